"""Random admission order: the null baseline."""

from __future__ import annotations

from .base import _StaticPolicy, register_scheduler

@register_scheduler
class RandomOrder(_StaticPolicy):
    """Random admission order (seeded; one uniform draw per request at the start of the run).

    The null baseline: any policy that cannot beat it on a metric has no signal there.
    Information: none. Expressible as a vLLM static priority.
    """

    name = "random"
    vllm_static = True
    information = "none"
    models = "random order (null baseline)"

    def reset(self, ctx):
        self._u = ctx.rng.random(ctx.n).tolist()

    def priority(self, r, now):
        return self._u[r.id]
