"""What a new user trips over (issue #15): runs that keep to their own folders, make targets that keep
tracked files, a missing data mirror, downloads, the CLI's rough edges, progress and worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from portbench import params
from portbench.core import progress
from portbench.data import registry

ROOT = Path(__file__).resolve().parents[1]
PORTBENCH = [sys.executable, "-m", "portbench"]


def _run(args, **kw):
    env = {**os.environ, **kw.pop("env", {})}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, **kw)


# --------------------------------------------------------------------------- where a run writes

def test_a_non_default_parameter_set_writes_under_its_own_folder():
    default = params.load()
    assert default.paths.run_name is None and default.paths.results_dir == ROOT / "data" / "results"
    assert default.paths.figures_dir == ROOT / "figures" and default.paths.build_dir == ROOT / "build"
    smoke = params.load("papermill_params/smoke.yaml")
    assert smoke.paths.run_name == "smoke" and smoke.paths.build_dir == ROOT / "build" / "smoke"
    assert smoke.paths.results_dir == ROOT / "build" / "smoke" / "results"
    a = params.load(overrides={"campaign": {"windows_per_source": 1}})
    b = params.load(overrides={"campaign": {"windows_per_source": 2}})
    for c in (a, b):     # the default file with overrides: its own folder, never data/results or figures/
        assert c.paths.run_name.startswith("default-")
        assert c.paths.results_dir == ROOT / "build" / c.paths.run_name / "results"
        assert c.paths.figures_dir == ROOT / "build" / c.paths.run_name / "figures"
    assert a.paths.run_name != b.paths.run_name
    # overrides of paths only (a mirror, an explicit results folder) change where things are, not results
    m = params.load(overrides={"paths": {"mirror": "/elsewhere"}})
    assert m.paths.run_name is None and m.paths.results_dir == default.paths.results_dir
    own = params.load(overrides={"simulation": {"replicates": 1}, "paths": {"results_dir": "/tmp/x"}})
    assert own.paths.results_dir == Path("/tmp/x")


def test_cli_says_where_a_non_default_run_writes(tmp_path):
    r = _run(PORTBENCH + ["params", "--show", "paths.results_dir", "--set", "campaign.windows_per_source=1"])
    assert r.returncode == 0, r.stderr
    assert "build/default-" in r.stdout


def test_make_clean_touches_no_tracked_file():
    recipe = _run(["make", "-n", "clean"])
    assert recipe.returncode == 0, recipe.stderr
    removed = [w for line in recipe.stdout.splitlines() if line.strip().startswith("rm ")
               for w in line.split()[2:]]
    assert removed
    tracked = _run(["git", "ls-files", "--", *removed]).stdout.split()
    assert not tracked, f"make clean would delete tracked files: {tracked[:5]}"
    assert "git ls-files --others" in recipe.stdout       # figures: only untracked files


@pytest.mark.skipif(os.geteuid() != 0, reason="the --allow-root flag is added only when running as root")
def test_make_lab_runs_as_root():
    assert "--allow-root" in _run(["make", "-n", "lab"]).stdout


# --------------------------------------------------------------------------- data

def test_a_missing_mirror_gives_one_short_message_before_any_notebook(tmp_path):
    r = _run(PORTBENCH + ["notebooks", "--params", "papermill_params/smoke.yaml", "--set",
                          f"paths.data_dir={tmp_path / 'data'}", "--out", str(tmp_path / "nb")],
             env={registry.MIRROR_ENV: str(tmp_path / "no-such-mirror")}, timeout=300)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) <= 15, r.stderr
    assert "DATA_MIRROR" in r.stderr and "no-such-mirror" in r.stderr and "Traceback" not in r.stderr
    assert "AzureLLMInferenceTrace_conv.csv" in r.stderr
    assert "01_ingest" not in r.stdout and not (tmp_path / "nb").exists()


def test_no_download_in_standin_mode_or_for_a_file_the_mirror_holds(monkeypatch, shared_traces, tmp_path):
    calls = []
    monkeypatch.setattr(registry, "_download", lambda spec, st: calls.append(spec.name) or (None, ["blocked"]))
    monkeypatch.delenv(registry.OFFLINE_ENV, raising=False)
    over = {"paths": {"mirror": str(shared_traces), "data_dir": str(tmp_path)},
            "sources": {"burstgpt": {"mode": "standin"}}}
    res = registry.resolve_sources(params.load(overrides=over))
    assert res["azure"]["provenance"] == "real" and res["burstgpt"]["provenance"] == "standin"
    # bailian is auto and its official file is not in the mirror: the stand-in, with no download either
    assert res["bailian"]["provenance"] == "standin" and "no download attempted" in res["bailian"]["reason"]
    assert calls == []
    # without any mirror, auto does try the official locations
    monkeypatch.setenv(registry.MIRROR_ENV, str(tmp_path / "none"))
    st = registry.Store(root=ROOT, mirror=None, raw_dir=tmp_path / "raw")
    with pytest.raises(registry.MissingFileError):
        registry.locate("qwen_traceB_blksz_16.jsonl", st)
    assert calls == ["qwen_traceB_blksz_16.jsonl"]


# --------------------------------------------------------------------------- the CLI

def test_cli_rough_edges():
    top = _run(PORTBENCH + ["--help"])
    assert top.returncode == 0 and "``" not in top.stdout and "params" in top.stdout
    ver = _run(PORTBENCH + ["--version"])
    assert ver.returncode == 0 and ver.stdout.startswith("portbench ")
    sweep = _run(PORTBENCH + ["sweep", "--help"])
    named = [w.strip(",.()") for w in sweep.stdout.split() if w.startswith("papermill_params/sweeps/")]
    assert named and all((ROOT / n).is_file() for n in named), named
    for cmd in ("simulate", "analyze", "notebooks", "params"):
        assert "portbench params" in _run(PORTBENCH + [cmd, "--help"]).stdout   # --set keys are discoverable
    shown = _run(PORTBENCH + ["params", "--show", "analysis.alpha"])
    assert shown.returncode == 0 and "analysis.alpha = 0.05" in shown.stdout
    bad = _run(PORTBENCH + ["params", "--show", "analysis.alfa"])
    assert bad.returncode == 2 and "--show" in bad.stderr
    odd = _run(PORTBENCH + ["simulate", "--set", "simulation.replicats=1"])
    assert odd.returncode == 2 and "simulation.replicats" in odd.stderr and "Traceback" not in odd.stderr


def test_cli_output_into_a_closed_pipe_is_not_an_error():
    p = subprocess.Popen(PORTBENCH + ["params"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()                 # `| head -1`
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()


def test_notebooks_set_reaches_the_notebooks(monkeypatch):
    """`portbench notebooks --set k=v` hands the override to every notebook (papermill parameter)."""
    from portbench import cli, notebooks

    got = {}
    monkeypatch.setattr(notebooks, "run_notebooks", lambda *a, **kw: got.update(kw))
    assert cli.main(["notebooks", "--params", "papermill_params/smoke.yaml", "--set", "analysis.alpha=0.5"]) == 0
    assert got["overrides"] == {"analysis": {"alpha": 0.5}}


# --------------------------------------------------------------------------- progress and processes

def test_progress_goes_to_the_terminal_inside_a_notebook_kernel(monkeypatch):
    monkeypatch.delenv(progress.TERMINAL_ENV, raising=False)
    assert progress.stream() is sys.stderr
    monkeypatch.setenv(progress.TERMINAL_ENV, "1")
    assert progress.stream() is sys.__stderr__


def test_pool_workers_exit_when_their_parent_is_killed(tmp_path):
    parent = textwrap.dedent(f"""
        import multiprocessing as mp, os, sys, time
        from concurrent.futures import ProcessPoolExecutor
        from portbench.core import procs
        if __name__ == "__main__":
            pool = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), initializer=procs.die_with_parent)
            pids = [f.result() for f in [pool.submit(os.getpid) for _ in range(8)]]
            futs = [pool.submit(time.sleep, 600) for _ in range(2)]
            open({str(tmp_path / 'pids')!r}, "w").write(" ".join(map(str, sorted(set(pids)))))
            time.sleep(600)
    """)
    script = tmp_path / "parent.py"
    script.write_text(parent)
    p = subprocess.Popen([sys.executable, str(script)], cwd=ROOT)
    pid_file = tmp_path / "pids"
    for _ in range(600):
        if pid_file.is_file() and pid_file.read_text().strip():
            break
        time.sleep(0.2)
    pids = [int(x) for x in pid_file.read_text().split()]
    assert pids
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    alive = pids
    for _ in range(300):              # polls for up to a minute: the check is that they exit, not how fast
        alive = [q for q in pids if _alive(q)]
        if not alive:
            break
        time.sleep(0.2)
    for q in alive:
        os.kill(q, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their parent"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")
