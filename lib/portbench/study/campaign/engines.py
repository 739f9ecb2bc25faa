"""What one run *is*: an injectable :class:`Engine` (capacity, rescale + horizon, one run ->
counters, metrics, records); :class:`SimEngine` is the real one (profiles, regions, schedulers,
simulator, metrics). Tests inject deterministic fakes to check the orchestration alone."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...core import io as fileio
from ...core.config import SimulationConfig
from ...sim import metrics, profiles, regions
from ...sim import schedulers as scheduler_registry
from ...sim.engine import columns, simulate

# Packages whose source code is part of the model fingerprint (a code change invalidates shards).
MODEL_MODULES = ("sim",)


@dataclass
class RunResult:
    """What one run returns: counters (arrived, completed, unfinished, rejected, preemptions, ...),
    metric values ``{name: float}`` and the per-request records DataFrame (or None)."""

    counters: dict
    metrics: dict
    records: Any = None


class _LazyRecords(RunResult):
    """A :class:`RunResult` whose ``records`` are read from the simulation's result when first asked for
    (the campaign keeps the records of a few replicates only)."""

    _res: Any

    def _get(self):
        res = self._res
        return res.requests if res is not None else None

    def _set(self, value) -> None:
        self._res = value

    records = property(_get, _set)


class Engine:
    """What the campaign runs. Subclass it (or duck-type it) to change what a run is.

    The campaign calls, in a worker: ``capacity`` once per source (with every window of the
    source, in window order), ``prepare`` once per shard (window x region) and ``run`` once per
    (scheduler, replicate). Engines must be picklable and deterministic given their inputs.
    """

    def fingerprint(self, sim: SimulationConfig) -> dict:
        """Everything about the model that changes results (hashed into every shard key)."""
        return {"engine": f"{type(self).__module__}.{type(self).__qualname__}"}

    def metric_names(self, sim: SimulationConfig) -> list[str]:
        raise NotImplementedError

    def profile_name(self, sim: SimulationConfig) -> str:
        return str(sim.profile)

    def capacity(self, window_df, sim: SimulationConfig) -> float | dict:
        """The capacity of a window (requests/s): a number, or a dict with at least
        ``capacity_rps`` plus how it was measured."""
        raise NotImplementedError

    def prepare(self, window_df, rho: float, capacity_rps: float, sim: SimulationConfig):
        """``(scaled_window_df, horizon_s)`` for one region."""
        raise NotImplementedError

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, sim: SimulationConfig) -> RunResult:
        raise NotImplementedError

    def worker_modules(self, sim: SimulationConfig) -> list[str]:
        """Modules a fresh worker process must import first (e.g. ones registering user schedulers)."""
        return []

    def for_window(self, window) -> "Engine":
        """The engine for one window (a :class:`~portbench.study.campaign.plan.WindowRef`), called before its
        ``capacity`` / ``prepare`` / ``run``. Default: this engine (nothing depends on the window)."""
        return self


def _source_hash(module: str) -> str:
    return fileio.code_sha256(module)


def scheduler_options(sim: SimulationConfig, name: str) -> dict:
    """Keyword options of scheduler ``name`` (``schedulers.options_for``:
    ``simulation.scheduler_options[name]`` plus the predictor sigma / edf SLO)."""
    return dict(scheduler_registry.options_for(sim, name))


class SimEngine(Engine):
    """The real engine: profiles + regions + schedulers + simulator + metrics (lazy imports)."""

    def __init__(self):
        self._profile = None
        self._profile_key = None
        self.hash_block_size = None   # tokens per block of the window's block_hashes (None: no hashes)
        # computed once per shard, not per run: every scheduler x replicate of a shard runs on the same scaled
        # window table and simulation section (checked by identity; the objects are held, so ids stay unique)
        self._marks: tuple = (None, (0.0, 0.0))      # (scaled table, its utilisation marks)
        self._window: tuple = (None, None)           # (scaled table, its columns.Window: the runs' shared set-up)
        self._options: tuple = (None, {})            # (simulation section, {scheduler: options})

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def for_window(self, window) -> "SimEngine":
        """This engine with the window's prompt-hash block size (``WindowRef.block_size``, from the
        manifest's ``sources.<s>.block_size``), handed to :func:`simulate` as ``hash_block_size``."""
        size = getattr(window, "block_size", None)
        if size == self.hash_block_size:
            return self
        eng = type(self).__new__(type(self))
        eng.__dict__.update(self.__dict__)
        eng.hash_block_size = size
        return eng

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

    def capacity_fingerprint(self, sim: SimulationConfig) -> dict:
        """What a window's capacity depends on (its cache key): the simulator's model -- also for a subclass whose
        runs differ (the virtual vLLM engine, an imported vLLM class) but whose capacity is this class's, so that
        such campaigns reuse the study's measured capacities; a subclass with its own ``capacity``: its fingerprint."""
        if type(self).capacity is not SimEngine.capacity:
            return self.fingerprint(sim)
        return {**SimEngine.fingerprint(self, sim), "engine": f"{SimEngine.__module__}.{SimEngine.__qualname__}"}

    def capacity(self, window_df, sim: SimulationConfig) -> dict:
        """The window's sustainable throughput (:func:`portbench.sim.regions.saturation`) under
        ``simulation.capacity_policy`` on the reference engine (vLLM V1, recompute: ``engine.reference``,
        whatever the campaign's engine, so that engine variants see the same arrivals), and the earlier
        burst definition (``burst_rps``, for comparison)."""
        prof, ref = self.profile(sim), sim.engine.reference
        rec = regions.saturation(window_df, prof, policy=self._scheduler(sim, sim.capacity_policy), engine=ref,
                                 hash_block_tokens=self.hash_block_size)
        rec["burst_rps"] = regions.burst_capacity(window_df, prof, policy=self._scheduler(sim, sim.capacity_policy),
                                                  engine=ref, hash_block_tokens=self.hash_block_size)
        rec["engine"] = ref.as_dict()
        return rec

    def prepare(self, window_df, rho: float, capacity_rps: float, sim: SimulationConfig):
        scaled = regions.rescale(window_df, rho, capacity_rps)
        return scaled, float(regions.horizon_s(scaled, sim.horizon_factor))

    def _scheduler(self, sim: SimulationConfig, name: str):
        if self._options[0] is not sim:
            self._options = (sim, {})
        opts = self._options[1]
        if name not in opts:
            opts[name] = scheduler_options(sim, name)
        return scheduler_registry.get_scheduler(name, **opts[name])

    def _utilisation_marks(self, scaled_df) -> tuple[float, float]:
        if self._marks[0] is not scaled_df:
            self._marks = (scaled_df, regions.utilisation_marks(scaled_df))
        return self._marks[1]

    def _prepared(self, scaled_df) -> columns.Window:
        if self._window[0] is not scaled_df:
            self._window = (scaled_df, columns.Window(scaled_df))
        return self._window[1]

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, sim: SimulationConfig) -> RunResult:
        t1, t2 = self._utilisation_marks(scaled_df)
        win = self._prepared(scaled_df)     # the window's set-up, shared by every run of the shard
        res = simulate(win, self._scheduler(sim, scheduler), self.profile(sim), horizon_s=horizon_s, seed=seed,
                       slo=sim.edf_slo_dict, engine=sim.engine, hash_block_tokens=self.hash_block_size,
                       work_marks=(t1, t2) if t2 > t1 else ())
        cols = res.record_arrays()      # the records' columns (the compiled core builds no DataFrame here)
        tindex = win.tenant_index() if win.base() is not None else None   # the records' tenants, indexed once
        values = metrics.compute(cols, horizon_s, sim.slo_dicts, tenant_index=tindex)
        counters = dict(res.counters)
        w = counters.get("work_at") or []
        if len(w) == 2:
            # useful tokens/s over the utilisation interval, and the window's useful tokens per request
            counters["work_rate_tok_s"] = (w[1] - w[0]) / (t2 - t1)
            keep = ~cols["refused"]
            tokens = (cols["prompt_tokens"] + cols["output_tokens"])[keep]
            counters["mean_work_tokens"] = int(tokens.sum()) / tokens.size if tokens.size else 0.0
        return _LazyRecords(counters=counters, metrics=dict(values), records=res)

    def worker_modules(self, sim: SimulationConfig) -> list[str]:
        out = []
        for name in scheduler_registry.names(sim.schedulers):
            m = scheduler_registry.SCHEDULERS[name].__module__
            if m and m not in out:
                out.append(m)
        return out
