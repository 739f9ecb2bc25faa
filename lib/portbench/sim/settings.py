"""The ``simulation`` section checked against what only the simulation layer knows: the registered
schedulers and their options, the profiles; and the names it resolves (``all``)."""

from __future__ import annotations

from ..core.config import SimulationConfig
from ..core.errors import ParameterError
from . import metrics, schedulers
from .profiles import get_profile


def scheduler_names(sim: SimulationConfig) -> list[str]:
    """The schedulers of ``sim`` (``all`` = every registered one, in registration order)."""
    return schedulers.names(sim.schedulers)


def metric_names(sim: SimulationConfig) -> list[str]:
    """Every metric of a run under ``sim`` (``slo_<name>`` for each SLO definition)."""
    return metrics.metric_names(sim.slo)


def validate(sim: SimulationConfig) -> None:
    """ParameterError naming the parameter when a scheduler, an option, the capacity policy or the
    profile is unknown or invalid."""
    names = scheduler_names(sim)
    schedulers.require_registered("simulation.capacity_policy", sim.capacity_policy)
    for name in sim.scheduler_options:
        schedulers.require_registered("simulation.scheduler_options", name)
    for name in set(names) | set(sim.scheduler_options) | {sim.capacity_policy}:
        schedulers.scheduler_for(sim, name)   # unknown options / bad values -> ParameterError
    try:
        get_profile(sim.profile)
    except ParameterError:
        raise
