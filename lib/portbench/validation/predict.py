"""Whole-run prediction: vLLM's own scheduler (:mod:`.virtual`) stepped with a measured step table.

The virtual vLLM engine runs a replayed window under the **wall-clock engine's settings**
(:class:`.resim.EngineSettings`: KV blocks, block size, budget, ``max_num_seqs``, context limit, prefix
caching, token scale -- the same mapping as the re-simulation, :func:`.resim.sim_settings`) and advances
its clock by a cost-model profile -- in the validation the one fitted to the fixed-shape **step grid**
(:mod:`.steps`), i.e. the engine's measured per-step times. That is a prediction of the wall-clock
replay from per-step timing alone, given the input the engine received: the arrivals as the replay's client
sent them (:func:`engine_input`; simultaneous arrivals reach vLLM in the client's order, which FCFS keeps).
A replay is saturated by a measured rule (:func:`saturated`: offered load at the engine's measured capacity, or
its queue grew, :func:`queue_growth`). What the prediction misses is split by cause (:func:`error_budget`, from
the :data:`VARIANTS`): the arrival order, the machine's speed during the replay (:func:`speed_factor`), the
step table's per-shape error, the divergence of the schedule, the frontend's hand-off (:func:`frontend_delay`).

The same runs are the *engine* side of the two-step verdicts where the virtual engine is the engine:
every policy runs on vLLM's scheduler (MLFQ, RR, VTC included) and ``sarathi`` with its own token budget
x token_scale (:func:`policy_settings`) -- the wall-clock engine cannot run that budget (vLLM requires a
budget of at least ``max_num_seqs``), the virtual one runs it as the simulator does (the running
sequences capped at the budget). Given the same profile, settings, window and seed, the virtual engine
and the simulator take the same steps (:mod:`.conformance`); :func:`predict` is the join the tests check.

Import needs vLLM (``.venv-vllm``); :func:`available` says whether it can run here.
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
from ..sim import regions
from . import capacity, policies, resim
from . import fidelity as fid
from .verdict import oriented

ENGINE_NAME = "virtual vLLM (vLLM's V1 scheduler, measured step table)"


def available() -> bool:
    """Whether the virtual engine can run here (vLLM of the tested version importable)."""
    try:
        from . import virtual
        virtual.check_version()
        return True
    except Exception:      # noqa: BLE001 -- any import failure means: not here
        return False


def policy_settings(es: resim.EngineSettings, scheduler: str, sarathi_budget: int | None) -> resim.EngineSettings:
    """The settings a policy runs with on the virtual engine: ``es``, and for a policy with an engine-wide
    token budget (``sarathi``) that budget (``sarathi_budget``: the simulator's x token_scale, not raised)."""
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


QUEUE_GROWTH_LIMIT = 0.1   # a replay is saturated when its engine's queue grew by more than this (queue_growth)
FRONTEND_QUANTILE = 0.1    # the frontend's hand-off: this quantile of (vLLM's queued_ts - the client's send)

# The whole-run prediction's variants (virtual vLLM engine + the step table), in the error budget's order: each
# adds one measured input to the one before it, so each step's change of the E2E MAPE is one cause's share.
VARIANTS = {
    "trace": "the window's scheduled arrivals in trace order (simultaneous arrivals in request-id order)",
    "engine_input": "the arrivals as the client sent them (its recorded send times: the order the engine got "
                    "simultaneous requests in) -- the prediction",
    "engine_input_frontend": "engine_input + the frontend's hand-off delay (per source: quantile "
                             f"{FRONTEND_QUANTILE:g} of vLLM's queued time - the client's send time)",
    "engine_input_speed": "engine_input with the step table x the replay's measured machine speed (its recorded "
                          "steps' measured / tabled time): the prediction had the machine run as fast during the "
                          "replay as during the step grid",
}
PREDICTION = "engine_input"

# The prediction's sensitivity to its step times: the prediction rerun with every step time of the table x these
# factors (same input, same schedule rules). Its disagreement with the unscaled prediction is the whole-run error that
# a uniform step-time error of that size causes by itself -- what the table's per-shape precision and the machine's
# speed changes (:func:`speed_variation`) are worth in whole-run MAPE on these windows (:func:`sensitivity`).
SENSITIVITY = {"steps_x1.05": 1.05, "steps_x0.95": 0.95}
# The prediction interval of the machine's speed: the prediction rerun with the step table x the step grid's measured
# speed quantiles (:func:`.steps.speed_band`, before any replay); a request is covered when the engine's latency
# lies between the two (:func:`band_coverage`).
BAND = ("speed_band_lo", "speed_band_hi")
SPEED_BIN_S = 0.5    # the machine's speed within a replay: measured / tabled step time per this much of its steps


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


def frontend_delay(records: pl.DataFrame, quantile: float = FRONTEND_QUANTILE) -> float:
    """The frontend's hand-off delay (s): ``quantile`` of vLLM's ``queued_s`` - the client's send ``arrival_s``
    over the admitted requests of ``records`` (a low quantile: the requests that found the engine between steps;
    the others also waited for the running step to end, which the virtual engine models itself)."""
    r = records.filter(~pl.col("rejected")) if "rejected" in records.columns else records
    d = (r["queued_s"] - r["arrival_s"]).drop_nans().drop_nulls()
    return float(d.quantile(quantile)) if d.len() else 0.0


def speed_factor(steps: pl.DataFrame, profile: Profile) -> float:
    """A replay's machine speed: its recorded steps' measured time (``step_s``) over the step table's time for
    the same shapes (1 = as fast as during the step grid; > 1 slower). NaN without steps."""
    if steps.height == 0:
        return math.nan
    a = steps["attention_pairs"].fill_null(0).to_numpy() if "attention_pairs" in steps.columns else 0
    pred = np.atleast_1d(profile.iteration_time(steps["prefill_tokens"].to_numpy(), steps["decode_seqs"].to_numpy(),
                                                steps["context_tokens"].to_numpy(), a)).astype(float)
    return float(steps["step_s"].sum() / pred.sum()) if pred.sum() > 0 else math.nan


def scaled_profile(p: Profile, f: float) -> Profile:
    """``p`` with every step-time term x ``f``."""
    return dataclasses.replace(p, c0_s=p.c0_s * f, c_prefill_s=p.c_prefill_s * f, c_decode_s=p.c_decode_s * f,
                               c_kv_s=p.c_kv_s * f, c_attn_s=p.c_attn_s * f, floor_s=p.floor_s * f)


def queue_growth(records: pl.DataFrame) -> float:
    """Whether the engine kept up with a replay, measured on its own records: the mean number of requests in the
    engine (arrived, not finished) over the last third of the arrival period minus that over the middle third,
    divided by the requests that arrived in the last third. ~0 when the queue is stable (the first third, the
    fill-up of an empty engine, is left out); about 1 - (completion rate / arrival rate) when it grows."""
    a = np.sort(records["arrival_s"].drop_nans().drop_nulls().to_numpy().astype(float))
    if a.size < 3 or a[-1] <= a[0]:
        return math.nan
    f = np.sort(records["finish_s"].fill_nan(None).fill_null(np.inf).to_numpy().astype(float))
    ts = np.linspace(a[0], a[-1], 301)
    n = np.searchsorted(a, ts, side="right") - np.searchsorted(f, ts, side="right")
    late = int(np.sum(a > a[0] + (a[-1] - a[0]) * 2 / 3))
    return float((n[200:].mean() - n[100:200].mean()) / max(late, 1))


def saturated(rho: float, growth: float, limit: float = QUEUE_GROWTH_LIMIT) -> bool:
    """A replay is saturated when its offered load reaches the engine's measured capacity (``rho`` >= 1: the
    window was rescaled with the capacity ``capacity.saturation_throughput`` measured) or the engine's queue grew
    during it (:func:`queue_growth` > ``limit``); a NaN growth counts as not grown."""
    return bool(rho >= 1.0 or (math.isfinite(growth) and growth > limit))


def error_budget(stages: dict, step_table_on_engine_schedule: float) -> dict:
    """The E2E MAPE of the whole-run prediction split by cause, from the MAPEs of the :data:`VARIANTS` on the same
    requests (``stages``: variant -> E2E MAPE) and ``step_table_on_engine_schedule`` (the step table's times x the
    replay's machine speed summed over the engine's *own recorded* steps in each request's lifetime: the error had
    the prediction taken the engine's exact schedule -- the step table's per-shape error alone).

    Causes (differences of MAPEs, in the order the inputs are added; they need not add up exactly):
    ``arrival_order`` = trace - engine_input (the order and times the engine got simultaneous requests in);
    ``machine_speed`` = engine_input - engine_input_speed (the shared machine ran the replay at another speed than
    the step grid); ``step_table_shapes`` = the step table's per-shape error on the engine's schedule;
    ``schedule_divergence`` = engine_input_speed - step_table_shapes (the virtual schedule differs from the
    engine's: timing-dependent decisions, random draws, the integration of step errors into queueing);
    ``frontend`` = engine_input_frontend - engine_input (adding the measured hand-off delay; negative: it
    helps)."""
    g = {k: float(stages.get(k, math.nan)) for k in VARIANTS}

    def diff(a: float, b: float) -> float:
        return a - b if math.isfinite(a) and math.isfinite(b) else math.nan
    st = float(step_table_on_engine_schedule)
    return {"e2e_mape_trace_order": g["trace"], "e2e_mape_prediction": g["engine_input"],
            "e2e_mape_with_machine_speed": g["engine_input_speed"],
            "e2e_mape_with_frontend": g["engine_input_frontend"],
            "arrival_order": diff(g["trace"], g["engine_input"]),
            "machine_speed": diff(g["engine_input"], g["engine_input_speed"]),
            "step_table_shapes": st,
            "schedule_divergence": diff(g["engine_input_speed"], st),
            "frontend": diff(g["engine_input_frontend"], g["engine_input"]),
            "explanation": "E2E MAPE of the whole-run prediction by cause, each a measured counterfactual on the same "
                           "requests: arrival_order = trace order - the client's send order; machine_speed = "
                           "prediction - prediction x the replay's measured machine speed; step_table_shapes = the "
                           "step table (x machine speed) summed over the engine's own recorded steps; "
                           "schedule_divergence = the rest of the speed-corrected prediction's error; frontend = "
                           "the change when the measured hand-off delay is added (differences of MAPEs)"}


def mape(a: np.ndarray, ref: np.ndarray) -> float:
    """Mean of |a - ref| / ref over finite pairs with ref > 0 (NaN when none)."""
    a, ref = np.asarray(a, float), np.asarray(ref, float)
    m = np.isfinite(a) & np.isfinite(ref) & (ref > 0)
    return float(np.mean(np.abs(a[m] - ref[m]) / ref[m])) if m.any() else math.nan


def sensitivity(head: pl.DataFrame, scaled: dict[str, pl.DataFrame], keys: list[str]) -> dict:
    """Per-request MAPE of TTFT, TPOT and E2E of each step-time-scaled prediction (``scaled``: name ->
    its requests, :data:`SENSITIVITY`) against the unscaled prediction ``head`` on the same requests (matched by
    ``keys`` + ``req_id``), overall and per ``source``: the whole-run error a uniform step-time error of that
    factor causes by itself."""
    from . import fidelity

    out: dict = {}
    for name, df in scaled.items():
        m = fidelity.matched_latencies(head, df, keys)
        if m.height == 0:
            continue
        f = fidelity.fidelity(m)
        out[name] = {"factor": SENSITIVITY.get(name, math.nan),
                     **{x: f[x]["mape"] for x in fidelity.LATENCIES}, "requests": f["e2e"]["n"],
                     "by_source": {s: {x: fidelity.fidelity(g)[x]["mape"] for x in fidelity.LATENCIES}
                                   for (s,), g in m.group_by(["source"], maintain_order=True)}
                     if "source" in m.columns else {}}
    return out


def speed_variation(steps: pl.DataFrame, profile: Profile, bin_s: float = SPEED_BIN_S) -> np.ndarray:
    """The machine's speed within one replay: its recorded steps (``t_start``, ``step_s`` and the shape columns) cut
    into consecutive ``bin_s`` pieces of time; per piece the measured / tabled time of its steps (1 = as fast as the
    step grid). The spread of these over a replay is how much the machine's speed changes while it runs -- a
    change no table measured before the replay can know."""
    if steps.height == 0:
        return np.array([])
    t = steps["t_start"].to_numpy().astype(float)
    a = steps["attention_pairs"].fill_null(0).to_numpy() if "attention_pairs" in steps.columns else 0
    tab = np.atleast_1d(profile.iteration_time(steps["prefill_tokens"].to_numpy(), steps["decode_seqs"].to_numpy(),
                                               steps["context_tokens"].to_numpy(), a)).astype(float)
    b = np.floor((t - t.min()) / float(bin_s)).astype(np.int64)
    meas = np.bincount(b, weights=steps["step_s"].to_numpy().astype(float))
    pred = np.bincount(b, weights=tab)
    ok = pred > 0
    return meas[ok] / pred[ok]


def band_coverage(lo: pl.DataFrame, hi: pl.DataFrame) -> dict:
    """The share of requests whose engine latency lies inside the prediction's speed band: ``lo``/``hi`` are
    :func:`.fidelity.matched_latencies` of the engine against the prediction at the band's two speeds (same
    requests); per TTFT, TPOT and E2E the share with min(lo, hi) <= engine <= max(lo, hi), and the share above
    (the engine slower than the slow end), overall and per ``source``."""
    from . import fidelity

    keys = [c for c in (*fidelity.KEY, "req_id") if c in lo.columns]
    m = lo.join(hi.select(*keys, *[pl.col(f"{x}_sim").alias(f"{x}_hi") for x in fidelity.LATENCIES]), on=keys)

    def shares(d: pl.DataFrame) -> dict:
        out: dict = {"requests": d.height}
        for x in fidelity.LATENCIES:
            e, a, b = (d[c].to_numpy().astype(float) for c in (x, f"{x}_sim", f"{x}_hi"))
            ok = np.isfinite(e) & np.isfinite(a) & np.isfinite(b)
            lo_, hi_ = np.minimum(a[ok], b[ok]), np.maximum(a[ok], b[ok])
            out[x] = float(np.mean((e[ok] >= lo_) & (e[ok] <= hi_))) if ok.any() else math.nan
            out[f"{x}_above"] = float(np.mean(e[ok] > hi_)) if ok.any() else math.nan
        return out
    if m.height == 0:
        return {"requests": 0}
    return {**shares(m), "by_source": {s: shares(g) for (s,), g in m.group_by(["source"], maintain_order=True)}
            if "source" in m.columns else {}}


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


def side_windows(windows: list[pl.DataFrame], es: resim.EngineSettings, rho: float, capacity_rps: float,
                 horizon_factor: float) -> list[tuple[pl.DataFrame, float]]:
    """The windows of one side as the engine replays them: prepared (:func:`.resim.prepare_window`: first N
    requests, token scale, context limit), rescaled to ``rho`` x the engine's capacity, with their horizons."""
    out = []
    for w in windows:
        df, _ = resim.prepare_window(w, es)
        sc = regions.rescale(df, rho, capacity_rps)
        out.append((sc, float(regions.horizon_s(sc, horizon_factor))))
    return out


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
