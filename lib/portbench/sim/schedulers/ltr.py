"""Learning to rank (Fu et al. NeurIPS'24) with starvation protection, on a learned ranker's scores
(``ltr``) or on the old noisy oracle (``ltr_noisy_oracle``, labelled oracle, not in ``all``)."""

from __future__ import annotations

import numpy as np

from .base import BaseScheduler, register_scheduler
from .length import frozen_predictions


class _RankPolicy(BaseScheduler):
    """Admission: starving requests first (those waiting, since arrival or their last eviction, for
    at least ``starvation_s`` seconds; oldest first), then by score (lower first). Non-preemptive
    (memory evictions only), like the paper's vLLM integration ranking the waiting queue."""

    vllm_static = True
    static_priority = False
    OPTIONS = {"starvation_s": 10.0, "preemptive": False}

    def _scores(self, ctx) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self, ctx):
        self._score = np.asarray(self._scores(ctx), dtype=float).tolist()

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
