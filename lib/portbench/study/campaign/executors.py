"""Workers and executors: one shard = every scheduler x replicate of one (window, region), computed in a
worker (this process, a spawn-context process pool, or Dask); only the main process writes files.

**Plug-ins that hang or cheat.** In a shard the built-in schedulers run first; a plug-in scheduler's run then has a
time limit of ``campaign.time_limit.factor`` x the slowest built-in run of the shard (same window and region), and
never less than ``floor_s`` (:func:`plugin_limit`). A run past it ends (SIGALRM in the process running it: this
process or a pool worker; a Dask worker runs tasks in threads, where no limit applies) with a
:class:`~portbench.core.errors.PluginTimeoutError` naming the scheduler, the window, the region and the limit. A
plug-in whose run drew no random number from the run's generator has its replicates simulated, not copied: the
second replicate (another seed) is run and compared with the first across the whole campaign, so a plug-in drawing
from ``random`` / numpy's global generator (whatever information it declares) is caught wherever it shows.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import polars as pl

from ...core import plugins as plugin_loader
from ...core import procs
from ...core.config import SimulationConfig
from ...core.errors import ParameterError, PluginTimeoutError, PortbenchError
from ...sim import settings as sim_settings
from .plan import ShardSpec, run_seed

EXECUTORS = ("process", "dask")
# Contract columns of a run row, in order; metric columns (Float64) follow.
KEY_COLUMNS = ("source", "provenance", "window_id", "region", "rho", "scheduler", "replicate", "seed")


# counters key -> run column (integers): request accounting (refused = prompt longer than the context
# limit, counted in rejected too; clipped = output clipped to it), preemptions (recompute or swap) and
# swaps, prefix-cache hit / looked-up tokens
COUNTER_COLUMNS = {"arrived": "arrived", "completed": "completed_n", "unfinished": "unfinished",
                   "rejected": "rejected", "preemptions": "preemptions", "refused": "refused",
                   "clipped": "clipped", "swaps": "swaps", "prefix_hit_tokens": "prefix_hit_tokens",
                   "prefix_query_tokens": "prefix_query_tokens"}


# load columns (floats): time-weighted mean and 95th percentile of the waiting queue over the
# observation, and the achieved utilisation (portbench.sim.regions.utilisation)
LOAD_COLUMNS = ("queue_mean", "queue_p95", "utilisation")


RUN_COLUMNS = KEY_COLUMNS + ("profile", "capacity_rps", "horizon_s") + tuple(COUNTER_COLUMNS.values()) + LOAD_COLUMNS


SORT_COLUMNS = ["source", "window_id", "rho", "region", "scheduler", "replicate"]


class RunFailed(PortbenchError):
    """A run (or a capacity measurement) failed inside the campaign; the message names it and the cause."""


@dataclass
class WorkerContext:
    """Sent once to each worker: the engine, the simulation settings, the verified window tables, the
    window references (``ShardSpec.window`` carries them too), the plug-ins to load (files travel as
    text) and the modules of the schedulers to import."""

    engine: Any
    sim: SimulationConfig
    windows: dict           # window id -> window DataFrame
    modules: list = field(default_factory=list)
    plugins: list = field(default_factory=list)   # core.plugins.PluginSpec
    refs: dict = field(default_factory=dict)      # window id -> WindowRef
    time_limit: tuple = (20.0, 60.0)              # a plug-in run's limit: (factor x slowest built-in, floor_s)


_CTX: WorkerContext | None = None


def _where() -> str:
    try:
        from distributed import get_worker

        return f"Dask worker {get_worker().address}"
    except (ImportError, ValueError):
        return f"worker process {os.getpid()}"


def load_worker_code(ctx: WorkerContext, where: str | None = None) -> None:
    """Load the campaign's plug-ins, then import the schedulers' modules (a clear RunFailed when one
    cannot be imported here, e.g. on a Dask worker without the package)."""
    if not ctx.plugins and all(m == "__main__" or m in sys.modules for m in ctx.modules):
        return
    where = where or _where()
    try:
        plugin_loader.load_all(ctx.plugins, where)
    except PortbenchError as e:
        raise RunFailed(str(e)) from None
    for m in ctx.modules:
        if m != "__main__" and m not in sys.modules:
            try:
                importlib.import_module(m)
            except ImportError as e:
                raise RunFailed(f"{where}: cannot import {m!r}, the module of a scheduler in this campaign "
                                f"({type(e).__name__}: {e}); load it as a plug-in (--plugin FILE or `plugins:`) so "
                                "that its code is shipped to the workers, or install it there") from None


def _init_worker(ctx: WorkerContext) -> None:
    global _CTX
    os.environ.setdefault("MPLBACKEND", "Agg")
    load_worker_code(ctx)
    _CTX = ctx


def _init_pool_worker(ctx: WorkerContext) -> None:
    """Initializer of a pool worker: it ends when the campaign's process dies, then :func:`_init_worker`."""
    procs.die_with_parent()
    _init_worker(ctx)


def _fail(what: str, e: BaseException) -> RunFailed:
    """The error of a failed run as one message naming the run (source, window, region, scheduler); a
    project error (bad data, a broken scheduler contract) keeps its own short message, anything else
    (a bug) adds the worker's last frames."""
    if isinstance(e, PortbenchError):
        return RunFailed(f"{what}: {e}")
    at = _plugin_line(e)
    if at is not None:           # the user's plug-in raised: its message and line, not portbench's frames
        return RunFailed(f"{what}: the plug-in raised {type(e).__name__}: {e} (at {at})")
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-4))
    return RunFailed(f"{what} failed: {type(e).__name__}: {e}\n--- worker traceback (last frames) ---\n{tb}")


class _Timeout(BaseException):
    """Raised by the alarm inside a run past its limit (a BaseException: no ``except Exception`` in a policy or the
    engine swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`_Timeout` in this thread after ``seconds`` (SIGALRM; a no-op outside the main thread, where
    signals cannot be delivered, e.g. a Dask worker's task thread)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread() \
            or not math.isfinite(seconds):
        yield
        return

    def _alarm(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def plugin_limit(ctx: WorkerContext, slowest_builtin_s: float) -> float:
    """A plug-in run's limit in seconds: ``factor`` x the slowest built-in run of its shard, at least ``floor_s``."""
    factor, floor = ctx.time_limit
    return max(float(floor), float(factor) * float(slowest_builtin_s))


def _is_plugin(name: str) -> bool:
    return sim_settings.is_plugin(name)


def _same_run(a, b) -> list[str]:
    """The metrics and counters in which two results differ (NaN equals NaN)."""
    diff = []
    for part in ("metrics", "counters"):
        x, y = getattr(a, part), getattr(b, part)
        for k in sorted(set(x) | set(y)):
            u, v = x.get(k), y.get(k)
            if u == v or (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v)):
                continue
            diff.append(k)
    return diff

def _plugin_line(e: BaseException) -> str | None:
    """``file.py:line`` of the innermost frame of ``e`` in a loaded plug-in file, or None."""
    files = {getattr(sys.modules.get(m), "__file__", None) for m in plugin_loader.loaded_modules()}
    files.discard(None)
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:       # the exception and its causes (simpy re-raises a copy)
        seen.add(id(x))
        for f in reversed(traceback.extract_tb(x.__traceback__)):
            if f.filename in files:
                return f"{Path(f.filename).name}:{f.lineno}"
        x = x.__cause__ or x.__context__
    return None


def compute_capacity(ctx: WorkerContext, window_id: str) -> tuple[str, dict, float]:
    """``(window_id, capacity record, wall_s)``: the engine's capacity of the window (a record with
    at least ``capacity_rps``)."""
    t0 = time.perf_counter()
    engine = ctx.engine.for_window(ctx.refs[window_id]) if window_id in ctx.refs else ctx.engine
    ref = ctx.refs.get(window_id)
    try:
        cap = engine.capacity(ctx.windows[window_id], ctx.sim)
    except Exception as e:
        src = f"source {ref.source}, " if ref is not None else ""
        raise _fail(f"capacity of {src}window {window_id}", e) from None
    rec = dict(cap) if isinstance(cap, dict) else {"capacity_rps": cap}
    rps = rec.get("capacity_rps")
    if isinstance(rps, bool) or not isinstance(rps, (int, float)) or not rps > 0:
        raise RunFailed(f"capacity of window {window_id} is {rps!r}: expected a positive req/s")
    rec["capacity_rps"] = float(rps)
    return window_id, rec, time.perf_counter() - t0


def compute_shard(ctx: WorkerContext, shard: ShardSpec, capacity, profile: str,
                  metric_names: Sequence[str]) -> dict:
    """Run every scheduler x replicate of one (window, region); returns the run rows and records.
    ``capacity``: the window's capacity record (or its requests/s)."""
    t0 = time.perf_counter()
    w = shard.window
    sim = ctx.sim
    base_seed = int(sim.seed)
    engine = ctx.engine.for_window(w)
    cap = capacity if isinstance(capacity, dict) else {"capacity_rps": float(capacity)}
    capacity_rps = float(cap["capacity_rps"])
    try:
        scaled, horizon = engine.prepare(ctx.windows[w.id], shard.rho, capacity_rps, sim)
    except Exception as e:  # noqa: BLE001 - whatever fails, the message names the run
        raise _fail(f"source {w.source}, window {w.id}, region {shard.region} (rho={shard.rho}): preparing the "
                    f"window's arrivals", e) from None
    schema = {**{c: pl.String for c in ("source", "provenance", "window_id", "region")}, "rho": pl.Float64,
              "scheduler": pl.String, "replicate": pl.Int64, "seed": pl.Int64, "profile": pl.String,
              "capacity_rps": pl.Float64, "horizon_s": pl.Float64,
              **{c: pl.Int64 for c in COUNTER_COLUMNS.values()}, **{c: pl.Float64 for c in LOAD_COLUMNS},
              **{m: pl.Float64 for m in metric_names}}
    columns: dict[str, list] = {c: [] for c in schema}     # the runs table, built column by column
    recs = []
    n_sim = 0
    nan = float("nan")
    slowest = 0.0                                           # the slowest built-in run of this shard (s)
    plug = {s: _is_plugin(s) for s in shard.schedulers}
    for sched in sorted(shard.schedulers, key=lambda s: plug[s]):     # built-ins first: they set the limit
        res = None
        for k, rep in enumerate(shard.replicates):
            seed = run_seed(base_seed, w.id, sched, shard.region, rep)
            what = (f"source {w.source}, window {w.id}, region {shard.region} (rho={shard.rho}), scheduler {sched}, "
                    f"replicate {rep} (seed {seed})")
            # a run that never drew from its random generator is the same run under any seed: its other
            # replicates are copies of it (an engine that does not report seed_used is always re-run) -- except a
            # plug-in's second replicate, run and compared with its first (randomness drawn elsewhere shows there)
            check_copy = plug[sched] and k == 1 and res is not None and not res.counters.get("seed_used", True)
            if res is None or res.counters.get("seed_used", True) or check_copy:
                limit = plugin_limit(ctx, slowest) if plug[sched] else math.inf
                t1 = time.perf_counter()
                try:
                    with time_limit(limit):
                        new = engine.run(scaled, sched, seed, horizon, sim)
                except _Timeout:
                    raise PluginTimeoutError(
                        f"{what}: scheduler {sched!r} (a plug-in) did not finish within its time limit of {limit:.0f} s on "
                        f"window {w.id} (source {w.source}, region {shard.region}); the slowest built-in run there took "
                        f"{slowest:.2f} s. A policy that never returns (an endless loop, a wait) is stopped here; a "
                        "slow but correct one needs a higher campaign.time_limit (factor, floor_s)") from None
                except Exception as e:
                    raise _fail(what, e) from None
                if not plug[sched]:
                    slowest = max(slowest, time.perf_counter() - t1)
                if check_copy and res is not None:
                    diff = _same_run(res, new)
                    if diff:
                        raise RunFailed(
                            f"scheduler {sched!r} (a plug-in) drew no random number from the run's generator, yet "
                            f"two of its runs of window {w.id} (source {w.source}, region {shard.region}) differ "
                            f"({', '.join(diff[:4])}): it draws randomness outside the run's generator (random, "
                            "numpy.random's global state, the clock ...), whatever information it declares. Draw every "
                            "random number from the generator the engine passes (ctx.rng in reset(ctx)), so that a run "
                            "is reproducible from its seed")
                res = new
                n_sim += 1
            counters, values = res.counters, res.metrics
            row = {"source": w.source, "provenance": w.provenance, "window_id": w.id, "region": shard.region,
                   "rho": float(shard.rho), "scheduler": sched, "replicate": int(rep), "seed": int(seed),
                   "profile": profile, "capacity_rps": float(capacity_rps), "horizon_s": float(horizon)}
            for ckey, col in COUNTER_COLUMNS.items():
                row[col] = int(counters.get(ckey, 0))
            row["queue_mean"] = float(counters.get("queue_mean", nan))
            row["queue_p95"] = float(counters.get("queue_p95", nan))
            rate, per_req = counters.get("work_rate_tok_s"), counters.get("mean_work_tokens")
            row["utilisation"] = (float(rate) / (capacity_rps * float(per_req))
                                  if rate is not None and per_req else nan)
            for m in metric_names:
                v = values.get(m)
                row[m] = nan if v is None else float(v)
            for c, v in row.items():
                columns[c].append(v)
            if rep in shard.record_replicates and res.records is not None:
                recs.append(_keyed_records(res.records, row))
    runs = pl.DataFrame(columns, schema=schema)
    records = pl.concat(recs, how="vertical_relaxed") if recs else None
    return {"shard": shard.name, "runs": runs, "records": records, "wall_s": time.perf_counter() - t0,
            "simulated": n_sim}


def _keyed_records(records, row: Mapping):
    """The run's records with its key columns first (each the run's value repeated; built as Series, not
    through a query)."""
    df = records if isinstance(records, pl.DataFrame) else pl.DataFrame(records)
    keys = [pl.Series(k, [row[k]], dtype=(pl.Float64 if k == "rho" else pl.Int64 if k in ("replicate", "seed")
                                         else pl.String)).new_from_index(0, df.height) for k in KEY_COLUMNS]
    return pl.DataFrame(keys + [df[c] for c in df.columns if c not in KEY_COLUMNS])


def _pool_capacity(window_id: str):
    return compute_capacity(_CTX, window_id)


def _pool_shard(shard, capacity_rps, profile, metric_names):
    return compute_shard(_CTX, shard, capacity_rps, profile, metric_names)


def _dask_capacity(ctx, window_id):
    load_worker_code(ctx)
    return compute_capacity(ctx, window_id)


def _dask_shard(ctx, shard, capacity_rps, profile, metric_names):
    load_worker_code(ctx)
    return compute_shard(ctx, shard, capacity_rps, profile, metric_names)


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
            # spawn: forking a process that has started polars' thread pool can deadlock.
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                             initializer=_init_pool_worker, initargs=(ctx,))
        elif kind == "dask":
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
            pool_fn = cast(Callable, {"capacity": _pool_capacity, "shard": _pool_shard}[fn_name])
            futures = [self._pool.submit(pool_fn, *a) for a in arg_list]
            try:
                for f in as_completed(futures):
                    yield f.result()
            finally:
                for f in futures:
                    f.cancel()
        elif self._client is not None:
            from distributed import as_completed as dask_as_completed

            dask_fn = cast(Callable, {"capacity": _dask_capacity, "shard": _dask_shard}[fn_name])
            dask_futures = [self._client.submit(dask_fn, self._ctx_future, *a, pure=False) for a in arg_list]
            try:
                for f in dask_as_completed(dask_futures):
                    yield f.result()
            finally:
                self._client.cancel(dask_futures)
        else:
            local_fn = cast(Callable, {"capacity": compute_capacity, "shard": compute_shard}[fn_name])
            for a in arg_list:
                yield local_fn(self.ctx, *a)

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
