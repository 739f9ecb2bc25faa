"""Advancing simulated time: compose an iteration, run decode-only batches k iterations at a time in
closed form, commit the tokens (see :mod:`portbench.sim.engine`)."""

from __future__ import annotations

from ...core.errors import ConservationError
from ..profiles import decode_run_s, first_k_reaching, last_k_within
from ..request import FINISHED, Request

_INF = float("inf")


class Iterations:
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: iterations and closed-form decode runs."""

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
