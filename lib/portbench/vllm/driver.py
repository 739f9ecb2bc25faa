"""The simulator's policies inside vLLM's scheduler: one rule, run by the same policy objects on both sides.

:class:`PolicyDriver` holds an instance of the portbench policy (the simulator's class, with the
simulator's options and the run's seed) and one simulator ``Request`` per vLLM request (its
*mirror*: arrival, lengths, tenant, tokens generated, state), and drives the policy's hooks
(``on_arrival``, ``on_admit``, ``on_tokens``, ``on_evict``, ``on_finish``) from vLLM's events. What
the policy decides reaches vLLM's own ``schedule()`` through three levers, nothing else:

* the **waiting queue** (:class:`PolicyQueue`, which replaces vLLM's): it offers vLLM the requests in
  the policy's admission order (non-preemptive policies whose order is not a static priority: ltr's
  starvation rule, vtc's counters; ``admission_order`` is a generator consulted one admission at a
  time, as the simulator does) or exactly the admissions of the ranked plan (preemptive policies);
* the **running list**: its order gives vLLM's token budget (decodes, then prompt chunks) and, for a
  preemptive policy's plan, *paused* requests are taken out of it for the step (they keep their KV
  blocks and get no token: vLLM schedules only what is in ``running``);
* **preemption**: the plan's victims are preempted (recompute) with vLLM's own ``_preempt_request``.

**Two ways to know the requests.** *Bound to a window* (:meth:`PolicyDriver.bind_window`, the virtual engine and
the conformance check): the mirrors and the policy's run context are the window's, built as the simulator builds
them (same seed, same ``max_model_len`` clipping), and a vLLM request is matched to its window row by its id.
*Online* (a server, ``vllm serve --scheduler-cls portbench.vllm.LAS``): a mirror is made when vLLM adds a request
(arrival time, prompt length, ``max_tokens`` as the output length -- read only by the oracle policies --, the
tenant, SLO class and predictions from ``SamplingParams.extra_args``), and the policy's per-request state is grown
by one row (:class:`Online`): the policy object is reset on the one-request context and its per-request lists
(:data:`PER_REQUEST`) are appended to the live object's. ``tests/test_vllm_export.py`` holds an online run
bit-identical to the bound one on the same window.

The ranked plan of preemptive policies (LAS, SRPT, MLFQ, RR) is the simulator's
:meth:`portbench.sim.engine.batching.Batching._plan_ranked` on vLLM's state; its docstring is the rule.
vLLM's own mechanisms (the admission gate ``full_sequence_must_fit``, chunking under the budget,
``max_num_seqs``, its preemption when a running request's block does not fit) then carry it out: by
construction every admission the plan makes passes vLLM's gate, and no running request runs out of
blocks.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator

import numpy as np
import polars as pl

from ..data import predictors
from ..sim import profiles as sim_profiles
from ..sim import schedulers
from ..sim.request import FINISHED, PAUSED, RUNNING, WAITING, Request, RunContext, requests_from_window
from .options import PolicyOptions, load_predictor

from vllm.v1.core.sched.request_queue import RequestQueue


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


class PolicyQueue(RequestQueue):
    """vLLM's waiting queue with the policy's order: it holds every waiting request; during
    ``schedule()`` it offers (``peek``/``pop``) only what :meth:`PolicyDriver.offer` set."""

    def __init__(self, driver: "PolicyDriver") -> None:
        self._d = driver
        self._reqs: dict[str, object] = {}
        self._offer: Iterator | None = None
        self._head = None

    # --- the queue's content
    def add_request(self, request) -> None:
        self._reqs[request.request_id] = request

    def prepend_request(self, request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests) -> None:
        for r in requests:
            self.add_request(r)

    def remove_request(self, request) -> None:
        self._reqs.pop(request.request_id, None)

    def remove_requests(self, requests) -> None:
        for r in requests:
            self.remove_request(r)

    def __len__(self) -> int:
        return len(self._reqs)

    def __iter__(self):
        return iter(list(self._reqs.values()))

    # --- what vLLM may admit in this step
    def set_offer(self, it: Iterator | None) -> None:
        self._offer, self._head = it, None

    def _peek(self):
        if self._head is None and self._offer is not None:
            for v in self._offer:
                if v.request_id in self._reqs:
                    self._head = v
                    break
            else:
                self._offer = None
        return self._head

    def __bool__(self) -> bool:
        return self._peek() is not None

    def peek_request(self):
        v = self._peek()
        if v is None:
            raise IndexError("peek from an empty queue")
        return v

    def pop_request(self):
        v = self.peek_request()
        del self._reqs[v.request_id]
        self._head = None
        self._d.on_admit(v)
        return v


# The per-request state each built-in policy builds in ``reset`` (lists indexed by request id) and the
# per-tenant dicts (grown with a key's first value); tests/test_vllm_export.py checks the table against the classes.
PER_REQUEST: dict[str, tuple[str, ...]] = {"random": ("_u",), "edf": ("_deadline",), "vtc": ("_charged",),
                                           "mlfq": ("_join",), "rr": ("_tau", "_turn"), "sjf_predicted": ("_pred",),
                                           "ltr": ("_score",)}
PER_KEY: dict[str, tuple[str, ...]] = {"vtc": ("_counter", "_waiting")}
log = logging.getLogger("portbench.vllm")


def _xargs(v) -> dict:
    sp = getattr(v, "sampling_params", None)
    return dict(getattr(sp, "extra_args", None) or {})


class Online:
    """The policy's run context grown one request at a time (a server: requests are not known in advance)."""

    def __init__(self, pol, opts: PolicyOptions) -> None:
        self.pol, self.opts = pol, opts
        self.rng = np.random.default_rng(opts.seed)
        self.profile = sim_profiles.get_profile(opts.profile or sim_profiles.DEFAULT_PROFILE)
        self.slo = opts.slo or (next(iter(opts.slo_classes.values())) if opts.slo_classes else None)
        self.model = load_predictor(opts.predictor) if opts.predictor else None
        self._warned: set[str] = set()
        pol.reset(self.context([], slo=self.slo))

    def context(self, reqs: list[Request], *, slo=None, pred=None, score=None) -> RunContext:
        n = len(reqs)
        return RunContext(n=n, arrival_s=np.array([r.arrival_s for r in reqs], dtype=float),
                          prompt_tokens=np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
                          output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
                          tenant=[r.tenant for r in reqs], profile=self.profile, rng=self.rng, slo=slo,
                          predicted_output=np.asarray(pred if pred is not None else [1.0] * n, dtype=float),
                          ltr_score=np.asarray(score if score is not None else [0.0] * n, dtype=float))

    def _warn(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("portbench %s: %s", self.opts.policy, msg)

    def predictions(self, m: Request, xargs: dict) -> tuple[float, float]:
        """``(predicted_output, ltr_score)`` of a request: its own (``vllm_xargs``), else the frozen predictor's."""
        pred, score = xargs.get("predicted_output"), xargs.get("ltr_score")
        if (pred is None or score is None) and self.model is not None:
            raw = {k: [xargs.get(k)] for k in ("model", "log_type", "client", "turn", "req_type", "prefix_reuse")}
            frame = predictors._raw_frame([m.prompt_tokens], [1], t_s=[m.arrival_s], **raw)
            p, s = self.model.predict(frame)
            pred = float(p[0]) if pred is None else pred
            score = float(s[0]) if score is None else score
        if self.opts.policy in ("sjf_predicted", "edf", "ltr") and (pred is None if self.opts.policy != "ltr"
                                                                     else score is None):
            self._warn("pred", "a request without a prediction and no 'predictor' option: its predicted output is "
                               "its max_tokens, its LTR score 0 (set the predictor option, or pass predicted_output/"
                               "ltr_score in vllm_xargs)")
        return float(pred if pred is not None else m.output_tokens), float(score if score is not None else 0.0)

    def grow(self, m: Request, xargs: dict) -> None:
        """Append request ``m`` (id = the next row) to the policy's per-request state."""
        slo = self.slo
        cls_name = xargs.get("slo")
        if cls_name is not None:
            if str(cls_name) in self.opts.slo_classes:
                slo = self.opts.slo_classes[str(cls_name)]
            else:
                self._warn(f"slo:{cls_name}", f"unknown SLO class {cls_name!r} (slo_classes: "
                                              f"{sorted(self.opts.slo_classes)}): the default SLO is used")
        pred, score = self.predictions(m, xargs)
        fresh = schedulers.get_scheduler(self.opts.policy, **self.opts.sim)
        one = Request(0, m.arrival_s, m.prompt_tokens, m.output_tokens, m.tenant)
        fresh.reset(self.context([one], slo=slo, pred=[pred], score=[score]))
        for name in PER_REQUEST.get(self.opts.policy, ()):
            lst = getattr(self.pol, name)
            if len(lst) != m.id:
                raise RuntimeError(f"portbench {self.opts.policy}: per-request state {name} out of step")
            lst.append(getattr(fresh, name)[0])
        for name in PER_KEY.get(self.opts.policy, ()):
            live = getattr(self.pol, name)
            for k, v in getattr(fresh, name).items():
                live.setdefault(k, v)


class PolicyDriver:
    """One policy of one engine inside vLLM's scheduler (module docstring). ``mode``: ``driven`` (the waiting
    queue, the running list and preemption are the policy's), ``static`` (vLLM's priority queue with the
    policy's static key as each request's priority) or ``fcfs`` (priority 0: vLLM's own FCFS rules)."""

    def __init__(self, sched, opts: PolicyOptions, mode: str, now: Callable[[], float]) -> None:
        self.s = sched
        self.name = opts.policy
        self.opts = opts
        self.mode = mode
        self.clock = now
        self.pol = schedulers.get_scheduler(self.name, **opts.sim)
        self.preemptive = bool(getattr(self.pol, "preemptive", False))
        # the admission order is the policy's (not a static priority vLLM's heap can hold)
        self.ordered = mode == "driven" and not self.preemptive
        self.paused: list = []          # vLLM requests paused by the plan (out of `running` for the step)
        self.queue = PolicyQueue(self)
        self.mirror: list[Request] | None = None      # bound to a window: one per row
        self.row_of: Callable[[str], int] | None = None
        self.online: Online | None = None
        self.by_id: dict[str, Request] = {}          # online: the live requests' mirrors
        self.next_row = 0
        if mode != "fcfs":
            self.online = Online(self.pol, opts)

    @property
    def now(self) -> float:
        return float(self.clock())

    def bind_window(self, window_df: pl.DataFrame, seed: int, profile, slo, row_of: Callable[[str], int]) -> None:
        """Know the requests in advance (virtual engine): the window's mirrors and run context, as the simulator
        builds them; ``row_of`` maps a vLLM request id to its window row."""
        mml = int(self.s.max_model_len)
        reqs, ctx = requests_from_window(window_df, profile, np.random.default_rng(seed), slo, max_model_len=mml)
        self.pol.reset(ctx)
        self.mirror = reqs
        self.row_of = row_of
        self.online = None

    def m(self, v) -> Request:
        if self.mirror is not None:
            return self.mirror[self.row_of(v.request_id)]
        return self.by_id[v.request_id]

    def _new_mirror(self, v) -> Request:
        x = _xargs(v)
        m = Request(self.next_row, float(v.arrival_time), int(v.num_prompt_tokens), int(v.max_tokens),
                    str(x.get("tenant", "default")))
        self.next_row += 1
        self.by_id[v.request_id] = m
        self.online.grow(m, x)
        return m

    # --- events from vLLM
    def on_arrival(self, v) -> None:
        if self.mode == "fcfs":
            v.priority = 0
            return
        now = self.now
        m = self.m(v) if self.mirror is not None else self._new_mirror(v)
        m.state = WAITING
        m.waiting_since = m.arrival_s
        self.pol.on_arrival(m, now)
        if self.mode == "static" or (self.ordered and getattr(self.pol, "vllm_static", False)):
            # vLLM's heap and its own victim choice: (priority, arrival, id) -- ltr: its score picks vLLM's victims
            v.priority = (self.pol.static_key(m), m.id)
        elif self.preemptive:
            m.key = (self.pol.priority(m, now), m.id)

    def on_admit(self, v) -> None:
        if self.mode == "fcfs":
            return
        m = self.m(v)
        m.state = RUNNING
        self.pol.on_admit(m, self.now)

    def on_evict(self, v) -> None:
        if self.mode == "fcfs":
            return
        now = self.now
        m = self.m(v)
        m.state = WAITING
        m.waiting_since = now
        m.preemptions += 1
        self.pol.on_evict(m, now)
        if self.preemptive:
            m.key = (self.pol.priority(m, now), m.id)

    def on_tokens(self, vs, t: float) -> None:
        if self.mode == "fcfs":
            return
        ms = []
        for v in vs:
            m = self.m(v)
            m.generated += 1
            ms.append(m)
        if ms:
            self.pol.on_tokens(ms, 1, lambda i: t)

    def on_finish(self, v, t: float) -> None:
        if self.mode == "fcfs":
            return
        m = self.m(v)
        m.state = FINISHED
        self.pol.on_finish(m, t)
        if self.mirror is None:
            del self.by_id[v.request_id]

    def on_abort(self, v) -> None:
        """A request vLLM dropped before its end (client gone): the policy sees it admitted (if waiting) and
        finished, so that no per-tenant or queue state keeps it."""
        if self.mode == "fcfs" or (self.mirror is None and v.request_id not in self.by_id):
            return
        m = self.m(v)
        if m.state == FINISHED:
            return
        if m.state == WAITING:
            self.pol.on_admit(m, self.now)
        self.on_finish(v, self.now)

    # --- before / after vLLM's schedule()
    def before(self) -> None:
        if self.mode != "driven":
            return
        if self.preemptive:
            self._plan()
        elif self.ordered:
            waiting = [self.m(v) for v in self.queue]
            by_row = {self.m(v).id: v for v in self.queue}
            self.queue.set_offer(by_row[m.id] for m in self.pol.admission_order(waiting, self.now))

    def after(self) -> None:
        if self.mode != "driven":
            return
        self.queue.set_offer(None)
        if self.paused:
            self.s.running.extend(self.paused)
            self.paused = []
    # --- the ranked plan (sim: Batching._plan_ranked)
    def _plan(self) -> None:
        s, pol, now = self.s, self.pol, self.now
        bs = int(s.block_size)
        kvm = s.kv_cache_manager
        running = list(s.running)
        key = {}
        for v in running:
            m = self.m(v)
            m.generated = int(v.num_output_tokens)
            key[v.request_id] = (pol.priority(m, now), m.id)
        waiting = list(self.queue)
        for v in waiting:
            m = self.m(v)
            key[v.request_id] = m.key if m.key is not None else (pol.priority(m, now), m.id)
        held = {v.request_id: self._held(v) for v in running}
        cap = int(kvm.block_pool.num_gpu_blocks) - 1
        free, slots = cap, int(s.max_num_running_reqs)
        ranked = sorted(running + waiting, key=lambda v: key[v.request_id])
        is_res = {v.request_id for v in running}
        hol = False
        cands: list = []
        dec: list = []
        pf: list = []
        displaced: list = []
        for v in ranked:
            rid = v.request_id
            if rid not in is_res:
                if hol:
                    continue
                need = _cdiv(v.num_tokens, bs) if slots > 0 else None
                if need is None or need > free:
                    hol = True
                    continue
                free -= need
                slots -= 1
                cands.append(v)
                continue
            # a decoder reserves its next token's blocks, a request in prefill its whole current sequence
            decoding = not self._in_prefill(v)
            need = _cdiv(v.num_computed_tokens + 1 if decoding else v.num_tokens, bs)
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                (dec if decoding else pf).append(v)
            else:
                displaced.append(v)
        reserved = cap - free
        held_d = sum(held[v.request_id] for v in displaced)
        while displaced and reserved + held_d > cap:
            victim_m = pol.victim([self.m(v) for v in displaced], now)
            v = next(x for x in displaced if self.m(x) is victim_m)
            displaced.remove(v)
            held_d -= held.pop(v.request_id)
            if v in s.running:
                s.running.remove(v)
            s._preempt_request(v, now)
        for v in displaced:
            if v in s.running:
                s.running.remove(v)
            self.m(v).state = PAUSED
        self.paused = displaced
        # budget order: placed decoders, then the placed prefills in rank order
        s.running[:] = dec + pf
        self.queue.set_offer(iter(cands))

    def _held(self, v) -> int:
        """KV blocks ``v`` holds (counted in vLLM's block table, without building its id list)."""
        groups = self.s.kv_cache_manager.coordinator.get_blocks(v.request_id)
        return len(groups[0]) if groups else 0

    def _in_prefill(self, v) -> bool:
        return bool(getattr(v, "is_prefill_chunk", False)) or v.num_computed_tokens < v.num_tokens - 1
