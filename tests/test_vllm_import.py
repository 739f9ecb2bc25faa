"""A user's vLLM Scheduler subclass in the virtual engine (``portbench simulate --vllm-scheduler``; issue #40).

* A small SJF-like subclass written here (the request's priority = its prompt length, set in ``add_request``;
  vLLM's own priority queue and preemption do the rest) matches the built-in ``sjf_prompt`` run on the same
  engine step for step and request for request, on a synthetic window under memory pressure (hundreds of
  preemptions) and on the conformance windows of each real source (when the trace mirror is there);
* each fault gives one message naming the class (and for a run, the step): class not found, module not found,
  wrong base class, raises at step N, needs a model output the stub cannot give, non-deterministic.
"""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import polars as pl
import pytest

pytestmark = pytest.mark.vllm

SLO = {"ttft_s": 2.0, "tpot_s": 0.1}

SCHEDULERS = textwrap.dedent('''
    import random
    from vllm.v1.core.sched.scheduler import Scheduler


    class PromptSJF(Scheduler):
        """Shortest prompt first: the priority of a request is its prompt length (ties: arrival, request id)."""
        information = "prompt"

        def add_request(self, request):
            request.priority = request.num_prompt_tokens
            super().add_request(request)


    class Broken(PromptSJF):
        """Raises at its 5th schedule() call."""
        calls = 0

        def schedule(self):
            type(self).calls += 1
            if type(self).calls == 5:
                raise ValueError("the fifth step is not for me")
            return super().schedule()


    class WantsLogprobs(PromptSJF):
        def update_from_output(self, scheduler_output, model_runner_output):
            _ = model_runner_output.logprobs
            return super().update_from_output(scheduler_output, model_runner_output)


    class Coin(Scheduler):
        """Random priorities from Python's global generator: not reproducible from the run's seed."""
        def add_request(self, request):
            request.priority = random.randint(0, 10**6)
            super().add_request(request)


    class NotAScheduler:
        pass
''')


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("user") / "my_scheds.py"
    p.write_text(SCHEDULERS)
    return p


def _window(n: int = 160, rate: float = 10.0, seed: int = 1) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    return pl.DataFrame({"arrival_s": arr, "prompt_tokens": rng.integers(20, 3000, n),
                         "output_tokens": rng.integers(5, 600, n), "tenant": [f"t{i % 3}" for i in range(n)]})


@pytest.fixture(scope="module")
def small_profile():
    from portbench.sim import profiles

    prof = profiles.get_profile("a100_40gb_llama3_1_8b")
    return dataclasses.replace(prof, kv_capacity_blocks=2000)    # 32k tokens: the cache binds


def _run(df, prof, spec=None, policy="sjf_prompt", seed=3):
    from portbench.validation import imported, virtual

    cls = imported.virtual_class(spec) if spec else None
    return virtual.run(df, policy if spec is None else imported.imported_name(spec), prof, horizon_s=float("inf"),
                       seed=seed, slo=SLO, scheduler_cls=cls)


def _same(a, b):
    from portbench.validation import conformance

    c = conformance.compare(a, b)
    return c


def test_user_sjf_matches_builtin_sjf_prompt_under_memory_pressure(user_file, small_profile):
    df = _window()
    a = _run(df, small_profile)
    b = _run(df, small_profile, f"{user_file}:PromptSJF")
    assert a.counters["preemptions"] > 0                      # the cache binds: vLLM's preemption is exercised
    assert a.steps.height == b.steps.height > 100
    assert a.steps.drop("scheduled").equals(b.steps.drop("scheduled"))
    assert a.steps["scheduled"].to_list() == b.steps["scheduled"].to_list()
    assert a.requests.equals(b.requests)
    fcfs = _run(df, small_profile, policy="fcfs")             # the comparison can fail: FCFS differs
    assert not fcfs.requests.equals(b.requests)


def test_user_sjf_matches_builtin_on_conformance_windows(user_file):
    """The conformance windows (the first window of each real source at three loads) through the campaign engine."""
    from portbench import params
    from portbench.core.errors import PortbenchError
    from portbench.data import windows
    from portbench.study.campaign.engines import SimEngine
    from portbench.study.campaign.plan import make_plan
    from portbench.validation import imported

    cfg = params.load(None, validate=False)
    try:
        manifest = windows.load_manifest(cfg.paths)
        plan = make_plan(cfg.plan_settings, manifest=manifest)
        refs = [next(w for w in plan.windows if w.source == s) for s in ("azure", "azure_code", "mooncake")]
        tables = {r.id: windows.load_windows(cfg.data, [r.source], manifest=manifest, per_source=1)[r.id] for r in refs}
    except (PortbenchError, StopIteration, KeyError) as e:
        pytest.skip(f"no frozen windows here: {e}")
    spec = f"{user_file}:PromptSJF"
    name = imported.register(spec)
    eng = imported.ImportedEngine({name: spec})
    sim = cfg.simulation
    for ref in refs:
        df = tables[ref.id]
        es, ev = SimEngine().for_window(ref), eng.for_window(ref)
        cap = es.capacity(df, sim)["capacity_rps"]
        for region in ("light", "near_saturation", "severe"):
            scaled, horizon = es.prepare(df, sim.region_loads[region], cap, sim)
            a = ev.run(scaled, "sjf_prompt", 7, horizon, sim)
            b = ev.run(scaled, name, 7, horizon, sim)
            assert a.records.equals(b.records), (ref.id, region)
            assert a.metrics == pytest.approx(b.metrics, nan_ok=True)


def test_class_not_found_module_not_found_wrong_base(user_file):
    from portbench.validation import imported

    with pytest.raises(imported.ImportedSchedulerError, match="no class 'Nope'.*PromptSJF"):
        imported.load_class(f"{user_file}:Nope")
    with pytest.raises(imported.ImportedSchedulerError, match="module 'no_such_pkg.mod' cannot be imported"):
        imported.load_class("no_such_pkg.mod:X")
    with pytest.raises(imported.ImportedSchedulerError, match="NotAScheduler is not a subclass of vllm"):
        imported.load_class(f"{user_file}:NotAScheduler")
    with pytest.raises(imported.ImportedSchedulerError, match="expected MODULE:CLASS"):
        imported.load_class("justaname")


def test_raises_at_step_n_names_class_and_step(user_file, small_profile):
    from portbench.validation import imported

    with pytest.raises(imported.ImportedSchedulerError,
                       match=r"Broken raised ValueError: the fifth step is not for me in schedule at step 5 "):
        _run(_window(), small_profile, f"{user_file}:Broken")


def test_needs_model_output_is_refused(user_file, small_profile):
    from portbench.validation import imported

    with pytest.raises(imported.NeedsModelOutput, match="WantsLogprobs: reads model_runner_output.logprobs"):
        _run(_window(), small_profile, f"{user_file}:WantsLogprobs")


def test_non_deterministic_class_is_refused(user_file, small_profile):
    from portbench.validation import imported

    spec = f"{user_file}:Coin"
    with pytest.raises(imported.ImportedSchedulerError, match="Coin: two runs of window w0.*same seed"):
        imported.check_deterministic(spec, lambda: _run(_window(), small_profile, spec).requests, where="window w0")
