"""Learning to rank (Fu et al. NeurIPS'24) with starvation protection."""

from __future__ import annotations

import numpy as np

from .base import BaseScheduler, register_scheduler

@register_scheduler
class LTR(BaseScheduler):
    """Learning to rank (Fu et al., "Efficient LLM Scheduling by Learning to Rank", NeurIPS'24).

    Rank score = log(true output) + N(0, sigma) (a noisy ranker: only the order of scores is
    used; seeded draw per request). Admission: starving requests first (those waiting, since
    arrival or their last eviction, for at least ``starvation_s`` seconds; oldest first), then by
    score. Non-preemptive (memory evictions only), like the paper's vLLM integration ranking the
    waiting queue. Information: predicted (rank) of the output length. vLLM static priority
    exports the score without the starvation protection.
    """

    name = "ltr"
    vllm_static = True
    information = "predicted"
    models = "Learning-to-rank scheduler (Fu et al. NeurIPS'24) with starvation protection"
    static_priority = False
    OPTIONS = {"sigma": 0.5, "starvation_s": 10.0, "preemptive": False}

    def reset(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        self._score = (np.log(np.asarray(ctx.output_tokens, dtype=float)) + self.sigma * noise).tolist()

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
        t = None
        for x in outside:
            if not x.resident and not self._starving(x, now):
                tx = x.waiting_since + self.starvation_s
                if t is None or tx < t:
                    t = tx
        return (None, t)
