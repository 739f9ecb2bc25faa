"""The waiting queue, admission and recompute preemption (see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

import bisect
import heapq

from ..request import RUNNING, REJECTED, WAITING, Request


def _key_of(r: Request):
    return r.key


class Queues:
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: arrivals into the waiting queue, admission
    (blocks of the whole prefill allocated at admission), eviction by recompute."""

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
