"""How each portbench scheduler runs inside vLLM (importable without vLLM).

Every policy runs inside vLLM's scheduler, one policy per engine instance (the wall-clock engine,
:mod:`.engine`) or per scheduler instance (the virtual engine, :mod:`.virtual`):

* ``fcfs`` -- every request has priority 0: vLLM's priority heap then orders by arrival time and,
  when the KV cache runs out, preempts the running request with the latest arrival -- vLLM's FCFS rules;
* **static** policies (``schedulers.VLLM_STATIC_PRIORITY``: sjf_prompt, sjf_oracle, sjf_predicted, edf,
  ltr, random) -- the request's priority is its rank under the scheduler's static key
  (:func:`portbench.sim.schedulers.static_priority`, same seed as the simulation);
* ``sarathi`` -- fcfs on an engine of its own with Sarathi-Serve's token budget (an engine-wide setting);
* the policies vLLM lacks (:data:`DRIVEN`: las, srpt_oracle, mlfq, rr, vtc) -- the simulator's own policy
  object inside vLLM's scheduler: the project's ``portbench.vllm`` scheduler classes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sim import schedulers

ID_SEP = "/"
# the planted reversal (validation only, not a study policy): the longest requests (prompt + output tokens) first,
# so the shortest wait -- SJF reversed, whose order against fcfs under load is known on any engine (:mod:`.engine`)
PLANTED = "delay_shortest"
# token-valued options of the policies vLLM lacks (scaled with the tokens)
QUANTUM_OPTIONS = {"las": ("quantum_tokens",), "mlfq": ("quantum_tokens",), "rr": ("quantum_tokens",)}
# Policies the virtual engine (validation/virtual.py) runs through the simulator's own policy object
# (portbench.vllm.driver.PolicyDriver).
DRIVEN = ("las", "srpt_oracle", "mlfq", "rr", "vtc", "ltr")


def virtual_mode(name: str) -> str:
    """How the virtual engine runs scheduler ``name``: ``fcfs`` (priority 0; sarathi on an engine with its own
    budget), ``priority`` (static rank), ``driven`` (the simulator's policy object) or ``excluded``."""
    if name in ("fcfs", "sarathi", "vtc"):
        return "driven" if name == "vtc" else "fcfs"
    if name in DRIVEN:
        return "driven"
    if name in schedulers.VLLM_STATIC_PRIORITY:
        return "priority"
    return "excluded"


@dataclass(frozen=True)
class EnginePolicy:
    """How a portbench scheduler runs in vLLM: ``mode`` is ``fcfs`` (priority 0), ``priority`` (static rank as
    the request's priority), ``budget`` (fcfs on an engine with the policy's own token budget: sarathi),
    ``class`` (the simulator's policy object inside vLLM's scheduler) or ``excluded`` (not a built-in policy)."""

    name: str
    mode: str
    note: str


def engine_policy(name: str) -> EnginePolicy:
    """How scheduler ``name`` runs in vLLM (see the module docstring)."""
    if name == "fcfs":
        return EnginePolicy(name, "fcfs", "every request priority 0: vLLM's priority heap orders by arrival time "
                            "and preempts the latest arrival (vLLM's FCFS rules)")
    if name in schedulers.VLLM_STATIC_PRIORITY:
        return EnginePolicy(name, "priority", "scheduling_policy='priority' with the scheduler's static key "
                            "(schedulers.static_priority, the simulation's seed) as each request's priority")
    if name == PLANTED:
        return EnginePolicy(name, "priority", "the planted reversal: priority = rank of -(prompt + output tokens), "
                            "the longest request first")
    if name == "sarathi":
        return EnginePolicy(name, "budget", "fcfs on an engine instance of its own with Sarathi-Serve's token budget")
    if name in DRIVEN:
        return EnginePolicy(name, "class", "the simulator's policy object inside vLLM's scheduler "
                            "(its portbench.vllm scheduler class)")
    return EnginePolicy(name, "excluded", "not one of the study's built-in policies (plug-ins run on the simulator)")


def runnable(name: str) -> bool:
    """True when vLLM can run scheduler ``name`` (every built-in policy)."""
    return engine_policy(name).mode != "excluded"


def request_id(policy: str, tag: str, row: int) -> str:
    """The engine request id of window row ``row`` replayed under ``policy`` (``tag``: the replay)."""
    if ID_SEP in policy or ID_SEP in tag:
        raise ValueError(f"policy and tag must not contain {ID_SEP!r}: {policy!r}, {tag!r}")
    return f"{policy}{ID_SEP}{tag}{ID_SEP}{row}"
