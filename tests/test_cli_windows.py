"""``portbench freeze`` / ``portbench verify``: output and exit codes (in process and as a subprocess)."""

from __future__ import annotations

import os
import subprocess

import polars as pl
import pytest

from portbench.data import windows as W
from portbench.cli import main
from test_windows import azure_only, fake_data  # noqa: F401 - shared fixtures


def _args(cmd: str, tmp_path, *extra: str) -> list[str]:
    return [cmd, "--params", "papermill_params/smoke.yaml",
            "--set", f"paths.data_dir={tmp_path / 'data'}",
            "--set", f"paths.manifest={tmp_path / 'data' / 'windows' / 'manifest.json'}",
            "--set", "windows.per_source=10", "--set", "windows.size=50", *extra]


def test_freeze_then_verify_ok(fake_data, tmp_path, capsys):
    assert main(_args("freeze", tmp_path)) == 0
    assert "manifest: 20 windows" in capsys.readouterr().out
    assert main(_args("verify", tmp_path)) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == "20/20 windows verified"
    assert "MISMATCH" not in out.err


def test_verify_tampered_cache_exits_1(fake_data, tmp_path, capsys):
    assert main(_args("freeze", tmp_path)) == 0
    cache = tmp_path / "data" / "windows" / "windows.parquet"
    m = W.parse_manifest((tmp_path / "data" / "windows" / "manifest.json").read_bytes())
    df = pl.read_parquet(cache)
    tables = {wid: part.drop("window_id") for (wid,), part in
              df.partition_by("window_id", as_dict=True, maintain_order=True).items()}
    tables["burstgpt-04"] = tables["burstgpt-04"].with_columns(pl.col("prompt_tokens") + 1)
    W._write_cache(cache, m, tables)
    capsys.readouterr()
    assert main(_args("verify", tmp_path)) == 1
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == "19/20 windows verified"
    assert "MISMATCH window burstgpt-04" in out.err


def test_verify_tampered_manifest_exits_1(fake_data, tmp_path, capsys):
    assert main(_args("freeze", tmp_path)) == 0
    path = tmp_path / "data" / "windows" / "manifest.json"
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"\n", b"\r\n", 1))  # a whitespace-only change
    capsys.readouterr()
    assert main(_args("verify", tmp_path)) == 1
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == "0/20 windows verified"
    assert "canonical serialisation" in out.err


def test_missing_manifest_and_changed_params_exit_2(fake_data, tmp_path, capsys):
    assert main(_args("verify", tmp_path)) == 2
    assert "portbench freeze" in capsys.readouterr().err
    assert main(_args("freeze", tmp_path)) == 0
    before = (tmp_path / "data" / "windows" / "manifest.json").read_bytes()
    assert main(_args("freeze", tmp_path, "--set", "windows.size=60")) == 2
    assert "--refreeze" in capsys.readouterr().err
    assert (tmp_path / "data" / "windows" / "manifest.json").read_bytes() == before
    assert main(_args("freeze", tmp_path, "--set", "windows.size=60", "--refreeze")) == 0
    assert main(_args("verify", tmp_path, "--set", "windows.size=60")) == 0


def test_portbench_verify_subprocess_on_real_azure(azure_only, tmp_path, root):
    """Freeze real Azure windows in process, then check them with the installed ``portbench`` script."""
    from portbench import params

    o = {"paths.data_dir": str(tmp_path / "data"),
         "paths.manifest": str(tmp_path / "data" / "windows" / "manifest.json"),
         "windows.per_source": 5, "windows.size": 50}
    W.freeze(params.load("papermill_params/smoke.yaml", params.undot(o)))
    exe = root / ".venv" / "bin" / "portbench"
    if not exe.is_file():
        pytest.skip(f"{exe} not installed (make setup)")
    cmd = [str(exe), "verify", "--params", "papermill_params/smoke.yaml",
           "--set", f"paths.data_dir={tmp_path / 'data'}", "--set", f"paths.manifest={o['paths.manifest']}",
           "--set", "windows.per_source=5", "--set", "windows.size=50"]
    env = {**os.environ, "PORTBENCH_OFFLINE": "1", "MPLBACKEND": "Agg"}
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "5/5 windows verified"
    path = tmp_path / "data" / "windows" / "manifest.json"
    raw = path.read_bytes()
    i = raw.index(b'"n_requests": 50') + len(b'"n_requests": 5')
    path.write_bytes(raw[:i] + b"1" + raw[i + 1:])  # 50 -> 51 in the first window
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert run.stdout.strip().splitlines()[-1] == "0/5 windows verified"
    assert "checksum mismatch" in run.stderr
