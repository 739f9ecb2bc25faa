"""The engine's loops compiled ahead in a child process while notebooks 01-02 run (portbench.sim.engine.ahead,
portbench.notebooks): started only when the run includes the simulation and a notebook before it and the campaign
uses the compiled core; the child leaves numba's disk cache ready and says so in its log; a run that stops early
ends it."""

from __future__ import annotations

import subprocess
import sys

from portbench import notebooks
from portbench.notebooks import notebook_paths
from portbench.sim.engine import ahead


def test_started_only_when_a_notebook_before_the_simulation_runs_with_the_compiled_core(tmp_path, monkeypatch):
    # not niced here: beside the test workers a niced child would get almost no CPU (a cold compile is ~50 CPU-s)
    monkeypatch.setattr(ahead, "NICE", 0)
    nbs = notebook_paths()
    assert notebooks._compile_ahead("auto", [p for p in nbs if p.name >= "03"], tmp_path) is None   # nothing before 03
    assert notebooks._compile_ahead("auto", [p for p in nbs if p.name < "03"], tmp_path) is None    # no simulation
    assert notebooks._compile_ahead("reference", nbs, tmp_path) is None                               # no compiled core
    proc = notebooks._compile_ahead("auto", nbs, tmp_path)
    assert proc is not None
    assert proc.wait(timeout=600) == 0
    log = (tmp_path / "logs" / "compile_ahead.log").read_text()
    assert "compiled core ready" in log or "compiled core unavailable here" in log, log


def test_a_compile_still_running_when_the_notebooks_stop_is_ended(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    notebooks._stop(proc)
    assert proc.poll() is not None


def test_the_wait_for_the_compile_raises_its_priority_back_where_allowed(tmp_path):
    import os

    import pytest

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("only root may raise a process's priority back")
    ready = tmp_path / "ready"
    child = ("import os, sys, time\n"
             "os.nice(10)\n"
             f"open({str(ready)!r}, 'w').close()\n"
             "end = time.monotonic() + 60\n"
             "while os.getpriority(os.PRIO_PROCESS, 0) != 0 and time.monotonic() < end:\n"
             "    time.sleep(0.05)\n"
             "print(os.getpriority(os.PRIO_PROCESS, 0))\n")
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    while not ready.exists() and proc.poll() is None:
        os.sched_yield()
    notebooks._join(proc)
    assert proc.returncode == 0 and proc.stdout is not None and proc.stdout.read().strip() == "0"
