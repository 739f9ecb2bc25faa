"""What ports (issue #25): TOST, the vectorised corrections, side classes, the four-way table, the analysis plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from portbench.study import stats
from portbench.study.analysis import plan as plan_mod
from portbench.study.analysis import ports
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- TOST

def test_tost_equals_statsmodels_and_a_hand_computation():
    rng = np.random.default_rng(3)
    for shift, margin in ((0.0, 0.3), (0.25, 0.3), (1.0, 0.3), (-0.1, 0.05)):
        a = rng.normal(5.0, 1.0, 40)
        b = a - shift + rng.normal(0, 0.4, 40)
        ref = ttost_paired(a, b, -margin, margin)[0]
        assert stats.tost_paired((a - b)[None], margin)[0] == pytest.approx(ref, rel=1e-10)
    # by hand: d = (1, 2, 3), margin 4: mean 2, se = 1 / sqrt(3); p = P(T_2 <= (2 - 4) / se)
    import scipy.stats as st
    se = 1.0 / np.sqrt(3)
    hand = max(st.t.sf((2 + 4) / se, 2), st.t.cdf((2 - 4) / se, 2))
    assert stats.tost_paired(np.array([1.0, 2.0, 3.0]), 4.0) == pytest.approx(hand)


def test_tost_degenerate_slices():
    d = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.1, np.nan, 0.2], [np.nan, np.nan, 0.3]])
    p = stats.tost_paired(d, 0.5)
    assert p[0] == 0.0 and p[1] == 1.0            # equal differences: inside / outside the margin
    assert 0.0 < p[2] < 1.0 and np.isnan(p[3])     # a missing window is left out; one window: undefined


@pytest.mark.parametrize("method", ["fdr_bh", "holm"])
def test_vectorised_adjustment_equals_multipletests(method):
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, (50, 78)) ** 2
    p[3, :10] = np.nan
    p[4, 5] = p[4, 6] = p[4, 7]                   # ties
    out = stats.adjust_last_axis(p, method)
    for i in range(p.shape[0]):
        ok = ~np.isnan(p[i])
        assert np.allclose(out[i][ok], multipletests(p[i][ok], method=method)[1], rtol=1e-12, atol=1e-15)
        assert np.isnan(out[i][~ok]).all()


# --------------------------------------------------------------------------- classes and the four-way table

def test_four_way_counts_on_a_tiny_table():
    A, B, E, U, N = stats.STRONG_A, stats.STRONG_B, stats.EQUIVALENT, stats.UNDETERMINED, stats.NOT_APPLICABLE
    c1 = np.array([A, A, B, A, E, U, E, A, N])
    c2 = np.array([A, B, B, E, A, U, E, U, A])
    fw = stats.four_way(c1, c2)
    assert fw.tolist() == [0, 1, 0, 2, 2, 3, 3, 2, -1]
    counts = stats.four_way_counts(fw)
    assert counts.tolist() == [2, 1, 3, 2]          # n/a left out of every class
    assert stats.concordance(counts) == pytest.approx(2 / 3)
    assert np.isnan(stats.concordance(np.array([0, 0, 5, 1])))


def test_side_classes_strong_needs_significance_and_size():
    p_adj = np.array([0.001, 0.001, 0.5, 0.001, 0.5])
    direction = np.array([1, -1, 1, 1, 1])
    diff = np.array([0.2, -0.2, 0.01, 0.2, 0.01])
    effect = np.array([0.2, 0.2, 0.01, 0.01, 0.01])            # 4th: significant but below delta
    p_tost = np.array([0.9, 0.9, 0.001, 0.001, 0.4])
    c = stats.side_classes(p_adj, direction, diff, effect, p_tost, 0.05, 0.05)
    assert c.tolist() == [stats.STRONG_A, stats.STRONG_B, stats.EQUIVALENT, stats.EQUIVALENT, stats.UNDETERMINED]


def _two_sources(effect_1: float, effect_2: float, W: int = 40, seed: int = 0):
    """Per-window values (R=1, M=1, K=3, W) of two sources: scheduler 0 vs 1 differ by the given relative
    effects (positive = 0 is better, lower is better); scheduler 2 equals 0 up to tiny noise."""
    rng = np.random.default_rng(seed)
    out = []
    for eff in (effect_1, effect_2):
        base = rng.uniform(1.0, 3.0, W)
        x = np.stack([base, base * (1 + eff) * (1 + rng.normal(0, 0.01, W)), base * (1 + rng.normal(0, 0.001, W))])
        out.append(x[None, None])
    return out


def _classes(x):
    return ports.classify(x, np.array([-1.0]), ["ratio"], np.array([0.05]), window_size=200, alpha=0.05,
                          correction="fdr_bh")["classes"][0, 0]


def test_planted_reversal_is_found_and_a_planted_non_reversal_is_not():
    x1, x2 = _two_sources(0.3, -0.3)            # 0 better on the first source, worse on the second
    c1, c2 = _classes(x1), _classes(x2)
    assert c1[0] == stats.STRONG_A and c2[0] == stats.STRONG_B
    assert stats.four_way(c1, c2)[0] == 1      # a reversal
    assert c1[1] == stats.EQUIVALENT            # (0, 2): the same up to 0.1% noise -> equivalent, not ordered
    y1, y2 = _two_sources(0.3, 0.3, seed=1)
    assert stats.four_way(_classes(y1), _classes(y2))[0] == 0
    z1, z2 = _two_sources(0.3, -0.01, seed=2)  # opposite sign but far below delta on the second: no reversal
    fw = stats.four_way(_classes(z1), _classes(z2))[0]
    assert fw in (2,) and _classes(z2)[0] in (stats.EQUIVALENT, stats.UNDETERMINED)


def test_tau_on_classes_leaves_undetermined_pairs_out():
    A, B, E, U = stats.STRONG_A, stats.STRONG_B, stats.EQUIVALENT, stats.UNDETERMINED
    r = ports.tau_on_classes(np.array([A, A, B, U, E]), np.array([A, B, B, A, A]))
    # determined on both: pairs 0, 1, 2, 4; x signs (1, 1, -1, 0), y signs (1, -1, -1, 1)
    assert r["tau_b"] == pytest.approx((1 - 1 + 1 + 0) / np.sqrt(3 * 4))
    assert r["tau_b_norm"] == pytest.approx(1 / 3)               # (C - D) / (C + D) = (2 - 1) / 3


def test_copeland_ranks_tie_equivalent_and_undetermined_pairs():
    A, E, U = stats.STRONG_A, stats.EQUIVALENT, stats.UNDETERMINED
    # K = 3, pairs (0,1), (0,2), (1,2): 0 beats 1, 0 ~ 2 equivalent, 1 vs 2 undetermined -> scores 1, -1, 0
    assert ports.copeland_ranks(np.array([A, E, U]), 3).tolist() == [1.0, 3.0, 2.0]
    # nothing strong: every scheduler tied
    assert ports.copeland_ranks(np.array([E, U, E]), 3).tolist() == [2.0, 2.0, 2.0]


def test_evenly_spaced_windows_cover_the_trace():
    idx = ports.evenly_spaced(40, 10)
    assert idx[0] == 0 and idx[-1] == 39 and len(idx) == 10


# --------------------------------------------------------------------------- the plan


def test_the_default_parameters_follow_the_analysis_plan():
    data = plan_mod.read_plan(plan_mod.plan_path(ROOT))
    default = yaml.safe_load((ROOT / "papermill_params/default.yaml").read_text())["analysis"]
    assert plan_mod.deviations(data["plan"], default) == {}
    first = data["changes"][0]
    assert str(first["date"]) == "2026-12-01" and "headline_metrics" in first["what"]
    assert [str(c["date"]) for c in data["changes"]] == sorted(str(c["date"]) for c in data["changes"])


def test_a_deviation_from_the_plan_is_reported(tmp_path):
    (tmp_path / "papermill_params").mkdir()
    text = (ROOT / plan_mod.PLAN_FILE).read_text()
    (tmp_path / plan_mod.PLAN_FILE).write_text(text)
    used = {**yaml.safe_load(text)["plan"], "delta": 0.1}
    block = plan_mod.plan_block(tmp_path, used)
    assert block["follows_plan"] is False and block["deviations"] == {"delta": {"plan": 0.05, "used": 0.1}}
    assert len(block["sha256"]) == 64


def test_fast_signed_rank_equals_scipy_asymptotic():
    import scipy.stats as st
    rng = np.random.default_rng(5)
    d = np.round(rng.normal(0.2, 1.0, (400, 40)), 1)         # rounded: ties and zeros
    d[:5] = 0.0
    d[5:10, :30] = 0.0
    p, direction = stats.signed_rank_normal(d)
    for i in range(d.shape[0]):
        if np.all(d[i] == 0):
            assert p[i] == 1.0 and direction[i] == 0
            continue
        ref = st.wilcoxon(d[i], method="asymptotic").pvalue
        assert p[i] == pytest.approx(ref, rel=1e-9, abs=1e-15)
        assert direction[i] == stats.paired_wilcoxon(d[i]).direction


def test_resampled_signed_rank_equals_the_test_on_resampled_rows():
    rng = np.random.default_rng(8)
    d = np.round(rng.normal(0.1, 1.0, (60, 30)), 1)
    d[0] = 0.0
    d[1, :20] = 0.0
    idx = rng.integers(0, 30, (25, 30))
    counts = np.stack([np.bincount(i, minlength=30) for i in idx])
    p, direction = stats.resampled_signed_rank(d, counts)
    p_ref, dir_ref = stats.signed_rank_normal(np.moveaxis(d[:, idx], 1, 0))   # (B, rows, W)
    assert np.allclose(p, p_ref, rtol=1e-9, atol=1e-15)
    assert (direction == dir_ref).all()


def test_resampled_classes_equal_the_classes_of_resampled_windows():
    x1, _ = _two_sources(0.3, -0.3, W=40, seed=4)
    rng = np.random.default_rng(1)
    x = np.concatenate([x1, x1 * np.array([1.0, 1.04, 0.97])[None, None, :, None]], axis=0)   # (R=2, M, K, W)
    idx = rng.integers(0, 40, (30, 40))
    counts = np.stack([np.bincount(i, minlength=40) for i in idx])
    kw = {"window_size": 200, "alpha": 0.05, "correction": "fdr_bh"}
    got = ports.classify_resampled(x, np.array([-1.0]), ["ratio"], np.array([0.05]), counts, **kw)
    ref = ports.classify(np.moveaxis(x[..., idx], -2, 0), np.array([-1.0]), ["ratio"], np.array([0.05]), fast=True,
                         **kw)["classes"]
    assert got.shape == ref.shape == (30, 2, 1, 3)
    assert (got == ref).all()


def test_effective_windows_of_independent_and_of_trending_windows():
    from portbench.study.analysis.cube import Cube
    rng = np.random.default_rng(0)
    W = 40
    iid = rng.normal(10, 1, W)
    trend = np.linspace(5, 15, W) + rng.normal(0, 0.1, W)
    vals = {s: np.tile(v, (1, 1, 1, 1)) for s, v in (("a", iid), ("b", trend))}
    cube = Cube(sources=["a", "b"], provenance={"a": "real", "b": "real"}, regions=["r"], rho={"r": 0.5},
                metrics=["e2e_mean"], directions=["lower"], schedulers=["fcfs"], windows={"a": [], "b": []},
                values=vals, n_replicates={})
    e = ports.effective_windows(cube, [0])["by_source"]
    assert abs(e["a"]["lag1_autocorrelation"]) < 0.4 and e["a"]["effective_windows"] > 20
    assert e["b"]["lag1_autocorrelation"] > 0.9 and e["b"]["effective_windows"] < 3


def test_the_plan_records_the_interval_method():
    data = plan_mod.read_plan(plan_mod.plan_path(ROOT))
    assert data["plan"]["interval"] == ports.INTERVAL
    assert any(str(c["date"]) == "2026-12-02" and "interval" in c["what"] for c in data["changes"])


def test_block_bootstrap_keeps_runs_of_consecutive_windows():
    rng = np.random.default_rng(2)
    idx = stats.block_bootstrap_indices(40, 200, 5, rng)
    assert idx.shape == (200, 40) and idx.min() >= 0 and idx.max() < 40
    step = (np.diff(idx, axis=1) % 40 == 1)               # consecutive (wrapping) within each block of 5
    for j in range(40 - 1):
        if (j + 1) % 5:
            assert step[:, j].all()
    # every window equally likely (circular): counts flat over many resamples
    c = np.bincount(stats.block_bootstrap_indices(40, 4000, 5, rng).ravel(), minlength=40)
    assert c.min() > 0.9 * c.mean() and c.max() < 1.1 * c.mean()
    # block 1 is the ordinary bootstrap, drawn from the same generator
    a = stats.block_bootstrap_indices(30, 7, 1, np.random.default_rng(4))
    assert (a == stats.bootstrap_indices(30, 7, np.random.default_rng(4))).all()


def _ar1(W, r, rng):
    x = np.empty(W)
    x[0] = rng.normal()
    for t in range(1, W):
        x[t] = r * x[t - 1] + np.sqrt(1 - r * r) * rng.normal()
    return x


def test_block_lengths_follow_the_autocorrelation_and_widen_the_interval():
    """Planted: one source's windows strongly autocorrelated (a slow drift shared by every scheduler), the other's
    independent. The correlated source gets long blocks, the other block 1; and the block bootstrap's spread of a
    mean difference over the correlated windows is wider than the ordinary bootstrap's (which treats them as
    independent)."""
    from portbench.study.analysis.cube import Cube
    rng = np.random.default_rng(11)
    W = 40
    drift = 10 + 3 * _ar1(W, 0.6, rng)
    corr = np.stack([drift, drift * 1.02 + 0.3 * _ar1(W, 0.6, rng)])[None, None]      # (R, M, K, W)
    iid = np.stack([10 + rng.normal(0, 1, W), 10.2 + rng.normal(0, 1, W)])[None, None]
    cube = Cube(sources=["c", "i"], provenance={"c": "real", "i": "real"}, regions=["r"], rho={"r": 0.5},
                metrics=["e2e_mean"], directions=["lower"], schedulers=["fcfs", "sjf_oracle"],
                windows={"c": [], "i": []}, values={"c": corr, "i": iid}, n_replicates={})
    bl = ports.block_lengths(cube, [0])
    assert bl["i"] == 1 and bl["c"] >= 3
    d = corr[0, 0, 1] - corr[0, 0, 0]
    spread = {}
    for L in (1, bl["c"]):
        idx = stats.block_bootstrap_indices(W, 2000, L, np.random.default_rng(0))
        spread[L] = np.std(d[idx].mean(axis=1))
    assert spread[bl["c"]] > 1.3 * spread[1]


def test_resampled_signed_rank_compiled_and_numpy_paths_agree_bit_for_bit():
    """The compiled loop (numba) and the numpy path give the same sums: every value a multiple of 1/2, exact in any
    order. Ties, zeros, NaNs and windows never drawn included; fails if either path mis-ranks a tie group."""
    rng = np.random.default_rng(3)
    d = np.round(rng.normal(0.0, 1.0, (80, 40)), 1)      # many ties
    d[0] = 0.0
    d[1, :30] = 0.0
    d[2, ::3] = np.nan
    d[3] = 0.5                                               # one tie group
    idx = rng.integers(0, 40, (60, 40))
    counts = np.stack([np.bincount(i, minlength=40) for i in idx])
    assert stats.SIGNED_RANK_LOOP(may_import=True) is not None
    p_c, dir_c = stats.resampled_signed_rank(d, counts)
    stats.SIGNED_RANK_LOOP.off = True
    try:
        p_n, dir_n = stats.resampled_signed_rank(d, counts)
    finally:
        stats.SIGNED_RANK_LOOP.off = False
    assert np.array_equal(p_c, p_n) and np.array_equal(dir_c, dir_n)
    assert not np.all(p_c == 1.0) and (dir_c != 0).any() and (p_c < 0.05).any()    # the case tests something
