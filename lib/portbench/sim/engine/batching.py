"""Batch formation at a decision point: non-preemptive and preemptive planning, prompt chunks, V1 and V0
(see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

import heapq

from ..request import PAUSED, RUNNING, WAITING, Request
from .queues import _key_of


class Batching:
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: which requests form the next iteration."""

    def _chunks(self, budget: int, now: float) -> int:
        """Chunked prefill: give the residents' ongoing prefills their chunks (policy order; under V1
        at most one prompt is ever part-way, so the order does not matter there)."""
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

    def _chunk_blocks(self) -> int:
        """V1: blocks the ongoing prefills' chunks add (blocks are allocated per chunk)."""
        bs = self.bs
        extra = 0
        for r in self.prefilling:
            extra += (r.prefilled + r.chunk + bs - 1) // bs - r.blocks
        return extra

    def _plan(self, now: float):
        """Non-preemptive decision (vLLM's scheduler): the running requests first -- every decode, then
        the rest of a started prompt, chunked to the budget left (V1) -- evicting victims while
        their next iteration does not fit the KV cache; then, if no request was preempted in this
        step (V1), waiting requests in the policy's order while they fit (slots, KV, token budget;
        the first that does not fit stops admission)."""
        S = self.sched
        cap = self.cap
        chunked, v1 = self.chunked, self.v1
        if self.pc_on:
            self._pc_reconcile()
        budget = self.B
        preempted = False
        extra = 0
        while True:
            if chunked:
                budget = self._chunks(max(0, self.B - len(self.cohort)), now)
                if v1:
                    extra = self._chunk_blocks()
            total = self.need_now + self.other_blocks + extra + self.cache_adj
            if total <= cap:
                break
            self._materialize()
            self._evict(S.victim(list(self.res.values()), now), now)
            preempted = True
        if v1:
            bs = self.bs
            for r in self.prefilling:
                if r.chunk:
                    r.blocks = (r.prefilled + r.chunk + bs - 1) // bs
                    if self.pc_on:
                        self._pc_register(r, r.prefilled + r.chunk)
            self.other_blocks += extra
            if self.pc_on:
                self._pc_reconcile()
                total = self.need_now + self.other_blocks + self.cache_adj   # shared blocks found
        free = cap - total
        slots = self.max_seqs - len(self.res)
        admitted = 0
        pf_tokens = 0
        if chunked:
            for r in self.prefilling:
                pf_tokens += r.chunk
        if v1 and preempted and self.n_wait:
            self.one_step = True      # admission resumes at the next iteration boundary
        if self.n_wait and slots > 0 and not (v1 and preempted):
            use_heap = self.use_heap
            for r in (self._heap_order() if use_heap else S.admission_order(self.wlist, now)):
                if slots <= 0:
                    break
                need = self._admit_need(r, budget, pf_tokens, admitted, free)
                if need is None:
                    break
                if use_heap:
                    heapq.heappop(self.wait_heap)
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += r.chunk
                budget -= r.chunk or 1
                if self._admit(r, now):
                    self._join(r)
                else:
                    self.other_blocks += r.blocks
                    self.prefilling.append(r)
                if self.pc_on:
                    free = cap - (self.need_now + self.other_blocks + self.cache_adj)
                    self._pc_reconcile()
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
        fits (slots, KV; admission of waiting requests stops at the first that does not fit,
        residents further down still run if they fit). The token budget goes to the batch's decodes
        first, then to prompt chunks in rank order. Descheduled residents are paused (KV kept)
        unless the batch needs their memory: then victims are evicted (recompute or swap)."""
        if not self.n_wait and not self.paused and self.need_now + self.other_blocks + self.cache_adj <= self.cap:
            return self._plan(now)      # nobody to rank against: every resident runs
        S = self.sched
        bs, cap = self.bs, self.cap
        chunked, v1 = self.chunked, self.v1
        if self.pc_on:
            self._pc_reconcile()
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
        free, slots = cap - self.cache_adj, self.max_seqs
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
                need = self._admit_need(r, b, pf_tokens, admitted, free) if slots > 0 else None
                if need is None:
                    hol = True
                    continue
                j += 1
                if j >= nw:
                    hol = True
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += r.chunk
                b -= r.chunk or (1 if chunked else 0)
                r.mark = seq
                if self._admit(r, now):
                    selected_dec.append(r)
                else:
                    prefilling.append(r)
                if self.pc_on:
                    self._pc_reconcile_walk(cap - free)
                continue
            r = residents[i]
            i += 1
            left = r.prefill_target - r.prefilled
            if left == 0:
                need = (r.prompt_tokens + r.generated + bs - 1) // bs
            elif v1:
                c = left if left < b else b
                need = (r.prefilled + c + bs - 1) // bs
            else:
                need = r.blocks
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
                    if v1:
                        r.blocks = need
                        if self.pc_on:
                            self._pc_register(r, r.prefilled + c)
                    prefilling.append(r)
            else:
                displaced.append(r)
        if admitted:
            del wl[:admitted]
            self.n_wait -= admitted
        for r in members:                      # cohort members that lost their place
            if r.mark != seq:
                self._leave(r)
        for r in selected_dec:                 # resumed (paused or swapped) decoders join the cohort
            if r.id not in self.cohort:
                self._join(r)
        self.prefilling = prefilling
        self.paused = []
        for r in displaced:
            r.chunk = 0
        other = 0
        for r in prefilling:
            other += r.blocks
        for r in displaced:
            other += r.blocks
        self.other_blocks = other
        while self.need_now + self.other_blocks + self.cache_adj > cap:
            if displaced:
                v = S.victim(displaced, now)
                displaced.remove(v)
                self.other_blocks -= v.blocks
                self._requeue_evicted(v, now)
            else:   # prefix caching: blocks a displaced victim shared with the batch stay in use
                self._materialize()
                self._evict(S.victim(list(self.res.values()), now), now)
                pf_tokens = sum(r.chunk for r in self.prefilling)
        if displaced:
            for r in displaced:
                if r.state == RUNNING:
                    r.state = PAUSED
                    r.pauses += 1
                    self.n_pause += 1
                if r.prefilled != r.prefill_target:
                    prefilling.append(r)
            self.paused = displaced
        if self.pc_on:
            self._pc_reconcile()
        return self._iteration(now, self.need_now + self.other_blocks + self.cache_adj, pf_tokens)
