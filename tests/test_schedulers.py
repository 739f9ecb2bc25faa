"""The 13 schedulers: each one's defining property on a crafted workload; the registry; a
user-defined scheduler; the static priorities exported to vLLM."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from portbench import params
from portbench.present import text as present_text
from portbench.sim import engine as simulator
from portbench.sim import schedulers
from portbench.core.errors import DataError, ParameterError
from portbench.sim.schedulers import BaseScheduler, register_scheduler
from test_simulator import SLO, StubProfile, run, window

ALL13 = ("fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "srpt_oracle", "sjf_predicted", "ltr", "mlfq", "las",
         "rr", "edf", "vtc", "random")
NON_PREEMPTIVE = ("fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "sjf_predicted", "ltr", "edf", "vtc", "random")
PREEMPTIVE = ("srpt_oracle", "mlfq", "las", "rr")
SERIAL = StubProfile(max_num_seqs=1)          # one request at a time: service order is observable


def first_token_order(res) -> list[int]:
    r = res.requests.filter(pl.col("first_token_s").is_not_nan()).sort(["first_token_s", "req_id"])
    return r["req_id"].to_list()


def finish_order(res) -> list[int]:
    r = res.requests.filter(pl.col("finish_s").is_not_nan()).sort(["finish_s", "req_id"])
    return r["req_id"].to_list()


# --------------------------------------------------------------------------- registry


def test_the_13_are_registered_with_their_properties():
    assert set(ALL13) <= set(schedulers.SCHEDULERS)
    for name in ALL13:
        s = schedulers.get_scheduler(name)
        assert s.name == name and s.information in schedulers.INFORMATION and s.models
        assert s.preemptive == (name in PREEMPTIVE)
        assert s.chunked_prefill == (name == "sarathi")
        assert type(s).__doc__ and len(type(s).__doc__) > 80
    info = {n: schedulers.SCHEDULERS[n].information for n in ALL13}
    assert info["fcfs"] == "arrival" and info["sjf_prompt"] == "prompt" and info["sjf_oracle"] == "oracle"
    assert info["sjf_predicted"] == "predicted" and info["ltr"] == "predicted" and info["vtc"] == "tenant"
    assert info["random"] == "none" and info["edf"] == "predicted"
    # `all` is the 13; the comparison variants are registered, labelled oracle, and outside it
    assert schedulers.names("all") == list(ALL13)
    for name in ("edf_oracle", "edf_noisy_oracle", "sjf_noisy_oracle", "ltr_noisy_oracle"):
        assert schedulers.SCHEDULERS[name].information == "oracle" and "oracle" in schedulers.uses(name)
    for name in schedulers.SCHEDULERS:
        used = schedulers.uses(name)
        assert set(used) <= set(schedulers.INFORMATION), name
        assert ("oracle" in used) == name.endswith("_oracle"), name
    assert schedulers.uses("las") == ("attained",) and schedulers.uses("rr") == ("arrival", "attained")
    assert schedulers.uses("edf") == ("arrival", "predicted")
    table = present_text.schedulers_markdown()
    for name in ALL13:
        assert f"| {name} |" in table
    for name in ("sjf_predicted", "ltr", "edf"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert "| predicted |" in row
    assert "Sarathi-Serve" in table and "OSDI'24" in table and "NeurIPS'24" in table


def test_get_scheduler_errors_name_the_parameter():
    with pytest.raises(ParameterError) as e:
        schedulers.get_scheduler("fifo")
    assert e.value.param == "simulation.schedulers" and "fcfs" in e.value.expected
    with pytest.raises(ParameterError) as e:
        schedulers.get_scheduler("rr", quantum=3)
    assert e.value.param == "simulation.scheduler_options.rr" and "quantum_tokens" in e.value.expected
    with pytest.raises(ParameterError) as e:
        schedulers.get_scheduler("rr", quantum_tokens=0)
    assert e.value.param == "simulation.scheduler_options.rr.quantum_tokens"
    with pytest.raises(ParameterError):
        schedulers.get_scheduler("sjf_predicted", sigma=-1)
    with pytest.raises(ParameterError):
        schedulers.get_scheduler("edf", slo={"ttft_s": 0})
    with pytest.raises(ParameterError):
        schedulers.get_scheduler("fcfs", preemptive="yes")
    with pytest.raises(ParameterError):
        schedulers.get_scheduler("fcfs", chunked_prefill=1)
    assert schedulers.get_scheduler("sjf_oracle", chunked_prefill=True).chunked_prefill
    assert not schedulers.get_scheduler("sarathi", chunked_prefill=False).chunked_prefill
    assert schedulers.get_scheduler("sarathi").chunked_prefill


def test_options_from_params():
    sim = params.load(overrides={"simulation.predictor_sigma": 0.25, "simulation.edf_slo": "tight",
                                 "simulation.scheduler_options": {"rr": {"quantum_tokens": 8},
                                                                  "ltr_noisy_oracle": {"sigma": 1.0}}}).simulation
    assert schedulers.options_for(sim, "sjf_noisy_oracle") == {"sigma": 0.25}
    assert schedulers.options_for(sim, "ltr_noisy_oracle") == {"sigma": 1.0}
    assert schedulers.options_for(sim, "sjf_predicted") == {} and schedulers.options_for(sim, "ltr") == {}
    assert schedulers.options_for(sim, "edf") == {"slo": {"ttft_s": 0.5, "tpot_s": 0.05}}
    assert schedulers.options_for(sim, "edf_oracle") == {"slo": {"ttft_s": 0.5, "tpot_s": 0.05}}
    assert schedulers.options_for(sim, "edf_noisy_oracle") == {"slo": {"ttft_s": 0.5, "tpot_s": 0.05}, "sigma": 0.25}
    assert schedulers.options_for(sim, "rr") == {"quantum_tokens": 8}
    assert schedulers.options_for(sim, "fcfs") == {}
    assert schedulers.scheduler_for(sim, "rr").quantum_tokens == 8


@pytest.fixture
def user_scheduler():
    """A policy defined in this test file, registered with one decorator (removed afterwards)."""

    @register_scheduler
    class LongestPromptFirst(BaseScheduler):
        """Longest prompt first (a user's example policy)."""

        name = "test_lpf"
        information = "prompt"
        models = "test example"

        def priority(self, r, now):
            return -r.prompt_tokens

    yield LongestPromptFirst
    schedulers.SCHEDULERS.pop("test_lpf", None)


def test_a_user_scheduler_runs_with_one_decorator(user_scheduler, tmp_path):
    assert schedulers.SCHEDULERS["test_lpf"] is user_scheduler
    assert "| test_lpf |" in present_text.schedulers_markdown()
    df = window([0, 0, 0, 0], [10, 300, 50, 200], [5, 5, 5, 5])
    res = run(df, "test_lpf", SERIAL)
    assert first_token_order(res) == [1, 3, 2, 0]
    res.check()
    # the parameter layer accepts it like a built-in, and so does the campaign's engine
    from portbench.sim import settings
    from portbench.study import campaign

    sim = params.load(overrides={"simulation.schedulers": ["fcfs", "test_lpf"]}).simulation
    settings.validate(sim)
    eng = campaign.SimEngine()
    rr = eng.run(df.with_columns(pl.Series("arrival_s", [0.0, 0.5, 1.0, 1.5])), "test_lpf", 0, 30.0, sim)
    assert rr.counters["completed"] == 4


def test_register_forms_and_conflicts():
    class A(BaseScheduler):
        """A."""
        name = "test_a"
        information = "arrival"

    class B(BaseScheduler):
        """B."""
        name = "test_b"
        information = "arrival"

    try:
        assert register_scheduler(A) is A
        assert register_scheduler("test_b2", B) is B and schedulers.SCHEDULERS["test_b2"] is B
        assert register_scheduler(name="test_c")(A) is A
        with pytest.raises(ParameterError):
            register_scheduler("test_a", B)            # a different class under a taken name
        register_scheduler("test_a", B, replace=True)
        assert schedulers.SCHEDULERS["test_a"] is B

        class Bad:
            name = "test_bad"
            information = "arrival"
        with pytest.raises(ParameterError):
            register_scheduler(Bad)
        class BadInfo(BaseScheduler):
            name = "test_badinfo"
            information = "telepathy"
        with pytest.raises(ParameterError):
            register_scheduler(BadInfo)
    finally:
        for k in ("test_a", "test_b", "test_b2", "test_c", "test_bad", "test_badinfo"):
            schedulers.SCHEDULERS.pop(k, None)


# --------------------------------------------------------------------------- defining properties


def test_fcfs_keeps_arrival_order():
    rng = np.random.default_rng(0)
    arr = np.sort(rng.uniform(0, 1, 40))
    df = window(arr, rng.integers(10, 400, 40), rng.integers(2, 60, 40))
    for prof in (SERIAL, StubProfile(max_num_seqs=4), StubProfile(kv_capacity_blocks=60)):
        res = run(df, "fcfs", prof)
        assert first_token_order(res) == list(range(40))
    assert finish_order(run(df, "fcfs", SERIAL)) == list(range(40))


def test_sjf_oracle_serves_shortest_output_first_and_does_not_preempt():
    out = [50, 5, 30, 1, 12]
    res = run(window([0] * 5, [100] * 5, out), "sjf_oracle", SERIAL)
    assert finish_order(res) == list(np.argsort(out, kind="stable"))
    # a shorter job arriving later waits for the running one (non-preemptive)
    res = run(window([0, 0.05], [100, 100], [200, 2]), "sjf_oracle", SERIAL)
    assert finish_order(res) == [0, 1] and res.counters["pauses"] == res.counters["preemptions"] == 0


def test_sjf_prompt_serves_shortest_prompt_first():
    prompt = [400, 20, 130, 64, 1000]
    res = run(window([0] * 5, prompt, [10] * 5), "sjf_prompt", SERIAL)
    assert first_token_order(res) == list(np.argsort(prompt, kind="stable"))


@pytest.mark.parametrize("name", ["srpt_oracle", "las", "mlfq"])
def test_srpt_las_mlfq_preempt_a_long_job_for_a_new_short_one(name):
    """Batch slots bind (max_num_seqs = 1): the long job is paused (KV kept, no recompute) and the
    short one, arriving later, finishes first. FCFS makes it wait."""
    df = window([0, 1.0], [100, 100], [300, 5])
    res = run(df, name, SERIAL)
    assert finish_order(res) == [1, 0]
    assert res.counters["pauses"] >= 1 and res.counters["preemptions"] == 0
    assert finish_order(run(df, "fcfs", SERIAL)) == [0, 1]


@pytest.mark.parametrize("name", ["srpt_oracle", "las"])
def test_preemption_for_priority_evicts_when_memory_is_needed(name):
    """KV for only one of them (8 blocks = 128 tokens): the running long job is evicted (recompute)
    to admit the short one; a non-preemptive policy lets the short one wait."""
    prof = StubProfile(kv_capacity_blocks=8)
    df = window([0, 1.0], [60, 60], [60, 4])
    res = run(df, name, prof)
    assert finish_order(res) == [1, 0]
    assert res.requests["preemptions"].to_list() == [1, 0]
    fc = run(df, "fcfs", prof)
    assert finish_order(fc) == [0, 1] and fc.counters["preemptions"] == 0


def test_non_preemptive_policies_only_preempt_for_memory():
    """Plenty of KV, few batch slots, arrivals far above capacity: the non-preemptive policies never
    pause or evict; the preemptive ones pause (and never need to evict)."""
    rng = np.random.default_rng(3)
    n = 80
    df = window(np.sort(rng.uniform(0, 2, n)), rng.integers(20, 300, n), rng.integers(2, 120, n),
                [f"t{i}" for i in rng.integers(0, 3, n)])
    prof = StubProfile(kv_capacity_blocks=100_000, max_num_seqs=4)
    for name in ALL13:
        c = run(df, name, prof, seed=1).counters
        if name in NON_PREEMPTIVE:
            assert c["pauses"] == 0 and c["preemptions"] == 0, name
        else:
            assert c["pauses"] > 0 and c["preemptions"] == 0, name
    # with a tight KV cache every policy may have to evict, and non-preemptive ones still never pause
    tight = StubProfile(kv_capacity_blocks=40, max_num_seqs=64)
    evicted = 0
    for name in NON_PREEMPTIVE:
        c = run(df, name, tight, seed=1).counters
        assert c["pauses"] == 0, name
        assert c["kv_max_used_blocks"] <= 40
        evicted += c["preemptions"]
    assert evicted > 0


def test_vtc_equalises_service_across_tenants():
    """Tenant a floods the queue first (40 requests), tenant b right after (40 identical ones). Two
    batch slots; at mid-run FCFS has served almost only a, VTC serves both about equally."""
    n = 40
    arr = [0.001 * i for i in range(n)] + [0.05 + 0.001 * i for i in range(n)]
    df = window(arr, [100] * (2 * n), [20] * (2 * n), ["a"] * n + ["b"] * n)
    prof = StubProfile(max_num_seqs=2)
    full = run(df, "fcfs", prof).requests["finish_s"].max()
    h = 0.5 * full

    def tokens_by_tenant(name):
        r = run(df, name, prof, horizon=h).requests
        g = r.group_by("tenant").agg(pl.col("generated_tokens").sum()).sort("tenant")
        return dict(zip(g["tenant"], g["generated_tokens"]))

    v, f = tokens_by_tenant("vtc"), tokens_by_tenant("fcfs")
    assert abs(v["a"] - v["b"]) <= 0.1 * (v["a"] + v["b"])
    assert f["a"] > 4 * max(f["b"], 1)


def test_vtc_counter_lift_and_charges():
    s = schedulers.get_scheduler("vtc")
    df = window([0, 0, 0], [10, 10, 10], [3, 3, 3], ["a", "b", "a"])
    from portbench.sim.request import requests_from_window
    reqs, ctx = requests_from_window(df, StubProfile(), np.random.default_rng(0))
    s.reset(ctx)
    s.on_arrival(reqs[0], 0.0)
    s.on_admit(reqs[0], 0.0)
    assert s._counter["a"] == 10                      # w_prompt x prompt
    s.on_tokens([reqs[0]], 3, lambda i: 0.0)
    assert s._counter["a"] == 10 + 2 * 3              # w_output x tokens
    s.on_arrival(reqs[1], 0.1)                        # b: queue empty -> lifted to the last left (a)
    assert s._counter["b"] == 16


def test_edf_meets_deadlines_fcfs_misses():
    """Serial engine, all at t=0; deadline = arrival + ttft + tpot x (output - 1). edf_oracle builds it
    from the truth, edf from the frozen prediction: with a perfect prediction they are the same, with
    an uninformative one (all predicted equal) edf is FCFS."""
    out = [120, 3, 40, 2, 8, 90]
    slo = {"ttft_s": 0.3, "tpot_s": 0.05}
    deadline = np.array([slo["ttft_s"] + slo["tpot_s"] * (o - 1) for o in out])

    def met(name, predicted):
        df = window([0] * 6, [50] * 6, out, predicted=predicted)
        r = simulator.simulate(df, name, SERIAL, horizon_s=math.inf, seed=0, slo=slo).requests
        return int((r["finish_s"].to_numpy() <= deadline + 1e-12).sum())

    assert met("edf_oracle", None) > met("fcfs", None)
    assert met("edf_oracle", None) == len(out)
    assert met("edf", out) == len(out)                       # perfect prediction
    assert met("edf", [7] * 6) == met("fcfs", None)          # no information: arrival order


def test_random_changes_with_the_seed_only():
    df = window([0] * 30, [100] * 30, [10] * 30)
    orders = {seed: first_token_order(run(df, "random", SERIAL, seed=seed)) for seed in (0, 1, 2)}
    assert orders[0] == first_token_order(run(df, "random", SERIAL, seed=0))
    assert orders[0] != orders[1] and orders[1] != orders[2]
    assert sorted(orders[0]) == list(range(30)) and orders[0] != list(range(30))


def test_sarathi_never_exceeds_the_token_budget_and_never_stalls_decodes():
    rng = np.random.default_rng(1)
    n = 60
    df = window(np.sort(rng.uniform(0, 3, n)), rng.integers(50, 2000, n), rng.integers(5, 200, n))
    prof = StubProfile(max_num_seqs=64, max_batched_tokens=1024)
    sarathi = schedulers.get_scheduler("sarathi", prefill_token_budget=256)
    for engine in ({}, {"batching": "v0"}):          # sarathi chunks under both engines
        res = run(df, sarathi, prof, record_iterations=True, engine=engine)
        it = res.iterations
        assert (it["prefill_tokens"] + it["decode_seqs"] <= 256).all()
        assert (it.filter(pl.col("prefill_tokens") > 0).height > 0)
        mixed = it.filter((pl.col("prefill_tokens") > 0) & (pl.col("decode_seqs") > 0)).height
        assert mixed > 0
    # its default budget is Sarathi-Serve's 512 tokens, not the profile's (vLLM's) budget
    assert schedulers.get_scheduler("sarathi").prefill_token_budget == 512
    # prefill-first FCFS (V0) stalls decodes instead: its prefill iterations never carry decodes
    fc = run(df, "fcfs", prof, record_iterations=True, engine={"batching": "v0"}).iterations
    assert fc.filter((pl.col("prefill_tokens") > 0) & (pl.col("decode_seqs") > 0)).height == 0
    # V1 FCFS mixes them too, under vLLM's (the profile's) larger budget
    f1 = run(df, "fcfs", prof, record_iterations=True).iterations
    assert f1.filter((pl.col("prefill_tokens") > 0) & (pl.col("decode_seqs") > 0)).height > 0
    assert (f1["prefill_tokens"] + f1["decode_seqs"] <= 1024).all() and (f1["prefill_tokens"] > 256).any()
    # stall-free: no iteration of sarathi leaves a running decode out (TPOT of long requests is
    # bounded by a full-budget iteration)
    r = res.requests.filter(pl.col("output_tokens") > 1)
    tpot = ((r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)).max()
    full = prof.iteration_time(256, 0, 0) + prof.c_kv_s * (n * 2200)
    assert tpot <= full


def test_mlfq_demotes_by_token_quantum():
    s = schedulers.get_scheduler("mlfq", quantum_tokens=4, levels=4)
    df = window([0, 0], [10, 3000], [100, 100])
    from portbench.sim.request import requests_from_window
    reqs, ctx = requests_from_window(df, StubProfile(), np.random.default_rng(0))
    s.reset(ctx)
    short, long_prompt = reqs
    assert s.level(short) == 0
    levels = []
    for g in range(0, 70):
        short.generated = g
        levels.append(s.level(short))
    # quanta 4, 8, 16 tokens at levels 0, 1, 2; the last level keeps the request
    assert levels[:4] == [0] * 4 and levels[4:12] == [1] * 8 and levels[12:28] == [2] * 16
    assert set(levels[28:]) == {3}
    # skip-join: a long prompt's prefill is worth many decode iterations -> it joins lower
    assert s.level(long_prompt) > 0
    # behaviour (one batch slot): job 1 arrives while job 0 is in level 0. Same level -> FCFS, so
    # job 1 waits until job 0 has used its level-0 quantum and is demoted; then it preempts it.
    df = window([0, 0.015], [16, 16], [300, 5])
    ttft = {}
    for q in (4, 64):
        res = run(df, schedulers.get_scheduler("mlfq", quantum_tokens=q), SERIAL, record_iterations=True)
        assert finish_order(res) == [1, 0] and res.counters["pauses"] >= 1
        ttft[q] = res.requests["first_token_s"][1] - 0.015
    per_token = SERIAL.iteration_time(0, 1, 17)
    assert ttft[4] < 6 * per_token + 0.1
    assert ttft[64] > 60 * per_token              # waited for job 0's 64-token quantum


def test_rr_time_slices_when_the_batch_is_full():
    df = window([0, 0], [50, 50], [400, 400])
    rr = run(df, schedulers.get_scheduler("rr", quantum_tokens=50), SERIAL)
    fc = run(df, "fcfs", SERIAL)
    assert rr.counters["pauses"] >= 6                 # 400 tokens / 50 per turn, alternating
    f_rr, f_fc = rr.requests["finish_s"].to_list(), fc.requests["finish_s"].to_list()
    assert abs(f_rr[0] - f_rr[1]) < 0.2 * max(f_rr)   # both finish near the end
    assert f_fc[0] < 0.6 * f_fc[1]                    # FCFS: one after the other
    # with room for both, RR never slices
    assert run(df, "rr", StubProfile()).counters["pauses"] == 0


def test_ltr_starvation_protection():
    """A long request (id 1) in a stream of short ones arriving faster than they are served:
    ranked last, it starves until it has waited starvation_s; then it is served first."""
    n = 60
    arr = [0.0, 0.001] + [0.002 + 0.05 * i for i in range(n)]
    out = [3, 400] + [3] * n
    df = window(arr, [50] * (n + 2), out, predicted=out)       # a perfect ranker
    with_protection = run(df, schedulers.get_scheduler("ltr", starvation_s=0.5), SERIAL)
    without = run(df, schedulers.get_scheduler("ltr", starvation_s=None), SERIAL)
    t_with = with_protection.requests["first_token_s"][1]
    t_without = without.requests["first_token_s"][1]
    assert 0.5 < t_with < 0.5 + 0.2 < 2.0 < t_without


def test_edf_noisy_oracle_is_edf_on_a_noisy_true_length():
    """sigma = 0: exactly edf_oracle (the true length's deadline); sigma > 0: the deadline of true x lognormal
    noise, a different order per seed (the equal-information control's variant of edf)."""
    out = [120, 3, 40, 2, 8, 90, 15, 60, 1, 30]
    slo = {"ttft_s": 0.3, "tpot_s": 0.05}
    df = window([0] * len(out), [50] * len(out), out)

    def order(s, seed=0):
        return first_token_order(simulator.simulate(df, s, SERIAL, horizon_s=math.inf, seed=seed, slo=slo))
    exact = order(schedulers.get_scheduler("edf_noisy_oracle", sigma=0.0))
    assert exact == order("edf_oracle")
    noisy = [order(schedulers.get_scheduler("edf_noisy_oracle", sigma=1.5), seed=s) for s in (0, 1, 2)]
    assert any(n != exact for n in noisy) and len({tuple(n) for n in noisy}) > 1


def test_sjf_noisy_oracle_noise():
    df = window([0] * 25, [100] * 25, list(range(1, 26))[::-1])
    exact = run(df, schedulers.get_scheduler("sjf_noisy_oracle", sigma=0.0), SERIAL)
    assert first_token_order(exact) == first_token_order(run(df, "sjf_oracle", SERIAL))
    noisy = [first_token_order(run(df, schedulers.get_scheduler("sjf_noisy_oracle", sigma=1.0), SERIAL, seed=s))
             for s in (0, 1)]
    assert noisy[0] != noisy[1] and noisy[0] != first_token_order(exact)


def test_sjf_predicted_and_ltr_follow_the_frozen_predictions_only():
    """The service order is the order of the predictions, whatever the true lengths and the seed;
    a run without predictions is a clear error."""
    rng = np.random.default_rng(5)
    out = rng.integers(1, 300, 25).tolist()
    pred = rng.uniform(1, 300, 25).tolist()
    df = window([0] * 25, [100] * 25, out, predicted=pred)
    want = list(np.argsort(pred, kind="stable"))
    for name, opts in (("sjf_predicted", {}), ("ltr", {"starvation_s": None})):
        for seed in (0, 1):
            sched = schedulers.get_scheduler(name, **opts)
            assert first_token_order(run(df, sched, SERIAL, seed=seed)) == want, name
    bare = df.drop("predicted_output", "ltr_score")
    for name in ("sjf_predicted", "ltr", "edf"):
        with pytest.raises(DataError) as e:
            run(bare, name, SERIAL)
        assert "frozen predictions" in str(e.value)


# --------------------------------------------------------------------------- vLLM static priorities


def test_static_priorities_reproduce_the_simulated_admission_order():
    rng = np.random.default_rng(4)
    n = 30
    df = window([0.0] * n, rng.integers(10, 500, n), rng.integers(1, 200, n))
    assert set(schedulers.VLLM_STATIC_PRIORITY) == {"sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "ltr",
                                                     "random"}
    for name in schedulers.VLLM_STATIC_PRIORITY:
        pr = schedulers.static_priority(name, df, seed=9, slo=SLO)
        assert pr.dtype == np.int64 and sorted(pr.tolist()) == list(range(n))
        sched = schedulers.get_scheduler(name, **({"starvation_s": None} if name == "ltr" else {}))
        res = simulator.simulate(df, sched, SERIAL, horizon_s=math.inf, seed=9, slo=SLO)
        assert first_token_order(res) == list(np.argsort(pr)), name
    out = df["output_tokens"].to_list()
    pr = schedulers.static_priority("sjf_oracle", df, seed=0)
    assert [out[i] for i in np.argsort(pr)] == sorted(out)
    with pytest.raises(ParameterError):
        schedulers.static_priority("las", df, seed=0)
