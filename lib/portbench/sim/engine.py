"""SimPy model of one continuously-batched, paged-KV LLM serving replica (vLLM-like).

The model
---------
**Requests.** Each window row is a request: arrival, prompt tokens P, output tokens O, tenant.
State: ``generated`` g (tokens streamed so far), ``prefilled`` (tokens of the current prefill
already computed), ``prefill_target``, KV ``blocks`` held, first-token time, finish time,
preemption (eviction) count. A request is *waiting* (no KV), *running* (in the batch, holds KV),
*paused* (descheduled by a preemptive policy, still holds KV), *finished* or *rejected*.

**Iterations and tokens.** One iteration = one forward pass over the batch. A prefill of the
request's known tokens produces the next token at the end of the iteration that completes it:
a fresh request prefills its P prompt tokens and emits token 1 (its first token, TTFT). Each
decode iteration feeds the last generated token and emits one more; a request finishes when
g = O (a fresh request needs 1 prefill + O − 1 decode iterations). Iteration time comes from
the profile: ``iteration_time(prefill_tokens, decode_seqs, context_tokens)`` with
context_tokens = Σ over the iteration's sequences of their KV tokens *after* the iteration
(decode: P + g with g counted before it; prefill chunk: tokens prefilled so far incl. the chunk).

**KV cache (paged).** Block size and capacity from the profile. A request holds
``ceil(kv_tokens / block_size)`` blocks, allocated when the iteration that writes them is
scheduled: a decoding request with g tokens generated holds ceil((P + g)/16) blocks while its
next decode iteration runs (prompt + all generated tokens, the last of which that iteration
writes). A request admitted for a prefill (of P + g tokens) gets that prefill's
ceil((P + g)/16) blocks at admission, also when the prefill is chunked (vLLM allocates the
prompt's blocks when it first schedules it), so a chunked prefill never runs out of memory
halfway. In both cases blocks = ceil((prompt + generated tokens known)/16). A request whose
ceil((P + O)/16) exceeds the whole cache can never run and is *rejected* at arrival (counted).

**Preemption by recompute** (vLLM's default): an evicted request frees all its blocks and loses
its KV; its generated tokens stay generated (they were streamed to the user, g is kept), but when
it is resumed it must prefill prompt + generated tokens again (target P + g) -- exactly vLLM's
recompute, which re-runs the prompt and the output so far as one prefill. That prefill emits
token g + 1, so no decode work is repeated; the lost work is the recomputed prefill.
Which request is evicted, and whether a running request may be descheduled for priority, is the
policy's choice: see :mod:`portbench.schedulers` (non-preemptive policies evict only for
memory; preemptive ones pause while memory allows and evict when it does not).

**Batch formation** at each decision point (:meth:`_Engine._plan`): ``max_num_seqs`` slots,
KV capacity, and a prefill token budget (the scheduler's ``prefill_token_budget`` option, else
the vLLM default of each mode). Whole-prompt policies (vLLM V0 default) run a prefill-only
iteration whenever they admit requests (decodes wait), batching whole prompts up to
:func:`whole_prefill_budget` tokens (vLLM: max(max_model_len, 2048); a longer prompt is
prefilled alone); chunked policies (Sarathi-Serve) put every running decode in every iteration
and fill the rest of the profile's ``max_batched_tokens`` with prompt chunks (the budget must
exceed ``max_num_seqs``).

**Speed.** Between decision points -- an arrival that could change the batch, a completion, a
KV-block boundary that would overflow the cache, a quantum/ranking change announced by the
policy (``next_decision``), the horizon -- a decode-only batch is fixed, so k iterations are
advanced at once in closed form: with n decodes and first-iteration context C,
``T(k) = k·iteration_time(0, n, C) + c_kv·n·k(k−1)/2`` (= k(c0 + c_d·n + c_kv·C) + … for the
linear model; any term that depends only on the batch composition, like the profiles' roofline
floor, is constant over the run); the k at which an arrival, a time-based decision or the
horizon falls solves this quadratic; the memory boundary comes from the members' block phases
(the (F+1)-th block crossing, F = free blocks). The decoding requests are kept as a *cohort*
relative to a shared iteration clock, so a decision of a non-preemptive policy costs
O(log n), not O(n) (see :class:`_Engine`). An arrival that cannot change the batch (static
non-preemptive policy, head of the queue blocked, the newcomer ranked behind it) is not a
decision point. SimPy drives an arrival process and a server process; the arithmetic between
events is plain Python. ``naive=True`` re-decides after every single iteration and computes each
with ``profile.iteration_time`` -- the test reference of the closed form (same records up to
float rounding; this also checks that every policy announces its ranking changes).

**Horizon.** The run stops at ``horizon_s``: an iteration that would end after it is not run.
Requests not finished are *unfinished*; requests arriving after the horizon are not *arrived*
(they stay in the records with NaN times; metrics ignore them). Every run checks
``arrived == completed + unfinished + rejected`` and that KV blocks in use never exceed the
capacity (:class:`~portbench.errors.ConservationError` otherwise).

Determinism: the only randomness is ``numpy.random.default_rng(seed)`` handed to the scheduler;
ties are broken by request id (= window row). Same inputs -> identical outputs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import simpy

from ..core.errors import ConservationError, DataError, ParameterError
from .profiles import decode_run_s, first_k_reaching, last_k_within
from .schedulers import BaseScheduler, RunContext, get_scheduler

NOT_ARRIVED, WAITING, RUNNING, PAUSED, FINISHED, REJECTED = -1, 0, 1, 2, 3, 4
STATE_NAMES = {NOT_ARRIVED: "not_arrived", WAITING: "waiting", RUNNING: "running", PAUSED: "paused",
               FINISHED: "finished", REJECTED: "rejected"}
WINDOW_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "tenant")
RECORD_COLUMNS = ("req_id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                  "generated_tokens", "preemptions", "rejected", "tenant", "service_s")
_NAN = float("nan")
_INF = float("inf")


class Request:
    """One request's simulation state (schedulers read it; only the engine writes it).

    ``id`` (window row), ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (the truth: only
    oracle policies should read it), ``tenant``, ``generated`` (tokens streamed so far; for
    requests in the decode batch it is brought up to date before any scheduler hook sees them),
    ``prefilled`` / ``prefill_target`` (progress of the current prefill: P + g tokens),
    ``blocks`` (KV blocks held), ``state`` (WAITING, RUNNING, PAUSED, FINISHED, REJECTED),
    ``preemptions`` (recompute evictions), ``pauses``, ``first_token_s``, ``finish_s``,
    ``waiting_since`` (arrival or last eviction), ``key`` (the (priority, id) the engine last
    ranked it by, preemptive policies). The rest is engine bookkeeping.
    """

    __slots__ = ("id", "arrival_s", "prompt_tokens", "output_tokens", "tenant", "generated", "prefilled",
                 "prefill_target", "blocks", "state", "preemptions", "pauses", "first_token_s", "finish_s",
                 "waiting_since", "rank", "never_fits", "chunk", "gbase", "cver", "key", "mark")

    def __init__(self, rid: int, arrival_s: float, prompt: int, output: int, tenant):
        self.id = rid
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt
        self.output_tokens = output
        self.tenant = tenant
        self.generated = 0
        self.prefilled = 0
        self.prefill_target = prompt
        self.blocks = 0
        self.state = NOT_ARRIVED
        self.preemptions = 0
        self.pauses = 0
        self.first_token_s = _NAN
        self.finish_s = _NAN
        self.waiting_since = arrival_s
        self.rank = 0
        self.never_fits = False
        self.chunk = 0
        self.gbase = 0
        self.cver = 0
        self.key = None
        self.mark = -1

    @property
    def resident(self) -> bool:
        """Holds KV blocks (running or paused)."""
        return self.state == RUNNING or self.state == PAUSED

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def decoding(self) -> bool:
        """Resident with its prefill complete (its next iteration is a decode)."""
        return (self.state == RUNNING or self.state == PAUSED) and self.prefilled == self.prefill_target

    def __repr__(self) -> str:
        return (f"Request(id={self.id}, state={STATE_NAMES[self.state]}, P={self.prompt_tokens}, "
                f"O={self.output_tokens}, g={self.generated}, prefilled={self.prefilled}/"
                f"{self.prefill_target}, blocks={self.blocks})")


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


def _window_arrays(window_df) -> tuple[list, list, list, list]:
    if isinstance(window_df, pl.DataFrame):
        missing = [c for c in WINDOW_COLUMNS[:3] if c not in window_df.columns]
        if missing:
            raise DataError("window", f"missing columns {missing}; expected {list(WINDOW_COLUMNS)}")
        arr = window_df["arrival_s"].cast(pl.Float64).to_list()
        pro = window_df["prompt_tokens"].cast(pl.Int64).to_list()
        out = window_df["output_tokens"].cast(pl.Int64).to_list()
        ten = (window_df["tenant"].cast(pl.Utf8).to_list() if "tenant" in window_df.columns
               else ["t0"] * window_df.height)
    else:  # a mapping of sequences
        arr = [float(x) for x in window_df["arrival_s"]]
        pro = [int(x) for x in window_df["prompt_tokens"]]
        out = [int(x) for x in window_df["output_tokens"]]
        ten = [str(x) for x in window_df["tenant"]] if "tenant" in window_df else ["t0"] * len(arr)
    for name, col in (("arrival_s", arr), ("prompt_tokens", pro), ("output_tokens", out)):
        if any(v is None for v in col):
            raise DataError("window", "null values", column=name)
    if any(not math.isfinite(a) or a < 0 for a in arr):
        raise DataError("window", "arrival_s must be finite and >= 0", column="arrival_s")
    if any(p <= 0 for p in pro) or any(o <= 0 for o in out):
        raise DataError("window", "prompt_tokens and output_tokens must be > 0")
    return arr, pro, out, ten


def _requests_from_window(window_df, profile, rng, slo=None) -> tuple[list[Request], RunContext]:
    arr, pro, out, ten = _window_arrays(window_df)
    reqs = [Request(i, arr[i], pro[i], out[i], ten[i]) for i in range(len(arr))]
    ctx = RunContext(n=len(reqs), arrival_s=np.asarray(arr, dtype=float), prompt_tokens=np.asarray(pro),
                     output_tokens=np.asarray(out), tenant=ten, profile=profile, rng=rng, slo=slo)
    return reqs, ctx


WHOLE_PREFILL_TOKENS = 4096


def _check_cost_model(profile, ckv: float) -> None:
    """The closed form needs iteration times > 0 that are affine in context_tokens with slope
    ``c_kv_s`` for a fixed batch composition (any function of prefill tokens and decode
    sequences is fine, e.g. the profiles' roofline floor)."""
    t1 = profile.iteration_time(0, 1, 1000)
    t2 = profile.iteration_time(0, 1, 3000)
    if not (t1 > 0 and profile.iteration_time(1, 0, 1) > 0):
        raise ParameterError("profile", getattr(profile, "name", profile), "positive iteration times")
    if not math.isclose(t2 - t1, 2000 * ckv, rel_tol=1e-6, abs_tol=1e-12):
        raise ParameterError("profile", getattr(profile, "name", profile),
                             "iteration_time affine in context_tokens with slope c_kv_s")


def whole_prefill_budget(profile) -> int:
    """Token budget of a whole-prompt (prefill-first) iteration: the profile's
    ``max_prefill_tokens`` if it has one, else vLLM's default without chunked prefill,
    ``max_num_batched_tokens = max(max_model_len, 2048)`` (max_model_len from the profile's
    provenance, else :data:`WHOLE_PREFILL_TOKENS` = 4096, Llama-2's context). The profile's
    ``max_batched_tokens`` is the *chunked*-prefill budget (Sarathi-Serve)."""
    v = getattr(profile, "max_prefill_tokens", None)
    if v:
        return int(v)
    prov = getattr(profile, "provenance", None) or {}
    mml = (prov.get("model_spec") or {}).get("max_model_len") if isinstance(prov, dict) else None
    return max(int(mml), 2048) if mml else WHOLE_PREFILL_TOKENS


class _Engine:
    """One run. See the module docstring for the model.

    Data structures (for speed; ``_check`` recomputes everything from scratch in tests):

    * ``res``: residents (hold KV) by id; ``prefilling``: residents whose prefill is incomplete;
      ``paused``: residents a preemptive policy descheduled at the last decision.
    * the **decode cohort** ``cohort``: the decoding requests of the current batch. They all
      advance together, so their state is kept relative to a shared ``clock`` (decode iterations
      of the cohort): ``generated = gbase + clock``. Aggregates: ``SL`` = Σ (P + gbase) (context
      = SL + n·clock), ``cnt[m]`` = members with (P + gbase) ≡ m (mod block size) (block-boundary
      phases), ``need_now`` = Σ ceil((P + g)/bs) (their KV blocks for the next iteration), and a
      heap of the clock values at which members finish. Advancing k iterations is O(bs); members'
      ``generated`` is brought up to date (``_materialize``) before any scheduler hook sees them.
    * waiting: a heap of static ranks (static non-preemptive), a list kept sorted by cached key
      (preemptive with keys frozen while waiting), or a plain list.
    """

    def __init__(self, reqs: list[Request], sched: BaseScheduler, profile, horizon_s: float,
                 naive: bool, record_iterations: bool, check: bool = False):
        self.sched = sched
        self.prof = profile
        self.H = float(horizon_s)
        self.naive = naive
        self.check = check
        self.trace = [] if record_iterations else None
        self.bs = bs = int(getattr(profile, "block_size", 16))
        self.cap = int(profile.kv_capacity_blocks)
        self.max_seqs = int(profile.max_num_seqs)
        self.chunked = bool(getattr(sched, "chunked_prefill", False))
        budget = getattr(sched, "prefill_token_budget", None)
        if budget is None:
            budget = profile.max_batched_tokens if self.chunked else whole_prefill_budget(profile)
        self.B = int(budget)
        if self.chunked and self.B <= self.max_seqs:
            raise ParameterError(f"simulation.scheduler_options.{sched.name}.prefill_token_budget", self.B,
                                 f"more tokens than max_num_seqs ({self.max_seqs}) for chunked prefill")
        self.ckv = float(profile.c_kv_s)
        _check_cost_model(profile, self.ckv)
        self.preemptive = bool(getattr(sched, "preemptive", False))
        self.static = bool(getattr(sched, "static_priority", True))
        self.frozen = self.static or bool(getattr(sched, "frozen_waiting_keys", False))
        self.wants_tokens = not (isinstance(sched, BaseScheduler)
                                 and type(sched).on_tokens is BaseScheduler.on_tokens)
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
        self.reqs = reqs
        self.arrivals = [reqs[i] for i in order]
        self.arr_t = [r.arrival_s for r in self.arrivals]
        self.n_arrivable = sum(1 for t in self.arr_t if t <= self.H)
        cap_tokens = self.cap * bs
        for r in reqs:
            r.never_fits = r.prompt_tokens + r.output_tokens > cap_tokens
        self.cursor = 0
        self.res: dict[int, Request] = {}
        self.prefilling: list[Request] = []
        self.paused: list[Request] = []
        self.cohort: dict[int, Request] = {}
        self.clock = 0
        self.SL = 0
        self.cnt = [0] * bs
        self.need_now = 0
        self.fheap: list = []
        self.other_blocks = 0
        self.use_heap = self.static and not self.preemptive
        self.wait_heap: list = []
        self.wlist: list[Request] = []
        self.n_wait = 0
        self.used = 0
        self.max_used = 0
        self.n_preempt = 0
        self.n_pause = 0
        self.n_iter = 0
        self.n_decisions = 0
        self.n_finished = 0
        self.wake = None
        self.plan_seq = 0
        self.end_time = 0.0
        self.suffix_min_rank = None
        self._pf: list[Request] = []
        self._kind = 0
        self._k = 0

    # ---------------------------------------------------------------------------------- setup

    def prepare_static_ranks(self) -> None:
        """Static policies: dense rank of (priority at arrival, id) -> ints compare fast."""
        if not self.static:
            return
        S = self.sched
        keyed = sorted((S.priority(r, r.arrival_s), r.id) for r in self.reqs)
        for k, (_, rid) in enumerate(keyed):
            self.reqs[rid].rank = k
        n = len(self.arrivals)
        big = n + 1
        suf = [big] * (n + 1)
        for i in range(n - 1, -1, -1):
            r = self.arrivals[i]
            v = big if r.never_fits else r.rank
            suf[i] = v if v < suf[i + 1] else suf[i + 1]
        self.suffix_min_rank = suf

    # ---------------------------------------------------------------------------------- SimPy

    def run(self) -> None:
        env = simpy.Environment()
        env.process(self._arrival_process(env))
        env.process(self._server(env))
        env.run()

    def _arrival_process(self, env):
        """Sleeps until each arrival; wakes the idle server. (The server ingests by time, so
        simultaneous events are ordered deterministically whatever SimPy's queue order.)"""
        last = None
        for i in range(self.n_arrivable):
            t = self.arr_t[i]
            if t == last:
                continue
            last = t
            if t > env.now:
                yield env.timeout(t - env.now)
            ev = self.wake
            if ev is not None and not ev.triggered:
                ev.succeed()

    def _server(self, env):
        while True:
            now = env.now
            if self.cursor < self.n_arrivable and self.arr_t[self.cursor] <= now:
                self._ingest(now)
            if not self.res and not self.n_wait:
                if self.cursor >= self.n_arrivable:
                    self.end_time = now
                    return
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            self.n_decisions += 1
            dt = self._plan_preemptive(now) if self.preemptive else self._plan(now)
            if self.check:
                self._check_state(now)
            if dt is None:
                self.end_time = self.H
                return
            yield env.timeout(dt)
            self._commit(now, env.now)

    # ---------------------------------------------------------------------------------- cohort

    def _join(self, r: Request) -> None:
        bs = self.bs
        P, g = r.prompt_tokens, r.generated
        gb = g - self.clock
        r.gbase = gb
        L = P + gb
        self.SL += L
        self.cnt[L % bs] += 1
        b = (P + g + bs - 1) // bs
        r.blocks = b
        self.need_now += b
        r.cver += 1
        heapq.heappush(self.fheap, (r.output_tokens - gb, r.id, r.cver, r))
        self.cohort[r.id] = r

    def _leave(self, r: Request) -> None:
        bs = self.bs
        P = r.prompt_tokens
        g = r.gbase + self.clock
        r.generated = g
        L = P + r.gbase
        self.SL -= L
        self.cnt[L % bs] -= 1
        b = (P + g + bs - 1) // bs
        self.need_now -= b
        r.blocks = b
        r.cver += 1
        del self.cohort[r.id]

    def _materialize(self) -> list[Request]:
        c, bs = self.clock, self.bs
        members = list(self.cohort.values())
        for r in members:
            g = r.gbase + c
            r.generated = g
            r.blocks = (r.prompt_tokens + g + bs - 1) // bs
        return members

    def _advance(self, k: int) -> None:
        bs, c, cnt = self.bs, self.clock, self.cnt
        d = 0
        for m in range(bs):
            w = cnt[m]
            if w:
                d += w * (((m + c - 1) % bs + k) // bs)
        self.need_now += d
        self.clock = c + k

    def _pop_finished(self) -> list[Request]:
        h, clock = self.fheap, self.clock
        out = []
        while h:
            e = h[0]
            if e[2] != e[3].cver:
                heapq.heappop(h)
            elif e[0] == clock:
                heapq.heappop(h)
                out.append(e[3])
            else:
                break
        return out

    def _k_complete(self) -> int:
        h = self.fheap
        while h and h[0][2] != h[0][3].cver:
            heapq.heappop(h)
        return h[0][0] - self.clock

    def _k_memory(self, F: int, kmax: int) -> int:
        """Largest k <= kmax such that the cohort's block needs over k iterations fit in F more
        blocks: the (F+1)-th block crossing ends the run (a decision point evicts there)."""
        n = len(self.cohort)
        bs = self.bs
        if kmax <= 1 or F >= n * ((kmax - 2) // bs + 1):
            return kmax
        c = self.clock
        offs = []
        cnt = self.cnt
        for m in range(bs):
            w = cnt[m]
            if w:
                offs.append((bs - (m + c - 1) % bs, w))
        offs.sort()
        q, rem = divmod(F, n)
        acc = 0
        for o, w in offs:
            acc += w
            if acc > rem:
                k = bs * q + o
                return k if k < kmax else kmax
        raise AssertionError("unreachable")  # pragma: no cover

    # ---------------------------------------------------------------------------------- queues

    def _ingest(self, now: float) -> None:
        S = self.sched
        c = self.cursor
        arr_t, arrivals, n = self.arr_t, self.arrivals, self.n_arrivable
        while c < n and arr_t[c] <= now:
            r = arrivals[c]
            c += 1
            if r.never_fits:
                r.state = REJECTED
                continue
            r.state = WAITING
            r.waiting_since = r.arrival_s
            S.on_arrival(r, now)
            self._push_waiting(r, now)
        self.cursor = c

    def _push_waiting(self, r: Request, now: float) -> None:
        if self.use_heap:
            heapq.heappush(self.wait_heap, (r.rank, r.id, r))
        elif self.preemptive and self.frozen:
            r.key = r.rank if self.static else (self.sched.priority(r, now), r.id)
            bisect.insort(self.wlist, r, key=_key_of)
        else:
            self.wlist.append(r)
        self.n_wait += 1

    def _evict(self, r: Request, now: float) -> None:
        if r.id in self.cohort:
            self._leave(r)
        else:
            self.other_blocks -= r.blocks
            if r.prefilled != r.prefill_target:
                self.prefilling.remove(r)
        self._requeue_evicted(r, now)

    def _requeue_evicted(self, r: Request, now: float) -> None:
        """Recompute preemption of a resident already out of the cohort and prefill lists: its KV
        blocks are freed, its prefill (prompt + tokens generated so far) is redone when it is
        admitted again, and it goes back to the waiting queue."""
        del self.res[r.id]
        r.state = WAITING
        r.blocks = 0
        r.prefilled = 0
        r.prefill_target = r.prompt_tokens + r.generated
        r.preemptions += 1
        r.waiting_since = now
        r.chunk = 0
        self.n_preempt += 1
        self.sched.on_evict(r, now)
        self._push_waiting(r, now)

    def _admit_need(self, r: Request, budget_left: int, pf_tokens: int, admitted: int):
        """Blocks a waiting request needs to be admitted -- those of its whole prefill (prompt +
        generated tokens), allocated at admission as vLLM does, also when the prefill is chunked --
        or None if the token budget stops admission. Sets ``r.chunk`` (this iteration's tokens)."""
        target = r.prompt_tokens + r.generated
        if self.chunked:
            c = target if target < budget_left else budget_left
            if c <= 0:
                return None
        else:
            c = target
            if admitted and pf_tokens + c > self.B:   # a longer prompt is prefilled alone
                return None
        r.chunk = c
        return (target + self.bs - 1) // self.bs

    def _admit(self, r: Request, need: int, now: float) -> None:
        r.state = RUNNING
        r.prefilled = 0
        r.prefill_target = r.prompt_tokens + r.generated
        r.blocks = need
        self.other_blocks += need
        self.res[r.id] = r
        self.prefilling.append(r)
        self.sched.on_admit(r, now)

    # ---------------------------------------------------------------------------------- planning

    def _chunks(self, budget: int, now: float) -> int:
        """Chunked prefill: give the residents' ongoing prefills their chunks (policy order)."""
        pre = self.prefilling
        if len(pre) > 1:
            S = self.sched
            pre.sort(key=(lambda r: r.rank) if self.static else (lambda r: (S.priority(r, now), r.id)))
        b = budget
        for r in pre:
            left = r.prefill_target - r.prefilled
            c = left if left < b else b
            r.chunk = c
            b -= c
        return b

    def _plan(self, now: float):
        """Non-preemptive decision: running requests stay (evict victims only if their next
        iteration does not fit), then admit waiting requests in the policy's order."""
        S = self.sched
        cap = self.cap
        chunked = self.chunked
        budget = self.B
        while True:
            total = self.need_now + self.other_blocks
            if chunked:
                budget = self._chunks(max(0, self.B - len(self.cohort)), now)
            if total <= cap:
                break
            self._materialize()
            self._evict(S.victim(list(self.res.values()), now), now)
        free = cap - total
        slots = self.max_seqs - len(self.res)
        admitted = 0
        pf_tokens = 0
        if chunked:
            for r in self.prefilling:
                pf_tokens += r.chunk
        if self.n_wait and slots > 0:
            use_heap = self.use_heap
            for r in (self._heap_order() if use_heap else S.admission_order(self.wlist, now)):
                if slots <= 0:
                    break
                need = self._admit_need(r, budget, pf_tokens, admitted)
                if need is None or need > free:
                    break
                if use_heap:
                    heapq.heappop(self.wait_heap)
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += r.chunk
                budget -= r.chunk
                self._admit(r, need, now)
            if admitted and not use_heap:
                self.wlist = [r for r in self.wlist if r.state == WAITING]
            self.n_wait -= admitted
        return self._iteration(now, cap - free, pf_tokens)

    def _heap_order(self):
        """Waiting requests of the static-rank heap, best first (the caller pops each one it admits)."""
        heap = self.wait_heap
        while heap:
            yield heap[0][2]

    def _plan_preemptive(self, now: float):
        """Preemptive decision: rank every live request; the batch is the best-ranked prefix that
        fits (slots, KV, token budget; admission of waiting requests stops at the first that does
        not fit, residents further down still run if they fit). Descheduled residents are paused
        (KV kept) unless the batch needs their memory: then victims are evicted."""
        if not self.n_wait and not self.paused and self.need_now + self.other_blocks <= self.cap:
            return self._plan(now)      # nobody to rank against: every resident runs
        S = self.sched
        bs, cap = self.bs, self.cap
        chunked = self.chunked
        members = self._materialize()
        self.plan_seq += 1
        seq = self.plan_seq
        residents = list(self.res.values())
        if self.static:
            for r in residents:
                r.key = r.rank
        else:
            for r in residents:
                r.key = (S.priority(r, now), r.id)
        residents.sort(key=_key_of)
        wl = self.wlist
        if not self.frozen:
            for r in wl:
                r.key = (S.priority(r, now), r.id)
            wl.sort(key=_key_of)
        if chunked:
            n_dec = 0
            for r in residents:
                if r.prefilled == r.prefill_target:
                    n_dec += 1
            b = max(0, self.B - n_dec)
        else:
            b = self.B
        free, slots = cap, self.max_seqs
        pf_tokens = admitted = 0
        selected_dec: list[Request] = []
        prefilling: list[Request] = []
        displaced: list[Request] = []
        i = j = 0
        nr, nw = len(residents), len(wl)
        hol = nw == 0
        while i < nr or not hol:
            if not hol and (i >= nr or wl[j].key < residents[i].key):
                r = wl[j]
                need = self._admit_need(r, b, pf_tokens, admitted) if slots > 0 else None
                if need is None or need > free:
                    hol = True
                    continue
                j += 1
                if j >= nw:
                    hol = True
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += r.chunk
                b -= r.chunk
                r.state = RUNNING
                r.prefilled = 0
                r.prefill_target = r.prompt_tokens + r.generated
                r.blocks = need
                r.mark = seq
                self.res[r.id] = r
                prefilling.append(r)
                S.on_admit(r, now)
                continue
            r = residents[i]
            i += 1
            left = r.prefill_target - r.prefilled
            need = (r.prompt_tokens + r.generated + bs - 1) // bs if left == 0 else r.blocks
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                r.state = RUNNING
                r.mark = seq
                if left == 0:
                    selected_dec.append(r)
                else:
                    c = left if left < b else b
                    r.chunk = c
                    b -= c
                    pf_tokens += c
                    prefilling.append(r)
            else:
                displaced.append(r)
        if admitted:
            del wl[:admitted]
            self.n_wait -= admitted
        for r in members:                      # cohort members that lost their place
            if r.mark != seq:
                self._leave(r)
        for r in selected_dec:                 # resumed (paused) decoders join the cohort
            if r.id not in self.cohort:
                self._join(r)
        self.prefilling = prefilling
        self.paused = []
        if displaced:
            total = (cap - free) + sum(r.blocks for r in displaced)
            while total > cap:
                v = S.victim(displaced, now)
                displaced.remove(v)
                total -= v.blocks
                self._requeue_evicted(v, now)
            for r in displaced:
                if r.state == RUNNING:
                    r.state = PAUSED
                    r.pauses += 1
                    self.n_pause += 1
                r.chunk = 0
                if r.prefilled != r.prefill_target:
                    prefilling.append(r)
            self.paused = displaced
        other = 0
        for r in prefilling:
            other += r.blocks
        for r in self.paused:
            if r.prefilled == r.prefill_target:
                other += r.blocks
        self.other_blocks = other
        return self._iteration(now, self.need_now + other, pf_tokens)

    def _iteration(self, now: float, used: int, pf_tokens: int):
        """Compose the iteration after a decision; return its duration (None: past the horizon)."""
        if used > self.cap:
            raise ConservationError(f"KV blocks in use {used} > capacity {self.cap} at t={now}")
        self.used = used
        if used > self.max_used:
            self.max_used = used
        if pf_tokens:
            pf = [r for r in self.prefilling if r.chunk]
            self._pf = pf
            if self.chunked:
                n = len(self.cohort)
                ctx = self.SL + n * self.clock
                for r in pf:
                    ctx += r.prefilled + r.chunk
                nd = n
                self._kind = 1
            else:
                ctx = pf_tokens
                nd = 0
                self._kind = 2   # whole-prompt prefill-first: the cohort waits for this iteration
            dt = self.prof.iteration_time(pf_tokens, nd, ctx)
            if now + dt > self.H:
                return None
            self._k = 1
            if self.trace is not None:
                self.trace.append((now, now + dt, 1, pf_tokens, nd, ctx, used))
            return dt
        if not self.cohort:
            raise RuntimeError(f"simulator made no progress at t={now}: {len(self.res)} residents, "
                               f"{self.n_wait} waiting (scheduler {self.sched.name})")
        return self._decode_run(now)

    def _decode_run(self, now: float):
        n = len(self.cohort)
        C = self.SL + n * self.clock
        a0 = self.prof.iteration_time(0, n, C)   # first iteration; each adds n tokens of context
        self._kind = 0
        if self.naive:
            if now + a0 > self.H:
                return None
            self._k = 1
            if self.trace is not None:
                self.trace.append((now, now + a0, 1, 0, n, C, self.used))
            return a0
        k = self._k_complete()
        k = self._k_memory(self.cap - self.used, k)
        inc = self.ckv * n
        self._a0, self._inc = a0, inc
        t_bound = _INF
        # the next arrival that could change the batch
        if self.cursor < self.n_arrivable:
            if self.use_heap and self.wait_heap:
                head = self.wait_heap[0][0]
                c = self.cursor
                if self.suffix_min_rank[c] < head:
                    arrivals = self.arrivals
                    while arrivals[c].never_fits or arrivals[c].rank > head:
                        c += 1
                    t_bound = self.arr_t[c]
            else:
                t_bound = self.arr_t[self.cursor]
        # policy-announced ranking changes (only when someone is outside the batch)
        if not self.static and k > 1 and (self.n_wait or self.paused):
            outside = self.paused + self.wlist if self.paused else self.wlist
            kq, tq = self.sched.next_decision(self._materialize(), outside, now)
            if kq is not None and kq < k:
                k = kq if kq > 1 else 1
            if tq is not None and tq < t_bound:
                t_bound = tq
        if t_bound < _INF and k > 1:
            x = t_bound - now
            if x > a0:
                kt = first_k_reaching(a0, inc, x)
                if kt < k:
                    k = kt
            else:
                k = 1
        dt = decode_run_s(k, a0, inc)
        if now + dt > self.H:
            k = last_k_within(a0, inc, self.H - now)
            if k <= 0:
                return None
            dt = decode_run_s(k, a0, inc)
        self._k = k
        if self.trace is not None:
            self.trace.append((now, now + dt, k, 0, n, C, self.used))
        return dt

    # ---------------------------------------------------------------------------------- commit

    def _commit(self, t0: float, t1: float) -> None:
        S = self.sched
        k = self._k
        kind = self._kind
        self.n_iter += k
        if kind != 2:                      # the cohort decodes k iterations (k = 1 when mixed)
            if k > 1:
                # KV in use during the run's last iteration (its peak): must fit
                self._advance(k - 1)
                used = self.need_now + self.other_blocks
                if used > self.cap:
                    raise ConservationError(f"KV blocks in use {used} > capacity {self.cap} in a decode "
                                            f"run ending at t={t1}")
                if used > self.max_used:
                    self.max_used = used
                self._advance(1)
            else:
                self._advance(1)
            if self.wants_tokens:
                members = self._materialize()
                if k == 1:
                    S.on_tokens(members, 1, lambda i: t1)
                else:
                    a0, inc = self._a0, self._inc
                    S.on_tokens(members, k, lambda i: t0 + decode_run_s(i, a0, inc) if i < k else t1)
            for r in self._pop_finished():
                self._leave(r)
                self._finish(r, t1)
        if kind != 0:                      # prefill chunks of this iteration
            produced = []
            done_prefill = False
            for r in self._pf:
                r.prefilled += r.chunk
                r.chunk = 0
                if r.prefilled == r.prefill_target:
                    done_prefill = True
                    r.generated += 1
                    if r.first_token_s != r.first_token_s:   # NaN: this is the first token
                        r.first_token_s = t1
                    produced.append(r)
                    self.other_blocks -= r.blocks
                    if r.generated == r.output_tokens:
                        r.blocks = 0
                        self._finish(r, t1)
                    else:
                        self._join(r)
            if done_prefill:
                self.prefilling = [r for r in self.prefilling if r.prefilled != r.prefill_target]
            if produced and self.wants_tokens:
                S.on_tokens(produced, 1, lambda i: t1)
        self.end_time = t1

    def _finish(self, r: Request, t: float) -> None:
        r.state = FINISHED
        r.finish_s = t
        r.blocks = 0
        del self.res[r.id]
        self.n_finished += 1
        self.sched.on_finish(r, t)

    # ---------------------------------------------------------------------------------- checks

    def _check_state(self, now: float) -> None:
        """Recompute the incremental bookkeeping from scratch (tests: ``check=True``)."""
        bs = self.bs
        c = self.clock
        need = SL = 0
        cnt = [0] * bs
        for r in self.cohort.values():
            g = r.gbase + c
            assert r.state == RUNNING and r.prefilled == r.prefill_target, r
            assert 1 <= g < r.output_tokens, r
            need += (r.prompt_tokens + g + bs - 1) // bs
            SL += r.prompt_tokens + r.gbase
            cnt[(r.prompt_tokens + r.gbase) % bs] += 1
        assert (need, SL, cnt) == (self.need_now, self.SL, self.cnt), (need, SL, self.need_now, self.SL)
        other = sum(r.blocks for r in self.res.values() if r.id not in self.cohort)
        assert other == self.other_blocks, (other, self.other_blocks)
        assert self.used == need + other and self.used <= self.cap
        assert all(r.state in (RUNNING, PAUSED) for r in self.res.values())
        pre = {r.id for r in self.res.values() if r.prefilled != r.prefill_target}
        assert pre == {r.id for r in self.prefilling}, (pre, [r.id for r in self.prefilling])
        waiting = [r for r in self.reqs if r.state == WAITING]
        assert len(waiting) == self.n_wait == (len(self.wait_heap) if self.use_heap else len(self.wlist))
        if not self.preemptive:
            assert not any(r.state == PAUSED for r in self.res.values())


def _key_of(r: Request):
    return r.key


def simulate(window_df, scheduler, profile, *, horizon_s: float, seed: int, slo=None,
             naive: bool = False, record_iterations: bool = False,
             check_invariants: bool = False) -> SimResult:
    """Simulate one window under one scheduler on one replica.

    ``window_df``: the window table (``arrival_s, prompt_tokens, output_tokens, tenant``);
    ``scheduler``: a registered name or a :class:`~portbench.schedulers.BaseScheduler` instance;
    ``profile``: a :class:`~portbench.profiles.Profile` (or anything with its fields);
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
    reqs, ctx = _requests_from_window(window_df, profile, rng, slo)
    sched.reset(ctx)
    eng = _Engine(reqs, sched, profile, H, naive, record_iterations, check_invariants)
    eng.prepare_static_ranks()
    if reqs:
        eng.run()
    return _result(eng, reqs, profile, H)


def _result(eng: _Engine, reqs: list[Request], profile, H: float) -> SimResult:
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
