"""Sustainable throughput of a backlogged run: one definition for the engine and the simulator.

Capacity (the load unit of the operating regions) is the highest arrival rate at which the
reference engine keeps its queue bounded. With every request of a large sample queued at t = 0
(:func:`backlog_workload`) the engine is saturated until the last request is admitted; its
completion rate over that backlogged stretch, leaving out the ramp-up, is the rate it can sustain.
A burst's *makespan* would also count the drain tail (the last long requests finishing alone) and
underestimate it -- the problem issue #10 describes. :func:`sustainable_throughput` computes it from
the contract's per-request records, so the same function measures the vLLM engine (its replay
records) and the simulator (its run records) and the two capacities can be compared.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ..core.errors import DataError

SKIP_FRACTION = 0.1   # completions left out at the start (the batch filling up)


def backlog_workload(pool: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
    """``n`` requests drawn without replacement (seeded) from ``pool`` (a source's windows), all
    arriving at t = 0, in the drawn order (= FCFS order)."""
    if pool.height == 0:
        raise DataError("saturation pool", "no requests")
    rng = np.random.default_rng(seed)
    idx = rng.choice(pool.height, size=min(int(n), pool.height), replace=False)
    return pool[idx.tolist()].with_columns(pl.lit(0.0).alias("arrival_s"))


def sustainable_throughput(records: pl.DataFrame, *, skip_fraction: float = SKIP_FRACTION) -> dict:
    """Completion rate (requests/s) of a backlogged run in its steady stretch.

    ``records``: per-request records (``arrival_s, first_token_s, finish_s, rejected``) of a run in
    which the queue stays non-empty until the last request is admitted (every request queued at
    t = 0). The steady stretch runs from the finish of the ``ceil(skip_fraction·n)``-th request (the
    batch has filled) to the last first token (after it nobody waits: the engine drains);
    ``capacity_rps`` = completions inside it / its length. When the stretch holds fewer than 10
    completions (a tiny run) the rate falls back to completions / makespan (``method`` says which).
    """
    r = records.filter(~pl.col("rejected") & pl.col("finish_s").is_not_nan() & pl.col("finish_s").is_not_null())
    n = r.height
    if n == 0:
        raise DataError("backlogged run", "no completed request: capacity undefined")
    t0 = float(records["arrival_s"].min())
    fin = np.sort(r["finish_s"].to_numpy().astype(float)) - t0
    k = max(1, math.ceil(skip_fraction * n))
    t_a = float(fin[k - 1])
    t_b = float(np.nanmax(r["first_token_s"].to_numpy().astype(float)) - t0)
    inside = int(np.sum((fin > t_a) & (fin <= t_b)))
    if t_b > t_a and inside >= 10:
        rate, method = inside / (t_b - t_a), "steady backlogged stretch"
    else:
        rate, method = n / float(fin[-1]), "completions / makespan (stretch too short)"
    return {"capacity_rps": float(rate), "method": method, "requests": int(records.height),
            "completed": n, "stretch_start_s": t_a, "stretch_end_s": t_b, "completions_in_stretch": inside,
            "makespan_s": float(fin[-1]), "makespan_rps": float(n / fin[-1])}
