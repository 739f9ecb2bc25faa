"""Advancing simulated time: compose an iteration, run decode-only batches k iterations at a time in
closed form, commit the tokens (see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

from ...core.errors import ConservationError
from ..profiles import decode_run_s, first_k_reaching, last_k_within
from ..request import FINISHED, Request
from .state import EngineState

_INF = float("inf")


class Iterations(EngineState):
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: iterations and closed-form decode runs."""

    def _iteration(self, now: float, used: int, pf_tokens: int):
        """Compose the iteration after a decision; return its duration (None: past the horizon).
        Swap copies decided at this decision point (``pending_s``) are added to it."""
        if used > self.cap:
            raise ConservationError(f"KV blocks in use {used} > capacity {self.cap} at t={now}")
        self.used = used
        if used > self.max_used:
            self.max_used = used
        if pf_tokens:
            pf = [r for r in self.prefilling if r.chunk]
            self._pf = pf
            ctx = pairs = 0
            for r in pf:
                c, p0 = r.chunk, r.prefilled
                ctx += p0 + c
                pairs += c * p0 + c * (c + 1) // 2
            if self.mode.chunked:
                n = len(self.cohort)
                ctx += self.SL + n * self.clock
                nd = n
                self._kind = 1
            else:
                nd = 0
                self._kind = 2   # whole-prompt prefill-first: the cohort waits for this iteration
            self._n_dec = nd
            dt = (self.prof.iteration_time(pf_tokens, nd, ctx, pairs) if self.attn
                  else self.prof.iteration_time(pf_tokens, nd, ctx)) + self.pending_s
            if now + dt > self.H:
                return None
            self._k = 1
            if self.trace is not None:
                self.trace.append((now, now + dt, 1, pf_tokens, nd, ctx, used))
                if self.trace_batch is not None:
                    ids = [(r.id, r.chunk) for r in pf] + ([(i, 1) for i in self.cohort] if nd else [])
                    self.trace_batch.append(",".join(f"{i}:{k}" for i, k in sorted(ids)))
            return dt
        if not self.cohort:
            raise RuntimeError(f"simulator made no progress at t={now}: {len(self.res)} residents, "
                               f"{self.n_wait} waiting (scheduler {self.sched.name})")
        return self._decode_run(now)

    def _decode_run(self, now: float):
        n = len(self.cohort)
        self._n_dec = n
        C = self.SL + n * self.clock
        a0 = self.prof.iteration_time(0, n, C)   # first iteration; each adds n tokens of context
        self._kind = 0
        if self.naive or self.pending_s or self.one_step:
            self.one_step = False
            a = a0 + self.pending_s            # a swap copy, or admission held back: this iteration alone
            if now + a > self.H:
                return None
            self._k = 1
            self._a0, self._inc = a, 0.0
            if self.trace is not None:
                self.trace.append((now, now + a, 1, 0, n, C, self.used))
                if self.trace_batch is not None:
                    self.trace_batch.append(",".join(f"{i}:1" for i in sorted(self.cohort)))
            return a
        k = self._k_complete()
        # the ranked plan (preemptive, V1) counts every resident's own blocks (no prefix-cache sharing)
        k = self._k_memory(self.cap - (self.need_now + self.other_blocks if self.ranked else self.used), k)
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
                # the run must end at or after t_bound as the clock adds it (now + T), not only
                # T >= t_bound − now: else the event is seen one iteration late
                while kt < k and now + decode_run_s(kt, a0, inc) < t_bound:
                    kt += 1
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

    def _note_marks(self, t: float, partial=None, inclusive: bool = False) -> None:
        """Record the useful work done by each work mark before ``t`` (at or before, ``inclusive``);
        ``partial(m)``: work done within the current commit by time m (None: none)."""
        marks = self.marks
        i = len(self.work_at)
        while i < len(marks) and (marks[i] < t or (inclusive and marks[i] == t)):
            self.work_at.append(self.work + (partial(marks[i]) if partial is not None else 0))
            i += 1

    def _commit(self, t0: float, t1: float) -> None:
        S = self.sched
        k = self._k
        kind = self._kind
        self.n_iter += k
        if self.pending_s:
            self.swap_s += self.pending_s
            self.pending_s = 0.0
        if self.marks and len(self.work_at) < len(self.marks):
            n, a0, inc = self._n_dec, getattr(self, "_a0", 0.0), getattr(self, "_inc", 0.0)
            if kind == 0 and k > 1:
                self._note_marks(t1, lambda m: n * last_k_within(a0, inc, m - t0))
            else:
                self._note_marks(t1)
        if kind != 2:                      # the cohort decodes k iterations (k = 1 when mixed)
            self.work += len(self.cohort) * k
            if k > 1:
                # KV in use during the run's last iteration (its peak): must fit
                self._advance(k - 1)
                used = self.need_now + self.other_blocks + self.cache_adj
                if used > self.cap:
                    raise ConservationError(f"KV blocks in use {used} > capacity {self.cap} in a decode "
                                            f"run ending at t={t1}")
                if used > self.max_used:
                    self.max_used = used
                if self.pc_on:           # the run's blocks were allocated iteration by iteration:
                    self._pc_reconcile()  # cached free blocks were evicted up to its peak
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
                p1 = r.prefilled + r.chunk
                lim = p1 if p1 < r.prompt_tokens else r.prompt_tokens
                if lim > r.high:               # useful work: prompt tokens never computed before
                    self.work += lim - (r.high if r.high > r.prefilled else r.prefilled)
                    r.high = lim
                r.prefilled = p1
                r.chunk = 0
                if p1 == r.prefill_target:
                    done_prefill = True
                    r.generated += 1
                    self.work += 1
                    if r.first_token_s != r.first_token_s:   # NaN: this is the first token
                        r.first_token_s = t1
                    produced.append(r)
                    self.other_blocks -= r.blocks
                    if r.generated == r.output_tokens:
                        self._finish(r, t1)
                    else:
                        self._join(r)
            if done_prefill:
                self.prefilling = [r for r in self.prefilling if r.prefilled != r.prefill_target]
            if produced and self.wants_tokens:
                S.on_tokens(produced, 1, lambda i: t1)
        self.end_time = t1
        if self.marks and len(self.work_at) < len(self.marks):
            self._note_marks(t1, inclusive=True)

    def _finish(self, r: Request, t: float) -> None:
        r.state = FINISHED
        r.finish_s = t
        self._pc_release(r)
        r.blocks = 0
        del self.res[r.id]
        if self.preemptive:
            self.rorder.remove(r)
        self.n_finished += 1
        self.sched.on_finish(r, t)
