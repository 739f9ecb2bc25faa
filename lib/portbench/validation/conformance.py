"""Conformance: the simulator's scheduling against vLLM's own V1 scheduler, step for step (needs vLLM).

For each real source, window, operating region and policy, the same rescaled window (the campaign's
capacity, region, horizon, profile, engine settings, seed and policy options) is run through

* the simulator, one iteration at a time (``naive=True``: the closed-form decode runs of the
  campaign path are tested against this path by the simulator's own tests), and
* the virtual vLLM engine (:mod:`.virtual`: vLLM's scheduler, stub model, the same cost model),

and compared: every step (start time, prompt tokens, decodes, context tokens, KV blocks in use, and which requests
ran with how many tokens each: ``scheduled``, "row:tokens" by row) and
every request (first-token and finish time, tokens generated, preemptions). :func:`summarise` turns
the comparisons into ``data/results/conformance/summary.json``: per policy the requests and steps
compared, the share of steps identical, the first divergence (where and what), and the per-request
TTFT and E2E differences (max and mean relative).
"""

from __future__ import annotations

import json
import time
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ..sim import schedulers as registry
from ..sim.engine import simulate
from ..study.campaign.engines import SimEngine, scheduler_options
from ..core import io as fileio
from ..core import outputs
from ..core.config import Config, EngineConfig, PathsConfig
from ..core.errors import ParameterError
from ..data import windows as windows_mod
from ..study.campaign.plan import make_plan, run_seed
from ..study.campaign.run import run_tables
from ..vllm.options import PREEMPTIVE
from . import policies, virtual

STEP_COMPARE = ("start_s", "prefill_tokens", "decode_seqs", "context_tokens", "kv_blocks_used", "scheduled")
REGIONS = ("light", "near_saturation", "severe")


@dataclass(frozen=True)
class Case:
    source: str
    window_id: str
    region: str
    rho: float
    policy: str


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    both = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a[both] - b[both]) / np.maximum(np.abs(a[both]), 1e-12)
    return d


def compare(sim_res, virt_res) -> dict:
    """One case: steps and requests of the simulator (naive, iteration trace) against the virtual engine."""
    si, vs = sim_res.iterations, virt_res.steps
    n = min(si.height, vs.height)
    same = np.ones(n, dtype=bool)
    first = None
    for c in STEP_COMPARE:
        if c not in si.columns or c not in vs.columns:
            continue
        x, y = si[c].to_numpy()[:n], vs[c].to_numpy()[:n]
        eq = x == y
        same &= eq
        bad = np.nonzero(~eq)[0]
        if len(bad) and (first is None or bad[0] < first["step"]):
            conv = str if c == "scheduled" else float      # "row:tokens,..." of the step's requests, by row
            first = {"step": int(bad[0]), "column": c, "simulator": conv(x[bad[0]]), "vllm": conv(y[bad[0]])}
    if si.height != vs.height and first is None:
        first = {"step": n, "column": "steps", "simulator": float(si.height), "vllm": float(vs.height)}
    a, b = sim_res.requests, virt_res.requests
    arr = a["arrival_s"].to_numpy()
    ttft_a, ttft_b = a["first_token_s"].to_numpy() - arr, b["first_token_s"].to_numpy() - arr
    e2e_a, e2e_b = a["finish_s"].to_numpy() - arr, b["finish_s"].to_numpy() - arr
    rt, re_ = _rel(ttft_a, ttft_b), _rel(e2e_a, e2e_b)
    records_equal = all(np.array_equal(a[c].to_numpy(), b[c].to_numpy(), equal_nan=True)
                        for c in ("first_token_s", "finish_s", "generated_tokens", "preemptions", "rejected"))
    return {"requests": int(a.height), "finished_sim": int(np.isfinite(e2e_a).sum()),
            "finished_vllm": int(np.isfinite(e2e_b).sum()), "steps_sim": int(si.height), "steps_vllm": int(vs.height),
            "steps_identical": int(same.sum()), "first_divergence": first, "records_identical": bool(records_equal),
            "preemptions_sim": int(sim_res.counters["preemptions"]), "preemptions_vllm": int(virt_res.counters["preemptions"]),
            "ttft_rel_max": float(rt.max()) if rt.size else 0.0, "ttft_rel_sum": float(rt.sum()), "ttft_n": int(rt.size),
            "e2e_rel_max": float(re_.max()) if re_.size else 0.0, "e2e_rel_sum": float(re_.sum()), "e2e_n": int(re_.size),
            "mean_e2e_sim": float(np.nanmean(e2e_a)) if np.isfinite(e2e_a).any() else None,
            "mean_e2e_vllm": float(np.nanmean(e2e_b)) if np.isfinite(e2e_b).any() else None}


def run_case(window_df: pl.DataFrame, case: Case, capacity_rps: float, sim_cfg, engine: SimEngine,
             hash_block_tokens: int | None, native: bool = False) -> tuple[dict, float, float]:
    """Both sides of one case; returns (comparison, simulator seconds, vLLM seconds). ``native``: a preemptive
    policy also runs as its vLLM-native variant (:mod:`portbench.vllm.options`: priority recomputed before each
    step, vLLM's own preemption): ``mean_e2e_native``, ``completed_native``, ``preemptions_native``."""
    scaled, horizon = engine.prepare(window_df, case.rho, capacity_rps, sim_cfg)
    prof = engine.profile(sim_cfg)
    opts = scheduler_options(sim_cfg, case.policy)
    sched = registry.get_scheduler(case.policy, **opts)
    seed = run_seed(sim_cfg.seed, case.window_id, case.policy, case.region, 0)
    eng = EngineConfig.of(sim_cfg.engine)
    pc = eng.prefix_caching != "off" and hash_block_tokens is not None and "block_hashes" in scaled.columns
    t0 = time.perf_counter()
    s = simulate(scaled, sched, prof, horizon_s=horizon, seed=seed, slo=sim_cfg.edf_slo_dict, engine=eng,
                 hash_block_tokens=hash_block_tokens, naive=True, record_iterations=True)
    t1 = time.perf_counter()
    v = virtual.run(scaled, case.policy, prof, horizon_s=horizon, seed=seed, slo=sim_cfg.edf_slo_dict, options=opts,
                    prefix_caching=pc, hash_block_tokens=hash_block_tokens if pc else None,
                    budget=getattr(sched, "prefill_token_budget", None))
    t2 = time.perf_counter()
    out = compare(s, v)
    out["prefix_caching"] = bool(pc)
    out["vllm_steps_per_s"] = v.counters["steps"] / max(t2 - t1, 1e-9)
    if native and case.policy in PREEMPTIVE:
        n = virtual.run(scaled, case.policy, prof, horizon_s=horizon, seed=seed, slo=sim_cfg.edf_slo_dict,
                        options={**opts, "native": True}, prefix_caching=pc,
                        hash_block_tokens=hash_block_tokens if pc else None, log_steps=False)
        e2e = (n.requests["finish_s"] - n.requests["arrival_s"]).to_numpy()
        out["mean_e2e_native"] = float(np.nanmean(e2e)) if np.isfinite(e2e).any() else None
        out["completed_native"] = int(n.counters["completed"])
        out["completed_vllm"] = int(v.counters["completed"])
        out["preemptions_native"] = int(n.counters["preemptions"])
    return out, t1 - t0, time.perf_counter() - t1


SUMMARY_SCHEMA = {"source": pl.Utf8, "window_id": pl.Utf8, "region": pl.Utf8, "policy": pl.Utf8,
                  "requests": pl.Int64, "steps_sim": pl.Int64, "steps_identical": pl.Int64, "ttft_n": pl.Int64,
                  "e2e_n": pl.Int64, "ttft_rel_max": pl.Float64, "ttft_rel_sum": pl.Float64, "e2e_rel_max": pl.Float64,
                  "e2e_rel_sum": pl.Float64, "preemptions_sim": pl.Int64, "preemptions_vllm": pl.Int64,
                  "vllm_steps_per_s": pl.Float64, "records_identical": pl.Boolean, "prefix_caching": pl.Boolean}


def summarise(rows: list[dict]) -> dict:
    """Per policy (and overall): requests and steps compared, share of steps identical, the first
    divergence, per-request TTFT/E2E differences (max and mean relative). The frame has an explicit schema
    (:data:`SUMMARY_SCHEMA`); a divergence (a dict whose values may be ints, floats or request lists) stays out of it."""
    df = pl.DataFrame([{k: r.get(k) for k in SUMMARY_SCHEMA} for r in rows], schema=SUMMARY_SCHEMA, orient="row")
    df = df.with_columns(pl.Series("diverges", [r["first_divergence"] is not None for r in rows], dtype=pl.Boolean),
                         pl.Series("row", list(range(len(rows))), dtype=pl.Int64))
    out = {}
    for pol in sorted(df["policy"].unique().to_list()):
        d = df.filter(pl.col("policy") == pol)
        div = [{**r, "first_divergence": rows[r["row"]]["first_divergence"]} for r in d.iter_rows(named=True)
               if r["diverges"]]
        first = None
        if div:
            r0 = min(div, key=lambda r: (r["source"], r["window_id"], r["region"]))
            first = {"source": r0["source"], "window_id": r0["window_id"], "region": r0["region"], **r0["first_divergence"]}
        steps = int(d["steps_sim"].sum())
        n_t, n_e = int(d["ttft_n"].sum()), int(d["e2e_n"].sum())
        out[pol] = {
            "cases": d.height, "requests": int(d["requests"].sum()), "steps": steps,
            "steps_identical_share": float(d["steps_identical"].sum() / steps) if steps else 1.0,
            "cases_bit_identical": sum(1 for r in d.iter_rows(named=True)
                                       if r["records_identical"] and not r["diverges"]),
            "first_divergence": first,
            "ttft_rel_max": float(d["ttft_rel_max"].max()), "ttft_rel_mean": float(d["ttft_rel_sum"].sum() / n_t) if n_t else 0.0,
            "e2e_rel_max": float(d["e2e_rel_max"].max()), "e2e_rel_mean": float(d["e2e_rel_sum"].sum() / n_e) if n_e else 0.0,
            "preemptions_sim": int(d["preemptions_sim"].sum()), "preemptions_vllm": int(d["preemptions_vllm"].sum()),
            "vllm_steps_per_s_median": float(d["vllm_steps_per_s"].median()),
        }
        out[pol]["bit_identical"] = out[pol]["cases_bit_identical"] == d.height
        # the named difference (docs/conformance.md): vLLM caches 16-token blocks, the simulator whole hash blocks of
        # prompts; a case run with prefix caching may differ by it, a case without it may not
        cached = d.filter(pl.col("prefix_caching").fill_null(False))
        out[pol]["cases_prefix_cached"] = cached.height
        out[pol]["cases_prefix_cached_bit_identical"] = sum(
            1 for r in cached.iter_rows(named=True) if r["records_identical"] and not r["diverges"])
        out[pol]["bit_identical_without_prefix_caching"] = (
            out[pol]["cases_bit_identical"] - out[pol]["cases_prefix_cached_bit_identical"]
            == d.height - cached.height)
    return out


def native_summary(rows: list[dict]) -> dict:
    """The vLLM-native variants beside the ranked plan (rows of :func:`run` with ``native=True``): per policy the
    mean relative difference of mean E2E (native vs ranked, over cases), and per (window, region) whether the order
    of the preemptive policies by mean E2E differs (pairs reversed of those compared)."""
    rs = [r for r in rows if r.get("mean_e2e_native") is not None and r.get("mean_e2e_vllm")]
    out: dict[str, Any] = {"policies": {}, "orders": []}
    for pol in sorted({r["policy"] for r in rs}):
        d = [(r["mean_e2e_native"] - r["mean_e2e_vllm"]) / r["mean_e2e_vllm"] for r in rs if r["policy"] == pol]
        out["policies"][pol] = {"cases": len(d), "e2e_rel_diff_mean": float(np.mean(d)),
                                "e2e_rel_diff_min": float(np.min(d)), "e2e_rel_diff_max": float(np.max(d)),
                                "completed_ranked": sum(r["completed_vllm"] for r in rs if r["policy"] == pol),
                                "completed_native": sum(r["completed_native"] for r in rs if r["policy"] == pol),
                                "preemptions_ranked": sum(r["preemptions_vllm"] for r in rs if r["policy"] == pol),
                                "preemptions_native": sum(r["preemptions_native"] for r in rs if r["policy"] == pol)}
    for key in sorted({(r["window_id"], r["region"]) for r in rs}):
        by = {r["policy"]: r for r in rs if (r["window_id"], r["region"]) == key}
        pols = sorted(by)
        ranked = sorted(pols, key=lambda p: by[p]["mean_e2e_vllm"])
        native = sorted(pols, key=lambda p: by[p]["mean_e2e_native"])
        pairs = [(a, b) for i, a in enumerate(pols) for b in pols[i + 1:]]
        flips = [f"{a}/{b}" for a, b in pairs if (by[a]["mean_e2e_vllm"] < by[b]["mean_e2e_vllm"])
                 != (by[a]["mean_e2e_native"] < by[b]["mean_e2e_native"])]
        out["orders"].append({"window_id": key[0], "region": key[1], "ranked": ranked, "native": native,
                              "pairs": len(pairs), "pairs_reversed": flips})
    out["orders_differ"] = sum(1 for o in out["orders"] if o["pairs_reversed"])
    return out


def run(cfg: Config, *, windows_per_source: int = 2, regions=REGIONS, schedulers=None, sources=None,
        requests_per_window: int | None = None, out_dir=None, progress: bool = True, window_ids=None,
        native: bool = False) -> dict:
    """Conformance of every policy on the real sources' first ``windows_per_source`` windows in ``regions``, or on
    the windows named by ``window_ids`` (e.g. ``["mooncake-25", "azure-17"]``; any real window of the plan)
    (``requests_per_window``: only each window's first requests -- a quick check; capacity from the whole
    window); writes ``{results_dir}/conformance/summary.json`` (and ``cases.parquet``) and returns the summary."""
    sim_cfg = cfg.simulation
    manifest = windows_mod.load_manifest(cfg.paths)      # once for the command: the plan, the windows, their inputs
    plan = make_plan(cfg.plan_settings, manifest=manifest)
    names = list(schedulers) if schedulers else list(plan.schedulers)
    real = [w for w in plan.windows if w.provenance == "real" and (sources is None or w.source in sources)]
    chosen: list = []
    per: dict[str, int] = {}
    if window_ids:
        by_id = {w.id: w for w in real}
        unknown = [i for i in window_ids if i not in by_id]
        if unknown:
            raise ParameterError("--window", unknown[0], "a real window of the plan, e.g. "
                                 + ", ".join(sorted(by_id)[:4]) + f" ({len(by_id)} in all: the window manifest lists them)")
        chosen = [by_id[i] for i in dict.fromkeys(window_ids)]
    for w in ([] if window_ids else real):
        if per.get(w.source, 0) < windows_per_source:
            per[w.source] = per.get(w.source, 0) + 1
            chosen.append(w)
    tables = windows_mod.load_windows(cfg.data, sorted({w.source for w in chosen}), manifest=manifest)
    tables = run_tables(cfg.data, cfg.predictors, sim_cfg, {w.id: tables[w.id] for w in chosen}, names, manifest=manifest,
                        workers=cfg.campaign.workers)
    loads = dict(sim_cfg.region_loads)
    base = SimEngine()
    rows, t_sim, t_vllm = [], 0.0, 0.0
    t_start = time.perf_counter()
    for w in chosen:
        eng = base.for_window(w)
        df = tables[w.id]
        cap = eng.capacity(df, sim_cfg)["capacity_rps"]
        if requests_per_window:
            df = df.head(int(requests_per_window))
        for region in regions:
            for pol in names:
                case = Case(w.source, w.id, region, float(loads[region]), pol)
                if policies.virtual_mode(pol) == "excluded":
                    continue
                res, a, b = run_case(df, case, cap, sim_cfg, eng, w.block_size, native=native)
                t_sim += a
                t_vllm += b
                rows.append({"source": w.source, "window_id": w.id, "region": region, "policy": pol, **res})
                if progress:
                    tag = "identical" if res["records_identical"] and res["first_divergence"] is None else \
                        f"diverges at step {res['first_divergence']['step'] if res['first_divergence'] else '-'}"
                    print(f"[conform] {w.id} {region:15s} {pol:13s} {res['steps_sim']:5d} steps: {tag}", flush=True)
    summary = {"vllm": virtual.check_version(), "windows": [w.id for w in chosen], "regions": list(regions),
               "requests_per_window": requests_per_window,
               "profile": str(sim_cfg.profile), "engine": EngineConfig.of(sim_cfg.engine).as_dict(),
               "policies": summarise(rows), "wall_s": time.perf_counter() - t_start,
               **({"native": native_summary(rows)} if native else {}),
               "simulator_s": t_sim, "vllm_s": t_vllm,
               "vllm_steps_per_s": float(sum(r["steps_vllm"] for r in rows) / t_vllm) if t_vllm else None}
    out = out_folder(cfg.paths, out_dir, "conformance")
    flat = [{k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()} for r in rows]
    table = pl.DataFrame(flat)
    fileio.atomic_write(out / "cases.parquet", table.write_parquet)
    fileio.atomic_write(out / "summary.json", lambda t: Path(t).write_text(json.dumps(summary, indent=1, sort_keys=True)
                                                                          + "\n"))
    return summary


def out_folder(paths: PathsConfig, out_dir, name: str) -> Path:
    """``{results_dir}/name`` (inside the run's claimed results folder), or ``out_dir`` claimed as portbench's own
    (:func:`portbench.core.outputs.claim`: a folder holding someone else's files is refused)."""
    if out_dir:
        return outputs.claim(out_dir, paths.root)
    out = Path(paths.results_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    return out
