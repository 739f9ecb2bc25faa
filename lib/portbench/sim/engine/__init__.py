"""SimPy model of one continuously-batched, paged-KV LLM serving replica (vLLM-like).

The model
---------
**Requests.** Each window row is a request: arrival, prompt tokens P, output tokens O, tenant.
State: ``generated`` g (tokens streamed so far), ``prefilled`` (tokens of the current prefill
already computed), ``prefill_target``, KV ``blocks`` held, first-token time, finish time,
preemption (eviction) count. A request is *waiting* (no KV), *running* (in the batch, holds KV),
*paused* (descheduled by a preemptive policy, still holds KV), *finished* or *rejected*.

**Iterations and tokens.** One iteration = one forward pass over the batch. A prefill of the
request's known tokens produces the next token at the end of the iteration that completes it:
a fresh request prefills its P prompt tokens and emits token 1 (its first token, TTFT). Each
decode iteration feeds the last generated token and emits one more; a request finishes when
g = O (a fresh request needs 1 prefill + O − 1 decode iterations). Iteration time comes from
the profile: ``iteration_time(prefill_tokens, decode_seqs, context_tokens)`` with
context_tokens = Σ over the iteration's sequences of their KV tokens *after* the iteration
(decode: P + g with g counted before it; prefill chunk: tokens prefilled so far incl. the chunk).

**KV cache (paged).** Block size and capacity from the profile. A request holds
``ceil(kv_tokens / block_size)`` blocks, allocated when the iteration that writes them is
scheduled: a decoding request with g tokens generated holds ceil((P + g)/16) blocks while its
next decode iteration runs (prompt + all generated tokens, the last of which that iteration
writes). A request admitted for a prefill (of P + g tokens) gets that prefill's
ceil((P + g)/16) blocks at admission, also when the prefill is chunked (vLLM allocates the
prompt's blocks when it first schedules it), so a chunked prefill never runs out of memory
halfway. In both cases blocks = ceil((prompt + generated tokens known)/16). A request whose
ceil((P + O)/16) exceeds the whole cache can never run and is *rejected* at arrival (counted).

**Preemption by recompute** (vLLM's default): an evicted request frees all its blocks and loses
its KV; its generated tokens stay generated (they were streamed to the user, g is kept), but when
it is resumed it must prefill prompt + generated tokens again (target P + g) -- exactly vLLM's
recompute, which re-runs the prompt and the output so far as one prefill. That prefill emits
token g + 1, so no decode work is repeated; the lost work is the recomputed prefill.
Which request is evicted, and whether a running request may be descheduled for priority, is the
policy's choice: see :mod:`portbench.sim.schedulers` (non-preemptive policies evict only for
memory; preemptive ones pause while memory allows and evict when it does not).

**Batch formation** at each decision point (:meth:`_Engine._plan`): ``max_num_seqs`` slots,
KV capacity, and a prefill token budget (the scheduler's ``prefill_token_budget`` option, else
the vLLM default of each mode). Whole-prompt policies (vLLM V0 default) run a prefill-only
iteration whenever they admit requests (decodes wait), batching whole prompts up to
:func:`whole_prefill_budget` tokens (vLLM: max(max_model_len, 2048); a longer prompt is
prefilled alone); chunked policies (Sarathi-Serve) put every running decode in every iteration
and fill the rest of the profile's ``max_batched_tokens`` with prompt chunks (the budget must
exceed ``max_num_seqs``).

**Speed.** Between decision points -- an arrival that could change the batch, a completion, a
KV-block boundary that would overflow the cache, a quantum/ranking change announced by the
policy (``next_decision``), the horizon -- a decode-only batch is fixed, so k iterations are
advanced at once in closed form: with n decodes and first-iteration context C,
``T(k) = k·iteration_time(0, n, C) + c_kv·n·k(k−1)/2`` (= k(c0 + c_d·n + c_kv·C) + … for the
linear model; any term that depends only on the batch composition, like the profiles' roofline
floor, is constant over the run); the k at which an arrival, a time-based decision or the
horizon falls solves this quadratic; the memory boundary comes from the members' block phases
(the (F+1)-th block crossing, F = free blocks). The decoding requests are kept as a *cohort*
relative to a shared iteration clock, so a decision of a non-preemptive policy costs
O(log n), not O(n) (see :class:`_Engine`). An arrival that cannot change the batch (static
non-preemptive policy, head of the queue blocked, the newcomer ranked behind it) is not a
decision point. SimPy drives an arrival process and a server process; the arithmetic between
events is plain Python. ``naive=True`` re-decides after every single iteration and computes each
with ``profile.iteration_time`` -- the test reference of the closed form (same records up to
float rounding; this also checks that every policy announces its ranking changes).

**Horizon.** The run stops at ``horizon_s``: an iteration that would end after it is not run.
Requests not finished are *unfinished*; requests arriving after the horizon are not *arrived*
(they stay in the records with NaN times; metrics ignore them). Every run checks
``arrived == completed + unfinished + rejected`` and that KV blocks in use never exceed the
capacity (:class:`~portbench.core.errors.ConservationError` otherwise).

Determinism: the only randomness is ``numpy.random.default_rng(seed)`` handed to the scheduler;
ties are broken by request id (= window row). Same inputs -> identical outputs.

The package: :mod:`.core` (the engine's state and SimPy processes), :mod:`.memory` (the decode cohort's
KV blocks), :mod:`.queues` (waiting queue, admission, recompute preemption), :mod:`.batching` (batch
formation), :mod:`.iteration` (iterations and closed-form decode runs), :mod:`.simulate` (the entry point).
"""

from ..request import FINISHED, NOT_ARRIVED, PAUSED, REJECTED, RUNNING, STATE_NAMES, WAITING, Request
from .core import WHOLE_PREFILL_TOKENS, Engine, whole_prefill_budget
from .simulate import RECORD_COLUMNS, SimResult, simulate

__all__ = ["FINISHED", "NOT_ARRIVED", "PAUSED", "RECORD_COLUMNS", "REJECTED", "RUNNING", "STATE_NAMES",
           "WAITING", "WHOLE_PREFILL_TOKENS", "Engine", "Request", "SimResult", "simulate", "whole_prefill_budget"]
