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
  moderate 0.5, busy 0.7, near_saturation 0.9, overload 1.2, severe 2.0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import polars as pl

from ..core.errors import DataError, ParameterError, check_choice, check_choices

DEFAULT_REGION_LOADS = {"light": 0.3, "moderate": 0.5, "busy": 0.7, "near_saturation": 0.9,
                        "overload": 1.2, "severe": 2.0}


def region_loads(P: Mapping | None = None) -> dict[str, float]:
    """``{region: rho}`` from ``simulation.region_loads`` (validated), or the defaults."""
    loads = (P or {}).get("simulation", {}).get("region_loads") if P else None
    loads = DEFAULT_REGION_LOADS if loads is None else loads
    if not isinstance(loads, Mapping) or not loads:
        raise ParameterError("simulation.region_loads", loads, "a non-empty mapping region -> rho > 0")
    out = {}
    for name, rho in loads.items():
        out[str(name)] = check_rho(rho, f"simulation.region_loads.{name}")
    return out


def check_rho(rho, param: str = "rho") -> float:
    """``rho`` as a float, or ParameterError unless it is a finite number > 0."""
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho <= 0:
        raise ParameterError(param, rho, "a finite load rho > 0 (offered rate / capacity)")
    return float(rho)


def region_rho(region: str, P: Mapping | None = None) -> float:
    """The load of a named region; unknown name -> ParameterError listing the regions."""
    loads = region_loads(P)
    check_choice("simulation.regions", region, list(loads))
    return loads[region]


def regions(P: Mapping) -> dict[str, float]:
    """The regions of a run (``simulation.regions``, ``all`` = every region) with their loads."""
    loads = region_loads(P)
    names = check_choices("simulation.regions", P.get("simulation", {}).get("regions", "all"), list(loads))
    return {n: loads[n] for n in names}


def _check_window(window_df) -> None:
    if not isinstance(window_df, pl.DataFrame) or "arrival_s" not in window_df.columns:
        raise DataError("window", "expected a polars DataFrame with columns arrival_s, prompt_tokens, "
                        "output_tokens, tenant")


def capacity(window_df, profile, policy: str = "fcfs", *, seed: int = 0) -> float:
    """Saturation throughput (requests/s) of the window under ``policy``: all requests at t=0,
    capacity = completed / makespan (see the module docstring)."""
    from . import engine as simulator
    from .profiles import get_profile

    _check_window(window_df)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    if window_df.height == 0:
        raise DataError("window", "no requests: capacity undefined")
    burst = window_df.with_columns(pl.lit(0.0).alias("arrival_s"))
    res = simulator.simulate(burst, policy, prof, horizon_s=math.inf, seed=seed)
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


def validate_simulation_params(P: Mapping) -> None:
    """Check the ``simulation`` section: schedulers and their options, regions and loads, profile,
    SLO definitions, edf_slo, capacity policy, horizon factor, replicates, seed, predictor sigma.
    Raises ParameterError naming the parameter and what is allowed."""
    from . import schedulers as sch

    s = P.get("simulation")
    if not isinstance(s, Mapping):
        raise ParameterError("simulation", s, "a mapping (see papermill_params/default.yaml)")
    names = check_choices("simulation.schedulers", s.get("schedulers", "all"), list(sch.SCHEDULERS))
    check_choice("simulation.capacity_policy", s.get("capacity_policy", "fcfs"), list(sch.SCHEDULERS))
    loads = region_loads(P)
    check_choices("simulation.regions", s.get("regions", "all"), list(loads))
    hf = s.get("horizon_factor", 1.5)
    if isinstance(hf, bool) or not isinstance(hf, (int, float)) or not math.isfinite(hf) or hf <= 0:
        raise ParameterError("simulation.horizon_factor", hf, "a number > 0 (horizon = factor x rescaled span)")
    rep = s.get("replicates", 1)
    if isinstance(rep, bool) or not isinstance(rep, int) or rep <= 0:
        raise ParameterError("simulation.replicates", rep, "a positive integer")
    seed = s.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ParameterError("simulation.seed", seed, "a non-negative integer")
    sig = s.get("predictor_sigma", 0.5)
    if isinstance(sig, bool) or not isinstance(sig, (int, float)) or not math.isfinite(sig) or sig < 0:
        raise ParameterError("simulation.predictor_sigma", sig, "a number >= 0")
    slo = s.get("slo")
    if not isinstance(slo, Mapping) or not slo:
        raise ParameterError("simulation.slo", slo, "a non-empty mapping name -> {ttft_s, tpot_s}")
    for name, spec in slo.items():
        if not isinstance(spec, Mapping):
            raise ParameterError(f"simulation.slo.{name}", spec, "a mapping {ttft_s, tpot_s}")
        unknown = set(spec) - {"ttft_s", "tpot_s"}
        if unknown:
            raise ParameterError(f"simulation.slo.{name}", sorted(unknown)[0], "keys ttft_s, tpot_s")
        sch._check_slo(f"simulation.slo.{name}", spec)
    check_choice("simulation.edf_slo", s.get("edf_slo"), list(slo))
    opts = s.get("scheduler_options") or {}
    if not isinstance(opts, Mapping):
        raise ParameterError("simulation.scheduler_options", opts, "a mapping scheduler -> {option: value}")
    for name, o in opts.items():
        check_choice("simulation.scheduler_options", name, list(sch.SCHEDULERS))
        if not isinstance(o, Mapping):
            raise ParameterError(f"simulation.scheduler_options.{name}", o, "a mapping option -> value")
    for name in set(names) | set(opts) | {s.get("capacity_policy", "fcfs")}:
        sch.scheduler_from_params(P, name)   # unknown options / bad values -> ParameterError
    from .profiles import get_profile

    get_profile(s.get("profile"))
