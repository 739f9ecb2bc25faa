"""Synthetic campaign run tables with planted effects — for the analysis tests only.

The table has the contract's columns (see contracts.md, "Campaign results") and metric names.
Value model, per (source s, window w, region r, scheduler k, replicate q, metric m), on a latent
scale where larger = better::

    z = skill[k, r, m] + source_dev[k, s, r, m] + window[s, w, r, m] * orient
        + planted shifts + interaction noise[k, s, w, r, m] + replicate noise

``window`` is shared by every scheduler of the window (window difficulty), so paired tests over
windows see through it. The latent z maps to the metric's scale: lower-is-better metrics are
``base * exp(-z)`` (seconds etc.), fractions are ``sigmoid(logit(base) + z)``, ``completed`` is a
request count capped at the window size (so every scheduler ties at light load — realistic ties).
A planted effect adds ``shift + sd * N(0, 1)`` (per window) to one scheduler's z in one (source,
region, metric): ``shift`` 0.4 is about a 40-50% relative difference, consistent across windows
when ``sd`` is small and inconsistent when ``sd`` is large.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

SOURCES = ("azure", "burstgpt", "bailian")
SCHEDULERS = ("fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "srpt_oracle", "sjf_predicted", "ltr", "mlfq",
              "las", "rr", "edf", "vtc", "random")
REGIONS = {"light": 0.3, "moderate": 0.5, "busy": 0.7, "near_saturation": 0.9, "overload": 1.2, "severe": 2.0}
# metric -> (direction, kind, base level)
METRICS = {
    "completed": ("higher", "count", None),
    "throughput_tok_s": ("higher", "positive", 800.0),
    "slo_tight": ("higher", "fraction", 0.35),
    "slo_medium": ("higher", "fraction", 0.6),
    "slo_loose": ("higher", "fraction", 0.85),
    "ttft_p50": ("lower", "positive", 0.2),
    "ttft_p90": ("lower", "positive", 1.0),
    "ttft_p95": ("lower", "positive", 1.4),
    "ttft_p99": ("lower", "positive", 2.0),
    "tpot_mean": ("lower", "positive", 0.04),
    "tpot_p90": ("lower", "positive", 0.06),
    "tpot_p95": ("lower", "positive", 0.07),
    "tpot_p99": ("lower", "positive", 0.09),
    "e2e_mean": ("lower", "positive", 6.0),
    "e2e_p90": ("lower", "positive", 14.0),
    "e2e_p95": ("lower", "positive", 18.0),
    "e2e_p99": ("lower", "positive", 25.0),
    "norm_latency_mean": ("lower", "positive", 0.05),
    "slowdown_jain": ("higher", "fraction", 0.7),
    "max_slowdown": ("lower", "positive", 30.0),
}
WINDOW_SIZE = 200


@dataclass
class Effect:
    """Add ``shift + sd * N(0,1)`` (per window) to ``scheduler``'s latent score (larger = better)."""

    scheduler: str
    source: str
    region: str
    metric: str
    shift: float
    sd: float = 0.0


def make_runs(*, schedulers=SCHEDULERS, sources=SOURCES, regions=REGIONS, metrics=tuple(METRICS),
              n_windows: int = 40, replicates: int = 3, effects=(), skill: dict | None = None,
              skill_sd: float = 0.25, source_dev_sd: float = 0.08, window_sd: float = 0.3,
              noise_sd: float = 0.08, replicate_sd: float = 0.02, provenance: dict | None = None,
              seed: int = 0) -> pl.DataFrame:
    """A runs table; ``skill`` = {scheduler: latent skill} fixes skills (no random skills or
    source deviations then), otherwise skills are random per (scheduler, region, metric)."""
    rng = np.random.default_rng(seed)
    S, K, M = list(sources), list(schedulers), list(metrics)
    R = list(regions) if not isinstance(regions, dict) else list(regions)
    rho = regions if isinstance(regions, dict) else {r: REGIONS.get(r, 1.0) for r in R}
    W, Q = n_windows, replicates
    prov = provenance or {s: ("real" if s == "azure" else "standin") for s in S}
    orient = np.array([1.0 if METRICS[m][0] == "higher" else -1.0 for m in M])

    if skill is not None:
        sk = np.broadcast_to(np.array([skill.get(k, 0.0) for k in K])[:, None, None], (len(K), len(R), len(M)))
        dev = np.zeros((len(K), len(S), len(R), len(M)))
    else:
        base = rng.normal(0, skill_sd, (len(K), 1, 1)) + rng.normal(0, skill_sd / 2, (len(K), 1, len(M)))
        sk = base + rng.normal(0, skill_sd / 2, (len(K), len(R), len(M)))
        dev = rng.normal(0, source_dev_sd, (len(K), len(S), len(R), len(M)))
    # dims: (S, W, R, K, Q, M)
    z = np.transpose(sk, (1, 0, 2))[None, None, :, :, None, :]
    z = z + np.transpose(dev, (1, 2, 0, 3))[:, None, :, :, None, :]
    z = z + rng.normal(0, window_sd, (len(S), W, len(R), 1, 1, len(M))) * orient
    z = z + rng.normal(0, noise_sd, (len(S), W, len(R), len(K), 1, len(M)))
    z = z + rng.normal(0, replicate_sd, (len(S), W, len(R), len(K), Q, len(M)))
    for e in effects:
        si, ri, ki, mi = S.index(e.source), R.index(e.region), K.index(e.scheduler), M.index(e.metric)
        z[si, :, ri, ki, :, mi] += (e.shift + e.sd * rng.normal(0, 1, W))[:, None]

    load = np.array([rho[r] for r in R])[None, None, :, None, None]
    vals = np.empty(z.shape)
    for j, m in enumerate(M):
        direction, kind, base_level = METRICS[m]
        zj = z[..., j]
        if kind == "count":
            frac = 1 / (1 + np.exp(-(4.0 / load - 2.5 + zj)))
            vals[..., j] = np.minimum(WINDOW_SIZE, np.round(WINDOW_SIZE * np.minimum(1, frac * 1.15)))
        elif kind == "fraction":
            logit = np.log(base_level / (1 - base_level)) - 1.5 * (load - 0.9)
            vals[..., j] = 1 / (1 + np.exp(-(logit + zj)))
        else:
            scale = base_level * (1 + load) ** (1.5 if direction == "lower" else -0.3)
            vals[..., j] = scale * np.exp(-zj) if direction == "lower" else scale * np.exp(zj)

    ii = np.indices(z.shape[:-1]).reshape(5, -1)
    si, wi, ri, ki, qi = ii
    n = si.size
    df = pl.DataFrame({
        "source": np.asarray(S, dtype=object)[si].tolist(),
        "provenance": [prov[s] for s in np.asarray(S, dtype=object)[si]],
        "window_id": [f"{S[a]}-{b:02d}" for a, b in zip(si, wi)],
        "region": np.asarray(R, dtype=object)[ri].tolist(),
        "rho": np.array([rho[r] for r in R])[ri],
        "scheduler": np.asarray(K, dtype=object)[ki].tolist(),
        "replicate": qi.astype(np.int64),
        "seed": np.arange(n, dtype=np.int64),
        "profile": ["planted"] * n,
        "capacity_rps": np.full(n, 5.0),
        "horizon_s": np.full(n, 60.0),
        "arrived": np.full(n, WINDOW_SIZE, dtype=np.int64),
    })
    flat = vals.reshape(n, len(M))
    completed = flat[:, M.index("completed")] if "completed" in M else np.full(n, WINDOW_SIZE)
    df = df.with_columns(
        pl.Series("completed_n", completed.astype(np.int64)),
        pl.Series("unfinished", (WINDOW_SIZE - completed).astype(np.int64)),
        pl.Series("rejected", np.zeros(n, dtype=np.int64)),
        pl.Series("preemptions", rng.poisson(3, n).astype(np.int64)),
    )
    return df.with_columns([pl.Series(m, flat[:, j]) for j, m in enumerate(M)])


def realistic_effects() -> list[Effect]:
    """A few planted reversals for the realistic-size table the notebooks are tried on."""
    return [
        Effect("sjf_prompt", "azure", "overload", "e2e_mean", 0.5, 0.1),
        Effect("sjf_prompt", "burstgpt", "overload", "e2e_mean", -0.5, 0.1),
        Effect("las", "bailian", "severe", "ttft_p99", 0.6, 0.1),
        Effect("las", "azure", "severe", "ttft_p99", -0.4, 0.1),
        Effect("vtc", "burstgpt", "near_saturation", "slowdown_jain", 0.8, 0.2),
        Effect("mlfq", "azure", "busy", "slo_tight", 0.5, 2.0),      # large but inconsistent
    ]


def write_runs(results_dir, df: pl.DataFrame):
    """Write ``df`` as ``{results_dir}/runs.parquet`` (the folder made a portbench output folder first, as a
    campaign would); returns the path."""
    from pathlib import Path

    from portbench.core import outputs

    p = Path(results_dir) / "runs.parquet"
    outputs.claim(p.parent, Path(__file__).resolve().parents[1])
    df.write_parquet(p)
    return p
