"""What one run *is*: an injectable :class:`Engine` (capacity, rescale + horizon, one run ->
counters, metrics, records); :class:`SimEngine` is the real one (profiles, regions, schedulers,
simulator, metrics). Tests inject deterministic fakes to check the orchestration alone."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.config import SimulationConfig
from ...sim import metrics, profiles, regions
from ...sim import schedulers as scheduler_registry
from ...sim.engine import simulate

# Packages whose source code is part of the model fingerprint (a code change invalidates shards).
MODEL_MODULES = ("sim",)


@dataclass
class RunResult:
    """What one run returns: counters (arrived, completed, unfinished, rejected, preemptions, ...),
    metric values ``{name: float}`` and the per-request records DataFrame (or None)."""

    counters: dict
    metrics: dict
    records: Any = None


class Engine:
    """What the campaign runs. Subclass it (or duck-type it) to change what a run is.

    The campaign calls, in a worker: ``capacity`` once per window, ``prepare`` once per shard
    (window x region) and ``run`` once per (scheduler, replicate). Engines must be picklable and
    deterministic given their inputs.
    """

    def fingerprint(self, sim: SimulationConfig) -> dict:
        """Everything about the model that changes results (hashed into every shard key)."""
        return {"engine": f"{type(self).__module__}.{type(self).__qualname__}"}

    def metric_names(self, sim: SimulationConfig) -> list[str]:
        raise NotImplementedError

    def profile_name(self, sim: SimulationConfig) -> str:
        return str(sim.profile)

    def capacity(self, window_df, sim: SimulationConfig) -> float:
        raise NotImplementedError

    def prepare(self, window_df, rho: float, capacity_rps: float, sim: SimulationConfig):
        """``(scaled_window_df, horizon_s)`` for one region."""
        raise NotImplementedError

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, sim: SimulationConfig) -> RunResult:
        raise NotImplementedError

    def worker_modules(self, sim: SimulationConfig) -> list[str]:
        """Modules a fresh worker process must import first (e.g. ones registering user schedulers)."""
        return []


def _source_hash(module: str) -> str:
    spec = importlib.util.find_spec(f"portbench.{module}")
    h = hashlib.sha256()
    if spec.submodule_search_locations:
        files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    else:
        files = [Path(spec.origin)]
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def scheduler_options(sim: SimulationConfig, name: str) -> dict:
    """Keyword options of scheduler ``name`` (``schedulers.options_for``:
    ``simulation.scheduler_options[name]`` plus the predictor sigma / edf SLO)."""
    return dict(scheduler_registry.options_for(sim, name))


class SimEngine(Engine):
    """The real engine: profiles + regions + schedulers + simulator + metrics (lazy imports)."""

    def __init__(self):
        self._profile = None
        self._profile_key = None

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def profile(self, sim: SimulationConfig):
        key = sim.profile
        if self._profile is None or self._profile_key != key:
            self._profile, self._profile_key = profiles.get_profile(key), key
        return self._profile

    def profile_name(self, sim: SimulationConfig) -> str:
        return str(getattr(self.profile(sim), "name", sim.profile))

    def fingerprint(self, sim: SimulationConfig) -> dict:
        prof = self.profile(sim)
        fields = {f.name: getattr(prof, f.name) for f in dataclasses.fields(prof)
                  if f.compare and f.name not in ("notes",)} if dataclasses.is_dataclass(prof) else repr(prof)
        return {"engine": f"{type(self).__module__}.{type(self).__qualname__}", "profile": fields,
                "code": {m: _source_hash(m) for m in MODEL_MODULES}}

    def metric_names(self, sim: SimulationConfig) -> list[str]:
        return list(metrics.metric_names(sim.slo))

    def capacity(self, window_df, sim: SimulationConfig) -> float:
        return float(regions.capacity(window_df, self.profile(sim), policy=sim.capacity_policy))

    def prepare(self, window_df, rho: float, capacity_rps: float, sim: SimulationConfig):
        scaled = regions.rescale(window_df, rho, capacity_rps)
        return scaled, float(regions.horizon_s(scaled, sim.horizon_factor))

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, sim: SimulationConfig) -> RunResult:
        sched = scheduler_registry.get_scheduler(scheduler, **scheduler_options(sim, scheduler))
        res = simulate(scaled_df, sched, self.profile(sim), horizon_s=horizon_s, seed=seed, slo=sim.edf_slo_dict)
        values = metrics.compute(res.requests, horizon_s, sim.slo_dicts)
        return RunResult(counters=dict(res.counters), metrics=dict(values), records=res.requests)

    def worker_modules(self, sim: SimulationConfig) -> list[str]:
        out = []
        for name in scheduler_registry.names(sim.schedulers):
            m = scheduler_registry.SCHEDULERS[name].__module__
            if m and m not in out:
                out.append(m)
        return out
