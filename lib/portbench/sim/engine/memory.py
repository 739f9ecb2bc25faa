"""KV memory of the decode cohort: block accounting in closed form (see :mod:`portbench.sim.engine`).

The decoding requests of the current batch advance together, so their state is kept relative to a
shared iteration clock (``generated = gbase + clock``); joining, leaving, advancing k iterations and
finding the iteration at which the cache would overflow cost O(block size), not O(n).
"""

from __future__ import annotations

import heapq

from ..request import Request


class CohortMemory:
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: the decode cohort and its KV blocks."""

    def _join(self, r: Request) -> None:
        bs = self.bs
        P, g = r.prompt_tokens, r.generated
        gb = g - self.clock
        r.gbase = gb
        L = P + gb
        self.SL += L
        self.cnt[L % bs] += 1
        b = (P + g + bs - 1) // bs
        r.blocks = b
        self.need_now += b
        r.cver += 1
        heapq.heappush(self.fheap, (r.output_tokens - gb, r.id, r.cver, r))
        self.cohort[r.id] = r

    def _leave(self, r: Request) -> None:
        bs = self.bs
        P = r.prompt_tokens
        g = r.gbase + self.clock
        r.generated = g
        L = P + r.gbase
        self.SL -= L
        self.cnt[L % bs] -= 1
        b = (P + g + bs - 1) // bs
        self.need_now -= b
        r.blocks = b
        r.cver += 1
        del self.cohort[r.id]

    def _materialize(self) -> list[Request]:
        c, bs = self.clock, self.bs
        members = list(self.cohort.values())
        for r in members:
            g = r.gbase + c
            r.generated = g
            r.blocks = (r.prompt_tokens + g + bs - 1) // bs
        return members

    def _advance(self, k: int) -> None:
        bs, c, cnt = self.bs, self.clock, self.cnt
        d = 0
        for m in range(bs):
            w = cnt[m]
            if w:
                d += w * (((m + c - 1) % bs + k) // bs)
        self.need_now += d
        self.clock = c + k

    def _pop_finished(self) -> list[Request]:
        h, clock = self.fheap, self.clock
        out = []
        while h:
            e = h[0]
            if e[2] != e[3].cver:
                heapq.heappop(h)
            elif e[0] == clock:
                heapq.heappop(h)
                out.append(e[3])
            else:
                break
        return out

    def _k_complete(self) -> int:
        h = self.fheap
        while h and h[0][2] != h[0][3].cver:
            heapq.heappop(h)
        return h[0][0] - self.clock

    def _k_memory(self, F: int, kmax: int) -> int:
        """Largest k <= kmax such that the cohort's block needs over k iterations fit in F more
        blocks: the (F+1)-th block crossing ends the run (a decision point evicts there)."""
        n = len(self.cohort)
        bs = self.bs
        if kmax <= 1 or F >= n * ((kmax - 2) // bs + 1):
            return kmax
        c = self.clock
        offs = []
        cnt = self.cnt
        for m in range(bs):
            w = cnt[m]
            if w:
                offs.append((bs - (m + c - 1) % bs, w))
        offs.sort()
        q, rem = divmod(F, n)
        acc = 0
        for o, w in offs:
            acc += w
            if acc > rem:
                k = bs * q + o
                return k if k < kmax else kmax
        raise AssertionError("unreachable")  # pragma: no cover
