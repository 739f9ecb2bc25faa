"""The engine of one run: state, the SimPy processes and the invariant checks
(the model is described in :mod:`portbench.sim.engine`)."""

from __future__ import annotations

import math

import simpy

from ...core.config import EngineConfig
from ...core.errors import ParameterError
from ..request import PAUSED, RUNNING, WAITING, Request
from ..schedulers import BaseScheduler
from .batching import Batching
from .contract import CheckedPolicy, check_class, check_static, is_plugin, overrides
from .iteration import Iterations
from .memory import CohortMemory, PrefixCache
from .modes import batching_mode
from .queues import Queues


def delay_to(now: float, t: float) -> float:
    """A delay d >= 0 with ``now + d == t`` in floating point (or, if no such d exists, the
    smallest of a few candidates with ``now + d >= t``). SimPy adds delays to its clock, and
    ``t − now`` alone can land one rounding step before ``t``: a process woken there would not
    yet see the event at ``t``. (For now <= t <= 2·now, t − now is exact and so is the sum.)"""
    d = t - now
    if d <= 0:
        return 0.0
    while now + d < t:                 # d >= now here, so each step moves the sum
        d = math.nextafter(d, math.inf)
    for _ in range(4):                 # overshoot: step back while the sum still reaches t
        e = math.nextafter(d, -math.inf)
        if e <= 0 or now + e < t:
            break
        d = e
    return d


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


class Engine(CohortMemory, PrefixCache, Queues, Batching, Iterations):
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
                 naive: bool, record_iterations: bool, check: bool = False, check_contract: bool | None = None,
                 settings: EngineConfig | None = None, hash_block_tokens: int | None = None, marks=()):
        check_class(sched)
        if check_contract is None:   # plug-ins are checked on every call; built-ins by the test suite
            check_contract = is_plugin(sched)
        # ``settings``: the ``engine:`` section (batching, preemption, prefix caching); "engine" alone names
        # this class, the run
        settings = EngineConfig.of(settings)
        self.settings = settings
        self.policy = sched
        self.sched = CheckedPolicy(sched) if check_contract else sched
        self.check_contract = bool(check_contract)
        self.prof = profile
        self.H = float(horizon_s)
        self.naive = naive
        self.check = check
        self.trace = [] if record_iterations else None
        # naive + trace (the conformance reference): each step's scheduled requests "id:tokens,..." (by id)
        self.trace_batch: list[str] | None = [] if (record_iterations and naive) else None
        self.bs = bs = int(getattr(profile, "block_size", 16))
        self.cap = int(profile.kv_capacity_blocks)
        # the batching mode, chosen once: V1 chunks every policy's prompts; V0 only those that chunk by
        # definition (sarathi)
        self.mode = mode = batching_mode(settings.batching, sched)
        self.B = mode.token_budget(sched, profile)
        self.max_seqs = mode.max_seqs(profile, self.B)
        self.ckv = float(profile.c_kv_s)
        _check_cost_model(profile, self.ckv)
        self.attn = bool(getattr(profile, "c_attn_s", 0.0))   # prefill attention term
        self.preemptive = bool(getattr(sched, "preemptive", False))
        self.ranked = self.preemptive and mode.per_chunk   # V1 preemptive policies: the ranked plan (Batching._plan_ranked)
        self.static = bool(getattr(sched, "static_priority", False))
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
            r.never_fits = r.refused or r.prompt_tokens + r.output_tokens > cap_tokens
        # swap preemption: the profile's host memory and PCIe bandwidth (recompute when it has none)
        self.swap = settings.preemption == "swap" and bool(getattr(profile, "can_swap", False))
        self.host_cap = int(getattr(profile, "host_kv_blocks", 0)) if self.swap else 0
        self.swap_s_block = float(profile.swap_s_per_block) if self.swap else 0.0
        self.host_used = 0
        self.pending_s = 0.0            # swap copies charged to the next iteration
        self.n_swap_out = self.n_swap_in = 0
        self.swap_s = 0.0
        self._init_prefix_cache(settings, reqs, hash_block_tokens)
        self.cursor = 0
        self.res: dict[int, Request] = {}
        self.rorder: list[Request] = []     # preemptive policies: residents in the last decision's rank order
        # lazy keys (built-in preemptive policies that say when a generating request's key changes):
        # cohort members to re-key, and a heap of (cohort clock of the next change, id, cver, request)
        self.lazy_keys = (self.preemptive and not self.static and bool(getattr(sched, "lazy_keys", False))
                          and bool(getattr(sched, "frozen_waiting_keys", False)) and not is_plugin(sched))
        self.kdirty: list[Request] = []
        self.kheap: list = []
        self.prefilling: list[Request] = []
        self.paused: list[Request] = []
        self.skipped: list[Request] = []    # V1: residents vLLM gave no token in this step (self-preemption stop)
        self.cohort: dict[int, Request] = {}
        self.clock = 0
        self.SL = 0
        self.cnt = [0] * bs
        self.need_now = 0
        self.fheap: list = []
        self.other_blocks = 0
        # static non-preemptive: a heap of ranks, unless the policy orders admission itself
        self.use_heap = self.static and not self.preemptive and not overrides(sched, "admission_order")
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
        self.announced = None
        self.plan_seq = 0
        self.end_time = 0.0
        self.suffix_min_rank = None
        self._pf: list[Request] = []
        self._kind = 0
        self._k = 0
        self._n_dec = 0
        self.one_step = False           # the next decode run is one iteration (V1: admission held back)
        # waiting intervals (queue length) and useful work (utilisation) at the given times
        self.wq: list[tuple[float, float]] = []
        self.work = 0
        self.marks = sorted(float(m) for m in marks)
        self.work_at: list[float] = []

    def prepare_static_ranks(self) -> None:
        """Static policies: dense rank of (priority at arrival, id) -> ints compare fast. The declared-static
        priority is checked first (plug-ins, and any policy under ``check_contract``; the built-ins by
        the test suite): the same key at arrival and later (SchedulerError otherwise)."""
        if not self.static:
            return
        if self.check_contract:
            keys = check_static(self.policy, self.reqs)
        else:
            pri = self.policy.priority
            keys = [pri(r, r.arrival_s) for r in self.reqs]
        keyed = sorted((k, r.id) for k, r in zip(keys, self.reqs))
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

    def run(self) -> None:
        env = simpy.Environment()
        env.process(self._arrival_process(env))
        env.process(self._server(env))
        env.run()

    def _arrival_process(self, env):
        """Sleeps until each arrival time and announces it; wakes the idle server with that time.
        (The server keeps its own clock of absolute event times, see :meth:`_server`.)"""
        last = None
        for i in range(self.n_arrivable):
            t = self.arr_t[i]
            if t == last:
                continue
            last = t
            en = env.now
            if t > en:
                d = t - en
                yield env.timeout(d if en + d == t else delay_to(en, t))
            self.announced = t
            ev = self.wake
            if ev is not None and not ev.triggered:
                ev.succeed(t)

    def _server(self, env):
        """The engine loop. Its clock ``now`` only takes absolute event times -- an arrival time, or
        the end ``now + dt`` of the iteration it ran -- never SimPy's accumulated clock: adding a
        delay ``t − now`` to a clock can round one step below ``t`` (an idle server woken there
        would not see the arrival it was woken for, and would miss it until the next one)."""
        now = 0.0
        arr_t, n = self.arr_t, self.n_arrivable
        while True:
            if self.cursor < n and arr_t[self.cursor] <= now:
                self._ingest(now)
            if not self.res and not self.n_wait:
                if self.cursor >= n:
                    self.end_time = now
                    return
                t = arr_t[self.cursor]
                self._note_marks(t)      # idle until t: no work done
                if self.announced is None or self.announced < t:   # not announced yet: sleep until it is
                    self.wake = env.event()
                    yield self.wake
                    self.wake = None
                now = t
                continue
            self.n_decisions += 1
            dt = self._plan_preemptive(now) if self.preemptive else self._plan(now)
            if self.check:
                self._check_state(now)
            if dt is None:
                self.end_time = self.H
                return
            t1 = now + dt
            if self.cursor < n and arr_t[self.cursor] <= t1:
                # an arrival falls within the iteration: SimPy orders the two processes. Otherwise nothing
                # else happens before t1 and the server goes straight on (one SimPy event per arrival,
                # not one per decision; SimPy's clock catches up at the next yield)
                en = env.now
                yield env.timeout(dt if en == now else delay_to(en, t1))
            self._commit(now, t1)
            now = t1

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
        adj = self._check_prefix_cache()
        assert self.used == need + other + adj and self.used <= self.cap, (self.used, need, other, adj)
        assert self.host_used == sum(r.swap_blocks for r in self.reqs if r.swapped) <= max(self.host_cap, 0)
        if self.mode.per_chunk:
            for r in self.res.values():   # V1 allocates per chunk: a resident holds its computed + scheduled tokens
                if r.prefilled != r.prefill_target:
                    assert r.blocks == (r.prefilled + r.chunk + bs - 1) // bs, r
        assert all(r.state in (RUNNING, PAUSED) for r in self.res.values())
        pre = {r.id for r in self.res.values() if r.prefilled != r.prefill_target}
        assert pre == {r.id for r in self.prefilling}, (pre, [r.id for r in self.prefilling])
        waiting = [r for r in self.reqs if r.state == WAITING]
        assert len(waiting) == self.n_wait == (len(self.wait_heap) if self.use_heap else len(self.wlist))
        if not self.preemptive:
            assert not any(r.state == PAUSED for r in self.res.values())
        else:
            assert sorted(r.id for r in self.rorder) == sorted(self.res), "rank order != residents"

