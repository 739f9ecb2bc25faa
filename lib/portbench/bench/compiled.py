"""The compiled engine core in the benchmark: compile time, and equality on the benchmark's runs.

* **compile time**: a fresh process runs one tiny run on the compiled core with an empty numba cache
  (``compile_cold_s``: compilation and writing the cache), then another with that cache
  (``compile_warm_s``: what each campaign worker pays once when the cache is on disk). The cache of the
  real runs is numba's default (``__pycache__`` next to :mod:`portbench.sim.engine.compiled`).
* **equality**: every policy the compiled core supports, on the simulator benchmark's windows in every
  region, on both cores (:func:`portbench.sim.engine.simulate` with ``engine.core`` reference and
  compiled): identical records and counters? (The test suite holds the full contract,
  ``tests/test_compiled_core.py``; this is the benchmark's own check of the runs it times.)

The speed of both cores is measured by the simulator part (:mod:`portbench.bench.simulator`), in the same
session, alternating (window, region) by (window, region).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from ..sim import profiles
from ..sim import engine as simulator
from ..sim.engine import compiled
from . import simulator as simbench

_TINY = ("import time, polars as pl; t = time.perf_counter(); "
         "from portbench.sim import profiles; from portbench.sim.engine import simulate; "
         "df = pl.DataFrame({'arrival_s': [0.0, 0.5], 'prompt_tokens': [100, 200], 'output_tokens': [5, 7], "
         "'tenant': ['a', 'b']}); t1 = time.perf_counter(); "
         "simulate(df, 'fcfs', profiles.get_profile(profiles.DEFAULT_PROFILE), horizon_s=100.0, seed=0, "
         "engine={'core': 'compiled'}); print('TIME', time.perf_counter() - t1)")


def _tiny_run_s(cache_dir: str) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-c", _TINY], capture_output=True, text=True, env=env, check=True)
    return float([ln for ln in out.stdout.splitlines() if ln.startswith("TIME ")][-1].split()[1])


def _same(a, b) -> bool:
    ra, rb = a.requests, b.requests
    for col in ra.columns:
        x, y = ra[col].to_numpy(), rb[col].to_numpy()
        if not (np.array_equal(x, y, equal_nan=True) if x.dtype.kind == "f" else np.array_equal(x, y)):
            return False
    return a.counters == b.counters


def run(quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as d:
        cold = _tiny_run_s(d)
        warm = _tiny_run_s(d)
    profile = profiles.get_profile(profiles.DEFAULT_PROFILE)
    slo = {"ttft_s": 2.0, "tpot_s": 0.1}
    cases = simbench._prepare(simbench.real_windows((200,), 2 if quick else 3)[200], profile, simbench.REGION_LOADS)
    mismatches = []
    n = 0
    t0 = time.perf_counter()
    for name in compiled.SUPPORTED_POLICIES:
        for i, reg, sdf, h in cases:
            a = simulator.simulate(sdf, name, profile, horizon_s=h, seed=1, slo=slo, engine={"core": "reference"})
            b = simulator.simulate(sdf, name, profile, horizon_s=h, seed=1, slo=slo, engine={"core": "compiled"})
            n += 1
            if not _same(a, b):
                mismatches.append(f"{name} window {i} {reg}")
    return {"policies": list(compiled.SUPPORTED_POLICIES), "compile_cold_s": cold, "compile_warm_s": warm,
            "runs_compared": n, "identical": not mismatches, "mismatches": mismatches[:20],
            "equality_wall_s": time.perf_counter() - t0}
