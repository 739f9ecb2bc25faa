"""``simulate``: one window under one scheduler on one replica, and its result."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import polars as pl

from ...core.config import EngineConfig
from ...core.errors import ConservationError, ParameterError
from ..loops import LazyLoop
from ..profiles import DEFAULT_PROFILE, get_profile
from ..request import FINISHED, NOT_ARRIVED, REJECTED, WAITING, Request, requests_from_window
from ..schedulers import get_scheduler
from . import columns, compiled
from .columns import service_times as _service_s
from .contract import is_plugin
from .core import Engine

RECORD_COLUMNS = ("req_id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                  "generated_tokens", "preemptions", "rejected", "tenant", "service_s", "refused",
                  "trace_output_tokens", "admitted_s")


def queue_stats(intervals, t_end: float) -> tuple[float, float]:
    """(time-average, time-weighted 95th percentile) of the number of waiting requests over
    [0, t_end], from each waiting interval (start, end) (clipped to [0, t_end])."""
    if len(intervals) == 0 or not t_end > 0:
        return 0.0, 0.0
    a = np.asarray(intervals, dtype=float)
    return _queue_stats(a[:, 0], a[:, 1], t_end)


def _queue_stats(start: np.ndarray, end: np.ndarray, t_end: float) -> tuple[float, float]:
    """:func:`queue_stats` of the intervals' start and end times (float arrays)."""
    if not start.shape[0] or not t_end > 0:
        return 0.0, 0.0
    core = QUEUE_LOOP()     # None where numba is not loaded (loops.NUMBA_LOADED): then numpy
    if core is not None:        # the same numbers, compiled (tests/test_compiled_core.py holds them equal)
        m, levels, durs, p95 = core(np.ascontiguousarray(start, float), np.ascontiguousarray(end, float), float(t_end))
        if not m:
            return 0.0, 0.0
        return float(np.sum(levels * durs) / t_end), float(p95)
    st = np.clip(start, 0.0, t_end)
    en = np.clip(end, 0.0, t_end)
    keep = en > st
    if not keep.all():
        st, en = st[keep], en[keep]
    m = st.shape[0]
    if not m:
        return 0.0, 0.0
    # the times in order, at equal times the ends (-1) first: a stable sort of (ends, starts)
    t = np.concatenate([en, st])
    order = np.argsort(t, kind="stable")
    t = t[order]
    levels = np.concatenate([[0.0], np.cumsum(np.where(order < m, -1.0, 1.0))])
    durs = np.diff(np.concatenate([[0.0], t, [t_end]]))
    mean = float(np.sum(levels * durs) / t_end)
    o = np.argsort(levels, kind="stable")
    cum = np.cumsum(durs[o])
    p95 = float(levels[o[np.searchsorted(cum, 0.95 * t_end, side="left").clip(0, len(o) - 1)]])
    return mean, p95


def _queue_levels(start, end, t_end):
    """``(intervals kept, levels, durations, p95)`` of :func:`_queue_stats` as loops (compiled by numba): the
    same operations in the same order; the mean's sum stays numpy's."""
    n = start.shape[0]
    ts = np.empty(2 * n)
    m = 0
    for i in range(n):            # np.clip, then the intervals of positive length
        a = start[i]
        a = a if (a > 0.0 or np.isnan(a)) else 0.0
        a = a if (a < t_end or np.isnan(a)) else t_end
        b = end[i]
        b = b if (b > 0.0 or np.isnan(b)) else 0.0
        b = b if (b < t_end or np.isnan(b)) else t_end
        if b > a:
            ts[m] = b             # ends first
            ts[n + m] = a
            m += 1
    t = np.concatenate((ts[:m], ts[n:n + m]))
    order = np.argsort(t, kind="mergesort")
    levels = np.empty(2 * m + 1)
    durs = np.empty(2 * m + 1)
    levels[0] = 0.0
    acc = 0.0
    prev = 0.0
    for k in range(2 * m):
        acc = acc + (-1.0 if order[k] < m else 1.0)
        levels[k + 1] = acc
        tk = t[order[k]]
        durs[k] = tk - prev
        prev = tk
    durs[2 * m] = t_end - prev
    p95 = 0.0
    if m:
        # levels are whole numbers in [0, m] (an interval ends after it starts): a stable counting sort is numpy's
        # stable argsort
        for k in range(2 * m + 1):
            if not 0.0 <= levels[k] <= m:      # pragma: no cover - cannot happen; numpy's sort then
                raise ValueError("queue level out of range")
        count = np.zeros(m + 2, np.int64)
        for k in range(2 * m + 1):
            count[int(levels[k]) + 1] += 1
        for v in range(1, m + 2):
            count[v] += count[v - 1]
        o = np.empty(2 * m + 1, np.int64)
        for k in range(2 * m + 1):
            lv = int(levels[k])
            o[count[lv]] = k
            count[lv] += 1
        goal = 0.95 * t_end
        cum = 0.0
        pick = 2 * m
        for k in range(2 * m + 1):
            cum = cum + durs[o[k]]
            if cum >= goal:
                pick = k
                break
        p95 = levels[o[pick]]
    return m, levels, durs, p95


QUEUE_LOOP = LazyLoop(_queue_levels)     # :func:`_queue_levels` compiled by numba, or None (loops.LazyLoop)


@dataclass
class SimResult:
    """Result of one run: per-request ``requests`` (metrics records), ``counters``, optional
    ``iterations`` trace (``record_iterations=True``)."""

    requests: pl.DataFrame
    counters: dict
    iterations: pl.DataFrame | None = None
    scheduler: str = ""
    core: str = "reference"     # the engine core that ran it (reference | compiled)
    core_note: str = ""         # engine.core auto on the reference: why the compiled core did not run it

    def record_arrays(self) -> dict:
        """The records' columns ``{name: numpy array}`` (``tenant``: a polars Series of strings), what
        :func:`portbench.sim.metrics.compute` reads: without building the DataFrame on the compiled core."""
        r = self.requests
        return {c: (r[c] if c == "tenant" else r[c].to_numpy()) for c in r.columns}

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


class ArrayRecords(SimResult):
    """A :class:`SimResult` whose records are kept as the columns' arrays (the compiled core's result) and
    turned into the ``requests`` DataFrame only when something reads it: a campaign that computes the
    metrics from the arrays (:meth:`record_arrays`) and keeps the records of a few runs builds no
    DataFrame for the others. Equal in every respect to the eager result."""

    _columns: dict
    _frame: pl.DataFrame | None

    def _get_requests(self) -> pl.DataFrame:
        if self._frame is None:
            self._frame = pl.DataFrame(self._columns)
        return self._frame

    def _set_requests(self, value) -> None:
        if isinstance(value, dict):
            self._columns, self._frame = value, None
        else:
            self._columns, self._frame = {}, value

    requests = property(_get_requests, _set_requests)

    def record_arrays(self) -> dict:
        if self._frame is not None:
            return super().record_arrays()
        return self._columns


class SeedRecorder:
    """The run's random generator (``numpy.random.default_rng(seed)``), recording whether anything drew from
    it (or asked for any of its attributes). A run whose policy never touched it does not depend on the seed
    -- the generator is a run's only source of randomness -- so its replicates are the same run
    (``counters["seed_used"]``: the campaign simulates such a policy's replicates once)."""

    __slots__ = ("_seed", "_rng", "used")

    def __init__(self, seed: int):
        self._seed = int(seed)
        self._rng = None           # made at the first draw (most policies never draw)
        self.used = False

    def __getattr__(self, name):
        self.used = True
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return getattr(self._rng, name)


def simulate(window_df, scheduler, profile, *, horizon_s: float, seed: int, slo=None,
             engine: EngineConfig | dict | None = None, hash_block_tokens: int | None = None,
             work_marks=(), naive: bool = False, record_iterations: bool = False,
             check_invariants: bool = False, check_contract: bool | None = None) -> SimResult:
    """Simulate one window under one scheduler on one replica.

    ``window_df``: the window table (``arrival_s, prompt_tokens, output_tokens, tenant``), or a
    :class:`~portbench.sim.engine.columns.Window` of it (runs on the same window share its set-up: the same
    records);
    ``scheduler``: a registered name or a :class:`~portbench.sim.schedulers.BaseScheduler` instance;
    ``profile``: a :class:`~portbench.sim.profiles.Profile` (or anything with its fields);
    ``horizon_s``: end of the observation (``inf`` = run until every request finished);
    ``seed``: the run's seed (``numpy.random.default_rng(seed)`` is handed to the scheduler);
    ``slo``: the SLO definition ``{ttft_s, tpot_s}`` for deadline-based policies (edf);
    ``engine``: the :class:`~portbench.core.config.EngineConfig` (or a mapping; None = defaults:
    V1 batching, recompute preemption, prefix caching where the window has ``block_hashes``);
    ``hash_block_tokens``: prompt tokens per hash of the window's optional ``block_hashes`` column
    (a list of ints per request, e.g. 512 for Mooncake); ``work_marks``: times at which to report
    the useful work done (``counters["work_at"]``: prompt tokens computed for the first time +
    tokens generated, by each time).
    ``naive=True`` steps one iteration at a time (test reference); ``record_iterations=True``
    adds ``SimResult.iterations`` (one row per iteration or closed-form decode run);
    ``check_invariants=True`` recomputes the engine's incremental bookkeeping from scratch at
    every decision point (slow; for tests). ``check_contract``: check every hook result of the policy
    against the scheduler contract (:mod:`.contract`; SchedulerError on a breach); None = for plug-ins
    (classes defined outside portbench) only. A policy declaring ``static_priority = True`` is always
    checked to give the same priority at different times.

    Returns a :class:`SimResult` whose ``requests`` are the metrics records (one row per window
    row, ``req_id`` = row) and ``counters`` = arrived, completed, unfinished, rejected,
    preemptions (evictions: recompute or swap), swaps, pauses, iterations, decision_points,
    sim_end_s, horizon_s, kv_capacity_blocks, kv_max_used_blocks; refused (prompt >=
    max_model_len; counted in rejected), clipped (output clipped to the context limit);
    prefix-cache hit and query tokens; queue_mean / queue_p95 (waiting requests, time-weighted over
    the observation); work (useful tokens) and work_at; seed_used (the policy drew from the run's random
    generator: False means any other seed gives the same run, :class:`SeedRecorder`). Raises
    ConservationError if a request is lost or the KV cache overflows.
    """
    try:
        H = float(horizon_s)
    except (TypeError, ValueError):
        raise ParameterError("horizon_s", horizon_s, "a number of seconds > 0") from None
    if not H > 0:
        raise ParameterError("horizon_s", horizon_s, "a number of seconds > 0 (inf: run to the end)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParameterError("seed", seed, "a non-negative integer")
    if hash_block_tokens is not None and (isinstance(hash_block_tokens, bool)
                                          or not isinstance(hash_block_tokens, (int, np.integer)) or hash_block_tokens <= 0):
        raise ParameterError("hash_block_tokens", hash_block_tokens, "None or a positive number of tokens per hash block")
    sched = get_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
    engine = EngineConfig.of(engine)
    rng = SeedRecorder(int(seed))
    why = None
    if engine.core != "reference":
        contract = bool(is_plugin(sched) if check_contract is None else check_contract)
        why = compiled.unsupported(sched, engine, profile, naive=naive, check_invariants=check_invariants,
                                   check_contract=contract)
        if engine.core == "compiled":
            compiled.require_supported(why)
        if why is None:         # the set-up straight from the window's columns, where it applies
            fast = columns.prepare(window_df, sched, profile, H, rng, slo, engine, hash_block_tokens=hash_block_tokens,
                                   marks=work_marks, record_iterations=record_iterations, check_contract=contract)
            if fast is not None:
                cols = fast.columns
                res = _result_compiled(fast.engine, compiled.run(fast.engine, window_df, cols), cols.prompt,
                                       cols.arrival, fast.trace_output, fast.refused, fast.tenant, profile, H,
                                       service=fast.service_s)
                res.counters["seed_used"] = rng.used
                res.core = "compiled"
                return res
    if isinstance(window_df, columns.Window):
        window_df = window_df.df
    reqs, ctx = requests_from_window(window_df, profile, rng, slo,
                                     max_model_len=int(getattr(profile, "max_model_len", 0) or 0))
    sched.reset(ctx)
    eng = Engine(reqs, sched, profile, H, naive, record_iterations, check_invariants, check_contract,
                 settings=engine, hash_block_tokens=hash_block_tokens, marks=work_marks)
    eng.prepare_static_ranks()
    if reqs and engine.core != "reference" and why is None:
        n = len(reqs)
        res = _result_compiled(eng, compiled.run(eng, window_df), np.fromiter((r.prompt_tokens for r in reqs), np.int64, n),
                               np.fromiter((r.arrival_s for r in reqs), float, n),
                               np.fromiter((r.trace_output_tokens for r in reqs), np.int64, n),
                               np.fromiter((r.refused for r in reqs), bool, n),
                               pl.Series("tenant", [str(r.tenant) for r in reqs], dtype=pl.Utf8), profile, H)
    else:
        if reqs:
            eng.run()
        res = _result(eng, reqs, profile, H)
    res.counters["seed_used"] = rng.used
    if engine.core != "reference" and why is None:
        res.core = "compiled"
    elif why is not None:
        res.core_note = why
    return res


def warm_compiled() -> float:
    """Compile the compiled core's loop in this process, or load it from numba's disk cache, by one tiny run;
    returns the seconds it took. A campaign calls it before its worker processes start, so that the workers
    load the cached machine code instead of compiling it side by side."""
    t0 = time.perf_counter()
    df = pl.DataFrame({"arrival_s": [0.0, 0.5], "prompt_tokens": [100, 200], "output_tokens": [5, 7],
                       "tenant": ["a", "b"]})
    simulate(df, "fcfs", get_profile(DEFAULT_PROFILE), horizon_s=100.0, seed=0, engine={"core": "compiled"})
    QUEUE_LOOP(may_import=True)
    _queue_stats(np.zeros(1), np.ones(1), 2.0)      # the queue statistics' compiled loops
    return time.perf_counter() - t0


def _counters(eng: Engine, H: float, arrived: int, completed: int, unfinished: int, rejected: int, refused: int,
              clipped: int, q_mean: float, q_p95: float, work_at: list) -> dict:
    counters = {
        "arrived": arrived, "completed": completed, "unfinished": unfinished, "rejected": rejected,
        "refused": refused, "clipped": clipped,
        "preemptions": eng.n_preempt, "swaps": eng.n_swap_out, "swap_ins": eng.n_swap_in,
        "swap_s": float(eng.swap_s), "pauses": eng.n_pause, "iterations": eng.n_iter,
        "decision_points": eng.n_decisions, "sim_end_s": float(eng.end_time), "horizon_s": H,
        "kv_capacity_blocks": eng.cap, "kv_max_used_blocks": eng.max_used,
        "prefix_hit_tokens": eng.pc_hit_tokens, "prefix_query_tokens": eng.pc_query_tokens,
        "prefix_caching": bool(eng.pc_on), "queue_mean": q_mean, "queue_p95": q_p95,
        "work": int(eng.work), "work_at": work_at,
        "batching": eng.settings.batching, "preemption": eng.settings.preemption, "token_budget": eng.B,
    }
    if arrived != completed + unfinished + rejected or eng.n_finished != completed:
        raise ConservationError(f"arrived {arrived} != completed {completed} + unfinished {unfinished} + "
                                f"rejected {rejected} (engine finished {eng.n_finished})")
    if eng.max_used > eng.cap:
        raise ConservationError(f"KV blocks in use reached {eng.max_used} > capacity {eng.cap}")
    counters["conserved"] = True
    return counters


ITERATION_SCHEMA = [("start_s", pl.Float64), ("end_s", pl.Float64), ("n_iterations", pl.Int64),
                    ("prefill_tokens", pl.Int64), ("decode_seqs", pl.Int64), ("context_tokens", pl.Int64),
                    ("kv_blocks_used", pl.Int64)]


def _result_compiled(eng: Engine, o: compiled.Outcome, pro: np.ndarray, arrival: np.ndarray, trace_out: np.ndarray,
                     refused_m: np.ndarray, tenant: pl.Series, profile, H: float,
                     service: np.ndarray | None = None) -> SimResult:
    """:func:`_result` from the compiled core's arrays (:class:`compiled.Outcome`) and the requests' prompt,
    arrival, trace output, refused and tenant columns, built in one go: the same records, counters and step
    log. ``service``: the requests' isolated service times when already known (:class:`columns.Window`)."""
    n = pro.shape[0]
    st = o.state
    arrived_m = st != NOT_ARRIVED
    arrived = int(arrived_m.sum())
    completed = int((st == FINISHED).sum())
    rej_m = st == REJECTED
    rejected = int(rej_m.sum())
    unfinished = arrived - completed - rejected
    out = o.output_tokens
    t_obs = H if np.isfinite(H) else float(eng.end_time)
    wait_m = st == WAITING       # the waiting intervals that ended, then the requests still waiting
    ws = o.waiting_since[wait_m]
    q_mean, q_p95 = _queue_stats(np.concatenate([o.wq_s, ws]), np.concatenate([o.wq_e, np.full(ws.shape[0], t_obs)]),
                                 t_obs)
    records = {
        "req_id": np.arange(n, dtype=np.int64),
        "arrival_s": arrival,
        "first_token_s": o.first_token_s,
        "finish_s": o.finish_s,
        "prompt_tokens": pro,
        "output_tokens": out,
        "generated_tokens": o.generated,
        "preemptions": o.preemptions,
        "rejected": rej_m,
        "tenant": tenant,
        "service_s": _service_s(eng, profile, pro, out) if service is None else service,
        "refused": refused_m,
        "trace_output_tokens": trace_out,
        "admitted_s": o.admitted_s,
    }
    refused = int((refused_m & arrived_m).sum())
    clipped = int(((out < trace_out) & arrived_m & ~refused_m).sum())
    counters = _counters(eng, H, arrived, completed, unfinished, rejected, refused, clipped, q_mean, q_p95,
                         o.work_at.tolist())
    iters = None
    if o.tr_f is not None:
        iters = pl.DataFrame({name: (o.tr_f[:, j] if j < 2 else o.tr_i[:, j - 2])
                              for j, (name, _) in enumerate(ITERATION_SCHEMA)}, schema=ITERATION_SCHEMA)
    return ArrayRecords(requests=records, counters=counters, iterations=iters, scheduler=eng.sched.name)


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
    t_obs = H if np.isfinite(H) else float(eng.end_time)
    waits = list(eng.wq)
    for r in reqs:
        if r.state == WAITING:
            waits.append((r.waiting_since, t_obs))
    q_mean, q_p95 = queue_stats(waits, t_obs)
    eng._note_marks(float("inf"))
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
        "service_s": _service_s(eng, profile, pro, out),
        "refused": np.fromiter((r.refused for r in reqs), dtype=bool, count=n),
        "trace_output_tokens": np.fromiter((r.trace_output_tokens for r in reqs), dtype=np.int64, count=n),
        "admitted_s": np.fromiter((r.admitted_s for r in reqs), dtype=float, count=n),
    })
    refused = sum(1 for r in reqs if r.refused and r.state != NOT_ARRIVED)
    clipped = sum(1 for r in reqs if r.output_tokens < r.trace_output_tokens and r.state != NOT_ARRIVED
                  and not r.refused)
    counters = _counters(eng, H, arrived, completed, unfinished, rejected, refused, clipped, q_mean, q_p95,
                         [float(w) for w in eng.work_at])
    iters = None
    if eng.trace is not None:
        iters = pl.DataFrame(eng.trace, schema=ITERATION_SCHEMA, orient="row")
        if eng.trace_batch is not None and len(eng.trace_batch) == iters.height:
            iters = iters.with_columns(pl.Series("scheduled", eng.trace_batch, dtype=pl.Utf8))
    return SimResult(requests=records, counters=counters, iterations=iters, scheduler=eng.sched.name)
