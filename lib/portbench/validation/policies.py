"""How each portbench scheduler runs inside one vLLM engine (importable without vLLM).

Every policy of the validation runs on **one** engine instance, started with
``scheduling_policy="priority"`` and :class:`.engine_scheduler.PortbenchScheduler` as its
``scheduler_cls`` (vLLM's V1 scheduler, unchanged for static policies). A request says which
policy it belongs to through its request id, ``"<policy>/<tag>/<row>"`` (:func:`request_id`), so
the windows of every policy can be interleaved on the same engine:

* ``fcfs`` -- every request has priority 0: vLLM's priority heap then orders by arrival time and,
  when the KV cache runs out, preempts the running request with the latest arrival
  (``max(running, key=(priority, arrival_time))``) -- vLLM's FCFS rules, and the simulator's;
* **static** policies (``schedulers.VLLM_STATIC_PRIORITY``: sjf_prompt, sjf_oracle,
  sjf_predicted, edf, ltr, random) -- the request's priority is its rank under the scheduler's
  static key (:func:`portbench.sim.schedulers.static_priority`, same seed as the simulation);
* **dynamic** policies (:data:`DYNAMIC_KEYS`: ``las``, ``srpt_oracle``) -- the scheduler subclass
  recomputes every live request's priority before each step from the request's own state
  (tokens generated, ``max_tokens``), re-sorts the waiting heap and the running list, and
  *preempts*: when a waiting request ranks above running ones and does not fit the KV cache (or a
  batch slot), the worst-ranked running requests are preempted by recompute until it fits --
  :func:`displace` walks the ranking exactly as the simulator's preemptive batch planner does
  (``sim.engine.batching._plan_preemptive``), except that a descheduled request is always
  recomputed (vLLM cannot pause a request and keep its KV), which is the simulator's behaviour
  whenever memory is what is short.

Everything else (MLFQ, RR, VTC, sarathi) is ``excluded`` from the wall-clock replay's shared engine with the
reason (:func:`engine_policy`). The virtual engine (:mod:`.virtual`) runs every built-in policy
(:func:`virtual_mode`): through the exported classes (:mod:`portbench.vllm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..sim import schedulers

ID_SEP = "/"

# Dynamic policies the engine-side scheduler implements: key(tokens generated, max_tokens, options).
# Ties are broken by vLLM's (arrival_time, request_id), the simulator's (arrival, id).
DYNAMIC_KEYS: dict[str, Callable[[int, int, dict], int]] = {
    # least attained service, in quanta of generated tokens (sim.schedulers.LAS)
    "las": lambda generated, max_tokens, o: generated // int(o.get("quantum_tokens", 32)),
    # shortest remaining processing time with the true output length (sim.schedulers.SRPTOracle)
    "srpt_oracle": lambda generated, max_tokens, o: max_tokens - generated,
}
QUANTUM_OPTIONS = {"las": ("quantum_tokens",), "mlfq": ("quantum_tokens",), "rr": ("quantum_tokens",)}
# Policies the virtual engine (validation/virtual.py) runs through the simulator's own policy object
# (portbench.vllm.driver.PolicyDriver); the wall-clock replay's shared engine runs only what engine_policy() says.
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
    return "excluded"   # token-valued options (scaled with the tokens)

EXCLUDED_REASON = {   # on the wall-clock replay's shared engine; the virtual engine runs all of them (virtual_mode)
    "sarathi": "under vLLM V1 it is FCFS with Sarathi's small chunk budget, an engine-wide setting: it runs on an "
               "engine instance of its own (validation cases) and on the virtual engine",
    "mlfq": "runs on the virtual vLLM engine (the simulator's policy object inside vLLM's scheduler); not on the "
            "wall-clock replay's shared engine",
    "rr": "runs on the virtual vLLM engine (the simulator's policy object inside vLLM's scheduler); not on the "
          "wall-clock replay's shared engine",
    "vtc": "runs on the virtual vLLM engine (the simulator's policy object inside vLLM's scheduler); not on the "
           "wall-clock replay's shared engine",
}


@dataclass(frozen=True)
class EnginePolicy:
    """How a portbench scheduler runs in the engine: ``mode`` is ``fcfs`` (priority 0),
    ``priority`` (static rank as the request's priority), ``dynamic`` (engine-side keys and
    preemption, :data:`DYNAMIC_KEYS`) or ``excluded``."""

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
    if name in DYNAMIC_KEYS:
        return EnginePolicy(name, "dynamic", "PortbenchScheduler re-keys every live request before each step "
                            "and preempts (recompute) running requests for better-ranked waiting ones")
    why = EXCLUDED_REASON.get(name, "not a static per-request order and not ported to the engine-side scheduler")
    return EnginePolicy(name, "excluded", why)


def runnable(name: str) -> bool:
    """True when the validation engine can run scheduler ``name``."""
    return engine_policy(name).mode != "excluded"


def request_id(policy: str, tag: str, row: int) -> str:
    """The engine request id of window row ``row`` replayed under ``policy`` (``tag``: the replay)."""
    if ID_SEP in policy or ID_SEP in tag:
        raise ValueError(f"policy and tag must not contain {ID_SEP!r}: {policy!r}, {tag!r}")
    return f"{policy}{ID_SEP}{tag}{ID_SEP}{row}"


def policy_of(req_id: str) -> str:
    """The policy a request id names ("" when it names none)."""
    head, sep, _ = req_id.partition(ID_SEP)
    return head if sep else ""


def dynamic_key(policy: str, generated: int, max_tokens: int, options: dict | None = None) -> int | None:
    """The engine-side priority of a request of a dynamic policy (None for other policies)."""
    f = DYNAMIC_KEYS.get(policy)
    return None if f is None else int(f(int(generated), int(max_tokens), (options or {}).get(policy, {})))


@dataclass(frozen=True)
class Live:
    """One live request as :func:`displace` sees it: ``key`` (lower = first), ``blocks`` its KV
    blocks if placed this step (held + what this step adds; for a waiting request those of its
    whole current sequence, vLLM's admission gate), ``running``."""

    key: tuple
    blocks: int
    running: bool


def displace(live: Sequence[Live], total_blocks: int, slots: int) -> list[int]:
    """Indices of running requests to preempt so that better-ranked waiting ones can run.

    The simulator's preemptive planner: walk every live request in key order; a waiting request is
    placed when a slot is free and its blocks fit what the requests placed before it left
    (``total_blocks`` minus theirs), else admission stops (head-of-line: later waiting requests are
    not placed); a running request is placed when it fits, else it is displaced. Running requests
    are displaced only when a waiting request was placed ahead of them -- a shortage among running
    requests alone is vLLM's own preemption (it happens inside ``schedule()``). Returned worst-ranked
    first.
    """
    order = sorted(range(len(live)), key=lambda i: live[i].key)
    used = placed = 0
    hol = False
    admitted_ahead = False
    out: list[int] = []
    for i in order:
        r = live[i]
        if not r.running:
            if hol:
                continue
            if placed < slots and used + r.blocks <= total_blocks:
                used += r.blocks
                placed += 1
                admitted_ahead = True
            else:
                hol = True
            continue
        if (placed < slots and used + r.blocks <= total_blocks) or not admitted_ahead:
            used += r.blocks      # kept (a shortage among running requests alone is vLLM's to resolve)
            placed += 1
        else:
            out.append(i)
    return sorted(out, key=lambda i: live[i].key, reverse=True)
