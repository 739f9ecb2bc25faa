"""Analysis benchmark: the portability analysis at the full study's size, on a planted runs table.

The table comes from the test suite's generator (``tests/planted.py``, so this needs the source
checkout, as ``make bench`` has): 13 schedulers x 3 sources x 40 windows x 6 regions x 3
replicates x 14 metrics = 28,080 runs, with realistic ties (every scheduler completes every
request at light load) and a few planted reversals. Timed, with ``analysis.bootstrap`` = 1000:

* ``compute``: :func:`portbench.study.analysis.compute` (every table and summary number), median of 3
  (1 with ``quick``);
* ``figures``: every figure of notebooks 04-07 (:func:`portbench.present.plots_analysis.make_all`), once;
* ``notebooks`` (not with ``quick``): notebooks 04, 05, 06, 07 and 10 executed with papermill in a
  fresh results folder — the whole analysis as a user runs it. Target: <= 180 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .. import params
from ..core.config import project_root
from ..notebooks import run_notebooks
from ..present import plots_analysis
from ..study import analysis

TARGET_NOTEBOOKS_S = 180.0


def _planted():
    path = project_root() / "tests" / "planted.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} (the planted-table generator of the test suite) is needed")
    spec = importlib.util.spec_from_file_location("portbench_planted", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod            # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def run(quick: bool = False) -> dict:
    """Time the analysis at default size; returns the timings (seconds) and the target verdict."""
    planted = _planted()
    df = planted.make_runs(effects=planted.realistic_effects())
    out: dict = {"runs": df.height, "schedulers": df["scheduler"].n_unique(), "windows": df["window_id"].n_unique(),
                 "regions": df["region"].n_unique(), "replicates": df["replicate"].n_unique()}
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp_dir:
        tmp = Path(tmp_dir)
        planted.write_runs(tmp / "results", df)
        overrides = {"paths": {"results_dir": str(tmp / "results"), "figures_dir": str(tmp / "figures")},
                     "analysis": {"runs_file": str(tmp / "results" / "runs.parquet")}}
        cfg = params.load("papermill_params/default.yaml", overrides)
        out["bootstrap"] = cfg.analysis.bootstrap
        walls = []
        for _ in range(1 if quick else 3):
            t0 = time.perf_counter()
            A = analysis.compute(cfg.analysis_inputs)
            walls.append(time.perf_counter() - t0)
        out["compute_s"] = walls
        out["compute_s_median"] = statistics.median(walls)
        out["compute_parts_s"] = A.meta["timings_s"]
        analysis.write(cfg.paths.results_dir, A)
        t0 = time.perf_counter()
        plots_analysis.make_all(cfg.paths, cfg.analysis, A, close=True)
        out["figures_s"] = time.perf_counter() - t0
        if not quick:
            shutil.rmtree(tmp / "results" / "analysis", ignore_errors=True)
            shutil.rmtree(tmp / "figures", ignore_errors=True)
            t0 = time.perf_counter()
            run_notebooks("papermill_params/default.yaml", tmp / "notebooks", only=["04", "05", "06", "07", "10"],
                          overrides=overrides)
            out["notebooks_s"] = time.perf_counter() - t0
            out["target"] = f"notebooks 04-07 + 10 <= {TARGET_NOTEBOOKS_S:.0f} s"
            out["target_met"] = out["notebooks_s"] <= TARGET_NOTEBOOKS_S
    return out
