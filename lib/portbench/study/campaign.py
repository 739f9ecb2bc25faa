"""The campaign: schedulers x windows x operating regions x replicates, sharded and resumable.

**Grid.** Every frozen window of the manifest (``campaign.windows_per_source`` limits it to the first
N per source), every region of ``simulation.regions`` (load ``rho`` from ``simulation.region_loads``),
every scheduler of ``simulation.schedulers`` and replicates ``0 .. simulation.replicates-1``.

**Seeds.** One seed per run, :func:`run_seed`: the first 8 bytes of the SHA-256 of the canonical
JSON of ``["portbench-run-seed-v1", simulation.seed, window_id, scheduler, region, replicate]``
(63 bits). It never uses Python's ``hash()``, so it is the same in every process and on every
machine, and it does not depend on which worker runs the run or in which order.

**Capacity.** A window's capacity (req/s) is measured once per (window, profile) by
``regions.capacity(window_df, profile, policy=simulation.capacity_policy)`` and cached as
``{results_dir}/capacity/<window_id>__<key>.json``; every run of that window, in every region, uses it.

**Shards.** One task = one shard = one (window, region): all schedulers x replicates of it (13 x 3 = 39
runs in the full study), so process and serialisation overhead is paid once per 39 runs and the
rescaled window is built once. Shard files are ``{results_dir}/runs/<window_id>__<region>__<key>.parquet``,
``<key>`` = the first 16 hex digits of the SHA-256 of the shard's *fingerprint*: the window's SHA-256,
source and provenance, region and rho, the scheduler list with each scheduler's options, the
replicates, and everything common to every run that changes results (the model fingerprint: profile
coefficients and a hash of the simulation code, see :meth:`SimEngine.fingerprint`; capacity policy,
horizon factor, base seed, predictor sigma, SLO definitions, edf SLO, the metric list and this
module's result format version). Changing any of them gives new file names, so stale shards are
never read (they stay on disk, and come back into use if the parameter is changed back). The
fingerprint is also stored in each shard's parquet metadata (key ``portbench``).

Per-request records of the chosen subset (``campaign.request_records``: the first N windows per
source, the listed regions and replicates) go to ``{results_dir}/requests/<same prefix>__<key>.parquet``
(records columns + run keys); a shard counts as finished only when its records file exists too.

**Atomicity and resume.** Workers compute; the main process alone writes, each file to a temporary
name in the same folder and then ``os.replace`` (atomic on POSIX). A killed campaign leaves only
complete shards; rerunning it computes exactly the missing shards. ``runs.parquet`` is the sorted
concatenation of the plan's shards, tagged with the plan's hash, so :func:`load_runs` never returns
rows of other parameters.

**Executors.** ``campaign.executor: process`` (default): a spawn-context process pool of
``campaign.workers`` processes (1 = in this process); ``dask``: a ``distributed`` cluster at
``campaign.dask_address``, or a ``LocalCluster`` of ``campaign.workers`` single-threaded worker
processes. The worker context (the engine, the parameters and the verified windows) is sent to each
worker once (pool initializer / Dask broadcast scatter). Rows are sorted by (source, window_id, rho,
region, scheduler, replicate), so every executor and worker count gives identical tables.

**Engine.** What a run *is* is an injectable :class:`Engine` (capacity, rescale + horizon, one run ->
counters, metrics, records). :class:`SimEngine` is the real one (profiles, regions, schedulers,
simulator, metrics); tests inject deterministic fakes to check the orchestration alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data import registry
from ..sim import regions
from ..sim import schedulers as scheduler_registry
from ..core.errors import DataError, ParameterError, PortbenchError, check_choice, check_choices

FORMAT_VERSION = 1
SEED_TAG = "portbench-run-seed-v1"
EXECUTORS = ("process", "dask")
META_KEY = b"portbench"

# Contract columns of a run row, in order; metric columns (Float64) follow.
KEY_COLUMNS = ("source", "provenance", "window_id", "region", "rho", "scheduler", "replicate", "seed")
RUN_COLUMNS = KEY_COLUMNS + ("profile", "capacity_rps", "horizon_s",
                             "arrived", "completed_n", "unfinished", "rejected", "preemptions")
# counters key -> run column
COUNTER_COLUMNS = {"arrived": "arrived", "completed": "completed_n", "unfinished": "unfinished",
                   "rejected": "rejected", "preemptions": "preemptions"}
SORT_COLUMNS = ["source", "window_id", "rho", "region", "scheduler", "replicate"]
# Modules whose source code is part of the model fingerprint (a code change invalidates shards).
MODEL_MODULES = ("sim",)


class RunFailed(PortbenchError):
    """A run (or a capacity measurement) failed inside the campaign; the message names it and the cause."""


# --------------------------------------------------------------------------- small helpers


def canonical_json(obj: Any) -> str:
    """Sorted-key compact JSON (the one serialisation hashed for seeds and fingerprints)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_jsonable)


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    if hasattr(x, "item"):  # numpy scalar
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return repr(x)


def sha256_hex(obj: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def run_seed(base_seed: int, window_id: str, scheduler: str, region: str, replicate: int) -> int:
    """The deterministic 63-bit seed of one run (see the module docstring)."""
    digest = hashlib.sha256(canonical_json(
        [SEED_TAG, int(base_seed), str(window_id), str(scheduler), str(region), int(replicate)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)) or "x"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _sim(P: Mapping) -> dict:
    return P.get("simulation", {})


def _camp(P: Mapping) -> dict:
    return P.get("campaign", {})


def results_dir(P: Mapping) -> Path:
    return Path(P["paths"]["results_dir"])


# --------------------------------------------------------------------------- parameters


def scheduler_names(P: Mapping) -> list[str]:
    """The schedulers of the campaign (``simulation.schedulers``; ``all`` = every registered one)."""
    return check_choices("simulation.schedulers", _sim(P).get("schedulers", "all"),
                         list(scheduler_registry.SCHEDULERS))


def region_loads(P: Mapping) -> dict[str, float]:
    """``{region: rho}`` of the campaign's regions, in increasing rho (ties by name)."""
    loads = _sim(P).get("region_loads") or {}
    names = check_choices("simulation.regions", _sim(P).get("regions", "all"), list(loads))
    return dict(sorted(((n, float(loads[n])) for n in names), key=lambda kv: (kv[1], kv[0])))


def replicates(P: Mapping) -> list[int]:
    return list(range(int(_sim(P).get("replicates", 1))))


def validate_params(P: Mapping) -> None:
    """Validate the ``simulation`` (``regions.validate_simulation_params``) and ``campaign`` sections
    (ParameterError naming the parameter)."""
    regions.validate_simulation_params(P)
    c = _camp(P)
    check_choice("campaign.executor", c.get("executor"), EXECUTORS)
    if not _is_int(c.get("workers")) or c["workers"] < 1:
        raise ParameterError("campaign.workers", c.get("workers"), "a positive integer (worker processes)")
    addr = c.get("dask_address")
    if addr is not None and not (isinstance(addr, str) and addr.strip()):
        raise ParameterError("campaign.dask_address", addr, "null (a LocalCluster) or a scheduler address "
                             "such as tcp://host:8786")
    wps = c.get("windows_per_source")
    if wps is not None and (not _is_int(wps) or wps < 1):
        raise ParameterError("campaign.windows_per_source", wps, "null (every window) or a positive integer")
    rr = c.get("request_records")
    if rr is None:
        return
    if not isinstance(rr, dict):
        raise ParameterError("campaign.request_records", rr, "a mapping with keys windows_per_source, regions, "
                             "replicates")
    unknown = set(rr) - {"windows_per_source", "regions", "replicates"}
    if unknown:
        k = sorted(unknown)[0]
        raise ParameterError(f"campaign.request_records.{k}", rr[k], "one of windows_per_source, regions, replicates")
    n = rr.get("windows_per_source", 0)
    if n not in (None, "all") and (not _is_int(n) or n < 0):
        raise ParameterError("campaign.request_records.windows_per_source", n, "'all' or an integer >= 0")
    check_choices("campaign.request_records.regions", rr.get("regions", "all"),
                  list(_sim(P).get("region_loads") or {}))
    reps = rr.get("replicates", "all")
    if reps != "all" and reps is not None:
        if not isinstance(reps, list) or not all(_is_int(r) and r >= 0 for r in reps):
            raise ParameterError("campaign.request_records.replicates", reps, "'all' or a list of integers >= 0")


# --------------------------------------------------------------------------- engines


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

    def fingerprint(self, P: Mapping) -> dict:
        """Everything about the model that changes results (hashed into every shard key)."""
        return {"engine": f"{type(self).__module__}.{type(self).__qualname__}"}

    def metric_names(self, P: Mapping) -> list[str]:
        raise NotImplementedError

    def profile_name(self, P: Mapping) -> str:
        return str(_sim(P).get("profile"))

    def capacity(self, window_df, P: Mapping) -> float:
        raise NotImplementedError

    def prepare(self, window_df, rho: float, capacity_rps: float, P: Mapping):
        """``(scaled_window_df, horizon_s)`` for one region."""
        raise NotImplementedError

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, P: Mapping) -> RunResult:
        raise NotImplementedError

    def worker_modules(self, P: Mapping) -> list[str]:
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


def scheduler_options(P: Mapping, name: str) -> dict:
    """Keyword options of scheduler ``name`` (``schedulers.options_from_params``:
    ``simulation.scheduler_options[name]`` plus the predictor sigma / edf SLO)."""
    return dict(scheduler_registry.options_from_params(P, name))


class SimEngine(Engine):
    """The real engine: profiles + regions + schedulers + simulator + metrics (lazy imports)."""

    def __init__(self):
        self._profile = None
        self._profile_key = None

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def profile(self, P: Mapping):
        key = _sim(P).get("profile")
        if self._profile is None or self._profile_key != key:
            from ..sim import profiles

            self._profile, self._profile_key = profiles.get_profile(key), key
        return self._profile

    def profile_name(self, P: Mapping) -> str:
        return str(getattr(self.profile(P), "name", _sim(P).get("profile")))

    def fingerprint(self, P: Mapping) -> dict:
        prof = self.profile(P)
        fields = {f.name: getattr(prof, f.name) for f in dataclasses.fields(prof)
                  if f.compare and f.name not in ("notes",)} if dataclasses.is_dataclass(prof) else repr(prof)
        return {"engine": f"{type(self).__module__}.{type(self).__qualname__}", "profile": fields,
                "code": {m: _source_hash(m) for m in MODEL_MODULES}}

    def metric_names(self, P: Mapping) -> list[str]:
        from ..sim import metrics

        return list(metrics.metric_names(P))

    def capacity(self, window_df, P: Mapping) -> float:
        return float(regions.capacity(window_df, self.profile(P), policy=_sim(P).get("capacity_policy", "fcfs")))

    def prepare(self, window_df, rho: float, capacity_rps: float, P: Mapping):
        scaled = regions.rescale(window_df, rho, capacity_rps)
        return scaled, float(regions.horizon_s(scaled, _sim(P)["horizon_factor"]))

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, P: Mapping) -> RunResult:
        from ..sim import metrics, engine as simulator

        s = _sim(P)
        sched = scheduler_registry.get_scheduler(scheduler, **scheduler_options(P, scheduler))
        slo = (s.get("slo") or {}).get(s.get("edf_slo"))
        res = simulator.simulate(scaled_df, sched, self.profile(P), horizon_s=horizon_s, seed=seed, slo=slo)
        values = metrics.compute(res.requests, horizon_s, s.get("slo") or {})
        return RunResult(counters=dict(res.counters), metrics=dict(values), records=res.requests)

    def worker_modules(self, P: Mapping) -> list[str]:
        out = []
        for name in scheduler_names(P):
            m = scheduler_registry.SCHEDULERS[name].__module__
            if m and m not in out:
                out.append(m)
        return out


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class WindowRef:
    id: str
    source: str
    provenance: str
    sha256: str


@dataclass(frozen=True)
class ShardSpec:
    """One task: every scheduler x replicate of one (window, region)."""

    window: WindowRef
    region: str
    rho: float
    schedulers: tuple
    replicates: tuple
    record_replicates: tuple  # replicates whose per-request records are kept (empty: none)
    key: str                  # fingerprint hash (16 hex)
    name: str                 # file stem: <window>__<region>__<key>
    fingerprint: str          # canonical JSON of the fingerprint

    @property
    def records_name(self) -> str:
        return f"{self.name}__r{'-'.join(map(str, self.record_replicates))}" if self.record_replicates else ""


@dataclass
class Plan:
    """The campaign's grid for one parameter set."""

    windows: list[WindowRef]
    regions: dict[str, float]
    schedulers: list[str]
    replicates: list[int]
    metrics: list[str]
    profile: str
    common: dict
    capacity_keys: dict[str, str]   # window id -> capacity cache key
    shards: list[ShardSpec]
    hash: str

    @property
    def n_runs(self) -> int:
        return len(self.windows) * len(self.regions) * len(self.schedulers) * len(self.replicates)


def _records_selection(P: Mapping, windows: Sequence[WindowRef], regions: Iterable[str], reps: Sequence[int]):
    """(window ids, regions, replicates) whose per-request records are kept."""
    rr = _camp(P).get("request_records") or {}
    if not rr:
        return set(), set(), ()
    n = rr.get("windows_per_source", 0)
    seen: dict[str, int] = {}
    chosen_w = set()
    for w in windows:
        seen[w.source] = seen.get(w.source, 0) + 1
        if n in (None, "all") or seen[w.source] <= n:
            chosen_w.add(w.id)
    r = rr.get("regions", "all")
    chosen_r = set(regions) if r in ("all", None) else set(r) & set(regions)
    r_reps = rr.get("replicates", "all")
    chosen_rep = tuple(reps) if r_reps in ("all", None) else tuple(sorted(set(r_reps) & set(reps)))
    return chosen_w, chosen_r, chosen_rep


def window_refs(P: Mapping, manifest: Mapping | None = None) -> list[WindowRef]:
    """The campaign's windows (manifest order; the first ``campaign.windows_per_source`` per source)."""
    from ..data import windows

    manifest = manifest if manifest is not None else windows.load_manifest(P)
    entries = windows.select_entries(manifest, None, _camp(P).get("windows_per_source"))
    return [WindowRef(e["id"], e["source"], e["provenance"], e["sha256"]) for e in entries]


def _refs(windows) -> list[WindowRef]:
    return [w[0] if isinstance(w, tuple) else w for w in windows]


def make_plan(P: Mapping, *, engine: Engine | None = None, windows: Sequence | None = None,
              manifest: Mapping | None = None) -> Plan:
    """The grid, seeds' keys and shard fingerprints for ``P`` (nothing is computed).

    ``windows`` replaces the manifest's windows: a list of :class:`WindowRef` or of
    ``(WindowRef, window_df)`` pairs (tests and benchmarks use it).
    """
    engine = engine or SimEngine()
    s = _sim(P)
    wins = _refs(windows) if windows is not None else window_refs(P, manifest)
    regs = region_loads(P)
    scheds = scheduler_names(P)
    reps = replicates(P)
    metric_list = list(engine.metric_names(P))
    model = engine.fingerprint(P)
    policy = s.get("capacity_policy", "fcfs")
    common = {
        "format": FORMAT_VERSION,
        "model": model,
        "capacity_policy": policy,
        "capacity_options": scheduler_options(P, policy),
        "horizon_factor": s.get("horizon_factor"),
        "seed": s.get("seed"),
        "predictor_sigma": s.get("predictor_sigma"),
        "slo": s.get("slo"),
        "edf_slo": s.get("edf_slo"),
        "metrics": metric_list,
    }
    cap_common = {k: common[k] for k in ("format", "model", "capacity_policy", "capacity_options")}
    capacity_keys = {w.id: sha256_hex({"window_sha256": w.sha256, **cap_common})[:16] for w in wins}
    rec_w, rec_r, rec_reps = _records_selection(P, wins, regs, reps)
    opts = {name: scheduler_options(P, name) for name in scheds}
    shards = []
    for w in wins:
        for region, rho in regs.items():
            fp = {"common": common, "window": dataclasses.asdict(w), "capacity_key": capacity_keys[w.id],
                  "region": region, "rho": rho, "schedulers": scheds, "scheduler_options": opts,
                  "replicates": reps}
            text = canonical_json(fp)
            key = hashlib.sha256(text.encode()).hexdigest()[:16]
            keep = rec_reps if (w.id in rec_w and region in rec_r) else ()
            shards.append(ShardSpec(window=w, region=region, rho=rho, schedulers=tuple(scheds),
                                    replicates=tuple(reps), record_replicates=tuple(keep), key=key,
                                    name=f"{_safe(w.id)}__{_safe(region)}__{key}", fingerprint=text))
    plan_hash = sha256_hex([sh.name + "/" + sh.records_name for sh in shards])[:16]
    return Plan(windows=wins, regions=regs, schedulers=scheds, replicates=reps, metrics=metric_list,
                profile=engine.profile_name(P), common=common, capacity_keys=capacity_keys, shards=shards,
                hash=plan_hash)


# --------------------------------------------------------------------------- files


def runs_path(P: Mapping) -> Path:
    return results_dir(P) / "runs.parquet"


def shard_path(P: Mapping, shard: ShardSpec) -> Path:
    return results_dir(P) / "runs" / f"{shard.name}.parquet"


def records_path(P: Mapping, shard: ShardSpec) -> Path | None:
    return results_dir(P) / "requests" / f"{shard.records_name}.parquet" if shard.record_replicates else None


def capacity_path(P: Mapping, window_id: str, key: str) -> Path:
    return results_dir(P) / "capacity" / f"{_safe(window_id)}__{key}.json"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    registry.atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_parquet_atomic(df, path: Path, meta: Mapping | None = None) -> None:
    """Write a polars DataFrame to ``path`` via a temporary file + rename, with JSON metadata."""
    import pyarrow.parquet as pq

    table = df.to_arrow()
    if meta is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               META_KEY: canonical_json(meta).encode()})
    registry.atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_meta(path: Path) -> dict | None:
    """The ``portbench`` metadata of a parquet file written by :func:`write_parquet_atomic`."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[META_KEY]) if META_KEY in meta else None


def _clean_stale_tmp(folder: Path, older_than_s: float = 600.0) -> None:
    if not folder.is_dir():
        return
    now = time.time()
    for p in folder.glob(".*.tmp"):  # left by a killed worker (registry.atomic_write's temporary names)
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
        except OSError:
            pass


def shard_done(P: Mapping, shard: ShardSpec) -> bool:
    """True when the shard's runs file (and its records file, when records are kept) exist."""
    rp = records_path(P, shard)
    return shard_path(P, shard).is_file() and (rp is None or rp.is_file())


# --------------------------------------------------------------------------- worker side


@dataclass
class WorkerContext:
    """Sent once to each worker: the engine, the parameters and the verified window tables."""

    engine: Any
    P: dict
    windows: dict           # window id -> window DataFrame
    modules: list = field(default_factory=list)


_CTX: WorkerContext | None = None


def _init_worker(ctx: WorkerContext) -> None:
    global _CTX
    os.environ.setdefault("MPLBACKEND", "Agg")
    for m in ctx.modules:
        if m != "__main__":
            importlib.import_module(m)
    _CTX = ctx


def _fail(what: str, e: BaseException) -> RunFailed:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-4))
    return RunFailed(f"{what} failed: {type(e).__name__}: {e}\n--- worker traceback (last frames) ---\n{tb}")


def compute_capacity(ctx: WorkerContext, window_id: str) -> tuple[str, float, float]:
    """``(window_id, capacity_rps, wall_s)``."""
    t0 = time.perf_counter()
    try:
        cap = float(ctx.engine.capacity(ctx.windows[window_id], ctx.P))
    except Exception as e:
        raise _fail(f"capacity of window {window_id}", e) from None
    if not cap > 0:
        raise RunFailed(f"capacity of window {window_id} is {cap!r}: expected a positive req/s")
    return window_id, cap, time.perf_counter() - t0


def compute_shard(ctx: WorkerContext, shard: ShardSpec, capacity_rps: float, profile: str,
                  metric_names: Sequence[str]) -> dict:
    """Run every scheduler x replicate of one (window, region); returns the run rows and records."""
    import polars as pl

    t0 = time.perf_counter()
    w = shard.window
    P = ctx.P
    base_seed = int(_sim(P).get("seed", 0))
    scaled, horizon = ctx.engine.prepare(ctx.windows[w.id], shard.rho, capacity_rps, P)
    rows, recs = [], []
    for sched in shard.schedulers:
        for rep in shard.replicates:
            seed = run_seed(base_seed, w.id, sched, shard.region, rep)
            try:
                res = ctx.engine.run(scaled, sched, seed, horizon, P)
            except Exception as e:
                raise _fail(f"run window={w.id} region={shard.region} (rho={shard.rho}) scheduler={sched} "
                            f"replicate={rep} seed={seed}", e) from None
            row = {"source": w.source, "provenance": w.provenance, "window_id": w.id, "region": shard.region,
                   "rho": float(shard.rho), "scheduler": sched, "replicate": int(rep), "seed": int(seed),
                   "profile": profile, "capacity_rps": float(capacity_rps), "horizon_s": float(horizon)}
            for ckey, col in COUNTER_COLUMNS.items():
                row[col] = int(res.counters.get(ckey, 0))
            for m in metric_names:
                v = res.metrics.get(m)
                row[m] = float("nan") if v is None else float(v)
            rows.append(row)
            if rep in shard.record_replicates and res.records is not None:
                recs.append(_keyed_records(res.records, row))
    schema = {**{c: pl.String for c in ("source", "provenance", "window_id", "region")}, "rho": pl.Float64,
              "scheduler": pl.String, "replicate": pl.Int64, "seed": pl.Int64, "profile": pl.String,
              "capacity_rps": pl.Float64, "horizon_s": pl.Float64,
              **{c: pl.Int64 for c in COUNTER_COLUMNS.values()}, **{m: pl.Float64 for m in metric_names}}
    runs = pl.DataFrame(rows, schema=schema)
    records = pl.concat(recs, how="vertical_relaxed") if recs else None
    return {"shard": shard.name, "runs": runs, "records": records, "wall_s": time.perf_counter() - t0}


def _keyed_records(records, row: Mapping):
    import polars as pl

    df = records if isinstance(records, pl.DataFrame) else pl.DataFrame(records)
    keys = [pl.lit(row[k], dtype=(pl.Float64 if k == "rho" else pl.Int64 if k in ("replicate", "seed")
                                  else pl.String)).alias(k) for k in KEY_COLUMNS]
    return df.select(keys + [pl.col(c) for c in df.columns if c not in KEY_COLUMNS])


def _pool_capacity(window_id: str):
    return compute_capacity(_CTX, window_id)


def _pool_shard(shard, capacity_rps, profile, metric_names):
    return compute_shard(_CTX, shard, capacity_rps, profile, metric_names)


def _dask_capacity(ctx, window_id):
    return compute_capacity(ctx, window_id)


def _dask_shard(ctx, shard, capacity_rps, profile, metric_names):
    for m in ctx.modules:
        if m != "__main__" and m not in sys.modules:
            importlib.import_module(m)
    return compute_shard(ctx, shard, capacity_rps, profile, metric_names)


# --------------------------------------------------------------------------- executors


class _Executor:
    """Uniform submit / as_completed over serial, process pool and Dask."""

    def __init__(self, kind: str, workers: int, ctx: WorkerContext, dask_address: str | None = None):
        self.kind, self.workers, self.ctx = kind, workers, ctx
        self._pool = self._client = self._cluster = self._ctx_future = None
        if "__main__" in ctx.modules and (kind == "dask" or workers > 1):
            raise ParameterError("campaign.workers", workers, "1 (runs in this process) when a scheduler is "
                                 "defined in the notebook or script itself: worker processes cannot import "
                                 "it; or move the scheduler into an importable module")
        if kind == "process" and workers > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            # spawn: forking a process that has started polars' thread pool can deadlock.
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                             initializer=_init_worker, initargs=(ctx,))
        elif kind == "dask":
            import logging

            from distributed import Client, LocalCluster

            if dask_address:
                self._client = Client(dask_address)
            else:
                self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                             dashboard_address=None, silence_logs=logging.ERROR)
                self._client = Client(self._cluster)
            self._ctx_future = self._client.scatter(ctx, broadcast=True, hash=False)
        elif kind == "process":
            _init_worker(ctx)

    def map_unordered(self, fn_name: str, arg_list: list[tuple]):
        """Yield results of ``fn(*args)`` as they finish (serial: in order)."""
        if self._pool is not None:
            from concurrent.futures import as_completed

            fn = {"capacity": _pool_capacity, "shard": _pool_shard}[fn_name]
            futures = [self._pool.submit(fn, *a) for a in arg_list]
            try:
                for f in as_completed(futures):
                    yield f.result()
            finally:
                for f in futures:
                    f.cancel()
        elif self._client is not None:
            from distributed import as_completed

            fn = {"capacity": _dask_capacity, "shard": _dask_shard}[fn_name]
            futures = [self._client.submit(fn, self._ctx_future, *a, pure=False) for a in arg_list]
            try:
                for f in as_completed(futures):
                    yield f.result()
            finally:
                self._client.cancel(futures)
        else:
            fn = {"capacity": compute_capacity, "shard": compute_shard}[fn_name]
            for a in arg_list:
                yield fn(self.ctx, *a)

    def close(self) -> None:
        global _CTX
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        if self.kind == "process" and self.workers <= 1:
            _CTX = None


# --------------------------------------------------------------------------- running


@dataclass
class CampaignResult:
    """What :func:`run_campaign` did."""

    plan: Plan
    runs: Any                    # the consolidated runs DataFrame
    computed_shards: int
    reused_shards: int
    computed_capacities: int
    wall_s: float
    shard_wall_s: list = field(default_factory=list)
    executor: str = "process"
    workers: int = 1

    def summary(self) -> str:
        n_runs = self.runs.height if self.runs is not None else 0
        return (f"campaign {self.plan.hash}: {n_runs} runs in {len(self.plan.shards)} shards "
                f"({self.computed_shards} computed, {self.reused_shards} reused), "
                f"{self.computed_capacities} capacities measured, "
                f"{self.wall_s:.1f} s wall on {self.workers} {self.executor} worker(s)")


def load_capacities(P: Mapping, plan: Plan | None = None) -> dict[str, float]:
    """``{window_id: capacity_rps}`` of the plan's windows found in the capacity cache."""
    plan = plan or make_plan(P)
    out = {}
    for wid, key in plan.capacity_keys.items():
        p = capacity_path(P, wid, key)
        if p.is_file():
            out[wid] = float(json.loads(p.read_text())["capacity_rps"])
    return out


def run_campaign(P: Mapping, *, engine: Engine | None = None, executor: str | None = None,
                 workers: int | None = None, windows: Sequence[tuple] | None = None, progress: bool = True,
                 consolidate: bool = True, verbose: bool = True) -> CampaignResult:
    """Run (or resume) the campaign of ``P``; returns what was done and the consolidated runs table.

    ``engine``, ``executor`` and ``workers`` override the engine / ``campaign.executor`` /
    ``campaign.workers``; ``windows`` (``[(WindowRef, window_df)]``) replaces the manifest's windows.
    """
    from tqdm import tqdm

    t0 = time.perf_counter()
    engine = engine or SimEngine()
    # a terminal gets a live bar; a notebook or a log gets an update every 15 s (not hundreds of lines)
    interval = 1.0 if getattr(sys.stderr, "isatty", lambda: False)() else 15.0
    executor = executor or _camp(P).get("executor", "process")
    workers = int(workers or _camp(P).get("workers", 1))
    check_choice("campaign.executor", executor, EXECUTORS)
    plan = make_plan(P, engine=engine, windows=windows)
    out = results_dir(P)
    for sub in ("runs", "requests", "capacity"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        _clean_stale_tmp(out / sub)
    todo = [sh for sh in plan.shards if not shard_done(P, sh)]
    caps = load_capacities(P, plan)
    need_cap = sorted({sh.window.id for sh in todo} - set(caps))
    shard_walls: list[float] = []
    if todo:
        needed = sorted({sh.window.id for sh in todo})
        if windows is not None:
            loaded = {ref.id: df for ref, df in windows if ref.id in needed}
        else:
            loaded = _load_window_tables(P, plan, needed)
        ctx = WorkerContext(engine=engine, P=_plain(P), windows=loaded, modules=engine.worker_modules(P))
        ex = _Executor(executor, workers, ctx, _camp(P).get("dask_address"))
        try:
            if need_cap:
                bar = tqdm(total=len(need_cap), desc="capacity", unit="window", disable=not progress,
                           file=sys.stderr, mininterval=interval)
                for wid, cap, wall in ex.map_unordered("capacity", [(w,) for w in need_cap]):
                    _atomic_write_bytes(capacity_path(P, wid, plan.capacity_keys[wid]), json.dumps({
                        "window_id": wid, "capacity_rps": cap, "profile": plan.profile,
                        "policy": plan.common["capacity_policy"], "key": plan.capacity_keys[wid],
                        "wall_s": wall}, indent=1).encode())
                    caps[wid] = cap
                    bar.update(1)
                bar.close()
            bar = tqdm(total=len(plan.shards), initial=len(plan.shards) - len(todo), desc="campaign",
                       unit="shard", disable=not progress, file=sys.stderr, mininterval=interval)
            by_name = {sh.name: sh for sh in todo}
            args = [(sh, caps[sh.window.id], plan.profile, plan.metrics) for sh in todo]
            for res in ex.map_unordered("shard", args):
                sh = by_name[res["shard"]]
                rp = records_path(P, sh)
                if rp is not None:
                    if res["records"] is None:
                        raise RunFailed(f"shard {sh.name}: records were requested but the engine returned none")
                    write_parquet_atomic(res["records"], rp, {"shard": sh.name, "kind": "requests"})
                # the runs file is written last: it marks the shard finished
                write_parquet_atomic(res["runs"], shard_path(P, sh),
                                     {"shard": sh.name, "kind": "runs", "fingerprint": json.loads(sh.fingerprint)})
                shard_walls.append(res["wall_s"])
                bar.update(1)
            bar.close()
        finally:
            ex.close()
    runs = consolidate_runs(P, plan) if consolidate else None
    result = CampaignResult(plan=plan, runs=runs, computed_shards=len(todo),
                            reused_shards=len(plan.shards) - len(todo), computed_capacities=len(need_cap),
                            wall_s=time.perf_counter() - t0, shard_wall_s=shard_walls, executor=executor,
                            workers=workers)
    _atomic_write_bytes(out / "campaign.json", json.dumps({
        "plan": plan.hash, "n_runs": plan.n_runs, "n_shards": len(plan.shards),
        "computed_shards": result.computed_shards, "reused_shards": result.reused_shards,
        "computed_capacities": result.computed_capacities, "wall_s": result.wall_s,
        "executor": executor, "workers": workers, "profile": plan.profile,
        "schedulers": plan.schedulers, "regions": plan.regions, "replicates": plan.replicates,
        "windows": len(plan.windows), "metrics": plan.metrics}, indent=1).encode())
    if verbose:
        print(result.summary(), flush=True)
    return result


def _plain(P: Mapping) -> dict:
    return json.loads(json.dumps(P, default=str))


def _load_window_tables(P: Mapping, plan: Plan, needed: Sequence[str]) -> dict:
    from ..data import windows as windows_mod

    wps = _camp(P).get("windows_per_source")
    tables = windows_mod.load_windows(P, per_source=wps)
    missing = [w for w in needed if w not in tables]
    if missing:
        raise DataError(windows_mod.manifest_path(P), f"windows {missing[:3]} of the plan could not be loaded")
    by_id = {w.id: w for w in plan.windows}
    for wid in needed:  # load_windows verified the hashes; the plan must agree with them
        got = windows_mod.window_sha256(tables[wid])
        if got != by_id[wid].sha256:
            raise DataError(windows_mod.manifest_path(P), f"window {wid}: sha256 {got} but the plan has "
                            f"{by_id[wid].sha256}")
    return {wid: tables[wid] for wid in needed}


# --------------------------------------------------------------------------- reading results


def consolidate_runs(P: Mapping, plan: Plan | None = None):
    """Concatenate the plan's shards (sorted) into ``{results_dir}/runs.parquet``; returns the table."""
    import polars as pl

    plan = plan or make_plan(P)
    missing = [sh for sh in plan.shards if not shard_path(P, sh).is_file()]
    if missing:
        raise DataError(results_dir(P) / "runs", f"{len(missing)} of {len(plan.shards)} shards of this parameter "
                        f"set are missing (first: {missing[0].name}); run `portbench simulate --params "
                        f"{P.get('_params_file', 'FILE')}` (notebook 03)")
    frames = [pl.read_parquet(shard_path(P, sh)) for sh in plan.shards]
    runs = pl.concat(frames, how="vertical") if frames else _empty_runs(plan.metrics)
    runs = runs.sort(SORT_COLUMNS)
    dup = runs.select(KEY_COLUMNS[2:4] + ("scheduler", "replicate")).is_duplicated().sum()
    if dup:
        raise DataError(results_dir(P) / "runs", f"{dup} duplicated run keys among the plan's shards")
    write_parquet_atomic(runs, runs_path(P), {"plan": plan.hash, "kind": "runs"})
    return runs


def _empty_runs(metric_names):
    import polars as pl

    schema = {c: pl.String for c in ("source", "provenance", "window_id", "region", "scheduler", "profile")}
    schema.update({"rho": pl.Float64, "replicate": pl.Int64, "seed": pl.Int64, "capacity_rps": pl.Float64,
                   "horizon_s": pl.Float64, **{c: pl.Int64 for c in COUNTER_COLUMNS.values()},
                   **{m: pl.Float64 for m in metric_names}})
    return pl.DataFrame(schema=schema).select(list(RUN_COLUMNS) + list(metric_names))


def load_runs(P: Mapping, *, engine: Engine | None = None, windows: Sequence | None = None):
    """The campaign's runs table for ``P``: ``runs.parquet`` when it belongs to this parameter set,
    else consolidated from the shards; DataError naming the command to run when shards are missing."""
    import polars as pl

    plan = make_plan(P, engine=engine, windows=windows)
    path = runs_path(P)
    if path.is_file():
        meta = read_meta(path) or {}
        if meta.get("plan") == plan.hash:
            return pl.read_parquet(path)
    return consolidate_runs(P, plan)


def load_requests(P: Mapping, *, engine: Engine | None = None, windows: Sequence | None = None):
    """Per-request records of the ``campaign.request_records`` subset (records columns + run keys)."""
    import polars as pl

    plan = make_plan(P, engine=engine, windows=windows)
    paths = [records_path(P, sh) for sh in plan.shards if sh.record_replicates]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DataError(missing[0], f"{len(missing)} request-record files of this parameter set are missing; "
                        "run the campaign (`portbench simulate`, notebook 03)")
    if not paths:
        return pl.DataFrame()
    return pl.concat([pl.read_parquet(p) for p in paths], how="vertical_relaxed").sort(
        ["source", "window_id", "rho", "region", "scheduler", "replicate", "req_id"])


# --------------------------------------------------------------------------- notebook 03: tables and figures

CURVE_SCHEDULERS = ("fcfs", "sarathi", "srpt_oracle", "las", "random")


def regions_table(P: Mapping):
    """One row per campaign region: name and offered load rho (x the window's measured capacity)."""
    import polars as pl

    loads = region_loads(P)
    return pl.DataFrame({"region": list(loads), "rho": list(loads.values())})


def conservation_summary(runs):
    """Request accounting per source and overall: arrived = completed + unfinished + rejected, and
    the number of runs where it does not hold (must be 0)."""
    import polars as pl

    bad = (pl.col("arrived") != pl.col("completed_n") + pl.col("unfinished") + pl.col("rejected"))
    agg = [pl.len().alias("runs"), pl.col("arrived").sum(), pl.col("completed_n").sum(),
           pl.col("unfinished").sum(), pl.col("rejected").sum(), pl.col("preemptions").sum(),
           bad.sum().alias("violations")]
    per = runs.group_by(["source", "provenance"]).agg(agg).sort("source")
    total = runs.select(agg).with_columns(pl.lit("all").alias("source"), pl.lit("").alias("provenance"))
    return pl.concat([per, total.select(per.columns)], how="vertical")


def _source_rank(source: str) -> tuple:
    from ..core.provenance import SOURCES

    return (SOURCES.index(source), "") if source in SOURCES else (len(SOURCES), source)


def capacity_summary(runs):
    """Per source (in the study's source order): windows and median / min / max capacity (req/s)."""
    import polars as pl

    cap = capacity_by_window(runs).group_by(["source", "provenance"]).agg(
        pl.len().alias("windows"), pl.col("capacity_rps").median().alias("median"),
        pl.col("capacity_rps").min().alias("min"), pl.col("capacity_rps").max().alias("max"))
    return cap.sort(pl.col("source").map_elements(lambda s: _source_rank(s)[0], return_dtype=pl.Int64))


def capacity_by_window(runs):
    """One row per window: source, provenance, window id, measured capacity (req/s)."""
    return runs.select(["source", "provenance", "window_id", "capacity_rps"]).unique().sort(["source", "window_id"])


def _plain_log_axis(ax, axis: str = "y", subs=(1.0, 2.0, 5.0)) -> None:
    """Log scale with plain-number tick labels at 1-2-5 steps (readable without exponents)."""
    import matplotlib.ticker as mticker

    getattr(ax, f"set_{axis}scale")("log")
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    a.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(mticker.NullFormatter())


def _labels_for(runs, labels: Mapping | None) -> dict:
    from ..core.provenance import label

    prov = dict(runs.select(["source", "provenance"]).unique().iter_rows())
    return {s: (labels or {}).get(s) or label(s, p) for s, p in prov.items()}


def plot_capacity(runs, labels: Mapping | None = None):
    """Capacity per window (req/s, log scale), one column of dots per source, median marked."""
    import numpy as np

    from ..present.figures import figure

    cap = capacity_by_window(runs)
    lab = _labels_for(runs, labels)
    srcs = [s for s in ("azure", "burstgpt", "bailian") if s in lab] + sorted(set(lab) - {"azure", "burstgpt", "bailian"})
    fig, ax = figure(figsize=(1.9 * len(srcs) + 2.5, 3.6))
    rng = np.random.default_rng(0)
    for i, s in enumerate(srcs):
        y = cap.filter(cap["source"] == s)["capacity_rps"].to_numpy()
        ax.scatter(i + rng.uniform(-0.18, 0.18, y.size), y, s=14, alpha=0.7, label=None)
        ax.hlines(np.median(y), i - 0.3, i + 0.3, color="black", lw=2)
    ax.set_xticks(range(len(srcs)), [lab[s] for s in srcs])
    _plain_log_axis(ax, subs=(1.0, 2.0, 3.0, 5.0))
    ax.set_ylabel("capacity (requests/s, log scale)")
    ax.set_title("Measured saturation capacity per window (bar = median)")
    return fig


def curve_schedulers(runs, preferred: Sequence[str] = CURVE_SCHEDULERS, k: int = 5) -> list[str]:
    """A few schedulers for load curves: the preferred ones present, topped up in name order."""
    present = sorted(runs["scheduler"].unique().to_list())
    out = [s for s in preferred if s in present]
    return (out + [s for s in present if s not in out])[:k]


def load_curves(runs, metrics: Sequence[str], schedulers: Sequence[str] | None = None):
    """Median and inter-quartile range over windows x replicates of each metric, per (source,
    scheduler, region); ``completed_frac`` = completed_n / arrived is available as a metric."""
    import polars as pl

    df = runs.with_columns((pl.col("completed_n") / pl.col("arrived")).alias("completed_frac"))
    if schedulers is not None:
        df = df.filter(pl.col("scheduler").is_in(list(schedulers)))
    agg = []
    for m in metrics:
        agg += [pl.col(m).median().alias(f"{m}_median"), pl.col(m).quantile(0.25).alias(f"{m}_q25"),
                pl.col(m).quantile(0.75).alias(f"{m}_q75")]
    return df.group_by(["source", "provenance", "scheduler", "region", "rho"]).agg(agg).sort(
        ["source", "scheduler", "rho"])


def _metric_axis_label(name: str) -> str:
    if name == "completed_frac":
        return "completed in horizon (fraction)"
    from ..sim import metrics

    try:
        return f"{name} ({metrics.metric(name).unit})"
    except ParameterError:  # not a registered metric: the bare name
        return name


LOG_METRICS = ("ttft_p50", "ttft_p99", "e2e_mean", "e2e_p99", "tpot_mean", "tpot_p99", "norm_latency_mean",
               "max_slowdown")


def plot_load_curves(runs, labels: Mapping | None = None, metrics: Sequence[str] = ("e2e_p99", "ttft_p50",
                     "completed_frac"), schedulers: Sequence[str] | None = None):
    """Metric against offered load rho: one row per metric, one column per source, one line per
    scheduler (median over windows x replicates, band = inter-quartile range)."""
    from ..present.figures import figure

    schedulers = list(schedulers or curve_schedulers(runs))
    curves = load_curves(runs, metrics, schedulers)
    lab = _labels_for(runs, labels)
    srcs = [s for s in ("azure", "burstgpt", "bailian") if s in lab] + sorted(set(lab) - {"azure", "burstgpt", "bailian"})
    fig, axes = figure(len(metrics), len(srcs), figsize=(4.3 * len(srcs), 3.0 * len(metrics)), squeeze=False,
                       sharex=True, sharey="row")
    rho_ticks = runs.select(["region", "rho"]).unique().sort("rho")
    for j, s in enumerate(srcs):
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            for k, sched in enumerate(schedulers):
                c = curves.filter((curves["source"] == s) & (curves["scheduler"] == sched)).sort("rho")
                if c.height == 0:
                    continue
                x = c["rho"].to_numpy()
                ax.plot(x, c[f"{m}_median"].to_numpy(), marker="o", ms=3.5, lw=1.4, color=f"C{k}", label=sched)
                ax.fill_between(x, c[f"{m}_q25"].to_numpy(), c[f"{m}_q75"].to_numpy(), color=f"C{k}", alpha=0.12,
                                lw=0)
            if m in LOG_METRICS:
                _plain_log_axis(ax)
            ax.axvline(1.0, color="0.5", lw=0.8, ls=":")
            if i == 0:
                ax.set_title(lab[s])
            if j == 0:
                ax.set_ylabel(_metric_axis_label(m))
            if i == len(metrics) - 1:
                ax.set_xlabel("offered load ρ (x window capacity)")
                ax.set_xticks(rho_ticks["rho"].to_list(), [f"{r:g}" for r in rho_ticks["rho"].to_list()])
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), title="scheduler", frameon=False)
    fig.tight_layout()
    return fig


def load_story(runs, schedulers: Sequence[str] | None = None) -> list[dict]:
    """Numbers behind the load-curve text, per source: the lightest and heaviest region's median
    completion fraction and e2e_p99 over the given schedulers' runs."""
    import polars as pl

    df = runs.with_columns((pl.col("completed_n") / pl.col("arrived")).alias("completed_frac"))
    if schedulers is not None:
        df = df.filter(pl.col("scheduler").is_in(list(schedulers)))
    lo, hi = df["rho"].min(), df["rho"].max()
    out = []
    for (s, prov), g in df.group_by(["source", "provenance"], maintain_order=True):
        light, heavy = g.filter(pl.col("rho") == lo), g.filter(pl.col("rho") == hi)
        row = {"source": s, "provenance": prov, "rho_light": lo, "rho_heavy": hi,
               "region_light": light["region"][0], "region_heavy": heavy["region"][0],
               "completed_light": float(light["completed_frac"].median()),
               "completed_heavy": float(heavy["completed_frac"].median())}
        if "e2e_p99" in g.columns:
            row["e2e_p99_light"] = float(light["e2e_p99"].median())
            row["e2e_p99_heavy"] = float(heavy["e2e_p99"].median())
        out.append(row)
    return sorted(out, key=lambda r: _source_rank(r["source"]))


def preemption_table(runs):
    """Mean preemptions per run by (source, scheduler, region)."""
    import polars as pl

    return runs.group_by(["source", "scheduler", "region", "rho"]).agg(
        pl.col("preemptions").mean().alias("preemptions_per_run"),
        (pl.col("rejected").sum() / pl.col("arrived").sum()).alias("rejected_frac")).sort(
        ["source", "scheduler", "rho"])


# How the attained-service policies rank requests (for :func:`preemption_markdown`).
ATTAINED_RANKING = {
    "las": "`las`: tokens generated",
    "mlfq": "`mlfq`: the feedback level a request has been demoted to",
    "rr": "`rr`: a cyclic queue that a request rejoins at the tail each time it uses up a quantum",
}


def preemption_markdown(runs, labels: Mapping | None = None) -> str | None:
    """Notebook 03's explanation of why the attained-service policies (las, mlfq, rr) preempt more than
    fcfs, with their mean preemptions per run at the heaviest region of ``runs``; None when the runs
    have none of them, no fcfs, or no preemption at that load."""
    import polars as pl

    names = set(runs["scheduler"])
    ranked = [p for p in ATTAINED_RANKING if p in names]
    pre = preemption_table(runs)
    heavy = pre.filter(pl.col("rho") == pre["rho"].max())
    if not ranked or "fcfs" not in names or not heavy["preemptions_per_run"].max() > 0:
        return None
    lab = _labels_for(runs, labels)
    per_run = {(r["source"], r["scheduler"]): r["preemptions_per_run"] for r in heavy.iter_rows(named=True)}
    srcs = sorted((s for s in lab if (s, "fcfs") in per_run), key=_source_rank)
    idle = [lab[s] for s in srcs if max(per_run[(s, p)] for p in [*ranked, "fcfs"]) < 1]
    one = len(ranked) == 1
    numbers = "; ".join(f"{lab[s]}: " + ", ".join(f"`{p}` {per_run[(s, p)]:.1f}" for p in ranked)
                        + f" vs `fcfs` {per_run[(s, 'fcfs')]:.1f}" for s in srcs)
    return (
        f"**Why {', '.join(f'`{p}`' for p in ranked)} preempt{'s' if one else ''} more than `fcfs` when memory is "
        f"short.** {'It ranks' if one else 'They rank'} requests by the service received so far "
        f"({'; '.join(ATTAINED_RANKING[p] for p in ranked)}), so newly arrived requests, with zero attained service, "
        "rank above running requests that have already been served. When the KV cache is full, serving the newcomers "
        "means evicting running requests, and each evicted request must later recompute its prompt and every token "
        "it has generated so far (KV swapping to CPU memory is not modelled, so recompute is the only way to free "
        "memory). `fcfs` never lets a newcomer overtake: it evicts (the latest arrival) only when the running "
        f"requests' own growth overflows the cache. Mean preemptions per run in region *{heavy['region'][0]}* "
        f"(ρ = {heavy['rho'][0]:g}): {numbers}."
        + (f" On {' and '.join(idle)} the cache almost never fills at this load (under one preemption per run for "
           "every policy shown), so the ranking costs almost no recomputation there." if idle else ""))


def plot_preemptions(runs, labels: Mapping | None = None):
    """Heatmaps of mean preemptions per run, scheduler x region, one panel per source."""
    import numpy as np

    from ..present.figures import figure

    t = preemption_table(runs)
    lab = _labels_for(runs, labels)
    srcs = [s for s in ("azure", "burstgpt", "bailian") if s in lab] + sorted(set(lab) - {"azure", "burstgpt", "bailian"})
    regions = runs.select(["region", "rho"]).unique().sort("rho")["region"].to_list()
    scheds = sorted(runs["scheduler"].unique().to_list())
    import matplotlib.colors as mcolors

    vmax = max(1.0, float(t["preemptions_per_run"].max() or 0.0))
    norm = mcolors.PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)  # square-root colour scale: small counts stay visible
    fig, axes = figure(1, len(srcs), figsize=(0.75 * len(regions) * len(srcs) + 2.8, 0.32 * len(scheds) + 1.8),
                       squeeze=False, sharey=True)
    im = None
    for j, s in enumerate(srcs):
        ax = axes[0][j]
        grid = np.full((len(scheds), len(regions)), np.nan)
        for r in t.filter(t["source"] == s).iter_rows(named=True):
            grid[scheds.index(r["scheduler"]), regions.index(r["region"])] = r["preemptions_per_run"]
        im = ax.imshow(grid, aspect="auto", cmap="viridis", norm=norm)
        for (a, b), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(b, a, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="center", fontsize=7.5,
                        color="white" if norm(v) < 0.6 else "black")
        ax.set_xticks(range(len(regions)), regions, rotation=35, ha="right")
        ax.set_yticks(range(len(scheds)), scheds)
        ax.set_title(lab[s])
        ax.grid(False)
    axes[0][len(srcs) // 2].set_xlabel("operating region (load increases to the right)")
    fig.colorbar(im, ax=axes[0].tolist(), label="recompute preemptions per run (mean; sqrt scale)", shrink=0.9)
    return fig
