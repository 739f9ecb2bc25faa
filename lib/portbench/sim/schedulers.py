"""The 13 scheduling policies behind one protocol, and the scheduler registry.

How the simulator uses a scheduler (:mod:`portbench.simulator` has the full engine model)
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
module before running it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ..core.errors import ParameterError

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Request

INFORMATION = ("none", "arrival", "prompt", "predicted", "oracle", "tenant")


# --------------------------------------------------------------------------------------------
# Protocol and base class
# --------------------------------------------------------------------------------------------


@dataclass
class RunContext:
    """What a scheduler may look at when a run starts (:meth:`BaseScheduler.reset`).

    Arrays are indexed by request id (= the row of the window table). ``rng`` is the run's only
    source of randomness (``numpy.random.default_rng(seed)``); ``slo`` is the SLO definition the
    run was given (``{"ttft_s", "tpot_s"}``, for deadline-based policies) or None.
    """

    n: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tenant: list
    profile: Any
    rng: np.random.Generator
    slo: Mapping | None = None


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
    for the prefill mode -- the profile's ``max_batched_tokens`` for chunked prefill, vLLM's
    max(max_model_len, 2048) for whole prompts) and ``chunked_prefill`` (None: the class's mode;
    true/false switches it, e.g. ``sjf_oracle`` with chunked prefill is what vLLM V1's priority
    policy does). An instance is reusable: :meth:`reset` is called at the start of every run.

    Request attributes a policy may read (see :class:`portbench.simulator.Request`): ``id``,
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
    static_priority: ClassVar[bool] = True    # priority(r) depends only on r's own static fields + rng
    frozen_waiting_keys: ClassVar[bool] = False  # a waiting request's priority does not change while it waits
    prefill_token_budget: int | None = None
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


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

SCHEDULERS: dict[str, type] = {}


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
        return name
    if name not in SCHEDULERS:
        raise ParameterError("simulation.schedulers", name, "one of " + ", ".join(SCHEDULERS))
    return SCHEDULERS[name](**options)


def options_from_params(P: Mapping, name: str) -> dict:
    """Keyword options of scheduler ``name`` from a parameter set: ``simulation.scheduler_options
    [name]``, plus ``sigma = simulation.predictor_sigma`` for classes with a ``sigma`` option and
    ``slo = simulation.slo[simulation.edf_slo]`` for classes with an ``slo`` option (unless set
    explicitly). The campaign calls this for every run."""
    s = P.get("simulation", {}) or {}
    opts = dict((s.get("scheduler_options") or {}).get(name) or {})
    cls = SCHEDULERS.get(name)
    if cls is None:
        raise ParameterError("simulation.schedulers", name, "one of " + ", ".join(SCHEDULERS))
    defaults = cls.option_defaults() if hasattr(cls, "option_defaults") else {}
    if "sigma" in defaults and "sigma" not in opts and s.get("predictor_sigma") is not None:
        opts["sigma"] = s["predictor_sigma"]
    if "slo" in defaults and "slo" not in opts:
        slo = (s.get("slo") or {}).get(s.get("edf_slo"))
        if slo is not None:
            opts["slo"] = dict(slo)
    return opts


def scheduler_from_params(P: Mapping, name: str) -> BaseScheduler:
    """``get_scheduler(name, **options_from_params(P, name))``."""
    return get_scheduler(name, **options_from_params(P, name))


def table() -> list[dict]:
    """One row per registered scheduler: name, information, attained, preemptive, prefill, models."""
    rows = []
    for name, cls in SCHEDULERS.items():
        try:
            inst = cls()
        except Exception:  # a user class with required options
            inst = cls
        rows.append({"name": name, "information": cls.information,
                     "attained": bool(getattr(cls, "attained", False)),
                     "preemptive": bool(getattr(inst, "preemptive", False)),
                     "prefill": "chunked" if getattr(inst, "chunked_prefill", False) else "whole",
                     "static": bool(getattr(cls, "static_priority", True)),
                     "vllm_static_priority": name in VLLM_STATIC_PRIORITY,
                     "models": getattr(cls, "models", "")})
    return rows


def describe() -> str:
    """Markdown table of the registered schedulers and the information each uses."""
    head = "| scheduler | information used | preemptive | prefill | vLLM static priority | models |"
    lines = [head, "|---|---|---|---|---|---|"]
    for row in table():
        info = row["information"] + (" + attained service" if row["attained"] else "")
        lines.append(f"| {row['name']} | {info} | {'yes' if row['preemptive'] else 'no (memory only)'} | "
                     f"{row['prefill']} | {'yes' if row['vllm_static_priority'] else 'no'} | {row['models']} |")
    lines += ["", "information: none | arrival (order only) | prompt (length) | predicted (noisy output "
              "length) | oracle (true output length) | tenant. Preemption = pause (KV kept) while memory "
              "allows, recompute eviction when memory is short; see portbench.schedulers."]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The 13 policies
# --------------------------------------------------------------------------------------------


class _StaticPolicy(BaseScheduler):
    """Static-priority policies. By default they are what vLLM V1's ``scheduling_policy=
    "priority"`` does: the waiting queue is ordered by the priority and, when a running request
    cannot get its next KV block, the running request with the worst priority is evicted -- no
    preemption for priority alone (V1 always chunks prefills: add ``chunked_prefill: true`` to
    match it). Option ``preemptive: true`` also evicts/pauses running requests for a better-ranked
    waiting one (vLLM V0's priority preemption)."""

    OPTIONS = {"preemptive": False}


@register_scheduler
class FCFS(_StaticPolicy):
    """First come, first served -- vLLM's default scheduler.

    Rule: admit in arrival order; whole-prompt prefill-first iterations; when the KV cache runs
    out, evict (recompute) the latest-arriving running request. Information: arrival order.
    Models: vLLM (Kwon et al., SOSP'23) default FCFS policy (V0 scheduler, no chunked prefill).
    """

    name = "fcfs"
    information = "arrival"
    models = "vLLM default (Kwon et al. SOSP'23): FCFS, prefill-first, recompute the latest arrival"


@register_scheduler
class Sarathi(FCFS):
    """Sarathi-Serve stall-free batching: chunked prefill under a token budget, decodes first.

    Rule: every iteration carries every running decode (one budget token each) and fills the
    rest of ``max_batched_tokens`` with prompt chunks in FCFS order (ongoing prefills first, then
    new admissions); decodes never stall behind a long prompt. Victim: latest arrival.
    Information: arrival order. Models: Agrawal et al., "Taming Throughput-Latency Tradeoff in
    LLM Inference with Sarathi-Serve", OSDI'24 (= vLLM with chunked prefill).
    """

    name = "sarathi"
    information = "arrival"
    models = "Sarathi-Serve (Agrawal et al. OSDI'24): stall-free chunked prefill, FCFS"
    chunked_prefill = True


@register_scheduler
class SJFPrompt(_StaticPolicy):
    """Shortest prompt first (non-preemptive). Key: (prompt tokens, arrival).

    Information: prompt length (known at arrival). Models: the classic SJF baseline with the only
    length an engine sees for free; expressible as a vLLM static priority.
    """

    name = "sjf_prompt"
    information = "prompt"
    models = "SJF on prompt length (baseline; vLLM static priority)"

    def priority(self, r, now):
        return (r.prompt_tokens, r.arrival_s)


@register_scheduler
class SJFOracle(_StaticPolicy):
    """Shortest job first by the *true* output length (non-preemptive). Key: (output, arrival).

    Information: oracle output length (an upper bound of what length prediction can achieve).
    Models: the oracle SJF used as the ideal in S3 (Jin et al. NeurIPS'23) and LTR (Fu et al.).
    """

    name = "sjf_oracle"
    information = "oracle"
    models = "oracle SJF (ideal of S3, Jin et al. NeurIPS'23; Fu et al. NeurIPS'24)"

    def priority(self, r, now):
        return (r.output_tokens, r.arrival_s)


@register_scheduler
class SRPTOracle(BaseScheduler):
    """Shortest remaining processing time, preemptive at iteration boundaries.

    Key: (true remaining output tokens = output − generated, arrival). A newly arrived shorter
    request displaces the running request with the most remaining work (pause, or recompute if
    its memory is needed). Information: oracle output length. Models: SRPT (Schrage 1968) as the
    preemptive oracle bound used by FastServe/ Andes-style studies. Keys only decrease while a
    request runs, so the batch never needs a re-decision between events.
    """

    name = "srpt_oracle"
    information = "oracle"
    models = "SRPT with oracle lengths (Schrage 1968), preemptive at iteration boundaries"
    preemptive = True
    static_priority = False
    frozen_waiting_keys = True

    def priority(self, r, now):
        return (r.output_tokens - r.generated, r.arrival_s)

    def next_decision(self, batch, outside, now):
        # a running request's remaining work only decreases: it never falls behind a waiting one
        return (None, None)


@register_scheduler
class SJFPredicted(_StaticPolicy):
    """Shortest *predicted* output first (non-preemptive).

    Predictor: predicted = true output × exp(N(0, sigma)) (seeded, one draw per request at the
    start of the run; ``sigma`` = ``simulation.predictor_sigma``). Key: (predicted, arrival).
    Information: predicted output length. Models: length-prediction schedulers (S3, Jin et al.
    NeurIPS'23; Qiu et al. 2024 "Efficient interactive LLM serving with proxy model-based
    sequence length prediction").
    """

    name = "sjf_predicted"
    information = "predicted"
    models = "SJF on predicted length (S3, Jin et al. NeurIPS'23; Qiu et al. 2024)"
    OPTIONS = {"sigma": 0.5}

    def reset(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        self._pred = (np.asarray(ctx.output_tokens, dtype=float) * np.exp(self.sigma * noise)).tolist()

    def priority(self, r, now):
        return (self._pred[r.id], r.arrival_s)


@register_scheduler
class LTR(BaseScheduler):
    """Learning to rank (Fu et al., "Efficient LLM Scheduling by Learning to Rank", NeurIPS'24).

    Rank score = log(true output) + N(0, sigma) (a noisy ranker: only the order of scores is
    used; seeded draw per request). Admission: starving requests first (those waiting, since
    arrival or their last eviction, for at least ``starvation_s`` seconds; oldest first), then by
    score. Non-preemptive (memory evictions only), like the paper's vLLM integration ranking the
    waiting queue. Information: predicted (rank) of the output length. vLLM static priority
    exports the score without the starvation protection.
    """

    name = "ltr"
    information = "predicted"
    models = "Learning-to-rank scheduler (Fu et al. NeurIPS'24) with starvation protection"
    static_priority = False
    OPTIONS = {"sigma": 0.5, "starvation_s": 10.0, "preemptive": False}

    def reset(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        self._score = (np.log(np.asarray(ctx.output_tokens, dtype=float)) + self.sigma * noise).tolist()

    def _starving(self, r, now) -> bool:
        return self.starvation_s is not None and not r.resident and now >= r.waiting_since + self.starvation_s

    def priority(self, r, now):
        if self._starving(r, now):
            return (0, r.waiting_since)
        return (1, self._score[r.id])

    def static_key(self, r):
        return self._score[r.id]

    def next_decision(self, batch, outside, now):
        """The earliest time a waiting request starts starving (running keys never change)."""
        if self.starvation_s is None:
            return (None, None)
        t = None
        for x in outside:
            if not x.resident and not self._starving(x, now):
                tx = x.waiting_since + self.starvation_s
                if t is None or tx < t:
                    t = tx
        return (None, t)


class _LevelPolicy(BaseScheduler):
    """Preemptive policies whose key is (level(generated), arrival) with a non-decreasing level."""

    preemptive = True
    static_priority = False
    frozen_waiting_keys = True
    attained = True

    def level(self, r) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def tokens_to_level(self, r, level: int) -> int | None:  # pragma: no cover - abstract
        """Tokens r must still generate until level(r) >= level (None: never)."""
        raise NotImplementedError

    def priority(self, r, now):
        return (self.level(r), r.arrival_s)

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
    (FCFS within a level). FastServe's proactive KV swapping is not modelled: a demoted request
    is paused if memory allows, else evicted (recompute). Information: prompt length (skip-join)
    and attained service.
    """

    name = "mlfq"
    information = "prompt"
    models = "FastServe skip-join MLFQ (Wu et al. 2023), token-quantum demotion"
    OPTIONS = {"quantum_tokens": 16, "levels": 6}

    def reset(self, ctx):
        p = ctx.profile
        q, L = self.quantum_tokens, self.levels
        prompts = np.asarray(ctx.prompt_tokens, dtype=float)
        prefill_s = p.iteration_time(prompts, np.zeros_like(prompts), prompts)
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
    models = "least attained service / FB (Rai et al. SIGMETRICS'03), quantised"
    OPTIONS = {"quantum_tokens": 32}

    def level(self, r) -> int:
        return r.generated // self.quantum_tokens

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
    OPTIONS = {"quantum_tokens": 64}

    def reset(self, ctx):
        self._tau = np.asarray(ctx.arrival_s, dtype=float).tolist()
        self._turn = [0] * ctx.n

    def priority(self, r, now):
        return (self._tau[r.id], r.arrival_s)

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


@register_scheduler
class EDF(_StaticPolicy):
    """Earliest deadline first (non-preemptive by default).

    Deadline = arrival + ttft_s + tpot_s × (output − 1): the latest finish time that meets the
    SLO (``simulation.slo[simulation.edf_slo]``, or option ``slo``) -- it uses the true output
    length (oracle information). Key: (deadline, arrival).
    Models: EDF for LLM SLOs (e.g. the deadline-aware schedulers compared in Andes, Liu et al.
    2024; SLOs-Serve), expressible as a vLLM static priority.
    """

    name = "edf"
    information = "oracle"
    models = "earliest deadline first on the SLO deadline (arrival + TTFT + TPOT·(output−1))"
    OPTIONS = {"slo": None}

    def _check_option(self, key, value):
        if key == "slo" and value is not None:
            _check_slo(f"simulation.scheduler_options.{self.name}.slo", value)
        else:
            super()._check_option(key, value)

    def reset(self, ctx):
        slo = self.slo if self.slo is not None else ctx.slo
        if slo is None:
            raise ParameterError("simulation.edf_slo", None,
                                 "an SLO definition {ttft_s, tpot_s} for edf (simulate(..., slo=...) "
                                 "or option slo)")
        _check_slo("slo", slo)
        self._ttft, self._tpot = float(slo["ttft_s"]), float(slo["tpot_s"])

    def deadline(self, r) -> float:
        return r.arrival_s + self._ttft + self._tpot * (r.output_tokens - 1)

    def priority(self, r, now):
        return (self.deadline(r), r.arrival_s)


def _check_slo(param: str, slo) -> None:
    if not isinstance(slo, Mapping):
        raise ParameterError(param, slo, "a mapping {ttft_s: seconds, tpot_s: seconds}")
    for k in ("ttft_s", "tpot_s"):
        v = slo.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{param}.{k}", v, "a number of seconds > 0")


@register_scheduler
class VTC(BaseScheduler):
    """Virtual token counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24).

    One counter per tenant. Admission: repeatedly take the tenant with the smallest counter among
    tenants with waiting requests and admit its earliest request (stop at the first that does not
    fit); admitting charges ``w_prompt`` × prompt tokens (first admission only), every generated
    token charges ``w_output``. Counter lift: a tenant whose queue was empty is lifted to the
    smallest counter of the backlogged tenants (or of the last tenant that left the queue) when
    its request arrives, so idle time earns no credit. Non-preemptive (memory evictions only: the
    latest arrival). Information: tenant. Weights default to the paper's (1, 2).
    """

    name = "vtc"
    information = "tenant"
    models = "Virtual Token Counter fair scheduling (Sheng et al. OSDI'24)"
    static_priority = False
    OPTIONS = {"w_prompt": 1, "w_output": 2}

    def reset(self, ctx):
        self._counter: dict = {t: 0 for t in sorted(set(ctx.tenant))}
        self._waiting: dict = {t: 0 for t in self._counter}
        self._charged = [False] * ctx.n
        self._last_left = None

    def priority(self, r, now):
        return (self._counter[r.tenant], r.arrival_s)

    def victim(self, candidates, now):
        return max(candidates, key=lambda r: (r.arrival_s, r.id))

    def on_arrival(self, r, now):
        t = r.tenant
        if self._waiting[t] == 0:
            backlogged = [self._counter[u] for u, w in self._waiting.items() if w > 0]
            if backlogged:
                self._counter[t] = max(self._counter[t], min(backlogged))
            elif self._last_left is not None:
                self._counter[t] = max(self._counter[t], self._counter[self._last_left])
        self._waiting[t] += 1

    def on_evict(self, r, now):
        self._waiting[r.tenant] += 1

    def on_admit(self, r, now):
        t = r.tenant
        self._waiting[t] -= 1
        if self._waiting[t] == 0:
            self._last_left = t
        if not self._charged[r.id]:
            self._charged[r.id] = True
            self._counter[t] += self.w_prompt * r.prompt_tokens

    def on_tokens(self, batch, k, time_after):
        c, w = self._counter, self.w_output * k
        for r in batch:
            c[r.tenant] += w

    def admission_order(self, waiting, now) -> Iterator:
        queues: dict = {}
        for r in sorted(waiting, key=lambda r: (r.arrival_s, r.id)):
            queues.setdefault(r.tenant, []).append(r)
        pos = {t: 0 for t in queues}
        while queues:
            t = min(queues, key=lambda u: (self._counter[u], queues[u][pos[u]].arrival_s, queues[u][pos[u]].id))
            r = queues[t][pos[t]]
            pos[t] += 1
            if pos[t] == len(queues[t]):
                del queues[t]
            yield r

    def next_decision(self, batch, outside, now):
        """Iterations until the admission head (tenant with the smallest counter) changes."""
        heads: dict = {}
        for r in outside:
            if r.resident:
                continue
            h = heads.get(r.tenant)
            if h is None or (r.arrival_s, r.id) < (h.arrival_s, h.id):
                heads[r.tenant] = r
        if len(heads) < 2:
            return (None, None)
        n_in: dict = {}
        for r in batch:
            n_in[r.tenant] = n_in.get(r.tenant, 0) + 1
        c = self._counter
        h = min(heads, key=lambda u: (c[u], heads[u].arrival_s, heads[u].id))
        best = None
        for u in heads:
            if u == h:
                continue
            s = self.w_output * (n_in.get(h, 0) - n_in.get(u, 0))
            if s <= 0:
                continue
            du = c[u] - c[h]
            earlier = (heads[u].arrival_s, heads[u].id) < (heads[h].arrival_s, heads[h].id)
            k = max(1, -(-du // s)) if earlier else du // s + 1
            if best is None or k < best:
                best = k
        return (best, None)


@register_scheduler
class RandomOrder(_StaticPolicy):
    """Random admission order (seeded; one uniform draw per request at the start of the run).

    The null baseline: any policy that cannot beat it on a metric has no signal there.
    Information: none. Expressible as a vLLM static priority.
    """

    name = "random"
    information = "none"
    models = "random order (null baseline)"

    def reset(self, ctx):
        self._u = ctx.rng.random(ctx.n).tolist()

    def priority(self, r, now):
        return self._u[r.id]


# The policies vLLM can run through scheduling_policy="priority" (fcfs runs natively).
VLLM_STATIC_PRIORITY = ("sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "ltr", "random")


def static_priority(name: str, window_df, seed: int, *, profile=None, slo=None, **options) -> np.ndarray:
    """vLLM priorities (int64, lower = served first; one per window row) that reproduce the
    simulator's admission order of ``name`` for the same ``seed``: the dense rank of the
    scheduler's static key (ties by row = arrival order). ``ltr`` exports its score (vLLM has no
    starvation protection); ``edf`` needs ``slo`` (or option ``slo``).
    """
    from ..core.errors import check_choice
    from .engine import _requests_from_window

    check_choice("name", name, VLLM_STATIC_PRIORITY)
    sched = get_scheduler(name, **options)
    reqs, ctx = _requests_from_window(window_df, profile, np.random.default_rng(seed), slo)
    sched.reset(ctx)
    keys = [(sched.static_key(r), r.id) for r in reqs]
    order = sorted(range(len(reqs)), key=lambda i: keys[i])
    ranks = np.empty(len(reqs), dtype=np.int64)
    for rank, i in enumerate(order):
        ranks[reqs[i].id] = rank
    return ranks
