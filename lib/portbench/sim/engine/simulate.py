"""``simulate``: one window under one scheduler on one replica, and its result."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ...core.errors import ConservationError, ParameterError
from ..request import FINISHED, NOT_ARRIVED, REJECTED, WAITING, Request, requests_from_window
from ..schedulers import get_scheduler
from .core import Engine

RECORD_COLUMNS = ("req_id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                  "generated_tokens", "preemptions", "rejected", "tenant", "service_s")


@dataclass
class SimResult:
    """Result of one run: per-request ``requests`` (metrics records), ``counters``, optional
    ``iterations`` trace (``record_iterations=True``)."""

    requests: pl.DataFrame
    counters: dict
    iterations: pl.DataFrame | None = None
    scheduler: str = ""

    def check(self) -> "SimResult":
        """Re-check conservation and the KV bound from the records and counters."""
        c = self.counters
        if c["arrived"] != c["completed"] + c["unfinished"] + c["rejected"]:
            raise ConservationError(f"arrived {c['arrived']} != completed {c['completed']} + unfinished "
                                    f"{c['unfinished']} + rejected {c['rejected']}")
        if c["kv_max_used_blocks"] > c["kv_capacity_blocks"]:
            raise ConservationError(f"KV blocks in use reached {c['kv_max_used_blocks']} > capacity "
                                    f"{c['kv_capacity_blocks']}")
        r = self.requests
        if r.height:
            arrived = r["arrival_s"] <= c["horizon_s"]
            done = r["finish_s"].is_not_nan() & r["finish_s"].is_not_null()
            n_done = int(done.sum())
            n_rej = int(r["rejected"].sum())
            if n_done != c["completed"] or n_rej != c["rejected"] or int(arrived.sum()) != c["arrived"]:
                raise ConservationError("records disagree with counters: completed "
                                        f"{n_done}/{c['completed']}, rejected {n_rej}/{c['rejected']}, "
                                        f"arrived {int(arrived.sum())}/{c['arrived']}")
            bad = r.filter(done & (r["generated_tokens"] != r["output_tokens"]))
            if bad.height:
                raise ConservationError(f"{bad.height} finished requests did not generate their output")
            if int((r["generated_tokens"] > r["output_tokens"]).sum()):
                raise ConservationError("a request generated more tokens than its output length")
        return self


def simulate(window_df, scheduler, profile, *, horizon_s: float, seed: int, slo=None,
             naive: bool = False, record_iterations: bool = False,
             check_invariants: bool = False) -> SimResult:
    """Simulate one window under one scheduler on one replica.

    ``window_df``: the window table (``arrival_s, prompt_tokens, output_tokens, tenant``);
    ``scheduler``: a registered name or a :class:`~portbench.sim.schedulers.BaseScheduler` instance;
    ``profile``: a :class:`~portbench.sim.profiles.Profile` (or anything with its fields);
    ``horizon_s``: end of the observation (``inf`` = run until every request finished);
    ``seed``: the run's seed (``numpy.random.default_rng(seed)`` is handed to the scheduler);
    ``slo``: the SLO definition ``{ttft_s, tpot_s}`` for deadline-based policies (edf).
    ``naive=True`` steps one iteration at a time (test reference); ``record_iterations=True``
    adds ``SimResult.iterations`` (one row per iteration or closed-form decode run);
    ``check_invariants=True`` recomputes the engine's incremental bookkeeping from scratch at
    every decision point (slow; for tests).

    Returns a :class:`SimResult` whose ``requests`` are the metrics records (one row per window
    row, ``req_id`` = row) and ``counters`` = arrived, completed, unfinished, rejected,
    preemptions (recompute evictions), pauses, iterations, decision_points, sim_end_s,
    horizon_s, kv_capacity_blocks, kv_max_used_blocks. Raises ConservationError if a request is
    lost or the KV cache overflows.
    """
    try:
        H = float(horizon_s)
    except (TypeError, ValueError):
        raise ParameterError("horizon_s", horizon_s, "a number of seconds > 0") from None
    if not H > 0:
        raise ParameterError("horizon_s", horizon_s, "a number of seconds > 0 (inf: run to the end)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParameterError("seed", seed, "a non-negative integer")
    sched = get_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
    rng = np.random.default_rng(int(seed))
    reqs, ctx = requests_from_window(window_df, profile, rng, slo)
    sched.reset(ctx)
    eng = Engine(reqs, sched, profile, H, naive, record_iterations, check_invariants)
    eng.prepare_static_ranks()
    if reqs:
        eng.run()
    return _result(eng, reqs, profile, H)


def _result(eng: Engine, reqs: list[Request], profile, H: float) -> SimResult:
    eng._materialize()
    # requests that arrived but were never ingested (the server stopped at the horizon)
    for i in range(eng.cursor, eng.n_arrivable):
        r = eng.arrivals[i]
        r.state = REJECTED if r.never_fits else WAITING
    arrived = completed = unfinished = rejected = 0
    for r in reqs:
        st = r.state
        if st == NOT_ARRIVED:
            continue
        arrived += 1
        if st == FINISHED:
            completed += 1
        elif st == REJECTED:
            rejected += 1
        else:
            unfinished += 1
    n = len(reqs)
    pro = np.fromiter((r.prompt_tokens for r in reqs), dtype=np.int64, count=n)
    out = np.fromiter((r.output_tokens for r in reqs), dtype=np.int64, count=n)
    svc = profile.isolated_service_s(pro, out) if n else np.zeros(0)
    records = pl.DataFrame({
        "req_id": np.arange(n, dtype=np.int64),
        "arrival_s": np.fromiter((r.arrival_s for r in reqs), dtype=float, count=n),
        "first_token_s": np.fromiter((r.first_token_s for r in reqs), dtype=float, count=n),
        "finish_s": np.fromiter((r.finish_s for r in reqs), dtype=float, count=n),
        "prompt_tokens": pro,
        "output_tokens": out,
        "generated_tokens": np.fromiter((r.generated for r in reqs), dtype=np.int64, count=n),
        "preemptions": np.fromiter((r.preemptions for r in reqs), dtype=np.int64, count=n),
        "rejected": np.fromiter((r.state == REJECTED for r in reqs), dtype=bool, count=n),
        "tenant": pl.Series("tenant", [str(r.tenant) for r in reqs], dtype=pl.Utf8),
        "service_s": np.asarray(svc, dtype=float).reshape(n),
    })
    counters = {
        "arrived": arrived, "completed": completed, "unfinished": unfinished, "rejected": rejected,
        "preemptions": eng.n_preempt, "pauses": eng.n_pause, "iterations": eng.n_iter,
        "decision_points": eng.n_decisions, "sim_end_s": float(eng.end_time), "horizon_s": H,
        "kv_capacity_blocks": eng.cap, "kv_max_used_blocks": eng.max_used,
    }
    if arrived != completed + unfinished + rejected or eng.n_finished != completed:
        raise ConservationError(f"arrived {arrived} != completed {completed} + unfinished {unfinished} + "
                                f"rejected {rejected} (engine finished {eng.n_finished})")
    if eng.max_used > eng.cap:
        raise ConservationError(f"KV blocks in use reached {eng.max_used} > capacity {eng.cap}")
    counters["conserved"] = True
    iters = None
    if eng.trace is not None:
        iters = pl.DataFrame(eng.trace, schema=[("start_s", pl.Float64), ("end_s", pl.Float64),
                                                 ("n_iterations", pl.Int64), ("prefill_tokens", pl.Int64),
                                                 ("decode_seqs", pl.Int64), ("context_tokens", pl.Int64),
                                                 ("kv_blocks_used", pl.Int64)], orient="row")
    return SimResult(requests=records, counters=counters, iterations=iters, scheduler=eng.sched.name)
