"""The replay harness end to end on vLLM's CPU build (``make test-vllm``, inside .venv-vllm).

A tiny Llama architecture (2 layers, hidden 128, vocabulary 1000; ``model_configs/tiny_llama``) with
dummy weights, no tokenizer, eager mode, a 1 GiB KV cache. Two short windows are replayed on two
engines — vLLM's FCFS and its priority policy fed with ``sjf_prompt``'s static order — through the
same code the GPU validation uses (``validation.replay.Replayer``). Marked ``vllm``: the main
environment's ``make test`` deselects it (``-m "not vllm"``) and then runs ``make test-vllm``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import polars as pl
import pytest

pytestmark = pytest.mark.vllm

SIMULTANEOUS = pl.DataFrame({            # six requests arriving together
    "arrival_s": [0.0] * 6,
    "prompt_tokens": [40, 24, 56, 32, 48, 16],
    "output_tokens": [6, 9, 5, 8, 7, 4],
    "tenant": ["t0", "t1", "t0", "t1", "t0", "t1"],
})
OVERTAKE = pl.DataFrame({                # a long request, three long prompts queue, a short prompt comes later
    "arrival_s": [0.0, 0.02, 0.03, 0.04, 0.10],
    "prompt_tokens": [64, 200, 180, 160, 16],
    "output_tokens": [400, 8, 8, 8, 8],
    "tenant": ["t0"] * 5,
})
WINDOWS = {"simultaneous": SIMULTANEOUS, "overtake": OVERTAKE}
LONG = pl.DataFrame({"arrival_s": [0.0, 0.0], "prompt_tokens": [32, 8], "output_tokens": [1500, 2],
                     "tenant": ["t0", "t1"]})   # request 0 cannot finish within SHORT_HORIZON_S
SHORT_HORIZON_S = 0.3
SHORT = 4            # req_id of OVERTAKE's short-prompt request
QUEUED = (1, 2, 3)   # OVERTAKE's requests waiting behind request 0 when SHORT arrives
HORIZON_S = 30.0


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


def _spec(mode: str):
    from portbench.validation import replay

    return replay.EngineSpec(model="tiny_llama", mode=mode, max_num_seqs=1, block_size=None,
                             kv_cache_memory_bytes=1 << 30, dtype="float32", enforce_eager=True,
                             max_model_len=1024, seed=0)


@pytest.fixture(scope="module")
def replays(env, tmp_path_factory):
    """{mode: {"records": {window: records}, "iterations": rows, "startup_s": s}} for fcfs and priority."""
    from portbench.validation import replay

    out = {}
    tmp = tmp_path_factory.mktemp("vllm")
    for mode in ("fcfs", "priority"):
        log = tmp / f"iterations_{mode}.jsonl"
        recs = {}
        with replay.Replayer(_spec(mode), log) as r:
            for name, df in WINDOWS.items():
                prio = None
                if mode == "priority":
                    prio = replay.priority_ranks(replay.static_keys("sjf_prompt", df, seed=0))
                reqs, rej = replay.build_requests(df, vocab_size=1000, seed=7, priorities=prio, max_model_len=1024)
                assert not rej
                recs[name] = r.replay(reqs, horizon_s=HORIZON_S, tag=f"{mode}-{name}")
            startup = r.startup_s
            if mode == "fcfs":
                reqs, _ = replay.build_requests(LONG, vocab_size=1000, seed=8, max_model_len=2048)
                long_rec = r.replay(reqs, horizon_s=SHORT_HORIZON_S, tag="long")
        out[mode] = {"records": recs, "iterations": replay.iteration_rows(log), "startup_s": startup}
    out["long"] = long_rec
    return out


def _all_records(replays):
    return [(mode, name, rec) for mode, d in replays.items() if mode != "long" for name, rec in d["records"].items()]


def test_every_request_finishes_with_exactly_its_output_length(replays):
    for mode, name, rec in _all_records(replays):
        src = WINDOWS[name]
        assert rec.height == src.height, (mode, name)
        assert rec["status"].to_list() == ["finished"] * src.height, (mode, name, rec["status"].to_list())
        assert rec["streamed_tokens"].to_list() == src["output_tokens"].to_list(), (mode, name)
        assert rec["generated_tokens"].to_list() == src["output_tokens"].to_list()
        assert rec["finish_s"].is_not_nan().all() and rec["first_token_s"].is_not_nan().all()
        assert (rec["preemptions"] == 0).all()   # 1 GiB of KV: nothing is ever preempted here


def test_the_two_clocks_are_reconciled(replays):
    from portbench.validation import replay

    for mode, name, rec in _all_records(replays):
        assert replay.clock_problems(rec) == [], (mode, name)
        # arrivals honoured: each request was sent at its (rescaled) arrival time, within 50 ms
        assert rec["submit_lag_s"].min() >= -1e-3 and rec["submit_lag_s"].max() < 0.05, (mode, name)


def test_fcfs_serves_simultaneous_arrivals_in_arrival_order(replays):
    rec = replays["fcfs"]["records"]["simultaneous"].sort("arrival_s")
    ft = rec["first_token_s"].to_numpy()
    assert np.all(np.diff(ft) > 0), ft       # one sequence at a time: strictly increasing
    fin = rec["finish_s"].to_numpy()
    assert np.all(ft[1:] >= fin[:-1] - 1e-6)  # max_num_seqs=1: each starts after the previous finished


def test_priority_policy_serves_the_short_prompt_before_the_queued_ones(replays):
    pri = replays["priority"]["records"]["overtake"]
    ft = dict(zip(pri["req_id"].to_list(), pri["first_token_s"].to_list()))
    arr = dict(zip(pri["req_id"].to_list(), pri["arrival_s"].to_list()))
    fin0 = pri.filter(pl.col("req_id") == 0)["finish_s"][0]
    for q in QUEUED:
        assert arr[q] < arr[SHORT], "the queued requests arrived first"
        assert ft[q] > fin0 and arr[SHORT] < fin0, "they really queued behind request 0"
        assert ft[SHORT] < ft[q], (SHORT, q, ft)
    # and the priorities were sjf_prompt's order: shorter prompt = smaller number
    pr = pri.sort("prompt_tokens")["priority"].to_numpy()
    assert np.all(np.diff(pr) > 0)
    # the same window under FCFS: the short prompt waits its turn
    fc = replays["fcfs"]["records"]["overtake"]
    ftf = dict(zip(fc["req_id"].to_list(), fc["first_token_s"].to_list()))
    assert all(ftf[SHORT] > ftf[q] for q in QUEUED)


def test_metrics_come_from_the_shared_metric_function(replays):
    from portbench.sim import metrics
    from portbench import params

    P = params.load("papermill_params/smoke.yaml")
    slo = P.simulation.slo_dicts
    for mode, name, rec in _all_records(replays):
        m = metrics.compute(rec, HORIZON_S, slo)
        assert list(m) == metrics.metric_names(P.simulation.slo)
        ttft = (rec["first_token_s"] - rec["arrival_s"]).to_numpy()
        e2e = (rec["finish_s"] - rec["arrival_s"]).to_numpy()
        assert m["completed"] == rec.height
        assert m["ttft_p50"] == pytest.approx(np.median(ttft))
        assert m["e2e_mean"] == pytest.approx(e2e.mean())
        assert m["throughput_tok_s"] == pytest.approx(rec["output_tokens"].sum() / HORIZON_S)


ABORT_LAG_STEPS = 4


def test_iterations_are_recorded_and_a_profile_is_fitted(replays, tmp_path):
    from portbench.sim import profiles
    from portbench.validation import verdict

    for mode in ("fcfs", "priority"):
        it = replays[mode]["iterations"]
        prompts = sum(int(w["prompt_tokens"].sum()) for w in WINDOWS.values())
        decodes = sum(int((w["output_tokens"] - 1).sum()) for w in WINDOWS.values())
        # every prompt token prefilled once, every later token decoded once (no preemption)
        if mode == "fcfs":   # this engine also replayed LONG, cut at the horizon
            long_gen = replays["long"]["generated_tokens"].to_numpy()
            prompts += int(LONG["prompt_tokens"].sum())
            decodes += int((long_gen - 1).sum())
        assert int(it["prefill_tokens"].sum()) == prompts, mode
        # The abort travels from the client to the engine-core process asynchronously: until it lands the
        # core keeps decoding the aborted request, one step per iteration (up to 2 steps seen on a loaded
        # 2-core machine). Those steps produce tokens nobody receives; allow a few, never fewer than needed.
        assert decodes <= int(it["decode_seqs"].sum()) <= decodes + ABORT_LAG_STEPS, mode
        assert (it["iteration_s"] > 0).all() and (it["num_reqs"] <= 1).all()
    rows = pl.concat([replays[m]["iterations"] for m in ("fcfs", "priority")])
    prof = verdict.fit_engine_profile(rows, profiles.get_profile(profiles.DEFAULT_PROFILE), "vllm_cpu_tiny")
    assert all(np.isfinite(c) and c >= 0 for c in prof.coefficients) and prof.c0_s > 0
    path = profiles.save_profile(prof, tmp_path / "engine_profile.json")
    assert profiles.get_profile(str(path)).coefficients == pytest.approx(prof.coefficients)


def test_requests_still_running_at_the_horizon_are_aborted_with_their_partial_output(replays):
    from portbench.sim import metrics

    rec = replays["long"].sort("req_id")
    cut, short = rec.row(0, named=True), rec.row(1, named=True)
    assert short["status"] == "finished" and short["generated_tokens"] == 2
    assert cut["status"] == "aborted_at_horizon" and math.isnan(cut["finish_s"])
    assert 0 < cut["generated_tokens"] < 1500 and cut["first_token_s"] < SHORT_HORIZON_S
    # the simulator's semantics: one completed request, throughput counts the partial output
    m = metrics.compute(rec, SHORT_HORIZON_S, {})
    assert m["completed"] == 1
    assert m["throughput_tok_s"] == pytest.approx((2 + cut["generated_tokens"]) / SHORT_HORIZON_S)
