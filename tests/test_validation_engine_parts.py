"""The engine side's pure parts without vLLM, on hand-computed cases: the hashed prompts, the step grid and its
statistics, the engine input of a prediction (the order verdicts' statistics are tests/test_validation_design.py's)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest


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


def test_engine_input_takes_the_clients_send_times_by_request_id():
    from portbench.validation import predict
    win = pl.DataFrame({"arrival_s": [0.0, 0.0, 0.0, 1.0], "prompt_tokens": [10, 20, 30, 40]})
    rec = pl.DataFrame({"req_id": [2, 0, 1], "arrival_s": [0.0004, 0.0011, 0.0007]})    # request 3 never sent
    got = predict.engine_input(win, rec)["arrival_s"].to_list()
    assert got == [0.0011, 0.0007, 0.0004, 1.0]          # the client sent 2 first, then 1, then 0


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


# --------------------------------------------------------------------------- the family at the campaign's settings


