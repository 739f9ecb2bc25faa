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
    assert m["tpot_mean"] == pytest.approx(7 / 3)
    assert m["tpot_p99"] == pytest.approx(0.5 + 0.98 * 5.5)
    assert m["e2e_mean"] == pytest.approx(12.5 / 3)
    assert m["e2e_p99"] == pytest.approx(3 + 0.98 * 5)
    assert m["norm_latency_mean"] == pytest.approx((3 / 5 + 1.5 / 3 + 8 / 2) / 3)
    # x = 1/slowdown = [1/3, 1/3, 1/4]: (11/12)^2 / (3 * 41/144) = 121/123
    assert m["jain_fairness"] == pytest.approx(121 / 123)
    assert m["max_slowdown"] == pytest.approx(4.0)
    # strict: r0 (TTFT 1 <= 1, TPOT 0.5 <= 0.5) and r1 pass, r2 fails TTFT -> 2/3; lax: r2 fails TPOT 6 <= 10? passes
    assert m["slo_strict"] == pytest.approx(2 / 3)
    assert m["slo_lax"] == pytest.approx(1.0)
    assert list(m) == ["completed", "throughput_tok_s", "slo_strict", "slo_lax", "ttft_p50", "ttft_p99",
                       "tpot_mean", "tpot_p99", "e2e_mean", "e2e_p99", "norm_latency_mean",
                       "jain_fairness", "max_slowdown"]


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
    assert m["jain_fairness"] == pytest.approx(1.0) and m["max_slowdown"] == pytest.approx(1.0)


def test_equal_slowdowns_are_perfectly_fair_and_one_starved_request_is_not():
    fair = [(float(i), i + 0.5, i + 2.0, 4, 4, False, 1.0) for i in range(5)]   # all slowdown 2
    assert metrics.compute(records(fair), 100.0, SLO)["jain_fairness"] == pytest.approx(1.0)
    unfair = fair[:4] + [(4.0, 50.0, 90.0, 4, 4, False, 1.0)]                   # slowdown 86
    j = metrics.compute(records(unfair), 100.0, SLO)["jain_fairness"]
    x = np.array([0.5] * 4 + [1 / 86])
    assert j == pytest.approx(x.sum() ** 2 / (5 * (x**2).sum())) and j < 0.85


def test_all_rejected_or_empty():
    m = metrics.compute(records([(0.0, NAN, NAN, 3, 0, True, 1.0)]), 10.0, SLO)
    assert m["completed"] == 0 and m["throughput_tok_s"] == 0
    for k in ("slo_strict", "ttft_p50", "ttft_p99", "tpot_mean", "e2e_mean", "e2e_p99",
              "norm_latency_mean", "jain_fairness", "max_slowdown"):
        assert math.isnan(m[k]), k


def test_polars_nulls_and_plain_mappings_agree():
    df = records(BASE + [(4.0, 6.0, NAN, 10, 3, False, 1.0)])
    with_nulls = df.with_columns(pl.when(pl.col("finish_s").is_nan()).then(None)
                                 .otherwise(pl.col("finish_s")).alias("finish_s"))
    as_dict = {c: df[c].to_numpy() for c in df.columns}
    a = metrics.compute(df, 10.0, SLO)
    assert metrics.compute(with_nulls, 10.0, SLO) == pytest.approx(a)
    assert metrics.compute(as_dict, 10.0, SLO) == pytest.approx(a)
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
    higher = {"completed", "throughput_tok_s", "jain_fairness", "slo_tight", "slo_medium", "slo_loose"}
    for name in metrics.metric_names():
        assert metrics.direction(name) == ("higher" if name in higher else "lower"), name
    with pytest.raises(ParameterError) as e:
        metrics.direction("goodput")
    assert "ttft_p99" in str(e.value)
    table = text.metrics_markdown()
    assert table.startswith("| metric |") and "`jain_fairness`" in table and "`slo_tight`" in table


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
