"""The wall-clock engine's run-to-run floor: how well the engine reproduces itself (``summary.json``
``whole_run_prediction.repeatability``, ``targets.e2e_floor``).

Each source's first fidelity window(s) (``validation.repeat_windows``) is replayed a second time right after its
first replay: the same engine, the same scaled window and
scheduled arrivals, the same policy (fcfs), priorities, prompts and horizon, vLLM's prefix cache emptied before it
as before every replay. Its records are kept apart (``raw/`` :data:`RAW_FILE`, steps in the phase
:data:`PHASE`), so nothing else in the analysis sees it. :func:`section` compares the two replays request by
request -- MAPE of TTFT, TPOT and E2E with the first replay as the reference, :func:`.predict.mape`'s definition
-- per source and overall, with both replays' machine speeds (:func:`.predict.speed_factor` against the step
table) and the whole-run prediction's MAPE against the first replay on the same requests beside it;
:func:`e2e_floor` sets the measured floor next to the E2E target.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from . import fidelity, predict
from .common import steps_of

PHASE = "repeat"                                   # the repeat replays' phase in raw/run.json (apart from "fidelity")
RAW_FILE = "engine_repeat_requests.parquet"        # raw/: their records, the columns of raw/engine_requests.parquet
TABLE = "repeat_requests"                          # per request: both replays' latencies and the prediction's

EXPLANATION = (
    "Two wall-clock replays of the same input back to back on the same engine: the same scaled window and scheduled "
    "arrivals, policy fcfs, seeds and horizon, the second right after the first (vLLM's prefix cache emptied before "
    "each). Their per-request disagreement (MAPE of the repeat against the first replay) "
    "is the engine's run-to-run floor on this machine: a deterministic predictor's error against one replay "
    "cannot be expected below the replays' disagreement with each other; when the two replays' deviations from "
    "their common expectation are independent and alike, a perfect predictor's error is roughly the repeat MAPE / "
    "sqrt(2) (an approximation: exact for the mean absolute difference of two independent normal deviations). "
    "The prediction's MAPE is computed against the first replay on the same requests, so the two are comparable.")


def tag(wid: str, region: str) -> str:
    """The repeat replay's tag (its vLLM request ids and its phase entry): its first replay's + ``.repeat``."""
    return f"{wid}.{region}.{PHASE}"


def pairs(first: pl.DataFrame, repeats: pl.DataFrame, prediction: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per request completed in both replays (``first``: the first replays' records, ``repeats``: the repeats',
    both with the columns of ``raw/engine_requests.parquet``): the KEY, ``req_id``, ``rho`` and TTFT, TPOT and E2E
    of the first replay (``<x>``), of the repeat (``<x>_repeat``) and of the prediction (``<x>_prediction``: the
    whole-run prediction's records of the same replays, null where it did not complete the request or is
    absent)."""
    lat = list(fidelity.LATENCIES)
    m = fidelity.matched_latencies(first, repeats).rename({f"{x}_sim": f"{x}_repeat" for x in lat})
    if prediction is not None and prediction.height and m.height:
        p = fidelity.matched_latencies(first, prediction).select(
            *fidelity.KEY, "req_id", *[pl.col(f"{x}_sim").alias(f"{x}_prediction") for x in lat])
        m = m.join(p, on=[*fidelity.KEY, "req_id"], how="left")
    else:
        m = m.with_columns(*[pl.lit(None, dtype=pl.Float64).alias(f"{x}_prediction") for x in lat])
    return m.sort([*fidelity.KEY, "req_id"])


def _mape(m: pl.DataFrame, side: str) -> dict:
    """MAPE of ``<x>_<side>`` against ``<x>`` (the first replay) for TTFT, TPOT, E2E, and the requests counted
    (E2E's)."""
    out = {x: predict.mape(m[f"{x}_{side}"].cast(pl.Float64).to_numpy(), m[x].cast(pl.Float64).to_numpy())
           for x in fidelity.LATENCIES}
    e, ref = (m[c].cast(pl.Float64).to_numpy() for c in (f"e2e_{side}", "e2e"))
    return out | {"requests": int((np.isfinite(e) & np.isfinite(ref) & (ref > 0)).sum())}


def _bias(m: pl.DataFrame) -> float:
    """Mean repeat / first - 1 of E2E (> 0: the repeat ran slower)."""
    a, b = (m[c].cast(pl.Float64).to_numpy() for c in ("e2e", "e2e_repeat"))
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0)
    return float(np.mean(b[ok] / a[ok] - 1.0)) if ok.any() else math.nan


def _speed(logged: pl.DataFrame, phases: list[dict], tag_: str, phase: str, profile) -> tuple[float, float]:
    """The machine speed (:func:`.predict.speed_factor`) and wall seconds of the replay tagged ``tag_`` in
    ``phase`` (its last entry of ``phases``); NaN when it has none."""
    ph = [p for p in phases if p["tag"] == tag_ and p["phase"] == phase and p.get("instance") != "own"]
    if not ph:
        return math.nan, math.nan
    return predict.speed_factor(steps_of(logged, ph[-1]), profile), float(ph[-1]["t1"] - ph[-1]["t0"])


def same_input(first: pl.DataFrame, repeat_rec: pl.DataFrame) -> dict:
    """Did the two replays of one window get the same input? The client sends each request at its scheduled time,
    but simultaneous arrivals (a burst at one timestamp: Mooncake's quantised trace) leave its event loop in an
    order of its own, which the engine serves (FCFS). Per request sent in both (``arrival_s``: the client's send
    time): ``send_order_changed`` = the share whose rank in send order differs, and the send-time difference
    (median, 90 %, ms). ``same`` when no rank changed: only then is the two replays' disagreement the engine's and the
    machine's alone."""
    j = first.select("req_id", "arrival_s").join(repeat_rec.select("req_id", pl.col("arrival_s").alias("again")),
                                                on="req_id").drop_nans().drop_nulls().sort("req_id")
    if j.height == 0:
        return {"requests": 0, "send_order_changed": math.nan, "same": False}
    r1 = j["arrival_s"].rank("ordinal").to_numpy()
    r2 = j["again"].rank("ordinal").to_numpy()
    d = np.abs(j["again"].to_numpy() - j["arrival_s"].to_numpy()) * 1e3
    changed = float(np.mean(r1 != r2))
    return {"requests": j.height, "send_order_changed": changed, "send_diff_ms_median": float(np.median(d)),
            "send_diff_ms_q90": float(np.quantile(d, 0.9)), "same": changed == 0.0}


def section(first: pl.DataFrame, repeats: pl.DataFrame | None, *, prediction: pl.DataFrame | None = None,
            logged: pl.DataFrame | None = None, phases: list[dict] | None = None, profile=None,
            info: list[dict] | None = None, cut: list[dict] | None = None) -> tuple[dict, pl.DataFrame]:
    """``whole_run_prediction.repeatability`` and the per-request table (:func:`pairs`): the repeat replays
    (``repeats``; None or empty: none ran) against their first replays (``first``: every replay's records, the
    repeated ones are picked by KEY), per source and overall; with ``prediction`` (the whole-run prediction's
    records, the prediction variant) its MAPE against the first replay on the same requests; with ``logged`` (the
    step log's rows, every phase), ``phases`` (raw/run.json's, the repeats' included) and ``profile`` (the step
    table) both replays' machine speeds; ``info``: raw/run.json ``repeats`` (the prefix cache's reset); ``cut``:
    the budget's cut replays (a cut repeat says why none ran)."""
    why_cut = [c for c in (cut or []) if str(c.get("replay", "")).startswith(f"{PHASE}:")]
    if repeats is None or repeats.height == 0:
        why = ("every repeat replay was cut: " + "; ".join(f"{c['replay']} ({c['why']})" for c in why_cut)
               if why_cut else "no repeat replay ran (validation.repeat_windows is 0, or a run before the repeats)")
        return {"available": False, "why": why, "what": EXPLANATION}, pl.DataFrame()
    m = pairs(first, repeats, prediction)
    keys = repeats.select(*fidelity.KEY).unique().sort(list(fidelity.KEY)).rows()
    by_source = {s: {**_mape(g, "repeat"), "e2e_bias": _bias(g)}
                 for (s,), g in m.group_by(["source"], maintain_order=True)}
    pred_by_source = {s: _mape(g, "prediction") for (s,), g in m.group_by(["source"], maintain_order=True)}
    info_of = {tuple(d[k] for k in fidelity.KEY): d for d in (info or [])}
    rows = []
    for key in keys:
        s, wid, region, sched = key
        g = m.filter(*[pl.col(c) == x for c, x in zip(fidelity.KEY, key)])
        row: dict = {**dict(zip(fidelity.KEY, key)), "requests": g.height}
        row |= {f"{x}_mape": v for x, v in _mape(g, "repeat").items() if x != "requests"}
        row |= {"e2e_bias": _bias(g), "e2e_mape_prediction": _mape(g, "prediction")["e2e"]}
        inp = same_input(first.filter(*[pl.col(c) == x for c, x in zip(fidelity.KEY, key)]),
                         repeats.filter(*[pl.col(c) == x for c, x in zip(fidelity.KEY, key)]))
        row |= {"same_input": inp["same"], "send_order_changed": inp["send_order_changed"],
                "send_diff_ms_median": inp.get("send_diff_ms_median", math.nan)}
        if logged is not None and phases is not None and profile is not None:
            row["speed_first"], row["first_s"] = _speed(logged, phases, f"{wid}.{region}", "fidelity", profile)
            row["speed_repeat"], row["repeat_s"] = _speed(logged, phases, tag(wid, region), PHASE, profile)
        if key in info_of:
            row["prefix_cache_reset"] = bool(info_of[key].get("prefix_cache_reset"))
        rows.append(row)
    overall = {**_mape(m, "repeat"), "e2e_bias": _bias(m)}
    # the floor only from the windows whose two replays got the same input (the same send order)
    same_keys = [tuple(r[c] for c in fidelity.KEY) for r in rows if r["same_input"]]
    ms = m.join(pl.DataFrame(same_keys, schema=list(fidelity.KEY), orient="row"), on=list(fidelity.KEY), how="semi") \
        if same_keys else m.head(0)
    same = {**_mape(ms, "repeat"), "prediction_e2e": _mape(ms, "prediction")["e2e"],
            "sources": sorted({k[0] for k in same_keys})}
    e2e = same["e2e"]
    return ({"available": True, "what": EXPLANATION,
             "definition": "per request completed in both replays, |repeat - first| / first (predict.mape); the "
                           "prediction's MAPE on the same requests, |prediction - first| / first; e2e_bias: mean "
                           "repeat / first - 1; speeds: each replay's recorded steps' time / the step table's",
             "replays": len(keys), "requests": overall["requests"],
             "mape": overall, "mape_by_source": by_source,
             "prediction_same_requests": {"mape": _mape(m, "prediction"), "mape_by_source": pred_by_source},
             "same_input": same,
             "floor_e2e_approx": e2e / math.sqrt(2) if math.isfinite(e2e) else math.nan,
             "floor_scope": ("the repeated windows whose two replays got the same input (the client sent their "
                             "requests in the same order): a window whose simultaneous arrivals left the client in "
                             "another order is reported, not counted in the floor -- there a prediction given the "
                             "replay's own recorded input faces less than the two replays' disagreement"),
             "per_replay": rows, "cut": why_cut}, m)


def e2e_floor(rep: dict, target: float) -> dict:
    """``targets.e2e_floor``: the engine's measured run-to-run floor (:func:`section`'s ``rep``) next to the E2E
    MAPE target (``target``), whether the target lies below it, in a phrase."""
    if not rep.get("available"):
        return {"available": False, "target_e2e_mape": target, "why": rep.get("why", "no repeat replay")}
    same = rep.get("same_input") or {}
    e2e, floor = float(same.get("e2e", math.nan)), float(rep["floor_e2e_approx"])
    pred = float(same.get("prediction_e2e", math.nan))
    below = bool(math.isfinite(floor) and target < floor)
    if not math.isfinite(floor):
        phrase = ("no repeated window whose two replays got the same input (send order) completed a request in both: "
                  "no floor measured")
    elif below:
        phrase = (f"the {target:.0%} target lies below the engine's own run-to-run floor (~{floor:.1%}: two "
                  f"replays of the same input disagree by {e2e:.1%} on {', '.join(same.get('sources', []))}); no "
                  "deterministic prediction can be expected to meet it on this machine")
    else:
        phrase = (f"the {target:.0%} target lies above the engine's approximate run-to-run floor (~{floor:.1%}; two "
                  f"replays of the same input disagree by {e2e:.1%}): the engine's own noise does not rule it out")
    return {"available": True, "target_e2e_mape": target, "repeat_e2e_mape": e2e, "floor_e2e_mape_approx": floor,
            "prediction_e2e_mape_same_requests": pred, "target_below_floor": below, "phrase": phrase,
            "sources": same.get("sources", []),
            "floor_definition": "repeat E2E MAPE / sqrt(2) (whole_run_prediction.repeatability.what), measured on "
                                "the repeated fidelity replays (fcfs at validation.fidelity_region) whose two "
                                "replays got the same input (repeatability.floor_scope)"}
