"""The waiting queue, admission (V1 and V0), preemption by recompute or swap (see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

import bisect
import heapq
from operator import attrgetter

from ..request import REJECTED, RUNNING, WAITING, Request
from .state import EngineState

_key_of = attrgetter("key")      # the (priority, id) a request was last ranked by


class Queues(EngineState):
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: arrivals into the waiting queue, admission
    (V1: the whole current sequence must fit the free blocks, blocks allocated per chunk; V0: the
    whole prefill's blocks allocated at admission), preemption by recompute or swap."""

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
        """Preemption of a resident already out of the cohort and prefill lists: its KV blocks are
        freed and it goes back to the waiting queue (in the policy's order; under FCFS that is the
        front, as vLLM puts it). *Swap* (``engine.preemption: swap``, while host memory has room): its
        computed KV is copied to host memory (the copy time is charged to the next iteration) and it
        resumes where it stopped. *Recompute* (otherwise): its prefill of prompt + tokens generated
        so far is redone when it is admitted again (the generated tokens stay generated)."""
        del self.res[r.id]
        if self.preemptive:
            self.rorder.remove(r)
        self._pc_release(r)
        decoding = r.prefilled == r.prefill_target
        computed = r.blocks if decoding else (r.prefilled + self.bs - 1) // self.bs
        r.state = WAITING
        r.blocks = 0
        r.chunk = 0
        r.preemptions += 1
        r.waiting_since = now
        self.n_preempt += 1
        if self.swap and computed and self.host_used + computed <= self.host_cap:
            r.swapped = True
            r.swap_blocks = computed
            r.swaps += 1
            self.host_used += computed
            self.n_swap_out += 1
            self.pending_s += computed * self.swap_s_block
        else:
            r.prefilled = 0
            r.prefill_target = r.prompt_tokens + r.generated
        self.sched.on_evict(r, now)
        self._push_waiting(r, now)

    def _admit_need(self, r: Request, budget_left: int, pf_tokens: int, admitted: int, free: int) -> int | None:
        """KV blocks that admitting waiting request ``r`` now adds to the blocks in use, or None if it
        cannot be admitted now (the caller stops admitting: head-of-line). Sets ``r.chunk`` (this
        iteration's prompt tokens) and ``r.hit`` (prefix-cache entries hit).

        * V1 (vLLM's admission gate; :meth:`~.modes.V1Batching.fresh_need`): the blocks of its whole current
          sequence (prompt + tokens generated so far), less its prefix-cache hit, must fit the free blocks;
          only the blocks of this iteration's chunk (at most the token budget left) are allocated.
        * V0 (:meth:`~.modes.V0Batching.fresh_need`): the blocks of its whole prefill are allocated at
          admission (chunked policies too); whole-prompt batches stop at the budget (a longer prompt is
          prefilled alone).
        * swapped out: its KV comes back (blocks of what it had computed, plus this iteration's
          decode token or prompt chunk).
        """
        mode = self.mode
        if r.swapped:
            bs = self.bs
            if r.prefilled == r.prefill_target:              # resumes decoding
                if mode.chunked and budget_left < 1:
                    return None
                r.chunk = 0
                need = (r.prompt_tokens + r.generated + bs - 1) // bs
            else:
                c = mode.prefill_chunk(r.prefill_target - r.prefilled, budget_left, pf_tokens, admitted, self.B)
                if c is None:
                    return None
                r.chunk = c
                need = (mode.prefill_blocks_tokens(r, c) + bs - 1) // bs
            r.hit = 0
            return need if need <= free else None
        return mode.fresh_need(self, r, r.prompt_tokens + r.generated, budget_left, pf_tokens, admitted, free)

    def _admit(self, r: Request, now: float) -> bool:
        """Admit ``r`` after :meth:`_admit_need`: sets its blocks, takes its prefix-cache hit,
        registers the full hash blocks its chunk computes, swaps it back in if it was swapped out.
        Returns True when it resumes decoding (swapped in after its prefill); the caller puts it in
        the decode cohort or in the prefill list (and counts its blocks)."""
        r.state = RUNNING
        self.res[r.id] = r
        if r.admitted_s != r.admitted_s:        # NaN: first admission
            r.admitted_s = now
        self.wq.append((r.waiting_since, now))
        self.sched.on_admit(r, now)
        if r.swapped:
            self.host_used -= r.swap_blocks
            t = r.swap_blocks * self.swap_s_block
            self.pending_s += t
            self.n_swap_in += 1
            r.swapped = False
            r.swap_blocks = 0
            if r.prefilled == r.prefill_target:
                return True
            r.blocks = (self.mode.prefill_blocks_tokens(r, r.chunk) + self.bs - 1) // self.bs
            return False
        target = r.prompt_tokens + r.generated
        r.prefill_target = target
        self.mode.fresh_admit(self, r, target)
        return False
