"""The window-level sampling error of a metric, beside delta (issue #39).

A window has ~200 requests, so its TTFT p90 rests on ~20 of them and its p99 on 2-3: a window's quantile carries a
sampling error of its own. :func:`sampling_error` bootstraps the requests *within* one run (the per-request records
kept by ``campaign.request_records``) and reports the relative standard error of each metric -- the spread of the
metric over the resamples divided by its value -- as the median over the kept runs, per source and overall, beside
delta. A relative standard error near or above delta means one window cannot tell a delta-sized difference; the
headline's tests pool windows, so this does not bound them, but it says which metrics' window values are mostly noise.

Metrics from the records (completed, non-refused requests): TTFT = first token - arrival; TPOT = (finish - first
token) / (generated - 1) over requests with at least two generated tokens; E2E = finish - arrival. The campaign's own
metric definitions (``portbench.sim.metrics``) may treat requests unfinished at the horizon differently; this is the
sampling error of the completed requests' quantiles. The bootstrap understates the error of an extreme quantile
(a p99 of 200 requests moves between a few order statistics), so the p99 row is a lower bound.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .common import _num

QUANTILES = {"ttft_p50": ("ttft", 0.50), "ttft_p90": ("ttft", 0.90), "ttft_p95": ("ttft", 0.95),
             "ttft_p99": ("ttft", 0.99), "tpot_p90": ("tpot", 0.90), "e2e_mean": ("e2e", None)}
BOOT = 200


def _rel_se(x: np.ndarray, q: float | None, rng: np.random.Generator, boot: int) -> float | None:
    x = x[np.isfinite(x)]
    if x.size < 5:
        return None
    idx = rng.integers(0, x.size, (boot, x.size))
    xs = x[idx]
    point = float(np.mean(x)) if q is None else float(np.quantile(x, q))
    vals = xs.mean(axis=1) if q is None else np.quantile(xs, q, axis=1)
    return float(np.std(vals, ddof=1) / abs(point)) if point else None


def sampling_error(records: pl.DataFrame | None, delta: float, *, boot: int = BOOT, seed: int = 0) -> dict:
    """``summary.json["sampling_error"]``: per metric the median relative standard error of a window's value over
    the kept runs (requests bootstrapped within each run), overall and per source, beside ``delta``."""
    if records is None or not records.height:
        return {"available": False, "reason": "no per-request records (campaign.request_records keeps none)"}
    need = {"source", "window_id", "region", "scheduler", "replicate", "arrival_s", "first_token_s", "finish_s",
            "generated_tokens"}
    if not need <= set(records.columns):
        return {"available": False, "reason": f"the records lack {', '.join(sorted(need - set(records.columns)))}"}
    r = records
    if "refused" in r.columns:
        r = r.filter(~pl.col("refused"))
    r = r.filter(pl.col("finish_s").is_not_null() & pl.col("first_token_s").is_not_null()).with_columns(
        (pl.col("first_token_s") - pl.col("arrival_s")).alias("ttft"),
        (pl.col("finish_s") - pl.col("arrival_s")).alias("e2e"),
        pl.when(pl.col("generated_tokens") >= 2)
        .then((pl.col("finish_s") - pl.col("first_token_s")) / (pl.col("generated_tokens") - 1)).alias("tpot"))
    rng = np.random.default_rng(seed)
    per: dict[str, dict[str, list]] = {}
    keys = ["source", "window_id", "region", "scheduler", "replicate"]
    for key, g in r.sort(keys).group_by(keys, maintain_order=True):
        src = str(key[0])
        for m, (col, q) in QUANTILES.items():
            v = _rel_se(g[col].cast(pl.Float64).to_numpy(), q, rng, boot)
            if v is not None:
                per.setdefault(m, {}).setdefault(src, []).append(v)
    out: dict = {}
    for m, by in per.items():
        allv = np.concatenate([np.asarray(v) for v in by.values()])
        out[m] = {"median_rel_se": _num(np.median(allv)), "q90_rel_se": _num(np.quantile(allv, 0.9)),
                  "runs": int(allv.size), "rel_se_over_delta": _num(np.median(allv) / delta) if delta else None,
                  "by_source": {s: _num(np.median(v)) for s, v in by.items()}}
    return {"available": True, "delta": delta, "bootstrap": boot,
            "definition": "relative standard error of one window's metric: requests bootstrapped within each kept run "
                          f"({boot} resamples; completed requests), median over the runs kept by "
                          "campaign.request_records, beside delta",
            "metrics": out}
