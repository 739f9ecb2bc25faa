"""First come, first served (vLLM's default) and Sarathi-Serve's stall-free chunked prefill."""

from __future__ import annotations

from ..profiles.hardware import SARATHI_TOKEN_BUDGET
from operator import attrgetter

from .base import _StaticPolicy, register_scheduler

_arrival = attrgetter("arrival_s")

@register_scheduler
class FCFS(_StaticPolicy):
    """First come, first served -- vLLM's default scheduler.

    Rule: admit in arrival order with vLLM's default token budget per iteration (the profile's
    ``max_batched_tokens``, vLLM's ``max_num_batched_tokens``); when the KV cache runs out, evict
    (recompute) the latest-arriving running request. Under ``engine.batching: v1`` (default) this is
    vLLM V1's scheduler exactly; under ``v0`` it is vLLM V0's prefill-first batching.
    Information: arrival order. Models: vLLM (Kwon et al., SOSP'23) default FCFS policy.
    """

    name = "fcfs"
    information = "arrival"
    models = "vLLM default (Kwon et al. SOSP'23): FCFS, vLLM's token budget, recompute the latest arrival"

    def victim(self, candidates, now):
        """The latest arrival; among equal arrival times the first in running order (``candidates`` come in
        the engine's running order) -- vLLM's ``max(running, key=(priority, arrival_time))``."""
        return max(candidates, key=_arrival)


@register_scheduler
class Sarathi(FCFS):
    """Sarathi-Serve stall-free batching: FCFS with a small chunk budget, decodes first.

    Rule: every iteration carries every running decode (one budget token each) and fills the rest
    of Sarathi-Serve's small token budget (``prefill_token_budget``, default 512 tokens) with prompt
    chunks in FCFS order (ongoing prefills first, then new admissions); decodes never stall behind
    a long prompt chunk. Its identity is the budget: under V1 batching ``fcfs`` runs the same
    batching with vLLM's default budget (2,048 on the A100), so a long prompt stalls decodes four
    times as long; under V0 batching it is the only policy that chunks. Victim: latest arrival.
    Information: arrival order. Models: Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM
    Inference with Sarathi-Serve", OSDI'24.
    """

    name = "sarathi"
    information = "arrival"
    models = "Sarathi-Serve (Agrawal et al. OSDI'24): stall-free chunked prefill, small token budget, FCFS"
    chunked_prefill = True
    OPTIONS = {"prefill_token_budget": SARATHI_TOKEN_BUDGET}
