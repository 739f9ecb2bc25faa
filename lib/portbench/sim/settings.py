"""The ``simulation`` section checked against what only the simulation layer knows: the registered
schedulers and their options, the profiles; and the names it resolves (``all``)."""

from __future__ import annotations

from ..core.config import SimulationConfig
from ..core.errors import ParameterError
from . import metrics, schedulers
from .profiles import get_profile

# The built-in schedulers as registered when the package was imported (before any plug-in): a plug-in may add
# schedulers, never replace one of these (a table would keep the built-in's name for another policy).
BUILTIN_SCHEDULERS = {name: cls for name, cls in schedulers.SCHEDULERS.items()
                      if cls.__module__.startswith("portbench.")}


def check_builtins_intact() -> None:
    """ParameterError when a plug-in registered a class under a built-in scheduler's name (``replace=True``)."""
    for name, cls in BUILTIN_SCHEDULERS.items():
        now = schedulers.SCHEDULERS.get(name)
        if now is not cls:
            who = f"{now.__module__}.{now.__qualname__}" if now is not None else "nothing"
            raise ParameterError("plugins", who, f"a plug-in that registers its scheduler under a new name: it "
                                 f"replaced the built-in scheduler {name!r} (register_scheduler(..., replace=True)), "
                                 "and every table and figure would show the built-in's name for another policy; "
                                 f"name it e.g. {name}_mine")


def is_plugin(name: str) -> bool:
    """True for a scheduler registered by a plug-in (not one of portbench's own)."""
    cls = schedulers.SCHEDULERS.get(name)
    return cls is not None and not cls.__module__.startswith("portbench.")


def scheduler_names(sim: SimulationConfig) -> list[str]:
    """The schedulers of ``sim`` (``all`` = every registered one, in registration order)."""
    return schedulers.names(sim.schedulers)


def metric_names(sim: SimulationConfig) -> list[str]:
    """Every metric of a run under ``sim`` (``slo_<name>`` for each SLO definition)."""
    return metrics.metric_names(sim.slo)


def validate(sim: SimulationConfig) -> None:
    """ParameterError naming the parameter when a scheduler, an option, the capacity policy or the
    profile is unknown or invalid, or a plug-in replaced a built-in scheduler."""
    check_builtins_intact()
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
