"""Operating regions: per-window service capacity, load rescaling, observation horizon.

Definitions
-----------
* **Capacity** of a window (:func:`capacity`): its measured *saturation throughput* on the
  replica under a reference policy (``simulation.capacity_policy``, default fcfs): every request
  of the window arrives at t = 0, the simulator runs until all have finished, and
  ``capacity = completed requests / makespan`` (requests/s). The engine is then saturated
  (KV-cache or batch bound) the whole time except in the drain at the end, so this is a
  slight underestimate of the steady-state maximum rate; it depends on the window's own
  prompt/output lengths (long outputs -> lower capacity). Rejected requests (never fit in the
  KV cache) are left out of both the count and the load.
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


def capacity(window_df, profile, policy: str = "fcfs", *, seed: int = 0) -> float:
    """Saturation throughput (requests/s) of the window under ``policy``: all requests at t=0,
    capacity = completed / makespan (see the module docstring)."""
    _check_window(window_df)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    if window_df.height == 0:
        raise DataError("window", "no requests: capacity undefined")
    burst = window_df.with_columns(pl.lit(0.0).alias("arrival_s"))
    res = simulate(burst, policy, prof, horizon_s=math.inf, seed=seed)
    done = res.counters["completed"]
    if done == 0:
        raise DataError("window", "no request fits in the KV cache of the profile: capacity undefined")
    makespan = float(res.requests["finish_s"].max())
    return done / makespan


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
