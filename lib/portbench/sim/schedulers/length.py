"""Length-based policies: shortest prompt, shortest (oracle or predicted) output, SRPT.

``sjf_predicted`` reads only the window's frozen predictions (:attr:`RunContext.predicted_output`,
from :mod:`portbench.data.predictors`); ``sjf_noisy_oracle`` is the old noisy oracle (true length x
log-normal noise), kept for comparison, labelled oracle and not in ``all``.
"""

from __future__ import annotations

import numpy as np

from ...core.errors import DataError
from .base import BaseScheduler, _StaticPolicy, register_scheduler


def frozen_predictions(ctx, policy: str, column: str = "predicted_output") -> np.ndarray:
    """The window's frozen predictions ``column`` from the run context; DataError when the run was
    not given them (the campaign adds them; elsewhere use ``portbench.data.predictors.attach``)."""
    v = getattr(ctx, column, None)
    if v is None:
        raise DataError("window", f"{policy} needs the window's frozen predictions (column {column!r} of the "
                        "table given to simulate); the campaign adds them -- elsewhere call "
                        "portbench.data.predictors.attach(cfg.data, cfg.predictors, tables, manifest=manifest)", column=column)
    return np.asarray(v, dtype=float)

@register_scheduler
class SJFPrompt(_StaticPolicy):
    """Shortest prompt first (non-preemptive). Key: (prompt tokens, arrival).

    Information: prompt length (known at arrival). Models: the classic SJF baseline with the only
    length an engine sees for free; expressible as a vLLM static priority.
    """

    name = "sjf_prompt"
    vllm_static = True
    information = "prompt"
    models = "SJF on prompt length (baseline; vLLM static priority)"

    def priority(self, r, now):
        return (r.prompt_tokens, r.arrival_s)


@register_scheduler
class SJFOracle(_StaticPolicy):
    """Shortest job first by the *true* output length (non-preemptive). Key: (output, arrival).

    Information: oracle output length (an upper bound of what length prediction can achieve).
    Models: the oracle SJF used as the ideal in S3 (Jin et al. NeurIPS'23) and LTR (Fu et al.).
    """

    name = "sjf_oracle"
    vllm_static = True
    information = "oracle"
    models = "oracle SJF (ideal of S3, Jin et al. NeurIPS'23; Fu et al. NeurIPS'24)"

    def priority(self, r, now):
        return (r.output_tokens, r.arrival_s)


@register_scheduler
class SRPTOracle(BaseScheduler):
    """Shortest remaining processing time, preemptive at iteration boundaries.

    Key: (true remaining output tokens = output − generated, arrival). A newly arrived shorter
    request displaces the running request with the most remaining work (pause, or recompute if
    its memory is needed). Information: oracle output length. Models: SRPT (Schrage 1968) as the
    preemptive oracle bound used by FastServe/ Andes-style studies. Keys only decrease while a
    request runs, so the batch never needs a re-decision between events.
    """

    name = "srpt_oracle"
    information = "oracle"
    uses = ("oracle", "attained")
    models = "SRPT with oracle lengths (Schrage 1968), preemptive at iteration boundaries"
    preemptive = True
    static_priority = False
    frozen_waiting_keys = True

    def priority(self, r, now):
        return (r.output_tokens - r.generated, r.arrival_s)

    def next_decision(self, batch, outside, now):
        # a running request's remaining work only decreases: it never falls behind a waiting one
        return (None, None)


@register_scheduler
class SJFPredicted(_StaticPolicy):
    """Shortest *predicted* output first (non-preemptive).

    Predictor: the source's learned regressor (:mod:`portbench.data.predictors`: gradient-boosted
    trees on log output length from arrival-time features, trained on requests outside every frozen
    window), its predictions frozen per window and handed to the run. Key: (predicted, arrival).
    Information: predicted output length. Models: length-prediction schedulers (S3, Jin et al.
    NeurIPS'23; Qiu et al. 2024 "Efficient interactive LLM serving with proxy model-based
    sequence length prediction").
    """

    name = "sjf_predicted"
    vllm_static = True
    information = "predicted"
    uses = ("predicted",)
    models = "SJF on a learned length prediction (S3, Jin et al. NeurIPS'23; Qiu et al. 2024)"

    def reset(self, ctx):
        self._pred = frozen_predictions(ctx, self.name).tolist()

    def priority(self, r, now):
        return (self._pred[r.id], r.arrival_s)


@register_scheduler
class SJFNoisyOracle(_StaticPolicy):
    """The old ``sjf_predicted``: true output × exp(N(0, sigma)) (seeded, one draw per request).

    It reads the true length, so it is an *oracle* (its accuracy is set by ``sigma``, not by what is
    learnable from the workload); kept for comparison with the learned predictor, not in ``all``.
    """

    name = "sjf_noisy_oracle"
    vllm_static = True
    in_all = False
    information = "oracle"
    uses = ("oracle",)
    models = "SJF on a noisy oracle length (true x lognormal noise; the study's former sjf_predicted)"
    OPTIONS = {"sigma": 0.5}

    def reset(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        self._pred = (np.asarray(ctx.output_tokens, dtype=float) * np.exp(self.sigma * noise)).tolist()

    def priority(self, r, now):
        return (self._pred[r.id], r.arrival_s)
