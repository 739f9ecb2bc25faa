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

The ranked plan of preemptive policies (LAS, SRPT, MLFQ, RR) is the simulator's
:meth:`portbench.sim.engine.batching.Batching._plan_ranked` on vLLM's state; its docstring is the rule.
vLLM's own mechanisms (the admission gate ``full_sequence_must_fit``, chunking under the budget,
``max_num_seqs``, its preemption when a running request's block does not fit) then carry it out: by
construction every admission the plan makes passes vLLM's gate, and no running request runs out of
blocks.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..sim import schedulers
from ..sim.request import FINISHED, PAUSED, RUNNING, WAITING, requests_from_window

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


class PolicyDriver:
    """One policy of one run inside vLLM's scheduler (module docstring)."""

    def __init__(self, sched, name: str, options: dict, window_df, seed: int, profile, slo, row_of) -> None:
        self.s = sched
        self.name = name
        self.pol = schedulers.get_scheduler(name, **(options or {}))
        mml = int(sched.max_model_len)
        reqs, ctx = requests_from_window(window_df, profile, np.random.default_rng(seed), slo, max_model_len=mml)
        self.pol.reset(ctx)
        self.mirror = reqs
        self.row_of = row_of
        self.now = 0.0
        self.preemptive = bool(getattr(self.pol, "preemptive", False))
        # the admission order is the policy's (not a static priority vLLM's heap can hold)
        self.ordered = not self.preemptive and not getattr(self.pol, "static_priority", False)
        self.paused: list = []          # vLLM requests paused by the plan (out of `running` for the step)
        self.queue = PolicyQueue(self)

    def m(self, v):
        return self.mirror[self.row_of(v.request_id)]

    # --- events from vLLM
    def on_arrival(self, v) -> None:
        m = self.m(v)
        m.state = WAITING
        m.waiting_since = m.arrival_s
        self.pol.on_arrival(m, self.now)
        if self.preemptive:
            m.key = (self.pol.priority(m, self.now), m.id)

    def on_admit(self, v) -> None:
        m = self.m(v)
        m.state = RUNNING
        self.pol.on_admit(m, self.now)

    def on_evict(self, v) -> None:
        m = self.m(v)
        m.state = WAITING
        m.waiting_since = self.now
        m.preemptions += 1
        self.pol.on_evict(m, self.now)
        if self.preemptive:
            m.key = (self.pol.priority(m, self.now), m.id)

    def on_tokens(self, vs, t: float) -> None:
        ms = []
        for v in vs:
            m = self.m(v)
            m.generated += 1
            ms.append(m)
        if ms:
            self.pol.on_tokens(ms, 1, lambda i: t)

    def on_finish(self, v, t: float) -> None:
        m = self.m(v)
        m.state = FINISHED
        self.pol.on_finish(m, t)

    # --- before / after vLLM's schedule()
    def before(self) -> None:
        if self.preemptive:
            self._plan()
        elif self.ordered:
            waiting = [self.m(v) for v in self.queue]
            by_row = {self.row_of(v.request_id): v for v in self.queue}
            self.queue.set_offer(by_row[m.id] for m in self.pol.admission_order(waiting, self.now))

    def after(self) -> None:
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
            v = next(x for x in displaced if self.row_of(x.request_id) == victim_m.id)
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
