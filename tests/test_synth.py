"""Generators of synth.py: target rates and CVs within sampling error, stationary starts,
superposition, replay, resampling and PMF sampling.

Tolerances are ``Z`` standard errors of the estimate, with the standard error derived from the
sample size (delta method for the CV, see ``synth.cv_standard_error``; binomial for frequencies).
With fixed seeds the tests are deterministic; ``Z = 4`` means a correct generator would fail a
given check for fewer than 1 seed in 15,000.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy import stats

from portbench.data import synth
from portbench.core.errors import DataError, ParameterError

Z = 4.0


@pytest.mark.parametrize("family,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 2.0), ("gamma", 3.5),
                                       ("weibull", 0.6), ("weibull", 1.5)])
def test_renewal_window_hits_rate_and_cv(family, cv):
    n = 200_000
    process = synth.Renewal(family, 2.5, cv)
    arr = synth.renewal_window(process, n + 1, synth.rng_from(11, family, int(cv * 10)))
    assert arr[0] == 0.0 and np.all(np.diff(arr) >= 0) and arr.size == n + 1
    rate, cv_hat = synth.sample_rate_cv(arr)
    assert abs(rate - 2.5) < Z * synth.rate_standard_error(process, n)
    assert abs(cv_hat - cv) < Z * synth.cv_standard_error(process, n)


def test_cv_standard_error_matches_monte_carlo():
    """The delta-method SE (which the tolerances rely on) agrees with the spread of simulated CVs."""
    process, n, reps = synth.Renewal("weibull", 1.0, 1.3), 2000, 1500
    rng = synth.rng_from(3)
    cvs = np.array([synth.sample_rate_cv(synth.renewal_window(process, n + 1, rng))[1] for _ in range(reps)])
    se = synth.cv_standard_error(process, n)
    # the SD of `reps` normal draws has relative SE 1/sqrt(2 reps)
    assert abs(cvs.std() / se - 1) < Z / math.sqrt(2 * reps)


def test_gamma_cv_standard_error_closed_form():
    for cv in (0.3, 1.0, 2.7):
        p = synth.Renewal("gamma", 1.0, cv)
        assert synth.cv_standard_error(p, 100) == pytest.approx(cv * math.sqrt((1 + cv * cv) / 200), rel=1e-12)
    assert synth.cv_standard_error(synth.poisson(3.0), 400) == pytest.approx(1 / 20, rel=1e-12)


@pytest.mark.parametrize("shape", [0.12, 0.3, 0.7, 1.0, 2.0, 5.0, 30.0])
def test_weibull_shape_solver_inverts_the_cv(shape):
    cv = synth.weibull_cv(shape)
    assert synth.weibull_shape_for_cv(cv) == pytest.approx(shape, rel=1e-9)


def test_weibull_shape_one_is_exponential_and_bad_cv_rejected():
    assert synth.weibull_shape_for_cv(1.0) == pytest.approx(1.0, abs=1e-10)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-6):
        with pytest.raises(ParameterError):
            synth.weibull_shape_for_cv(bad)


def test_renewal_parameters_give_the_mean_gap():
    for family, cv in (("gamma", 0.4), ("gamma", 5.0), ("weibull", 0.4), ("weibull", 44.0)):
        p = synth.Renewal(family, 4.0, cv)
        mean = p.shape * p.scale if family == "gamma" else p.scale * math.gamma(1 + 1 / p.shape)
        assert mean == pytest.approx(0.25, rel=1e-9)
    with pytest.raises(ParameterError):
        synth.Renewal("poisson", 1.0, 2.0)
    with pytest.raises(ParameterError):
        synth.Renewal("lognormal", 1.0, 2.0)
    with pytest.raises(ParameterError):
        synth.Renewal("gamma", 0.0, 1.0)


@pytest.mark.parametrize("family,cv", [("gamma", 3.0), ("weibull", 2.0), ("poisson", 1.0)])
def test_interval_starts_in_equilibrium(family, cv):
    """A stationary renewal process has E[N(t0, t0+T)] = rate * T even for T shorter than a gap;
    starting at an arrival instead would overcount by one arrival per interval."""
    process, T, reps = synth.Renewal(family, 1.0, cv), 0.5, 20_000
    rng = synth.rng_from(5, family)
    counts = np.array([synth.renewal_interval(process, 10.0, 10.0 + T, rng).size for _ in range(reps)])
    assert abs(counts.mean() - T) < Z * counts.std() / math.sqrt(reps)
    assert np.all([(x >= 10.0) & (x < 10.5) for x in synth.renewal_interval(process, 10.0, 10.5, rng)])


def test_interval_max_n_keeps_the_earliest_points():
    process = synth.Renewal("gamma", 50.0, 1.5)
    full = synth.renewal_interval(process, 0.0, 100.0, synth.rng_from(1))
    capped = synth.renewal_interval(process, 0.0, 100.0, synth.rng_from(1), max_n=30)
    assert capped.size == 30 and np.all(np.diff(capped) >= 0) and capped[-1] < 100.0
    assert full.size > 30
    np.testing.assert_array_equal(synth.renewal_interval(process, 0.0, 100.0, synth.rng_from(1), max_n=30), capped)


def test_superposition_rate_is_the_sum_of_rates():
    """Counts of a superposition over T: mean sum(rate_i T), variance ~ sum(rate_i cv_i^2 T) (renewal CLT)."""
    procs = [synth.Renewal("gamma", 3.0, 2.0), synth.Renewal("weibull", 1.5, 0.7), synth.poisson(5.0),
             synth.Renewal("weibull", 0.5, 3.0)]
    T = 20_000.0
    rng = synth.rng_from(9)
    streams = [synth.renewal_interval(p, 0.0, T, rng) for p in procs]
    times, which = synth.superpose(streams)
    assert np.all(np.diff(times) >= 0)
    assert times.size == sum(s.size for s in streams)
    for i, s in enumerate(streams):
        np.testing.assert_array_equal(times[which == i], s)
    expected = sum(p.rate for p in procs) * T
    sd = math.sqrt(sum(p.rate * p.cv ** 2 for p in procs) * T)
    assert abs(times.size - expected) < Z * sd


def test_replay_window_reproduces_the_gaps():
    arr = np.array([0.0, 1.0, 1.5, 4.0, 4.25])
    np.testing.assert_array_equal(synth.replay_window(arr, 5), arr)
    longer = synth.replay_window(arr, 9, synth.rng_from(2))
    gaps = np.diff(longer)
    real = np.diff(arr)
    start = int(np.nonzero(np.isclose(real, gaps[0]))[0][0])
    np.testing.assert_allclose(gaps, real[(start + np.arange(8)) % 4])


def test_resample_pairs_uniform_and_weighted_frequencies():
    n = 100_000
    idx = synth.resample_pairs(5, n, synth.rng_from(4))
    assert idx.min() >= 0 and idx.max() < 5
    w = np.array([1.0, 0.0, 3.0, 4.0, 2.0])
    idx = synth.resample_pairs(5, n, synth.rng_from(4), w)
    freq = np.bincount(idx, minlength=5) / n
    p = w / w.sum()
    assert np.all(np.abs(freq - p) <= Z * np.sqrt(p * (1 - p) / n))
    assert freq[1] == 0.0
    with pytest.raises(ParameterError):
        synth.resample_pairs(5, 3, synth.rng_from(4), np.array([1.0, -1, 1, 1, 1]))


def test_empirical_pmf_parses_safely_and_samples():
    pmf = synth.EmpiricalPMF.parse("{0: 0.2, 5: 0.3, 2: 0.5}")
    np.testing.assert_array_equal(pmf.values, [2, 5])
    np.testing.assert_allclose(pmf.probs, [0.625, 0.375])
    assert pmf.dropped_mass == pytest.approx(0.2)
    assert synth.EmpiricalPMF.parse("{}") is None
    n = 100_000
    draws = pmf.sample(n, synth.rng_from(8))
    assert set(np.unique(draws)) <= {2, 5}
    f2 = np.mean(draws == 2)
    assert abs(f2 - 0.625) <= Z * math.sqrt(0.625 * 0.375 / n)
    for text in ("__import__('os').system('true')", "[1, 2]", "{1.5: 1.0}", "{1: -0.5, 2: 1.5}", "{'a': 1}",
                 "{0: 1.0}", "{1: 0.5"):
        with pytest.raises(DataError):
            synth.EmpiricalPMF.parse(text)


def test_window_frame_has_the_window_schema():
    df = synth.window_frame(np.array([5.0, 5.0, 7.5]), np.array([3, 4, 5]), np.array([1, 2, 3]), ["a", "b", "a"])
    assert df.columns == ["arrival_s", "prompt_tokens", "output_tokens", "tenant"]
    assert df.schema == pl.Schema(synth.WINDOW_SCHEMA)
    assert df["arrival_s"].to_list() == [0.0, 0.0, 2.5]
    with pytest.raises(DataError):
        synth.window_frame(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1]), ["a", "a"])
    with pytest.raises(DataError):
        synth.window_frame(np.array([0.0, 0.5]), np.array([1, 0]), np.array([1, 1]), ["a", "a"])


def test_seeds_are_stable_and_distinct():
    assert synth.derive_seed(7, "bailian", 0) == synth.derive_seed(7, "bailian", 0)
    seeds = {synth.derive_seed(7, s, k) for s in ("burstgpt", "bailian") for k in range(40)}
    assert len(seeds) == 80 and all(0 <= s < 2 ** 53 for s in seeds)
    a = synth.rng_from(1, "x").random(3)
    np.testing.assert_array_equal(a, synth.rng_from(1, "x").random(3))
    assert not np.array_equal(a, synth.rng_from(1, "y").random(3))


def test_ks_sanity_of_gamma_gaps_against_scipy():
    """The gamma gaps follow scipy's gamma distribution with the solved shape and scale."""
    p = synth.Renewal("gamma", 2.0, 1.7)
    gaps = p.gaps(20_000, synth.rng_from(12))
    res = stats.kstest(gaps, stats.gamma(a=p.shape, scale=p.scale).cdf)
    assert res.pvalue > 1e-4
    w = synth.Renewal("weibull", 2.0, 1.7)
    res = stats.kstest(w.gaps(20_000, synth.rng_from(13)), stats.weibull_min(c=w.shape, scale=w.scale).cdf)
    assert res.pvalue > 1e-4


def test_pmf_text_fast_path_reads_what_literal_eval_reads(shared_traces):
    """EmpiricalPMF.parse reads ServeGen's PMF texts with a regular expression; on the real files (every bucket of the
    first chunks in ../shared) and on planted edge cases it gives what ast.literal_eval gives -- the same mapping, or
    the same refusal (leading zeros, underscores, expressions go to literal_eval and fail or pass there)."""
    import ast
    import glob
    import json as _json
    from pathlib import Path

    from portbench.core.errors import DataError
    from portbench.data.synth import EmpiricalPMF

    def reference(text):
        try:
            obj = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return "refused"
        if not obj:
            return None
        try:
            return EmpiricalPMF.from_mapping(obj)
        except DataError:
            return "refused"

    def fast(text):
        try:
            return EmpiricalPMF.parse(text)
        except DataError:
            return "refused"

    texts = ["{}", " {}", "{12: 0.5, 40: 0.5}", "{12:0.5,40:5e-1,}", "{1: 1}", "{+3: .5, 7: 5.}", "{3: 1E2, 4: 0}",
             "{012: 0.5}", "{12: 05}", "{1_000: 0.5}", "{1: 0.5 + 0.5}", "{1: -0.5, 2: 1.5}", "{0: 0.5, 3: 0.5}",
             "{1: 1e999}", "\n{1: 0.5}", "{1: 0.25, 1: 0.75}", "{-2: 0.5, 4: 0.5}", "{1: 0.5}\n"]
    root = shared_traces / "servegen"
    for f in sorted(glob.glob(str(root / "**" / "chunk-*-dataset.json"), recursive=True))[:3]:
        for fields in _json.loads(Path(f).read_text()).values():
            texts += [fields["input_tokens"], fields["output_tokens"]]
    for t in texts:
        a, b = reference(t), fast(t)
        if isinstance(a, EmpiricalPMF):
            assert isinstance(b, EmpiricalPMF), t[:60]
            assert np.array_equal(a.values, b.values) and np.array_equal(a.probs, b.probs), t[:60]
        else:
            assert a == b, (t[:60], a, b)
    assert len(texts) > 100, "the real ServeGen texts were not found"
