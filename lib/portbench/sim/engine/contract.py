"""The scheduler contract, checked: every hook result a policy returns is checked before the engine
uses it, and a breach is one :class:`~portbench.core.errors.SchedulerError` naming the policy, the
hook, the request and the rule (never a silent FCFS order, an arbitrary order or an AttributeError).

The rules (see :mod:`portbench.sim.schedulers` for the protocol):

* ``priority(r, now)`` returns a key that orders: a number that is not NaN, a string, or a tuple
  of those; every request's key has the same shape (keys must compare with one another).
* a policy that declares ``static_priority = True`` gives every request the same key whatever
  ``now`` is (:func:`check_static`, run for every policy that declares it, at the start of a run);
* ``admission_order(waiting, now)`` yields only requests of ``waiting``, each at most once;
* ``victim(candidates, now)`` returns one of ``candidates``;
* ``next_decision(...)`` returns ``(iterations or None, time or None)``, an integer and a finite time;
* a preemptive policy ranks every live request by ``priority``: it may not override
  ``admission_order`` (the engine would never call it).

Built-in policies are checked by the test suite (every one runs under :class:`CheckedPolicy`);
campaigns check plug-ins (classes defined outside ``portbench``) on every call.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ...core.errors import SchedulerError
from ..request import STATE_NAMES, WAITING, Request
from ..schedulers import BaseScheduler

PRIORITY_RULE = ("priority(r, now) must return a key that orders requests, lower = served first: a number "
                 "(not NaN), a string, or a tuple of those, of the same shape for every request")
STATIC_RULE = ("a policy that declares static_priority = True must give each request the same priority "
               "whatever `now` is; a key that changes with time needs a dynamic policy (the default: leave "
               "static_priority unset)")
ADMISSION_RULE = "admission_order(waiting, now) may yield only requests of the waiting list it is given, each at most once"
VICTIM_RULE = "victim(candidates, now) must return one of the candidates it is given"
NEXT_RULE = ("next_decision(...) must return (iterations, time): iterations an integer or None, time a finite "
             "number of seconds or None")
PREEMPTIVE_ADMISSION_RULE = ("a preemptive policy ranks every live request by priority(); admission_order is "
                             "never called for it, so it must not be overridden (order admission through "
                             "priority instead)")
# the times at which a declared-static priority is compared with its value at arrival (seconds later)
STATIC_PROBES_S = (1.0, 3600.0)


def policy_name(policy) -> str:
    return str(getattr(policy, "name", None) or type(policy).__name__)


def is_plugin(policy) -> bool:
    """A policy class defined outside the portbench package (checked on every call by default)."""
    return not type(policy).__module__.startswith("portbench.")


def overrides(policy, hook: str) -> bool:
    """``policy`` overrides the base class's ``hook``."""
    base = getattr(BaseScheduler, hook, None)
    own = getattr(type(policy), hook, None)
    return base is not None and own is not None and own is not base


def _shape(key) -> Any:
    """The comparable shape of a valid key, or a problem string."""
    if key is None:
        return "returned None"
    if isinstance(key, bool):
        return "num"
    if isinstance(key, numbers.Real):
        try:
            nan = math.isnan(key)
        except (TypeError, ValueError):
            return f"returned {key!r}, a number that cannot be compared"
        return "returned NaN" if nan else "num"
    if isinstance(key, str):
        return "str"
    if isinstance(key, (tuple, list)):
        parts = []
        for i, x in enumerate(key):
            s = _shape(x)
            if isinstance(s, str) and s.startswith("returned"):
                return f"returned {key!r}, whose element {i} is {'None' if x is None else repr(x)}"
            parts.append(s)
        return tuple(parts)
    return f"returned {key!r} (a {type(key).__name__}, which does not order)"


def _compatible(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return all(_compatible(x, y) for x, y in zip(a, b))
    return a == b


def check_static(policy, reqs: list[Request]) -> list:
    """The declared-static keys ``priority(r, r.arrival_s)``; SchedulerError if one differs at a later time
    (or is not a valid key)."""
    name = policy_name(policy)
    keys, first = [], None
    for r in reqs:
        k0 = policy.priority(r, r.arrival_s)
        first = _check_key(name, "priority", r, k0, first, r.arrival_s)
        for dt in STATIC_PROBES_S:
            k1 = policy.priority(r, r.arrival_s + dt)
            if k1 != k0:
                raise SchedulerError(name, "priority", r.id,
                                     f"declares static_priority = True, but priority(request {r.id}, now) is "
                                     f"{k0!r} at now = {r.arrival_s:g} s (its arrival) and {k1!r} at now = "
                                     f"{r.arrival_s + dt:g} s", STATIC_RULE)
        keys.append(k0)
    return keys


def _check_key(name: str, hook: str, r: Request, key, first, now: float):
    shape = _shape(key)
    if isinstance(shape, str) and shape.startswith("returned"):
        raise SchedulerError(name, hook, r.id, f"{shape} at now = {now:g} s", PRIORITY_RULE)
    if first is not None and not _compatible(first, shape):
        raise SchedulerError(name, hook, r.id, f"returned {key!r} at now = {now:g} s, whose shape differs from "
                             f"the earlier keys' ({_describe(first)}), so they cannot be compared", PRIORITY_RULE)
    return shape if first is None else first


def _describe(shape) -> str:
    if isinstance(shape, tuple):
        return "a tuple of " + ", ".join(_describe(s) for s in shape)
    return {"num": "a number", "str": "a string"}.get(shape, str(shape))


def check_class(policy) -> None:
    """Contract rules that need no call (checked when a run starts)."""
    if bool(getattr(policy, "preemptive", False)) and overrides(policy, "admission_order") \
            and not getattr(policy, "admission_by_priority", False):
        raise SchedulerError(policy_name(policy), "admission_order", None,
                             "is overridden by a preemptive policy", PREEMPTIVE_ADMISSION_RULE)


class CheckedPolicy:
    """A policy whose hook results are checked against the contract (everything else passes through)."""

    def __init__(self, policy):
        self._policy = policy
        self._name = policy_name(policy)
        self._shape = None

    def __getattr__(self, attr):
        return getattr(self._policy, attr)

    @property
    def unwrapped(self):
        return self._policy

    def priority(self, r: Request, now: float):
        key = self._policy.priority(r, now)
        self._shape = _check_key(self._name, "priority", r, key, self._shape, now)
        return key

    def admission_order(self, waiting: list[Request], now: float):
        if not overrides(self._policy, "admission_order"):   # the default, with every key checked
            return sorted(waiting, key=lambda r: (self.priority(r, now), r.id))
        order = self._policy.admission_order(waiting, now)
        if order is None:
            raise SchedulerError(self._name, "admission_order", None, "returned None", ADMISSION_RULE)
        try:
            it = iter(order)
        except TypeError:
            raise SchedulerError(self._name, "admission_order", None,
                                 f"returned a {type(order).__name__}, which is not iterable", ADMISSION_RULE) from None
        return self._checked_order(it, {r.id for r in waiting})

    def _checked_order(self, it, waiting_ids: set):
        seen = set()
        for r in it:
            if not isinstance(r, Request):
                raise SchedulerError(self._name, "admission_order", None,
                                     f"yielded {r!r} (a {type(r).__name__}), not a request", ADMISSION_RULE)
            if r.id in seen:
                raise SchedulerError(self._name, "admission_order", r.id, "yielded the same request twice",
                                     ADMISSION_RULE)
            if r.id not in waiting_ids or r.state != WAITING:
                raise SchedulerError(self._name, "admission_order", r.id,
                                     f"yielded a request that is not waiting (it is {STATE_NAMES.get(r.state, r.state)})",
                                     ADMISSION_RULE)
            seen.add(r.id)
            yield r

    def victim(self, candidates: list[Request], now: float) -> Request:
        if not overrides(self._policy, "victim"):             # the default, with every key checked
            return max(candidates, key=lambda r: (self.priority(r, now), r.id))
        v = self._policy.victim(candidates, now)
        if not any(v is c for c in candidates):
            ids = [c.id for c in candidates]
            shown = ids if len(ids) <= 12 else ids[:12] + ["..."]
            what = "None" if v is None else (f"request {v.id}" if isinstance(v, Request) else repr(v))
            raise SchedulerError(self._name, "victim", getattr(v, "id", None),
                                 f"returned {what} at now = {now:g} s, which is not a candidate (candidates: "
                                 f"requests {shown})", VICTIM_RULE)
        return v

    def next_decision(self, batch, outside, now: float):
        res = self._policy.next_decision(batch, outside, now)
        ok = isinstance(res, tuple) and len(res) == 2
        if ok:
            k, t = res
            ok = (k is None or (isinstance(k, numbers.Integral) and not isinstance(k, bool))) and \
                 (t is None or (isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t)))
        if not ok:
            raise SchedulerError(self._name, "next_decision", None, f"returned {res!r} at now = {now:g} s", NEXT_RULE)
        return res
