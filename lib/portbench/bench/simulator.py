"""Simulator benchmark: how fast one run is, per scheduler and operating region, on real windows.

``run(quick)`` measures (medians of several repetitions, one process = one core):

* per (scheduler, region): wall milliseconds per run, simulated seconds per wall second
  (``sim_end_s / wall``) on the default core (``engine.core: auto``: compiled where it supports the
  run) and on the reference, measured in the same session, alternating (window, region) by (window,
  region): the default core's 13 runs of a case back to back, as a campaign's worker runs a shard, then the
  reference's (a reference run between two compiled ones -- its garbage and its footprint in the caches --
  made the next compiled run about half as slow again, a cost no campaign pays); decision points and
  iterations per run, microseconds per decision; per policy the median over regions
  (``speedup_min_policy``: the slowest policy's). A run is timed as a campaign runs it: each (window,
  region)'s scheduler-independent set-up (:class:`~portbench.sim.engine.columns.Window`) is built once and
  shared by the 13 schedulers' runs, and each run's wall time includes a 13th of it; the run's metrics
  (:func:`portbench.sim.metrics.compute`, as the campaign calls it) are timed beside it
  (``metrics_ms_per_run``), not in the speed-up;
* overall: runs per second, aggregate simulated seconds per wall second per core
  (``speedup_per_core``), and the projected wall time of the full default campaign
  (13 schedulers x 120 windows x 6 regions x 3 replicates) on 2 cores;
* wall time against window size: 200/400/800/1600/3200 consecutive real requests (every scheduler; FCFS and
  LAS with ``quick``) at near-saturation and overload, with each scheduler's log-log slope (1 = linear), the
  slope of its decision points per run (the policy's own growth) and of the wall time per decision.

Windows are consecutive rows of the real Azure conversation trace from the data mirror, stride
placed through the file, with a seeded assignment of 4 tenants. Numbers are reported, not asserted.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import polars as pl

from ..sim import metrics, profiles, regions, schedulers
from ..sim import engine as simulator
from ..sim.engine.columns import Window

REGION_LOADS = {"light": 0.3, "moderate": 0.5, "busy": 0.7, "near_saturation": 0.9, "overload": 1.2,
                "severe": 2.0}
SIZES = (200, 400, 800, 1600, 3200)
AZURE_FILE = "AzureLLMInferenceTrace_conv.csv"
FULL_CAMPAIGN_RUNS = 13 * 120 * 6 * 3
CORES = ("reference", "auto")    # engine.core: the SimPy reference, and what campaigns run (compiled where supported)


def _azure_path(mirror: Path | None = None) -> Path:
    cands = []
    if mirror is not None:
        cands.append(Path(mirror) / "azure2023" / AZURE_FILE)
    env = os.environ.get("PORTBENCH_DATA_MIRROR")
    if env:
        cands.append(Path(env) / "azure2023" / AZURE_FILE)
    here = Path(__file__).resolve()
    cands += [p / "shared" / "traces" / "azure2023" / AZURE_FILE for p in here.parents]
    for c in cands:
        if c.is_file():
            return c
    raise FileNotFoundError(f"{AZURE_FILE} not found in the data mirror (set PORTBENCH_DATA_MIRROR)")


def real_windows(sizes=(200,), n_windows: int = 3, mirror: Path | None = None) -> dict[int, list[pl.DataFrame]]:
    """``{size: [window_df, ...]}``: ``n_windows`` windows of ``size`` consecutive Azure requests,
    placed evenly through the trace; tenants seeded (4)."""
    raw = pl.read_csv(_azure_path(mirror))
    ts = raw["TIMESTAMP"].str.to_datetime("%Y-%m-%d %H:%M:%S%.f")
    t = ((ts - ts[0]).dt.total_microseconds() / 1e6).to_numpy()
    out: dict[int, list[pl.DataFrame]] = {}
    for size in sizes:
        starts = np.linspace(0, raw.height - size, n_windows + 2)[1:-1].astype(int)
        dfs = []
        for s in starts:
            rng = np.random.default_rng(int(s))
            dfs.append(pl.DataFrame({
                "arrival_s": t[s:s + size] - t[s],
                "prompt_tokens": raw["ContextTokens"][s:s + size].cast(pl.Int64),
                "output_tokens": raw["GeneratedTokens"][s:s + size].cast(pl.Int64),
                "tenant": [f"tenant{i}" for i in rng.integers(0, 4, size)],
            }))
        out[size] = dfs
    return out


def _profile():
    return profiles.get_profile(profiles.DEFAULT_PROFILE)


def _with_predictions(df: pl.DataFrame) -> pl.DataFrame:
    """The columns the prediction-based policies read, as a placeholder from the prompt length when a
    benchmark window has none (the benchmark measures speed, not the quality of an order)."""
    if "predicted_output" in df.columns and "ltr_score" in df.columns:
        return df
    p = pl.col("prompt_tokens").cast(pl.Float64)
    return df.with_columns(p.sqrt().alias("predicted_output"), p.log().alias("ltr_score"))


def _prepare(dfs, profile, loads):
    cases = []
    for i, df in enumerate(dfs):
        df = _with_predictions(df)
        cap = regions.capacity(df, profile)
        for reg, rho in loads.items():
            s = regions.rescale(df, rho, cap)
            cases.append((i, reg, s, regions.horizon_s(s, 1.5)))
    return cases


def run(quick: bool = False, windows: dict | None = None) -> dict:
    """Benchmark the simulator; returns a dict of numbers (see the module docstring).

    ``windows``: optional ``{size: [window_df, ...]}`` (or ``{name: window_df}`` of 200-request
    windows) instead of the Azure windows."""
    profile = _profile()
    slo = {"ttft_s": 2.0, "tpot_s": 0.1}
    names = schedulers.names("all")          # the 13 of the study
    repeats = 1 if quick else 3
    n_win = 2 if quick else 3
    if windows is None:
        windows = real_windows(SIZES if not quick else (200, 800), n_win)
    elif windows and not all(isinstance(k, int) for k in windows):
        windows = {200: list(windows.values())}
    base = windows.get(200) or next(iter(windows.values()))
    cases = _prepare(base, profile, REGION_LOADS)

    t_all = time.perf_counter()
    per: dict[tuple, list] = {}
    total_wall = total_sim = 0.0
    total_runs = 0
    slo_defs = {"bench": slo}
    for rep in range(repeats):
        scheds = {name: schedulers.get_scheduler(name) for name in names}
        for _i, reg, sdf, h in cases:
            # as a campaign's shard: the window's scheduler-independent set-up once, shared by every scheduler's
            # run (each run is charged its share), then the runs
            t0 = time.perf_counter()
            win = Window(sdf).prime(profile, h)
            share = (time.perf_counter() - t0) / len(names)
            ran = {}
            for name in names:                # the default core: the case's runs back to back, as in a shard
                t0 = time.perf_counter()
                res = simulator.simulate(win, scheds[name], profile, horizon_s=h, seed=rep, slo=slo,
                                         engine={"core": "auto"})
                wall = time.perf_counter() - t0 + share
                t0 = time.perf_counter()      # the run's metrics, as the campaign computes them
                metrics.compute(res.record_arrays(), h, slo_defs,
                                tenant_index=win.tenant_index() if win.base() is not None else None)
                ran[name] = (wall, res, time.perf_counter() - t0)
            for name in names:                # then the reference on the same case (same session)
                t0 = time.perf_counter()
                simulator.simulate(sdf, scheds[name], profile, horizon_s=h, seed=rep, slo=slo,
                                   engine={"core": "reference"})
                wall_ref = time.perf_counter() - t0
                wall, res, metrics_wall = ran[name]
                c = res.counters
                per.setdefault((name, reg), []).append((wall, c["sim_end_s"], c["decision_points"],
                                                        c["iterations"], wall_ref, res.core, metrics_wall))
                total_wall += wall
                total_sim += c["sim_end_s"]
                total_runs += 1
    rows: list[dict] = []
    for (name, reg), xs in per.items():
        rows.append({
            "scheduler": name, "region": reg, "core": xs[0][5],
            "ms_per_run": 1000 * statistics.median([x[0] for x in xs]),
            "metrics_ms_per_run": 1000 * statistics.median([x[6] for x in xs]),
            "sim_s_per_wall_s": statistics.median([x[1] / x[0] for x in xs]),
            "sim_s_per_wall_s_reference": statistics.median([x[1] / x[4] for x in xs]),
            "decisions": statistics.median([x[2] for x in xs]),
            "iterations": statistics.median([x[3] for x in xs]),
            "us_per_decision": 1e6 * statistics.median([x[0] / max(x[2], 1) for x in xs]),
        })
    by_region = {}
    for reg in REGION_LOADS:
        sub = [r for r in rows if r["region"] == reg]
        fc = next(r for r in sub if r["scheduler"] == "fcfs")
        slow = max(sub, key=lambda r: r["ms_per_run"])
        by_region[reg] = {"fcfs_ms": fc["ms_per_run"], "slowest": slow["scheduler"],
                          "slowest_ms": slow["ms_per_run"],
                          "median_ms": statistics.median(r["ms_per_run"] for r in sub)}
    by_policy = {}
    for name in names:
        sub = [r for r in rows if r["scheduler"] == name]
        by_policy[name] = {"core": sub[0]["core"],
                           "speedup_per_core": statistics.median(r["sim_s_per_wall_s"] for r in sub),
                           "speedup_per_core_reference": statistics.median(r["sim_s_per_wall_s_reference"] for r in sub)}
    slowest = min(by_policy, key=lambda k: by_policy[k]["speedup_per_core"])
    runs_per_s = total_runs / total_wall
    result = {
        "profile": getattr(profile, "name", str(profile)),
        "windows": len(base), "window_size": base[0].height, "repeats": repeats,
        "runs": total_runs, "runs_per_s": runs_per_s,
        "ms_per_run_mean": 1000 * total_wall / total_runs,
        "ms_per_run_median": statistics.median(r["ms_per_run"] for r in rows),
        "speedup_per_core": total_sim / total_wall,
        "speedup_per_core_median": statistics.median(r["sim_s_per_wall_s"] for r in rows),
        "metrics_ms_per_run_median": statistics.median(r["metrics_ms_per_run"] for r in rows),
        "speedup_per_core_median_reference": statistics.median(r["sim_s_per_wall_s_reference"] for r in rows),
        "speedup_min_policy": by_policy[slowest]["speedup_per_core"], "slowest_policy": slowest,
        "speedup_min_policy_reference": min(v["speedup_per_core_reference"] for v in by_policy.values()),
        "by_policy": by_policy,
        "full_campaign_sim_only_s_2_cores": FULL_CAMPAIGN_RUNS / runs_per_s / 2,
        "by_region": by_region,
        "rows": sorted(rows, key=lambda r: (list(REGION_LOADS).index(r["region"]), r["scheduler"])),
    }
    # wall time against window size
    size_rows: list[dict] = []
    sizes = sorted(k for k in windows if isinstance(k, int))
    loads = {k: REGION_LOADS[k] for k in ("near_saturation", "overload")}
    size_names = ("fcfs", "las") if quick else names          # every policy's slope (issue #16: each <= 1.15)
    for size in sizes:
        sc = _prepare(windows[size][:1 if quick else 2], profile, loads)
        for name in size_names:
            walls = []
            decisions = preemptions = 0
            for rep in range(repeats):
                t0 = time.perf_counter()
                for _, _reg, sdf, h in sc:
                    c = simulator.simulate(sdf, name, profile, horizon_s=h, seed=rep, slo=slo).counters
                    decisions += c["decision_points"]
                    preemptions += c["preemptions"]
                walls.append((time.perf_counter() - t0) / len(sc))
            ms = 1000 * statistics.median(walls)
            per_run = decisions / (repeats * len(sc))
            size_rows.append({"size": size, "scheduler": name, "ms_per_run": ms, "decisions": per_run,
                              "preemptions": preemptions / (repeats * len(sc)),
                              "us_per_decision": 1000 * ms / max(per_run, 1.0)})
    result["window_size_rows"] = size_rows

    def slope_of(name: str, col: str) -> float:
        pts = [(math.log(r["size"]), math.log(r[col])) for r in size_rows if r["scheduler"] == name and r[col] > 0]
        mx = statistics.fmean(p[0] for p in pts)
        my = statistics.fmean(p[1] for p in pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)

    ok = [n for n in size_names if sum(1 for r in size_rows if r["scheduler"] == n) >= 2]
    # the wall time's slope; the policy's own growth (decisions per run) and the cost per decision's slope
    result["loglog_slope"] = {n: slope_of(n, "ms_per_run") for n in ok}
    result["loglog_slope_decisions"] = {n: slope_of(n, "decisions") for n in ok}
    result["loglog_slope_per_decision"] = {n: slope_of(n, "us_per_decision") for n in ok}
    result["bench_s"] = time.perf_counter() - t_all
    return result


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    out = run(quick="--quick" in sys.argv)
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
