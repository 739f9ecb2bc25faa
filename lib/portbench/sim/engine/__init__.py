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

**Context limits (as vLLM applies them).** The profile's ``max_model_len``: a request whose prompt
has ``max_model_len`` tokens or more is *refused* at arrival (vLLM returns an error; counted in
``refused`` and ``rejected``), and every output is clipped to ``max_model_len − prompt`` tokens
(``clipped``; records keep the trace's value in ``trace_output_tokens``). A request whose
ceil((P + O)/16) blocks exceed the whole cache can never run and is *rejected* at arrival.

**KV cache (paged).** Block size and capacity from the profile. A request holds
``ceil(kv_tokens / block_size)`` blocks, allocated when the iteration that writes them is
scheduled: a decoding request with g tokens generated holds ceil((P + g)/16) blocks while its
next decode iteration runs (prompt + all generated tokens, the last of which that iteration
writes). Under V1 batching (default) a prompt's blocks are allocated chunk by chunk, and a
waiting request is admitted only when the blocks of its whole current sequence (P + g) fit the
free blocks (vLLM's ``scheduler_reserve_full_isl`` gate -- a check, not a reservation); under V0 a
request admitted for a prefill gets that prefill's ceil((P + g)/16) blocks at admission.

**Preemption** (the policy picks the victim: see :mod:`portbench.sim.schedulers`; non-preemptive
policies evict only for memory, preemptive ones pause while memory allows and evict when it does
not). *Recompute* (``engine.preemption: recompute``, vLLM V1): an evicted request frees all its
blocks and loses its KV; its generated tokens stay generated (they were streamed to the user, g is
kept), but when it is resumed it must prefill prompt + generated tokens again (target P + g) --
exactly vLLM's recompute. That prefill emits token g + 1, so no decode work is repeated; the lost
work is the recomputed prefill. *Swap* (``swap``): its computed KV blocks are copied to the
profile's host memory over PCIe (``swap_s_per_block`` each, added to the next iteration) and back
when it is resumed, after which it continues where it stopped; when host memory is full, recompute.
An evicted request goes back to the waiting queue in the policy's order (under FCFS: the front,
as vLLM puts it). Under V1 no request is admitted in an iteration in which one was preempted.

**Batch formation** at each decision point (:meth:`_Engine._plan`), ``engine.batching``:

* ``v1`` (default; vLLM V1's ``Scheduler.schedule`` for every policy): a token budget per
  iteration (vLLM's ``max_num_batched_tokens``: the profile's ``max_batched_tokens``, or the
  scheduler's own ``prefill_token_budget`` -- Sarathi-Serve's 512 for ``sarathi``). Running
  requests first: every decode (one token each), then the rest of a started prompt chunked to the
  budget left; then waiting requests in the policy's order, each getting a chunk of what is left,
  while slots (``max_num_seqs``), the admission gate and the budget allow (the first that does not
  fit stops admission). Prompts are never prefilled in iterations of their own: decodes never stall
  for longer than one budget's chunk.
* ``v0`` (vLLM V0, the sensitivity case): whole-prompt policies run a prefill-only iteration
  whenever they admit requests (decodes wait), batching whole prompts up to
  :func:`whole_prefill_budget` tokens (vLLM: max(max_model_len, 2048); a longer prompt is
  prefilled alone); policies with ``chunked_prefill`` (Sarathi-Serve) batch as under V1.

**Iteration cost.** ``iteration_time(P, B, C, A)``: P prompt tokens, B decodes, C context tokens
(decode attention reads the KV: linear in context), A = Σ over the iteration's prompt chunks of
new × (cached + new) causal token pairs (prefill attention: quadratic in the chunk's context).

**Prefix caching** (``engine.prefix_caching: auto``, V1) for windows whose requests carry prompt
block hashes (column ``block_hashes``, ``simulate(..., hash_block_tokens=...)``): see
:class:`~portbench.sim.engine.memory.PrefixCache` -- cached full blocks are shared, hit tokens
need no prefill, unreferenced cached blocks are evicted LRU.

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
capacity (:class:`~portbench.core.errors.ConservationError` otherwise); ``check_invariants=True``
recomputes every incremental structure (decode cohort, block counts, prefix-cache reference counts,
host memory of swapped requests, V1's per-chunk allocation) from scratch at every decision point.

**Clock.** The server's clock only takes absolute event times -- an arrival time or the end
``now + dt`` of the iteration it ran -- never SimPy's accumulated clock (adding ``t − now`` to a
clock can round one step below ``t``, and an idle server would then miss the arrival it was woken
for). Counters also report the time-weighted queue length (``queue_mean``, ``queue_p95``: waiting
requests over the observation) and the useful work done (prompt tokens computed for the first time +
tokens generated; by given times with ``work_marks``), from which the campaign derives utilisation.

Determinism: the only randomness is ``numpy.random.default_rng(seed)`` handed to the scheduler;
ties are broken by request id (= window row). Same inputs -> identical outputs.

The package: :mod:`.core` (the engine's state and SimPy processes), :mod:`.state` (that state declared once,
for the type checker: every attribute the parts share), :mod:`.memory` (the decode cohort's
KV blocks, the prefix cache), :mod:`.queues` (waiting queue, admission, recompute and swap preemption),
:mod:`.batching` (batch formation, V1 and V0), :mod:`.iteration` (iterations and closed-form decode runs),
:mod:`.simulate` (the entry point), :mod:`.compiled` (the same loop compiled with numba, bit-identical;
``engine.core``).
"""

from ..request import FINISHED, NOT_ARRIVED, PAUSED, REJECTED, RUNNING, STATE_NAMES, WAITING, Request
from .core import Engine
from .modes import WHOLE_PREFILL_TOKENS, BatchingMode, V0Batching, V1Batching, batching_mode, whole_prefill_budget
from .simulate import RECORD_COLUMNS, SimResult, queue_stats, simulate

__all__ = ["FINISHED", "NOT_ARRIVED", "PAUSED", "RECORD_COLUMNS", "REJECTED", "RUNNING", "STATE_NAMES",
           "WAITING", "WHOLE_PREFILL_TOKENS", "BatchingMode", "Engine", "Request", "SimResult", "V0Batching",
           "V1Batching", "batching_mode", "queue_stats", "simulate", "whole_prefill_budget"]
