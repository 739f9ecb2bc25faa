"""KV memory of the decode cohort: block accounting in closed form (see :mod:`portbench.sim.engine`).

The decoding requests of the current batch advance together, so their state is kept relative to a
shared iteration clock (``generated = gbase + clock``); joining, leaving, advancing k iterations and
finding the iteration at which the cache would overflow cost O(block size), not O(n).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from ...core.config import EngineConfig
from ...core.errors import ParameterError
from ..request import Request
from .state import EngineState


class CohortMemory(EngineState):
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
        if self.lazy_keys:
            self.kdirty.append(r)       # its key may have changed (the token its prefill emitted)

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
        if k == 1:              # one more block for the members whose P + g is a multiple of bs
            self.need_now += cnt[-c % bs]
            self.clock = c + 1
            return
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


class PrefixCache(EngineState):
    """Mixin of :class:`~portbench.sim.engine.core.Engine`: vLLM's automatic prefix caching, for windows
    whose requests carry prompt block hashes (``block_hashes``: one hash per ``hash_block_tokens``
    prompt tokens, chained so that equal hashes mean equal prefixes).

    The unit is a *hash block* of ``Hb`` tokens = ``eb = Hb / block_size`` KV blocks (a trace's hash
    block may be larger than the engine's KV block: Mooncake hashes 512 tokens). An entry is cached
    once some request has computed (scheduled) that full block of its prompt; only full blocks are
    cached. Entries are reference-counted: while a resident references an entry its blocks are
    counted once, however many requests share them; an entry nobody references stays cached but
    counts as free (vLLM's free queue holds such blocks) and is evicted in LRU order -- when a
    request's entries are freed, its last block first -- as soon as the free blocks without a cached
    entry run out. A waiting (new or preempted) request hits the longest run of cached entries from
    its first block, at most ``(tokens − 1) // Hb`` of them (the last token is always recomputed);
    hit tokens need no prefill and no token budget, and touching an unreferenced entry takes its
    blocks out of the free pool. Output tokens are not hashed (the traces hash prompts only).

    Accounting: each resident's ``blocks`` counts all its KV blocks, shared ones included;
    ``cache_adj`` = (blocks of referenced entries) − Σ residents' referenced entry blocks, so KV in
    use = Σ blocks + ``cache_adj`` (<= Σ blocks: sharing saves memory).
    """

    def _init_prefix_cache(self, settings: EngineConfig, reqs: list[Request], hash_block_tokens) -> None:
        self.pc_on = False
        self.cache_adj = 0
        self.pc_ref = 0          # blocks of entries referenced by a resident
        self.pc_shared = 0       # Σ over residents of their referenced entries' blocks
        self.pc_entries: dict = {}
        self.pc_lru: OrderedDict = OrderedDict()
        self.pc_hit_tokens = 0
        self.pc_query_tokens = 0
        self.pc_hashed = any(r.hashes for r in reqs)
        if not self.pc_hashed or settings.prefix_caching == "off" or not self.mode.per_chunk:
            return
        Hb = hash_block_tokens
        if isinstance(Hb, bool) or not isinstance(Hb, int) or Hb <= 0 or Hb % self.bs:
            raise ParameterError("hash_block_tokens", Hb, f"the prompt tokens per block hash of the window's "
                                 f"block_hashes column, a positive multiple of the KV block size {self.bs} "
                                 "(e.g. 512 for Mooncake, 16 for Qwen)")
        self.pc_on = True
        self.Hb = Hb
        self.eb = Hb // self.bs

    def _pc_hit(self, r: Request, tokens: int) -> tuple[int, int]:
        """(entries hit, of which unreferenced) for a waiting request of ``tokens`` tokens."""
        hs = r.hashes
        if not hs:
            return 0, 0
        ent = self.pc_entries
        lim = min(len(hs), (tokens - 1) // self.Hb)
        h = nfree = 0
        while h < lim:
            ref = ent.get(hs[h])
            if ref is None:
                break
            if ref == 0:
                nfree += 1
            h += 1
        return h, nfree

    def _pc_ref(self, hsh) -> None:
        ref = self.pc_entries.get(hsh)
        if ref is None:
            self.pc_entries[hsh] = 1
            self.pc_ref += self.eb
        else:
            if ref == 0:
                del self.pc_lru[hsh]
                self.pc_ref += self.eb
            self.pc_entries[hsh] = ref + 1

    def _pc_take(self, r: Request, h: int) -> None:
        """``r`` (admitted) references its first ``h`` entries (its cache hit)."""
        hs = r.hashes
        for j in range(h):
            self._pc_ref(hs[j])
        r.nshared = h
        self.pc_shared += h * self.eb
        self.cache_adj = self.pc_ref - self.pc_shared

    def _pc_register(self, r: Request, upto: int) -> None:
        """The full hash blocks of ``r``'s prompt within its first ``upto`` tokens (scheduled now) are
        cached (vLLM caches blocks when it schedules them) and referenced by ``r``."""
        hs = r.hashes
        if not hs:
            return
        j, Hb = r.nshared, self.Hb
        n = min(len(hs), upto // Hb)
        if j >= n:
            return
        while j < n:
            self._pc_ref(hs[j])
            j += 1
        self.pc_shared += (j - r.nshared) * self.eb
        r.nshared = j
        self.cache_adj = self.pc_ref - self.pc_shared

    def _pc_release(self, r: Request) -> None:
        """``r`` stops referencing its entries (finished, preempted or swapped out); entries nobody
        references go to the LRU tail, the request's last block first."""
        k = r.nshared
        if not k:
            return
        hs, ent, lru, eb = r.hashes, self.pc_entries, self.pc_lru, self.eb
        for j in range(k - 1, -1, -1):
            hsh = hs[j]
            ref = ent[hsh] - 1
            ent[hsh] = ref
            if ref == 0:
                lru[hsh] = None
                self.pc_ref -= eb
        self.pc_shared -= k * eb
        r.nshared = 0
        self.cache_adj = self.pc_ref - self.pc_shared

    def _pc_reconcile(self) -> None:
        """Evict LRU unreferenced entries while the blocks in use plus the cached free ones exceed the
        cache (what vLLM's allocations since the last decision would have evicted)."""
        lru = self.pc_lru
        if not lru:
            return
        over = (self.need_now + self.other_blocks + self.cache_adj) + self.eb * len(lru) - self.cap
        while over > 0 and lru:
            hsh, _ = lru.popitem(last=False)
            del self.pc_entries[hsh]
            over -= self.eb

    def _pc_reconcile_walk(self, used: int) -> None:
        """:meth:`_pc_reconcile` with the blocks in use given (mid-planning of a preemptive policy)."""
        lru = self.pc_lru
        over = used + self.eb * len(lru) - self.cap
        while over > 0 and lru:
            hsh, _ = lru.popitem(last=False)
            del self.pc_entries[hsh]
            over -= self.eb

    def _check_prefix_cache(self) -> int:
        """Recompute the cache's reference counts from the residents (tests); returns cache_adj."""
        if not self.pc_on:
            assert self.cache_adj == 0
            return 0
        refs: dict = {}
        shared = 0
        for r in self.res.values():
            for hsh in r.hashes[:r.nshared]:
                refs[hsh] = refs.get(hsh, 0) + 1
            shared += r.nshared * self.eb
            assert r.nshared * self.Hb <= max(r.prefilled + r.chunk, r.hit * self.Hb), r
        for hsh, ref in self.pc_entries.items():
            assert ref == refs.get(hsh, 0), (hsh, ref, refs.get(hsh))
            assert (ref == 0) == (hsh in self.pc_lru)
        assert set(refs) <= set(self.pc_entries)
        pool = self.eb * sum(1 for v in self.pc_entries.values() if v > 0)
        assert (pool, shared) == (self.pc_ref, self.pc_shared), (pool, shared, self.pc_ref, self.pc_shared)
        assert self.cache_adj == pool - shared
        return self.cache_adj
