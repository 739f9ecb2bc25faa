"""The 13 scheduling policies behind one protocol, and the scheduler registry.

How the simulator uses a scheduler (:mod:`portbench.sim.engine` has the full engine model)
----------------------------------------------------------------------------------------
The engine is iteration-level and continuously batched (vLLM-like). At every *decision point*
(an iteration boundary where something changed: arrival, completion, memory, quantum, chunk) it
asks the scheduler which live requests form the next iteration's batch:

* **priority** -- :meth:`BaseScheduler.priority` gives each request a key, *lower = served
  first* (the engine breaks ties by request id, i.e. by arrival order).
* **admission** -- waiting requests are admitted in :meth:`BaseScheduler.admission_order`
  (default: by priority) while they fit (``max_num_seqs`` slots, free KV blocks, the prefill token
  budget); the first one that does not fit stops admission (head-of-line, as vLLM does).
* **non-preemptive policies** (``preemptive = False``) never deschedule a running request except
  for memory: when the running batch's next iteration needs more KV blocks than exist, the engine
  evicts :meth:`BaseScheduler.victim` (default: the running request with the worst priority; for
  FCFS the latest arrival, exactly vLLM's rule) until it fits. Eviction = preemption by *recompute*
  (``engine.preemption: recompute``, vLLM V1) or *swap* (``swap``: KV copied to host memory). As in
  vLLM V1, a waiting request never preempts a running one for priority, and no request is admitted
  in an iteration in which one was preempted.
* **preemptive policies** (``preemptive = True``) re-rank *all* live requests (running, paused,
  waiting) at every decision point; the batch is the best-ranked prefix that fits. A running
  request that loses its place is **paused**: it keeps its KV blocks and resumes without any
  recomputation -- as long as memory allows. When the requests ranked above it need its memory it
  is **evicted** (recompute or swap; victims chosen by :meth:`BaseScheduler.victim` among the
  descheduled). So "preemption for priority" is free when only batch slots are short and costs a
  recompute (or a swap) when memory is short -- the cases a real engine has. (vLLM runs such a
  policy only through a custom scheduler class; this is what one that re-sorts its queues does.)
* **batching** is the engine's, not the policy's (``engine.batching``): under ``v1`` (default,
  vLLM V1) every policy's iteration carries the running decodes first and fills the rest of the
  token budget with prompt chunks in the policy's order; under ``v0`` (vLLM V0) policies prefill
  whole prompts in prefill-only iterations while decodes wait, except those with
  ``chunked_prefill = True`` (``sarathi``), which chunk as under V1. The token budget is the
  scheduler's ``prefill_token_budget`` if set (``sarathi``: Sarathi-Serve's 512), else the
  profile's (vLLM's default ``max_num_batched_tokens``).
* **time-sliced / dynamic policies** (``static_priority = False``): a request's key may change as
  it is served (attained service, quantum, tenant counters) or with time (starvation). Such a
  policy must tell the engine when the ranking may change, through :meth:`next_decision`, so that
  the engine can advance many decode iterations at once in closed form in between. The default
  for a dynamic policy is "after every iteration" (always correct, slower).

Information a policy uses (``information``, and everything its decisions read in ``uses``):
``none`` | ``arrival`` | ``prompt`` (prompt length) | ``predicted`` (the window's frozen learned
prediction of the output length, :mod:`portbench.data.predictors`) | ``oracle`` (the true output
length) | ``tenant`` | ``attained`` (tokens generated so far, runtime state). Only ``*_oracle``
policies read a true output length; ``edf_oracle``, ``sjf_noisy_oracle`` and ``ltr_noisy_oracle``
are comparison variants outside ``all`` (the 13).

Adding a policy
---------------
Subclass :class:`BaseScheduler`, set ``name``/``information``/``models``, override
:meth:`priority` (and whatever else), and register it::

    @register_scheduler
    class LongestPromptFirst(BaseScheduler):
        \"\"\"Longest prompt first (an example).\"\"\"
        name = "lpf"
        information = "prompt"
        models = "example"

        def priority(self, r, now):
            return -r.prompt_tokens

The campaign, the metrics and every analysis then include ``lpf`` with no other change (set
``simulation.schedulers`` to a list with it, or ``all``); a worker process imports the class's
module before running it."""

# Importing the policy modules registers the 13 policies, in this order (the order of `all`):
# fcfs, sarathi, sjf_prompt, sjf_oracle, srpt_oracle, sjf_predicted, ltr, mlfq, las, rr, edf, vtc, random
# (plus the comparison variants sjf_noisy_oracle, ltr_noisy_oracle, edf_oracle, registered but not in `all`).
from . import fifo, length, ltr, feedback, deadline, fairness, baseline  # noqa: F401,I001
from .base import (INFORMATION, SCHEDULERS, BaseScheduler, RunContext, Scheduler, get_scheduler, names, options_for,
                   register_scheduler, require_registered, scheduler_for, table)
from .baseline import RandomOrder
from .deadline import EDF, EDFOracle
from .fairness import VTC
from .feedback import LAS, MLFQ, RoundRobin
from .fifo import FCFS, Sarathi
from .length import SJFNoisyOracle, SJFOracle, SJFPredicted, SJFPrompt, SRPTOracle, frozen_predictions
from .ltr import LTR, LTRNoisyOracle
from .vllm import VLLM_STATIC_PRIORITY, static_priority


def uses(name: str) -> tuple[str, ...]:
    """Every kind of information scheduler ``name``'s decisions read (``uses``, else ``information``
    plus ``attained`` for attained-service policies)."""
    cls = SCHEDULERS[name]
    got = getattr(cls, "uses", None)
    if got:
        return tuple(got)
    return (cls.information,) + (("attained",) if getattr(cls, "attained", False) else ())

__all__ = ["EDF", "EDFOracle", "LTRNoisyOracle", "SJFNoisyOracle", "frozen_predictions", "uses", "FCFS", "INFORMATION", "LAS", "LTR", "MLFQ", "SCHEDULERS", "VLLM_STATIC_PRIORITY", "VTC",
           "BaseScheduler", "RandomOrder", "RoundRobin", "RunContext", "SJFOracle", "SJFPredicted", "SJFPrompt",
           "SRPTOracle", "Sarathi", "Scheduler", "get_scheduler", "names", "options_for", "register_scheduler",
           "require_registered", "scheduler_for", "static_priority", "table"]
