"""The SimPy serving simulator: invariants, a hand-computed case, closed form == step-by-step,
determinism, parameter errors.

Helpers used by test_schedulers.py / test_regions.py too: :class:`StubProfile` (a linear cost
model with round coefficients, so cases can be computed by hand) and :func:`azure_windows`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from portbench.sim import profiles, regions, schedulers, engine as simulator
from portbench.core.errors import ConservationError, DataError, ParameterError

REGION_LOADS = {"light": 0.3, "moderate": 0.5, "busy": 0.7, "near_saturation": 0.9, "overload": 1.2,
                "severe": 2.0}
SLO = {"ttft_s": 2.0, "tpot_s": 0.1}
V0 = {"batching": "v0"}
ENGINES = {"v1": {}, "v0": V0, "v1_swap": {"preemption": "swap"}, "v0_swap": {"batching": "v0", "preemption": "swap"}}


def StubProfile(**fields) -> profiles.Profile:
    """A real :class:`portbench.sim.profiles.Profile` with round numbers (linear: no floor, no attention
    term, no context limit, no swap unless given), for hand arithmetic."""
    base = dict(name="round", gpu="test", model="test", kv_capacity_blocks=1000, c0_s=0.01, c_prefill_s=0.001,
                c_decode_s=0.002, c_kv_s=0.0001, max_num_seqs=256, max_batched_tokens=512,
                provenance={"note": "round numbers for hand-computed tests"})
    return profiles.Profile(**(base | fields))


def real_profile() -> profiles.Profile:
    """The study's default profile."""
    return profiles.get_profile(profiles.DEFAULT_PROFILE)


def window(arrival, prompt, output, tenant=None, predicted=None) -> pl.DataFrame:
    """A crafted window table with the columns a run is given: the frozen-window columns plus
    predictions (``predicted`` lengths; default: the prompt length, i.e. a predictor that knows
    nothing of the output) as ``predicted_output`` and ``ltr_score`` = log(predicted)."""
    n = len(arrival)
    pred = [max(float(p), 1.0) for p in (predicted if predicted is not None else prompt)]
    return pl.DataFrame({"arrival_s": [float(a) for a in arrival],
                         "prompt_tokens": pl.Series([int(p) for p in prompt], dtype=pl.Int64),
                         "output_tokens": pl.Series([int(o) for o in output], dtype=pl.Int64),
                         "tenant": list(tenant) if tenant is not None else ["t0"] * n,
                         "predicted_output": pred, "ltr_score": [math.log(p) for p in pred]})


def azure_windows(shared_traces, starts=(1000, 8000, 15000), size=200) -> dict[str, pl.DataFrame]:
    """Windows of ``size`` consecutive rows of the real Azure conversation trace (read directly;
    tenants: a seeded assignment of 4; stand-in predictions from the prompt length)."""
    raw = pl.read_csv(shared_traces / "azure2023" / "AzureLLMInferenceTrace_conv.csv")
    ts = raw["TIMESTAMP"].str.to_datetime("%Y-%m-%d %H:%M:%S%.f")
    t = ((ts - ts[0]).dt.total_microseconds() / 1e6).to_numpy()
    out = {}
    for s in starts:
        rng = np.random.default_rng(s)
        a = t[s:s + size] - t[s]
        out[f"azure-{s}"] = pl.DataFrame({
            "arrival_s": a,
            "prompt_tokens": raw["ContextTokens"][s:s + size].cast(pl.Int64),
            "output_tokens": raw["GeneratedTokens"][s:s + size].cast(pl.Int64),
            "tenant": [f"tenant{i}" for i in rng.integers(0, 4, size)],
        }).with_columns(pl.col("prompt_tokens").cast(pl.Float64).sqrt().alias("predicted_output"),
                        (-pl.col("prompt_tokens").cast(pl.Float64)).alias("ltr_score"))
    return out


def run(df, sched, prof=None, horizon=math.inf, seed=0, **kw):
    return simulator.simulate(df, sched, prof or StubProfile(), horizon_s=horizon, seed=seed, slo=SLO, **kw)


@pytest.fixture(scope="module")
def windows(shared_traces):
    return azure_windows(shared_traces)


@pytest.fixture(scope="module")
def scaled(windows):
    """Every window in every region: {(window, region): (scaled_df, horizon_s)} (default profile)."""
    prof = real_profile()
    out = {}
    for wid, df in windows.items():
        cap = regions.capacity(df, prof)
        for reg, rho in REGION_LOADS.items():
            sdf = regions.rescale(df, rho, cap)
            out[(wid, reg)] = (sdf, regions.horizon_s(sdf, 1.5))
    return out


# --------------------------------------------------------------------------- invariants


SCHEDULER_NAMES = ("fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "srpt_oracle", "sjf_predicted", "ltr",
                   "mlfq", "las", "rr", "edf", "vtc", "random")


def with_hashes(df: pl.DataFrame, seed: int = 0, hb: int = 32) -> pl.DataFrame:
    """Synthetic prompt block hashes: requests fall into 8 conversations whose prompts share their
    leading blocks (a per-conversation chain), then diverge."""
    rng = np.random.default_rng(seed)
    out = []
    for i, p in enumerate(df["prompt_tokens"].to_list()):
        conv = int(rng.integers(0, 8))
        shared = int(rng.integers(0, 6))
        n = p // hb + (1 if p % hb else 0)
        out.append([conv * 1000 + j if j < shared else 10**6 + i * 1000 + j for j in range(n)])
    return df.with_columns(pl.Series("block_hashes", out, dtype=pl.List(pl.Int64)))


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_conservation_and_kv_bound_every_region(name, scaled):
    """arrived = completed + unfinished + rejected and KV never above capacity, every region; the
    incremental bookkeeping re-checked from scratch at overload, in every engine mode."""
    prof = real_profile()
    for (wid, reg), (sdf, h) in scaled.items():
        engines = ENGINES.items() if reg == "overload" else [("v1", {})]
        for _ename, engine in engines:
            res = simulator.simulate(sdf, name, prof, horizon_s=h, seed=7, slo=SLO, engine=engine,
                                     check_invariants=(reg == "overload"))
            c = res.check().counters
            assert c["arrived"] == sdf.height
            assert c["arrived"] == c["completed"] + c["unfinished"] + c["rejected"]
            assert 0 < c["kv_max_used_blocks"] <= c["kv_capacity_blocks"] == prof.kv_capacity_blocks
            recs = res.requests
            assert recs.columns == list(simulator.RECORD_COLUMNS)
            done = recs.filter(pl.col("finish_s").is_not_nan())
            assert (done["generated_tokens"] == done["output_tokens"]).all()
            assert (done["finish_s"] <= h + 1e-9).all() and (done["first_token_s"] <= done["finish_s"]).all()
            assert (done["first_token_s"] > done["arrival_s"]).all()
            assert (recs["generated_tokens"] <= recs["output_tokens"]).all()
            if reg == "light":
                assert c["unfinished"] == 0, f"{name} left requests unfinished at light load on {wid}"


def test_overload_leaves_work_and_preempts(scaled):
    """The default profile's KV cache binds at overload: preemptions happen and requests remain."""
    prof = real_profile()
    tot_pre = tot_unf = 0
    for (_wid, reg), (sdf, h) in scaled.items():
        if reg == "severe":
            c = simulator.simulate(sdf, "fcfs", prof, horizon_s=h, seed=0).counters
            tot_pre += c["preemptions"]
            tot_unf += c["unfinished"]
            assert c["kv_max_used_blocks"] >= 0.95 * prof.kv_capacity_blocks
    assert tot_pre > 0 and tot_unf > 0


def test_conservation_check_catches_a_lost_request():
    res = run(window([0, 0.1], [10, 10], [3, 3]), "fcfs")
    res.check()
    bad = simulator.SimResult(res.requests, {**res.counters, "completed": res.counters["completed"] - 1})
    with pytest.raises(ConservationError):
        bad.check()
    worse = simulator.SimResult(res.requests, {**res.counters, "kv_max_used_blocks": 10**6})
    with pytest.raises(ConservationError):
        worse.check()


def test_rejected_when_it_can_never_fit():
    prof = StubProfile(kv_capacity_blocks=10)            # 160 tokens
    res = run(window([0, 0, 0], [100, 150, 20], [61, 10, 5]), "fcfs", prof)
    r = res.requests
    assert r["rejected"].to_list() == [True, False, False]   # 161 > 160 tokens; 150+10 = 160 fits exactly
    assert res.counters["rejected"] == 1 and res.counters["completed"] == 2
    assert math.isnan(r["first_token_s"][0]) and r["generated_tokens"][0] == 0


# --------------------------------------------------------------------------- hand-computed


def test_hand_computed_fcfs_prefill_first():
    """V0 batching. c0 = 0.01, c_p = 0.001/token, c_d = 0.002/seq, c_kv = 0.0001/context token.

    A (P=100, O=3) and B (P=50, O=2) arrive at 0; C (P=20, O=1) at 0.18.
    t=0      prefill A+B (150 tokens, context 150): 0.01 + 0.150 + 0.0150 = 0.1750 -> first tokens
    t=0.1750 decode A,B (context 101+51=152):       0.01 + 0.004 + 0.0152 = 0.0292 -> t=0.2042, B done
             (C arrived at 0.18, seen at this iteration boundary)
    t=0.2042 prefill C alone, A waits (prefill-first): 0.01 + 0.020 + 0.0020 = 0.0320 -> t=0.2362, C done
    t=0.2362 decode A (context 102):                 0.01 + 0.002 + 0.0102 = 0.0222 -> t=0.2584, A done
    """
    res = run(window([0, 0, 0.18], [100, 50, 20], [3, 2, 1]), "fcfs", record_iterations=True, engine=V0)
    r = res.requests
    assert r["first_token_s"].to_list() == pytest.approx([0.1750, 0.1750, 0.2362], abs=1e-12)
    assert r["finish_s"].to_list() == pytest.approx([0.2584, 0.2042, 0.2362], abs=1e-12)
    ttft = (r["first_token_s"] - r["arrival_s"]).to_list()
    assert ttft == pytest.approx([0.1750, 0.1750, 0.0562], abs=1e-12)
    tpot_a = (0.2584 - 0.1750) / 2          # two decode gaps, one of them stalled by C's prefill
    assert (r["finish_s"][0] - r["first_token_s"][0]) / 2 == pytest.approx(tpot_a, abs=1e-12)
    assert res.counters["iterations"] == 4
    it = res.iterations
    assert it["prefill_tokens"].to_list() == [150, 0, 20, 0]
    assert it["decode_seqs"].to_list() == [0, 2, 0, 1]
    assert it["context_tokens"].to_list() == [150, 152, 20, 102]


def test_hand_computed_v1_iteration_decodes_and_a_chunk_under_the_budget():
    """V1 batching (vLLM V1), same requests as the V0 case above: the running decode goes first and the
    newly arrived prompt is chunked into the same iteration (budget 512 tokens).

    t=0      A (100) and B (50) admitted, chunks 100 + 50 (context 150): 0.1750 -> first tokens
    t=0.1750 decode A, B (context 152): 0.0292 -> t=0.2042, B done; C arrived at 0.18
    t=0.2042 decode A (context 102) + C's prompt 20 (context 20), 21 budget tokens:
             0.01 + 0.020 + 0.002 + 0.0001·122 = 0.0442 -> t=0.2484, A done, C's first token (done)
    A is not stalled by C's prefill (V0: 0.2584); C waits one decode longer (TTFT 0.0684 vs 0.0562).
    """
    res = run(window([0, 0, 0.18], [100, 50, 20], [3, 2, 1]), "fcfs", record_iterations=True)
    r = res.requests
    assert res.counters["batching"] == "v1" and res.counters["token_budget"] == 512
    assert r["first_token_s"].to_list() == pytest.approx([0.1750, 0.1750, 0.2484], abs=1e-12)
    assert r["finish_s"].to_list() == pytest.approx([0.2484, 0.2042, 0.2484], abs=1e-12)
    it = res.iterations
    assert it["prefill_tokens"].to_list() == [150, 0, 20]
    assert it["decode_seqs"].to_list() == [0, 2, 1]
    assert it["context_tokens"].to_list() == [150, 152, 122]
    assert it["end_s"].to_list() == pytest.approx([0.1750, 0.2042, 0.2484], abs=1e-12)


def test_v1_budget_chunks_a_long_prompt_behind_running_decodes():
    """Budget 64: A (P=10, O=4) runs; B (P=100, O=1) arrives at 0.05. Every iteration carries A's decode
    (1 budget token) and 63 of B's prompt tokens, then the remaining 37; blocks are allocated per chunk.

    t=0      A's prompt (10):                                  0.01 + 0.010 + 0.0010 = 0.0210
    t=0.021  decode A (context 11):                            0.01 + 0.002 + 0.0011 = 0.0131 -> 0.0341
    t=0.0341 decode A (12):                                    0.0132 -> 0.0473
    t=0.0473 decode A (13), A done:                            0.0133 -> 0.0606 (B arrived at 0.05)
    t=0.0606 B chunk 64 (A finished: the whole budget):         0.01 + 0.064 + 0.0064 = 0.0804 -> 0.1410
    t=0.1410 B chunk 36 (context 100), first token:             0.01 + 0.036 + 0.0100 = 0.0560 -> 0.1970
    """
    prof = StubProfile(max_num_seqs=8)
    sched = schedulers.get_scheduler("fcfs", prefill_token_budget=64)
    res = run(window([0, 0.05], [10, 100], [4, 1]), sched, prof, record_iterations=True, check_invariants=True)
    it = res.iterations
    assert it["prefill_tokens"].to_list() == [10, 0, 64, 36]
    assert it["n_iterations"].to_list() == [1, 3, 1, 1]
    assert res.requests["first_token_s"].to_list() == pytest.approx([0.021, 0.197], abs=1e-12)
    # B arrives while A decodes: its 64-token chunk shares iterations with A's decodes
    res2 = run(window([0, 0.022], [10, 100], [8, 1]), sched, prof, record_iterations=True, check_invariants=True)
    it2 = res2.iterations.filter(pl.col("prefill_tokens") > 0)
    assert it2["prefill_tokens"].to_list() == [10, 63, 37]
    assert it2["decode_seqs"].to_list() == [0, 1, 1]


def test_quadratic_prefill_attention_on_a_crafted_chunk():
    """A chunk of n new tokens after c cached ones computes n·c + n(n+1)/2 causal token pairs; the
    profile charges c_attn_s per pair. B (P=700) is chunked 400 + 300 by a 400-token budget: the
    second chunk attends to the 400 cached tokens: 300·400 + 300·301/2 = 165,150 pairs."""
    assert profiles.attention_pairs(300, 400) == 165150
    assert profiles.attention_pairs(1, 0) == 1
    prof = StubProfile(c_attn_s=1e-6)
    sched = schedulers.get_scheduler("fcfs", prefill_token_budget=400)
    res = run(window([0], [700], [1]), sched, prof, record_iterations=True)
    it = res.iterations
    first = 0.01 + 0.400 + 0.0001 * 400 + 1e-6 * (400 * 401 // 2)
    second = 0.01 + 0.300 + 0.0001 * 700 + 1e-6 * 165150
    assert (it["end_s"] - it["start_s"]).to_list() == pytest.approx([first, second], abs=1e-12)
    assert res.requests["service_s"][0] == pytest.approx(first + second, abs=1e-12)   # isolated, same chunks
    # quadratic: the same 700 tokens prefilled in one chunk cost more attention than 2 x 350
    whole = prof.iteration_time(700, 0, 700, profiles.attention_pairs(700, 0))
    assert whole - prof.iteration_time(700, 0, 700) == pytest.approx(1e-6 * 700 * 701 / 2)
    # the real profiles: attention is a few % of a 4k prefill and about half of a 25k one
    p = real_profile()
    share = {n: (p.prefill_s(n) - p.iteration_time(n, 0, n)) / (p.c_prefill_s * n) for n in (4096, 25600)}
    assert 0.05 < share[4096] < 0.12 and 0.35 < share[25600] < 0.65


def test_prompt_over_the_context_limit_is_refused_and_counted():
    """max_model_len = 100: a 100-token prompt (one over the longest allowed, 99) is refused at arrival
    (vLLM: prompt_len >= max_model_len is an error), counted in rejected and refused; a 99-token
    prompt with 10 output tokens has its output clipped to 100 − 99 = 1 token."""
    prof = StubProfile(max_model_len=100)
    res = run(window([0, 0, 0], [100, 99, 20], [5, 10, 5]), "fcfs", prof)
    c, r = res.check().counters, res.requests
    assert r["refused"].to_list() == [True, False, False] and r["rejected"].to_list() == [True, False, False]
    assert c["refused"] == 1 and c["rejected"] == 1 and c["clipped"] == 1 and c["completed"] == 2
    assert r["output_tokens"].to_list() == [5, 1, 5] and r["trace_output_tokens"].to_list() == [5, 10, 5]
    assert r["generated_tokens"].to_list() == [0, 1, 5]
    assert math.isnan(r["first_token_s"][0])
    # the default profile's limit is Llama-3.1-8B's context
    assert real_profile().max_model_len == 131072


def test_hand_computed_chunked_prefill():
    """Sarathi with a 300-token budget: A (P=400, O=2) at 0, B (P=10, O=3) at 0.

    t=0      chunk A 300 (context 300):                        0.01 + 0.300 + 0.0300 = 0.3400
    t=0.34   chunk A 100 (context 400) + B 10 (context 10):   0.01 + 0.110 + 0.0410 = 0.1610 -> t=0.501,
             A and B first tokens
    t=0.501  decode A (401), B (11), context 412:             0.01 + 0.004 + 0.0412 = 0.0552 -> t=0.5562,
             A done (O=2)
    t=0.5562 decode B (context 12):                           0.01 + 0.002 + 0.0012 = 0.0132 -> t=0.5694
    """
    prof = StubProfile(max_num_seqs=4)
    sched = schedulers.get_scheduler("sarathi", prefill_token_budget=300)
    for engine in ({}, V0):       # sarathi chunks under V0 too (its definition); V1 chunks everyone
        res = run(window([0, 0], [400, 10], [2, 3]), sched, prof, record_iterations=True, engine=engine)
        r = res.requests
        assert r["first_token_s"].to_list() == pytest.approx([0.501, 0.501], abs=1e-12)
        assert r["finish_s"].to_list() == pytest.approx([0.5562, 0.5694], abs=1e-12)
        assert res.iterations["prefill_tokens"].to_list() == [300, 110, 0, 0]


def test_single_request_takes_its_isolated_service_time():
    """Alone on the replica, E2E == profile.isolated_service_s (same cost convention): under V1 the
    prompt is chunked by the token budget, under V0 it is one iteration."""
    for prof in (StubProfile(), real_profile()):
        for engine, chunk in (({}, prof.max_batched_tokens), (V0, None)):
            res = run(window([0.0], [3777], [123]), "fcfs", prof, engine=engine)
            r = res.requests
            assert r["finish_s"][0] == pytest.approx(prof.isolated_service_s(3777, 123, chunk), rel=1e-9)
            assert r["service_s"][0] == pytest.approx(prof.isolated_service_s(3777, 123, chunk), rel=1e-12)


def test_recompute_preemption_keeps_generated_tokens_and_reprefills_prompt_plus_output():
    """V0 batching. KV of 6 blocks (96 tokens); A (P=40, O=50) at 0, B (P=40, O=50) at 0.001.

    A prefills (3 blocks), then B (3 blocks; A waits, prefill-first); both decode with g equal.
    At g = 9 each needs ceil((40+9)/16) = 4 blocks: 8 > 6, so FCFS evicts the latest arrival, B,
    which keeps its 9 streamed tokens. A finishes alone (at most ceil(89/16) = 6 blocks); then B is
    resumed by a recompute prefill of prompt + generated = 40 + 9 = 49 tokens, which yields its
    10th token, and decodes to 50.
    """
    prof = StubProfile(kv_capacity_blocks=6)
    res = run(window([0, 0.001], [40, 40], [50, 50]), "fcfs", prof, record_iterations=True, engine=V0)
    r = res.requests
    assert r["preemptions"].to_list() == [0, 1]
    assert r["generated_tokens"].to_list() == [50, 50]
    assert res.counters["preemptions"] == 1 and res.counters["completed"] == 2
    assert res.counters["kv_max_used_blocks"] == 6
    it = res.iterations
    assert it.filter(pl.col("prefill_tokens") > 0)["prefill_tokens"].to_list() == [40, 40, 49]
    assert r["finish_s"][0] < r["finish_s"][1]
    # B's first token came from its first prefill, not from the recompute
    assert r["first_token_s"][1] == pytest.approx(it["end_s"][1], abs=1e-12)


def test_v1_recompute_preempts_the_tail_and_admits_nobody_in_that_step():
    """V1, KV of 6 blocks; A (P=40, O=50) at 0, B (P=40, O=50) at 0.001. B's prompt joins A's decode in
    the second iteration, so A is one token ahead. At gA = 9 (49 tokens: a 4th block) with gB = 8 the
    two need 7 > 6 blocks: V1 preempts the tail of the running list (B, the latest arrival), which keeps
    its 8 tokens, goes back to the front of the waiting queue, and is re-admitted only when its whole
    sequence (48 tokens, 3 blocks) fits again, re-prefilling 48 tokens."""
    prof = StubProfile(kv_capacity_blocks=6)
    res = run(window([0, 0.001], [40, 40], [50, 50]), "fcfs", prof, record_iterations=True, check_invariants=True)
    r, it = res.requests, res.iterations
    assert r["preemptions"].to_list() == [0, 1] and r["generated_tokens"].to_list() == [50, 50]
    assert it.filter(pl.col("prefill_tokens") > 0)["prefill_tokens"].to_list() == [40, 40, 48]
    assert it["decode_seqs"][1] == 1                      # B's prompt rode along A's decode
    assert res.counters["kv_max_used_blocks"] == 6
    # B's recompute prefill starts only after A finished (its 48 tokens need 3 of the 6 blocks and
    # A holds 6 at the end)
    recompute_start = it.filter(pl.col("prefill_tokens") == 48)["start_s"][0]
    assert recompute_start == pytest.approx(r["finish_s"][0], abs=1e-12)


def test_swap_restores_a_request_without_recompute():
    """Same squeeze with ``preemption: swap``: B's KV (3 blocks) goes to host memory and comes back when
    A finishes; B re-prefills nothing, each copy costs 3 blocks x the per-block PCIe time, and B's
    remaining tokens are decoded from where it stopped."""
    prof = StubProfile(kv_capacity_blocks=6, kv_bytes_per_token=1000, pcie_gb_s=1.0, host_kv_blocks=100)
    per_block = 16 * 1000 / 1e9
    assert prof.swap_s_per_block == pytest.approx(per_block)
    rec = run(window([0, 0.001], [40, 40], [50, 50]), "fcfs", prof, record_iterations=True)
    res = run(window([0, 0.001], [40, 40], [50, 50]), "fcfs", prof, record_iterations=True,
              engine={"preemption": "swap"}, check_invariants=True)
    c, r, it = res.check().counters, res.requests, res.iterations
    assert c["swaps"] == 1 and c["swap_ins"] == 1 and c["preemptions"] == 1
    assert r["generated_tokens"].to_list() == [50, 50]
    assert it.filter(pl.col("prefill_tokens") > 0)["prefill_tokens"].to_list() == [40, 40]   # no recompute
    assert c["swap_s"] == pytest.approx(2 * 3 * per_block, abs=1e-15)
    assert r["finish_s"][1] < rec.requests["finish_s"][1]   # cheaper than re-prefilling 48 tokens here
    # no host memory: swap falls back to recompute
    none = run(window([0, 0.001], [40, 40], [50, 50]), "fcfs", dataclasses.replace(prof, host_kv_blocks=2),
               engine={"preemption": "swap"})
    assert none.counters["swaps"] == 0 and none.counters["preemptions"] == 1


def test_prefix_cache_hit_on_two_requests_sharing_blocks():
    """Two requests share their first 3 prompt blocks of 32 tokens (hash block = 2 KV blocks). B arrives
    after A's prompt is computed: it hits 3 cached blocks (96 tokens), prefills only its other 34
    tokens, and the shared blocks are counted once in the KV cache."""
    prof = StubProfile()
    df = window([0, 1.0], [100, 130], [200, 5]).with_columns(
        pl.Series("block_hashes", [[11, 12, 13], [11, 12, 13, 99]], dtype=pl.List(pl.Int64)))
    res = run(df, "fcfs", prof, record_iterations=True, hash_block_tokens=32, check_invariants=True)
    c, it = res.check().counters, res.iterations
    assert c["prefix_caching"] and c["prefix_hit_tokens"] == 96 and c["prefix_query_tokens"] == 230
    assert it.filter(pl.col("prefill_tokens") > 0)["prefill_tokens"].to_list() == [100, 34]
    # B's blocks: ceil(130/16) = 9, of which 6 are A's cached blocks -> KV in use while both run
    # = A's ceil((100 + g)/16) + 9 − 6; without caching it would be + 9
    off = run(df, "fcfs", prof, record_iterations=True, hash_block_tokens=32, engine={"prefix_caching": "off"})
    assert off.counters["prefix_hit_tokens"] == 0 and not off.counters["prefix_caching"]
    assert off.iterations.filter(pl.col("prefill_tokens") > 0)["prefill_tokens"].to_list() == [100, 130]
    both = it.filter((pl.col("start_s") >= 1.0) & (pl.col("decode_seqs") == 2))
    both_off = off.iterations.filter((pl.col("start_s") >= 1.0) & (pl.col("decode_seqs") == 2))
    assert both["kv_blocks_used"][0] == both_off["kv_blocks_used"][0] - 6
    # a prompt whose every block is cached still recomputes its last token: at most (P − 1)//32 blocks hit
    df2 = window([0, 1.0], [96, 96], [2, 2]).with_columns(
        pl.Series("block_hashes", [[1, 2, 3], [1, 2, 3]], dtype=pl.List(pl.Int64)))
    r2 = run(df2, "fcfs", prof, record_iterations=True, hash_block_tokens=32)
    assert r2.counters["prefix_hit_tokens"] == 64
    with pytest.raises(ParameterError) as e:   # hashes without their block size
        run(df, "fcfs", prof)
    assert e.value.param == "hash_block_tokens"


def test_horizon_stops_the_run():
    res = run(window([0, 0, 5.0], [100, 100, 10], [500, 500, 5]), "fcfs", horizon=1.0)
    c = res.counters
    assert c["arrived"] == 2 and c["completed"] == 0 and c["unfinished"] == 2
    assert c["sim_end_s"] == 1.0
    r = res.requests
    assert math.isnan(r["first_token_s"][2]) and r["generated_tokens"][2] == 0   # arrives after horizon
    assert 0 < r["generated_tokens"][0] < 500


# --------------------------------------------------------------------------- closed form == naive


def _assert_same(a, b):
    ra, rb = a.requests, b.requests
    for c in ("generated_tokens", "preemptions", "rejected", "req_id"):
        assert ra[c].to_list() == rb[c].to_list(), c
    for c in ("first_token_s", "finish_s", "admitted_s"):
        np.testing.assert_allclose(ra[c].to_numpy(), rb[c].to_numpy(), rtol=1e-9, atol=1e-9)
    skip = ("decision_points", "sim_end_s", "swap_s", "queue_mean", "queue_p95", "work_at")
    assert {k: v for k, v in a.counters.items() if k not in skip} == \
        {k: v for k, v in b.counters.items() if k not in skip}
    for k in ("swap_s", "queue_mean", "queue_p95"):
        assert a.counters[k] == pytest.approx(b.counters[k], rel=1e-9, abs=1e-9), k


@pytest.mark.parametrize("engine", ["v1", "v0", "v1_swap"])
@pytest.mark.parametrize("region", ["near_saturation", "severe"])
def test_closed_form_equals_step_by_step_on_real_windows(region, engine, scaled):
    """The key test of the fast path: advancing k iterations at once in closed form gives the
    same records as a naive reference that re-decides after every single iteration (and computes
    every iteration's time with profile.iteration_time), in every engine mode."""
    prof = real_profile()
    n_decisions = n_iters = 0
    for (wid, reg), (sdf, h) in scaled.items():
        if reg != region or wid == "azure-15000":
            continue
        for name in SCHEDULER_NAMES:
            fast = simulator.simulate(sdf, name, prof, horizon_s=h, seed=11, slo=SLO, check_invariants=True,
                                      engine=ENGINES[engine])
            slow = simulator.simulate(sdf, name, prof, horizon_s=h, seed=11, slo=SLO, naive=True,
                                      engine=ENGINES[engine])
            _assert_same(fast, slow)
            # one decision per iteration (+1: the decision whose iteration would cross the horizon)
            assert slow.counters["decision_points"] - slow.counters["iterations"] in (0, 1)
            n_decisions += fast.counters["decision_points"]
            n_iters += fast.counters["iterations"]
    # the fast path does skip iterations (fewer at severe overload, where V1 admits a queued request at
    # almost every iteration boundary: each admission is a prompt chunk, one iteration of its own)
    assert n_iters > (1.5 if region == "near_saturation" else 1.1) * n_decisions


@pytest.mark.parametrize("engine", ["v1", "v0", "v1_swap", "v0_swap"])
@pytest.mark.parametrize("variant", ["tight_kv", "few_slots"])
def test_closed_form_equals_step_by_step_under_pressure(variant, engine, windows):
    """Same, with memory or batch slots binding hard (evictions, pauses, swaps) and non-default options."""
    base = real_profile()
    prof = (dataclasses.replace(base, kv_capacity_blocks=600, host_kv_blocks=300) if variant == "tight_kv"
            else dataclasses.replace(base, max_num_seqs=6, max_batched_tokens=256))
    df = windows["azure-8000"].head(120)
    cap = regions.capacity(df, prof)
    cases = [(n, {}) for n in SCHEDULER_NAMES] + [
        ("sjf_oracle", {"preemptive": True}), ("las", {"quantum_tokens": 4}), ("rr", {"quantum_tokens": 8}),
        ("mlfq", {"quantum_tokens": 2}), ("ltr", {"starvation_s": 1.0}), ("vtc", {"w_output": 1}),
        ("sjf_oracle", {"chunked_prefill": True}), ("las", {"chunked_prefill": True}),
        ("edf", {"chunked_prefill": True, "preemptive": True}), ("sarathi", {"chunked_prefill": False})]
    events = {"preemptions": 0, "pauses": 0, "swaps": 0}
    for rho in (0.8, 2.0):
        sdf = regions.rescale(df, rho, cap)
        h = regions.horizon_s(sdf, 1.5)
        for name, opts in cases:
            fast = simulator.simulate(sdf, schedulers.get_scheduler(name, **opts), prof, horizon_s=h, seed=3,
                                      slo=SLO, check_invariants=True, engine=ENGINES[engine])
            slow = simulator.simulate(sdf, schedulers.get_scheduler(name, **opts), prof, horizon_s=h, seed=3,
                                      slo=SLO, naive=True, engine=ENGINES[engine])
            _assert_same(fast, slow)
            for k in events:
                events[k] += fast.counters[k]
    if variant == "tight_kv":
        assert events["preemptions"] > 0
        if engine.endswith("swap"):
            assert events["swaps"] > 0
    else:
        assert events["pauses"] > 0


@pytest.mark.parametrize("region", ["near_saturation", "severe"])
def test_closed_form_equals_step_by_step_with_prefix_caching(region, scaled):
    """Prefix caching (synthetic conversation hashes, 32-token hash blocks; a tight KV cache so that
    cached blocks are evicted): closed form == step by step, invariants re-checked, hits happen."""
    prof = dataclasses.replace(real_profile(), kv_capacity_blocks=900)
    hits = 0
    for (wid, reg), (sdf, h) in scaled.items():
        if reg != region or wid != "azure-1000":
            continue
        hdf = with_hashes(sdf)
        for name in SCHEDULER_NAMES:
            fast = simulator.simulate(hdf, name, prof, horizon_s=h, seed=5, slo=SLO, check_invariants=True,
                                      hash_block_tokens=32)
            slow = simulator.simulate(hdf, name, prof, horizon_s=h, seed=5, slo=SLO, naive=True,
                                      hash_block_tokens=32)
            _assert_same(fast, slow)
            hits += fast.check().counters["prefix_hit_tokens"]
    assert hits > 0


# --------------------------------------------------------------------------- determinism, errors


def test_same_seed_identical_records(scaled):
    prof = real_profile()
    sdf, h = scaled[("azure-1000", "overload")]
    for name in SCHEDULER_NAMES:
        a = simulator.simulate(sdf, name, prof, horizon_s=h, seed=5, slo=SLO)
        b = simulator.simulate(sdf, schedulers.get_scheduler(name), prof, horizon_s=h, seed=5, slo=SLO)
        assert a.requests.equals(b.requests), name
        assert a.counters == b.counters


def test_scheduler_instances_are_reusable():
    """reset() clears per-run state: one instance, two runs, same result."""
    df = window(np.linspace(0, 1, 30), [50 + 10 * i for i in range(30)], [20] * 30,
                [f"t{i % 3}" for i in range(30)])
    for name in SCHEDULER_NAMES:
        s = schedulers.get_scheduler(name)
        a = run(df, s, StubProfile(max_num_seqs=3), seed=1)
        b = run(df, s, StubProfile(max_num_seqs=3), seed=1)
        assert a.requests.equals(b.requests), name


@pytest.mark.parametrize("kwargs, param", [
    ({"horizon_s": 0}, "horizon_s"),
    ({"horizon_s": -1.0}, "horizon_s"),
    ({"horizon_s": "soon"}, "horizon_s"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
])
def test_bad_parameters_raise_one_clear_error(kwargs, param):
    args = {"horizon_s": 10.0, "seed": 0, **kwargs}
    with pytest.raises(ParameterError) as e:
        simulator.simulate(window([0], [10], [2]), "fcfs", StubProfile(), **args)
    assert e.value.param == param


def test_unknown_scheduler_and_bad_windows():
    with pytest.raises(ParameterError) as e:
        simulator.simulate(window([0], [10], [2]), "shortest_first", StubProfile(), horizon_s=1, seed=0)
    assert e.value.param == "simulation.schedulers" and "fcfs" in str(e.value)
    with pytest.raises(DataError):
        simulator.simulate(pl.DataFrame({"arrival_s": [0.0]}), "fcfs", StubProfile(), horizon_s=1, seed=0)
    with pytest.raises(DataError):
        simulator.simulate(window([0], [0], [2]), "fcfs", StubProfile(), horizon_s=1, seed=0)
    # a budget below max_num_seqs caps the running sequences (each decode takes a budget token)
    small = simulator.simulate(window([0] * 10, [1] * 10, [20] * 10), schedulers.get_scheduler("sarathi",
                               prefill_token_budget=4), StubProfile(), horizon_s=100, seed=0, record_iterations=True)
    assert small.iterations["decode_seqs"].max() == 4 and small.counters["completed"] == 10
    with pytest.raises(ParameterError):
        simulator.simulate(window([0], [10], [2]), "fcfs", StubProfile(), horizon_s=1, seed=0, engine={"batching": "v2"})
    with pytest.raises(ParameterError) as e:   # edf without an SLO
        simulator.simulate(window([0], [10], [2]), "edf", StubProfile(), horizon_s=1, seed=0)
    assert e.value.param == "simulation.edf_slo"


def test_profile_must_be_affine_in_context():
    @dataclass(frozen=True)
    class Quadratic(profiles.Profile):
        def iteration_time(self, prefill_tokens, decode_seqs, context_tokens):
            return super().iteration_time(prefill_tokens, decode_seqs, context_tokens) + 1e-9 * context_tokens ** 2

    quadratic = Quadratic(**dataclasses.asdict(StubProfile()))
    with pytest.raises(ParameterError) as e:
        simulator.simulate(window([0], [10], [2]), "fcfs", quadratic, horizon_s=1, seed=0)
    assert "affine" in e.value.expected


def test_empty_window():
    res = simulator.simulate(window([], [], []), "fcfs", StubProfile(), horizon_s=1.0, seed=0)
    assert res.requests.height == 0 and res.counters["arrived"] == 0


def test_runs_do_not_depend_on_the_interpreters_hash_seed():
    """Every policy's records are the same under two PYTHONHASHSEEDs (tenants are strings: no set or dict
    order of them may reach a decision)."""
    import os
    import subprocess
    import sys

    code = """
import hashlib, numpy as np, polars as pl
from portbench.sim.engine import simulate
from portbench.sim import profiles, schedulers
rng = np.random.default_rng(0); n = 150
arr = np.concatenate([[0.0], np.cumsum(rng.exponential(0.04, n - 1))])
df = pl.DataFrame({"arrival_s": arr, "prompt_tokens": rng.integers(10, 3000, n), "output_tokens": rng.integers(1, 400, n),
                   "tenant": [f"tenant-{k}" for k in rng.integers(1, 6, n)],
                   "predicted_output": rng.integers(1, 400, n).astype(float), "ltr_score": rng.normal(size=n)})
prof = profiles.get_profile(profiles.DEFAULT_PROFILE)
for name in schedulers.names("all"):
    r = simulate(df, name, prof, horizon_s=float(arr[-1] * 1.5), seed=1, slo={"ttft_s": 2.0, "tpot_s": 0.1})
    print(name, hashlib.sha256(r.requests.write_csv().encode()).hexdigest())
"""
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 13
