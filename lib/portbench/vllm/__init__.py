"""portbench's policies as vLLM scheduler classes: deploy what you benchmarked.

Use a benchmarked policy in a vLLM 0.32 server (docs/vllm.md)::

    vllm serve MODEL --scheduler-cls portbench.vllm.LAS \\
        --additional-config '{"portbench": {"quantum_tokens": 32}}'

or in Python ``EngineArgs(model=..., **portbench.vllm.engine_args("las", {"quantum_tokens": 32}))``.

The API (importable without vLLM; the classes are loaded on first access and need vLLM
:data:`SUPPORTED_VLLM`):

* ``portbench.vllm.<Class>`` / ``portbench.vllm.Async<Class>``: one scheduler class per policy
  (:data:`CLASSES`: FCFS, SJFPrompt, SJFPredicted, LTR, MLFQ, LAS, RR, EDF, VTC, Random; SJFOracle and
  SRPTOracle for replays that pass the true output length as ``max_tokens`` with ``ignore_eos`` only), the
  ``Async`` variant where vLLM's async scheduling is on (its default);
* :func:`engine_args` ``(policy, options=None, *, async_scheduling=False) -> dict``: the engine arguments
  (``scheduler_cls``, ``scheduling_policy``, ``additional_config``, ``async_scheduling``, and sarathi's
  ``max_num_batched_tokens``: sarathi is FCFS with Sarathi-Serve's budget, a setting, not a class);
* :func:`parse_options` (the one place options come from: ``additional_config["portbench"]``; validated,
  :class:`PolicyOptionsError`), :func:`check_version` (:class:`UnsupportedVllm`), :func:`save_predictor`
  (sjf_predicted / ltr / edf's frozen predictor file);
* :class:`.records.StepRecords`: the per-step iteration records (``$PORTBENCH_VLLM_ITERATION_LOG``) as a mixin
  for any vLLM scheduler class (``class Mine(StepRecords, Scheduler)``).

Modules: :mod:`.options` (no vLLM), :mod:`.records` (no vLLM), :mod:`.driver` (the policy object inside vLLM's
scheduler), :mod:`.schedulers` (the classes).
"""

from __future__ import annotations

from .options import (CLASSES, DEPLOYABLE, DRIVEN, ORACLE, STATIC, SUPPORTED_VLLM, PolicyOptions, PolicyOptionsError,
                      UnsupportedVllm, check_version, class_path, engine_args, save_predictor)
from .options import parse as parse_options
from .records import LOG_ENV, StepRecords

__all__ = ["CLASSES", "DEPLOYABLE", "DRIVEN", "LOG_ENV", "ORACLE", "STATIC", "SUPPORTED_VLLM", "PolicyOptions",
           "PolicyOptionsError", "StepRecords", "UnsupportedVllm", "check_version", "class_path", "engine_args",
           "parse_options", "save_predictor", "scheduler_class"]


def scheduler_class(policy: str, *, async_scheduling: bool = False) -> type:
    """The scheduler class of ``policy`` (imports vLLM)."""
    from . import schedulers
    return schedulers.scheduler_class(policy, async_scheduling=async_scheduling)


def __getattr__(name: str):
    """``portbench.vllm.LAS`` etc. (what ``--scheduler-cls`` resolves): loaded with vLLM on first access."""
    if name.removeprefix("Async") in CLASSES.values():
        from . import schedulers
        return schedulers.CLASSES[name]
    raise AttributeError(f"module 'portbench.vllm' has no attribute {name!r}")
