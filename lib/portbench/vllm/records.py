"""Per-step iteration records of a vLLM scheduler (a mixin; the wall-clock replay's step table).

:class:`StepRecords` goes first in a scheduler class's bases (``class X(StepRecords, <a vLLM Scheduler>)``).
With ``$PORTBENCH_VLLM_ITERATION_LOG`` set it appends one JSON line per step with something scheduled; the
first line of each engine is ``{"event": "init", ...}`` with the engine's resolved settings (KV blocks, block
size, token budget, max_num_seqs, max_model_len, the scheduling policy, the portbench policy):

* ``prefill_tokens``: tokens scheduled for requests still in (re)prefill;
* ``decode_seqs``: requests scheduled for exactly one token after their known tokens (decodes);
* ``context_tokens``: KV tokens of every scheduled request after the step (the cost model's C);
* ``attention_pairs``: causal attention pairs of the step's prompt chunks (the cost model's A);
* ``t_start`` (monotonic, start of ``schedule()``), ``model_s`` (to the start of ``update_from_output()``),
  ``iteration_s`` (to its end: when vLLM stamps the step's tokens), ``cpu_s`` (this process's CPU time over
  the same span: wall - CPU = time the OS gave to others), ``waiting`` / ``running`` (queue lengths after
  scheduling), ``free_blocks``, ``preempted`` (requests preempted in this step, by vLLM or by the policy),
  ``displaced`` (of those, by the policy's ranked plan), ``busy_after`` (requests left after the step).
"""

from __future__ import annotations

import json
import os
import time

LOG_ENV = "PORTBENCH_VLLM_ITERATION_LOG"


class StepRecords:
    """The iteration records (module docstring); ``pb_displaced`` counts the policy's preemptions of a step."""

    pb_policy: str = "vllm"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(LOG_ENV)
        self._pb_log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - closed in shutdown
        self._pb_pending: dict | None = None
        self.pb_displaced = 0
        if self._pb_log is not None:
            sc = self.scheduler_config
            self._pb_log.write(json.dumps({
                "event": "init", "num_blocks": int(self.kv_cache_config.num_blocks), "block_size": int(self.block_size),
                "max_num_batched_tokens": int(sc.max_num_batched_tokens), "max_num_seqs": int(sc.max_num_seqs),
                "max_model_len": int(self.max_model_len), "policy": str(self.policy.value),
                "portbench_policy": self.pb_policy, "scheduler_cls": type(self).__name__,
                "chunked_prefill": bool(sc.enable_chunked_prefill), "pid": os.getpid()}) + "\n")

    def schedule(self, *args, **kwargs):
        t = time.monotonic()
        c = time.process_time()
        self.pb_displaced = 0
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
                                "preempted": len(out.preempted_req_ids or ()), "displaced": self.pb_displaced}
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
            super().shutdown()  # type: ignore[misc]
        finally:
            if self._pb_log is not None:
                self._pb_log.close()
                self._pb_log = None
