"""vLLM's V1 scheduler with portbench's iteration records and dynamic policies (runs in vLLM's engine process).

Selected through ``AsyncEngineArgs(scheduler_cls="portbench.validation.engine_scheduler.PortbenchScheduler",
scheduling_policy="priority")``. vLLM warns that the scheduler interface is not public; this class
relies on vLLM 0.32's ``Scheduler.schedule()`` / ``update_from_output()`` / ``_preempt_request()``,
the ``running`` list, the priority ``waiting`` queue (``_heap``), ``kv_cache_manager`` (free blocks,
a request's block ids) and the ``Request`` fields ``priority``, ``arrival_time``,
``num_computed_tokens``, ``num_prompt_tokens``, ``num_tokens``, ``num_output_tokens``, ``max_tokens``.

**Two ways in.** In the virtual engine (:mod:`.virtual`, one policy per scheduler instance) the
policy is configured in process (:meth:`PortbenchScheduler.pb_configure`): static policies keep vLLM's
priority queue; every policy vLLM lacks (``policies.DRIVEN``) runs through the simulator's own policy
object (:class:`.policy_driver.PolicyDriver`: the waiting queue, the running list, ``_preempt_request``)
-- the rules the conformance tests hold bit-identical to the simulator. In the wall-clock replay (one
engine shared by every policy, request ids naming the policy) the older per-request keys below apply.

**Decisions (wall-clock replay).** Requests of static policies (fcfs, priority) are scheduled by vLLM's own code,
unchanged. Before each step, requests whose id names a dynamic policy
(:data:`portbench.validation.policies.DYNAMIC_KEYS`) get their priority recomputed; the waiting
heap is re-heapified, the running list sorted by (priority, arrival) (token-budget order), and
the running requests :func:`~portbench.validation.policies.displace` returns are preempted
(recompute). Options of the dynamic policies (e.g. LAS's quantum) come as JSON in
``$PORTBENCH_VLLM_POLICY_OPTIONS``.

**Records** (one JSON line per step with something scheduled, appended to ``$PORTBENCH_VLLM_ITERATION_LOG``;
the first line of each engine is ``{"event": "init", ...}`` with the engine's resolved settings:
KV blocks, block size, token budget, max_num_seqs, max_model_len):

* ``prefill_tokens``: tokens scheduled for requests still in (re)prefill;
* ``decode_seqs``: requests scheduled for exactly one token after their known tokens (decodes);
* ``context_tokens``: KV tokens of every scheduled request after the step (the cost model's C);
* ``attention_pairs``: causal attention pairs of the step's prompt chunks (the cost model's A);
* ``t_start`` (monotonic, start of ``schedule()``), ``model_s`` (to the start of
  ``update_from_output()``), ``iteration_s`` (to its end: when vLLM stamps the step's tokens),
  ``cpu_s`` (this process's CPU time over the same span: wall − CPU = time the OS gave to others),
  ``waiting`` / ``running`` (queue lengths after scheduling), ``free_blocks``, ``preempted``
  (requests preempted in this step, by vLLM or by a dynamic policy), ``displaced`` (of those, by a
  dynamic policy), ``busy_after`` (requests left after the step: the next step follows at once).
"""

from __future__ import annotations

import heapq
import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler

from . import policies

LOG_ENV = "PORTBENCH_VLLM_ITERATION_LOG"
OPTIONS_ENV = "PORTBENCH_VLLM_POLICY_OPTIONS"


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


class PortbenchScheduler(Scheduler):
    """vLLM's scheduler + per-step records + engine-side dynamic policies (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(LOG_ENV)
        self._pb_log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - closed in shutdown
        self._pb_pending = None
        self._pb_options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
        self._pb_policy: dict[str, str] = {}
        self._pb_displaced = 0
        self._pb_preempted: list[str] = []
        self.pb_driver = None
        self.pb_now = 0.0           # the virtual engine's clock (the policies' `now`)
        if self._pb_log is not None:
            sc = self.scheduler_config
            self._pb_log.write(json.dumps({
                "event": "init", "num_blocks": int(self.kv_cache_config.num_blocks), "block_size": int(self.block_size),
                "max_num_batched_tokens": int(sc.max_num_batched_tokens), "max_num_seqs": int(sc.max_num_seqs),
                "max_model_len": int(self.max_model_len), "policy": str(self.policy.value),
                "chunked_prefill": bool(sc.enable_chunked_prefill), "pid": os.getpid()}) + "\n")

    # ----------------------------------------------------------------- virtual engine

    def pb_configure(self, policy: str, options: dict, *, window, seed: int, profile, slo=None, row_of=None) -> None:
        """In process (the virtual engine): run ``policy`` with the simulator's own policy object
        (:class:`.policy_driver.PolicyDriver`) when vLLM's priority queue cannot express it (dynamic
        policies); static ones keep vLLM's own queue (their priorities come with the requests)."""
        from .policy_driver import PolicyDriver

        self._pb_options = {policy: dict(options)}
        if policy in policies.DRIVEN:
            self.pb_driver = PolicyDriver(self, policy, options, window, seed, profile, slo, row_of)
            self.waiting = self.pb_driver.queue

    def _preempt_request(self, request, *args, **kwargs):
        self._pb_preempted.append(request.request_id)
        out = super()._preempt_request(request, *args, **kwargs)
        if self.pb_driver is not None:
            self.pb_driver.on_evict(request)
        return out

    def pb_take_preempted(self) -> list[str]:
        """Ids of the requests preempted since the last call (by vLLM or by a dynamic policy)."""
        out, self._pb_preempted = self._pb_preempted, []
        return out

    # ----------------------------------------------------------------- dynamic policies

    def add_request(self, request) -> None:
        if self.pb_driver is not None:
            self.pb_driver.now = self.pb_now
            super().add_request(request)
            self.pb_driver.on_arrival(request)
            return
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
            self._pb_displaced += 1
        if victims and heap is not None:
            heapq.heapify(heap)

    def _free_request(self, request, *args, **kwargs):
        self._pb_policy.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)

    # ----------------------------------------------------------------- records

    def schedule(self, *args, **kwargs):
        t = time.monotonic()
        c = time.process_time()
        self._pb_displaced = 0
        if self.pb_driver is not None:
            self.pb_driver.now = self.pb_now
            self.pb_driver.before()
            try:
                out = super().schedule(*args, **kwargs)
            finally:
                self.pb_driver.after()
        else:
            self._pb_rekey()
            out = super().schedule(*args, **kwargs)
        if self._pb_log is not None and out.num_scheduled_tokens:
            prefill = decode = context = pairs = 0
            for req_id, n in out.num_scheduled_tokens.items():
                req = self.requests.get(req_id)
                if req is None or n <= 0:
                    continue
                after = int(req.num_computed_tokens)          # advanced by schedule() already
                before = after - int(n)
                if n == 1 and before >= req.num_tokens - 1 and before >= req.num_prompt_tokens:
                    decode += 1
                else:
                    prefill += int(n)
                    pairs += int(n) * before + int(n) * (int(n) + 1) // 2   # the cost model's causal attention pairs
                context += after
            self._pb_pending = {"t_start": t, "c_start": c, "prefill_tokens": prefill, "decode_seqs": decode,
                                "context_tokens": context, "attention_pairs": pairs,
                                "num_reqs": len(out.num_scheduled_tokens),
                                "waiting": len(self.waiting), "running": len(self.running),
                                "preempted": len(out.preempted_req_ids or ()), "displaced": self._pb_displaced}
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        t = time.monotonic()
        row, self._pb_pending = self._pb_pending, None
        result = super().update_from_output(scheduler_output, model_runner_output)
        if row is not None and self._pb_log is not None:
            end = time.monotonic()
            row["model_s"] = t - row["t_start"]
            row["iteration_s"] = end - row["t_start"]
            row["cpu_s"] = time.process_time() - row.pop("c_start")
            row["free_blocks"] = int(self.kv_cache_manager.block_pool.get_num_free_blocks())
            row["busy_after"] = bool(self.get_num_unfinished_requests())
            self._pb_log.write(json.dumps(row) + "\n")
        return result

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if self._pb_log is not None:
                self._pb_log.close()
                self._pb_log = None


RecordingScheduler = PortbenchScheduler   # the name earlier versions used
