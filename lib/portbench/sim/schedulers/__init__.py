"""The scheduling policies behind one protocol, and the scheduler registry.

How the simulator uses a scheduler (priority, admission, preemption, batching, dynamic and static
policies), the contract a plug-in policy is checked against, and the kinds of information a policy
may use are documented once, in :mod:`portbench.sim.schedulers.base`; the engine model in
:mod:`portbench.sim.engine`. ``portbench schedulers`` lists the registered policies.

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

# Importing the policy modules registers the built-in policies, in this order (the order of `all`):
# fcfs, sarathi, sjf_prompt, sjf_oracle, srpt_oracle, sjf_predicted, ltr, mlfq, las, rr, edf, vtc, random
# (plus the comparison variants sjf_noisy_oracle, ltr_noisy_oracle, edf_oracle, edf_noisy_oracle, registered but not
# in `all`).
from . import fifo, length, ltr, feedback, deadline, fairness, baseline  # noqa: F401,I001
from .base import (INFORMATION, SCHEDULERS, BaseScheduler, RunContext, Scheduler, get_scheduler, names, options_for,
                   register_scheduler, require_registered, scheduler_for, table)
from .baseline import RandomOrder
from .deadline import EDF, EDFNoisyOracle, EDFOracle
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

__all__ = ["EDF", "EDFNoisyOracle", "EDFOracle", "LTRNoisyOracle", "SJFNoisyOracle", "frozen_predictions", "uses", "FCFS", "INFORMATION", "LAS", "LTR", "MLFQ", "SCHEDULERS", "VLLM_STATIC_PRIORITY", "VTC",
           "BaseScheduler", "RandomOrder", "RoundRobin", "RunContext", "SJFOracle", "SJFPredicted", "SJFPrompt",
           "SRPTOracle", "Sarathi", "Scheduler", "get_scheduler", "names", "options_for", "register_scheduler",
           "require_registered", "scheduler_for", "static_priority", "table"]
