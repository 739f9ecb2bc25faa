"""portbench's policies as vLLM 0.32 scheduler classes (``--scheduler-cls portbench.vllm.<Class>``).

Each class is vLLM's own V1 ``Scheduler`` (or, ``Async<Class>``, its ``AsyncScheduler``: vLLM keeps its
scheduling overlap only for a subclass of that one) with

* the policy (:class:`.driver.PolicyDriver`): ``fcfs`` keeps vLLM's priority queue with every priority 0
  (vLLM's FCFS rules: arrival order, the latest arrival preempted); the static policies (sjf_prompt,
  sjf_predicted, edf, random, sjf_oracle) give each request its static key as vLLM priority at arrival; the
  driven ones (las, srpt_oracle, mlfq, rr, vtc, ltr) run through the simulator's own policy object (waiting
  queue, running list, ``_preempt_request``);
* the step records of :class:`.records.StepRecords` (``$PORTBENCH_VLLM_ITERATION_LOG``).

The engine runs in vLLM's ``priority`` scheduling mode whatever ``--scheduling-policy`` says (the class sets
it: the rules the conformance check holds are those of that mode). Options: :mod:`.options`. vLLM warns that
its scheduler interface is not public; the classes refuse any vLLM but :data:`.options.SUPPORTED_VLLM`.

The clock: a server's requests carry vLLM's arrival time (``time.time()``) and the policy's ``now`` is
``time.time()``; the virtual engine (:mod:`portbench.validation.virtual`) sets :attr:`pb_now` (virtual seconds)
and binds the window (:meth:`pb_bind_window`).
"""

from __future__ import annotations

import logging
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

from . import options as opts_mod
from .driver import PolicyDriver
from .records import StepRecords

log = logging.getLogger("portbench.vllm")


class _PolicyCore(Scheduler):
    """The policy inside vLLM's scheduler (module docstring); subclasses set ``pb_policy``."""

    pb_policy = "fcfs"

    def __init__(self, *args, **kwargs):
        opts_mod.check_version()
        super().__init__(*args, **kwargs)
        if self.policy != SchedulingPolicy.PRIORITY:
            self.policy = SchedulingPolicy.PRIORITY
            self.waiting = create_request_queue(self.policy)
            self.kv_holding_waiting = create_request_queue(self.policy)
        extra = getattr(self.vllm_config, "additional_config", None)
        raw = extra.get(opts_mod.OPTIONS_KEY) if isinstance(extra, dict) else None
        self.pb_options = opts_mod.parse(self.pb_policy, raw)
        self.pb_now: float | None = None      # the virtual engine's clock; None: time.time()
        mode = ("fcfs" if self.pb_policy == "fcfs" else "driven" if self.pb_policy in opts_mod.DRIVEN
                else "static")
        self.pb_driver = PolicyDriver(self, self.pb_options, mode, self.pb_clock)
        if mode == "driven":
            self.waiting = self.pb_driver.queue
        if self.pb_policy in opts_mod.ORACLE:
            log.warning("portbench %s reads each request's max_tokens as its true output length: meaningful only "
                        "for replays that send the true length with ignore_eos (not for live traffic)",
                        self.pb_policy)
        if self.scheduler_config.async_scheduling and not isinstance(self, AsyncScheduler):
            log.warning("async scheduling is on: use portbench.vllm.Async%s (this class is not an AsyncScheduler)",
                        type(self).__name__)
        self.pb_preempted: list[str] = []

    def pb_clock(self) -> float:
        return self.pb_now if self.pb_now is not None else time.time()

    def pb_bind_window(self, window_df, seed: int, profile, slo, row_of) -> None:
        """The virtual engine: the window's requests known in advance (:meth:`.driver.PolicyDriver.bind_window`)."""
        if self.pb_driver.mode != "fcfs":
            self.pb_driver.bind_window(window_df, seed, profile, slo, row_of)

    def pb_take_preempted(self) -> list[str]:
        """Ids of the requests preempted since the last call (by vLLM or by the policy)."""
        out, self.pb_preempted = self.pb_preempted, []
        return out

    # --- vLLM's hooks
    def add_request(self, request) -> None:
        self.pb_driver.on_arrival(request)          # sets the request's priority (fcfs: 0; static: its key)
        super().add_request(request)

    def _preempt_request(self, request, *args, **kwargs):
        self.pb_preempted.append(request.request_id)
        out = super()._preempt_request(request, *args, **kwargs)
        self.pb_driver.on_evict(request)
        return out

    def schedule(self, *args, **kwargs):
        d = self.pb_driver
        n0 = len(self.pb_preempted)
        d.before()
        self.pb_displaced = len(self.pb_preempted) - n0     # the ranked plan's preemptions (StepRecords)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            d.after()

    def update_from_output(self, scheduler_output, model_runner_output):
        d = self.pb_driver
        if d.mode == "fcfs":
            return super().update_from_output(scheduler_output, model_runner_output)
        produced = []
        sampled = model_runner_output.sampled_token_ids
        for rid, i in (model_runner_output.req_id_to_index or {}).items():
            if sampled is not None and i < len(sampled) and len(sampled[i]) > 0:
                req = self.requests.get(rid)
                if req is not None and not req.is_finished():
                    produced.append(req)
        out = super().update_from_output(scheduler_output, model_runner_output)
        now = self.pb_clock()
        produced = [r for r in produced if r.request_id in d.by_id or d.mirror is not None]
        d.on_tokens(produced, now)
        for r in produced:
            if r.is_finished():
                d.on_finish(r, now)
        return out

    def finish_requests(self, request_ids, finished_status):
        out = super().finish_requests(request_ids, finished_status)
        for r in out or ():
            self.pb_driver.on_abort(r)
        return out


def _make(policy: str, name: str) -> tuple[type, type]:
    doc = (f"vLLM's V1 scheduler running portbench's ``{policy}`` policy (``--scheduler-cls portbench.vllm.{name}``; "
           "see :mod:`portbench.vllm`).")
    sync = type(name, (StepRecords, _PolicyCore), {"pb_policy": policy, "__doc__": doc, "__module__": __name__})
    asy = type(f"Async{name}", (StepRecords, _PolicyCore, AsyncScheduler),
               {"pb_policy": policy, "__doc__": doc.replace("V1 scheduler", "V1 AsyncScheduler"),
                "__module__": __name__})
    return sync, asy


CLASSES: dict[str, type] = {}
for _policy, _name in opts_mod.CLASSES.items():
    CLASSES[_name], CLASSES[f"Async{_name}"] = _make(_policy, _name)
globals().update(CLASSES)


def scheduler_class(policy: str, *, async_scheduling: bool = False) -> type:
    """The class of ``policy`` (sarathi: FCFS)."""
    name = opts_mod.CLASSES[opts_mod.policy_of(policy)]
    return CLASSES[f"Async{name}" if async_scheduling else name]
