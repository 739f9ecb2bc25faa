"""The planted reversal's scheduler class: ``delay_shortest`` inside vLLM's scheduler (imports vLLM).

vLLM's own V1 scheduler in its ``priority`` mode, with each request's priority set at arrival to minus its size
(prompt tokens + ``max_tokens``, the true output length the replay sends with ``ignore_eos``): the longest request
is served first, the shortest waits -- SJF reversed. Its order against fcfs under load follows from queueing alone,
on any engine, so the paired procedure must find fcfs better (:mod:`.engine`). A validation instrument, not a study
policy: it is never ranked. The step records are the exported classes' (:class:`portbench.vllm.StepRecords`).
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler

from ..vllm.records import StepRecords


class DelayShortest(StepRecords, Scheduler):
    """vLLM's priority scheduler with priority = -(prompt tokens + max_tokens) (module docstring)."""

    pb_policy = "delay_shortest"

    def add_request(self, request) -> None:
        request.priority = -(int(request.num_prompt_tokens) + int(request.max_tokens or 0))
        super().add_request(request)
