"""A thin subclass of vLLM's scheduler that records every iteration (imported in vLLM's engine process).

It changes no decision: ``schedule()`` and ``update_from_output()`` call vLLM's own and only note,
per iteration, what was scheduled and how long it took, appending one JSON line to the file named by
``$PORTBENCH_VLLM_ITERATION_LOG`` (the engine-core process inherits the variable). Selected through
``AsyncEngineArgs(scheduler_cls="portbench.validation.engine_scheduler.RecordingScheduler")``; vLLM
warns that the scheduler interface is not public — this class relies only on ``schedule()``,
``update_from_output()``, ``SchedulerOutput.num_scheduled_tokens`` and the ``Request`` fields
``num_computed_tokens`` / ``num_prompt_tokens`` (vLLM 0.32). A custom scheduler class disables
vLLM's async scheduling, which the replay turns off anyway (one iteration at a time).

Row of one iteration (the cost model's terms, :meth:`portbench.sim.profiles.Profile.iteration_time`):

* ``prefill_tokens``: tokens scheduled for requests still in prefill (their computed tokens before
  the iteration are below the prompt length, or — after a recompute preemption — more than one token
  is scheduled);
* ``decode_seqs``: requests scheduled for exactly one token after their prompt (decode steps);
* ``context_tokens``: KV tokens of all scheduled requests after the iteration (what attention reads;
  a prefill of p tokens counts p, a decode at length L counts L — the profile's convention);
* ``iteration_s``: monotonic time from the start of ``schedule()`` to the start of
  ``update_from_output()`` — scheduling, the forward pass and sampling of that iteration.
"""

from __future__ import annotations

import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler

LOG_ENV = "PORTBENCH_VLLM_ITERATION_LOG"


class RecordingScheduler(Scheduler):
    """vLLM's scheduler, unchanged, plus one JSONL row per iteration (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(LOG_ENV)
        self._pb_log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - closed in shutdown
        self._pb_pending = None

    def schedule(self, *args, **kwargs):
        t = time.monotonic()
        out = super().schedule(*args, **kwargs)
        if self._pb_log is not None:
            prefill = decode = context = 0
            for req_id, n in out.num_scheduled_tokens.items():
                req = self.requests.get(req_id)
                if req is None or n <= 0:
                    continue
                after = int(req.num_computed_tokens)          # advanced by schedule() already
                before = after - int(n)
                if n == 1 and before >= req.num_prompt_tokens:
                    decode += 1
                else:
                    prefill += int(n)
                context += after
            self._pb_pending = {"t_start": t, "prefill_tokens": prefill, "decode_seqs": decode,
                                "context_tokens": context, "num_reqs": len(out.num_scheduled_tokens)}
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        t = time.monotonic()
        row, self._pb_pending = self._pb_pending, None
        if row is not None and self._pb_log is not None:
            row["iteration_s"] = t - row["t_start"]
            self._pb_log.write(json.dumps(row) + "\n")
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if self._pb_log is not None:
                self._pb_log.close()
                self._pb_log = None
