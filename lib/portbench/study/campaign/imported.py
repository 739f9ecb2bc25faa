"""Imported vLLM scheduler classes in a campaign (``simulation.vllm_schedulers``; issue #40), without importing vLLM.

A vLLM ``Scheduler`` subclass runs on the virtual vLLM engine (:mod:`portbench.validation.imported`), which needs
vLLM, i.e. ``.venv-vllm``; the campaign and the analysis run in ``.venv``. So:

* :func:`run_classes` -- called at the end of :func:`portbench.study.campaign.run` when the parameters name
  classes -- runs ``portbench simulate --vllm-scheduler SPEC ... --panel all --windows <the campaign's>`` in
  ``.venv-vllm`` (``$PORTBENCH_VLLM_PYTHON``, else ``<root>/.venv-vllm/bin/python``): one campaign of the classes on
  every source, window and region of the study, replicate 0, under :func:`runs_dir` (resumable like any campaign;
  its shards are keyed by the class's source SHA-256 and vLLM's version);
* :func:`with_classes` -- called by the analysis' :func:`portbench.study.analysis.cube.load_runs` -- adds their runs
  to the campaign's, so the classes appear in every ranking, table and figure beside the built-ins.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ...core.errors import DataError, PortbenchError


def imported_name(spec: str) -> str:
    """The scheduler name of an imported vLLM class ``module:Class`` / ``file.py:Class``: ``vllm_`` + the class name
    in lower case."""
    return "vllm_" + re.sub(r"\W", "_", spec.rsplit(":", 1)[-1]).lower()


def runs_dir(results_dir: Path, name: str) -> Path:
    """Where the campaign of a policy the main campaign lacks writes (``{results_dir}/claims/runs/<name>``)."""
    return Path(results_dir) / "claims" / "runs" / name


def vllm_python(root: Path) -> str:
    """The interpreter of .venv-vllm; PortbenchError when it is not there."""
    py = os.environ.get("PORTBENCH_VLLM_PYTHON") or str(Path(root) / ".venv-vllm" / "bin" / "python")
    if not Path(py).is_file():
        raise PortbenchError(f"simulation.vllm_schedulers: a vLLM scheduler class runs on the virtual vLLM engine, "
                             f"which needs .venv-vllm ({py} is not there): make setup-vllm, or set PORTBENCH_VLLM_PYTHON")
    return py


def command(paths, specs: Sequence[str], *, panel: str = "all", windows_per_source: int | None = None) -> list[str]:
    """The ``portbench simulate --vllm-scheduler`` command line that runs ``specs`` in .venv-vllm with the parameter
    file and results folder of ``paths`` (the ``paths`` section)."""
    cmd = [vllm_python(paths.root), "-m", "portbench", "simulate", "--panel", panel,
           "--windows", "all" if windows_per_source is None else str(windows_per_source),
           "--params", str(paths.params_file), "--set", f"paths.results_dir={paths.results_dir}"]
    for sp in specs:
        cmd += ["--vllm-scheduler", sp]
    return cmd


def subprocess_env(paths) -> dict:
    """The environment of the .venv-vllm subprocess: this portbench first on the path, vLLM's and numba's caches in
    the build folder (as the Makefile's VLLM_ENV)."""
    cache = Path(paths.build_dir) / "vllm-cache"
    lib = str(Path(__file__).resolve().parents[3])
    return {"NUMBA_CACHE_DIR": str(cache / "numba"), "VLLM_CACHE_ROOT": str(cache), "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (lib, os.environ.get("PYTHONPATH", "")) if p)}


def run_classes(cfg, *, runner=subprocess.run) -> None:
    """Run the campaign of ``cfg.simulation.vllm_schedulers`` in .venv-vllm (module docstring); PortbenchError when
    it fails (its own message is printed above)."""
    specs = list(cfg.simulation.vllm_schedulers)
    if not specs:
        return
    cmd = command(cfg.paths, specs, windows_per_source=cfg.campaign.windows_per_source)
    print(f"[portbench] vLLM scheduler classes {', '.join(specs)}: running on the virtual vLLM engine in .venv-vllm",
          file=sys.stderr, flush=True)
    rc = runner(cmd, env=subprocess_env(cfg.paths)).returncode
    if rc:
        raise PortbenchError(f"simulation.vllm_schedulers: the run of {', '.join(specs)} in .venv-vllm failed (exit "
                             f"{rc}; its message is above)")


def with_classes(runs: pl.DataFrame, sim, results_dir: Path) -> pl.DataFrame:
    """The campaign's ``runs`` with the runs of every class of ``sim.vllm_schedulers`` (DataError naming the command
    when one has not run)."""
    frames = [runs]
    for spec in sim.vllm_schedulers:
        name = imported_name(spec)
        path = runs_dir(results_dir, name) / "runs.parquet"
        if not path.is_file():
            raise DataError(path, f"the runs of the vLLM scheduler class {spec} ({name}) are missing: run the campaign "
                            "(notebook 03, `portbench simulate`), which runs it in .venv-vllm")
        extra = pl.read_parquet(path).filter(pl.col("scheduler") == name)
        frames.append(extra.select([c for c in runs.columns if c in extra.columns]))
    return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else runs
