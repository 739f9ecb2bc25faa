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
  FCFS the latest arrival, exactly vLLM's rule) until it fits. Eviction = *recompute* preemption.
* **preemptive policies** (``preemptive = True``) re-rank *all* live requests (running, paused,
  waiting) at every decision point; the batch is the best-ranked prefix that fits. A running
  request that loses its place is **paused**: it keeps its KV blocks and resumes without any
  recomputation -- as long as memory allows. When the requests ranked above it need its memory it
  is **evicted** (recompute; victims chosen by :meth:`BaseScheduler.victim` among the descheduled).
  So "preemption for priority" is free when only batch slots are short and costs a recompute when
  memory is short -- the same two cases a real engine has (pausing costs nothing; swapping is
  not modelled, so recompute is the only way to free memory).
* **prefill** -- ``chunked_prefill = False``: whole prompts, prefill-first (vLLM V0 default): an
  iteration that admits requests prefills their whole prompts (up to the token budget, a longer
  prompt alone) while the running decodes wait one iteration. ``chunked_prefill = True``:
  Sarathi-Serve stall-free batching: every running decode is in every iteration (one budget
  token each), the rest of the token budget goes to prompt chunks in priority order.
* **time-sliced / dynamic policies** (``static_priority = False``): a request's key may change as
  it is served (attained service, quantum, tenant counters) or with time (starvation). Such a
  policy must tell the engine when the ranking may change, through :meth:`next_decision`, so that
  the engine can advance many decode iterations at once in closed form in between. The default
  for a dynamic policy is "after every iteration" (always correct, slower).

Information a policy uses (``information``): ``none`` | ``arrival`` | ``prompt`` (prompt
length) | ``predicted`` (a noisy prediction of the output length) | ``oracle`` (the true output
length) | ``tenant``; policies that rank by attained service also observe the tokens generated so
far (runtime state, not a-priori knowledge): ``attained=True`` in :func:`describe`.

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
# fcfs, sarathi, sjf_prompt, sjf_oracle, srpt_oracle, sjf_predicted, ltr, mlfq, las, rr, edf, vtc, random.
from . import fifo, length, ltr, feedback, deadline, fairness, baseline  # noqa: F401,I001
from .base import (INFORMATION, SCHEDULERS, BaseScheduler, RunContext, Scheduler, get_scheduler, names, options_for,
                   register_scheduler, scheduler_for, table)
from .baseline import RandomOrder
from .deadline import EDF
from .fairness import VTC
from .feedback import LAS, MLFQ, RoundRobin
from .fifo import FCFS, Sarathi
from .length import SJFOracle, SJFPredicted, SJFPrompt, SRPTOracle
from .ltr import LTR
from .vllm import VLLM_STATIC_PRIORITY, static_priority

__all__ = ["EDF", "FCFS", "INFORMATION", "LAS", "LTR", "MLFQ", "SCHEDULERS", "VLLM_STATIC_PRIORITY", "VTC",
           "BaseScheduler", "RandomOrder", "RoundRobin", "RunContext", "SJFOracle", "SJFPredicted", "SJFPrompt",
           "SRPTOracle", "Sarathi", "Scheduler", "get_scheduler", "names", "options_for", "register_scheduler",
           "scheduler_for", "static_priority", "table"]
