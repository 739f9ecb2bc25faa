"""vLLM's V1 scheduler with portbench's iteration records and driven policies (runs in vLLM's engine process).

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
-- the rules the conformance tests hold bit-identical to the simulator. On the wall-clock engine (one policy per engine
instance, :mod:`.engine`) static policies keep vLLM's own queue, their priorities sent with the requests.

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
  (requests preempted in this step, by vLLM or by a driven policy), ``busy_after`` (requests left after the step: the next step follows at once).
"""

from __future__ import annotations

import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler

from . import policies

LOG_ENV = "PORTBENCH_VLLM_ITERATION_LOG"


class PortbenchScheduler(Scheduler):
    """vLLM's scheduler + per-step records + the driven policies of the virtual engine (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(LOG_ENV)
        self._pb_log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - closed in shutdown
        self._pb_pending = None
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

    def add_request(self, request) -> None:
        if self.pb_driver is not None:
            self.pb_driver.now = self.pb_now
            super().add_request(request)
            self.pb_driver.on_arrival(request)
            return
        super().add_request(request)

    # ----------------------------------------------------------------- records

    def schedule(self, *args, **kwargs):
        t = time.monotonic()
        c = time.process_time()
        if self.pb_driver is not None:
            self.pb_driver.now = self.pb_now
            self.pb_driver.before()
            try:
                out = super().schedule(*args, **kwargs)
            finally:
                self.pb_driver.after()
        else:
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
                                "preempted": len(out.preempted_req_ids or ())}
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
