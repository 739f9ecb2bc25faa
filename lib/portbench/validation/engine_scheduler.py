"""The wall-clock replay's shared engine scheduler: per-request policy keys (the older path) + step records.

Selected through ``AsyncEngineArgs(scheduler_cls="portbench.validation.engine_scheduler.PortbenchScheduler",
scheduling_policy="priority")`` by :mod:`.replay` (one engine shared by every policy, request ids naming the
policy). Being replaced by the exported classes (:mod:`portbench.vllm`, ``engine_args(policy, options)``): the
virtual engine and the conformance check already run those; the step records are their mixin
(:class:`portbench.vllm.records.StepRecords`, ``$PORTBENCH_VLLM_ITERATION_LOG``).

**Decisions (wall-clock replay).** Requests of static policies (fcfs, priority) are scheduled by vLLM's own code,
unchanged. Before each step, requests whose id names a dynamic policy
(:data:`portbench.validation.policies.DYNAMIC_KEYS`) get their priority recomputed; the waiting
heap is re-heapified, the running list sorted by (priority, arrival) (token-budget order), and
the running requests :func:`~portbench.validation.policies.displace` returns are preempted
(recompute). Options of the dynamic policies (e.g. LAS's quantum) come as JSON in
``$PORTBENCH_VLLM_POLICY_OPTIONS``."""

from __future__ import annotations

import heapq
import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler

from ..vllm.records import LOG_ENV, StepRecords
from . import policies

__all__ = ["LOG_ENV", "OPTIONS_ENV", "PortbenchScheduler", "RecordingScheduler"]
OPTIONS_ENV = "PORTBENCH_VLLM_POLICY_OPTIONS"


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


class _PerRequestKeys(Scheduler):
    """vLLM's scheduler + engine-side dynamic policies named by request id (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pb_options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
        self._pb_policy: dict[str, str] = {}

    # ----------------------------------------------------------------- dynamic policies

    def add_request(self, request) -> None:
        pol = policies.policy_of(request.request_id)
        if pol in policies.DYNAMIC_KEYS:
            self._pb_policy[request.request_id] = pol
            request.priority = self._pb_key(request, pol)
        super().add_request(request)

    def _pb_key(self, r, pol: str) -> int:
        return policies.dynamic_key(pol, r.num_output_tokens, r.max_tokens, self._pb_options)

    def _pb_blocks_held(self, r) -> int:
        groups = self.kv_cache_manager.coordinator.get_blocks(r.request_id)
        return len(groups[0]) if groups else 0

    def _pb_rekey(self) -> None:
        if not self._pb_policy:
            return
        live = [r for r in (*self.running, *self.waiting) if r.request_id in self._pb_policy]
        if not live:
            return
        for r in live:
            r.priority = self._pb_key(r, self._pb_policy[r.request_id])
        heap = getattr(self.waiting, "_heap", None)
        if heap is not None:
            heapq.heapify(heap)
        self.running.sort(key=lambda r: (r.priority, r.arrival_time))
        if not self.waiting:
            return
        bs = int(self.block_size)
        running, waiting = list(self.running), list(self.waiting)
        free = int(self.kv_cache_manager.block_pool.get_num_free_blocks())
        held = [self._pb_blocks_held(r) for r in running]
        total = free + sum(held)
        items = []
        for r, h in zip(running, held):
            nxt = r.num_computed_tokens + max(1, r.num_tokens - r.num_computed_tokens)
            items.append(policies.Live((r.priority, r.arrival_time, r.request_id),
                                       max(h, _cdiv(min(nxt, self.max_model_len), bs)), True))
        for r in waiting:
            items.append(policies.Live((r.priority, r.arrival_time, r.request_id),
                                       _cdiv(min(r.num_tokens, self.max_model_len), bs), False))
        victims = policies.displace(items, total, int(self.max_num_running_reqs))
        now = time.monotonic()
        for i in victims:
            r = running[i]
            if r.request_id not in self._pb_policy:   # only requests of a dynamic policy are displaced
                continue
            self.running.remove(r)
            self._preempt_request(r, now)
            self.pb_displaced += 1
        if victims and heap is not None:
            heapq.heapify(heap)

    def _free_request(self, request, *args, **kwargs):
        self._pb_policy.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)

    def schedule(self, *args, **kwargs):
        self._pb_rekey()
        return super().schedule(*args, **kwargs)


class PortbenchScheduler(StepRecords, _PerRequestKeys):
    """The replay's shared engine scheduler: step records + per-request dynamic keys."""


RecordingScheduler = PortbenchScheduler   # the name earlier versions used
