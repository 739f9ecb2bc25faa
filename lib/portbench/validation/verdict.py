"""Does the engine reproduce the simulated finding? Paired tests, simulator error, fitted profile.

* **Engine verdict per (case, source)**: the measured metric per scheduler and window
  (``portbench.sim.metrics.compute`` on the replay's records — the one metric function), the oriented
  per-window differences ``a - b`` (positive = a better; orientation from the metric registry), and
  the analysis' own paired test ``portbench.study.stats.paired_wilcoxon`` (two-sided Wilcoxon signed-rank
  over windows). p-values are adjusted over the validation's family (every engine side test of every
  case) with ``analysis.correction``; a side is significant when ``stats.side_significant`` says so
  at ``analysis.alpha``. The relative effect is ``stats.relative_effect`` of the two means.
* **Match with the simulation**: per source, whether the engine's sign equals the simulation's and
  whether significance agrees. A *reversal* reproduces when the engine's signs are opposite on the two
  sources and both sides are significant; a *control* reproduces when every source keeps the
  simulated sign, significantly. ``sign_reproduced`` drops the significance requirement.
* **Simulator error**: the same rescaled windows simulated with the same policies (on the profile
  fitted to this engine), compared request by request (requests completed in both) for TTFT, TPOT
  and E2E: per window the mean of each, and the relative error of the simulator's mean to the
  engine's, plus the median absolute per-request relative error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import polars as pl

from ..study import stats
from ..sim import metrics, profiles
from .cases import Case

KEY = ("source", "window_id", "region", "scheduler")
LATENCIES = ("ttft", "tpot", "e2e")


def metric_direction(metric: str) -> str:
    return metrics.direction(metric)


def window_values(runs: pl.DataFrame, source: str, region: str, metric: str, a: str, b: str
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Windows where both a and b were measured, and the metric of each (replicates averaged)."""
    sub = (runs.filter((pl.col("source") == source) & (pl.col("region") == region)
                       & pl.col("scheduler").is_in([a, b]))
           .group_by(["window_id", "scheduler"]).agg(pl.col(metric).mean()))
    wide = sub.pivot(on="scheduler", index="window_id", values=metric).sort("window_id")
    if a not in wide.columns or b not in wide.columns:
        return [], np.array([]), np.array([])
    wide = wide.drop_nulls([a, b])
    return wide["window_id"].to_list(), wide[a].to_numpy().astype(float), wide[b].to_numpy().astype(float)


@dataclass(frozen=True)
class Side:
    """The engine's paired comparison of a vs b on one source."""

    source: str
    n: int
    mean_a: float
    mean_b: float
    diff: float          # oriented mean difference: positive = a better
    rel: float
    p: float
    test_direction: float


def paired_side(source: str, va: np.ndarray, vb: np.ndarray, direction: str) -> Side:
    """Oriented differences over windows and the analysis' Wilcoxon test (``stats.paired_wilcoxon``)."""
    va, vb = np.asarray(va, float), np.asarray(vb, float)
    if va.size == 0:
        return Side(source, 0, math.nan, math.nan, math.nan, math.nan, math.nan, 0.0)
    d = stats.orient(va, direction) - stats.orient(vb, direction)
    t = stats.paired_wilcoxon(d[None, :])
    ma, mb = float(np.nanmean(va)), float(np.nanmean(vb))
    return Side(source, int(va.size), ma, mb, float(np.nanmean(d)), float(stats.relative_effect(ma, mb)),
                float(t.pvalue[0]), float(t.direction[0]))


def verdict_table(cases: Sequence[Case], engine_runs: pl.DataFrame, *, alpha: float, correction: str,
                  sim_runs: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (case, source): simulation vs engine sign and significance (module docstring).

    ``engine_runs``: one row per (source, window_id, region, scheduler) with one column per metric
    (the replay's measurements). ``sim_runs`` (optional, same layout): the re-simulation of the
    replayed windows on the engine's fitted profile, reported as ``resim_*`` columns.
    """
    rows = []
    for c in cases:
        direction = c.direction or metric_direction(c.metric)
        for s in c.sides:
            wins, va, vb = window_values(engine_runs, s.source, c.region, c.metric, c.a, c.b)
            e = paired_side(s.source, va, vb, direction)
            row = {"case": c.kind, "a": c.a, "b": c.b, "region": c.region, "metric": c.metric,
                   "direction": direction, "source": s.source, "sim_diff": s.diff, "sim_rel": s.rel,
                   "sim_p_adj": s.p_adj, "sim_significant": bool(s.significant), "n_windows": e.n,
                   "engine_mean_a": e.mean_a, "engine_mean_b": e.mean_b, "engine_diff": e.diff,
                   "engine_rel": e.rel, "engine_p": e.p, "engine_test_direction": e.test_direction}
            if sim_runs is not None:
                _, sa, sb = window_values(sim_runs, s.source, c.region, c.metric, c.a, c.b)
                r = paired_side(s.source, sa, sb, direction)
                row.update(resim_diff=r.diff, resim_rel=r.rel, resim_p=r.p)
            rows.append(row)
    if not rows:
        return pl.DataFrame()
    df = pl.DataFrame(rows)
    p = df["engine_p"].to_numpy().astype(float)
    p_adj = stats.adjust_pvalues(p, correction)
    sig = stats.side_significant(p_adj, df["engine_test_direction"].to_numpy(), df["engine_diff"].to_numpy(), alpha)
    df = df.with_columns(pl.Series("engine_p_adj", p_adj), pl.Series("engine_significant", sig.astype(bool)))
    return df.with_columns(
        sign_match=(pl.col("engine_diff").sign() == pl.col("sim_diff").sign()) & (pl.col("engine_diff") != 0),
        significance_match=pl.col("engine_significant") == pl.col("sim_significant"))


def case_summary(verdicts: pl.DataFrame) -> pl.DataFrame:
    """One row per case: did the engine reproduce the finding (sign; sign and significance)?"""
    if verdicts.height == 0:
        return pl.DataFrame()
    out = []
    for (kind, a, b, region, metric), g in verdicts.group_by(["case", "a", "b", "region", "metric"],
                                                              maintain_order=True):
        signs = np.sign(g["engine_diff"].to_numpy())
        sig = g["engine_significant"].to_numpy().astype(bool)
        if kind == "reversal":
            sign_ok = bool(len(signs) == 2 and signs[0] * signs[1] < 0 and g["sign_match"].all())
        else:
            sign_ok = bool(g["sign_match"].all())
        out.append({"case": kind, "a": a, "b": b, "region": region, "metric": metric,
                    "sources": ", ".join(g["source"].to_list()), "windows": int(g["n_windows"].min()),
                    "sign_reproduced": sign_ok, "reproduced": bool(sign_ok and sig.all()),
                    "sign_matches": int(g["sign_match"].sum()), "significance_matches": int(g["significance_match"].sum()),
                    "sides": g.height})
    return pl.DataFrame(out)


# --------------------------------------------------------------------------- simulator error


def latencies(records: pl.DataFrame) -> pl.DataFrame:
    """Per-request TTFT, TPOT, E2E of completed (not rejected, finished) requests."""
    r = records.filter(~pl.col("rejected") & pl.col("finish_s").is_not_nan())
    return r.select(
        "req_id",
        (pl.col("first_token_s") - pl.col("arrival_s")).alias("ttft"),
        pl.when(pl.col("output_tokens") > 1)
        .then((pl.col("finish_s") - pl.col("first_token_s")) / (pl.col("output_tokens") - 1))
        .otherwise(None).alias("tpot"),
        (pl.col("finish_s") - pl.col("arrival_s")).alias("e2e"))


def simulator_error(engine_records: pl.DataFrame, sim_records: pl.DataFrame) -> dict[str, float]:
    """Simulator vs engine on one replayed window (requests completed in both, matched by req_id).

    For each of TTFT, TPOT, E2E: ``<x>_engine`` and ``<x>_sim`` (means), ``<x>_rel_err`` =
    sim mean / engine mean − 1, ``<x>_mape`` = median |sim − engine| / engine over requests.
    """
    e, s = latencies(engine_records), latencies(sim_records)
    j = e.join(s, on="req_id", suffix="_sim")
    out: dict[str, float] = {"n_matched": float(j.height)}
    for x in LATENCIES:
        a = j[x].to_numpy().astype(float) if j.height else np.array([])
        b = j[f"{x}_sim"].to_numpy().astype(float) if j.height else np.array([])
        ok = np.isfinite(a) & np.isfinite(b) & (a > 0)
        me, ms = (float(a[ok].mean()), float(b[ok].mean())) if ok.any() else (math.nan, math.nan)
        out[f"{x}_engine"], out[f"{x}_sim"] = me, ms
        out[f"{x}_rel_err"] = ms / me - 1.0 if ok.any() and me > 0 else math.nan
        out[f"{x}_mape"] = float(np.median(np.abs(b[ok] - a[ok]) / a[ok])) if ok.any() else math.nan
    return out


def error_table(engine_requests: pl.DataFrame, sim_requests: pl.DataFrame) -> pl.DataFrame:
    """:func:`simulator_error` for every (source, window_id, region, scheduler) present in both."""
    rows = []
    keys = engine_requests.select(KEY).unique().sort(list(KEY))
    for k in keys.iter_rows(named=True):
        flt = [pl.col(c) == k[c] for c in KEY]
        e = engine_requests.filter(*flt)
        s = sim_requests.filter(*flt)
        if s.height == 0:
            continue
        rows.append({**k, **simulator_error(e, s)})
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def error_summary(errors: pl.DataFrame) -> pl.DataFrame:
    """Median over windows of the per-window relative error and per-request error, per latency."""
    if errors.height == 0:
        return pl.DataFrame()
    rows = []
    for x in LATENCIES:
        rel = errors[f"{x}_rel_err"].drop_nans().drop_nulls()
        mape = errors[f"{x}_mape"].drop_nans().drop_nulls()
        rows.append({"latency": x.upper(), "windows": rel.len(),
                     "median_rel_err_of_mean": float(rel.median()) if rel.len() else math.nan,
                     "median_abs_rel_err_of_mean": float(rel.abs().median()) if rel.len() else math.nan,
                     "median_per_request_abs_rel_err": float(mape.median()) if mape.len() else math.nan})
    return pl.DataFrame(rows)


# --------------------------------------------------------------------------- profile


def fit_engine_profile(iterations: pl.DataFrame, base, name: str):
    """Cost-model profile fitted to the engine's measured iterations (``profiles.fit_profile``).

    Rows: one per engine iteration (see :mod:`.engine_scheduler`): ``prefill_tokens``,
    ``decode_seqs``, ``context_tokens`` and the measured ``iteration_s``. Memory fields (KV blocks,
    block size, max_num_seqs, chunk budget) come from ``base`` — the engine was configured with
    them. Relative weighting (``relative=True``) so that short decode iterations count as much as
    long prefills.
    """
    rows = iterations.filter(pl.col("iteration_s") > 0)
    return profiles.fit_profile(rows.select(list(profiles.FIT_COLUMNS)), base, name, relative=True)


def profile_fit_table(iterations: pl.DataFrame, profile) -> pl.DataFrame:
    """Measured vs predicted iteration time, by iteration kind (prefill / decode / mixed)."""
    if iterations.height == 0:
        return pl.DataFrame()
    pred = profile.iteration_time(iterations["prefill_tokens"].to_numpy(), iterations["decode_seqs"].to_numpy(),
                                  iterations["context_tokens"].to_numpy())
    it = iterations.with_columns(pl.Series("predicted_s", np.atleast_1d(pred)),
                                 kind=pl.when(pl.col("decode_seqs") == 0).then(pl.lit("prefill only"))
                                 .when(pl.col("prefill_tokens") == 0).then(pl.lit("decode only"))
                                 .otherwise(pl.lit("mixed")))
    return (it.with_columns(rel_err=(pl.col("predicted_s") / pl.col("iteration_s") - 1).abs())
            .group_by("kind").agg(iterations=pl.len(), measured_mean_s=pl.col("iteration_s").mean(),
                                  predicted_mean_s=pl.col("predicted_s").mean(),
                                  median_abs_rel_err=pl.col("rel_err").median())
            .sort("kind"))


def summarize(verdicts: pl.DataFrame, errors: pl.DataFrame | None = None) -> dict:
    """JSON-ready summary of the verdicts and error tables."""
    cs = case_summary(verdicts)
    out = {"cases": cs.to_dicts() if cs.height else []}
    if errors is not None and errors.height:
        out["simulator_error"] = error_summary(errors).to_dicts()
    return out


def engine_metric_rows(records_by_key: Mapping[tuple, pl.DataFrame], horizons: Mapping[tuple, float],
                       slo_defs: Mapping) -> pl.DataFrame:
    """One row per replayed (source, window_id, region, scheduler) with every metric
    (``portbench.sim.metrics.compute`` on the replay's records — the same function as the campaign)."""
    rows = []
    for key, rec in records_by_key.items():
        vals = metrics.compute(rec, horizons[key], slo_defs)
        rows.append({**dict(zip(KEY, key)), "horizon_s": float(horizons[key]),
                     "arrived": rec.height, "completed_n": int((rec["finish_s"] <= horizons[key]).sum()),
                     "rejected": int(rec["rejected"].sum()), "preemptions": int(rec["preemptions"].sum()), **vals})
    return pl.DataFrame(rows) if rows else pl.DataFrame()
