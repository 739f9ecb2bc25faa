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

def test_a_non_default_parameter_set_writes_under_its_own_folder(tmp_path):
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
    own = params.load(overrides={"simulation": {"replicates": 1}, "paths": {"results_dir": str(tmp_path / "x")}})
    assert own.paths.results_dir == tmp_path / "x"


def test_a_run_with_other_windows_has_its_own_manifest_window_cache_and_predictions(monkeypatch, tmp_path):
    """Overrides that change what is frozen move the manifest and the window cache / frozen predictions under
    build/<run name>/windows/, so `portbench freeze --refreeze` never rewrites the committed manifest."""
    from portbench.data import predictors, windows

    monkeypatch.delenv("PORTBENCH_BUILD", raising=False)     # `make test BUILD=…` moves build/
    default = params.load()
    committed = ROOT / "data" / "windows" / "manifest.json"
    assert default.paths.manifest == committed and default.paths.windows_dir == ROOT / "data" / "windows"
    for over in ({"windows": {"per_source": 5}}, {"windows": {"seed": 1}}, {"sources": {"burstgpt": {"mode": "standin"}}},
                 {"sources": {"bailian": None}}, {"sources": {"mine": {"file": "x.csv", "columns": {
                     "arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}}}}, {"standins": {"seed": 8}}):
        c = params.load(overrides=over)
        run = ROOT / "build" / c.paths.run_name / "windows"
        assert c.paths.manifest == run / "manifest.json", over
        assert windows.cache_path(c.paths) == run / "windows.parquet" and predictors.predictions_dir(c.paths) == run / "predictions"
        assert {"manifest", "windows_dir"} <= set(c.paths.isolated) and str(run) in c.paths.where()
    # a parameter file that changes the windows: under its own name
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: default.yaml\nwindows: {size: 100}\n")
    mc = params.load(mine)     # a file outside papermill_params/: its name and a hash of its path
    assert mc.paths.run_name.startswith("mine-") and mc.paths.manifest == ROOT / "build" / mc.paths.run_name / "windows" / "manifest.json"
    # what changes no window keeps the committed manifest: a label, analysis or simulation, the smoke file
    for c in (params.load(overrides={"sources": {"azure": {"label": "Az"}}}),
              params.load(overrides={"analysis": {"alpha": 0.1}, "simulation": {"replicates": 1}}),
              params.load("papermill_params/smoke.yaml")):
        assert c.paths.run_name and c.paths.manifest == committed and "manifest" not in c.paths.isolated
    assert params.load("papermill_params/smoke.yaml").paths.windows_dir == ROOT / "build" / "smoke" / "data" / "windows"
    # folders set explicitly are kept (data_dir: the cache stays in it); BUILD moves the run's folder
    own = params.load(overrides={"windows": {"per_source": 5}, "paths": {"manifest": str(tmp_path / "m.json"),
                                                                          "data_dir": str(tmp_path / "d")}})
    assert own.paths.manifest == tmp_path / "m.json" and own.paths.windows_dir == tmp_path / "d" / "windows"
    wd = params.load(overrides={"windows": {"per_source": 5}, "paths": {"windows_dir": str(tmp_path / "w")}})
    assert wd.paths.windows_dir == tmp_path / "w" and wd.paths.manifest.parent.parent.parent == ROOT / "build"
    monkeypatch.setenv("PORTBENCH_BUILD", str(tmp_path / "b"))
    moved = params.load(overrides={"windows": {"per_source": 5}})
    assert moved.paths.manifest == tmp_path / "b" / moved.paths.run_name / "windows" / "manifest.json"


def test_cli_shows_where_a_run_with_other_windows_freezes(capsys, monkeypatch):
    from portbench import cli

    monkeypatch.delenv("PORTBENCH_BUILD", raising=False)
    assert cli.main(["params", "--set", "windows.per_source=5", "--show", "paths"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("paths.manifest = "))
    assert "/build/default-" in line and line.endswith('/windows/manifest.json"')
    assert "windows (manifest, cache, frozen predictions) -> " in out.splitlines()[0]


def test_cli_says_where_a_non_default_run_writes(tmp_path):
    r = _run(PORTBENCH + ["params", "--show", "paths.results_dir", "--set", "campaign.windows_per_source=1"])
    assert r.returncode == 0, r.stderr
    assert "build/default-" in r.stdout


def test_make_clean_deletes_only_through_the_record():
    """`make clean` runs no `rm` of its own: it hands the folders to outputs.py, which deletes only recorded files
    (tests/test_safety.py checks what it deletes and keeps)."""
    recipe = _run(["make", "-n", "clean"])
    assert recipe.returncode == 0, recipe.stderr
    assert "rm " not in recipe.stdout and "lib/portbench/core/outputs.py clean build " in recipe.stdout


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
    P = params.load(overrides=over)
    res = registry.resolve_sources(P.paths, P.sources, P.standins)
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
        # --set keys are discoverable (argparse may wrap the help between the two words)
        assert "portbench params" in " ".join(_run(PORTBENCH + [cmd, "--help"]).stdout.split())
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


def test_every_command_but_sweep_takes_params_set_and_plugin():
    """README: every command takes --params, --set and --plugin, except sweep (its file names base and grid)."""
    import argparse

    from portbench import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"schedulers", "profiles", "files", "params", "simulate", "sweep"} <= set(sub.choices)
    for name, p in sub.choices.items():
        flags = {o for a in p._actions for o in a.option_strings}
        assert "--plugin" in flags, name
        assert ({"--params", "--set"} <= flags) == (name != "sweep"), name
    readme = (ROOT / "docs" / "getting-started.md").read_text()
    assert "Every command but `sweep` takes `--params FILE`" in readme


def test_schedulers_lists_the_plugins_of_the_parameters(tmp_path):
    """`portbench schedulers --params FILE` (and --set plugins=…) shows the rows of the file's plug-ins."""
    plugin = ROOT / "tests" / "plugins" / "myschedulers.py"
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"extends: default.yaml\nplugins: [{plugin}]\n")
    plain = _run(PORTBENCH + ["schedulers"])
    assert plain.returncode == 0 and "| aging_sjf |" not in plain.stdout
    for extra in (["--params", str(mine)], ["--set", f"plugins=[{plugin}]"]):
        r = _run(PORTBENCH + ["schedulers", *extra])
        assert r.returncode == 0, r.stderr
        assert "| aging_sjf |" in r.stdout and "| lpf |" in r.stdout and "| fcfs |" in r.stdout


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


class _Bar:
    """Stands in for a tqdm bar: counts updates and redraws."""

    mininterval = 0.01

    def __init__(self, total=None, desc="", unit="", **kw):
        self.total, self.desc, self.unit, self.n, self.refreshes, self.closed = total, desc, unit, 0, 0, False
        self.on_refresh = None

    def update(self, k=1):
        self.n += k

    def set_postfix_str(self, *a, **kw):
        pass

    def refresh(self):
        self.refreshes += 1
        if self.on_refresh:
            self.on_refresh()

    def close(self):
        self.closed = True


def test_progress_completed_redraws_the_bar_while_a_pool_item_runs():
    """Nothing completes until the bar has been redrawn once: the wait cannot end without a redraw."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    bar, go = _Bar(), threading.Event()
    bar.on_refresh = go.set
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(go.wait, 60), pool.submit(lambda: 1)]
        got = [f.result() for f in progress.completed(futures, bar)]
    assert sorted(got, key=str) == [1, True] and bar.refreshes >= 1


def test_predictor_training_draws_a_bar_over_the_predictors(monkeypatch, tmp_path):
    """load_predictions: one bar, total = predictors to train, advanced as each source's training ends."""
    import polars as pl

    from portbench.data import predictors, windows

    made = []
    monkeypatch.setattr(progress, "bar", lambda *a, **kw: made.append(_Bar(*a, **kw)) or made[-1])
    monkeypatch.setattr(windows, "load_windows", lambda cfg, **kw: {})
    trained = []

    def compute(data, P, manifest, train, targets, tables):
        trained.append((train, tuple(targets), made[-1].n))      # the bar's position when this training starts
        return {t: predictors.Frozen(train, t, pl.DataFrame(), {}, tmp_path / f"{t}.parquet") for t in targets}

    monkeypatch.setattr(predictors, "_compute", compute)
    cfg = params.load(overrides={"paths": {"data_dir": str(tmp_path)}, "campaign": {"workers": 1}})
    m = {"checksum": "x", "windows": [{"id": f"{s}-00", "source": s, "provenance": "real"} for s in "abc"]}
    got = predictors.load_predictions(cfg.data, cfg.predictors, [("a", "a"), ("a", "b"), ("b", "b"), ("c", "c")], manifest=m)
    assert set(got) == {("a", "a"), ("a", "b"), ("b", "b"), ("c", "c")}
    assert [(b.unit, b.total, b.n, b.closed) for b in made] == [("predictor", 4, 4, True)]
    assert [n for _, _, n in trained] == [0, 2, 3]


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
