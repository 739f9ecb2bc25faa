"""An example vLLM scheduler class for `portbench simulate --vllm-scheduler docs/examples/vllm_prompt_sjf.py:PromptSJF`.

Shortest prompt first, written as a vLLM V1 ``Scheduler`` subclass: the request's priority is its prompt length
(vLLM's priority queue breaks ties by arrival time, then request id, and preempts the lowest priority first).
It is deployable as is (``vllm serve MODEL --scheduling-policy priority --scheduler-cls
vllm_prompt_sjf.PromptSJF``) and, in portbench's virtual engine, matches the built-in ``sjf_prompt`` run for run
(tests/test_vllm_import.py).
"""

from vllm.v1.core.sched.scheduler import Scheduler


class PromptSJF(Scheduler):
    """Shortest prompt first (priority = prompt tokens)."""

    information = "prompt"      # what its decisions read (portbench's information kinds); not checked

    def add_request(self, request):
        request.priority = request.num_prompt_tokens
        super().add_request(request)
