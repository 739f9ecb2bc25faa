"""The engine side's pure parts without vLLM, on hand-computed cases: the settings match, the hashed prompts, the
step grid and its statistics, the whole-run prediction's measurements (the order verdicts' statistics are
tests/test_validation_design.py's)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from portbench.validation import matching


def test_settings_match_counts_requests_only_the_engine_loses():
    from portbench.sim import profiles
    prof = profiles.get_profile("a100_40gb_llama3_1_8b")
    camp = matching.campaign_settings(prof, "auto")
    df = pl.DataFrame({"prompt_tokens": [100, 9000, 20000, 200000], "output_tokens": [10, 10, 10, 10]})
    eng = matching.engine_settings(num_blocks=192, block_size=32, max_num_batched_tokens=512, max_num_seqs=256,
                                   max_model_len=1024, token_scale=0.125, prefix_caching=False,
                                   sarathi_token_budget=None)
    r = matching.settings_match(camp, eng, {"max_model_len": 1024, "usable_kv_tokens": 191 * 32, "block_size": 32},
                                {"x": df}, hash_block_tokens={"x": 512})
    src = r["sources"]["x"]
    # campaign: 200,000 >= 131,072 refused; engine (x 1/8): 9000 -> 1125 and 20000 -> 2500 >= 1024 refused too
    assert src["campaign"]["refused"] == 1 and src["engine"]["refused"] == 3
    assert src["extra_lost_share"] == pytest.approx(0.5) and not src["ok"] and not r["all_sources_ok"]
    assert not r["settings"]["max_model_len"]["match"] and r["settings"]["max_num_seqs"]["match"]
    assert src["prefix_caching"] == {"campaign": True, "engine": False, "match": False, "hash_block_tokens": 512}
    eng2 = matching.engine_settings(num_blocks=632, block_size=32, max_num_batched_tokens=256, max_num_seqs=256,
                                    max_model_len=16384, token_scale=0.125, prefix_caching=True, sarathi_token_budget=64)
    r2 = matching.settings_match(camp, eng2, {"max_model_len": 16384, "usable_kv_tokens": 631 * 32, "block_size": 32},
                                 {"x": df}, hash_block_tokens={"x": 512})
    assert r2["sources"]["x"]["extra_lost_share"] == 0 and r2["all_sources_ok"]
    assert all(r2["settings"][k]["match"] for k in ("max_model_len", "kv_cache_tokens", "max_num_batched_tokens",
                                                      "sarathi_token_budget"))
    assert r2["sources"]["x"]["prefix_caching"]["match"]


def test_default_cpu_engine_matches_the_campaign():
    """The shipped CPU settings are the campaign's x token_scale (what summary.json settings_match reports)."""
    from portbench import params
    from portbench.sim import profiles
    cfg = params.load(None)
    c = cfg.validation.cpu
    prof = profiles.get_profile(cfg.simulation.profile)
    camp = matching.campaign_settings(prof, cfg.engine.prefix_caching)
    eng = matching.engine_settings(num_blocks=int(c.kv_blocks), block_size=c.block_size,
                                   max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
                                   max_model_len=c.max_model_len, token_scale=c.token_scale,
                                   prefix_caching=c.prefix_caching != "off", sarathi_token_budget=64)
    df = pl.DataFrame({"prompt_tokens": [1], "output_tokens": [1]})
    r = matching.settings_match(camp, eng, {"max_model_len": c.max_model_len,
                                            "usable_kv_tokens": (int(c.kv_blocks) - 1) * c.block_size,
                                            "block_size": c.block_size}, {"x": df})
    assert all(r["settings"][k]["match"] for k in ("max_model_len", "kv_cache_tokens", "max_num_batched_tokens",
                                                     "max_num_seqs", "sarathi_token_budget"))


def test_hashed_prompts_share_exactly_the_hashed_prefix():
    from portbench.validation import replay
    w = pl.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [150, 140, 150], "output_tokens": [3, 3, 3],
                      "block_hashes": [[1, 2], [1, 3], [7, 8]]})
    reqs, _ = replay.build_requests(w, vocab_size=1000, seed=0, hash_block_tokens=64)
    p = [np.array(r.prompt_token_ids) for r in reqs]
    assert [len(x) for x in p] == [150, 140, 150]
    assert (p[0][:64] == p[1][:64]).all() and not (p[0][64:128] == p[1][64:128]).all()
    assert not (p[0][:64] == p[2][:64]).all()
    plain, _ = replay.build_requests(w, vocab_size=1000, seed=0)
    assert not (np.array(plain[0].prompt_token_ids)[:64] == np.array(plain[1].prompt_token_ids)[:64]).all()


# --------------------------------------------------------------------------- step grid (no vLLM)


def test_step_grid_shapes_schedule_and_fit():
    from portbench.core.config import StepGridConfig
    from portbench.sim import profiles
    from portbench.validation import steps
    g = StepGridConfig()
    shapes = steps.grid(g)
    assert shapes[0].kind == "decode" and {s.kind for s in shapes} == {"decode", "prefill", "mixed"}
    # the KV cache (the CPU engine's 20,224 tokens) keeps long contexts with small batches only
    held = steps.grid(g, kv_tokens=20_224)
    dec = {(s.decode_batch, s.decode_context) for s in held if s.kind == "decode"}
    assert (1, 8192) in dec and (4, 2048) in dec and (64, 256) in dec
    assert (4, 8192) not in dec and (16, 2048) not in dec and (64, 2048) not in dec
    assert all(b * (c + 1 + g.steps_per_shape) <= 20_224 for b, c in dec) and held[0] == shapes[0]
    assert shapes[-2].model_inputs() == (128, 16, 16 * 65 + 128, 128 * 129 // 2)
    assert shapes[-1].name == "mixed B=2 C=2048 + P=256" and shapes[-1].model_inputs()[2] == 2 * 2049 + 256
    from portbench.core.errors import ParameterError
    with pytest.raises(ParameterError, match="triples"):
        StepGridConfig(mixed=((2, 256, 2048, 1),))
    order = steps.schedule(shapes, 2, seed=3)
    assert order == steps.schedule(shapes, 2, seed=3) and order[0] == (0, 0)
    for r in (0, 1):   # every shape once per round besides the repeated reference
        assert sorted(i for rr, i in order if rr == r and i) == list(range(1, len(shapes)))
    # a known cost model, medians exact: the fit recovers it, attention term included
    true = dict(c0_s=5e-3, c_prefill_s=2e-5, c_decode_s=1e-4, c_kv_s=1e-7, c_attn_s=3e-9)
    rows = []
    for s in shapes:
        p, b, c, a = s.model_inputs()
        t = true["c0_s"] + true["c_prefill_s"] * p + true["c_decode_s"] * b + true["c_kv_s"] * c + true["c_attn_s"] * a
        for k in range(9):
            rows.append({"shape": s.name, "kind": s.kind, "step_wall_s": t * (1 + 0.01 * (k - 4)), "as_planned": True,
                         "prefill_tokens": p, "decode_seqs": b, "context_tokens": c, "attention_pairs": a,
                         "round": 0, "reference": False})
    tab = steps.shape_table(pl.DataFrame(rows))
    assert (tab["lo_s"] < tab["median_s"]).all() and (tab["median_s"] < tab["hi_s"]).all()
    prof, out, summ = steps.fit(tab, profiles.get_profile("a100_40gb_llama3_1_8b"), "t")
    for k, v in true.items():
        assert summ["coefficients"][k] == pytest.approx(v, rel=1e-3)
    assert summ["max_abs_rel_err"] < 1e-6 and summ["r2"] == pytest.approx(1.0)
    assert prof.c_attn_s == pytest.approx(true["c_attn_s"], rel=1e-3) and prof.floor_s == 0


def test_median_ci_order_statistics():
    from portbench.validation import steps
    med, lo, hi = steps.median_ci(np.arange(1.0, 21.0))
    # n = 20: binom(20, .5) 2.5 % quantile = 6 -> the 6th and 15th order statistics
    assert (med, lo, hi) == (10.5, 6.0, 15.0)
    assert math.isnan(steps.median_ci([1.0, 2.0, 3.0])[1])


# --------------------------------------------------------------------------- the deciding engine (issue 24)


def test_repeat_cv_from_every_shape_per_round():
    from portbench.validation import steps
    speed = {0: 1.0, 1: 1.1, 2: 0.9}          # the machine's speed per round; one outlier step does not move it
    rows = pl.DataFrame([{"shape": sh, "round": r, "step_wall_s": base * f * (5.0 if (sh, r, k) == ("x", 2, 0) else 1.0)}
                         for sh, base in (("x", 1e-3), ("y", 4e-3), ("z", 9e-3)) for r, f in speed.items()
                         for k in range(3)])
    r = steps.repeat_cv(rows)
    assert r["rounds"] == 3 and r["cv"] == pytest.approx(0.1)
    assert math.isnan(steps.repeat_cv(rows.filter(pl.col("round") == 0))["cv"])


def test_error_budget_by_cause_is_the_chain_of_measured_variants():
    from portbench.validation import predict
    b = predict.error_budget({"trace": 0.40, "engine_input": 0.25, "engine_input_speed": 0.15,
                              "engine_input_frontend": 0.26}, 0.06)
    assert b["arrival_order"] == pytest.approx(0.15) and b["machine_speed"] == pytest.approx(0.10)
    assert b["step_table_shapes"] == pytest.approx(0.06) and b["schedule_divergence"] == pytest.approx(0.09)
    assert b["frontend"] == pytest.approx(0.01) and b["e2e_mape_prediction"] == 0.25
    assert math.isnan(predict.error_budget({"engine_input": 0.2}, 0.05)["arrival_order"])
    assert predict.mape([1.1, 2.0, float("nan")], [1.0, 2.0, 3.0]) == pytest.approx(0.05)


def test_engine_input_takes_the_clients_send_times_by_request_id():
    from portbench.validation import predict
    win = pl.DataFrame({"arrival_s": [0.0, 0.0, 0.0, 1.0], "prompt_tokens": [10, 20, 30, 40]})
    rec = pl.DataFrame({"req_id": [2, 0, 1], "arrival_s": [0.0004, 0.0011, 0.0007]})    # request 3 never sent
    got = predict.engine_input(win, rec)["arrival_s"].to_list()
    assert got == [0.0011, 0.0007, 0.0004, 1.0]          # the client sent 2 first, then 1, then 0
    fe = pl.DataFrame({"queued_s": [0.003, 0.013, 0.004], "arrival_s": [0.001, 0.001, 0.002],
                       "rejected": [False, False, False]})
    assert predict.frontend_delay(fe, 0.0) == pytest.approx(0.002)


def test_queue_growth_tells_a_stable_queue_from_a_growing_one():
    from portbench.validation import predict
    arr = np.arange(300) * 0.01
    stable = pl.DataFrame({"arrival_s": arr, "finish_s": arr + 0.02})                # each served in 20 ms
    growing = pl.DataFrame({"arrival_s": arr, "finish_s": np.arange(300) * 0.02 + 0.02})   # half the arrival rate
    g0, g1 = predict.queue_growth(stable), predict.queue_growth(growing)
    assert abs(g0) < 0.02 and g1 == pytest.approx(0.5, abs=0.05)
    assert not predict.saturated(0.5, g0) and predict.saturated(0.5, g1) and predict.saturated(1.2, g0)
    assert not predict.saturated(0.9, math.nan)
    unfinished = growing.with_columns(pl.when(pl.col("arrival_s") > 2).then(float("nan")).otherwise(pl.col("finish_s"))
                                      .alias("finish_s"))
    assert predict.queue_growth(unfinished) >= g1 - 1e-9


def test_speed_factor_is_measured_over_tabled_time():
    from portbench.sim import profiles
    from portbench.validation import predict
    prof = profiles.get_profile("a100_40gb_llama3_1_8b")
    st_ = pl.DataFrame({"prefill_tokens": [0, 128, 0], "decode_seqs": [4, 2, 8], "context_tokens": [400, 900, 1600],
                        "attention_pairs": [0, 128 * 129 // 2, 0]})
    tab = np.atleast_1d(prof.iteration_time(st_["prefill_tokens"].to_numpy(), st_["decode_seqs"].to_numpy(),
                                            st_["context_tokens"].to_numpy(), st_["attention_pairs"].to_numpy()))
    st_ = st_.with_columns(pl.Series("step_s", tab * 1.3))
    assert predict.speed_factor(st_, prof) == pytest.approx(1.3)
    assert predict.scaled_profile(prof, 2.0).iteration_time(128, 2, 900, 100) == pytest.approx(
        2 * prof.iteration_time(128, 2, 900, 100))
    assert math.isnan(predict.speed_factor(st_.head(0), prof))


def test_speed_variation_is_measured_over_tabled_time_per_piece_of_the_replay():
    from portbench.sim import profiles
    from portbench.validation import predict
    prof = profiles.get_profile("a100_40gb_llama3_1_8b")
    n = 40
    st_ = pl.DataFrame({"t_start": np.arange(n) * 0.05, "prefill_tokens": [0] * n, "decode_seqs": [4] * n,
                        "context_tokens": [400] * n, "attention_pairs": [0] * n})
    tab = float(prof.iteration_time(0, 4, 400))
    speed = np.where(np.arange(n) < 20, 0.8, 1.2)        # the first second at 0.8, the second at 1.2
    st_ = st_.with_columns(pl.Series("step_s", tab * speed))
    v = predict.speed_variation(st_, prof, bin_s=0.5)
    assert v.tolist() == pytest.approx([0.8, 0.8, 1.2, 1.2])
    assert predict.speed_variation(st_.head(0), prof).size == 0


def test_sensitivity_is_the_scaled_prediction_against_the_unscaled_one():
    from portbench.validation import fidelity, predict

    def reqs(scale: float, src: str = "azure") -> pl.DataFrame:
        return pl.DataFrame({"source": [src] * 3, "window_id": ["w"] * 3, "region": ["moderate"] * 3,
                             "scheduler": ["fcfs"] * 3, "req_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0],
                             "first_token_s": [0.1 * scale, 1.0 + 0.2 * scale, 2.0 + 0.1 * scale],
                             "finish_s": [0.5 * scale, 1.0 + 1.0 * scale, float("nan")],
                             "output_tokens": [5, 9, 3], "rejected": [False, False, False]})
    head = reqs(1.0)
    got = predict.sensitivity(head, {"steps_x1.05": reqs(1.1), "steps_x0.95": head}, list(fidelity.KEY))
    assert got["steps_x1.05"]["e2e"] == pytest.approx(0.1) and got["steps_x1.05"]["requests"] == 2   # unfinished out
    assert got["steps_x1.05"]["factor"] == 1.05 and got["steps_x1.05"]["by_source"]["azure"]["ttft"] == pytest.approx(0.1)
    assert got["steps_x0.95"]["e2e"] == 0.0


def test_speed_band_is_the_quantiles_of_the_grids_visit_speeds():
    from portbench.validation import steps
    rows = []
    for shape, base in (("a", 0.004), ("b", 0.010)):
        for rnd, f in enumerate((0.8, 1.0, 1.0, 1.0, 1.25)):      # the same speed states met by both shapes
            rows += [{"shape": shape, "round": rnd, "step_wall_s": base * f}] * 3
    band = steps.speed_band(pl.DataFrame(rows), (0.0, 1.0))
    assert band["lo"] == pytest.approx(0.8) and band["hi"] == pytest.approx(1.25) and band["visits"] == 10
    one_round = pl.DataFrame([r for r in rows if r["round"] == 0])
    assert math.isnan(steps.speed_band(one_round)["lo"])


def test_band_coverage_counts_the_engine_between_the_two_predictions():
    from portbench.validation import fidelity, predict

    def reqs(e2e: list[float]) -> pl.DataFrame:
        n = len(e2e)
        return pl.DataFrame({"source": ["azure"] * n, "window_id": ["w"] * n, "region": ["moderate"] * n,
                             "scheduler": ["fcfs"] * n, "req_id": list(range(n)), "arrival_s": [0.0] * n,
                             "first_token_s": [x / 2 for x in e2e], "finish_s": e2e, "output_tokens": [3] * n,
                             "rejected": [False] * n})
    eng = reqs([1.0, 1.0, 1.0, 2.0])
    lo, hi = reqs([0.9, 1.1, 0.5, 1.0]), reqs([1.1, 1.3, 0.8, 1.5])
    cov = predict.band_coverage(fidelity.matched_latencies(eng, lo), fidelity.matched_latencies(eng, hi))
    assert cov["requests"] == 4 and cov["e2e"] == pytest.approx(0.25) and cov["e2e_above"] == pytest.approx(0.5)
    assert cov["by_source"]["azure"]["e2e"] == pytest.approx(0.25)


# --------------------------------------------------------------------------- the family at the campaign's settings


