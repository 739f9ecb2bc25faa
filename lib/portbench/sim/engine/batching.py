"""Batch formation at a decision point: non-preemptive and preemptive planning, prefill chunks
(see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

import heapq

from ..request import PAUSED, RUNNING, WAITING, Request
from .queues import _key_of


class Batching:
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: which requests form the next iteration."""

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
