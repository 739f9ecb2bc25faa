"""First come, first served (vLLM's default) and Sarathi-Serve's stall-free chunked prefill."""

from __future__ import annotations

from .base import _StaticPolicy, register_scheduler

@register_scheduler
class FCFS(_StaticPolicy):
    """First come, first served -- vLLM's default scheduler.

    Rule: admit in arrival order; whole-prompt prefill-first iterations; when the KV cache runs
    out, evict (recompute) the latest-arriving running request. Information: arrival order.
    Models: vLLM (Kwon et al., SOSP'23) default FCFS policy (V0 scheduler, no chunked prefill).
    """

    name = "fcfs"
    information = "arrival"
    models = "vLLM default (Kwon et al. SOSP'23): FCFS, prefill-first, recompute the latest arrival"


@register_scheduler
class Sarathi(FCFS):
    """Sarathi-Serve stall-free batching: chunked prefill under a token budget, decodes first.

    Rule: every iteration carries every running decode (one budget token each) and fills the
    rest of ``max_batched_tokens`` with prompt chunks in FCFS order (ongoing prefills first, then
    new admissions); decodes never stall behind a long prompt. Victim: latest arrival.
    Information: arrival order. Models: Agrawal et al., "Taming Throughput-Latency Tradeoff in
    LLM Inference with Sarathi-Serve", OSDI'24 (= vLLM with chunked prefill).
    """

    name = "sarathi"
    information = "arrival"
    models = "Sarathi-Serve (Agrawal et al. OSDI'24): stall-free chunked prefill, FCFS"
    chunked_prefill = True
