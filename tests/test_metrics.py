"""Metrics: hand-computed small cases, censoring, rejection, directions, names, speed."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from portbench.present import text
from portbench.sim import metrics
from portbench import params
from portbench.core.errors import DataError, ParameterError
from portbench.sim.metrics import Metric

NAN = float("nan")
SLO = {"strict": {"ttft_s": 1.0, "tpot_s": 0.5}, "lax": {"ttft_s": 5.0, "tpot_s": 10.0}}


def records(rows: list[tuple]) -> pl.DataFrame:
    """rows: (arrival, first_token, finish, output, generated, rejected, service)."""
    a, f, e, o, g, r, s = map(list, zip(*rows))
    n = len(rows)
    return pl.DataFrame({
        "req_id": list(range(n)), "arrival_s": a, "first_token_s": f, "finish_s": e,
        "prompt_tokens": [10] * n, "output_tokens": o, "generated_tokens": g, "preemptions": [0] * n,
        "rejected": r, "tenant": ["t0"] * n, "service_s": s,
    }, schema_overrides={"first_token_s": pl.Float64, "finish_s": pl.Float64, "service_s": pl.Float64,
                         "arrival_s": pl.Float64})


# Three completed requests (horizon 10 s):
#   r0: arrives 0, first token 1,   finish 3,   5 tokens, service 1.0 -> TTFT 1,   E2E 3,   TPOT 2/4=0.5, slowdown 3
#   r1: arrives 1, first token 1.5, finish 2.5, 3 tokens, service 0.5 -> TTFT 0.5, E2E 1.5, TPOT 1/2=0.5, slowdown 3
#   r2: arrives 2, first token 4,   finish 10,  2 tokens, service 2.0 -> TTFT 2,   E2E 8,   TPOT 6/1=6,   slowdown 4
BASE = [(0.0, 1.0, 3.0, 5, 5, False, 1.0), (1.0, 1.5, 2.5, 3, 3, False, 0.5), (2.0, 4.0, 10.0, 2, 2, False, 2.0)]


def test_hand_computed_three_requests():
    m = metrics.compute(records(BASE), 10.0, SLO)
    assert m["completed"] == 3
    assert m["throughput_tok_s"] == pytest.approx((5 + 3 + 2) / 10)
    assert m["ttft_p50"] == pytest.approx(1.0)
    # numpy linear percentile of [0.5, 1, 2] at 99: position 0.99*2 = 1.98 -> 1 + 0.98*(2-1)
    assert m["ttft_p99"] == pytest.approx(1.98)
    assert (m["ttft_p90"], m["ttft_p95"]) == pytest.approx((1.8, 1.9))          # positions 1.8 and 1.9
    assert (m["tpot_p90"], m["tpot_p95"]) == pytest.approx((0.5 + 0.8 * 5.5, 0.5 + 0.9 * 5.5))
    assert (m["e2e_p90"], m["e2e_p95"]) == pytest.approx((3 + 0.8 * 5, 3 + 0.9 * 5))
    assert m["tpot_mean"] == pytest.approx(7 / 3)
    assert m["tpot_p99"] == pytest.approx(0.5 + 0.98 * 5.5)
    assert m["e2e_mean"] == pytest.approx(12.5 / 3)
    assert m["e2e_p99"] == pytest.approx(3 + 0.98 * 5)
    assert m["norm_latency_mean"] == pytest.approx((3 / 5 + 1.5 / 3 + 8 / 2) / 3)
    # x = 1/slowdown = [1/3, 1/3, 1/4]: (11/12)^2 / (3 * 41/144) = 121/123
    assert m["slowdown_jain"] == pytest.approx(121 / 123)
    assert m["max_slowdown"] == pytest.approx(4.0)
    # strict: r0 (TTFT 1 <= 1, TPOT 0.5 <= 0.5) and r1 pass, r2 fails TTFT -> 2/3; lax: r2 fails TPOT 6 <= 10? passes
    assert m["slo_strict"] == pytest.approx(2 / 3)
    assert m["slo_lax"] == pytest.approx(1.0)
    assert list(m) == ["completed", "throughput_tok_s", "slo_strict", "slo_lax", "ttft_p50", "ttft_p90",
                       "ttft_p95", "ttft_p99", "tpot_mean", "tpot_p90", "tpot_p95", "tpot_p99", "e2e_mean",
                       "e2e_p90", "e2e_p95", "e2e_p99", "norm_latency_mean", "slowdown_jain",
                       "tenant_service_gap", "tenant_jain", "max_slowdown"]
    assert list(m) == metrics.metric_names(SLO)
    # one tenant ("t0"): the tenant metrics are n/a
    assert math.isnan(m["tenant_service_gap"]) and math.isnan(m["tenant_jain"])


def test_rejected_requests_are_excluded():
    base = metrics.compute(records(BASE), 10.0, SLO)
    with_rej = metrics.compute(records(BASE + [(0.5, NAN, NAN, 50, 0, True, 9.0)]), 10.0, SLO)
    assert with_rej == pytest.approx(base, nan_ok=True)


def test_censoring_unfinished_requests():
    # r3 arrives at 4, first token at 6, still running at the horizon with 3 of 10 tokens;
    # r4 arrives at 9 and has no token yet.
    rows = BASE + [(4.0, 6.0, NAN, 10, 3, False, 1.0), (9.0, NAN, NAN, 4, 0, False, 0.5)]
    m = metrics.compute(records(rows), 10.0, SLO)
    dropped = metrics.compute(records(BASE), 10.0, SLO)
    assert m["completed"] == 3
    # E2E censored at the horizon: 10-4 = 6 and 10-9 = 1 (lower bounds), averaged with 3, 1.5, 8
    assert m["e2e_mean"] == pytest.approx((3 + 1.5 + 8 + 6 + 1) / 5)
    # a long-waiting unfinished request raises e2e_mean instead of vanishing from it
    only_r3 = metrics.compute(records(rows[:4]), 10.0, SLO)
    assert only_r3["e2e_mean"] == pytest.approx((3 + 1.5 + 8 + 6) / 4)
    assert only_r3["e2e_mean"] > dropped["e2e_mean"]
    # TTFT: r3 has its token (2 s), r4 is censored at 10 - 9 = 1 s -> [1, 0.5, 2, 2, 1]
    assert m["ttft_p50"] == pytest.approx(1.0)
    assert m["ttft_p99"] == pytest.approx(2.0)
    # TPOT over completed requests only: unchanged
    assert m["tpot_mean"] == pytest.approx(dropped["tpot_mean"])
    # unfinished requests count in SLO denominators, and their partial tokens in throughput
    assert m["slo_strict"] == pytest.approx(2 / 5)
    assert m["throughput_tok_s"] == pytest.approx((5 + 3 + 2 + 3 + 0) / 10)
    # slowdown of r3 = 6 / 1 = 6 (a lower bound) -> the new maximum
    assert m["max_slowdown"] == pytest.approx(6.0)
    assert m["norm_latency_mean"] == pytest.approx((0.6 + 0.5 + 4 + 6 / 10 + 1 / 4) / 5)


def test_events_after_the_horizon_are_censored_and_late_arrivals_ignored():
    # finish after the horizon (a replay that drained): unfinished, tokens interpolated:
    # first token at 2, finish at 12, 11 tokens -> at t=10: 1 + 10 * (8/10) = 9 tokens
    rows = [(0.0, 2.0, 12.0, 11, 11, False, 1.0), (11.0, 11.5, 12.0, 2, 2, False, 1.0)]
    m = metrics.compute(records(rows), 10.0, SLO)
    assert m["completed"] == 0
    assert m["throughput_tok_s"] == pytest.approx(9 / 10)
    assert m["e2e_mean"] == pytest.approx(10.0)
    assert math.isnan(m["tpot_mean"]) and math.isnan(m["tpot_p99"])
    assert m["slo_lax"] == 0.0


def test_single_token_outputs_use_ttft_only():
    rows = [(0.0, 0.2, 0.2, 1, 1, False, 0.2)]
    m = metrics.compute(records(rows), 5.0, SLO)
    assert m["slo_strict"] == 1.0 and math.isnan(m["tpot_mean"])
    assert m["slowdown_jain"] == pytest.approx(1.0) and m["max_slowdown"] == pytest.approx(1.0)


def test_equal_slowdowns_are_perfectly_fair_and_one_starved_request_is_not():
    fair = [(float(i), i + 0.5, i + 2.0, 4, 4, False, 1.0) for i in range(5)]   # all slowdown 2
    assert metrics.compute(records(fair), 100.0, SLO)["slowdown_jain"] == pytest.approx(1.0)
    unfair = fair[:4] + [(4.0, 50.0, 90.0, 4, 4, False, 1.0)]                   # slowdown 86
    j = metrics.compute(records(unfair), 100.0, SLO)["slowdown_jain"]
    x = np.array([0.5] * 4 + [1 / 86])
    assert j == pytest.approx(x.sum() ** 2 / (5 * (x**2).sum())) and j < 0.85


def test_all_rejected_or_empty():
    m = metrics.compute(records([(0.0, NAN, NAN, 3, 0, True, 1.0)]), 10.0, SLO)
    assert m["completed"] == 0 and m["throughput_tok_s"] == 0
    for k in ("slo_strict", "ttft_p50", "ttft_p99", "tpot_mean", "e2e_mean", "e2e_p99",
              "norm_latency_mean", "slowdown_jain", "max_slowdown", "tenant_service_gap", "tenant_jain"):
        assert math.isnan(m[k]), k


def test_polars_nulls_and_plain_mappings_agree():
    df = records(BASE + [(4.0, 6.0, NAN, 10, 3, False, 1.0)])
    with_nulls = df.with_columns(pl.when(pl.col("finish_s").is_nan()).then(None)
                                 .otherwise(pl.col("finish_s")).alias("finish_s"))
    as_dict = {c: df[c].to_numpy() for c in df.columns}
    a = metrics.compute(df, 10.0, SLO)
    assert metrics.compute(with_nulls, 10.0, SLO) == pytest.approx(a, nan_ok=True)
    assert metrics.compute(as_dict, 10.0, SLO) == pytest.approx(a, nan_ok=True)
    with pytest.raises(DataError, match="service_s"):
        metrics.compute(df.drop("service_s"), 10.0, SLO)
    with pytest.raises(ParameterError):
        metrics.compute(df, 0.0, SLO)


def test_names_follow_simulation_slo(tmp_params):
    P = params.load(validate=False)
    names = metrics.metric_names(P.simulation.slo)
    assert names[:2] == ["completed", "throughput_tok_s"]
    assert [n for n in names if n.startswith("slo_")] == [f"slo_{s}" for s in P.simulation.slo]
    assert names == metrics.metric_names()
    P2 = params.load(validate=False, overrides={"simulation.slo": {"chat": {"ttft_s": 1, "tpot_s": 0.1}}})
    chat = [n for n in metrics.metric_names(P2.simulation.slo) if n.startswith("slo_")]
    assert "slo_chat" in chat
    assert metrics.direction("slo_chat") == "higher"
    assert "TTFT <= 1 s" in text.metrics_markdown(P2.simulation.slo)
    assert metrics.selected_metrics(P.analysis.metrics, P.simulation.slo) == names


def test_directions():
    higher = {"completed", "throughput_tok_s", "slowdown_jain", "tenant_jain", "slo_tight", "slo_medium", "slo_loose"}
    for name in metrics.metric_names():
        assert metrics.direction(name) == ("higher" if name in higher else "lower"), name
    with pytest.raises(ParameterError) as e:
        metrics.direction("goodput")
    assert "ttft_p99" in str(e.value)
    table = text.metrics_markdown()
    assert table.startswith("| metric |") and "`slowdown_jain`" in table and "`slo_tight`" in table


def test_scales_say_how_differences_are_sized():
    """Proportions (SLO attainment, fairness) are compared in percentage points, counts in points of the
    window, everything else (latencies, throughput, slowdown) relatively."""
    for name in metrics.metric_names():
        want = ("proportion" if name.startswith("slo_") or name in ("slowdown_jain", "tenant_jain")
                else "count" if name == "completed" else "ratio")
        assert metrics.scale(name) == want, name
    with pytest.raises(ParameterError, match="scale"):
        metrics.register_metric(Metric("odd", "lower", "s", "x", "percent"), lambda v: 0.0)
    assert "odd" not in metrics.metric_names()


def test_check_slo_defs():
    metrics.check_slo_defs(SLO)
    with pytest.raises(ParameterError, match=r"simulation.slo.bad.tpot_s"):
        metrics.check_slo_defs({"bad": {"ttft_s": 1.0, "tpot_s": 0}})
    with pytest.raises(ParameterError):
        metrics.check_slo_defs({"bad": {"ttft_s": 1.0}})


def test_custom_metric_registration():
    m = Metric("p90_e2e", "lower", "s", "90th-percentile E2E (censored)")
    metrics.register_metric(m, lambda v: float(np.percentile(v.e2e, 90)))
    try:
        assert metrics.metric_names()[-1] == "p90_e2e" and metrics.direction("p90_e2e") == "lower"
        out = metrics.compute(records(BASE), 10.0, SLO)
        assert out["p90_e2e"] == pytest.approx(np.percentile([3, 1.5, 8], 90))
        with pytest.raises(ParameterError):
            metrics.register_metric(m, lambda v: 0.0)
    finally:
        metrics.unregister_metric("p90_e2e")
    assert "p90_e2e" not in metrics.metric_names()


# --------------------------------------------------------------------------- per-tenant (VTC) fairness


def tenant_records(rows: list[tuple]) -> pl.DataFrame:
    """rows: (tenant, arrival, first_token, finish, prompt, output, generated)."""
    t, a, f, e, p, o, g = map(list, zip(*rows))
    n = len(rows)
    return pl.DataFrame({
        "req_id": list(range(n)), "arrival_s": a, "first_token_s": f, "finish_s": e, "prompt_tokens": p,
        "output_tokens": o, "generated_tokens": g, "preemptions": [0] * n, "rejected": [False] * n,
        "tenant": t, "service_s": [1.0] * n,
    }, schema_overrides={"first_token_s": pl.Float64, "finish_s": pl.Float64, "arrival_s": pl.Float64})


def test_vtc_service_gap_hand_computed_two_tenants():
    """a: arrives 0, first token 1, finish 3, prompt 10, 5 tokens; b: arrives 0, first token 2, finish 4,
    prompt 10, 3 tokens. Service = prompt + 2 x tokens (tokens linear from the first token):
    S_a(0, 1, 2, 3) = 0, 12, 16, 20; S_b(0, 1, 2, 3, 4) = 0, 0, 12, 14, 16. Both wait only during
    (0, 1): S_a - S_b goes 0 -> 12, so the gap is 12. Rates while backlogged: a 12 / 1 s, b (0 + 12) / 2 s
    -> Jain (12 + 6)^2 / (2 (144 + 36)) = 0.9."""
    rows = [("a", 0.0, 1.0, 3.0, 10, 5, 5), ("b", 0.0, 2.0, 4.0, 10, 3, 3)]
    m = metrics.compute(tenant_records(rows), 10.0, SLO)
    assert m["tenant_service_gap"] == pytest.approx(12.0)
    assert m["tenant_jain"] == pytest.approx(0.9)
    names, times, S, B = metrics.service_curves(np.array(["a", "b"]), np.array([0.0, 0.0]), np.array([1.0, 2.0]),
                                                np.array([3.0, 4.0]), np.array([10.0, 10.0]), np.array([5.0, 3.0]),
                                                np.array([5.0, 3.0]), 10.0)
    assert times.tolist() == [0, 1, 2, 3, 4, 10]
    assert S[0].tolist() == [0, 12, 16, 20, 20, 20] and S[1].tolist() == [0, 0, 12, 14, 16, 16]
    assert B.tolist() == [[True, False, False, False, False], [True, True, False, False, False]]


def test_tenant_metrics_are_na_without_tenants():
    rows = [("n/a", 0.0, 1.0, 3.0, 10, 5, 5), ("n/a", 0.0, 2.0, 4.0, 10, 3, 3)]
    m = metrics.compute(tenant_records(rows), 10.0, SLO)
    assert math.isnan(m["tenant_service_gap"]) and math.isnan(m["tenant_jain"])
    assert not math.isnan(m["slowdown_jain"])                      # per-request fairness still defined
    assert metrics.NO_TENANT == "n/a"


def _brute_gap(tenant, arr, ft, fin, prompt, out, gen, h, grid=4001):
    """The service gap on a fine grid (a check of the exact event-based computation)."""
    t = np.linspace(0, h, grid)
    names = sorted(set(tenant))
    S = {u: np.zeros(grid) for u in names}
    W = {u: np.zeros(grid, dtype=bool) for u in names}
    for i, u in enumerate(tenant):
        f = ft[i] if ft[i] <= h else np.inf
        end = fin[i] if np.isfinite(fin[i]) else h
        n_end = out[i] if np.isfinite(fin[i]) else gen[i]
        frac = np.clip((t - f) / max(end - f, 1e-12), 0, 1)
        S[u] += np.where(t >= f, prompt[i] + 2 * (1 + (n_end - 1) * frac), 0.0)
        W[u] |= (arr[i] <= t) & (t < f)
    best = 0.0
    for x in names:
        for y in names:
            if x >= y:
                continue
            both = W[x] & W[y]
            d = S[x] - S[y]
            k = 0
            while k < grid:
                if both[k]:
                    j = k
                    while j + 1 < grid and both[j + 1]:
                        j += 1
                    seg = d[k:min(j + 2, grid)]
                    best = max(best, seg.max() - seg.min())
                    k = j + 1
                else:
                    k += 1
    return best


def test_vtc_service_gap_matches_a_brute_force_grid():
    rng = np.random.default_rng(11)
    n = 30
    arr = np.sort(rng.uniform(0, 5, n))
    ft = arr + rng.uniform(0.1, 3, n)
    out = rng.integers(2, 40, n).astype(float)
    fin = ft + out * rng.uniform(0.05, 0.2, n)
    fin[rng.random(n) < 0.2] = np.nan                   # some unfinished at the horizon
    h = 12.0
    gen = np.where(np.isfinite(fin), out, np.floor(out / 2))
    prompt = rng.integers(5, 200, n).astype(float)
    tenant = np.array([f"t{k}" for k in rng.integers(0, 3, n)])
    ft_c = np.where(ft <= h, ft, np.nan)
    gap, _ = metrics.tenant_fairness(tenant, arr, ft_c, np.where(fin <= h, fin, np.nan), prompt, out, gen, h)
    want = _brute_gap(tenant, arr, ft_c, np.where(fin <= h, fin, np.nan), prompt, out, gen, h)
    assert gap == pytest.approx(want, rel=0.02)


def test_vtc_narrows_the_service_gap_of_a_flooding_tenant():
    """Simulated: tenant a floods the queue, b arrives just after. FCFS serves a first (large gap between
    two backlogged tenants); VTC interleaves them (small gap, Jain over tenants near 1)."""
    from test_simulator import StubProfile, run, window
    n = 40
    arr = [0.001 * i for i in range(n)] + [0.05 + 0.001 * i for i in range(n)]
    df = window(arr, [100] * (2 * n), [20] * (2 * n), ["a"] * n + ["b"] * n)
    prof = StubProfile(max_num_seqs=2)
    h = 0.5 * run(df, "fcfs", prof).requests["finish_s"].max()
    m = {name: metrics.compute(run(df, name, prof, horizon=h).requests, h, SLO) for name in ("fcfs", "vtc")}
    assert m["vtc"]["tenant_service_gap"] < 0.25 * m["fcfs"]["tenant_service_gap"]
    assert m["vtc"]["tenant_jain"] > 0.95 > m["fcfs"]["tenant_jain"]


def test_percentile_replica_is_numpys_bit_for_bit():
    """The metrics' percentiles (``metrics._percentile_linear``) are numpy.percentile's, bit for bit: random
    arrays of every size from 1, with ties, wide and tiny magnitudes, and the quantiles the metrics take."""
    rng = np.random.default_rng(0)
    for i in range(3000):
        n = int(rng.integers(1, 300))
        x = (rng.exponential(3, n), rng.integers(0, 5, n).astype(float), rng.normal(0, 1e6, n),
             rng.uniform(0, 1, n) * 10.0 ** rng.integers(-8, 8))[i % 4]
        for q in ([50, 90, 95, 99], [90, 95, 99], [0, 100]):
            a, b = np.percentile(x, q), metrics._percentile_linear(x, q)
            assert (a.view(np.int64) == b.view(np.int64)).all(), (n, q)


def _bits(x):
    return np.asarray(x, dtype=float).view(np.int64).tolist()


def test_compiled_tenant_curves_and_tenant_index_give_the_same_bits():
    """The compiled service curves (numba) and the numpy ones give the same tenant metrics, bit for bit, on random
    runs (ties, requests without a first token, unfinished ones, ones that drained past the horizon, one tenant
    only); and a tenant index computed once for the window (``compute(..., tenant_index=...)``, as the campaign
    passes it) gives the metrics computed from the tenant column."""
    core = metrics.CURVES_LOOP(may_import=True)
    assert core is not None          # numba is a dependency: the compiled path is the one the campaign takes
    rng = np.random.default_rng(5)
    slo = {"a": {"ttft_s": 1.0, "tpot_s": 0.05}}
    for k in range(150):
        n = int(rng.integers(1, 70))
        arr = np.sort(np.round(rng.uniform(0, 6, n), int(rng.integers(0, 3))))
        ft = arr + np.round(rng.uniform(0, 3, n), 1)
        out = rng.integers(1, 60, n).astype(float)
        fin = ft + out * rng.uniform(0.0, 0.2, n)
        h = float(rng.choice([4.0, 8.0, 20.0]))
        fin[rng.random(n) < 0.2] = np.nan                     # unfinished
        ft[rng.random(n) < 0.1] = np.nan                      # no first token
        gen = np.where(np.isfinite(fin), out, np.floor(out * rng.uniform(0, 1, n)))
        tenant = np.array([f"t{t}" for t in rng.integers(0, int(rng.integers(1, 5)), n)])
        df = pl.DataFrame({"req_id": np.arange(n), "arrival_s": arr, "first_token_s": ft, "finish_s": fin,
                           "prompt_tokens": rng.integers(1, 900, n), "output_tokens": out.astype(np.int64),
                           "generated_tokens": gen.astype(np.int64), "preemptions": np.zeros(n, np.int64),
                           "rejected": rng.random(n) < 0.05, "tenant": tenant,
                           "service_s": rng.uniform(0.05, 2.0, n)})
        got = metrics.compute(df, h, slo)
        index = np.unique(df["tenant"].cast(str).to_numpy(), return_inverse=True)
        with_index = metrics.compute(df, h, slo, tenant_index=index)
        metrics.CURVES_LOOP.off = True                        # the numpy service curves
        try:
            ref = metrics.compute(df, h, slo)
        finally:
            metrics.CURVES_LOOP.off = False
        assert list(got) == list(ref) == list(with_index)
        assert _bits(list(got.values())) == _bits(list(ref.values())) == _bits(list(with_index.values())), k


def test_metrics_and_the_reference_core_never_import_numba():
    """loops.NUMBA_LOADED: a process that computes metrics (tenant fairness included) and runs the reference core
    stays free of numba/llvmlite -- vLLM's in-process engine (the validation's step grid) cannot start where llvmlite
    is loaded."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, polars as pl\n"
            "from portbench.sim import metrics, profiles\n"
            "from portbench.sim.engine import simulate\n"
            "df = pl.DataFrame({'request_id': [0, 1, 2], 'arrival_s': [0.0, 0.1, 0.2], 'prompt_tokens': [10, 20, 30],"
            " 'output_tokens': [5, 6, 7], 'tenant': ['a', 'b', 'a']})\n"
            "r = simulate(df, 'vtc', profiles.get_profile('a100_40gb_llama3_1_8b'), horizon_s=10.0, seed=0,"
            " engine={'core': 'reference'})\n"
            "m = metrics.compute(r.record_arrays(), 10.0, {'s': {'ttft_s': 1.0, 'tpot_s': 0.1}})\n"
            "assert r.counters['queue_mean'] == r.counters['queue_mean']\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('numba', 'llvmlite')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
