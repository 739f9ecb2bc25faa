"""Attained-service policies: FastServe's skip-join MLFQ, least attained service, round robin."""

from __future__ import annotations

import bisect

import numpy as np

from .base import BaseScheduler, _passing_iterations, register_scheduler

class _LevelPolicy(BaseScheduler):
    """Preemptive policies whose key is (level(generated), arrival) with a non-decreasing level."""

    preemptive = True
    static_priority = False
    frozen_waiting_keys = True
    lazy_keys = True
    attained = True

    def level(self, r) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def tokens_to_level(self, r, level: int) -> int | None:  # pragma: no cover - abstract
        """Tokens r must still generate until level(r) >= level (None: never)."""
        raise NotImplementedError

    def priority(self, r, now):
        return (self.level(r), r.arrival_s)

    def key_change_tokens(self, r):
        return self.tokens_to_level(r, self.level(r) + 1)

    def _iters_until_after(self, m, key):
        (lvl, arr), rid = key
        target = lvl + 1 if (m.arrival_s, m.id) < (arr, rid) else lvl
        return self.tokens_to_level(m, target)

    def next_decision(self, batch, outside, now):
        return (_passing_iterations(self, batch, outside, now, self._iters_until_after), None)


@register_scheduler
class MLFQ(_LevelPolicy):
    """FastServe skip-join multi-level feedback queue (Wu et al., "Fast Distributed Inference
    Serving for Large Language Models", 2023), preemptive, token quanta.

    Levels 0..levels−1; level i has a quantum of ``quantum_tokens``·2^i generated tokens. Skip-join:
    a request enters the highest-priority level whose quantum covers its prefill, measured in
    single-sequence decode iterations of the profile (prefill time / decode time); after using a
    level's quantum it is demoted one level (the last level keeps it). Key: (level, arrival)
    (FCFS within a level). A demoted request is paused (KV kept) if memory allows, else evicted:
    recompute, or -- FastServe's KV swapping -- swap under ``engine.preemption: swap``.
    Information: prompt length (skip-join) and attained service.
    """

    name = "mlfq"
    information = "prompt"
    models = "FastServe skip-join MLFQ (Wu et al. 2023), token-quantum demotion"
    OPTIONS = {"quantum_tokens": 16, "levels": 6}

    def reset(self, ctx):
        p = ctx.profile
        q, L = self.quantum_tokens, self.levels
        prompts = np.asarray(ctx.prompt_tokens, dtype=float)
        prefill_s = (p.prefill_s(prompts) if hasattr(p, "prefill_s")
                     else p.iteration_time(prompts, np.zeros_like(prompts), prompts))
        decode_s = p.iteration_time(np.zeros_like(prompts), np.ones_like(prompts), prompts + 1.0)
        ratio = np.atleast_1d(np.asarray(prefill_s, dtype=float) / np.asarray(decode_s, dtype=float))
        quanta = q * 2.0 ** np.arange(L)
        join = np.searchsorted(quanta, ratio, side="left")      # first level whose quantum >= ratio
        self._join = np.minimum(join, L - 1).astype(int).tolist()
        # cumulative demotion thresholds (tokens generated) for each join level
        self._bounds = []
        for j in range(L):
            b, acc = [], 0
            for i in range(j, L - 1):
                acc += q * 2 ** i
                b.append(acc)
            self._bounds.append(b)

    def level(self, r) -> int:
        j = self._join[r.id]
        return j + bisect.bisect_right(self._bounds[j], r.generated)

    def priority(self, r, now):         # (level(r), arrival), inlined: the engine ranks every resident with it
        j = self._join[r.id]
        return (j + bisect.bisect_right(self._bounds[j], r.generated), r.arrival_s)

    def tokens_to_level(self, r, level):
        j = self._join[r.id]
        if level <= j:
            return 0
        b = self._bounds[j]
        idx = level - j - 1
        if idx >= len(b):
            return None
        return max(b[idx] - r.generated, 1)


@register_scheduler
class LAS(_LevelPolicy):
    """Least attained service first, preemptive.

    Key: (generated tokens // quantum_tokens, arrival): the request that has received the least
    service goes first, attained service being counted in quanta so that requests swap at most
    once per quantum (with quantum 1 it would thrash every iteration). A new arrival (0 tokens)
    displaces the most-served running request when it does not fit. Information: attained service
    only (no length knowledge). Models: LAS / foreground-background scheduling (Rai et al.,
    SIGMETRICS'03), the length-agnostic policy behind FastServe/Andes-style schedulers.
    """

    name = "las"
    information = "arrival"
    uses = ("attained",)           # arrival only breaks ties
    models = "least attained service / FB (Rai et al. SIGMETRICS'03), quantised"
    OPTIONS = {"quantum_tokens": 32}
    quantum_tokens: int

    def level(self, r) -> int:
        return r.generated // self.quantum_tokens

    def priority(self, r, now):         # (level(r), arrival), inlined
        return (r.generated // self.quantum_tokens, r.arrival_s)

    def tokens_to_level(self, r, level):
        return max(level * self.quantum_tokens - r.generated, 1) if level > self.level(r) else 0


@register_scheduler
class RoundRobin(BaseScheduler):
    """Round robin with a token quantum, preemptive (time slicing when the batch is full).

    A cyclic queue: a request's key is the time it (re)joined the tail of the queue -- its arrival,
    then the end of the iteration in which it used up a quantum of ``quantum_tokens`` tokens
    (counted from the start of its current turn). While every live request fits in the batch the
    order is irrelevant; when some cannot run, a request whose quantum expires goes behind every
    request already queued, and is paused (KV kept) or evicted (recompute) if the memory it holds
    is needed. Information: arrival order and attained service.
    Models: processor-sharing / round-robin baselines of LLM serving (e.g. FastServe's RR).
    """

    name = "rr"
    information = "arrival"
    models = "round robin, token quantum (time slicing baseline)"
    attained = True
    preemptive = True
    static_priority = False
    frozen_waiting_keys = True
    lazy_keys = True
    OPTIONS = {"quantum_tokens": 64}

    def reset(self, ctx):
        self._tau = np.asarray(ctx.arrival_s, dtype=float).tolist()
        self._turn = [0] * ctx.n

    def priority(self, r, now):
        return (self._tau[r.id], r.arrival_s)

    def key_change_tokens(self, r):
        return self._turn[r.id] + self.quantum_tokens - r.generated     # its quantum expires (on_tokens)

    def on_tokens(self, batch, k, time_after):
        q = self.quantum_tokens
        for r in batch:
            used = r.generated - self._turn[r.id]
            if used >= q:
                m = used // q
                g_cross = self._turn[r.id] + m * q
                self._turn[r.id] = g_cross
                self._tau[r.id] = time_after(g_cross - (r.generated - k))

    def next_decision(self, batch, outside, now):
        q = self.quantum_tokens

        def until(m, key):  # expiry moves m behind everything queued before now
            return self._turn[m.id] + q - m.generated

        return (_passing_iterations(self, batch, outside, now, until), None)
