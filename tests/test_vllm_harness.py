"""The replay harness and a short validation end to end on vLLM's CPU build (``make test-vllm``, in .venv-vllm).

A tiny Llama architecture (2 layers, hidden 128, vocabulary 1000; ``model_configs/tiny_llama``) with
dummy weights, no tokenizer, eager mode, one OpenMP thread. One engine runs fcfs and the static ``sjf_prompt``
through vLLM's priority policy (the replay client's tests); the planted reversal ``delay_shortest`` runs on an
instance of its own (its scheduler class); the two-case end-to-end runs :func:`portbench.validation.pipeline.execute`
(one engine instance per policy, the A/A pairs' twin) and the GPU run's dry run. Marked
``vllm``: the main environment's ``make test`` deselects it (``-m "not vllm"``) and then runs
``make test-vllm``.

Busy-machine rule: no assertion depends on how fast or how loaded the machine is. The tests assert on
the engine's own records (per-request timestamps and per-step rows) and on orderings, and the windows
are *event-based* where an outcome would otherwise hang on a time margin: a request that must find
another one running is submitted only once the engine's outputs show that one has generated k tokens
(``ReplayRequest.after``), and the horizon of the abort test is "request 1 has generated 50 tokens"
(``Replayer.replay(stop_when=...)``), not a number of seconds. Run under load: see the README (two CPU
burners beside ``make test-vllm``).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import polars as pl
import pytest

pytestmark = pytest.mark.vllm

LONG_OUT = 600       # the long request of OVERTAKE and DISPLACE
SIMULTANEOUS = pl.DataFrame({            # six requests arriving together
    "arrival_s": [0.0] * 6,
    "prompt_tokens": [40, 24, 56, 32, 48, 16],
    "output_tokens": [6, 9, 5, 8, 7, 4],
    "tenant": ["t0", "t1", "t0", "t1", "t0", "t1"],
})
OVERTAKE = pl.DataFrame({                # a long request; three long prompts queue behind it; a short prompt comes later
    "arrival_s": [0.0] * 5,
    "prompt_tokens": [64, 200, 180, 160, 16],
    "output_tokens": [LONG_OUT, 8, 8, 8, 8],
    "tenant": ["t0"] * 5,
})
PLANTED = pl.DataFrame({                 # a long request; four others queue behind it, shortest first
    "arrival_s": [0.0] * 5,
    "prompt_tokens": [64, 16, 120, 160, 200],
    "output_tokens": [LONG_OUT, 8, 8, 8, 8],
    "tenant": ["t0"] * 5,
})
LONG = pl.DataFrame({"arrival_s": [0.0, 0.0], "prompt_tokens": [8, 32], "output_tokens": [2, 3000],
                     "tenant": ["t0", "t1"]})
# Event-based arrivals (req_id -> ((watched req_id, tokens it has generated), ...)). The queued requests
# come once request 0 runs; the short one once it has 20 tokens, i.e. >= 19 engine steps after them, so it
# reaches the engine after them; request 0 then still has 580 of its 600 tokens to go.
GATES = {
    "overtake": {1: ((0, 1),), 2: ((0, 1),), 3: ((0, 1),), 4: ((0, 20),)},
    "planted": {1: ((0, 1),), 2: ((0, 1),), 3: ((0, 1),), 4: ((0, 1),)},
    "long": {1: ((0, 2),)},          # request 1 starts once request 0 has finished (2 tokens)
}
LONG_STOP = (1, 50)                  # LONG's horizon: request 1 has generated 50 of its 3000 tokens
WINDOWS = {"simultaneous": SIMULTANEOUS, "overtake": OVERTAKE}
SHORT = 4            # req_id of OVERTAKE's short-prompt request
QUEUED = (1, 2, 3)   # OVERTAKE's requests waiting behind request 0 when SHORT arrives
HORIZON_S = 600.0    # far beyond any window here: every request finishes (the call returns when they have)
MAX_MODEL_LEN = 4096


@pytest.fixture(scope="module")
def env(root):
    cache = root / "build" / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    for k, v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CACHE_ROOT": str(cache),
                 "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "VLLM_NO_USAGE_STATS": "1",
                 "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}.items():
        os.environ.setdefault(k, v)
    import vllm  # noqa: F401 - fails loudly (not a skip) when the vLLM environment is broken

    return cache


def _spec():
    from portbench.validation import replay

    return replay.EngineSpec(model="tiny_llama", max_num_seqs=1, max_batched_tokens=512, block_size=32,
                             num_gpu_blocks=256, dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN,
                             gpu_memory_utilization=0.05, seed=0, env=dict(replay.CPU_ENGINE_ENV))


def _gated(reqs, name):
    import dataclasses

    gates = GATES.get(name, {})
    return [dataclasses.replace(r, after=gates.get(r.req_id, ())) for r in reqs]


@pytest.fixture(scope="module")
def replays(env, tmp_path_factory):
    """One engine; {policy: {window: records}}, the step log, the LONG replay and where it ended."""
    import time

    from portbench.validation import replay

    import dataclasses

    from portbench import vllm as pbv

    log = tmp_path_factory.mktemp("vllm") / "iterations.jsonl"
    out = {"records": {}, "log": log}
    t = time.perf_counter()
    # one engine instance per policy, each its scheduler class (portbench.vllm), one step log; fcfs's last (LONG)
    for pol in ("sjf_prompt", "fcfs"):
        spec = dataclasses.replace(_spec(), extra={"scheduler_cls": pbv.engine_args(pol)["scheduler_cls"]})
        with replay.Replayer(spec, log) as r:
            for name, df in WINDOWS.items():
                reqs, rej = replay.build_requests(df, vocab_size=1000, seed=7, max_model_len=MAX_MODEL_LEN)
                assert not rej
                out["records"].setdefault(pol, {})[name] = r.replay(_gated(reqs, name), horizon_s=HORIZON_S,
                                                                   policy=pol, tag=f"{name}")
            if pol == "fcfs":
                out["startup_s"] = r.startup_s
                out["long"], out["long_horizon_s"], out["before_long"] = _long(r)
    print(f"\n[vllm harness] engine start {out['startup_s']:.1f} s, every replay {time.perf_counter() - t:.1f} s")
    return out


def _long(r):
    """LONG on the started instance ``r``: its records, where its observation ended, when it started."""
    import time

    from portbench.validation import replay

    reqs, _ = replay.build_requests(LONG, vocab_size=1000, seed=8, max_model_len=MAX_MODEL_LEN)
    before = time.monotonic()
    rec = r.replay(_gated(reqs, "long"), horizon_s=HORIZON_S, policy="fcfs", tag="long", stop_when=LONG_STOP)
    return rec, r.last_horizon_s, before


def _all_records(replays):
    return [(pol, name, rec) for pol, d in replays["records"].items() for name, rec in d.items()]


def _source(name):
    return {"simultaneous": SIMULTANEOUS, "overtake": OVERTAKE}[name]


def test_every_request_finishes_with_exactly_its_output_length(replays):
    for pol, name, rec in _all_records(replays):
        src = _source(name)
        assert rec.height == src.height, (pol, name)
        assert rec["status"].to_list() == ["finished"] * src.height, (pol, name, rec["status"].to_list())
        assert rec["streamed_tokens"].to_list() == src["output_tokens"].to_list(), (pol, name)
        assert rec["generated_tokens"].to_list() == src["output_tokens"].to_list()
        assert rec["finish_s"].is_not_nan().all() and rec["first_token_s"].is_not_nan().all()


def test_the_two_clocks_are_reconciled(replays):
    from portbench.validation import replay

    for pol, name, rec in _all_records(replays):
        assert replay.clock_problems(rec) == [], (pol, name)
        # never sent early, and a later arrival never sent before an earlier one (ties: any order)
        assert rec["submit_lag_s"].min() >= -1e-3, (pol, name)
        g = rec.group_by("scheduled_arrival_s").agg(pl.col("arrival_s").min().alias("lo"),
                                                    pl.col("arrival_s").max().alias("hi")).sort("scheduled_arrival_s")
        assert np.all(g["lo"].to_numpy()[1:] >= g["hi"].to_numpy()[:-1]), (pol, name)


def _served_out_of_turn(rec) -> list[tuple[int, int]]:
    """With one batch slot (max_num_seqs=1), vLLM's FCFS rule on the engine's own timestamps: each time
    the scheduler took a request, no request waiting then (queued before that step began, scheduled
    later) had an earlier arrival stamp. Returns the (taken, passed over) pairs that break it."""
    r = rec.sort("scheduled_s").select("req_id", "queued_s", "scheduled_s", "engine_arrival_s").to_dicts()
    bad = []
    for j in r:
        for i in r:
            if i["queued_s"] < j["scheduled_s"] < i["scheduled_s"] and i["engine_arrival_s"] < j["engine_arrival_s"]:
                bad.append((j["req_id"], i["req_id"]))
    return bad


def test_fcfs_serves_simultaneous_arrivals_in_arrival_order(replays):
    # simultaneous arrivals reach the engine in request-id order (the client's one release clock): FCFS is the
    # order vLLM stamped them in
    for name in ("simultaneous", "overtake"):
        assert _served_out_of_turn(replays["records"]["fcfs"][name]) == [], name
    for pol, by_window in replays["records"].items():
        if "simultaneous" not in by_window:
            continue
        sim = by_window["simultaneous"]
        assert sim.sort("arrival_s")["req_id"].to_list() == list(range(6)), pol      # the client's send order
        assert sim.sort("queued_s")["req_id"].to_list() == list(range(6)), pol       # the order vLLM got them in
    rec = replays["records"]["fcfs"]["simultaneous"].sort("scheduled_s")
    ft = rec["first_token_s"].to_numpy()
    assert np.all(np.diff(ft) > 0), ft       # one sequence at a time: strictly increasing
    fin = rec["finish_s"].to_numpy()
    assert np.all(ft[1:] >= fin[:-1] - 1e-6)  # max_num_seqs=1: each starts after the previous finished


def test_priority_policy_serves_the_short_prompt_before_the_queued_ones(replays):
    pri = replays["records"]["sjf_prompt"]["overtake"]
    row = {r["req_id"]: r for r in pri.to_dicts()}
    fin0 = row[0]["finish_s"]
    for q in QUEUED:
        # the event-based arrivals did their job (engine records): the queued requests reached the engine
        # while request 0 ran, before the short one, which came while request 0 still ran
        assert row[0]["scheduled_s"] < row[q]["queued_s"] < row[SHORT]["queued_s"] < fin0
        assert row[q]["first_token_s"] > fin0, "they really queued behind request 0"
        assert row[SHORT]["first_token_s"] < row[q]["first_token_s"], (SHORT, q)
    # the class gave the priorities inside vLLM: the client sent none
    assert (pri["priority"] == 0).all()
    # the same window under FCFS (its own instance, its class): the short prompt waits its turn
    fc = replays["records"]["fcfs"]["overtake"]
    f = {r["req_id"]: r for r in fc.to_dicts()}
    assert all(f[q]["engine_arrival_s"] < f[SHORT]["engine_arrival_s"] for q in QUEUED)
    assert all(f[SHORT]["first_token_s"] > f[q]["first_token_s"] for q in QUEUED) and (fc["priority"] == 0).all()


@pytest.fixture(scope="module")
def planted(env, tmp_path_factory):
    """PLANTED under fcfs (the recording scheduler) and under delay_shortest (its own instance, its class)."""
    import dataclasses

    from portbench.validation import engine, replay

    out = {}
    for pol, cls in (("fcfs", replay.ENGINE_SCHEDULER), (engine.PLANTED, engine.PLANTED_SCHEDULER)):
        spec = dataclasses.replace(_spec(), extra={"scheduler_cls": cls})
        with replay.Replayer(spec, tmp_path_factory.mktemp("planted") / "iterations.jsonl") as r:
            reqs, _ = replay.build_requests(PLANTED, vocab_size=1000, seed=5, max_model_len=MAX_MODEL_LEN)
            out[pol] = r.replay(_gated(reqs, "planted"), horizon_s=HORIZON_S, policy=pol, tag="planted").sort("req_id")
    return out


def test_the_planted_reversal_serves_the_longest_queued_request_first(planted):
    """delay_shortest (its scheduler class, priorities set inside vLLM's scheduler): of the four requests queued
    behind request 0, the longest starts first and the shortest last; fcfs serves them in arrival order. With one
    batch slot the order follows from the rules alone."""
    from portbench.validation import engine

    for pol, want in (("fcfs", [1, 2, 3, 4]), (engine.PLANTED, [4, 3, 2, 1])):
        rec = planted[pol]
        row = {r["req_id"]: r for r in rec.to_dicts()}
        assert all(row[q]["queued_s"] < row[0]["finish_s"] for q in (1, 2, 3, 4)), pol   # they really queued
        got = sorted((1, 2, 3, 4), key=lambda q: row[q]["first_token_s"])
        assert got == want, (pol, got)
        assert (rec["priority"] == 0).all()       # nothing was sent with the requests: the class decided


def test_metrics_come_from_the_shared_metric_function(replays):
    from portbench import params
    from portbench.sim import metrics

    P = params.load("papermill_params/smoke.yaml")
    slo = P.simulation.slo_dicts
    for _pol, _name, rec in _all_records(replays):
        m = metrics.compute(rec, HORIZON_S, slo)
        assert list(m) == metrics.metric_names(P.simulation.slo)
        ttft = (rec["first_token_s"] - rec["arrival_s"]).to_numpy()
        e2e = (rec["finish_s"] - rec["arrival_s"]).to_numpy()
        assert m["completed"] == rec.height
        assert m["ttft_p50"] == pytest.approx(np.median(ttft))
        assert m["e2e_mean"] == pytest.approx(e2e.mean())
        assert m["throughput_tok_s"] == pytest.approx(rec["output_tokens"].sum() / HORIZON_S)


def test_steps_are_recorded_and_a_profile_is_fitted(replays, tmp_path):
    from portbench.sim import profiles
    from portbench.validation import fidelity, replay

    inits, _ = replay.read_iteration_log(replays["log"])
    assert [i["portbench_policy"] for i in inits] == ["sjf_prompt", "fcfs"]       # one instance per policy
    for init in inits:
        assert (init["num_blocks"], init["block_size"], init["max_num_seqs"], init["max_model_len"],
                init["max_num_batched_tokens"], init["policy"]) == (256, 32, 1, MAX_MODEL_LEN, 512, "priority")
    it = replay.iteration_rows(replays["log"])
    before = it.filter(pl.col("t_start") < replays["before_long"])       # every window but LONG
    windows = [(pol, name) for pol, name, _ in _all_records(replays)]
    prompts = sum(int(_source(n)["prompt_tokens"].sum()) for _, n in windows)
    decodes = sum(int((_source(n)["output_tokens"] - 1).sum()) for _, n in windows)
    # every decode step once; every prompt token prefilled once (one batch slot, nothing preempted)
    assert int(before["decode_seqs"].sum()) == decodes
    assert int(before["prefill_tokens"].sum()) == prompts
    assert (it["num_reqs"] <= 1).all() and (it["iteration_s"] > 0).all() and (it["step_s"] > 0).all()
    assert int(before["preempted"].sum()) == 0
    prof = fidelity.fit_engine_profile(it, profiles.get_profile(profiles.DEFAULT_PROFILE), "vllm_cpu_tiny", floor="none")
    assert all(np.isfinite(c) and c >= 0 for c in prof.coefficients) and prof.c0_s > 0
    path = profiles.save_profile(prof, tmp_path / "engine_profile.json")
    assert profiles.get_profile(str(path)).coefficients == pytest.approx(prof.coefficients)


def test_requests_still_running_at_the_horizon_are_aborted_with_their_partial_output(replays):
    from portbench.sim import metrics
    from portbench.validation import replay

    rec = replays["long"].sort("req_id")
    horizon = replays["long_horizon_s"]
    short, cut = rec.row(0, named=True), rec.row(1, named=True)
    assert short["status"] == "finished" and short["generated_tokens"] == 2
    assert cut["engine_arrival_s"] > short["engine_arrival_s"]       # gated on the short one's 2 tokens
    # the horizon was the event "request 1 has generated 50 tokens", not a number of seconds
    assert 0 < horizon < HORIZON_S and cut["first_token_s"] < horizon
    assert cut["status"] == "aborted_at_horizon" and math.isnan(cut["finish_s"])
    assert LONG_STOP[1] <= cut["generated_tokens"] < 3000
    # the engine's step records: request 1 decoded at least the tokens it returned (1 step each after its prefill)
    steps = replay.iteration_rows(replays["log"]).filter(pl.col("t_start") >= replays["before_long"])
    assert int(steps["decode_seqs"].sum()) >= (2 - 1) + (cut["generated_tokens"] - 1)
    # the simulator's semantics: one completed request, throughput counts the partial output
    m = metrics.compute(rec, horizon, {})
    assert m["completed"] == 1
    assert m["throughput_tok_s"] == pytest.approx((2 + cut["generated_tokens"]) / horizon)


TINY_GRID = {"decode_batches": [1, 4], "decode_contexts": [32], "prefill_tokens": [32], "cached_contexts": [0, 64],
             "mixed": [[2, 32]], "rounds": 2, "reduced_rounds": 2, "steps_per_shape": 2}


def _two_cases():
    """A plan of two cases on one source: fcfs vs sjf_prompt (a study pair), and the planted reversal."""
    from portbench.validation import pipeline

    case = {"id": "key", "role": "primary", "a": "fcfs", "b": "sjf_prompt", "metric": "ttft_p90",
            "region": "overload", "sources": ["azure"], "campaign_sign": {"azure": -1},
            "selection": {"rule": "test", "strength": 1.0}}
    planted = {"id": "planted", "role": "planted", "a": "fcfs", "b": "delay_shortest", "metric": "e2e_mean",
               "region": "overload", "sources": ["azure"], "campaign_sign": {"azure": 1},
               "selection": {"rule": "test", "strength": None}}
    return pipeline.Run([case], planted, {}, 2, 2, {"alpha": 0.05, "delta": 0.05, "design_seed": 0},
                        {"sha256": "test", "code_version": {"source_sha256": "test"}},
                        {"value": 0.2, "measured": False})


def test_two_cases_end_to_end_on_the_wall_clock_engine(env, tmp_params):
    """pipeline.execute on the CPU build: step table, capacities and predictions at the engine's scale, the paired
    design on one engine instance per policy (+ the A/A twin), the verdicts; then the analysis again from the raw
    files. Structure and orders only: no assertion on a time or on which policy won."""
    from portbench.validation import design, engine, pipeline, summary_path

    P = tmp_params(**{"validation.step_grid": TINY_GRID})
    S = engine.Settings(model="tiny_llama_long", token_scale=0.125, max_num_batched_tokens=256, max_num_seqs=64,
                        block_size=32, num_blocks=632, max_model_len=16384, dtype="float32", device="cpu")
    out = pipeline.out_dir(P.paths)
    s = pipeline.execute(P, _two_cases(), mode="full", out=out, device="cpu", progress=False, settings=S,
                         budget_s=3600.0, max_horizon_s=2.0, twins=True, conformance=False)
    assert s["ran"] and json.loads(summary_path(P.paths).read_text())["cases"] == json.loads(json.dumps(s["cases"]))
    for key in ("cases", "aa", "planted", "preregistration", "design", "predictions", "capacity_rps", "step_table"):
        assert key in s, key
    (c,) = s["cases"]
    assert c["id"] == "key" and c["pair"] == ["fcfs", "sjf_prompt"] and c["k"] == 2 and c["r"] == 2
    assert c["verdict"] in ("holds", "reverses", "undetermined", "not testable")
    assert set(s["aa"]) >= {"pairs", "sigma_r", "false_reversal_rate"} and s["planted"]["detected"] in (True, False)
    # the engine-scale prediction: both policies on the virtual engine with the engine's step table, per window
    pr = s["predictions"]["key"]["azure"]
    assert len(pr["per_window"]) == 2 and len(pr["metric_a"]) == 2 and "planted" not in s["predictions"]
    # every spec ran once, in its order, with the design's columns and the engine's
    tab = pl.read_parquet(out / "raw" / "replays.parquet")
    specs = pl.read_parquet(out / "raw" / "specs.parquet")
    assert tab.height == specs.height == 2 * 2 * 2 * 2
    assert set(design.TABLE_COLUMNS) <= set(tab.columns) and {"ttft_p90", "e2e_mean", "tpot_p90"} <= set(tab.columns)
    assert tab["order"].to_list() == specs["order"].to_list() and tab["replay_index"].to_list() == list(range(16))
    # one policy per instance; an A/A pair's slot b on the policy's twin, everything else on the policy's own
    for r in tab.iter_rows(named=True):
        assert r["instance"].split("@")[0] == r["policy"]
        assert r["instance"].endswith("#twin") == (r["is_aa"] and r["slot"] == "b")
    assert tab["gc_frozen"].all() and tab["steps"].min() > 0 and tab["machine_speed"].is_finite().all()
    assert set(tab["instance"].unique().to_list()) <= {"fcfs@engine", "fcfs@engine#twin", "sjf_prompt@engine",
                                                        "sjf_prompt@engine#twin", "delay_shortest@engine",
                                                        "delay_shortest@engine#twin"}
    # the analysis again from the files: the same verdicts
    again = json.loads(json.dumps(pipeline.analyze(P), default=str))
    first = json.loads(json.dumps(s, default=str))
    assert again["cases"] == first["cases"] and again["aa"] == first["aa"] and again["planted"] == first["planted"]


def test_the_gpu_run_dry_runs_on_the_cpu_build(env, tmp_params):
    """make gpu-validate's command with --dry-run: the campaign's settings set explicitly (budget 2,048,
    max_num_seqs 256, the 131,072-token context, the profile's KV cache), the step table first, the two primary
    cases on a design sized to the time left, the raw files an analysis on another machine reads."""
    from portbench.validation import gpu, pipeline

    P = tmp_params(**{"validation.step_grid": TINY_GRID})
    R = _two_cases()
    R = pipeline.Run([R.entries[0], {**R.entries[0], "id": "control", "b": "sjf_oracle"}], None, {}, 4, 2, R.rules,
                     R.preregistration, R.sigma_r)
    s = gpu.run(P, dry_run=True, plan=R, progress=False)
    st = s["engine"]["settings"]
    assert (st["max_num_batched_tokens"], st["max_num_seqs"], st["max_model_len"], st["token_scale"]) == (
        2048, 256, 131072, 1.0)
    assert st["kv_tokens"] >= 161_392 and st["model"] == gpu.DRY_MODEL and s["mode"] == "gpu-dry-run"
    assert [c["id"] for c in s["cases"]] == ["key", "control"] and s["design"]["r"] == 2 and s["design"]["k"] == 2
    raw = pipeline.out_dir(P.paths) / "raw"
    for f in ("run.json", "replays.parquet", "specs.parquet", "step_grid.parquet"):
        assert (raw / f).is_file(), f
    assert not s["design"]["twins"]
    assert pipeline.analyze(P)["design"]["replays_run"] == s["design"]["replays_run"]
