"""Counterfactual windows: a window with one property changed (burstiness, lengths, load)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import polars as pl

from .. import synth
from ...core.config import CounterfactualConfig
from ...core.errors import ParameterError, check_choice

COUNTERFACTUAL_KINDS = ("burstiness", "lengths", "load")


def _pairs_sha256(pairs: pl.DataFrame) -> str:
    h = hashlib.sha256()
    for c in ("prompt_tokens", "output_tokens"):
        h.update(np.ascontiguousarray(pairs[c].to_numpy(), dtype="<i8").tobytes())
    return h.hexdigest()


def counterfactual(window_df: pl.DataFrame, kind: str, *, seed: int, window_id: str | None = None,
                   **params: Any) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A variant of a window changing one property; returns ``(df, definition)``.

    * ``burstiness`` (``cv``, optional ``family`` gamma|weibull): the same requests in the same order
      over the same span (so the same mean rate); the gaps are redrawn from a renewal process with
      the target CV and scaled to sum to the original span. The target is the process CV: the
      sample CV of a 200-request window scatters around it and, for heavy-tailed gaps, below it
      (``definition["after"]`` records the achieved value).
    * ``lengths`` (``pairs``: DataFrame with ``prompt_tokens``, ``output_tokens``; optional
      ``label``): arrivals and tenants kept, (prompt, output) pairs resampled with replacement.
    * ``load`` (``factor`` > 0): arrival times divided by ``factor`` (rate x factor, pattern kept).

    ``definition`` = ``{kind, params (JSON-serialisable), seed, window_id, before, after}``.
    """
    check_choice("kind", kind, COUNTERFACTUAL_KINDS)
    df = window_df.select(list(synth.WINDOW_SCHEMA))
    arr = df["arrival_s"].to_numpy().astype(np.float64)
    rng = synth.rng_from(seed, "counterfactual", kind)
    if kind == "burstiness":
        cv, family = params.get("cv"), params.get("family", "gamma")
        check_choice("family", family, ("gamma", "weibull"))
        if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not (cv > 0 and math.isfinite(cv)):
            raise ParameterError("cv", cv, "a positive target coefficient of variation")
        span = float(arr[-1] - arr[0]) if arr.size else 0.0
        if df.height < 2 or span <= 0:
            raise ParameterError("window_df", df.height, "a window of at least two requests with a positive span")
        process = synth.Renewal(family, (df.height - 1) / span, float(cv))
        gaps = process.gaps(df.height - 1, rng)
        new = synth.arrivals_from_gaps(gaps * (span / gaps.sum()))
        out = df.with_columns(pl.Series("arrival_s", new, dtype=pl.Float64))
        rec = {"cv": float(cv), "family": family, "rate_rps": process.rate, "span_s": span}
    elif kind == "lengths":
        pairs = params.get("pairs")
        if not isinstance(pairs, pl.DataFrame) or not {"prompt_tokens", "output_tokens"} <= set(pairs.columns):
            raise ParameterError("pairs", type(pairs).__name__, "a DataFrame with prompt_tokens and output_tokens")
        pairs = pairs.select(pl.col("prompt_tokens").cast(pl.Int64), pl.col("output_tokens").cast(pl.Int64))
        if pairs.height == 0 or pairs["prompt_tokens"].min() <= 0 or pairs["output_tokens"].min() <= 0:
            raise ParameterError("pairs", pairs.height, "at least one pair, all token counts positive")
        idx = synth.resample_pairs(pairs.height, df.height, rng)
        out = df.with_columns(pairs["prompt_tokens"][idx].alias("prompt_tokens"),
                              pairs["output_tokens"][idx].alias("output_tokens"))
        rec = {"pairs_n": pairs.height, "pairs_sha256": _pairs_sha256(pairs), "label": params.get("label")}
    else:
        factor = params.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                factor > 0 and math.isfinite(factor)):
            raise ParameterError("factor", factor, "a positive number (rate multiplier)")
        out = df.with_columns((pl.col("arrival_s") / float(factor)).alias("arrival_s"))
        rec = {"factor": float(factor)}
    definition = {"kind": kind, "params": rec, "seed": int(seed), "window_id": window_id,
                  "before": _window_summary(df), "after": _window_summary(out)}
    return out, definition


def _window_summary(df: pl.DataFrame) -> dict[str, float]:
    rate, cv = synth.sample_rate_cv(df["arrival_s"].to_numpy())
    return {"n": df.height, "span_s": float(df["arrival_s"][-1] - df["arrival_s"][0]), "rate_rps": rate,
            "interarrival_cv": cv, "prompt_mean": float(df["prompt_tokens"].mean()),
            "output_mean": float(df["output_tokens"].mean())}


def burstiness_comparison(window_df: pl.DataFrame, cf: CounterfactualConfig, *, window_id: str | None = None,
                          window_label: str = "real window", provenance: str = "real", cv: float | None = None
                          ) -> tuple[pl.DataFrame, pl.DataFrame, str]:
    """One window beside its ``burstiness`` variant (target CV ``cf.burstiness_cv``, seed ``cf.seed``):
    ``(table, variant, variant_label)``; the table has one row each (``provenance`` of the window,
    ``counterfactual`` for the variant, whose row carries its definition as JSON)."""
    target = float(cv if cv is not None else cf.burstiness_cv)
    variant, definition = counterfactual(window_df, "burstiness", seed=cf.seed, window_id=window_id, cv=target)
    vlabel = f"burstiness variant (target CV {target:g}, synthetic)"
    rows = []
    for name, prov, df, d in ((window_label, provenance, window_df, None),
                              (vlabel, "counterfactual", variant, definition)):
        rows.append({"window": name, "provenance": prov, **_window_summary(df),
                     "definition": json.dumps(d, sort_keys=True) if d else None})
    return pl.DataFrame(rows), variant, vlabel
