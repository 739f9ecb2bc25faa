"""Length-based policies: shortest prompt, shortest (oracle or predicted) output, SRPT."""

from __future__ import annotations

import numpy as np

from .base import BaseScheduler, _StaticPolicy, register_scheduler

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

    Predictor: predicted = true output × exp(N(0, sigma)) (seeded, one draw per request at the
    start of the run; ``sigma`` = ``simulation.predictor_sigma``). Key: (predicted, arrival).
    Information: predicted output length. Models: length-prediction schedulers (S3, Jin et al.
    NeurIPS'23; Qiu et al. 2024 "Efficient interactive LLM serving with proxy model-based
    sequence length prediction").
    """

    name = "sjf_predicted"
    vllm_static = True
    information = "predicted"
    models = "SJF on predicted length (S3, Jin et al. NeurIPS'23; Qiu et al. 2024)"
    OPTIONS = {"sigma": 0.5}

    def reset(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        self._pred = (np.asarray(ctx.output_tokens, dtype=float) * np.exp(self.sigma * noise)).tolist()

    def priority(self, r, now):
        return (self._pred[r.id], r.arrival_s)
