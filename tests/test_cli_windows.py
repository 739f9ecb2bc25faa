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


class _Bar:
    """Stands in for progress.bar: records the total and how far the bar got."""

    mininterval = 1.0

    def __init__(self, total, desc, unit, **kw):
        self.total, self.desc, self.unit, self.n, self.closed = total, desc, unit, 0, False

    def update(self, k=1):
        self.n += k

    def set_postfix_str(self, *a, **kw):
        pass

    def refresh(self):
        pass

    def close(self):
        self.closed = True


@pytest.fixture()
def bars(monkeypatch):
    from portbench.core import progress

    made = []
    monkeypatch.setattr(progress, "bar", lambda *a, **kw: made.append(_Bar(*a, **kw)) or made[-1])
    return made


def test_refreeze_with_other_windows_writes_its_own_manifest_never_the_committed_one(fake_data, tmp_path, capsys,
                                                                                   monkeypatch, root, bars):
    """`freeze --refreeze --set windows.per_source=…` (issue 15): the run's own manifest and cache under
    BUILD/<run name>/windows/, said on the terminal; the committed manifest keeps its bytes. The freeze and the
    verification each draw a progress bar to its end."""
    monkeypatch.setenv("PORTBENCH_BUILD", str(tmp_path / "build"))
    committed = root / "data" / "windows" / "manifest.json"
    before = committed.read_bytes()
    args = ["--set", f"paths.data_dir={tmp_path / 'data'}", "--set", "windows.per_source=10", "--set", "windows.size=50"]
    assert main(["freeze", "--refreeze", *args]) == 0
    out = capsys.readouterr()
    own = next((tmp_path / "build").glob("default-*/windows/manifest.json"))
    assert f"manifest: 20 windows -> {own}" in out.out and str(own.parent) in out.err
    assert committed.read_bytes() == before
    assert [(b.unit, b.total, b.n, b.closed) for b in bars] == [("source", 5, 5, True)]   # 5 sources, 3 skipped here
    assert main(["verify", *args]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "20/20 windows verified"
    assert [(b.unit, b.total, b.n, b.closed) for b in bars[1:]] == [("window", 20, 20, True)]
