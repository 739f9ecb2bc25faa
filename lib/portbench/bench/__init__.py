"""``portbench bench`` / ``make bench``: how fast the pipeline is, against the study's targets.

A script, not a timed test: it measures, prints a report with *met* / *not met* for each target,
writes every number to ``build/bench/bench.json`` and ends with exactly one line::

    BENCH speedup_per_core=<x> speedup_min_policy=<p> runs_per_s=<y> full_campaign_s=<z> peak_mem_mib=<m> slope_max=<s>

Parts (each a median of several runs unless stated):

* **simulator** (:mod:`portbench.bench.simulator`): simulated seconds per wall second per core, for
  each scheduler on real windows in each region;
* **compiled** (:mod:`portbench.bench.compiled`): the compiled engine core's compile time (cold, and
  from numba's disk cache) and its equality with the reference on the simulator part's runs of the
  policies it supports (the speed of both cores is the simulator part's);
* **campaign**: wall time of the full default campaign (every scheduler x window x region x
  replicate of the parameters, on ``campaign.workers`` local processes) in a fresh results folder,
  run in a child process so that its memory can be measured. It is measured, not extrapolated,
  when a measured fraction predicts that it fits in 15 minutes; otherwise (and with ``--quick``) a
  fraction is measured and the full time extrapolated (the fraction's fixed cost — worker
  start-up, window loading, consolidation — plus the full number of runs at the fraction's compute
  time per run, divided by the workers), and the report says so. Peak memory: ``resource.getrusage`` max RSS of the campaign's main process plus
  ``workers`` x the largest worker's max RSS (an upper bound of the simultaneous total; tracemalloc
  would miss the worker processes and non-Python allocations);
* **window size**: wall time of the same runs on windows of 200 to 3,200 consecutive real requests (the
  simulator part's; 200/400/800/1600 when measured here), the log-log slope of wall time against size
  (1 = linear), and that of the decision points per run and of the wall time per decision;
* **ingest** (:mod:`portbench.bench.ingest`) and **analysis** (:mod:`portbench.bench.analysis`).

Targets (issue #16): >= 30,000x real time per core (the median over schedulers x regions); the full
campaign of the original three sources (28,080 runs) <= 60 s on 2 cores, and the campaign of every
default source reported beside it; peak memory < 2 GiB; every policy's cost about linear in window size
(log-log slope <= 1.15). ``speedup_per_core`` in the BENCH line is that median on the default core
(``engine.core: auto``), ``speedup_min_policy`` the slowest policy's median over regions; ``slope_max`` the
worst policy's slope. Issue #26's targets for the compiled core (>= 5e4x median, >= 3e4x slowest policy) are
reported beside them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ..core import config
from ..core.config import Config, DataSettings, SimulationConfig, WindowsConfig
from ..data import traces, windows
from ..sim import schedulers
from ..study import campaign
from . import analysis as analysis_bench
from . import compiled as compiled_bench
from . import ingest as ingest_bench
from . import simulator as simulator_bench

TARGET_SPEEDUP = 30_000.0
TARGET_CAMPAIGN_S = 60.0
TARGET_PEAK_MIB = 2048.0
TARGET_SLOPE = 1.15
TARGET_SPEEDUP_COMPILED = 50_000.0       # issue #26: median per core with the compiled core
TARGET_SPEEDUP_MIN_POLICY = 30_000.0     # issue #26: the slowest policy's median
TARGET_CAMPAIGN_ALL_S = 30.0             # issue #26: the default study's campaign, every source, 2 cores
STUDY_SOURCES = ("azure", "burstgpt", "bailian")     # the original study's campaign: 28,080 runs
MEASURE_LIMIT_S = 15 * 60.0
WINDOW_SIZES = (200, 400, 800, 1600)


def _median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else float("nan")


def _maxrss_mib(who) -> float:
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    kb = resource.getrusage(who).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0


def _fmt(x, nd=3) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        return f"{x:,.{nd}g}" if abs(x) < 1e5 else f"{x:,.0f}"
    return str(x)


def _print_result(name: str, res) -> None:
    """Print a sub-benchmark's dict: scalars as ``key: value``, lists of row dicts as a table."""
    print(f"\n== {name} ==")
    if not isinstance(res, Mapping):
        print(f"  {res}")
        return
    for k, v in res.items():
        if isinstance(v, list) and v and all(isinstance(r, Mapping) for r in v):
            cols = list(v[0])
            print(f"  {k}:")
            print("    " + "  ".join(f"{c:>14}" for c in cols))
            for r in v[:60]:
                print("    " + "  ".join(f"{_fmt(r.get(c)):>14}" for c in cols))
            if len(v) > 60:
                print(f"    ... {len(v) - 60} more rows in bench.json")
        elif isinstance(v, (list, tuple)) and len(v) > 12:
            print(f"  {k}: [{len(v)} values, median {_fmt(_median([x for x in v if isinstance(x, (int, float))]))}]")
        elif isinstance(v, Mapping) and len(json.dumps(v, default=str)) > 300:
            print(f"  {k}: {{{len(v)} entries, see bench.json}}")
        else:
            print(f"  {k}: {_fmt(v) if isinstance(v, float) else v}")


SUB_BENCHES = {"simulator": simulator_bench, "compiled": compiled_bench, "ingest": ingest_bench,
               "analysis": analysis_bench}


def _ingest_memory_target(ingest: Mapping) -> tuple[str, str, bool | None]:
    """The ingest memory target of issue #27 (bench/ingest.memory) as a (target, value, met) row."""
    mem = ingest.get("memory") or {}
    rows = mem.get("sizes") or []
    value = "; ".join(f"{r['file_gb']:g} GB file: ingest {_fmt(r['ingest_peak_gib'])} GiB, freeze "
                      f"{_fmt(r['freeze_peak_gib'])} GiB (start {_fmt(r['base_gib'])} GiB)" for r in rows) or "n/a"
    return (mem.get("target") or ingest_bench.MEMORY_TARGET, value, mem.get("met") if rows else None)


def _sub_bench(name: str, quick: bool) -> dict:
    """Run ``portbench.bench.<name>.run(quick)``; a failure is reported, not fatal."""
    t0 = time.perf_counter()
    mod = SUB_BENCHES[name]
    try:
        res = dict(mod.run(quick))
    except Exception as e:  # a benchmark failure is a finding; the other parts still run
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    res.setdefault("status", "ok")
    res["bench_wall_s"] = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------- the campaign


def _probe() -> None:
    """Child-process entry: run one campaign from a JSON spec, print its timing and memory as JSON."""
    spec = json.loads(sys.argv[1])
    cfg = config.build(json.loads(Path(spec["params_json"]).read_text()))
    t0 = time.perf_counter()
    res = campaign.run(cfg, executor="process", workers=spec["workers"], progress=spec.get("progress", False),
                                verbose=False)
    wall = time.perf_counter() - t0
    print("PROBE " + json.dumps({
        "wall_s": wall, "runs": res.plan.n_runs, "shards": len(res.plan.shards),
        "computed_shards": res.computed_shards, "shard_wall_s_sum": sum(res.shard_wall_s),
        "self_maxrss_mib": _maxrss_mib(resource.RUSAGE_SELF),
        "children_maxrss_mib": _maxrss_mib(resource.RUSAGE_CHILDREN)}), flush=True)


def _campaign_once(cfg: Config, overrides: Mapping, workers: int, tag: str, work: Path) -> dict:
    results = work / f"campaign-{tag}"
    shutil.rmtree(results, ignore_errors=True)
    tree = config.deep_merge(cfg.tree, config.undot({**overrides, "paths.results_dir": str(results)}))
    pfile = work / f"params-{tag}.json"
    pfile.write_text(json.dumps(tree, default=str))
    spec = json.dumps({"params_json": str(pfile), "workers": workers})
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-c", "from portbench.bench import _probe; _probe()", spec],
                         capture_output=True, text=True, env=env, cwd=str(cfg.paths.root))
    shutil.rmtree(results, ignore_errors=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    if out.returncode != 0 or not line:
        raise RuntimeError(f"campaign probe failed (rc {out.returncode}): {out.stderr[-2000:]}")
    r = json.loads(line[-1][len("PROBE "):])
    # in-process with 1 worker; else the main process plus every worker at the largest worker's peak
    r["peak_mem_mib"] = r["self_maxrss_mib"] + (workers * r["children_maxrss_mib"] if workers > 1 else 0.0)
    r["runs_per_s"] = r["runs"] / r["wall_s"]
    return r


def _bench_campaign(cfg: Config, quick: bool, work: Path) -> dict:
    workers = int(cfg.campaign.workers)
    manifest = windows.load_manifest(cfg.paths)
    windows.load_windows(cfg.data, per_source=cfg.campaign.windows_per_source, manifest=manifest)  # warm the cache
    full_plan = campaign.make_plan(cfg.plan_settings, manifest=manifest)
    full_runs = full_plan.n_runs
    n_windows = len(full_plan.windows)
    n_sources = len({w.source for w in full_plan.windows})
    per_source_full = max(1, math.ceil(n_windows / max(1, n_sources)))
    frac_wps = 1 if quick else max(1, min(per_source_full, math.ceil(per_source_full / 10)))
    frac_over = {"campaign.windows_per_source": frac_wps}
    if quick:
        frac_over["simulation.replicates"] = 1
    repeats = 3
    fracs = [_campaign_once(cfg, frac_over, workers, f"fraction{i}", work) for i in range(repeats)]
    frac = {k: _median([f[k] for f in fracs]) for k in fracs[0]}
    # Extrapolation: the fraction's fixed cost (worker start-up, window loading, consolidation) plus
    # the full campaign's runs at the fraction's compute time per run, spread over the workers.
    per_run_s = frac["shard_wall_s_sum"] / frac["runs"]
    fixed_s = max(0.0, frac["wall_s"] - frac["shard_wall_s_sum"] / workers)
    est_s = fixed_s + full_runs * per_run_s / workers
    out = {"workers": workers, "full_runs": full_runs, "full_shards": len(full_plan.shards),
           "fraction": {"overrides": frac_over, "runs": int(frac["runs"]), "repeats": repeats,
                        "wall_s": [f["wall_s"] for f in fracs], "wall_s_median": frac["wall_s"],
                        "runs_per_s": frac["runs_per_s"], "peak_mem_mib": max(f["peak_mem_mib"] for f in fracs)},
           "fixed_s": fixed_s, "compute_s_per_run": per_run_s, "estimated_full_s": est_s,
           "estimated_full_s_naive": full_runs / frac["runs_per_s"]}
    if quick or est_s > MEASURE_LIMIT_S:
        out.update(full_campaign_s=est_s, full_campaign_measured=False, runs_per_s=full_runs / est_s,
                   peak_mem_mib=out["fraction"]["peak_mem_mib"],
                   note=("extrapolated from a fraction ({} runs): {}".format(
                       int(frac["runs"]), "--quick" if quick else f"the estimate {est_s:.0f} s exceeds 15 min")))
        return out
    # the full campaign: once, and twice more (median of 3) when one run takes under 2 minutes
    fulls = [_campaign_once(cfg, {}, workers, "full0", work)]
    if fulls[0]["wall_s"] < 120:
        fulls += [_campaign_once(cfg, {}, workers, f"full{i}", work) for i in (1, 2)]
    full_repeats = len(fulls)
    out.update(full_campaign_s=_median([f["wall_s"] for f in fulls]), full_campaign_measured=True,
               full_repeats=full_repeats, full_wall_s=[f["wall_s"] for f in fulls],
               runs_per_s=_median([f["runs_per_s"] for f in fulls]),
               peak_mem_mib=max(f["peak_mem_mib"] for f in fulls),
               self_maxrss_mib=max(f["self_maxrss_mib"] for f in fulls),
               children_maxrss_mib=max(f["children_maxrss_mib"] for f in fulls),
               note=f"measured: the full campaign, {full_repeats} run(s), fresh results folder each time")
    return out


# --------------------------------------------------------------------------- window size


def _size_windows(data: DataSettings, W: WindowsConfig, sizes, n_windows: int) -> dict:
    """``{size: [window_df, ...]}``: stride-sampled windows of consecutive real requests (Azure; ``data``: where and
    how its trace is read, ``W``: the ``windows`` section's seed and tenants)."""
    real = [s for s in data.sources if s == "azure"] or list(data.sources)
    canon = traces.load_canonical(data, real[0])
    out = {}
    for size in sizes:
        cut = windows.cut_windows(canon, n_windows, size, int(W.seed), real[0], int(W.tenants))
        out[size] = [df for _, df in cut]
    return out


def _bench_window_size(sim: SimulationConfig, tables: Mapping, quick: bool) -> dict:
    """Wall time of the same runs on the windows of each size in ``tables`` (:func:`_size_windows`)."""
    engine = campaign.SimEngine()
    scheds = ["fcfs", "sarathi", "srpt_oracle"] if quick else schedulers.names(sim.schedulers)
    loads = sim.loads
    regions = {k: v for k, v in loads.items() if k in ("near_saturation", "overload")} or \
        dict(list(loads.items())[-2:])
    n_windows = max(len(dfs) for dfs in tables.values())
    repeats = 1 if quick else 3
    rows = []
    for size, dfs in tables.items():
        found = [engine.capacity(df, sim) for df in dfs]   # a number, or a record with capacity_rps
        caps = [float(c["capacity_rps"]) if isinstance(c, Mapping) else float(c) for c in found]
        walls, sim_s = [], 0.0
        for rep in range(repeats):
            t0 = time.perf_counter()
            sim_total = 0.0
            for df, cap in zip(dfs, caps):
                for region, rho in regions.items():
                    scaled, horizon = engine.prepare(df, rho, cap, sim)
                    for s in scheds:
                        r = engine.run(scaled, s, campaign.run_seed(0, f"size{size}", s, region, rep), horizon, sim)
                        sim_total += float(r.counters.get("sim_end_s", horizon))
            walls.append(time.perf_counter() - t0)
            sim_s = sim_total
        n_runs = len(dfs) * len(regions) * len(scheds)
        w = _median(walls)
        rows.append({"size": size, "runs": n_runs, "wall_s": w, "wall_per_run_ms": 1000 * w / n_runs,
                     "sim_s_per_wall_s": sim_s / w if w > 0 else float("nan")})
    xs = [math.log(r["size"]) for r in rows]
    ys = [math.log(r["wall_s"]) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"schedulers": scheds, "regions": regions, "windows_per_size": n_windows, "repeats": repeats,
            "rows": rows, "loglog_slope": slope,
            "speedup_per_core": _median([r["sim_s_per_wall_s"] for r in rows if r["size"] == 200])}


def _window_size(data: DataSettings, W: WindowsConfig, sim_cfg: SimulationConfig, quick: bool, sim: Mapping) -> dict:
    """Window-size scaling: from the simulator bench (its report ``sim``) when it measured it, else measured here
    (:func:`_size_windows` of ``data`` and ``W``, runs under ``sim_cfg``)."""
    slopes = sim.get("loglog_slope") if isinstance(sim, Mapping) else None
    if isinstance(slopes, Mapping) and slopes and sim.get("window_size_rows"):
        worst = max(slopes, key=slopes.get)
        per_decision = dict(sim.get("loglog_slope_per_decision") or {})
        return {"from": "bench/simulator.py", "rows": sim["window_size_rows"], "slopes": dict(slopes),
                "slopes_decisions": dict(sim.get("loglog_slope_decisions") or {}),
                "slopes_per_decision": per_decision,
                "loglog_slope": float(slopes[worst]), "worst_scheduler": worst,
                "loglog_slope_per_decision_max": max(per_decision.values()) if per_decision else float("nan")}
    try:
        tables = _size_windows(data, W, WINDOW_SIZES, 2 if quick else 3)
        return {"from": "portbench.bench (campaign engine)", **_bench_window_size(sim_cfg, tables, quick)}
    except Exception as e:
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}


# --------------------------------------------------------------------------- main


def _speedup(sim: Mapping, size: Mapping) -> tuple[float, str]:
    for key in ("speedup_per_core_median", "speedup_per_core", "median_speedup_per_core"):
        v = sim.get(key) if isinstance(sim, Mapping) else None
        if isinstance(v, (int, float)):
            return float(v), "bench/simulator.py"
    v = size.get("speedup_per_core") if isinstance(size, Mapping) else None
    if isinstance(v, (int, float)):
        return float(v), "window-size runs (200 requests; simulator bench unavailable)"
    return float("nan"), "unavailable"


def _verdict(ok) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def main(cfg: Config, quick: bool = False) -> int:
    """Run the benchmark; prints the report and the ``BENCH`` line; writes ``build/bench/bench.json``."""
    t_start = time.perf_counter()
    root = Path(cfg.paths.root)
    out_dir = root / "build" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"portbench bench ({'quick' if quick else 'full'}) on {platform.node()}: {os.cpu_count()} cores, "
          f"load average {load[0]:.2f} (other work on the machine slows every number below)", flush=True)
    report: dict = {"quick": quick, "cpu_count": os.cpu_count(), "loadavg_start": load,
                    "python": platform.python_version(), "params_file": str(cfg.paths.params_file)}

    report["simulator"] = _sub_bench("simulator", quick)
    _print_result("simulator (simulated s per wall s per core)", report["simulator"])
    report["compiled"] = _sub_bench("compiled", quick)
    _print_result("compiled core (compile time; equality with the reference on the simulator's runs)",
                  report["compiled"])

    study = cfg.with_overrides({"sources": {s: None for s in cfg.source_names() if s not in STUDY_SOURCES}})
    for key, c in (("campaign", study), ("campaign_all_sources", cfg)):
        if key == "campaign_all_sources" and c.source_names() == study.source_names():
            continue
        with tempfile.TemporaryDirectory(prefix="campaign-", dir=out_dir) as work:
            try:
                report[key] = _bench_campaign(c, quick, Path(work))
            except Exception as e:
                report[key] = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        _print_result(f"{key} ({', '.join(c.source_names())})", report[key])

    report["window_size"] = _window_size(cfg.data, cfg.windows, cfg.simulation, quick, report["simulator"])
    _print_result("window size", report["window_size"])

    report["ingest"] = _sub_bench("ingest", quick)
    _print_result("ingest", report["ingest"])
    report["analysis"] = _sub_bench("analysis", quick)
    _print_result("analysis", report["analysis"])

    camp = report["campaign"]
    min_policy = float(report["simulator"].get("speedup_min_policy", float("nan")))
    speedup, speed_from = _speedup(report["simulator"], report["window_size"])
    full_s = float(camp.get("full_campaign_s", float("nan")))
    runs_per_s = float(camp.get("runs_per_s", float("nan")))
    peak = float(camp.get("peak_mem_mib", float("nan")))  # the campaign's processes (see the docstring)
    report["bench_process_maxrss_mib"] = _maxrss_mib(resource.RUSAGE_SELF)
    slope = report["window_size"].get("loglog_slope")
    measured = "measured" if camp.get("full_campaign_measured") else "extrapolated"
    every = report.get("campaign_all_sources") or {}
    targets = [
        (f"simulation speed >= {TARGET_SPEEDUP:,.0f}x real time per core (median over schedulers x regions)",
         f"{_fmt(speedup)}x ({speed_from})", None if math.isnan(speedup) else speedup >= TARGET_SPEEDUP),
        (f"full campaign of {', '.join(STUDY_SOURCES)} <= {TARGET_CAMPAIGN_S:.0f} s on {camp.get('workers', '?')} cores",
         f"{_fmt(full_s)} s ({measured}; {camp.get('full_runs', '?')} runs; every default source: "
         f"{_fmt(float(every.get('full_campaign_s', float('nan'))))} s, {every.get('full_runs', '?')} runs)",
         None if math.isnan(full_s) else full_s <= TARGET_CAMPAIGN_S),
        (f"campaign peak memory < {TARGET_PEAK_MIB:.0f} MiB", f"{_fmt(peak)} MiB (main + workers x largest "
         f"worker max RSS; the bench process itself peaked at {_fmt(report['bench_process_maxrss_mib'])} MiB)",
         None if math.isnan(peak) else peak < TARGET_PEAK_MIB),
        (f"every policy's cost about linear in window size (log-log slope <= {TARGET_SLOPE})",
         (f"slope {_fmt(slope)} (worst: {report['window_size'].get('worst_scheduler', '?')}; sizes "
          f"{'/'.join(str(x) for x in sorted({r['size'] for r in report['window_size'].get('rows', [])}))})"
          if isinstance(slope, float) else "n/a"),
         slope <= TARGET_SLOPE if isinstance(slope, float) else None),
        (f"issue #26: median speed-up per core >= {TARGET_SPEEDUP_COMPILED:,.0f}x (engine.core auto; reference "
         f"{_fmt(float(report['simulator'].get('speedup_per_core_median_reference', float('nan'))))}x in the same run)",
         f"{_fmt(speedup)}x", None if math.isnan(speedup) else speedup >= TARGET_SPEEDUP_COMPILED),
        (f"issue #26: slowest policy's median speed-up >= {TARGET_SPEEDUP_MIN_POLICY:,.0f}x",
         f"{_fmt(min_policy)}x ({report['simulator'].get('slowest_policy', '?')})",
         None if math.isnan(min_policy) else min_policy >= TARGET_SPEEDUP_MIN_POLICY),
        (f"issue #26: the default study's campaign (every source) <= {TARGET_CAMPAIGN_ALL_S:.0f} s on 2 cores",
         f"{_fmt(float(every.get('full_campaign_s', float('nan'))))} s",
         None if math.isnan(float(every.get("full_campaign_s", float("nan"))))
         else float(every["full_campaign_s"]) <= TARGET_CAMPAIGN_ALL_S),
        _ingest_memory_target(report["ingest"]),
    ]
    print("\n== targets ==")
    for what, value, ok in targets:
        print(f"  [{_verdict(ok):>7}] {what}: {value}")
    report["targets"] = [{"target": w, "value": v, "met": ok} for w, v, ok in targets]
    report["summary"] = {"speedup_per_core": speedup, "speedup_min_policy": min_policy, "runs_per_s": runs_per_s, "full_campaign_s": full_s,
                         "full_campaign_all_sources_s": float(every.get("full_campaign_s", float("nan"))),
                         "full_campaign_measured": bool(camp.get("full_campaign_measured")),
                         "peak_mem_mib": peak, "loglog_slope": slope}
    report["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["bench_wall_s"] = time.perf_counter() - t_start
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\nwrote {out_dir / 'bench.json'} ({report['bench_wall_s']:.0f} s)")
    print(f"BENCH speedup_per_core={speedup:.6g} speedup_min_policy={min_policy:.6g} runs_per_s={runs_per_s:.6g} full_campaign_s={full_s:.6g} "
          f"peak_mem_mib={peak:.6g} slope_max={slope if isinstance(slope, float) else float('nan'):.6g}", flush=True)
    return 0
