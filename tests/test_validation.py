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
import scipy.stats as st

from portbench.sim import metrics
from portbench.study import stats
from portbench.validation import cases, replay, verdict

SOURCES = ("azure", "burstgpt", "bailian")


# --------------------------------------------------------------------------- policies


def test_engine_policies_cover_every_scheduler():
    from portbench.sim import schedulers

    modes = {n: replay.engine_policy(n).mode for n in schedulers.SCHEDULERS}
    assert modes["fcfs"] == "fcfs" and modes["sarathi"] == "chunked"
    assert {n for n, m in modes.items() if m == "priority"} == set(schedulers.VLLM_STATIC_PRIORITY)
    assert {n for n, m in modes.items() if m == "excluded"} == set(replay.DYNAMIC)
    assert all(replay.EXCLUDED_REASON[n] for n in replay.DYNAMIC)


def test_priority_ranks_keep_the_order_and_share_ties():
    keys = np.array([3.5, 1.0, 3.5, -2.0, 10.0])
    r = replay.priority_ranks(keys)
    assert r.dtype == np.int64 and r.tolist() == [2, 1, 2, 0, 3]
    assert replay.priority_ranks(np.array([])).size == 0
    with pytest.raises(Exception):
        replay.priority_ranks([1.0, float("nan")])


def test_static_order_is_the_schedulers_own():
    w = pl.DataFrame({"arrival_s": [0.0, 0.1, 0.2, 0.3], "prompt_tokens": [50, 10, 30, 10],
                      "output_tokens": [5, 5, 5, 5], "tenant": ["a"] * 4})
    pr = replay.priority_ranks(replay.static_keys("sjf_prompt", w, seed=0))
    # shortest prompt first, ties by arrival
    assert np.argsort(pr, kind="stable").tolist() == [1, 3, 2, 0]


# --------------------------------------------------------------------------- cases


def test_planted_table_selects_the_runnable_reversal_and_the_control():
    sel = cases.select_cases(cases.planted_reversals(SOURCES), {"overload": 1.2})
    kinds = [c.kind for c in sel.cases]
    assert kinds == ["reversal", "control"]
    key, ctrl = sel.cases
    # srpt_oracle vs fcfs has the larger effect but srpt_oracle cannot run in vLLM
    assert (key.a, key.b) == ("fcfs", "sjf_prompt") and key.rho == 1.2
    assert key.min_rel == pytest.approx(0.20)
    assert np.sign(key.sides[0].diff) != np.sign(key.sides[1].diff)
    assert (ctrl.a, ctrl.b) == ("random", "sjf_oracle") and set(ctrl.sources) == set(SOURCES)
    assert (ctrl.region, ctrl.metric) == (key.region, key.metric)
    assert "srpt_oracle" in sel.excluded
    t = sel.table()
    assert t.height == 2 + 3 and set(t["better"].to_list()) == {"fcfs", "sjf_prompt", "sjf_oracle"}


def _row(a, b, s1, s2, d1, d2, r1, r2, *, sig=True, region="overload", metric="ttft_p99"):
    return {"a": a, "b": b, "source_1": s1, "source_2": s2, "region": region, "metric": metric,
            "direction": "lower", "diff_1": d1, "diff_2": d2, "rel_1": r1, "rel_2": r2,
            "reversal": bool(np.sign(d1) * np.sign(d2) < 0), "significant": sig,
            "practical": min(r1, r2) >= 0.05}


def test_key_reversal_maximises_the_smaller_side_effect():
    rev = pl.DataFrame([
        _row("fcfs", "sjf_prompt", "azure", "burstgpt", 1.0, -1.0, 0.90, 0.06),  # max 0.90, min 0.06
        _row("fcfs", "edf", "azure", "burstgpt", 1.0, -1.0, 0.20, 0.15),         # min 0.15: the winner
        _row("edf", "random", "azure", "burstgpt", 1.0, -1.0, 0.50, 0.40, sig=False),  # not significant
    ])
    key = cases.key_reversal(rev)
    assert (key.a, key.b) == ("fcfs", "edf") and key.min_rel == pytest.approx(0.15)


def test_control_needs_the_same_significant_order_on_every_source():
    rows = [
        # sarathi vs random: same sign everywhere but not significant on the bailian pairs
        _row("random", "sarathi", "azure", "burstgpt", -1, -1, 0.3, 0.3),
        _row("random", "sarathi", "azure", "bailian", -1, -1, 0.3, 0.3, sig=False),
        _row("random", "sarathi", "burstgpt", "bailian", -1, -1, 0.3, 0.3, sig=False),
        # fcfs vs sjf_oracle: stable at another region only
        *[_row("fcfs", "sjf_oracle", s1, s2, -1, -1, 0.1, 0.1, region="light")
          for s1, s2 in [("azure", "burstgpt"), ("azure", "bailian"), ("burstgpt", "bailian")]],
    ]
    ctrl = cases.stable_control(pl.DataFrame(rows))
    assert (ctrl.a, ctrl.b, ctrl.region) == ("fcfs", "sjf_oracle", "light")
    assert ctrl.sources == tuple(sorted(SOURCES))
    assert cases.stable_control(pl.DataFrame(rows[:3])) is None


def test_selection_explains_an_empty_result():
    rev = pl.DataFrame([_row("fcfs", "las", "azure", "burstgpt", 1.0, -1.0, 0.5, 0.5)])
    sel = cases.select_cases(rev)
    assert sel.cases == [] and "las" in sel.excluded
    assert any("excluded policy" in m for m in sel.messages)
    with pytest.raises(Exception, match="missing columns"):
        cases.check_reversals(rev.drop("rel_1"))


# --------------------------------------------------------------------------- requests and records


def _window():
    return pl.DataFrame({"arrival_s": [0.0, 0.5, 0.5, 2.0], "prompt_tokens": [12, 7, 3000, 5],
                         "output_tokens": [4, 1, 10, 6], "tenant": ["a", "b", "a", "b"]})


def test_build_requests_prompts_lengths_priorities_and_rejections():
    w = _window()
    reqs, rej = replay.build_requests(w, vocab_size=1000, seed=3, priorities=[3, 0, 2, 1], max_model_len=2048)
    assert rej == [2]                                    # 3000 + 10 tokens can never fit 2048
    assert [r.prompt_tokens for r in reqs] == [12, 7, 5]
    assert [r.output_tokens for r in reqs] == [4, 1, 6]
    assert [r.priority for r in reqs] == [3, 0, 1] and [r.arrival_s for r in reqs] == [0.0, 0.5, 2.0]
    assert all(0 <= t < 1000 for r in reqs for t in r.prompt_token_ids)
    again, _ = replay.build_requests(w, vocab_size=1000, seed=3, priorities=[3, 0, 2, 1], max_model_len=2048)
    assert again == reqs                                  # seeded
    other, _ = replay.build_requests(w, vocab_size=1000, seed=4, max_model_len=2048)
    assert other[0].prompt_token_ids != reqs[0].prompt_token_ids
    with pytest.raises(Exception):
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


def test_iteration_rows_and_the_fitted_profile(tmp_path):
    from portbench.sim import profiles

    true = (2e-3, 5e-5, 3e-4, 1e-7)
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(200):
        p, d, c = int(rng.integers(0, 2000)), int(rng.integers(0, 64)), int(rng.integers(100, 50000))
        t = true[0] + true[1] * p + true[2] * d + true[3] * c
        lines.append(json.dumps({"t_start": 1.0, "iteration_s": t, "prefill_tokens": p, "decode_seqs": d,
                                 "context_tokens": c, "num_reqs": 1}))
    lines.append(json.dumps({"t_start": 1.0, "iteration_s": 1e-3, "prefill_tokens": 0, "decode_seqs": 0,
                             "context_tokens": 0, "num_reqs": 0}))   # empty iteration: left out
    (tmp_path / "it.jsonl").write_text("\n".join(lines) + "\n")
    rows = replay.iteration_rows(tmp_path / "it.jsonl")
    assert rows.height == 200 and replay.iteration_rows(tmp_path / "missing.jsonl").height == 0
    prof = verdict.fit_engine_profile(rows, profiles.get_profile(profiles.DEFAULT_PROFILE), "engine")
    assert prof.coefficients == pytest.approx(true, rel=1e-6, abs=1e-12)
    assert prof.kv_capacity_blocks == profiles.get_profile(profiles.DEFAULT_PROFILE).kv_capacity_blocks
    fit = verdict.profile_fit_table(rows, prof)
    assert fit["median_abs_rel_err"].max() < 1e-6


# --------------------------------------------------------------------------- verdicts


def test_paired_side_is_the_analysis_wilcoxon_on_oriented_differences():
    rng = np.random.default_rng(1)
    a = rng.normal(2.0, 0.3, 12)
    b = a + rng.normal(0.4, 0.2, 12)                           # b is larger
    side = verdict.paired_side("azure", a, b, "lower")         # lower is better: a better
    assert side.diff > 0 and side.test_direction > 0
    assert side.p == pytest.approx(st.wilcoxon(b - a).pvalue)
    assert side.rel == pytest.approx(float(stats.relative_effect(a.mean(), b.mean())))
    hi = verdict.paired_side("azure", a, b, "higher")
    assert hi.diff < 0 and hi.p == pytest.approx(side.p)


def _engine_runs(effects, n=10, seed=0):
    """Engine runs of fcfs and sjf_prompt with the given mean difference (b - a) per source."""
    rng = np.random.default_rng(seed)
    rows = []
    for src, eff in effects.items():
        for w in range(n):
            base = rng.uniform(1, 2)
            rows.append({"source": src, "window_id": f"{src}-{w:02d}", "region": "overload", "scheduler": "fcfs",
                         "ttft_p99": base})
            rows.append({"source": src, "window_id": f"{src}-{w:02d}", "region": "overload",
                         "scheduler": "sjf_prompt", "ttft_p99": base + eff + rng.normal(0, 0.01)})
    return pl.DataFrame(rows)


def test_verdicts_reproduced_or_not():
    case = cases.select_cases(cases.planted_reversals(("azure", "burstgpt"))).cases[0]
    assert case.side("azure").diff > 0 and case.side("burstgpt").diff < 0
    # engine: fcfs lower (better) ttft on azure, worse on burstgpt -> reproduced
    good = verdict.verdict_table([case], _engine_runs({"azure": 0.5, "burstgpt": -0.5}), alpha=0.05, correction="holm")
    s = verdict.case_summary(good).row(0, named=True)
    assert s["reproduced"] and s["sign_reproduced"] and s["sign_matches"] == 2
    assert good["engine_significant"].all() and good["n_windows"].to_list() == [10, 10]
    # engine: fcfs better on both -> the reversal does not reproduce
    bad = verdict.verdict_table([case], _engine_runs({"azure": 0.5, "burstgpt": 0.5}), alpha=0.05, correction="holm")
    s = verdict.case_summary(bad).row(0, named=True)
    assert not s["reproduced"] and not s["sign_reproduced"] and s["sign_matches"] == 1


def test_simulator_error_on_hand_computed_requests():
    def rec(first, finish):
        return pl.DataFrame({"req_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0], "first_token_s": first,
                             "finish_s": finish, "output_tokens": [3, 5, 2], "rejected": [False, False, False]})
    eng = rec([0.5, 2.0, 2.5], [1.5, 4.0, float("nan")])
    sim = rec([0.25, 1.5, 2.5], [1.25, 3.5, 3.0])
    e = verdict.simulator_error(eng, sim)
    assert e["n_matched"] == 2                                  # request 2 unfinished on the engine
    assert e["ttft_engine"] == pytest.approx((0.5 + 1.0) / 2) and e["ttft_sim"] == pytest.approx((0.25 + 0.5) / 2)
    assert e["ttft_rel_err"] == pytest.approx(0.375 / 0.75 - 1)
    assert e["tpot_engine"] == pytest.approx((0.5 + 0.5) / 2) and e["tpot_sim"] == pytest.approx((0.5 + 0.5) / 2)
    assert e["e2e_mape"] == pytest.approx(np.median([abs(1.25 - 1.5) / 1.5, abs(2.5 - 3.0) / 3.0]))


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


def test_engine_arguments_follow_the_profile():
    from portbench.sim import profiles

    prof = profiles.get_profile(profiles.DEFAULT_PROFILE)
    base = replay.EngineSpec(model="llama3_8b", max_num_seqs=prof.max_num_seqs, max_batched_tokens=prof.max_batched_tokens,
                             num_gpu_blocks=prof.kv_capacity_blocks)
    fc = replay.spec_for(replay.engine_policy("fcfs"), base).engine_kwargs()
    ch = replay.spec_for(replay.engine_policy("sarathi"), base).engine_kwargs()
    pr = replay.spec_for(replay.engine_policy("sjf_oracle"), base).engine_kwargs()
    mml = min(8192, prof.kv_capacity_tokens)
    assert fc["max_model_len"] == mml and fc["num_gpu_blocks_override"] == prof.kv_capacity_blocks
    assert fc["load_format"] == "dummy" and fc["skip_tokenizer_init"] and not fc["enable_prefix_caching"]
    assert not fc["enable_chunked_prefill"] and fc["max_num_batched_tokens"] >= mml and fc["scheduling_policy"] == "fcfs"
    assert ch["enable_chunked_prefill"] and ch["max_num_batched_tokens"] == prof.max_batched_tokens
    assert pr["scheduling_policy"] == "priority" and not pr["enable_chunked_prefill"]
    assert fc["scheduler_cls"] == replay.RECORDING_SCHEDULER and fc["disable_log_stats"] is False
    with pytest.raises(Exception, match="cannot run in vLLM"):
        replay.spec_for(replay.engine_policy("las"), base)


def test_model_configs_are_real_architectures():
    big = replay.model_config("llama3_8b")
    assert big["architectures"] == ["LlamaForCausalLM"]
    assert (big["hidden_size"], big["num_hidden_layers"], big["num_attention_heads"], big["num_key_value_heads"],
            big["intermediate_size"], big["vocab_size"]) == (4096, 32, 32, 8, 14336, 128256)
    tiny = replay.model_config("tiny_llama")
    assert (tiny["num_hidden_layers"], tiny["hidden_size"], tiny["vocab_size"]) == (2, 128, 1000)
    with pytest.raises(Exception, match="shipped"):
        replay.model_dir("no_such_model")


def test_validation_params_are_checked(tmp_params):
    from portbench.core.errors import ParameterError

    P = tmp_params()
    assert P.validation.device == "auto"
    for key, bad in [("device", "tpu"), ("max_windows", 0), ("kv_blocks", "lots"), ("calibration_requests", -1),
                     ("model_config", "gpt5"), ("vllm_version", 32), ("gpu_memory_utilization", 1.5)]:
        with pytest.raises(ParameterError, match=f"validation.{key}"):
            tmp_params(**{f"validation.{key}": bad})


def test_run_without_vllm_reports_the_skip_and_the_plan(tmp_params, monkeypatch):
    from portbench import validation

    monkeypatch.setattr(replay, "installed_vllm", lambda: (None, None))
    P = tmp_params()
    report = validation.run(P, progress=False)                   # no analysis, no vLLM: never raises
    assert report["ran"] is False and "not importable" in report["skipped_because"]
    saved = json.loads((validation.out_dir(P) / "report.json").read_text())
    assert saved["ran"] is False and any("reversal table" in m for m in saved["plan"]["messages"])
    # with a reversal table the plan still shows the cases and what would run
    the_plan = validation.plan(P, cases.planted_reversals(SOURCES))
    assert not the_plan.runnable and [c.kind for c in the_plan.selection.cases] == ["reversal", "control"]
    reps = the_plan.replays()
    assert set(reps["vllm_mode"].to_list()) == {"fcfs", "priority"}
    assert (reps["windows"] == P.validation.max_windows).all()
    assert "skipped" in validation.status_markdown(the_plan)


def test_notebook_is_committed_without_outputs_and_takes_the_two_parameters(root):
    import nbformat

    nb = nbformat.read(root / "notebooks" / "08_gpu_validation.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert code[0].metadata.get("tags") == ["parameters"]
    assert code[0].source.strip() == 'params_file = "papermill_params/default.yaml"\noverrides = {}'
    assert "cfg = portbench.params.load(params_file, overrides)" in code[1].source
    assert "text.banner" in code[1].source
