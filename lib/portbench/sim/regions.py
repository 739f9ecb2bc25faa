"""Operating regions: service capacity (sustainable throughput), load rescaling, observation horizon.

Definitions
-----------
* **Capacity** of a window (:func:`saturation`, :func:`capacity`): the *sustainable throughput* of
  the replica on the window's request mix -- the highest arrival rate at which the reference engine
  (``simulation.capacity_policy``, default fcfs, on the campaign's engine: V1 batching) keeps its
  queue bounded. It is measured by a saturation experiment: the window's requests, repeated until
  the backlog holds at least ``min_backlog`` (1,000) requests, all arrive at t = 0, so the engine
  works through a backlog at its limit (KV cache, ``max_num_seqs`` or token budget); its
  completion rate in the *steady part* of that run -- from the time of the ``trim`` (10 %)
  quantile of completions, which skips the start-up transient of the first batch, to the last
  admission, after which the backlog is gone and the batch drains -- is the capacity in
  requests/s. Checked against the definition on long arrival-driven runs (a window's arrival
  pattern repeated 15 times): the queue stays bounded at ρ = 1.0 and grows linearly from ρ = 1.1
  on, where the utilisation saturates at 1.00 (Azure, BurstGPT stand-in). Under persistent overload a deep
  backlog is where the engine ends up, so this is the rate it can sustain (a shallow queue can be
  served faster for a while: utilisation can exceed 1 in a finite overloaded window).
  :func:`burst_capacity` is the earlier definition: completed / makespan of one burst of the
  window's 200 requests, which counts the drain tail of its longest requests and so underestimates
  the capacity, by a lot where a few long requests dominate the makespan.
* **Utilisation** of a run (:func:`utilisation`): the useful work done (prompt tokens computed for
  the first time + tokens generated) between the 10 %-quantile arrival and the last arrival, per
  second, over the capacity expressed in the same unit (capacity × the window's mean useful tokens
  per request): ≈ ρ below saturation (done work tracks offered work; starting after the first 10 %
  of arrivals leaves out the start from an empty engine, and the lag of done behind offered work is
  then about the same at both ends) and about 1 above it.
* **Offered rate** of a window: ``(n − 1) / span`` with ``span = last arrival − first arrival``
  (n arrivals define n − 1 inter-arrival gaps; this is the rate whose mean gap is the window's
  mean gap, independent of where the window starts).
* **Rescaling** (:func:`rescale`): every arrival time is multiplied by one factor
  ``f = (n − 1) / (rho · capacity · span)``, so that the offered rate becomes ``rho ×
  capacity`` while the relative inter-arrival pattern (bursts, gaps, their order) is kept.
* **Horizon** (:func:`horizon_s`): ``horizon_factor × span`` of the rescaled window (the
  observation ends a fixed fraction after the last arrival; under overload requests are left
  unfinished, so completion counts differ).
* **Regions**: names and loads ``rho`` from ``simulation.region_loads`` (default light 0.3,
  moderate 0.5, busy 0.7, near_saturation 0.9, overload 1.2, severe 2.0;
  :attr:`portbench.core.config.SimulationConfig.loads`).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ..core.errors import DataError, ParameterError
from .engine import simulate
from .profiles import get_profile


def check_rho(rho, param: str = "rho") -> float:
    """``rho`` as a float, or ParameterError unless it is a finite number > 0."""
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho <= 0:
        raise ParameterError(param, rho, "a finite load rho > 0 (offered rate / capacity)")
    return float(rho)


def _check_window(window_df) -> None:
    if not isinstance(window_df, pl.DataFrame) or "arrival_s" not in window_df.columns:
        raise DataError("window", "expected a polars DataFrame with columns arrival_s, prompt_tokens, "
                        "output_tokens, tenant")


STEADY_TRIM = 0.1     # the steady part starts at this quantile of completions
# Requests in the saturation experiment's backlog: at least this many, and 16x max_num_seqs. Measured on
# the default profile's windows, the capacity moves by < 1.5 % from 4,000 to 8,000 requests, while a
# 1,000-request backlog is dominated by the start-up transient on sources of short requests (the Bailian
# stand-in: up to 15 % low).
MIN_BACKLOG = 4000
BACKLOG_PER_SEQ = 16


def _pool(windows, min_backlog: int) -> pl.DataFrame:
    """One backlog of every request of ``windows`` (a DataFrame or a sequence of them), repeated until
    it holds at least ``min_backlog`` requests, all at t = 0, in window order."""
    dfs = [windows] if isinstance(windows, pl.DataFrame) else list(windows)
    if not dfs:
        raise DataError("window", "no windows: capacity undefined")
    for df in dfs:
        _check_window(df)
    cols = [c for c in ("prompt_tokens", "output_tokens", "tenant", "block_hashes", "hash_block_tokens")
            if all(c in d.columns for d in dfs)]
    pooled = pl.concat([d.select(cols) for d in dfs], how="vertical_relaxed")
    if pooled.height == 0:
        raise DataError("window", "no requests: capacity undefined")
    reps = max(1, math.ceil(min_backlog / pooled.height))
    if reps > 1:
        pooled = pl.concat([pooled] * reps, how="vertical")
    return pooled.with_columns(pl.lit(0.0).alias("arrival_s"))


def saturation(windows, profile, policy: str = "fcfs", *, engine=None, seed: int = 0,
               trim: float = STEADY_TRIM, min_backlog: int = MIN_BACKLOG,
               hash_block_tokens: int | None = None) -> dict:
    """The saturation experiment (see the module docstring): sustainable throughput of the request
    mix of ``windows`` (one window table or a sequence of them) under ``policy`` on ``engine``.
    Returns ``capacity_rps``, the steady interval ``t_start_s`` .. ``t_end_s`` and what was counted
    in it, the backlog's size, its preemptions, and ``method`` (a sentence)."""
    if not 0 <= trim < 1:
        raise ParameterError("trim", trim, "a fraction in [0, 1)")
    prof = get_profile(profile) if isinstance(profile, str) else profile
    pooled = _pool(windows, max(int(min_backlog), BACKLOG_PER_SEQ * int(getattr(prof, "max_num_seqs", 0) or 0)))
    if hash_block_tokens is None and "hash_block_tokens" in pooled.columns:
        hash_block_tokens = int(pooled["hash_block_tokens"][0])
    res = simulate(pooled, policy, prof, horizon_s=math.inf, seed=seed, engine=engine,
                   hash_block_tokens=hash_block_tokens)
    rec = res.requests
    fin = rec["finish_s"].drop_nans().drop_nulls().sort()
    done = fin.len()
    if done == 0:
        raise DataError("window", "no request fits in the KV cache of the profile: capacity undefined")
    makespan = float(fin.max())
    t_end = float(rec["admitted_s"].drop_nans().max())                  # the last admission
    k = max(1, math.ceil(trim * done))
    t_start = float(fin[k - 1]) if trim > 0 else 0.0
    n_in = int(((fin > t_start) & (fin <= t_end)).sum())
    if not t_end > t_start or n_in < 2:       # too small a backlog for a steady part: whole run
        t_start, t_end, n_in = 0.0, makespan, done
    span = t_end - t_start
    name = getattr(policy, "name", policy)
    return {"capacity_rps": n_in / span, "t_start_s": t_start, "t_end_s": t_end, "completed_in_interval": n_in,
            "backlog": pooled.height, "completed": done, "rejected": int(res.counters["rejected"]),
            "makespan_s": makespan, "policy": name, "trim": trim, "batching": res.counters["batching"],
            "preemptions": int(res.counters["preemptions"]),
            "method": (f"saturation experiment: the window's requests repeated into a backlog of {pooled.height} "
                       f"at t = 0 under {name} ({res.counters['batching']} batching); completions per second from "
                       f"the {trim:.0%} completion quantile to the last admission (the steady part, before the "
                       "backlog runs out)")}


def capacity(windows, profile, policy: str = "fcfs", *, engine=None, seed: int = 0) -> float:
    """Sustainable throughput (requests/s) of the request mix of ``windows`` (one window table or a
    sequence of them): ``saturation(...)["capacity_rps"]``."""
    return float(saturation(windows, profile, policy, engine=engine, seed=seed)["capacity_rps"])


def burst_capacity(window_df, profile, policy: str = "fcfs", *, engine=None, seed: int = 0,
                   hash_block_tokens: int | None = None) -> float:
    """The earlier capacity definition, kept for comparison: all requests of one window at t = 0,
    completed / makespan (includes the drain tail of the longest requests)."""
    _check_window(window_df)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    if window_df.height == 0:
        raise DataError("window", "no requests: capacity undefined")
    burst = window_df.with_columns(pl.lit(0.0).alias("arrival_s"))
    res = simulate(burst, policy, prof, horizon_s=math.inf, seed=seed, engine=engine,
                   hash_block_tokens=hash_block_tokens)
    done = res.counters["completed"]
    if done == 0:
        raise DataError("window", "no request fits in the KV cache of the profile: capacity undefined")
    return done / float(res.requests["finish_s"].max())


UTILISATION_START = 0.1   # utilisation is measured from this quantile of the arrivals to the last one


def utilisation_marks(scaled_df) -> tuple[float, float]:
    """The interval over which a run's utilisation is measured: the arrival time of the
    :data:`UTILISATION_START` quantile request and the last arrival."""
    a = np.sort(scaled_df["arrival_s"].cast(pl.Float64).to_numpy())     # numpy: no thread-pool start per call
    if a.shape[0] < 2:
        return 0.0, 0.0
    return float(a[int(UTILISATION_START * (a.shape[0] - 1))]), float(a[-1])


def utilisation(work_rate_tok_s: float, capacity_rps: float, mean_work_tokens: float) -> float:
    """Achieved utilisation: useful tokens done per second over the interval of
    :func:`utilisation_marks`, over the capacity in the same unit (capacity in requests/s × the
    window's mean useful tokens per request, prompt + output)."""
    if not capacity_rps > 0 or not mean_work_tokens > 0 or work_rate_tok_s != work_rate_tok_s:
        return float("nan")
    return float(work_rate_tok_s) / (capacity_rps * mean_work_tokens)


def offered_rate(window_df) -> float:
    """``(n − 1) / span`` requests/s (span = last − first arrival); DataError if undefined."""
    _check_window(window_df)
    n = window_df.height
    if n < 2:
        raise DataError("window", f"{n} request(s): an offered rate needs at least two arrivals")
    a = window_df["arrival_s"]
    span = float(a.max() - a.min())
    if not span > 0:
        raise DataError("window", "all requests arrive at the same time: offered rate undefined")
    return (n - 1) / span


def scale_factor(window_df, rho: float, capacity_rps: float) -> float:
    """The factor f by which :func:`rescale` multiplies arrival times."""
    rho = check_rho(rho)
    if isinstance(capacity_rps, bool) or not isinstance(capacity_rps, (int, float)) or \
            not math.isfinite(capacity_rps) or capacity_rps <= 0:
        raise ParameterError("capacity_rps", capacity_rps, "a finite capacity > 0 (requests/s)")
    return offered_rate(window_df) / (rho * float(capacity_rps))


def rescale(window_df, rho: float, capacity_rps: float) -> pl.DataFrame:
    """The window with arrival times scaled by one factor so that its offered rate
    ((n−1)/span) is ``rho × capacity_rps``; columns and everything else unchanged."""
    f = scale_factor(window_df, rho, capacity_rps)
    a0 = float(window_df["arrival_s"].min())
    return window_df.with_columns(((pl.col("arrival_s") - a0) * f).alias("arrival_s"))


def horizon_s(scaled_df, factor: float) -> float:
    """Observation horizon = ``factor`` × span of the (rescaled) window (first arrival = 0)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
            or factor <= 0:
        raise ParameterError("simulation.horizon_factor", factor, "a number > 0")
    _check_window(scaled_df)
    a = scaled_df["arrival_s"]
    span = float(a.max() - a.min()) if scaled_df.height else 0.0
    if not span > 0:
        raise DataError("window", "zero span: horizon undefined")
    return float(a.min()) + float(factor) * span
