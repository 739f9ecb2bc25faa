"""The BurstGPT stand-in: (prompt, output) pairs resampled from the real slices, Gamma renewal
arrivals at the full file's mean rate with the slices' window-scale CV (see :mod:`portbench.data.standins`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .. import synth, traces
from ...core.errors import DataError, ParameterError
from .common import (_CACHE, FNSTGGL_ROLLUP, GUANXI_TABLE, StandinInputs, _evidence_digest, evidence_sha256)

TIMESTAMP_RESOLUTION_S = 1.0          # BurstGPT timestamps are whole seconds


def read_burstgpt_slice(path: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Valid rows of a BurstGPT CSV slice through the canonical reader (``traces.read_file``):
    ``row, timestamp_s, prompt_tokens, output_tokens, model, log_type``, and counts of the rows it
    excludes (failures: 0 response tokens)."""
    df, report = traces.read_file(path, "burstgpt")
    out = df.select(pl.col("row").cast(pl.Int64), pl.col("arrival_s").alias("timestamp_s").cast(pl.Float64),
                    pl.col("prompt_tokens").cast(pl.Int64), pl.col("output_tokens").cast(pl.Int64),
                    pl.col("model").cast(pl.String), pl.col("log_type").cast(pl.String)).sort("row")
    excluded = {str(k): int(v) for k, v in report["excluded"].items()}
    return out, {"rows": int(report["rows_read"]), "valid": out.height,
                 "excluded": sum(excluded.values()), "excluded_by_reason": excluded}


@dataclass
class BurstGPTEvidence:
    """The real BurstGPT rows and aggregates a stand-in is built from."""

    slices: list[str]                       # relative paths under the mirror, in pool order
    pool: pl.DataFrame                      # slice, row, timestamp_s, prompt/output_tokens, model, log_type, tenant
    gaps: list[np.ndarray]                  # gaps between consecutive valid requests, per slice
    counts: dict[str, dict[str, Any]]       # per slice: rows, valid, excluded
    full_files: list[dict[str, Any]]        # guanxi data-quality table, one entry per full file
    rollup: dict[str, Any] | None = None    # fnstggl first-60k rollups (comparison only)


def _burstgpt_pool(root: Path, slices: Sequence[str]) -> tuple[pl.DataFrame, list[np.ndarray], dict]:
    frames, gaps, counts = [], [], {}
    for rel in slices:
        df, report = read_burstgpt_slice(root / rel)
        frames.append(df.with_columns(pl.lit(rel).alias("slice")))
        gaps.append(np.diff(df["timestamp_s"].to_numpy().astype(np.float64)))
        counts[rel] = report
    pool = pl.concat(frames).select(
        "slice", "row", "timestamp_s", "prompt_tokens", "output_tokens", "model", "log_type",
        (pl.col("model").fill_null("unknown") + "/" + pl.col("log_type").fill_null("unknown")).alias("tenant"))
    return pool, gaps, counts


def read_full_file_table(path: Path) -> list[dict[str, Any]]:
    """The guanxi data-quality table: per full BurstGPT file ``file_id, rows, days,
    requests_per_hour, model_counts, log_type_counts`` (rows without rates are skipped)."""
    if not path.is_file():
        raise DataError(path, "BurstGPT aggregate table not found")
    raw = pl.read_csv(path, infer_schema=False)
    need = ("file_id", "raw_rows", "duration_days_inclusive", "mean_raw_requests_per_hour",
            "model_frequencies", "log_type_frequencies")
    missing = [c for c in need if c not in raw.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}")
    rows = []
    for i, r in enumerate(raw.iter_rows(named=True), start=1):
        if not r["mean_raw_requests_per_hour"]:
            continue  # the failure-audit row carries no rates
        try:
            rows.append({"file_id": r["file_id"], "rows": int(float(r["raw_rows"])),
                         "days": float(r["duration_days_inclusive"]),
                         "requests_per_hour": float(r["mean_raw_requests_per_hour"]),
                         "model_counts": {k: int(v) for k, v in json.loads(r["model_frequencies"]).items()},
                         "log_type_counts": {k: int(v) for k, v in json.loads(r["log_type_frequencies"]).items()}})
        except (ValueError, TypeError, AttributeError) as e:
            raise DataError(path, f"unparsable aggregate ({e})", row=i) from None
    if not rows:
        raise DataError(path, "no file rows with rates")
    return rows


def _rollup_desc(ev: BurstGPTEvidence) -> str:
    n = int(ev.rollup["numeric_distributions"]["input_tokens"]["count"]) if ev.rollup else 0
    return f"BurstGPT_1 first {n:,} rows"


def read_rollup(path: Path) -> dict[str, Any]:
    """The fnstggl rollup of BurstGPT_1's first rows (token quantiles, subgroup counts)."""
    if not path.is_file():
        raise DataError(path, "BurstGPT rollup not found")
    try:
        data = json.loads(path.read_text())
        data["numeric_distributions"]["input_tokens"]["p50"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(path, f"not the expected rollup JSON ({e})") from None
    return data


def burstgpt_evidence(inp: StandinInputs) -> BurstGPTEvidence:
    """Read (once per process) the slices and aggregates named in ``standins.burstgpt``."""
    root = inp.mirror
    b = inp.standins.burstgpt
    agg = root / b.aggregates
    key = ("burstgpt", str(root), tuple(b.slices), b.aggregates,
           tuple(_evidence_digest(inp.store, rel) for rel in b.slices))
    if key not in _CACHE:
        pool, gaps, counts = _burstgpt_pool(root, b.slices)
        rollup = read_rollup(agg / FNSTGGL_ROLLUP) if (agg / FNSTGGL_ROLLUP).is_file() else None
        _CACHE[key] = BurstGPTEvidence(list(b.slices), pool, gaps, counts,
                                       read_full_file_table(agg / GUANXI_TABLE), rollup)
    return _CACHE[key]


def full_file_id(official_file: str | None) -> str:
    """The aggregate table's id of an official BurstGPT file: ``BurstGPT_2.csv`` -> ``without_fails_2``."""
    m = re.search(r"_(\d+)\.csv$", official_file or "")
    if not m:
        raise ParameterError("sources.burstgpt.file", official_file,
                             "a BurstGPT file name like BurstGPT_without_fails_2.csv")
    return f"without_fails_{m.group(1)}"


def _full_file_row(ev: BurstGPTEvidence, file_id: str) -> dict[str, Any]:
    rows = [r for r in ev.full_files if r["file_id"] == file_id]
    if len(rows) != 1:
        raise DataError(GUANXI_TABLE, f"no aggregate row for {file_id} (have {[r['file_id'] for r in ev.full_files]})")
    return rows[0]


def _pooled_rate_cv(gaps: Sequence[np.ndarray]) -> tuple[float, float]:
    g = np.concatenate(gaps)
    return float(g.size / g.sum()), float(g.std() / g.mean())


def window_normalised_gaps(gaps: np.ndarray, span: int) -> np.ndarray:
    """Each gap divided by the centred moving mean of the ``span`` gaps around it (fewer at the
    ends): rate changes slower than ``span`` requests are removed, burstiness inside them kept."""
    g = np.asarray(gaps, dtype=np.float64)
    h = max(int(span) // 2, 1)
    c = np.concatenate([[0.0], np.cumsum(g)])
    i = np.arange(g.size)
    lo, hi = np.maximum(i - h, 0), np.minimum(i + h + 1, g.size)
    local = (c[hi] - c[lo]) / (hi - lo)
    return np.divide(g, local, out=np.zeros_like(g), where=local > 0)


def _block_resample(g: np.ndarray, block: int, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """``n_boot`` moving-block resamples of ``g`` (rows), each of ``len(g)`` values."""
    n = g.size
    b = min(block, n)
    n_blocks = -(-n // b)
    starts = rng.integers(0, n - b + 1, size=(n_boot, n_blocks))
    idx = (starts[:, :, None] + np.arange(b)[None, None, :]).reshape(n_boot, -1)[:, :n]
    return g[idx]


def _bootstrap_ci(series: Sequence[np.ndarray], stat, *, n_boot: int, block: int,
                  rng: np.random.Generator) -> list[float]:
    pooled = np.concatenate([_block_resample(g, block, rng, n_boot) for g in series], axis=1)
    return [float(v) for v in np.percentile(stat(pooled), [2.5, 97.5])]


def fit_gamma_arrivals(gaps: Sequence[np.ndarray], *, n_boot: int, block: int, span: int,
                       rng: np.random.Generator) -> dict[str, Any]:
    """Rate and CV of within-slice gaps with moving-block (and i.i.d.) bootstrap 95 % CIs.

    ``cv_pooled``: CV of the raw pooled gaps. ``cv_window``: CV of the gaps normalised by their
    ``span``-gap moving mean (:func:`window_normalised_gaps`), i.e. burstiness at a window's scale.
    """
    rate, cv = _pooled_rate_cv(gaps)
    norm = [window_normalised_gaps(g, span) for g in gaps]
    cv_w = float(np.concatenate(norm).std() / np.concatenate(norm).mean())
    out: dict[str, Any] = {"rate_rps": rate, "cv_pooled": cv, "cv_window": cv_w, "cv_window_span_gaps": int(span),
                           "n_gaps": int(sum(g.size for g in gaps))}

    def rate_of(x: np.ndarray) -> np.ndarray:
        return x.shape[1] / x.sum(axis=1)

    def cv_of(x: np.ndarray) -> np.ndarray:
        return x.std(axis=1) / x.mean(axis=1)

    for suffix, b in (("", block), ("_iid", 1)):
        out[f"rate_ci{suffix}"] = _bootstrap_ci(gaps, rate_of, n_boot=n_boot, block=b, rng=rng)
        out[f"cv_pooled_ci{suffix}"] = _bootstrap_ci(gaps, cv_of, n_boot=n_boot, block=b, rng=rng)
        out[f"cv_window_ci{suffix}"] = _bootstrap_ci(norm, cv_of, n_boot=n_boot, block=b, rng=rng)
    return out


def burstgpt_arrival_estimates(inp: StandinInputs, *, bootstrap: bool = True) -> dict[str, Any]:
    """The BurstGPT arrival estimates and the rate/CV the stand-in uses (see the module docstring)."""
    ev = burstgpt_evidence(inp)
    b = inp.standins.burstgpt
    span = int(inp.window_size)
    official = inp.burstgpt_file
    key = ("burstgpt-fit", id(ev), b.bootstrap, b.block_length, inp.standins.seed, bootstrap,
           b.rate, b.cv, span, official)
    if key in _CACHE:
        return _CACHE[key]
    if bootstrap:
        fit = fit_gamma_arrivals(ev.gaps, n_boot=b.bootstrap, block=b.block_length, span=span,
                                 rng=synth.rng_from(inp.standins.seed, "burstgpt", "bootstrap"))
    else:
        rate, cv = _pooled_rate_cv(ev.gaps)
        norm = np.concatenate([window_normalised_gaps(g, span) for g in ev.gaps])
        fit = {"rate_rps": rate, "cv_pooled": cv, "cv_window": float(norm.std() / norm.mean()),
               "cv_window_span_gaps": span, "n_gaps": int(sum(g.size for g in ev.gaps))}
    all_gaps = np.concatenate(ev.gaps)
    var = float(all_gaps.var())
    quant_var = 2 * TIMESTAMP_RESOLUTION_S ** 2 / 12   # two independently rounded timestamps
    real_cv = [synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in real_burstgpt_windows(inp, span)]
    fit.update({
        "per_slice": {rel: {"rate_rps": float(g.size / g.sum()), "cv_pooled": float(g.std() / g.mean()),
                            "cv_window": float(np.std(window_normalised_gaps(g, span))
                                               / np.mean(window_normalised_gaps(g, span))),
                            "n_gaps": int(g.size), "zero_gaps": int((g == 0).sum()),
                            "median_gap_over_mean": float(np.median(g) / g.mean())}
                      for rel, g in zip(ev.slices, ev.gaps)},
        "real_window_cv": {"windows": len(real_cv), "overlapping": True, "size": span,
                           "median": float(np.median(real_cv)) if real_cv else None,
                           "min": float(np.min(real_cv)) if real_cv else None,
                           "max": float(np.max(real_cv)) if real_cv else None},
        "zero_gaps": int((all_gaps == 0).sum()),
        "timestamp_resolution_s": TIMESTAMP_RESOLUTION_S,
        "resolution_cv_relative_effect": float(math.sqrt(max(var - quant_var, 0.0) / var) - 1.0) if var > 0 else 0.0,
        "rate_rph_slices": fit["rate_rps"] * 3600.0,
        "full_file_rates_rph": {r["file_id"]: r["requests_per_hour"] for r in ev.full_files},
    })
    fid = full_file_id(official)
    full_rate = _full_file_row(ev, fid)["requests_per_hour"] / 3600.0
    fit["rate_choice"] = b.rate
    fit["rate_file"] = fid
    fit["rate_rps_full_file"] = full_rate
    fit["rate_rps_used"] = full_rate if b.rate == "full_file" else fit["rate_rps"]
    fit["cv_choice"] = b.cv
    fit["cv_used"] = fit["cv_window"] if b.cv == "window" else fit["cv_pooled"]
    fit["slices_vs_full_file_rate_ratio"] = fit["rate_rps"] / full_rate
    _CACHE[key] = fit
    return fit


def log_type_shares(inp: StandinInputs) -> dict[str, Any]:
    """Log-type shares of the slices' valid rows and of the configured full file."""
    ev = burstgpt_evidence(inp)
    counts = ev.pool.group_by("log_type").len().sort("log_type")
    n = counts["len"].sum()
    slices = {r["log_type"]: r["len"] / n for r in counts.iter_rows(named=True)}
    fid = full_file_id(inp.burstgpt_file)
    full = _full_file_row(ev, fid)["log_type_counts"]
    tot = sum(full.values())
    return {"slices": slices, "full_file": {k: v / tot for k, v in sorted(full.items())}, "full_file_id": fid}


def _log_type_weights(inp: StandinInputs, reweight: bool) -> dict[str, float] | None:
    """Per-log-type row weight making the pool's log-type shares equal the full file's (or None)."""
    if not reweight:
        return None
    shares = log_type_shares(inp)
    missing = [k for k, v in shares["full_file"].items() if v > 0 and k not in shares["slices"]]
    if missing:
        raise DataError("burstgpt slices", f"no valid rows of log type(s) {missing} to reweight toward")
    return {k: shares["full_file"].get(k, 0.0) / v for k, v in shares["slices"].items()}


def _row_weights(pool: pl.DataFrame, weights: Mapping[str, float] | None) -> np.ndarray | None:
    if weights is None:
        return None
    missing = set(pool["log_type"].unique().to_list()) - set(weights)
    if missing:
        raise DataError("burstgpt slices", f"no weight recorded for log type(s) {sorted(missing)}")
    return pool["log_type"].replace_strict(dict(weights), return_dtype=pl.Float64).to_numpy()


def _burstgpt_params(inp: StandinInputs, size: int, reweight: bool | None = None) -> dict[str, Any]:
    ev = burstgpt_evidence(inp)
    fit = burstgpt_arrival_estimates(inp, bootstrap=False)
    b = inp.standins.burstgpt
    reweight = b.reweight_log_types if reweight is None else reweight
    return {
        "size": int(size),
        "evidence": evidence_sha256(inp, "burstgpt"),
        "slices": list(ev.slices),
        "pairs": {"n": ev.pool.height, "rule": "valid rows (Response tokens > 0, Request tokens > 0) of the "
                  "slices, in slice and file order; drawn with replacement",
                  "log_type_weights": _log_type_weights(inp, reweight)},
        "arrivals": {"family": "gamma", "rate_rps": fit["rate_rps_used"], "cv": fit["cv_used"],
                     "rate_basis": (f"full-file mean rate of {fit['rate_file']}" if fit["rate_choice"] == "full_file"
                                    else "pooled within-slice gaps"),
                     "cv_basis": (f"within-slice gaps over their {fit['cv_window_span_gaps']}-gap moving mean"
                                  if fit["cv_choice"] == "window" else "pooled within-slice gaps")},
        "tenant": "<model>/<log type> of the resampled row",
    }


def _burstgpt_window(pool: pl.DataFrame, params: Mapping[str, Any], seed: int) -> pl.DataFrame:
    size = int(params["size"])
    rng = synth.rng_from(seed)
    process = synth.Renewal("gamma", params["arrivals"]["rate_rps"], params["arrivals"]["cv"])
    arrival = synth.renewal_window(process, size, rng)
    idx = synth.resample_pairs(pool.height, size, rng, _row_weights(pool, params["pairs"]["log_type_weights"]))
    rows = pool[idx]
    return synth.window_frame(arrival, rows["prompt_tokens"].to_numpy(), rows["output_tokens"].to_numpy(),
                              rows["tenant"].to_list())


def real_burstgpt_windows(inp: StandinInputs, size: int | None = None) -> list[tuple[str, pl.DataFrame]]:
    """The slices' own windows of ``size`` consecutive valid requests (stride ``size // 4``; they
    overlap, so they are not independent): ``[(name, window table)]``."""
    size = size or inp.window_size
    ev = burstgpt_evidence(inp)
    out = []
    for rel in ev.slices:
        rows = ev.pool.filter(pl.col("slice") == rel)
        for start in range(0, rows.height - size + 1, max(size // 4, 1)):
            part = rows.slice(start, size)
            out.append((f"{Path(rel).name}[{start}:{start + size}]",
                        synth.window_frame(part["timestamp_s"].to_numpy(), part["prompt_tokens"].to_numpy(),
                                           part["output_tokens"].to_numpy(), part["tenant"].to_list())))
    return out


def _reweighted_pool_sample(inp: StandinInputs, n: int) -> pl.DataFrame | None:
    """A sample of ``n`` pairs under log-type reweighting (for the evidence table), or None when the
    slices lack a log type the full file has."""
    ev = burstgpt_evidence(inp)
    try:
        weights = _log_type_weights(inp, True)
    except DataError:
        return None
    rng = synth.rng_from(inp.standins.seed, "burstgpt", "reweighted-variant")
    idx = synth.resample_pairs(ev.pool.height, n, rng, _row_weights(ev.pool, weights))
    return ev.pool[idx]
