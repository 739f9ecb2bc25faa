"""Batch formation at a decision point: non-preemptive and preemptive planning, prompt chunks, V1 and V0
(see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

import heapq

from ...core.errors import ConservationError
from ..request import PAUSED, RUNNING, WAITING, Request
from .queues import _key_of
from .state import EngineState


class Batching(EngineState):
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: which requests form the next iteration."""

    def _chunks(self, budget: int, now: float, frozen: Request | None = None) -> int:
        """Chunked prefill: give the residents' ongoing prefills their chunks (policy order; under V1
        at most one prompt is ever part-way, so the order does not matter there). ``frozen``: a prefill whose
        chunk vLLM fixed before its allocation failed -- it keeps that chunk while vLLM preempts for it (a
        preempted decoder's token goes back to the budget, not into the chunk)."""
        pre = self.prefilling
        if len(pre) > 1:
            S = self.sched
            pre.sort(key=(lambda r: r.rank) if self.static else (lambda r: (S.priority(r, now), r.id)))
        b = budget
        skipped = self.skipped
        for r in pre:
            if skipped and r in skipped:      # vLLM stopped before it in this step
                r.chunk = 0
                continue
            left = r.prefill_target - r.prefilled
            c = r.chunk if r is frozen else left if left < b else b
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
        mode = self.mode
        chunked, per_chunk = mode.chunked, mode.per_chunk
        if self.skipped:
            self._unskip()
        if self.pc_on:
            self._pc_reconcile()
        budget = self.B
        preempted = False
        extra = 0
        frozen = None     # the prefill whose allocation failed: vLLM keeps its chunk while preempting for it
        while True:
            if chunked:
                budget = self._chunks(max(0, self.B - len(self.cohort)), now, frozen)
                if per_chunk:
                    extra = self._chunk_blocks()
            total = self.need_now + self.other_blocks + extra + self.cache_adj
            if total <= cap:
                break
            self._materialize()
            residents = list(self.res.values())
            v = S.victim(residents, now)
            preempted = True
            if per_chunk and not self.skipped:
                i = self._first_misfit(residents, total - cap)
                if residents[i] is not v and residents[i].chunk and residents[i].id not in self.cohort:
                    frozen = residents[i]
                if residents[i] is v:
                    # vLLM: the request whose blocks do not fit is itself the victim -- it is preempted and
                    # scheduling of the running requests stops: those after it keep their KV, get no token
                    self._evict(v, now)
                    self._skip(residents[i + 1:])
                    continue
            self._evict(v, now)
        if self.skipped and not self.cohort and not any(r.chunk for r in self.prefilling):
            return self._plan(now)    # vLLM: an empty step; the next schedule() follows at once
        if per_chunk:
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
        if per_chunk and preempted and self.n_wait:
            self.one_step = True      # admission resumes at the next iteration boundary
        if self.n_wait and slots > 0 and not (per_chunk and preempted):
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

    def _first_misfit(self, residents: list, over: int) -> int:
        """Index (in running order: admission order, vLLM's ``running`` list) of the first resident whose
        blocks for this step do not fit when each allocates in turn (``over`` = blocks in use after every
        allocation minus the capacity, > 0; the blocks the residents after it add are not allocated yet)."""
        bs = self.bs
        adds = []
        for r in residents:
            if r.id in self.cohort:
                adds.append(1 if (r.prompt_tokens + r.generated - 1) % bs == 0 else 0)
            elif r.chunk:
                adds.append((r.prefilled + r.chunk + bs - 1) // bs - r.blocks)
            else:
                adds.append(0)
        later = 0
        for i in range(len(residents) - 1, -1, -1):   # usage at i = total − Σ adds after i
            if over - later <= 0:
                return i + 1
            later += adds[i]
        return 0

    def _skip(self, rs: list) -> None:
        """Residents that get no token in this step (vLLM stopped scheduling before them): a decoder leaves
        the cohort and holds the blocks of its computed tokens; a prefill gets no chunk."""
        bs = self.bs
        for r in rs:
            if r.id in self.cohort:
                self._leave(r)
                r.blocks = (r.prompt_tokens + r.generated - 1 + bs - 1) // bs
                self.other_blocks += r.blocks
            else:
                r.chunk = 0
            self.skipped.append(r)
        self.one_step = True

    def _unskip(self) -> None:
        """The residents skipped in the last step decode again (they are still in running order)."""
        for r in self.skipped:
            if r.prefilled == r.prefill_target and r.id in self.res:
                self.other_blocks -= r.blocks
                self._join(r)
        self.skipped = []

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
        unless the batch needs their memory: then victims are evicted (recompute or swap).

        Cost: the walk in rank order visits requests one by one only until the last waiting request
        or non-decoding resident it meets; the rest of the ranking (decoding members of the cohort
        only) is decided in bulk from the cohort's block total -- all of it runs when it fits, else
        the greedy walk's first misfit is found from the end and only the members from there on are
        visited -- so a decision costs O(requests that change + displaced), not O(residents)."""
        if self.ranked:
            # nobody to rank against and every resident's own blocks fit (the ranked plan's accounting)
            if not self.n_wait and not self.paused and self.need_now + self.other_blocks <= self.cap:
                return self._plan(now)
            return self._plan_ranked(now)
        if not self.n_wait and not self.paused and self.need_now + self.other_blocks + self.cache_adj <= self.cap:
            return self._plan(now)      # nobody to rank against: every resident runs
        # V0 from here on (V1 ranks in _plan_ranked): a prompt's blocks were all allocated at admission
        S = self.sched
        bs, cap = self.bs, self.cap
        chunked, pc_on = self.mode.chunked, self.pc_on
        if pc_on:
            self._pc_reconcile()
        cohort, clock = self.cohort, self.clock
        residents = self._ranked_residents(now)
        wl = self.wlist
        if not self.frozen:
            pri = S.priority
            for r in wl:
                r.key = (pri(r, now), r.id)
            wl.sort(key=_key_of)
        if chunked:
            n_dec = len(cohort)                    # decoding residents: the cohort and the paused decoders
            for r in self.paused:
                if r.prefilled == r.prefill_target:
                    n_dec += 1
            b = self.B - n_dec
            if b < 0:
                b = 0
        else:
            b = self.B
        free, slots = cap - self.cache_adj, self.max_seqs
        pf_tokens = admitted = 0
        resumed: list[Request] = []            # selected decoders outside the cohort (they join it)
        prefilling: list[Request] = []
        displaced: list[Request] = []
        nr, nw = len(residents), len(wl)
        walked: list[Request] = []             # residents and admitted requests in rank order (the next order)
        cohort_need = self.need_now            # KV blocks of the cohort members not visited yet
        outside_left = nr - len(cohort)        # residents outside the cohort not visited yet
        i = j = 0
        wkey = wl[0].key if nw else None
        while i < nr or wkey is not None:
            if wkey is not None and (i >= nr or wkey < residents[i].key):
                r = wl[j]
                need = self._admit_need(r, b, pf_tokens, admitted, free) if slots > 0 else None
                if need is None:
                    wkey = None          # head-of-line: no further admission
                    continue
                j += 1
                wkey = wl[j].key if j < nw else None
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += r.chunk
                b -= r.chunk or (1 if chunked else 0)
                walked.append(r)
                if self._admit(r, now):
                    resumed.append(r)
                else:
                    prefilling.append(r)
                if pc_on:
                    self._pc_reconcile_walk(cap - free)
                continue
            if outside_left == 0 and (wkey is None or wkey > residents[-1].key):
                # the rest are cohort members and no waiting request ranks between them
                free, slots = self._bulk_tail(residents, i, cohort_need, free, slots, displaced)
                walked.extend(residents[i:] if i else residents)
                i = nr
                continue
            r = residents[i]
            i += 1
            walked.append(r)
            if r.id in cohort:
                need = (r.prompt_tokens + r.gbase + clock + bs - 1) // bs
                cohort_need -= need
                if slots > 0 and need <= free:
                    free -= need
                    slots -= 1
                else:
                    displaced.append(r)
                continue
            outside_left -= 1
            left = r.prefill_target - r.prefilled
            if left == 0:                      # a paused decoder
                need = (r.prompt_tokens + r.generated + bs - 1) // bs
                if slots > 0 and need <= free:
                    free -= need
                    slots -= 1
                    r.state = RUNNING
                    resumed.append(r)
                else:
                    displaced.append(r)
                continue
            c = left if left < b else b
            need = r.blocks
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                r.state = RUNNING
                r.chunk = c
                b -= c
                pf_tokens += c
                prefilling.append(r)
            else:
                displaced.append(r)
        if admitted:
            del wl[:admitted]
            self.n_wait -= admitted
        self.rorder = walked
        for r in displaced:                    # cohort members that lost their place
            if r.id in cohort:
                self._leave(r)
        for r in resumed:                      # resumed (paused or swapped) decoders join the cohort
            self._join(r)
        self.prefilling = prefilling
        self.paused = []
        other = 0
        for r in prefilling:
            other += r.blocks
        for r in displaced:
            r.chunk = 0
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
        if pc_on:
            self._pc_reconcile()
        return self._iteration(now, self.need_now + self.other_blocks + self.cache_adj, pf_tokens)

    def _gate_blocks(self, r: Request, free: int):
        """V1 ranked plan: the blocks a waiting request reserves -- every block of its whole current sequence
        (vLLM's admission gate; prefix-cache sharing is not counted on in the plan) -- or None when they exceed
        ``free``."""
        bs = self.bs
        if r.swapped and r.prefilled == r.prefill_target:
            need = (r.prompt_tokens + r.generated + bs - 1) // bs
        else:
            need = (r.prompt_tokens + r.generated + bs - 1) // bs if not r.swapped else (r.prefill_target + bs - 1) // bs
        return need if need <= free else None

    def _plan_ranked(self, now: float):
        """The ranked plan of preemptive policies under V1 -- one rule, also run by vLLM's scheduler
        (:mod:`portbench.vllm`; the README's "preemptive policies on vLLM"):

        1. *Rank* every live request (running, paused, waiting) by ``(priority, id)``.
        2. *Place* in rank order, each request reserving the KV blocks it needs this step: a decoder
           its next token's blocks, a request in prefill (resident or waiting) the blocks of its whole
           current sequence (vLLM's admission gate). Every request counts all its blocks (prefix-cache
           sharing is not counted on). A waiting request that does not fit (or finds no slot) stops
           admission; a resident that does not fit is *displaced*.
        3. *Memory*: displaced residents keep their KV (paused) while the reservations and the paused
           requests' blocks fit the cache; otherwise the policy's victims among them are evicted.
        4. *Budget and admission* (vLLM's order): one token for every placed decoder, then the placed
           residents' prompt chunks in rank order, then the placed waiting requests in rank order through
           vLLM's own admission (its gate on the blocks free at that moment, its prefix-cache hit); admission
           stops at the first that does not pass or where the budget is spent.
        """
        S = self.sched
        bs, cap = self.bs, self.cap
        pc_on = self.pc_on
        if pc_on:
            self._pc_reconcile()
        cohort, clock = self.cohort, self.clock
        residents = self._ranked_residents(now)
        wl = self.wlist
        if not self.frozen:
            pri = S.priority
            for r in wl:
                r.key = (pri(r, now), r.id)
            wl.sort(key=_key_of)
        free, slots = cap, self.max_seqs
        cands: list[Request] = []              # waiting requests placed (admitted in step 4 while they pass)
        resumed: list[Request] = []            # placed decoders outside the cohort (paused ones)
        placed_pf: list[Request] = []          # placed residents in prefill, rank order
        displaced: list[Request] = []
        walked: list[Request] = []             # residents and candidates in rank order
        nr, nw = len(residents), len(wl)
        cohort_need = self.need_now
        outside_left = nr - len(cohort)
        n_dec = 0                              # placed decoders
        i = j = 0
        wkey = wl[0].key if nw else None
        while i < nr or wkey is not None:
            if wkey is not None and (i >= nr or wkey < residents[i].key):
                r = wl[j]
                need = self._gate_blocks(r, free) if slots > 0 else None
                if need is None:
                    wkey = None                # head-of-line: no further admission
                    continue
                j += 1
                wkey = wl[j].key if j < nw else None
                free -= need
                slots -= 1
                cands.append(r)
                walked.append(r)
                continue
            if outside_left == 0 and (wkey is None or wkey > residents[-1].key):
                n0 = len(displaced)
                free, slots = self._bulk_tail(residents, i, cohort_need, free, slots, displaced)
                n_dec += nr - i - (len(displaced) - n0)
                walked.extend(residents[i:] if i else residents)
                i = nr
                continue
            r = residents[i]
            i += 1
            walked.append(r)
            if r.id in cohort:
                need = (r.prompt_tokens + r.gbase + clock + bs - 1) // bs
                cohort_need -= need
                if slots > 0 and need <= free:
                    free -= need
                    slots -= 1
                    n_dec += 1
                else:
                    displaced.append(r)
                continue
            outside_left -= 1
            if r.prefilled == r.prefill_target:    # a paused decoder
                need = (r.prompt_tokens + r.generated + bs - 1) // bs
                if slots > 0 and need <= free:
                    free -= need
                    slots -= 1
                    n_dec += 1
                    resumed.append(r)
                else:
                    displaced.append(r)
                continue
            need = (r.prefill_target + bs - 1) // bs
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                placed_pf.append(r)
            else:
                displaced.append(r)
        reserved = cap - free
        # 3. memory (before admission, as vLLM's scheduler runs it): the displaced stay paused while the
        # reservations and their blocks fit, else the policy's victims among them are evicted
        for r in displaced:
            r.chunk = 0
            if r.id in cohort:                 # paused: holds the blocks of its computed tokens (P + g − 1)
                self._leave(r)
                r.blocks = (r.prompt_tokens + r.generated - 1 + bs - 1) // bs
        held = 0
        for r in displaced:
            held += r.blocks
        while displaced and reserved + held > cap:
            v = S.victim(displaced, now)
            displaced.remove(v)
            held -= v.blocks
            self._requeue_evicted(v, now)
        for r in resumed:
            r.state = RUNNING
            self._join(r)
        # 4. the token budget: placed decoders, the placed residents' prompt chunks, then admissions
        b = self.B - n_dec
        if b < 0:
            b = 0
        pf_tokens = 0
        other = held
        for r in placed_pf:
            left = r.prefill_target - r.prefilled
            c = left if left < b else b
            r.chunk = c
            r.state = RUNNING
            b -= c
            pf_tokens += c
            r.blocks = (r.prefilled + c + bs - 1) // bs
            other += r.blocks
            if c and pc_on:
                self._pc_register(r, r.prefilled + c)
        self.other_blocks = other
        prefilling = list(placed_pf)
        if pc_on:
            self._pc_reconcile()
        free = cap - (self.need_now + self.other_blocks + self.cache_adj)
        admitted = 0
        for r in cands:                        # vLLM's admission: its gate on the blocks free now
            need = self._admit_need(r, b, pf_tokens, admitted, free) if b > 0 else None
            if need is None:                   # the rest stay waiting
                break
            admitted += 1
            pf_tokens += r.chunk
            b -= r.chunk or 1
            if self._admit(r, now):
                self._join(r)
            else:
                self.other_blocks += r.blocks
                prefilling.append(r)
            free = cap - (self.need_now + self.other_blocks + self.cache_adj)
            if pc_on:
                self._pc_reconcile()
        if admitted:                           # (evicted victims were inserted into the waiting list meanwhile)
            adm = {r.id for r in cands[:admitted]}
            self.wlist = [r for r in self.wlist if r.id not in adm]
            self.n_wait -= admitted
        if admitted < len(cands):
            skip = {r.id for r in cands[admitted:]}
            walked = [r for r in walked if r.id not in skip]
        gone = {r.id for r in walked if r.id not in self.res}     # evicted victims left the ranking
        self.rorder = [r for r in walked if r.id not in gone] if gone else walked
        self.paused = []
        if displaced:
            for r in displaced:
                if r.state == RUNNING:
                    r.state = PAUSED
                    r.pauses += 1
                    self.n_pause += 1
                if r.prefilled != r.prefill_target:
                    prefilling.append(r)
            self.paused = displaced
        self.prefilling = prefilling
        if self.need_now + self.other_blocks + self.cache_adj > cap:   # pragma: no cover - the gate and reservations cover it
            raise ConservationError(f"ranked plan at t={now}: {self.need_now + self.other_blocks + self.cache_adj} "
                                    f"KV blocks after placement > capacity {cap}")
        if pc_on:
            self._pc_reconcile()
        return self._iteration(now, self.need_now + self.other_blocks + self.cache_adj, pf_tokens)

    def _ranked_residents(self, now: float) -> list[Request]:
        """The residents sorted by their current key ``(priority, id)`` (static policies: their rank).
        The order of the last decision is kept (``rorder``, exact: finished and evicted requests leave
        it), so the sort sees a nearly sorted list."""
        residents = self.rorder
        if len(residents) != len(self.res):   # pragma: no cover - rorder is kept exact
            raise AssertionError(f"rank order of {len(residents)} residents, {len(self.res)} resident")
        if self.lazy_keys:
            self._refresh_keys(now)
            if self.check:                      # every cached key is the current (priority, id)
                clock, pri = self.clock, self.sched.priority
                for r in residents:
                    if r.id in self.cohort:
                        r.generated = r.gbase + clock
                    assert r.key == (pri(r, now), r.id), (r, r.key)
        elif not self.static:
            self._materialize()
            pri = self.sched.priority
            for r in residents:
                r.key = (pri(r, now), r.id)
        residents.sort(key=_key_of)
        return residents

    def _refresh_keys(self, now: float) -> None:
        """Lazy keys (built-in policies whose priority changes only as a request generates tokens, and
        says after how many: ``key_change_tokens``): re-key only the cohort members that joined since the
        last decision or reached their announced change; every other resident's key is current (a
        request that does not generate keeps its key)."""
        S, clock, cohort, h = self.sched, self.clock, self.cohort, self.kheap
        pri, ktok = S.priority, S.key_change_tokens
        todo = self.kdirty
        self.kdirty = []
        while h and h[0][0] <= clock:
            e = heapq.heappop(h)
            if e[2] == e[3].cver:
                todo.append(e[3])
        seen = set()
        for r in todo:
            if r.id not in cohort or r.id in seen:
                continue
            seen.add(r.id)
            r.generated = r.gbase + clock
            r.key = (pri(r, now), r.id)
            t = ktok(r)
            if t is not None:
                heapq.heappush(h, (clock + t, r.id, r.cver, r))

    def _bulk_tail(self, residents: list, i: int, need: int, free: int, slots: int, displaced: list):
        """The walk over ``residents[i:]`` -- cohort members only, whose blocks total ``need`` -- with
        ``free`` blocks and ``slots`` left: each runs if a slot is left and its blocks fit, else it is
        displaced. Returns the free blocks and slots left. All of them run when the total fits;
        otherwise the greedy walk's first misfit p is found from the end (the last index whose suffix
        holds at least the overflow), the members before p run and those from p on are walked."""
        n = len(residents) - i
        if need <= free and n <= slots:
            return free - need, slots - n
        bs, clock = self.bs, self.clock
        over = need - free                     # > 0 unless only slots are short
        tail_needs = []                        # needs from the end, down to the first misfit
        suffix = 0
        p = len(residents)
        if over > 0:
            while p > i:
                p -= 1
                r = residents[p]
                nd = (r.prompt_tokens + r.gbase + clock + bs - 1) // bs
                tail_needs.append(nd)
                suffix += nd
                if suffix >= over:
                    break
        if i + slots < p:                      # slots run out first
            for q in range(p - 1, i + slots - 1, -1):
                r = residents[q]
                nd = (r.prompt_tokens + r.gbase + clock + bs - 1) // bs
                tail_needs.append(nd)
                suffix += nd
            p = i + slots
        free -= need - suffix                  # residents[i:p] run
        slots -= p - i
        tail_needs.reverse()
        for r, nd in zip(residents[p:], tail_needs):
            if slots > 0 and nd <= free:
                free -= nd
                slots -= 1
            else:
                displaced.append(r)
        return free, slots
