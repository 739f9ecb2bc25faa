"""The batching mode (``engine.batching``), chosen once per run: :class:`V1Batching` (vLLM V1, the default)
or :class:`V0Batching` (vLLM V0, the sensitivity case). The engine's planning, admission and iteration
code asks the mode what differs between the two instead of branching on a flag (see
:mod:`portbench.sim.engine`, "Batch formation")."""

from __future__ import annotations

from typing import Any, Protocol

from ..request import Request

WHOLE_PREFILL_TOKENS = 4096


def whole_prefill_budget(profile) -> int:
    """Token budget of a whole-prompt (prefill-first, vLLM V0) iteration: the profile's
    ``max_prefill_tokens`` if it has one, else vLLM's default without chunked prefill,
    ``max_num_batched_tokens = max(max_model_len, 2048)`` (the profile's ``max_model_len``, else its
    provenance's, else :data:`WHOLE_PREFILL_TOKENS` = 4096, Llama-2's context). The profile's
    ``max_batched_tokens`` is the V1 (chunked) budget."""
    v = getattr(profile, "max_prefill_tokens", None)
    if v:
        return int(v)
    mml = int(getattr(profile, "max_model_len", 0) or 0)
    if mml:
        return max(mml, 2048)
    prov = getattr(profile, "provenance", None) or {}
    mml = (prov.get("model_spec") or {}).get("max_model_len") if isinstance(prov, dict) else None
    return max(int(mml), 2048) if mml else WHOLE_PREFILL_TOKENS


class AdmissionState(Protocol):
    """What a mode reads and changes of the engine when it admits a request (the engine is one)."""

    bs: int
    B: int
    pc_on: bool
    eb: int
    Hb: int
    pc_query_tokens: int
    pc_hit_tokens: int

    def _pc_hit(self, r: Request, tokens: int) -> tuple[int, int]: ...
    def _pc_take(self, r: Request, h: int) -> None: ...
    def _pc_register(self, r: Request, upto: int) -> None: ...


class BatchingMode:
    """What a batching mode decides (the two modes below fill it in).

    * ``name``: the ``engine.batching`` value.
    * ``chunked``: prompts are chunked to the token budget and share iterations with decodes (V1: every
      policy; V0: only policies with ``chunked_prefill``, Sarathi-Serve); otherwise a whole-prompt
      prefill-first iteration runs whenever requests are admitted (decodes wait).
    * ``per_chunk``: vLLM V1's scheduler -- a prompt's KV blocks are allocated chunk by chunk (V0: the whole
      prefill's blocks at admission); a running request whose blocks do not fit and is itself the victim
      stops the scheduling of those after it; no request is admitted in a step in which one was preempted;
      preemptive policies use the ranked plan; automatic prefix caching exists.
    """

    name: str
    chunked: bool
    per_chunk: bool

    def token_budget(self, sched: Any, profile: Any) -> int:
        """Tokens per iteration: the scheduler's own ``prefill_token_budget`` (Sarathi-Serve's 512), else the
        profile's ``max_batched_tokens`` when chunked, else :func:`whole_prefill_budget`."""
        budget = getattr(sched, "prefill_token_budget", None)
        if budget is None:
            budget = profile.max_batched_tokens if self.chunked else whole_prefill_budget(profile)
        return int(budget)

    def max_seqs(self, profile: Any, budget: int) -> int:
        """Running sequences at most: the profile's ``max_num_seqs``; when chunked, every running decode takes
        one budget token (vLLM requires max_num_batched_tokens >= max_num_seqs), so a smaller budget caps it."""
        n = int(profile.max_num_seqs)
        return min(n, budget) if self.chunked else n

    def prefill_blocks_tokens(self, r: Request, chunk: int) -> int:
        """Tokens whose KV blocks a request in prefill holds when ``chunk`` more of its prompt is scheduled."""
        raise NotImplementedError

    def prefill_chunk(self, left: int, budget_left: int, pf_tokens: int, admitted: int, whole_budget: int) -> int | None:
        """This iteration's tokens of a prompt with ``left`` tokens still to prefill (no prefix-cache hit), or None
        when it cannot start now: chunked, up to the token budget left (None when none is); whole, all of it,
        None when it would join admitted prefills (``admitted``, ``pf_tokens`` tokens) beyond ``whole_budget``
        (a longer prompt is prefilled alone)."""
        if self.chunked:
            c = left if left < budget_left else budget_left
            return c if c > 0 else None
        return None if admitted and pf_tokens + left > whole_budget else left

    def fresh_need(self, eng: AdmissionState, r: Request, target: int, budget_left: int, pf_tokens: int,
                   admitted: int, free: int) -> int | None:
        """:meth:`Queues._admit_need` for a request that is not swapped out (current sequence ``target``
        tokens): the blocks its admission adds, or None; sets ``r.chunk`` and ``r.hit``."""
        raise NotImplementedError

    def fresh_admit(self, eng: AdmissionState, r: Request, target: int) -> None:
        """:meth:`Queues._admit` for a request that is not swapped out: its prefill progress and blocks."""
        raise NotImplementedError


class V1Batching(BatchingMode):
    """vLLM V1's ``Scheduler.schedule`` for every policy (default): a token budget per iteration, running
    requests first (every decode, then the rest of a started prompt, chunked), then waiting requests in the
    policy's order, each getting a chunk of what is left; blocks allocated per chunk behind the admission gate
    (the blocks of the whole current sequence must fit the free blocks)."""

    name = "v1"
    chunked = True
    per_chunk = True

    def prefill_blocks_tokens(self, r: Request, chunk: int) -> int:
        return r.prefilled + chunk

    def fresh_need(self, eng: AdmissionState, r: Request, target: int, budget_left: int, pf_tokens: int,
                   admitted: int, free: int) -> int | None:
        bs = eng.bs
        h = nfree = 0
        pc_on = eng.pc_on
        if pc_on:
            h, nfree = eng._pc_hit(r, target)
        eb = eng.eb if pc_on else 0
        cached = h * eb * bs
        if (target + bs - 1) // bs - h * eb + nfree * eb > free:
            return None
        c = target - cached
        if c > budget_left:
            c = budget_left
        if c <= 0:
            return None
        r.chunk = c
        r.hit = h
        return (c + bs - 1) // bs + nfree * eb

    def fresh_admit(self, eng: AdmissionState, r: Request, target: int) -> None:
        cached = 0
        if eng.pc_on:
            cached = r.hit * eng.Hb
            eng.pc_query_tokens += target
            eng.pc_hit_tokens += cached
            if r.hit:
                eng._pc_take(r, r.hit)
            eng._pc_register(r, cached + r.chunk)
        r.prefilled = cached
        if cached > r.high:
            r.high = cached
        r.blocks = (cached + r.chunk + eng.bs - 1) // eng.bs


class V0Batching(BatchingMode):
    """vLLM V0 (the sensitivity case): whole-prompt policies run a prefill-only iteration whenever they admit
    requests, batching whole prompts up to the budget (a longer prompt is prefilled alone); policies with
    ``chunked_prefill`` chunk as under V1. A request admitted for a prefill gets that prefill's blocks at
    admission."""

    name = "v0"
    per_chunk = False

    def __init__(self, chunked: bool):
        self.chunked = chunked

    def prefill_blocks_tokens(self, r: Request, chunk: int) -> int:
        return r.prefill_target

    def fresh_need(self, eng: AdmissionState, r: Request, target: int, budget_left: int, pf_tokens: int,
                   admitted: int, free: int) -> int | None:
        c = self.prefill_chunk(target, budget_left, pf_tokens, admitted, eng.B)
        if c is None:
            return None
        r.chunk = c
        r.hit = 0
        need = (target + eng.bs - 1) // eng.bs
        return need if need <= free else None

    def fresh_admit(self, eng: AdmissionState, r: Request, target: int) -> None:
        r.prefilled = 0
        r.blocks = (target + eng.bs - 1) // eng.bs


def batching_mode(batching: str, sched: Any) -> BatchingMode:
    """The mode of ``engine.batching`` for scheduler ``sched`` (V0 chunks only a policy with ``chunked_prefill``)."""
    if batching == "v1":
        return V1Batching()
    return V0Batching(bool(getattr(sched, "chunked_prefill", False)))
