"""Scheduler plug-ins: the contract is checked (every breach is one SchedulerError naming the policy,
the hook, the request and the rule), policies are dynamic unless declared static (and a declared-static
policy is checked), and plug-ins load from the parameters and the CLI in the main process, in
process-pool workers and on Dask workers, and are part of the campaign's fingerprint."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from portbench import cli, params
from portbench.core import plugins
from portbench.core.errors import ParameterError, SchedulerError, UnknownSchedulerError
from portbench.data import windows
from portbench.sim import schedulers
from portbench.sim.schedulers import BaseScheduler
from portbench.study import campaign
from test_simulator import StubProfile, azure_windows, run, window

PLUGIN = Path(__file__).with_name("plugins") / "myschedulers.py"
SMOKE = "papermill_params/smoke.yaml"
SERIAL = StubProfile(max_num_seqs=1)
ROOT = Path(__file__).resolve().parents[1]


def _policy(name="bad", base=BaseScheduler, **attrs):
    """An unregistered policy class defined here (a plug-in: checked on every call)."""
    return type("Bad", (base,), {"name": name, "information": "prompt", "models": "test", **attrs})()


BURST = window([0, 0, 0, 0, 0, 0], [400, 30, 200, 50, 100, 10], [3, 3, 3, 3, 3, 3])


# --------------------------------------------------------------------------- contract breaches


@pytest.mark.parametrize("key, words", [
    (lambda r, now: None, "returned None"),
    (lambda r, now: float("nan") if r.id == 2 else r.prompt_tokens, "returned NaN"),
    (lambda r, now: {"p": r.prompt_tokens}, "which does not order"),
    (lambda r, now: (r.prompt_tokens, None), "whose element 1 is None"),
    (lambda r, now: (r.prompt_tokens, "x") if r.id == 3 else (r.prompt_tokens, 1.0), "shape differs"),
])
@pytest.mark.parametrize("static", [False, True])
def test_bad_priority_keys(key, words, static):
    pol = _policy(priority=lambda self, r, now: key(r, now), static_priority=static)
    with pytest.raises(SchedulerError) as e:
        run(BURST, pol, SERIAL)
    err = e.value
    assert err.policy == "bad" and err.hook == "priority" and isinstance(err.request, int)
    assert words in str(err) and "rule: priority(r, now) must return a key" in str(err)
    assert re.match(r"scheduler 'bad', hook priority, request \d+: ", str(err))


def test_a_declared_static_policy_that_depends_on_time_is_refused():
    pol = _policy(static_priority=True, priority=lambda self, r, now: r.prompt_tokens - 100 * (now - r.arrival_s))
    with pytest.raises(SchedulerError) as e:
        run(BURST, pol, SERIAL)
    assert e.value.hook == "priority" and e.value.request == 0
    assert "declares static_priority = True" in str(e.value) and "at now = 0 s (its arrival)" in str(e.value)
    assert "leave static_priority unset" in e.value.rule
    # built-in static policies pass the same check (it runs for every declared-static policy)
    for name in ("fcfs", "sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "random"):
        assert schedulers.SCHEDULERS[name].static_priority is True
        run(BURST, name, SERIAL, check_contract=True)


def test_admission_order_breaches():
    def yields_twice(self, waiting, now):
        yield from waiting
        yield waiting[0]

    def yields_a_stranger(self, waiting, now):
        yield from self._all[:1] if len(waiting) < len(self._all) else waiting

    def reset(self, ctx):
        self._all = []

    def on_arrival(self, r, now):
        self._all.append(r)

    cases = [(dict(admission_order=lambda self, waiting, now: None), "returned None", None),
             (dict(admission_order=lambda self, waiting, now: 7), "not iterable", None),
             (dict(admission_order=lambda self, waiting, now: ["x"]), "not a request", None),
             (dict(admission_order=yields_twice), "yielded the same request twice", 0),
             (dict(admission_order=yields_a_stranger, reset=reset, on_arrival=on_arrival), "not waiting", 0)]
    wide = StubProfile(max_num_seqs=2)
    df = window([0, 0, 0, 1, 1, 2], [100, 30, 200, 50, 100, 10], [30, 30, 30, 30, 30, 30])
    for attrs, words, rid in cases:
        with pytest.raises(SchedulerError) as e:
            run(df, _policy(**attrs), wide)
        assert e.value.hook == "admission_order" and words in str(e.value), (attrs, str(e.value))
        assert (e.value.request is None) == (rid is None) and "rule: admission_order(waiting, now) may yield only" \
            in str(e.value)


def test_an_overridden_admission_order_is_used_by_static_non_preemptive_policies():
    class Lifo(BaseScheduler):
        name, information, models, static_priority = "lifo", "arrival", "test", True

        def admission_order(self, waiting, now):
            return sorted(waiting, key=lambda r: -r.id)

    df = window([0, 0.01, 0.02, 0.03], [50, 50, 50, 50], [200, 20, 20, 20])
    order = run(df, Lifo(), SERIAL).requests.sort("first_token_s")["req_id"].to_list()
    assert order == [0, 3, 2, 1]     # request 0 runs alone (2.5 s); then the latest arrival first
    assert run(df, "fcfs", SERIAL).requests.sort("first_token_s")["req_id"].to_list() == [0, 1, 2, 3]


def test_a_preemptive_policy_may_not_override_admission_order():
    pol = _policy(preemptive=True, admission_order=lambda self, waiting, now: waiting)
    with pytest.raises(SchedulerError, match="hook admission_order: is overridden by a preemptive policy"):
        run(BURST, pol, SERIAL)


def test_victim_breaches():
    tight = StubProfile(kv_capacity_blocks=30, max_num_seqs=8)   # the KV cache binds: victims are asked for
    df = window([0, 0, 0, 0, 0, 0], [100, 120, 90, 110, 95, 105], [200, 200, 200, 200, 200, 200])
    for victim, words in ((lambda self, c, now: None, "returned None"),
                          (lambda self, c, now: self._outsider, "which is not a candidate")):
        pol = _policy(victim=victim, reset=lambda self, ctx: None)
        pol._outsider = type("R", (), {"id": 999})()
        with pytest.raises(SchedulerError) as e:
            run(df, pol, tight)
        assert e.value.hook == "victim" and words in str(e.value)
        assert "(candidates: requests [" in str(e.value) and "rule: victim(candidates, now) must return one" in str(e.value)


def test_next_decision_breach():
    pol = _policy(preemptive=True, next_decision=lambda self, b, o, now: 5)
    df = window([0, 0, 0, 0], [100, 120, 90, 110], [50, 50, 50, 50])
    with pytest.raises(SchedulerError, match=r"hook next_decision: returned 5 .*rule: next_decision"):
        run(df, pol, StubProfile(max_num_seqs=2))


def test_every_builtin_satisfies_the_contract_on_real_windows(shared_traces):
    """Built-ins are trusted in campaigns (not wrapped); here each runs wrapped, on real Azure windows at
    overload, and must give exactly the records it gives unwrapped."""
    from portbench.sim import profiles, regions

    prof = profiles.get_profile("a100_40gb_llama2_7b")
    df = next(iter(azure_windows(shared_traces, starts=(8000,)).values()))
    sdf = regions.rescale(df, 1.2, regions.capacity(df, prof))
    H = regions.horizon_s(sdf, 1.5)
    for name in [n for n in schedulers.SCHEDULERS if schedulers.SCHEDULERS[n].__module__.startswith("portbench.")]:
        a = run(sdf, name, prof, horizon=H, check_contract=True)
        b = run(sdf, name, prof, horizon=H, check_contract=False)
        assert a.requests.equals(b.requests) and a.counters == b.counters, name


# --------------------------------------------------------------------------- dynamic by default


@pytest.fixture()
def plugin():
    """The README's example plug-in loaded from its file (unregistered afterwards)."""
    loaded = plugins.load([str(PLUGIN)])
    yield loaded
    _unload()


def _unload():
    """Forget the test plug-ins (registry and loader), so that the next test loads them afresh."""
    for name in ("aging_sjf", "lpf"):
        schedulers.SCHEDULERS.pop(name, None)
    plugins._LOADED.clear()


def test_a_policy_is_dynamic_unless_declared_static(plugin):
    aging, lpf = schedulers.SCHEDULERS["aging_sjf"], schedulers.SCHEDULERS["lpf"]
    assert aging.static_priority is False and lpf.static_priority is True
    assert BaseScheduler.static_priority is False
    # long prompt 0 arrives first; short ones keep arriving. Without aging (the old trap: a `now`-dependent
    # priority evaluated once at arrival = sjf_prompt) it starves; with aging it is served once it has waited.
    # request 0 keeps the (serial) server busy while the long prompt 1 and a stream of short prompts arrive
    arr = [0.0, 0.01] + [0.02 + 0.1 * k for k in range(40)]
    df = window(arr, [10, 2000] + [100] * 40, [20, 2] + [2] * 40)
    prof = StubProfile(max_num_seqs=1)
    sjf = run(df, "sjf_prompt", prof).requests
    aged = run(df, schedulers.get_scheduler("aging_sjf", rate=2000.0), prof).requests
    rank = lambda r: r.sort("first_token_s")["req_id"].to_list().index(1)  # noqa: E731
    assert rank(sjf) == 41 and rank(aged) < 15          # starved under sjf_prompt; served once aged
    # with rate 0 the dynamic path ranks exactly like the static sjf_prompt: the same service order and times
    zero = run(df, schedulers.get_scheduler("aging_sjf", rate=0.0), prof).requests
    assert zero["req_id"].equals(sjf["req_id"]) and zero.sort("first_token_s")["req_id"].equals(
        sjf.sort("first_token_s")["req_id"])
    assert zero["finish_s"].to_numpy() == pytest.approx(sjf["finish_s"].to_numpy(), rel=1e-12)


# --------------------------------------------------------------------------- loading


def test_unregistered_scheduler_fails_at_once_with_the_plugin_hint(capsys):
    msg = "scheduler 'aging_sjf' is not registered; load its plug-in with --plugin FILE or `plugins:`"
    with pytest.raises(UnknownSchedulerError, match=re.escape(msg)):
        params.load(SMOKE, {"simulation": {"schedulers": ["fcfs", "aging_sjf"]}})
    for command in ("simulate", "analyze", "freeze"):
        assert cli.main([command, "--params", SMOKE, "--set", "simulation.schedulers=[fcfs, aging_sjf]"]) == 2
        assert msg in capsys.readouterr().err


def test_plugins_from_parameters_and_cli(tmp_path, capsys):
    own = tmp_path / "mine.yaml"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "sched.py").write_text(PLUGIN.read_text())
    own.write_text("extends: smoke.yaml\nplugins: [code/sched.py]\nsimulation: {schedulers: [fcfs, aging_sjf, lpf]}\n")
    try:
        P = params.load(own)     # relative to the parameter file; loaded before the names are checked
        assert P.plugins == (str((tmp_path / "code" / "sched.py").resolve()),)
        assert {"aging_sjf", "lpf"} <= set(schedulers.SCHEDULERS)
        _unload()
        assert cli.main(["schedulers", "--plugin", str(PLUGIN)]) == 0
        assert "| aging_sjf |" in capsys.readouterr().out
        with pytest.raises(ParameterError, match="plugins.*an existing Python file"):
            params.load(SMOKE, {"plugins": [str(tmp_path / "nope.py")]})
        broken = tmp_path / "broken.py"
        broken.write_text("x = 1\nraise RuntimeError('boom')\n")
        with pytest.raises(plugins.PluginError, match=r"broken.py.*RuntimeError: boom \(at broken.py:2\)"):
            params.load(SMOKE, {"plugins": [str(broken)]})
        with pytest.raises(ParameterError, match="no module 'no_such_module_xyz' is importable"):
            params.load(SMOKE, {"plugins": ["no_such_module_xyz"]})
    finally:
        _unload()


def _campaign_params(tmp_path, name, plugin_file, **over):
    o = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / name),   # the committed windows,
                   "manifest": str(ROOT / "data" / "windows" / "manifest.json")},             # of the sources kept
         "plugins": [str(plugin_file)],
         "simulation": {"schedulers": ["fcfs", "aging_sjf", "lpf"], "regions": ["overload"], "replicates": 1},
         "campaign": {"windows_per_source": 1, "request_records": {"windows_per_source": 0}},
         "sources": {"bailian": None, "burstgpt": None, "mooncake": None}}
    return params.load(SMOKE, params.deep_merge(o, params.undot(over)))


def test_plugin_runs_in_process_pool_and_dask_workers_with_identical_results(tmp_path, shared_traces):
    """Workers are fresh processes (spawn) or Dask workers that cannot import the plug-in by name: its
    text travels with the work."""
    code = tmp_path / "plug" / "user_scheds.py"
    code.parent.mkdir()
    code.write_text(PLUGIN.read_text())
    try:
        one = campaign.run(_campaign_params(tmp_path, "w1", code), workers=1, progress=False, verbose=False).runs
        assert set(one["scheduler"]) == {"fcfs", "aging_sjf", "lpf"} and one.height == 2 * 3
        pool = campaign.run(_campaign_params(tmp_path, "w2", code), workers=2, progress=False, verbose=False).runs
        assert pool.equals(one)
        pytest.importorskip("distributed")
        dask = campaign.run(_campaign_params(tmp_path, "dk", code), executor="dask", workers=2, progress=False,
                            verbose=False).runs
        assert dask.equals(one)
    finally:
        _unload()


def test_the_plugins_hash_is_in_every_shard_fingerprint(tmp_path):
    code = tmp_path / "user_scheds.py"
    code.write_text(PLUGIN.read_text())
    try:
        P = _campaign_params(tmp_path, "fp", code)
        plan = campaign.make_plan(P.plan_settings, manifest=windows.load_manifest(P.paths))
        fp = plan.common["plugins"]
        assert fp == [{"plugin": "user_scheds.py", "sha256": plugins.resolve(str(code)).sha256}]
        code.write_text(PLUGIN.read_text().replace("rate\": 200.0", "rate\": 300.0"))
        P2 = _campaign_params(tmp_path, "fp", code)
        plan2 = campaign.make_plan(P2.plan_settings, manifest=windows.load_manifest(P2.paths))
        assert {s.key for s in plan2.shards}.isdisjoint({s.key for s in plan.shards}), "an edit recomputes"
        assert schedulers.get_scheduler("aging_sjf").rate == 300.0, "the edited plug-in was re-executed"
    finally:
        _unload()


def test_readme_example_is_the_tested_plugin():
    readme = (ROOT / "docs" / "byo.md").read_text()
    block = readme.split("## Your own scheduler", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert block == PLUGIN.read_text(), "docs/byo.md's example and tests/plugins/myschedulers.py differ"


def test_block_size_reaches_the_engine_through_the_window_ref():
    from portbench.data import windows
    from portbench.study.campaign import SimEngine, WindowRef

    eng = SimEngine()
    ref = WindowRef("mooncake-00", "mooncake", "real", "0" * 64, 512)
    assert eng.for_window(ref).hash_block_size == 512 and eng.hash_block_size is None
    assert eng.for_window(WindowRef("azure-00", "azure", "real", "0" * 64)) is eng
    assert "block_size" not in WindowRef("a", "azure", "real", "0").fingerprint()
    assert WindowRef("m", "mooncake", "real", "0", 512).fingerprint()["block_size"] == 512
    P = params.load()
    refs = {w.id: w for w in campaign.window_refs(windows.load_manifest(P.paths), P.source_names(), P.campaign)}
    assert refs["mooncake-00"].block_size == 512 and refs["azure-00"].block_size is None
    with pytest.raises(ParameterError, match="hash_block_tokens"):
        run(BURST, "fcfs", SERIAL, hash_block_tokens=0)
    assert math.isfinite(run(BURST, "fcfs", SERIAL, hash_block_tokens=512).counters["sim_end_s"])
