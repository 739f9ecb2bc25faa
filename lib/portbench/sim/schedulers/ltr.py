"""Learning to rank (Fu et al. NeurIPS'24) with starvation protection, on a learned ranker's scores
(``ltr``) or on the old noisy oracle (``ltr_noisy_oracle``, labelled oracle, not in ``all``)."""

from __future__ import annotations

import bisect

import numpy as np

from .base import BaseScheduler, register_scheduler
from .length import frozen_predictions


class _RankPolicy(BaseScheduler):
    """Admission: starving requests first (those waiting, since arrival or their last eviction, for
    at least ``starvation_s`` seconds; oldest first), then by score (lower first). Non-preemptive
    (memory evictions only), like the paper's vLLM integration ranking the waiting queue.

    The waiting queue is kept in two sorted lists, by (waiting since, id) and by (score, id), updated by
    the arrival / eviction / admission hooks, so a decision costs O(log n + requests looked at), not a
    sort of the whole queue (the same order as sorting by :meth:`priority`)."""

    vllm_static = True
    static_priority = False
    admission_by_priority = True        # admission_order is the priority order, computed incrementally
    OPTIONS = {"starvation_s": 10.0, "preemptive": False}
    starvation_s: float | None

    def _scores(self, ctx) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self, ctx):
        self._score = np.asarray(self._scores(ctx), dtype=float).tolist()
        self._by_ws: list = []          # (waiting_since, id, r) of every waiting request, sorted
        self._by_score: list = []       # (score, id, r), sorted

    # -- the waiting queue (the engine's waiting requests are exactly these) -------------------------------

    def on_arrival(self, r, now):
        bisect.insort(self._by_ws, (r.waiting_since, r.id, r))
        bisect.insort(self._by_score, (self._score[r.id], r.id, r))

    on_evict = on_arrival              # back in the queue, waiting since its eviction

    def on_admit(self, r, now):
        for lst, k in ((self._by_ws, r.waiting_since), (self._by_score, self._score[r.id])):
            i = bisect.bisect_left(lst, (k, r.id))
            if i == len(lst) or lst[i][2] is not r:      # pragma: no cover - the hooks keep the lists exact
                raise RuntimeError(f"{self.name}: request {r.id} admitted but not in the waiting queue")
            del lst[i]

    def admission_order(self, waiting, now):
        if self.preemptive:               # preemptive variant: the engine ranks by priority itself
            yield from super().admission_order(waiting, now)
            return
        s = self.starvation_s
        starving = set()
        if s is not None:
            lst, i = self._by_ws, 0       # oldest first: the starving ones are a prefix
            while i < len(lst):
                e = lst[i]
                if not now >= e[0] + s:
                    break
                starving.add(e[1])
                yield e[2]
                if i < len(lst) and lst[i] is e:     # not admitted (an admitted one left the list)
                    i += 1
        lst, i = self._by_score, 0
        while i < len(lst):
            e = lst[i]
            if e[1] in starving:
                i += 1
                continue
            yield e[2]
            if i < len(lst) and lst[i] is e:
                i += 1

    def _starving(self, r, now) -> bool:
        return self.starvation_s is not None and not r.resident and now >= r.waiting_since + self.starvation_s

    def priority(self, r, now):
        if self._starving(r, now):
            return (0, r.waiting_since)
        return (1, self._score[r.id])

    def static_key(self, r):
        return self._score[r.id]

    def next_decision(self, batch, outside, now):
        """The earliest time a waiting request starts starving (running keys never change)."""
        if self.starvation_s is None:
            return (None, None)
        if self.preemptive:
            t = None
            for x in outside:
                if not x.resident and not self._starving(x, now):
                    tx = x.waiting_since + self.starvation_s
                    if t is None or tx < t:
                        t = tx
            return (None, t)
        s = self.starvation_s
        for ws, _, _ in self._by_ws:        # the oldest waiting request that is not starving yet
            if not now >= ws + s:
                return (None, ws + s)
        return (None, None)


@register_scheduler
class LTR(_RankPolicy):
    """Learning to rank (Fu et al., "Efficient LLM Scheduling by Learning to Rank", NeurIPS'24).

    Score: the source's learned ranker (:mod:`portbench.data.predictors`: LightGBM LambdaRank on
    arrival-time features, trained on requests outside every frozen window to order requests by
    output length), frozen per window (``RunContext.ltr_score``, lower = predicted shorter; only the
    order is used). Starvation protection as in :class:`_RankPolicy`. Information: predicted (rank)
    of the output length, and waiting time for the guard. vLLM static priority exports the score
    without the starvation protection.
    """

    name = "ltr"
    information = "predicted"
    uses = ("predicted", "arrival")
    models = "Learning-to-rank scheduler (Fu et al. NeurIPS'24; LambdaRank ranker) with starvation protection"

    def _scores(self, ctx):
        return frozen_predictions(ctx, self.name, "ltr_score")


@register_scheduler
class LTRNoisyOracle(_RankPolicy):
    """The old ``ltr``: score = log(true output) + N(0, sigma) (seeded). It reads the true length,
    so it is an oracle; kept for comparison, not in ``all``."""

    name = "ltr_noisy_oracle"
    in_all = False
    information = "oracle"
    uses = ("oracle", "arrival")
    models = "LTR on a noisy oracle score (log true length + normal noise; the study's former ltr)"
    OPTIONS = {"sigma": 0.5}

    def _scores(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        return np.log(np.asarray(ctx.output_tokens, dtype=float)) + self.sigma * noise
