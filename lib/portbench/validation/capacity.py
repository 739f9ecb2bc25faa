"""Capacity of a backlogged run, defined as the campaign defines it: one function for the engine and the simulator.

The campaign's capacity (the load unit of the operating regions) is :func:`portbench.sim.regions.saturation`:
a backlog of requests all arriving at t = 0 under fcfs on vLLM-V1 batching; capacity = completions per
second in the *steady part* of that run, from the finish of the ``ceil(trim·completed)``-th request
(``trim`` = ``regions.STEADY_TRIM``, 10 %: the first batch filling up) to the **last admission** (after it
the backlog is gone and the batch drains); a run too short for a steady part falls back to completed /
makespan. :func:`saturation_throughput` is that computation on a run's per-request records, so it
measures the vLLM engine's saturation run (its records: admission = vLLM's ``scheduled_ts``, the first
time the scheduler took the request, preemptions ignored) and the simulator's run of the same backlog
(admission = ``admitted_s``) alike; ``tests/test_validation.py`` checks that it returns exactly
``regions.saturation``'s numbers on a simulator run.

Backlog (:func:`backlog_workload`, :func:`backlog_size`): the campaign's size rule, at least
``regions.MIN_BACKLOG`` (4,000) and ``regions.BACKLOG_PER_SEQ`` x ``max_num_seqs`` requests -- 4,096 for
the CPU engine (``max_num_seqs`` 256) -- drawn at random from the source's windows as both sides replay
them. The validation shrinks it only when its time budget cannot hold it (see
``portbench.validation``); the size used is recorded with every capacity row.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ..core.errors import DataError
from ..sim import regions

MIN_REQUESTS = 500    # the smallest backlog the validation shrinks to (>= 400 completions after the trim)


def backlog_size(max_num_seqs: int | None, requested: int | None = None) -> int:
    """Requests of the saturation backlog: ``requested`` if given, else the campaign's rule
    (``regions.saturation``): ``max(regions.MIN_BACKLOG, regions.BACKLOG_PER_SEQ * max_num_seqs)``."""
    if requested is not None:
        return int(requested)
    return max(int(regions.MIN_BACKLOG), int(regions.BACKLOG_PER_SEQ) * int(max_num_seqs or 0))


def backlog_workload(pool: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
    """``n`` requests drawn at random (seeded) from ``pool`` (a source's windows), without replacement
    (the pool repeated first when it holds fewer than ``n``, as ``regions.saturation`` repeats its
    windows), all arriving at t = 0, in the drawn order (= FCFS order)."""
    if pool.height == 0:
        raise DataError("saturation pool", "no requests")
    reps = max(1, math.ceil(int(n) / pool.height))
    if reps > 1:
        pool = pl.concat([pool] * reps, how="vertical")
    rng = np.random.default_rng(seed)
    idx = rng.choice(pool.height, size=int(n), replace=False)
    return pool[idx.tolist()].with_columns(pl.lit(0.0).alias("arrival_s"))


def admission_column(records: pl.DataFrame) -> str:
    """``admitted_s`` (simulator records) or ``scheduled_s`` (engine records: vLLM's first scheduling)."""
    for c in ("admitted_s", "scheduled_s"):
        if c in records.columns:
            return c
    raise DataError("backlogged run", "records have neither admitted_s (simulator) nor scheduled_s (engine): "
                    "the last admission, where the steady part ends, is unknown")


def saturation_throughput(records: pl.DataFrame, *, trim: float = regions.STEADY_TRIM) -> dict:
    """Capacity (requests/s) of a backlogged run: ``regions.saturation``'s steady-part rate on ``records``.

    ``records``: per-request records of a run whose requests all arrived at t = 0 (``finish_s``, and the
    admission column of :func:`admission_column`; unfinished requests have NaN ``finish_s``, requests
    never admitted NaN admission). Returns ``capacity_rps`` and ``regions.saturation``'s fields
    (``t_start_s``, ``t_end_s``, ``completed_in_interval``, ``backlog``, ``completed``, ``makespan_s``,
    ``trim``) plus ``admitted`` (requests admitted before the run ended: fewer than ``backlog`` when the
    run was cut before the backlog ran out -- the engine's saturation run has a time guard) and
    ``method``.
    """
    adm = admission_column(records)
    fin = records["finish_s"].drop_nans().drop_nulls().sort()
    done = fin.len()
    if done == 0:
        raise DataError("backlogged run", "no completed request: capacity undefined")
    makespan = float(fin.max())
    admitted = records[adm].drop_nans().drop_nulls()
    t_end = float(admitted.max())                                       # the last admission
    k = max(1, math.ceil(trim * done))
    t_start = float(fin[k - 1]) if trim > 0 else 0.0
    n_in = int(((fin > t_start) & (fin <= t_end)).sum())
    steady = t_end > t_start and n_in >= 2
    if not steady:                        # too small a backlog for a steady part: whole run
        t_start, t_end, n_in = 0.0, makespan, done
    live = records.filter(~pl.col("rejected")).height if "rejected" in records.columns else records.height
    cut = admitted.len() < live
    return {"capacity_rps": n_in / (t_end - t_start), "t_start_s": t_start, "t_end_s": t_end,
            "completed_in_interval": n_in, "backlog": int(records.height), "completed": int(done),
            "admitted": int(admitted.len()), "makespan_s": makespan, "makespan_rps": done / makespan,
            "trim": float(trim),
            "method": (f"completions per second from the {trim:.0%} completion quantile to the last admission "
                       "(regions.saturation's steady part)" if steady else
                       "completed / makespan (backlog too small for a steady part)")
                      + ("; run cut by its time guard before the backlog ran out" if cut else "")}
