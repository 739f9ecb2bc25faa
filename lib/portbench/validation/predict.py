"""The simulator's prediction for the wall-clock engine: vLLM's own scheduler (:mod:`.virtual`, the project's policy
classes) stepped with the engine's measured step table and the engine's own settings.

* :func:`predict` -- one window on the virtual engine with the engine's settings (:class:`.resim.EngineSettings`:
  KV blocks, block size, budget, ``max_num_seqs``, context, prefix caching, token scale; a policy's own budget --
  sarathi's -- through :func:`.resim.sim_settings`) and the step table's step times;
* :func:`engine_capacity` -- a source's capacity at the engine's scale, as the campaign defines capacity;
* :func:`predict_case` -- each side's predicted effect of a case on the engine (what the plan classifies
  not-testable reasons with and the verdict tests against);
* :func:`fidelity_report` -- absolute latency, a report without a pass mark: every replay predicted from its own
  input (:func:`engine_input`: the client's send times) against the engine, and the A/A pairs' repeat floor.

Import needs vLLM (``.venv-vllm``) for the runs; :func:`available` says whether it can run here.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Mapping

import numpy as np
import polars as pl

from ..core.config import SimulationConfig
from ..sim import metrics
from ..sim.profiles import Profile
from . import capacity, policies, resim
from . import fidelity as fid
from .verdict import oriented

def available() -> bool:
    """Whether the virtual engine can run here (vLLM of the tested version importable)."""
    try:
        from . import virtual
        virtual.check_version()
        return True
    except Exception:      # noqa: BLE001 -- any import failure means: not here
        return False


def policy_settings(es: resim.EngineSettings, scheduler: str, sarathi_budget: int | None) -> resim.EngineSettings:
    """The settings a policy runs with on the virtual engine: ``es``, and for a policy with an engine-wide token
    budget (``sarathi``) that budget (``sarathi_budget``)."""
    if scheduler in resim.ENGINE_WIDE_TOKEN_OPTIONS and sarathi_budget:
        return dataclasses.replace(es, max_num_batched_tokens=int(sarathi_budget))
    return es


def predict(window_df: pl.DataFrame, scheduler: str, seed: int, horizon_s: float, es: resim.EngineSettings,
            profile: Profile, sim: SimulationConfig, hash_block_tokens: int | None = None):
    """One window on the virtual vLLM engine with the settings ``es`` (:func:`.resim.sim_settings`, the
    re-simulation's mapping) and the step times of ``profile``; ``hash_block_tokens``: the trace's tokens per
    block hash (prefix caching when ``es`` has it on). Returns :class:`.virtual.VirtualResult`."""
    from . import virtual

    prof, opts = resim.sim_settings(es, profile, scheduler, sim)
    hb = resim.scaled_hash_block(hash_block_tokens, es)
    df = window_df if hb is not None or "block_hashes" not in window_df.columns else window_df.drop("block_hashes")
    budget = opts.get("prefill_token_budget") if scheduler in resim.ENGINE_WIDE_TOKEN_OPTIONS else None
    return virtual.run(df, scheduler, prof, horizon_s=horizon_s, seed=seed, slo=sim.edf_slo_dict, options=opts,
                       prefix_caching=hb is not None, hash_block_tokens=hb, budget=budget)


def run_metrics(records: pl.DataFrame, horizon_s: float, sim: SimulationConfig) -> dict:
    """The study's metrics of one run's records (the same function for every engine)."""
    return metrics.compute(records, horizon_s, sim.slo_dicts)


def engine_input(window_df: pl.DataFrame, records: pl.DataFrame) -> pl.DataFrame:
    """``window_df`` (sorted by request id) with ``arrival_s`` replaced by the time the replay's client sent each
    request (``records``: the wall-clock engine's records, ``arrival_s`` = the client's send time relative to the
    replay's origin, by ``req_id``; a request the client never sent keeps its scheduled arrival). This is the
    input stream the engine received -- recorded before the engine acted on it. Simultaneous arrivals (Mooncake's
    bursts of up to ~11 requests at one timestamp) reach the engine in the order the client sent them (request-id
    order since the client releases every request from one clock: :func:`.replay._replay`; before, its event
    loop's order); under FCFS that order decides which request's prompt runs first."""
    sent = dict(zip(records["req_id"].to_list(), records["arrival_s"].to_list()))
    arr = window_df["arrival_s"].to_list()
    new = [float(sent[i]) if i in sent and sent[i] is not None and math.isfinite(sent[i]) else float(a)
           for i, a in enumerate(arr)]
    return window_df.with_columns(pl.Series("arrival_s", new))


# --------------------------------------------------------------------------- the engine-scale prediction of a case


def engine_capacity(pool: pl.DataFrame, step_table: Profile, es: resim.EngineSettings, sim: SimulationConfig, *,
                    backlog: int, seed: int, hash_block_tokens: int | None = None) -> dict:
    """The engine's capacity of a source at its own scale, as the campaign defines capacity (a backlog of
    ``backlog`` requests drawn from ``pool`` -- the source's windows as the engine runs them -- at t = 0 under fcfs;
    :func:`.capacity.saturation_throughput`), predicted by the virtual engine with the engine's step table and
    settings: deterministic, no wall-clock run. The load of every replay is rescaled with it, so the engine and its
    prediction see the same offered load."""
    burst = capacity.backlog_workload(pool, backlog, seed)
    res = predict(burst, "fcfs", seed, math.inf, es, step_table, sim, hash_block_tokens)
    return capacity.saturation_throughput(res.requests)


def predict_case(case, step_table: Profile, settings: resim.EngineSettings, *, sim: SimulationConfig,
                 windows: dict[str, list[tuple[pl.DataFrame, float]]], seeds: dict[str, list[int]] | None = None,
                 hash_block_tokens: dict[str, int | None] | None = None) -> dict[str, dict]:
    """Each side's predicted effect of ``case`` on the wall-clock engine: the virtual engine (vLLM's scheduler with
    the project's policy classes) with the engine's own step table and settings (token scale, budget -- a policy's
    own, sarathi's, through :func:`.resim.sim_settings` --, ``max_num_seqs``, block size, context) runs both
    policies on the side's windows as the engine replays them (``windows``: source -> [(rescaled window, horizon)],
    :func:`.stages.inputs`).

    ``case``: a plan entry (a mapping) or any object with ``a``, ``b``, ``metric``. Per source: ``per_window`` -- the window's effect of ``a`` over
    ``b`` on the verdict's scale (:func:`.verdict.oriented`: positive = a better; a log-ratio for a ratio metric, a
    difference for a proportion), ``effect`` their mean (what :func:`.verdict.case_verdicts` takes as the side's
    prediction), ``better`` (the policy the prediction finds better; None at an exact tie), the metric's values.
    ``seeds``: per source the windows' seeds (default 0, 1, ...); ``hash_block_tokens``: per source the trace's
    tokens per block hash (prefix caching as the engine runs it)."""
    a, b, metric = (case[k] if isinstance(case, Mapping) else getattr(case, k) for k in ("a", "b", "metric"))
    out: dict[str, dict] = {}
    for src, wins in windows.items():
        va: list[float] = []
        vb: list[float] = []
        for j, (df, horizon) in enumerate(wins):
            seed = (seeds or {}).get(src, list(range(len(wins))))[j]
            hb = (hash_block_tokens or {}).get(src)
            for pol, vals in ((a, va), (b, vb)):
                res = predict(df, pol, seed, horizon, settings, step_table, sim, hb)
                vals.append(float(run_metrics(res.requests, horizon, sim)[metric]))
        x = oriented(va, vb, metric)
        ok = np.isfinite(x)
        mean = float(x[ok].mean()) if ok.any() else math.nan
        better = None if not math.isfinite(mean) or mean == 0 else (a if mean > 0 else b)
        out[src] = {"effect": mean, "per_window": x.tolist(), "metric_a": va, "metric_b": vb, "windows": len(wins),
                    "better": better, "sd": float(x[ok].std(ddof=1)) if ok.sum() > 1 else math.nan}
    return out


# --------------------------------------------------------------------------- the fidelity report (absolute latency)


def fidelity_report(tab: pl.DataFrame, records: pl.DataFrame, windows_of, step_table: Profile,
                    settings: resim.EngineSettings, sim: SimulationConfig, *, deadline: float | None = None) -> dict:
    """How close the simulator's absolute latencies are on this machine -- a report, without a pass mark (a shared
    machine's speed moves within a replay; the orders are the verdicts' question, not this one):

    * ``whole_run``: every replay of a policy the virtual engine runs, predicted from its own input (the client's
      send times, :func:`engine_input`) with the engine's step table and settings, request by request against the
      engine (:func:`.fidelity.fidelity`: MAPE, bias, correlation of TTFT, TPOT, E2E), per source;
    * ``repeat_floor``: the engine against itself -- per A/A pair (same window, same input, twice), the same
      comparison between its two replays; a prediction cannot be expected closer than about this / sqrt(2).

    ``tab``/``records``: the run's per-replay table and per-request records; ``windows_of(row)``: the replay's
    window as the engine ran it (:class:`.engine.Window`); ``deadline`` (monotonic): replays not predicted by then
    are left out (counted)."""
    keys = ["replay_index"]
    pred, eng, left_out = [], [], 0
    for row in tab.iter_rows(named=True):
        if policies.virtual_mode(row["policy"]) == "excluded":
            continue
        if deadline is not None and time.monotonic() > deadline:
            left_out += 1
            continue
        w = windows_of(row)
        rec = records.filter(pl.col("replay_index") == row["replay_index"]).sort("req_id")
        res = predict(engine_input(w.df, rec), row["policy"], w.priority_seed, w.horizon_s, settings, step_table,
                      sim, w.trace_hash_block)
        pred.append(res.requests.with_columns(pl.lit(row["replay_index"]).alias("replay_index"),
                                              pl.lit(row["source"]).alias("source")))
        eng.append(rec.with_columns(pl.lit(row["source"]).alias("source")))
    out: dict = {"what": "absolute latency: the virtual engine + the engine's step table against the wall-clock "
                         "replays, request by request; no pass mark (orders are the verdicts' question)",
                 "replays_predicted": len(pred), "left_out_for_time": left_out}
    if pred:
        m = fid.matched_latencies(pl.concat(eng, how="diagonal_relaxed"), pl.concat(pred, how="diagonal_relaxed"),
                                  [*keys, "source"])
        out["whole_run"] = {"all": fid.fidelity(m), "by_source": {s: fid.fidelity(g) for (s,), g in
                                                                  m.group_by(["source"], maintain_order=True)}}
    aa = tab.filter(pl.col("is_aa"))
    pairs = []
    for (_, src, _, _), g in aa.group_by(["case", "source", "window", "pair"], maintain_order=True):
        if g.height != 2:
            continue
        first, second = g.sort("position")["replay_index"].to_list()
        r1 = records.filter(pl.col("replay_index") == first).with_columns(pl.lit(0).alias("k"))
        r2 = records.filter(pl.col("replay_index") == second).with_columns(pl.lit(0).alias("k"))
        pairs.append(fid.matched_latencies(r1, r2, ["k"]).with_columns(pl.lit(src).alias("source")))
    if pairs:
        m = pl.concat(pairs, how="diagonal_relaxed")
        f = fid.fidelity(m)
        out["repeat_floor"] = {"pairs": len(pairs), "replay_vs_replay": f,
                               "floor_e2e_mape": f["e2e"]["mape"] / math.sqrt(2) if f["e2e"]["n"] else math.nan,
                               "how": "per A/A pair, its second replay against its first, request by request; the "
                                      "floor of any prediction ~ that MAPE / sqrt(2)"}
    return out
