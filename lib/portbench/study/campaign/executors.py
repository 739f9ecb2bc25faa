"""Workers and executors: one shard = every scheduler x replicate of one (window, region), computed in a
worker (this process, a spawn-context process pool, or Dask); only the main process writes files."""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ...core.config import SimulationConfig
from ...core.errors import ParameterError, PortbenchError
from .plan import ShardSpec, run_seed

EXECUTORS = ("process", "dask")
# Contract columns of a run row, in order; metric columns (Float64) follow.
# Contract columns of a run row, in order; metric columns (Float64) follow.
KEY_COLUMNS = ("source", "provenance", "window_id", "region", "rho", "scheduler", "replicate", "seed")


RUN_COLUMNS = KEY_COLUMNS + ("profile", "capacity_rps", "horizon_s",
                             "arrived", "completed_n", "unfinished", "rejected", "preemptions")


# counters key -> run column
COUNTER_COLUMNS = {"arrived": "arrived", "completed": "completed_n", "unfinished": "unfinished",
                   "rejected": "rejected", "preemptions": "preemptions"}


SORT_COLUMNS = ["source", "window_id", "rho", "region", "scheduler", "replicate"]


class RunFailed(PortbenchError):
    """A run (or a capacity measurement) failed inside the campaign; the message names it and the cause."""


@dataclass
class WorkerContext:
    """Sent once to each worker: the engine, the simulation settings and the verified window tables."""

    engine: Any
    sim: SimulationConfig
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
        cap = float(ctx.engine.capacity(ctx.windows[window_id], ctx.sim))
    except Exception as e:
        raise _fail(f"capacity of window {window_id}", e) from None
    if not cap > 0:
        raise RunFailed(f"capacity of window {window_id} is {cap!r}: expected a positive req/s")
    return window_id, cap, time.perf_counter() - t0


def compute_shard(ctx: WorkerContext, shard: ShardSpec, capacity_rps: float, profile: str,
                  metric_names: Sequence[str]) -> dict:
    """Run every scheduler x replicate of one (window, region); returns the run rows and records."""
    t0 = time.perf_counter()
    w = shard.window
    sim = ctx.sim
    base_seed = int(sim.seed)
    scaled, horizon = ctx.engine.prepare(ctx.windows[w.id], shard.rho, capacity_rps, sim)
    rows, recs = [], []
    for sched in shard.schedulers:
        for rep in shard.replicates:
            seed = run_seed(base_seed, w.id, sched, shard.region, rep)
            try:
                res = ctx.engine.run(scaled, sched, seed, horizon, sim)
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
