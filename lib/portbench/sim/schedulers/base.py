"""The protocol every scheduling policy follows, the base class and the scheduler registry.

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
* **dynamic policies** (the default, ``static_priority = False``): a request's key may change as
  it is served (attained service, quantum, tenant counters) or with time (aging, starvation). Such
  a policy tells the engine when the ranking may change, through :meth:`next_decision`, so that
  the engine can advance many decode iterations at once in closed form in between. The default
  for a dynamic policy is "after every iteration" (always correct, slower).
* **static policies** declare ``static_priority = True``: the key depends on the request only (never
  on ``now`` or on its progress), so each request is ranked once, at arrival. The engine checks the
  declaration (the key at arrival, 1 s and 1 h later must agree; :mod:`portbench.sim.engine.contract`).

**The contract.** Every hook result of a plug-in policy (a class defined outside portbench) is
checked on every call; a breach -- a None / NaN / non-comparable priority, an admission order
yielding a request that is not waiting, a victim that is not a candidate, a malformed
``next_decision`` -- is one :class:`~portbench.core.errors.SchedulerError` naming the policy, the hook,
the request and the rule. A non-preemptive policy that overrides :meth:`admission_order` is admitted
in that order; a preemptive one ranks by :meth:`priority` and may not override it.

Information a policy uses (``information``, its main kind): ``none`` | ``arrival`` | ``prompt``
(prompt length) | ``predicted`` (the window's frozen learned prediction of the output length) |
``oracle`` (the true output length) | ``tenant`` | ``attained`` (tokens generated so far: runtime
state, not a-priori knowledge). ``uses`` (a tuple of those kinds) lists everything a policy's
decisions read (ties are broken by arrival everywhere); by default ``(information,)`` plus
``attained`` when ``attained=True``. Only policies named ``*_oracle`` read a true output length;
``edf_oracle``, ``edf_noisy_oracle``, ``sjf_noisy_oracle`` and ``ltr_noisy_oracle`` are comparison variants outside
``all``.

The protocol, the base class and the registry live here; one small module per policy family
(:mod:`.fifo`, :mod:`.length`, :mod:`.ltr`, :mod:`.feedback`, :mod:`.deadline`, :mod:`.fairness`,
:mod:`.baseline`) registers the built-in policies (``portbench schedulers`` lists them).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Protocol, runtime_checkable

from ...core.config import SimulationConfig
from ...core.errors import ParameterError, UnknownSchedulerError
from ..request import Request, RunContext

INFORMATION = ("none", "arrival", "prompt", "predicted", "oracle", "tenant", "attained")


@runtime_checkable
class Scheduler(Protocol):
    """What the simulator needs from a scheduling policy (implemented by :class:`BaseScheduler`).

    Class attributes: ``name`` (registry name), ``information`` (one of :data:`INFORMATION`),
    ``models`` (paper/system it models), ``preemptive``, ``chunked_prefill``, ``static_priority``,
    ``frozen_waiting_keys`` (a waiting request's priority does not change while it waits: the
    engine may cache it -- SRPT, LAS, MLFQ, RR).
    Hooks are called by the engine in simulated time order; ``now`` is the decision time.
    """

    name: str
    information: str
    models: str
    preemptive: bool
    chunked_prefill: bool
    static_priority: bool
    prefill_token_budget: int | None

    def reset(self, ctx: RunContext) -> None: ...
    def priority(self, r: Request, now: float) -> Any: ...
    def admission_order(self, waiting: list[Request], now: float) -> Iterable[Request]: ...
    def victim(self, candidates: list[Request], now: float) -> Request: ...
    def next_decision(self, batch: list[Request], outside: list[Request], now: float
                      ) -> tuple[int | None, float | None]: ...
    def on_arrival(self, r: Request, now: float) -> None: ...
    def on_admit(self, r: Request, now: float) -> None: ...
    def on_tokens(self, batch: list[Request], k: int, time_after: Callable[[int], float]) -> None: ...
    def on_evict(self, r: Request, now: float) -> None: ...
    def on_finish(self, r: Request, now: float) -> None: ...


class BaseScheduler:
    """Defaults of the :class:`Scheduler` protocol (FCFS-like); subclass and override.

    Options are keyword arguments declared in ``OPTIONS`` (``{name: default}``, merged along
    the class hierarchy); :func:`get_scheduler` passes ``simulation.scheduler_options[name]``.
    Every class accepts ``prefill_token_budget`` (tokens per iteration; None: the engine's default
    -- the profile's ``max_batched_tokens`` under V1 batching or for chunked prefill, vLLM's
    max(max_model_len, 2048) for whole prompts under V0) and ``chunked_prefill`` (None: the class's
    mode; true/false switches it under ``engine.batching: v0``; V1 always chunks). An instance is reusable: :meth:`reset` is called at the start of every run.

    Request attributes a policy may read (see :class:`portbench.sim.engine.Request`): ``id``,
    ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (the truth -- only ``oracle`` policies
    should read it), ``tenant``, ``generated`` (tokens generated so far), ``resident`` (holds KV),
    ``running``, ``preemptions``, ``waiting_since`` (arrival or last eviction time).
    """

    name: ClassVar[str] = ""
    information: ClassVar[str] = "arrival"
    models: ClassVar[str] = ""
    attained: ClassVar[bool] = False          # ranks by attained service (runtime observation)
    preemptive: bool = False
    chunked_prefill: bool = False
    static_priority: ClassVar[bool] = False   # True: priority(r, now) depends only on r (never on now or state);
                                              # declared by static policies, checked by the engine
    frozen_waiting_keys: ClassVar[bool] = False  # a waiting request's priority does not change while it waits
    lazy_keys: ClassVar[bool] = False            # built-in preemptive policies: keys change only as a request
                                                 # generates tokens, after key_change_tokens(r) of them
    prefill_token_budget: int | None = None
    vllm_static: ClassVar[bool] = False        # vLLM can run it as a static per-request priority
    OPTIONS: ClassVar[dict[str, Any]] = {"prefill_token_budget": None, "chunked_prefill": None}

    def __init__(self, **options):
        allowed = self.option_defaults()
        for key in options:
            if key not in allowed:
                raise ParameterError(f"simulation.scheduler_options.{self.name}", key,
                                     "one of " + ", ".join(sorted(allowed)) if allowed else "no options")
        merged = {**allowed, **options}
        for key, value in merged.items():
            self._check_option(key, value)
            if key == "chunked_prefill" and value is None:
                continue   # keep the class's prefill mode
            setattr(self, key, value)
        self.options = dict(options)

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            out.update(getattr(klass, "OPTIONS", {}) or {})
        return out

    def _check_option(self, key: str, value) -> None:
        param = f"simulation.scheduler_options.{self.name}.{key}"
        if key == "prefill_token_budget":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ParameterError(param, value, "null or a positive integer (tokens per iteration)")
        elif key == "chunked_prefill":
            if value is not None and not isinstance(value, bool):
                raise ParameterError(param, value, "null (the policy's mode), true or false")
        elif key == "preemptive":
            if not isinstance(value, bool):
                raise ParameterError(param, value, "true or false")
        elif key in ("quantum_tokens", "levels", "w_prompt", "w_output"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ParameterError(param, value, "a positive integer")
        elif key in ("sigma",):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ParameterError(param, value, "a number >= 0")
        elif key in ("starvation_s",):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ParameterError(param, value, "null or a number of seconds > 0")

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"

    # -- the protocol -----------------------------------------------------------------------

    def reset(self, ctx: RunContext) -> None:
        """Start of a run: draw the run's random numbers from ``ctx.rng``, clear per-run state."""

    def priority(self, r: Request, now: float) -> Any:
        """Sort key of ``r`` at time ``now``; lower = served first. Default: arrival time (FCFS)."""
        return r.arrival_s

    def static_key(self, r: Request):
        """The request's static priority (what :func:`static_priority` exports to vLLM)."""
        return self.priority(r, r.arrival_s)

    def admission_order(self, waiting: list[Request], now: float) -> Iterable[Request]:
        """Waiting requests in admission order (default: by priority, ties by id). May be a
        generator: the engine calls :meth:`on_admit` for each admitted request before it asks
        for the next one, and stops at the first that does not fit."""
        return sorted(waiting, key=lambda r: (self.priority(r, now), r.id))

    def victim(self, candidates: list[Request], now: float) -> Request:
        """The request to evict (recompute) when memory is short. Default: the worst priority
        (largest key, then the latest id) -- vLLM's rule for FCFS and for its priority policy."""
        return max(candidates, key=lambda r: (self.priority(r, now), r.id))

    def next_decision(self, batch: list[Request], outside: list[Request], now: float
                      ) -> tuple[int | None, float | None]:
        """When may the ranking between ``batch`` (the requests decoding now) and ``outside`` (live
        requests not in the batch) change if nothing else happens? Returns ``(iterations, time)``:
        after that many decode iterations of the unchanged batch, and/or at that absolute time
        (None = never). Called only when some live request is outside the batch. Static
        priorities never change: (None, None). Dynamic default: (1, None), i.e. re-decide after
        every iteration (always correct)."""
        return (None, None) if self.static_priority else (1, None)

    def key_change_tokens(self, r: Request) -> int | None:
        """(``lazy_keys`` policies) How many more tokens ``r`` can generate before its priority may change
        (>= 1; None: never by generating). The engine then re-ranks only the requests that reached
        their change, instead of every resident at every decision."""
        return 1

    def on_arrival(self, r: Request, now: float) -> None:
        """``r`` entered the waiting queue (``now`` = the first decision point at or after its arrival)."""

    def on_admit(self, r: Request, now: float) -> None:
        """``r`` (waiting) was admitted: its prefill (first, or recompute after eviction) starts."""

    def on_tokens(self, batch: list[Request], k: int, time_after: Callable[[int], float]) -> None:
        """Each request of ``batch`` generated ``k`` tokens in ``k`` iterations (its ``generated``
        is already updated); ``time_after(i)`` = end time of the i-th of them (1 <= i <= k)."""

    def on_evict(self, r: Request, now: float) -> None:
        """``r`` was evicted (KV freed, back to waiting, prefill of prompt+generated to redo)."""

    def on_finish(self, r: Request, now: float) -> None:
        """``r`` generated its last token."""


def _passing_iterations(sched: BaseScheduler, batch, outside, now, iters_until_after) -> int | None:
    """Fewest decode iterations after which some member of ``batch`` ranks after an ``outside``
    request it now ranks before (keys of outside requests are fixed while they wait).

    ``iters_until_after(m, key)`` = iterations until member m's (priority, id) exceeds ``key``
    (None: never). Only the next outside key above each member matters.
    """
    if not outside or not batch:
        return None
    # the engine keeps each live request's last (priority, id) in ``key``; keys of requests
    # outside the batch do not change while they wait (``frozen_waiting_keys``)
    okeys = sorted([x.key if x.key is not None else (sched.priority(x, now), x.id) for x in outside])
    best = None
    for m in batch:
        km = (sched.priority(m, now), m.id)
        i = bisect.bisect_right(okeys, km)
        if i == len(okeys):
            continue
        k = iters_until_after(m, okeys[i])
        if k is not None and (best is None or k < best):
            best = k
    return best


SCHEDULERS: dict[str, type[BaseScheduler]] = {}


def register_scheduler(cls_or_name=None, cls=None, *, name: str | None = None, replace: bool = False):
    """Register a scheduler class under its ``name`` (or ``name=``). Usable as

    ``@register_scheduler``, ``@register_scheduler(name="x")``, ``register_scheduler(MyClass)``
    or ``register_scheduler("x", MyClass)``. Re-registering a name with a different class needs
    ``replace=True``. Returns the class.
    """
    if isinstance(cls_or_name, str):
        name, cls_or_name = cls_or_name, cls

    def _register(klass):
        key = name or getattr(klass, "name", "")
        if not key or not isinstance(key, str):
            raise ParameterError("scheduler name", key, "a non-empty string (class attribute `name`)")
        missing = [a for a in ("priority", "admission_order", "victim", "next_decision", "reset",
                               "on_arrival", "on_admit", "on_tokens", "on_evict", "on_finish")
                   if not callable(getattr(klass, a, None))]
        if missing:
            raise ParameterError(f"scheduler {key}", klass.__name__,
                                 "a class implementing the Scheduler protocol (subclass BaseScheduler); "
                                 f"missing {missing}")
        info = getattr(klass, "information", None)
        if info not in INFORMATION:
            raise ParameterError(f"scheduler {key}.information", info, "one of " + ", ".join(INFORMATION))
        old = SCHEDULERS.get(key)
        if old is not None and old is not klass and not replace and \
                (old.__module__, old.__qualname__) != (klass.__module__, klass.__qualname__):
            raise ParameterError("scheduler name", key, "a name not registered yet (or replace=True)")
        if getattr(klass, "name", None) != key:
            klass.name = key
        SCHEDULERS[key] = klass
        return klass

    if cls_or_name is None:
        return _register
    return _register(cls_or_name)


def get_scheduler(name, **options) -> BaseScheduler:
    """A fresh instance of the registered scheduler ``name`` with ``options``.

    Unknown name -> ``ParameterError("simulation.schedulers", name, "one of ...")``; an unknown
    option -> ParameterError naming ``simulation.scheduler_options.<name>``.
    """
    if isinstance(name, BaseScheduler) or (not isinstance(name, str) and isinstance(name, Scheduler)):
        if options:
            raise ParameterError("scheduler", name, "a name when options are given")
        return name  # type: ignore[return-value]  # a Scheduler-protocol instance passes as it is
    require_registered("simulation.schedulers", name)
    return SCHEDULERS[name](**options)


def options_for(sim: SimulationConfig, name: str) -> dict:
    """Keyword options of scheduler ``name`` from the ``simulation`` section: ``scheduler_options[name]``,
    plus ``sigma = predictor_sigma`` for classes with a ``sigma`` option and ``slo = slo[edf_slo]``
    for classes with an ``slo`` option (unless set explicitly). The campaign calls this for every run."""
    opts = dict(sim.scheduler_options.get(name) or {})
    require_registered("simulation.schedulers", name)
    cls = SCHEDULERS[name]
    defaults = cls.option_defaults() if hasattr(cls, "option_defaults") else {}
    if "sigma" in defaults and "sigma" not in opts and sim.predictor_sigma is not None:
        opts["sigma"] = sim.predictor_sigma
    if "slo" in defaults and "slo" not in opts and sim.edf_slo_dict is not None:
        opts["slo"] = sim.edf_slo_dict
    return opts


def scheduler_for(sim: SimulationConfig, name: str) -> BaseScheduler:
    """``get_scheduler(name, **options_for(sim, name))``."""
    return get_scheduler(name, **options_for(sim, name))


def require_registered(param: str, name) -> None:
    """UnknownSchedulerError ("scheduler X is not registered; load its plug-in ...") unless ``name`` is registered."""
    if not isinstance(name, str) or name not in SCHEDULERS:
        raise UnknownSchedulerError(param, name, list(SCHEDULERS))


def names(spec) -> list[str]:
    """Registered scheduler names of a ``simulation.schedulers`` value (``all`` = every registered one
    except the comparison variants marked ``in_all = False``: edf_oracle, sjf/ltr_noisy_oracle)."""
    if spec == "all" or spec is None:
        return [n for n, c in SCHEDULERS.items() if getattr(c, "in_all", True)]
    spec = [spec] if isinstance(spec, str) else list(spec)
    for i, name in enumerate(spec):
        require_registered(f"simulation.schedulers[{i}]", name)
    return spec


def table() -> list[dict]:
    """One row per registered scheduler: name, information, attained, preemptive, token budget (V1:
    its own or the engine's default), prefill under V0 batching (whole or chunked), models."""
    rows = []
    for name, cls in SCHEDULERS.items():
        inst: Any
        try:
            inst = cls()
        except Exception:  # a user class with required options
            inst = cls
        rows.append({"name": name, "information": cls.information,
                     "attained": bool(getattr(cls, "attained", False)),
                     "preemptive": bool(getattr(inst, "preemptive", False)),
                     "token_budget": getattr(inst, "prefill_token_budget", None) or "engine default",
                     "prefill": "chunked" if getattr(inst, "chunked_prefill", False) else "whole",
                     "static": bool(getattr(cls, "static_priority", False)),
                     "vllm_static_priority": bool(getattr(cls, "vllm_static", False)),
                     "models": getattr(cls, "models", "")})
    return rows


class _StaticPolicy(BaseScheduler):
    """Static-priority policies. By default they are what vLLM V1's ``scheduling_policy=
    "priority"`` does: the waiting queue is ordered by the priority and, when a running request
    cannot get its next KV block, the running request with the worst priority is evicted -- no
    preemption for priority alone. Option ``preemptive: true`` also evicts/pauses running requests
    for a better-ranked waiting one (vLLM V0's priority preemption)."""

    static_priority = True
    OPTIONS = {"preemptive": False}
