"""The exported policies, their options (one documented place) and the supported vLLM version (no vLLM import).

**Where options come from.** One place: the ``"portbench"`` key of vLLM's ``additional_config``
(``vllm serve ... --additional-config '{"portbench": {"quantum_tokens": 32}}'``, or
``EngineArgs(additional_config={"portbench": {...}})``; :func:`engine_args` builds it). A scheduler class reads
it once, when vLLM creates it, and :func:`parse` validates it: an unknown key or a bad value is one
:class:`PolicyOptionsError` naming the policy, the key and what is allowed.

Keys: the simulator's options of the policy (``portbench schedulers``; e.g. ``quantum_tokens`` for las/mlfq/rr,
``levels`` for mlfq, ``starvation_s`` for ltr, ``w_prompt``/``w_output`` for vtc) and

* ``predictor`` (sjf_predicted, ltr, edf): path of a frozen predictor file (:func:`save_predictor`: a pickled
  :class:`portbench.data.predictors.Model`), applied at arrival to the request's prompt length (and any raw
  feature the request carries in ``vllm_xargs``); a request's own ``predicted_output`` / ``ltr_score``
  (``vllm_xargs``) wins -- a replay passes the study's frozen predictions so;
* ``slo`` (edf): the default SLO ``{"ttft_s", "tpot_s"}``; ``slo_classes`` (edf): named SLOs, chosen per request
  by ``vllm_xargs: {"slo": "<name>"}``;
* ``profile`` (mlfq): the simulator's cost profile whose prefill/decode ratio places a request's skip-join level
  (default :data:`portbench.sim.profiles.DEFAULT_PROFILE`);
* ``seed`` (random): the seed of the random order (default 0).

A request's tenant (vtc) is ``vllm_xargs: {"tenant": "<name>"}`` (vLLM 0.32 passes neither the OpenAI ``user``
field nor HTTP headers to the scheduler; ``vllm_xargs`` reaches it as ``SamplingParams.extra_args``); without one,
``"default"``.
"""

from __future__ import annotations

import json
import os
import pickle
from importlib import metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ParameterError, PortbenchError
from ..data import predictors
from ..sim import profiles, schedulers

SUPPORTED_VLLM = "0.32.0"          # constraints-vllm-cpu.txt / constraints-vllm-gpu.txt (tests/test_vllm_export.py)
OPTIONS_KEY = "portbench"          # the additional_config key
ORACLE = ("sjf_oracle", "srpt_oracle")
# policy -> exported class name (``portbench.vllm.<name>``; the async variant is ``Async<name>``)
CLASSES = {"fcfs": "FCFS", "sjf_prompt": "SJFPrompt", "sjf_predicted": "SJFPredicted", "ltr": "LTR", "mlfq": "MLFQ",
           "las": "LAS", "rr": "RR", "edf": "EDF", "vtc": "VTC", "random": "Random", "sjf_oracle": "SJFOracle",
           "srpt_oracle": "SRPTOracle"}
# settings, not classes: sarathi is FCFS with Sarathi-Serve's token budget
SETTINGS = {"sarathi": ("fcfs", {"max_num_batched_tokens": "prefill_token_budget"})}
DEPLOYABLE = tuple(p for p in CLASSES if p not in ORACLE) + tuple(SETTINGS)
# Policies whose decisions vLLM's priority queue cannot hold: run through the simulator's policy object
# (driver.PolicyDriver: the waiting queue, the running list, _preempt_request).
DRIVEN = ("las", "srpt_oracle", "mlfq", "rr", "vtc", "ltr")
STATIC = ("sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "random")   # a static priority per request
PREDICTED = ("sjf_predicted", "ltr", "edf")
PACKAGE_KEYS = {"predictor": PREDICTED, "slo_classes": ("edf",), "profile": ("mlfq",), "seed": ("random",)}
WHERE = ("vLLM's additional_config key \"portbench\" (vllm serve ... --additional-config "
         "'{\"portbench\": {...}}')")


class PolicyOptionsError(PortbenchError, ValueError):
    """A portbench scheduler's options are invalid (the message names the key and the fix)."""


class UnsupportedVllm(PortbenchError):
    """The installed vLLM is not the version the scheduler classes are written against."""


@dataclass(frozen=True)
class PolicyOptions:
    """One engine's validated options: ``policy`` (the simulator's name), ``sim`` (the policy object's options),
    and the package's own (``predictor`` path, ``slo_classes``, ``profile``, ``seed``)."""

    policy: str
    sim: dict = field(default_factory=dict)
    predictor: str | None = None
    slo: dict | None = None
    slo_classes: dict = field(default_factory=dict)
    profile: str | None = None
    seed: int = 0


def policy_of(name: str) -> str:
    """The simulator's policy name of an exported policy (``sarathi`` -> ``fcfs``)."""
    if name in SETTINGS:
        return SETTINGS[name][0]
    if name not in CLASSES:
        raise PolicyOptionsError(f"no vLLM scheduler class for policy {name!r}: one of {', '.join(sorted(CLASSES))} "
                                 f"(sarathi is fcfs with its token budget: engine_args('sarathi'))")
    return name


def _slo(value, where: str) -> dict:
    if not isinstance(value, dict) or set(value) != {"ttft_s", "tpot_s"} or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value.values()):
        raise PolicyOptionsError(f"{where} = {value!r}: expected {{\"ttft_s\": seconds > 0, \"tpot_s\": seconds > 0}}")
    return {"ttft_s": float(value["ttft_s"]), "tpot_s": float(value["tpot_s"])}


def parse(policy: str, raw: Any) -> PolicyOptions:
    """Validate ``raw`` (the ``"portbench"`` entry of additional_config) for ``policy``."""
    if raw is None:
        raw = {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise PolicyOptionsError(f"portbench options for {policy}: not JSON ({e}); set them in {WHERE}") from None
    if not isinstance(raw, dict):
        raise PolicyOptionsError(f"portbench options for {policy}: expected a JSON object, got {raw!r}; set them in "
                                 f"{WHERE}")
    cls = schedulers.SCHEDULERS[policy]
    sim_keys = set(cls.option_defaults()) - {"prefill_token_budget", "chunked_prefill"}
    allowed = sim_keys | {k for k, pols in PACKAGE_KEYS.items() if policy in pols}
    bad = sorted(set(raw) - allowed)
    if bad:
        raise PolicyOptionsError(f"portbench option {bad[0]!r} is not an option of {policy} (allowed: "
                                 f"{', '.join(sorted(allowed)) or 'none'}); set options in {WHERE}")
    sim = {k: v for k, v in raw.items() if k in sim_keys}
    try:
        cls(**sim)
    except ParameterError as e:
        raise PolicyOptionsError(f"portbench option {e.param.rsplit('.', 1)[-1]!r} of {policy} = {e.value!r}: "
                                 f"expected {e.expected}") from None
    slo = _slo(sim["slo"], f"portbench option 'slo' of {policy}") if sim.get("slo") is not None else None
    classes = raw.get("slo_classes") or {}
    if not isinstance(classes, dict):
        raise PolicyOptionsError(f"portbench option 'slo_classes' of {policy} = {classes!r}: expected "
                                 "{\"name\": {\"ttft_s\": .., \"tpot_s\": ..}, ...}")
    classes = {str(k): _slo(v, f"portbench option 'slo_classes.{k}'") for k, v in classes.items()}
    if policy == "edf" and slo is None and not classes:
        raise PolicyOptionsError(f"edf needs an SLO: set 'slo' ({{\"ttft_s\": .., \"tpot_s\": ..}}) or "
                                 f"'slo_classes' in {WHERE}")
    pred = raw.get("predictor")
    if pred is not None and not Path(str(pred)).is_file():
        raise PolicyOptionsError(f"portbench option 'predictor' of {policy}: no file {pred!r} (a frozen predictor "
                                 "written by portbench.vllm.save_predictor)")
    prof = raw.get("profile")
    if prof is not None:
        try:
            profiles.get_profile(prof)
        except PortbenchError as e:
            raise PolicyOptionsError(f"portbench option 'profile' of {policy}: {e}") from None
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PolicyOptionsError(f"portbench option 'seed' of {policy} = {seed!r}: expected an integer >= 0")
    return PolicyOptions(policy, sim, str(pred) if pred is not None else None, slo, classes,
                         str(prof) if prof is not None else None, int(seed))


def class_path(policy: str, *, async_scheduling: bool = False) -> str:
    """``portbench.vllm.<Class>`` of ``policy`` (``sarathi``: the FCFS class)."""
    name = CLASSES[policy_of(policy)]
    return f"portbench.vllm.{'Async' if async_scheduling else ''}{name}"


def engine_args(policy: str, options: dict | None = None, *, async_scheduling: bool = False) -> dict:
    """The vLLM engine arguments that run ``policy`` (``EngineArgs(**engine_args(...), model=...)``):
    ``scheduler_cls``, ``scheduling_policy="priority"``, ``additional_config={"portbench": options}`` (validated),
    ``async_scheduling``, and sarathi's token budget (``max_num_batched_tokens``) where the policy is a setting."""
    base = policy_of(policy)
    opts = dict(options or {})
    out: dict[str, Any] = {"scheduler_cls": class_path(policy, async_scheduling=async_scheduling),
                           "scheduling_policy": "priority", "async_scheduling": bool(async_scheduling)}
    if policy in SETTINGS:
        cls = schedulers.SCHEDULERS[policy]
        budget = opts.pop("prefill_token_budget", None) or cls.option_defaults().get("prefill_token_budget") \
            or getattr(cls, "prefill_token_budget", None)
        if budget:
            out["max_num_batched_tokens"] = int(budget)
    parse(base, opts)
    out["additional_config"] = {OPTIONS_KEY: opts}
    return out


def installed_vllm() -> tuple[str | None, str | None]:
    """``(distribution, version)`` of the installed vLLM (vllm or vllm-cpu), ``(None, None)`` without one."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def check_version(expected: str = SUPPORTED_VLLM) -> str:
    """The installed vLLM version; :class:`UnsupportedVllm` naming the supported one when it differs."""
    if os.environ.get("PORTBENCH_VLLM_VERSION_CHECK") == "off":   # porting work only (documented in docs/vllm.md)
        return installed_vllm()[1] or "?"
    dist, version = installed_vllm()
    if version is None:
        raise UnsupportedVllm(f"vLLM is not installed in this environment: portbench's scheduler classes need vLLM "
                              f"{expected} (make setup-vllm)")
    if version.split("+", 1)[0] != expected:
        raise UnsupportedVllm(f"portbench's scheduler classes drive vLLM {expected}'s scheduler internals (schedule, "
                              f"update_from_output, the running list, the waiting queue, _preempt_request); {dist} "
                              f"{version} is installed. Install vLLM {expected} (constraints-vllm-cpu.txt; make "
                              "setup-vllm) or port lib/portbench/vllm/")
    return version


def save_predictor(model, path) -> Path:
    """Freeze a fitted :class:`portbench.data.predictors.Model` into ``path`` (the ``predictor`` option)."""
    if not isinstance(model, predictors.Model):
        raise PolicyOptionsError(f"save_predictor takes a portbench.data.predictors.Model, got {type(model).__name__}")
    p = Path(path)
    p.write_bytes(pickle.dumps(model))
    return p


def load_predictor(path):
    """A frozen predictor written by :func:`save_predictor` (a pickle: load only files you wrote)."""
    model = pickle.loads(Path(path).read_bytes())   # noqa: S301 - the operator's own file (documented)
    if not isinstance(model, predictors.Model):
        raise PolicyOptionsError(f"{path}: not a frozen portbench predictor (portbench.vllm.save_predictor)")
    return model
