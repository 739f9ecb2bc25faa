"""portbench.study.stats: agreement with scipy / statsmodels and with hand computations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.stats as st
from statsmodels.stats.multitest import multipletests

from portbench.study import stats


def _scipy_tau(x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return st.kendalltau(x, y).statistic


# --------------------------------------------------------------------------- tau-b

def test_vectorised_tau_b_equals_scipy_on_many_cases_with_ties():
    rng = np.random.default_rng(1)
    n_cases, checked_ties, checked_nan = 3000, 0, 0
    for n_items in (2, 3, 5, 13):
        x = rng.integers(0, 4, (n_cases, n_items)).astype(float)   # few distinct values: many ties
        y = rng.integers(0, 4, (n_cases, n_items)).astype(float)
        x[:5] = 1.0                                                # all tied -> NaN in scipy
        vec = stats.tau_b(x, y)
        for i in range(n_cases):
            ref = _scipy_tau(x[i], y[i])
            if np.isnan(ref):
                assert np.isnan(vec[i]), (x[i], y[i])
                checked_nan += 1
            else:
                assert vec[i] == pytest.approx(ref, abs=1e-12), (x[i], y[i])
                checked_ties += len(np.unique(x[i])) < n_items
    assert checked_ties > 1000 and checked_nan >= 20


def test_vectorised_tau_b_equals_scipy_without_ties_and_on_continuous_data():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(500, 13)), rng.normal(size=(500, 13))
    vec = stats.tau_b(x, y)
    assert np.allclose(vec, [_scipy_tau(a, b) for a, b in zip(x, y)], atol=1e-12)
    assert stats.tau_b(x[0], x[0]) == pytest.approx(1.0)
    assert stats.tau_b(x[0], -x[0]) == pytest.approx(-1.0)


def test_kendall_tau_wrapper_and_hand_case():
    # x = [1,2,3,4], y = [1,3,2,4]: 5 concordant, 1 discordant, no ties -> (5-1)/6
    assert stats.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # ties: x = [1,1,2,3], y = [1,2,3,4]: n0 = 6, n1 = 1 tied pair in x; P - Q = 5 -> 5 / sqrt(5 * 6)
    assert stats.kendall_tau([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / np.sqrt(30))
    assert np.isnan(stats.kendall_tau([1, 1, 1], [1, 2, 3]))
    assert np.isnan(stats.kendall_tau([1, np.nan, 2], [1, 2, 3]))


def test_tau_b_matrix_equals_pairwise_scipy():
    rng = np.random.default_rng(3)
    rankings = rng.integers(0, 5, (6, 9)).astype(float)           # 6 raters, 9 items, ties
    tm = stats.tau_b_matrix(stats.pair_signs(rankings))
    for i in range(6):
        for j in range(6):
            ref = _scipy_tau(rankings[i], rankings[j])
            assert (np.isnan(ref) and np.isnan(tm[i, j])) or tm[i, j] == pytest.approx(ref, abs=1e-12)


def test_bootstrap_tau_equals_scipy_on_each_resample():
    """Spot-check of the vectorised bootstrap: resample windows, compute means, tau on every resample."""
    rng = np.random.default_rng(4)
    # two sources, 13 schedulers, 40 windows, integer-valued metric (exact ties between schedulers)
    x1 = rng.integers(0, 6, (13, 40)).astype(float)
    x2 = rng.integers(0, 6, (13, 40)).astype(float)
    x1[1] = x1[0]                                                  # schedulers 0 and 1 identical on source 1
    idx1 = stats.bootstrap_indices(40, 300, np.random.default_rng(10))
    idx2 = stats.bootstrap_indices(40, 300, np.random.default_rng(11))
    m1, m2 = stats.bootstrap_means(x1, idx1), stats.bootstrap_means(x2, idx2)   # (13, B)
    assert np.array_equal(m1[0], m1[1])                            # the tie survives every resample
    vec = stats.tau_b_from_signs(stats.pair_signs(m1, axis=0), stats.pair_signs(m2, axis=0))
    for b in range(300):
        assert np.allclose(m1[:, b], x1[:, idx1[b]].mean(axis=1))
        assert vec[b] == pytest.approx(_scipy_tau(m1[:, b], m2[:, b]), abs=1e-12)


def test_bootstrap_means_leave_out_missing_values():
    x = np.array([[1.0, np.nan, 3.0], [2.0, 2.0, 2.0]])
    idx = np.array([[0, 1, 2], [1, 1, 1], [2, 2, 0]])
    m = stats.bootstrap_means(x, idx)
    assert m[0, 0] == pytest.approx(2.0) and np.isnan(m[0, 1]) and m[0, 2] == pytest.approx(7 / 3)
    assert np.allclose(m[1], 2.0)


def test_percentile_ci():
    lo, hi = stats.percentile_ci(np.arange(1001.0))
    assert lo == pytest.approx(25.0) and hi == pytest.approx(975.0)


# --------------------------------------------------------------------------- Kendall's W

def test_kendall_w_hand_computation_with_ties():
    r = np.array([[1, 2, 3, 4], [1, 3, 2, 4], [1.5, 1.5, 3, 4]])
    # totals 3.5, 6.5, 8, 12; mean m(n+1)/2 = 7.5; S = 16 + 1 + 0.25 + 20.25 = 37.5
    # tie correction: rater 3 has one tie of 2 -> T = 2^3 - 2 = 6; den = 9 * 60 - 3 * 6 = 522
    assert stats.kendall_w(r) == pytest.approx(12 * 37.5 / 522)


def test_kendall_w_equals_friedman_over_m_times_n_minus_1():
    rng = np.random.default_rng(5)
    for _ in range(200):
        m, n = rng.integers(2, 5), rng.integers(3, 9)
        ranks = st.rankdata(rng.integers(0, 4, (m, n)), axis=1)
        if np.any(np.all(ranks == ranks[:, :1], axis=1)):
            continue                                               # an all-tied rater: W is NaN by definition
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chi2 = st.friedmanchisquare(*ranks.T).statistic
        assert stats.kendall_w(ranks) == pytest.approx(chi2 / (m * (n - 1)), rel=1e-10)


def test_kendall_w_extremes_and_vectorised():
    a = np.array([1.0, 2, 3, 4, 5])
    assert stats.kendall_w(np.stack([a, a, a])) == pytest.approx(1.0)
    assert stats.kendall_w(np.stack([a, a[::-1]])) == pytest.approx(0.0)
    assert np.isnan(stats.kendall_w(np.stack([a, np.full(5, 3.0), a])))        # a rater ties everything
    batch = np.stack([np.stack([a, a]), np.stack([a, a[::-1]])])
    assert np.allclose(stats.kendall_w(batch), [1.0, 0.0])


# --------------------------------------------------------------------------- orientation and ranks

def test_ranks_best_first_respects_direction_and_averages_ties():
    latency = np.array([3.0, 1.0, 2.0, 2.0])          # lower is better
    r = stats.ranks_best_first(stats.orient(latency, "lower"))
    assert list(r) == [4.0, 1.0, 2.5, 2.5]
    throughput = np.array([3.0, 1.0, 2.0, 2.0])       # higher is better
    assert list(stats.ranks_best_first(stats.orient(throughput, "higher"))) == [1.0, 4.0, 2.5, 2.5]


# --------------------------------------------------------------------------- paired tests

def _scipy_wilcoxon_p(d):
    d = d[~np.isnan(d)]
    if np.all(d == 0):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return st.wilcoxon(d).pvalue


def test_paired_wilcoxon_equals_scipy_slice_by_slice():
    rng = np.random.default_rng(6)
    for width in (8, 20, 40, 60):
        d = rng.normal(0.2, 1, (120, width))
        d[10:20, :3] = 0                                  # zeros
        d[20:40] = np.round(d[20:40], 1)                  # ties
        d[40:45] = 0                                      # all zero -> p = 1
        d[45:50, 1] = np.nan                              # a missing window
        d[50:55] = np.abs(d[50:55]) + 0.1                 # all positive: strong evidence
        res = stats.paired_wilcoxon(d)
        for i in range(d.shape[0]):
            assert res.pvalue[i] == pytest.approx(_scipy_wilcoxon_p(d[i]), rel=1e-9), (width, i, res.method[i])
        assert np.all(res.pvalue[40:45] == 1.0) and set(res.method[40:45]) == {"all_zero"}
        assert np.all(res.n[45:50] == width - 1)
        assert np.all(res.direction[50:55] == 1)


def test_paired_wilcoxon_direction_follows_the_ranks():
    d = np.array([[-0.1, -0.2, -0.3, 5.0, 6.0, 7.0, 8.0]])   # 3 small negatives, 4 large positives
    assert stats.paired_wilcoxon(d).direction[0] == 1
    assert stats.paired_wilcoxon(-d).direction[0] == -1


# --------------------------------------------------------------------------- multiple comparisons

@pytest.mark.parametrize("method", ["holm", "fdr_bh"])
def test_adjust_pvalues_equals_statsmodels(method):
    rng = np.random.default_rng(7)
    p = rng.uniform(0, 0.2, 300) ** 2
    assert np.allclose(stats.adjust_pvalues(p, method), multipletests(p, method=method)[1])
    groups = rng.integers(0, 3, 300)
    adj = stats.adjust_pvalues(p, method, groups)
    for g in range(3):
        assert np.allclose(adj[groups == g], multipletests(p[groups == g], method=method)[1])
    p[5] = np.nan
    adj = stats.adjust_pvalues(p, method)
    assert np.isnan(adj[5])
    keep = ~np.isnan(p)
    assert np.allclose(adj[keep], multipletests(p[keep], method=method)[1])


def test_adjust_pvalues_rejects_unknown_method():
    with pytest.raises(ValueError):
        stats.adjust_pvalues([0.1], "bonferonni")


# --------------------------------------------------------------------------- effects and verdicts

def test_relative_effect_is_symmetric_and_defined_at_zero():
    assert stats.relative_effect(110.0, 100.0) == pytest.approx(10 / 105)
    assert stats.relative_effect(100.0, 110.0) == stats.relative_effect(110.0, 100.0)
    assert stats.relative_effect(0.0, 0.0) == 0.0
    assert stats.relative_effect(0.0, 1.0) == pytest.approx(2.0)
    assert np.isnan(stats.relative_effect(np.nan, 1.0))


def test_verdicts_and_stages():
    v = stats.reversal_verdicts(np.array([1.0, 1.0, 1.0, 1.0]), np.array([-1.0, 1.0, -1.0, -1.0]),
                                np.array([True, True, True, False]), np.array([True, True, True, True]),
                                np.array([0.2, 0.2, 0.01, 0.2]), np.array([0.2, 0.2, 0.2, 0.2]), 0.05)
    assert list(v["reversal"]) == [True, False, True, True]
    assert list(v["significant"]) == [True, True, True, False]
    assert list(v["practical"]) == [True, True, False, True]
    assert list(stats.stage(**v)) == ["significant_and_practical", "none", "significant", "sign"]


def test_side_significant_needs_the_test_to_agree_with_the_mean():
    sig = stats.side_significant(np.array([0.01, 0.01, 0.2, 0.01]), np.array([1, -1, 1, 0]),
                                 np.array([0.5, 0.5, 0.5, 0.0]), 0.05)
    assert list(sig) == [True, False, False, False]


# --------------------------------------------------------------------------- top-1

def test_top1_changes_on_crafted_conditions():
    # (conditions, metrics, schedulers), oriented (larger = better)
    same = np.array([[[3, 1, 2], [5, 0, 1]]], float)            # scheduler 0 best under both metrics
    changes = np.array([[[3, 1, 2], [0, 5, 1]]], float)         # 0 best, then 1 best
    tied = np.array([[[3, 3, 2], [0, 5, 5]]], float)            # 1 is tied-best under both: no change
    assert list(stats.top1_changes(stats.top1_mask(np.concatenate([same, changes, tied])))) == [False, True, False]


# --------------------------------------------------------------------------- Friedman / Nemenyi

def test_friedman_equals_scipy_and_handles_all_ties():
    rng = np.random.default_rng(8)
    block = rng.normal(size=(12, 5))
    stat, p = stats.friedman(block)
    ref = st.friedmanchisquare(*block.T)
    assert stat == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    stat, p = stats.friedman(np.ones((10, 4)))
    assert np.isnan(stat) and p == 1.0


def test_nemenyi_matrix_and_critical_difference():
    rng = np.random.default_rng(9)
    block = rng.normal(size=(30, 4)) + np.array([0, 0, 2, 4])
    nm = stats.nemenyi(block, ["a", "b", "c", "d"])
    assert list(nm.index) == ["a", "b", "c", "d"] and np.allclose(nm.values, nm.values.T)
    assert nm.loc["a", "d"] < 0.05 < nm.loc["a", "b"]
    # Demsar (2006), Table 5: q_0.05 = 2.569 for k = 4 -> CD = 2.569 * sqrt(4*5 / (6*30))
    assert stats.nemenyi_cd(4, 30) == pytest.approx(2.569 * np.sqrt(20 / 180), rel=1e-3)


# --------------------------------------------------------------------------- practically tied ranks

def _rel(a, b):
    scale = (abs(a) + abs(b)) / 2.0
    return abs(a - b) / scale if scale > 0 else 0.0


def _reference_tolerant_ranks(v, tol):
    """Plain per-vector reference: sort best first, start a new group at every gap >= tol, average ranks."""
    v = [float(x) for x in v]
    if any(np.isnan(x) for x in v):
        return [np.nan] * len(v)
    order = sorted(range(len(v)), key=lambda i: -v[i])
    groups = []
    for i in order:
        if groups and (v[groups[-1][-1]] == v[i] or _rel(v[groups[-1][-1]], v[i]) < tol):
            groups[-1].append(i)
        else:
            groups.append([i])
    ranks, pos = [0.0] * len(v), 1
    for g in groups:
        for i in g:
            ranks[i] = pos + (len(g) - 1) / 2
        pos += len(g)
    return ranks


def _near_ties(rng, shape):
    """Values with planted exact ties, near-ties (relative 1e-5 .. 2e-2), chains, zeros and negatives."""
    base = rng.choice([1.0, 3.3, 250.0, 0.02], size=shape[:-1] + (1,))
    rel = rng.choice([0.0, 1e-5, 3e-3, 8e-3, 0.0099, 0.0101, 0.015, 0.05, 0.3], size=shape)
    x = base * np.cumprod(1 + rel, axis=-1)                         # chains of small gaps
    x = rng.permuted(x, axis=-1)
    flat = x.reshape(-1, shape[-1])
    flat[::7, 0] = 0.0                                            # zeros
    flat[::11, :2] = 0.0                                          # two zeros: an exact tie at 0
    flat[::5] *= -1                                               # negative (oriented lower-is-better) values
    if shape[-1] >= 3:
        flat[::13, 1] = -flat[::13, 2]                            # opposite signs
    return x


def test_tolerant_ranks_hand_cases():
    # tolerance 0 = exact ties only, as ranks_best_first
    assert list(stats.tolerant_ranks(stats.orient([3.0, 1.0, 2.0, 2.0], "lower"), 0.0)) == [4.0, 1.0, 2.5, 2.5]
    # 100 and 100.5 differ by 0.5 / 100.25 < 1%: tied for best
    assert list(stats.tolerant_ranks([100.0, 100.5, 50.0, 0.0], 0.01)) == [1.5, 1.5, 3.0, 4.0]
    # a gap of exactly the tolerance starts a new group; just below it, tied
    assert list(stats.tolerant_ranks([101.0, 99.0], 0.02)) == [1.0, 2.0]
    assert list(stats.tolerant_ranks([101.0, 99.0], 0.0201)) == [1.5, 1.5]
    # zeros: two zeros tie exactly; 0 vs a tiny positive value is a relative gap of 2 (never tied)
    assert list(stats.tolerant_ranks([0.0, 0.0, 1e-12, 5.0], 0.01)) == [3.5, 3.5, 2.0, 1.0]
    assert list(stats.tolerant_ranks([0.0, 0.0, 0.0], 0.5)) == [2.0, 2.0, 2.0]
    # negative (oriented lower-is-better) values: latencies 3.0 and 3.0001 tie, 1.0 is best
    lat = np.array([3.0, 3.0001, 1.0])
    assert list(stats.tolerant_ranks(stats.orient(lat, "lower"), 0.01)) == [2.5, 2.5, 1.0]
    assert list(stats.tolerant_ranks(stats.orient(lat, "higher"), 0.01)) == [1.5, 1.5, 3.0]
    assert list(stats.tolerant_ranks([-0.001, 0.001], 0.5)) == [2.0, 1.0]     # opposite signs: gap 2
    # all tied within the tolerance
    assert list(stats.tolerant_ranks([1.0, 1.001, 0.999], 0.01)) == [2.0, 2.0, 2.0]
    # chain: 1.000, 1.008, 1.016 have gaps < 1% but span 1.6% end to end: single linkage ties all three
    x = [1.0, 1.008, 1.016, 2.0]
    assert list(stats.tolerant_ranks(x, 0.01)) == [3.0, 3.0, 3.0, 1.0]
    spread = stats.tie_group_spread(x, 0.01)
    assert spread[0] == spread[1] == spread[2] == pytest.approx(0.016 / 1.008) and spread[3] == 0.0
    assert spread[0] >= 0.01                                        # wider than the tolerance
    # a missing value: the slice gets NaN ranks; other slices are unaffected (any axis)
    r = stats.tolerant_ranks(np.array([[1.0, np.nan], [2.0, 2.01], [3.0, 1.0]]), 0.01, axis=0)
    assert np.isnan(r[:, 1]).all() and list(r[:, 0]) == [3.0, 2.0, 1.0]


def test_tolerant_ranks_vectorised_equals_the_per_vector_reference():
    rng = np.random.default_rng(12)
    for tol in (0.0, 0.005, 0.01, 0.02, 0.5):
        for n in (1, 2, 5, 13):
            x = _near_ties(rng, (40, 6, n))                          # leading axes (40, 6)
            x[3, 2, 0] = np.nan
            vec = stats.tolerant_ranks(x, tol)
            for idx in np.ndindex(x.shape[:-1]):
                assert np.array_equal(vec[idx], _reference_tolerant_ranks(x[idx], tol), equal_nan=True), (tol, x[idx])
            # the same along another axis (the bootstrap ranks along axis 2 of (R, M, K, B))
            xs = np.moveaxis(x, -1, 1)                               # (40, n, 6)
            assert np.array_equal(stats.tolerant_ranks(xs, tol, axis=1), np.moveaxis(vec, -1, 1), equal_nan=True)
    # the planted near-ties produce real ties and chains at 1%
    x = _near_ties(np.random.default_rng(13), (500, 13))
    r = stats.tolerant_ranks(x, 0.01)
    assert np.mean([len(np.unique(row)) < 13 for row in r]) > 0.5
    assert (stats.tie_group_spread(x, 0.01) >= 0.01).any()


def test_tolerance_zero_reproduces_the_exact_ranks():
    rng = np.random.default_rng(14)
    for x in (rng.integers(0, 4, (300, 9)).astype(float), rng.normal(size=(300, 9)), _near_ties(rng, (300, 9)),
              rng.integers(-3, 3, (7, 5, 4, 30)).astype(float)):
        for axis in range(x.ndim):
            assert np.array_equal(stats.tolerant_ranks(x, 0.0, axis=axis), stats.ranks_best_first(x, axis=axis))
    x = rng.normal(size=(4, 6))
    x[1, 2] = np.nan
    assert np.array_equal(stats.tolerant_ranks(x, 0.0), stats.ranks_best_first(x), equal_nan=True)
    with pytest.raises(ValueError):
        stats.tolerant_ranks(x, -0.1)


def _old_top1_mask(x, axis=-1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return x == np.nanmax(x, axis=axis, keepdims=True)


def test_top1_mask_with_a_tolerance():
    x = np.array([[10.0, 10.05, 9.0, np.nan],     # 10 and 10.05 tied for best at 1%
                  [10.0, 10.2, 9.0, 10.19],       # 10.2 and 10.19 tied; 10.0 is 1.9% below 10.19: not
                  [np.nan] * 4])
    m = stats.top1_mask(x, tolerance=0.01)
    assert m.tolist() == [[True, True, False, False], [False, True, False, True], [False] * 4]
    rng = np.random.default_rng(15)
    for y in (rng.integers(0, 3, (200, 3, 6)).astype(float), _near_ties(rng, (200, 3, 6))):
        y[5, 1, 2] = np.nan
        for axis in (-1, 1):
            assert np.array_equal(stats.top1_mask(y, axis=axis), _old_top1_mask(y, axis=axis))
        # with a tolerance, the winners are the schedulers of rank-1 group (the group of the best mean)
        r = stats.tolerant_ranks(y, 0.01)
        ok = ~np.isnan(y).any(axis=-1)
        best_group = r == np.min(r, axis=-1, keepdims=True)
        assert np.array_equal(stats.top1_mask(y, tolerance=0.01)[ok], best_group[ok])


# --------------------------------------------------------------------------- tau-b,max and statistical ties

def test_tau_b_max_closed_form_on_crafted_tie_structures():
    """One scheduler above 12 tied ones against a full order of 13: sqrt(12/78). Group sizes [2, 2] vs [3, 1]:
    the north-west-corner table [[2, 0], [1, 1]] leaves 2 pairs untied in both, so 2 / sqrt(4 * 3)."""
    x = np.array([1.0] + [0.0] * 12)
    assert stats.tau_b_max(x, np.arange(13.0)) == pytest.approx(np.sqrt(12 / 78))
    assert stats.tau_b_max(np.arange(13.0), x) == pytest.approx(np.sqrt(12 / 78))       # symmetric
    assert stats.tau_b_max([1, 1, 0, 0], [1, 1, 1, 0]) == pytest.approx(2 / np.sqrt(12))
    # one best vs one worst (the rest tied): they can agree on a single pair: 1 / sqrt(12 * 12)
    assert stats.tau_b_max(x, -x) == pytest.approx(1 / 12)
    assert np.isnan(stats.tau_b_max(np.zeros(5), np.arange(5.0)))                        # all tied: undefined
    # the observed tau never exceeds it, and reaches it exactly when no resolved pair is discordant
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = rng.integers(0, 4, 9).astype(float), rng.integers(0, 3, 9).astype(float)
        if len(set(a)) < 2 or len(set(b)) < 2:
            continue
        t, tm = stats.kendall_tau(a, b), stats.tau_b_max(a, b)
        assert t <= tm + 1e-12
        disc = stats.pair_counts(stats.pair_signs(a), stats.pair_signs(b))["discordant"]
        assert (abs(t - tm) < 1e-12) == (disc == 0)


def test_tau_b_min_and_the_normalised_tau_stay_in_minus_one_one():
    x = np.array([1.0] + [0.0] * 12)
    assert stats.tau_b_min(x, np.arange(13.0)) == pytest.approx(-np.sqrt(12 / 78))
    rng = np.random.default_rng(4)
    for _ in range(200):
        a, b = rng.integers(0, 4, 8).astype(float), rng.integers(0, 3, 8).astype(float)
        if len(set(a)) < 2 or len(set(b)) < 2:
            continue
        t = stats.kendall_tau(a, b)
        tmin = stats.tau_b_min(a, b)
        assert tmin - 1e-12 <= t
        n = stats.tau_b_norm(t, stats.tau_b_max(a, b), tmin)
        assert -1 - 1e-12 <= n <= 1 + 1e-12
        if abs(t - tmin) < 1e-12 and t < 0:
            assert n == pytest.approx(-1.0)


def test_tau_b_max_equals_the_brute_force_maximum_over_arrangements():
    """For small rankings, every assignment of the items to the second ranking's positions: the maximum tau-b
    equals the closed form (the comonotone arrangement is optimal)."""
    from itertools import permutations

    rng = np.random.default_rng(1)
    for _ in range(60):
        n = int(rng.integers(3, 7))
        gx = np.sort(rng.integers(0, int(rng.integers(2, n + 1)), n)).astype(float)
        gy = np.sort(rng.integers(0, int(rng.integers(2, n + 1)), n)).astype(float)
        if len(set(gx)) < 2 or len(set(gy)) < 2:
            continue
        best = max(st.kendalltau(gx, gy[list(p)]).statistic for p in permutations(range(n)))
        assert stats.tau_b_max(rng.permutation(gx), rng.permutation(gy)) == pytest.approx(best)


def test_pair_counts_and_vectorised_tau_norm():
    x, y = np.array([3.0, 2, 2, 1]), np.array([1.0, 2, 3, 3])
    c = stats.pair_counts(stats.pair_signs(x), stats.pair_signs(y))
    # pairs: (0,1) d, (0,2) d, (0,3) d, (1,2) x tied, (1,3) d, (2,3) y tied
    assert (c["concordant"], c["discordant"], c["untied_x"], c["untied_y"]) == (0, 4, 5, 5)


def test_tie_partition_is_complete_linkage_over_the_mean_order():
    means = np.array([4.0, 3.0, 2.0, 1.0, 0.0])
    K = 5
    pairs = list(zip(*np.triu_indices(K, 1)))
    # a chain: every neighbour unresolved, everything two apart resolved -> single linkage would tie all five
    res = np.array([abs(i - j) >= 2 for i, j in pairs])
    lab = stats.tie_partition(means, stats.pair_matrix(res, K))
    assert lab.tolist() == [0, 0, 1, 1, 2]
    assert stats.tie_conflicts(lab, stats.pair_matrix(res, K)) == 2        # (1,2) and (3,4): tied, yet separated
    # nothing resolved: one group; everything resolved: five
    assert stats.tie_partition(means, stats.pair_matrix(np.zeros(10, bool), K)).tolist() == [0] * 5
    assert stats.tie_partition(means, stats.pair_matrix(np.ones(10, bool), K)).tolist() == [0, 1, 2, 3, 4]
    # labels follow the mean order whatever the item order; vectorised over leading axes
    perm = np.array([3, 0, 4, 1, 2])
    R = stats.pair_matrix(res, K)[np.ix_(perm, perm)]
    assert stats.tie_partition(means[perm], R).tolist() == [1, 0, 2, 0, 1]
    stacked = stats.tie_partition(np.stack([means, means[perm]]), np.stack([stats.pair_matrix(res, K), R]))
    assert stacked.tolist() == [[0, 0, 1, 1, 2], [1, 0, 2, 0, 1]]
    assert stats.n_groups(stacked).tolist() == [3, 3]
    assert stats.tie_partition(np.array([1.0, np.nan, 0.0]), np.zeros((3, 3), bool)).tolist() == [-1, -1, -1]


def test_every_group_is_pairwise_unresolved_on_random_relations():
    rng = np.random.default_rng(2)
    for _ in range(200):
        K = int(rng.integers(2, 9))
        m = rng.normal(size=K)
        res = stats.pair_matrix(rng.random(K * (K - 1) // 2) < 0.5, K)
        lab = stats.tie_partition(m, res)
        for g in set(lab.tolist()):
            idx = np.flatnonzero(lab == g)
            assert not res[np.ix_(idx, idx)].any()                     # no resolved pair inside a group
        order = np.argsort(-m, kind="stable")
        assert np.all(np.diff(lab[order]) >= 0)                       # groups are runs of the mean order
        assert np.all(np.diff(lab[order]) <= 1)


def test_group_values_tie_exactly_and_average_the_group():
    v = np.array([[3.0, 2.9, 1.0], [0.1, 0.2, 0.3]])
    lab = np.array([[0, 0, 1], [0, 1, 1]])
    g = stats.group_values(v, lab)
    assert g.tolist() == [[2.95, 2.95, 1.0], [0.1, 0.25, 0.25]]
    boot = np.random.default_rng(3).normal(size=(2, 3, 50))
    gb = stats.group_values(boot, lab, axis=-2)
    assert np.array_equal(gb[0, 0], gb[0, 1]) and np.allclose(gb[0, 0], boot[0, :2].mean(axis=0))
    assert np.array_equal(gb[1, 2], gb[1, 1]) and np.array_equal(gb[1, 0], boot[1, 0])
    assert np.isnan(stats.group_values(np.ones(3), np.array([-1, -1, -1]))).all()


def test_tolerance_labels_reproduce_the_old_rule():
    x = np.array([1.0, 1.008, 1.016, 2.0])
    lab = stats.tolerance_labels(x, 0.01)
    assert lab.tolist() == [1, 1, 1, 0]                                # single linkage chains the first three
    r = stats.tolerant_ranks(x, 0.01)
    assert np.array_equal(stats.ranks_best_first(stats.group_values(x, lab)), r)
    assert stats.tolerance_labels(x, 0.0).tolist() == [3, 2, 1, 0]


def test_min_wilcoxon_p_and_effect_sizes():
    assert stats.min_wilcoxon_p(5) == pytest.approx(0.0625) and stats.min_wilcoxon_p(6) == pytest.approx(0.03125)
    assert stats.min_wilcoxon_p(0) == 1.0
    assert st.wilcoxon(np.arange(1.0, 6.0)).pvalue == pytest.approx(stats.min_wilcoxon_p(5))   # attained
    assert stats.effect_size(0.05, 0.065, "ratio") == pytest.approx(0.015 / 0.0575)         # 26% relative...
    assert stats.effect_size(0.05, 0.065, "proportion") == pytest.approx(0.015)             # ...1.5 points
    assert stats.effect_size(190, 200, "count", 200) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        stats.effect_size(1, 2, "percent")


def test_sign_flip_wilcoxon_equals_scipy_with_ties_and_zeros():
    """The vectorised exact permutation test gives scipy.stats.wilcoxon(method="auto")'s p-value and statistic
    for every row of at most 13 differences with ties or zeros (where scipy runs permutation_test)."""
    rng = np.random.default_rng(3)
    rows = []
    for W in (1, 2, 3, 5, 8, 10, 13):          # scipy's reference is slow at 13 (8,192 patterns per call)
        for k in range(40 if W < 10 else 2):
            d = rng.integers(-3, 4, W).astype(float) * rng.choice([1.0, 0.5, 1.25], W)
            if k % 4 == 0:
                d = np.round(rng.normal(size=W), 1)
            if (d != 0).any():
                rows.append(d)
    for d in rows:
        p, stat = stats._sign_flip_wilcoxon(d[None, :])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = st.wilcoxon(d, zero_method="wilcox", method="auto")
        assert p[0] == pytest.approx(float(ref.pvalue), abs=1e-12), d
        assert stat[0] == pytest.approx(float(ref.statistic), abs=1e-12), d
    # and through paired_wilcoxon, many rows at once
    block = np.stack([np.pad(r, (0, 8 - r.size)) for r in rows if r.size <= 8])[:60]
    res = stats.paired_wilcoxon(block)
    for i, d in enumerate(block):
        if (d != 0).any():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert res.pvalue[i] == pytest.approx(float(st.wilcoxon(d, zero_method="wilcox").pvalue), abs=1e-12)
