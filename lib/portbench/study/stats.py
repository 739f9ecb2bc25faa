"""Statistics of the portability analysis: ranks, rank agreement, paired tests, reversals.

Everything here works on plain numpy arrays; :mod:`portbench.study.analysis` builds the arrays from the
campaign's run table and turns the results into tables. Conventions:

* **Orientation.** A metric's values are *oriented* by its direction (``"higher"`` or ``"lower"``
  is better, from the metric registry): oriented = value for higher-is-better, -value for
  lower-is-better. After orientation, larger is always better, so a positive oriented difference
  ``a - b`` means *a is better than b*.
* **Ranks.** 1 = best; ties get the average of the ranks they span (``scipy.stats.rankdata``).
  Rankings of scheduler *means* use **practically tied ranks** (:func:`tolerant_ranks`): means
  within a relative tolerance of each other are tied, so that differences of a few parts per
  million (microsecond noise at light load) do not count as orders. Tolerance 0 = exact ties only
  (identical to ``rankdata``). Per-window ranks (Friedman, Nemenyi) keep exact ties.
* **Unit of resampling and pairing.** The window. Replicates are averaged within a window first;
  paired tests pair two schedulers on the same windows; the bootstrap resamples windows.
* **Kendall tau-b** is ``scipy.stats.kendalltau`` (variant b). For bootstrap resamples a
  vectorised tau-b (:func:`tau_b_from_signs`) is used; ``tests/test_stats.py`` shows it equals
  scipy's on many cases with ties and on bootstrap resamples.
* **Kendall's W** with the tie correction (Kendall & Babington Smith; Siegel & Castellan):
  ``W = 12 S / (m^2 (n^3 - n) - m sum_j T_j)``, ``T_j = sum over tie groups of (t^3 - t)`` in
  ranking j. It equals Friedman's chi-square / (m (n - 1)) (scipy, tie-corrected); a test checks it.
* **Statistical ties** (:func:`tie_partition`): two schedulers are *resolved* when a test over windows
  tells them apart; the tie groups of a ranking are the maximal runs of the mean order (best first) whose
  members are pairwise unresolved, built greedily from the best (complete linkage, so no chaining). Tied
  schedulers share their group's mean (:func:`group_values`), so every ranking statistic below treats
  them as exact ties.
* **tau-b,max** (:func:`tau_b_max`): the largest tau-b two rankings with the observed tie-group sizes
  (in their rank order) can reach: the comonotone (north-west corner) arrangement, i.e. tau-b of the
  two *sorted* rank vectors. ``tau_b / tau_b_max`` = 1 exactly when no resolved pair is discordant; a
  negative tau-b is scaled by ``|tau_b,min|`` instead (:func:`tau_b_norm`), so the ratio lies in [-1, 1].
* **Relative effect** of a scheduler pair: the symmetric relative difference of the two means,
  ``|mean_a - mean_b| / ((|mean_a| + |mean_b|) / 2)`` (0 when both are 0). It does not depend on
  which scheduler is called a, lies in [0, 2], and reads like a percentage difference for small
  effects (0.05 = the two means differ by 5% of their average).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.stats as st
from scipy import special
from statsmodels.stats.multitest import multipletests

from ..sim.loops import LazyLoop

ORIENTATION = {"higher": 1.0, "lower": -1.0}
CORRECTIONS = ("holm", "fdr_bh")
CI_LEVEL = 0.95


# --------------------------------------------------------------------------- orientation, ranks

def orient(values, direction: str) -> np.ndarray:
    """Values oriented so that larger is better (``direction`` is "higher" or "lower")."""
    return ORIENTATION[direction] * np.asarray(values, dtype=float)


def ranks_best_first(oriented_means, axis: int = -1) -> np.ndarray:
    """Ranks along ``axis`` with 1 = best (largest oriented value), ties averaged.

    A slice containing NaN gets NaN ranks (nothing is ranked against a missing value).
    """
    return st.rankdata(-np.asarray(oriented_means, dtype=float), method="average", axis=axis)


def _new_group(prev, nxt, tolerance: float) -> np.ndarray:
    """True where the sorted value ``nxt`` starts a new tie group after ``prev``: the two differ
    and their relative gap (:func:`relative_effect`) is at least ``tolerance`` (a NaN gap, e.g.
    next to a missing value, also separates)."""
    with np.errstate(invalid="ignore"):
        return (prev != nxt) & ~(relative_effect(prev, nxt) < tolerance)


def _tie_structure(x: np.ndarray, tolerance: float):
    """Sort the last axis best first and find the tie groups.

    Returns ``order`` (argsort, best first, NaN last), the sorted values ``s`` and, for every
    sorted position, the first and last position of its tie group (``start``, ``end``).
    """
    n = x.shape[-1]
    order = np.argsort(-x, axis=-1, kind="stable")
    s = np.take_along_axis(x, order, axis=-1)
    new = np.ones(s.shape, dtype=bool)
    new[..., 1:] = _new_group(s[..., :-1], s[..., 1:], tolerance)          # group boundaries
    pos = np.arange(n)
    start = np.maximum.accumulate(np.where(new, pos, 0), axis=-1)          # first position of the group
    is_end = np.ones(s.shape, dtype=bool)
    is_end[..., :-1] = new[..., 1:]
    end = np.flip(np.minimum.accumulate(np.flip(np.where(is_end, pos, n - 1), -1), axis=-1), -1)
    return order, s, start, end


def _check_tolerance(tolerance) -> float:
    t = float(tolerance)
    if not (np.isfinite(t) and t >= 0):
        raise ValueError(f"rank tolerance {tolerance!r}: expected a non-negative relative difference")
    return t


def tolerant_ranks(oriented_means, tolerance: float = 0.0, axis: int = -1) -> np.ndarray:
    """Practically tied ranks along ``axis``: 1 = best (largest oriented value), tie groups averaged.

    Sort the values best first; a new tie group starts at every value whose relative gap to the
    previous (better) value, ``|x - y| / ((|x| + |y|) / 2)`` (the relative effect; 0 when both are
    0), is at least ``tolerance``. Exactly equal values are always tied, so ``tolerance = 0`` gives
    exactly :func:`ranks_best_first` (``scipy.stats.rankdata``, ties averaged). Every member of a
    group gets the average of the positions the group spans.

    This is single linkage on the sorted values: a chain of gaps each below the tolerance ties
    values that differ by more than the tolerance end to end (e.g. 1.000, 1.008, 1.016 at 0.01:
    one group although 1.000 and 1.016 differ by 1.6%); :func:`tie_group_spread` measures it.
    The relative gap is orientation-free (it is the same for a value and its negation), and two
    values of opposite sign always differ by the maximum gap 2. Vectorised over every leading axis;
    a slice containing NaN gets NaN ranks (nothing is ranked against a missing value).
    """
    tolerance = _check_tolerance(tolerance)
    x = np.moveaxis(np.asarray(oriented_means, dtype=float), axis, -1)
    if x.shape[-1] == 0:
        return np.moveaxis(x.copy(), -1, axis)
    order, _, start, end = _tie_structure(x, tolerance)
    ranks = np.empty(x.shape)
    np.put_along_axis(ranks, order, (start + end) / 2.0 + 1.0, axis=-1)
    ranks[np.isnan(x).any(axis=-1)] = np.nan
    return np.moveaxis(ranks, -1, axis)


def tie_group_spread(oriented_means, tolerance: float = 0.0, axis: int = -1) -> np.ndarray:
    """For every item, the relative effect between the best and the worst value of its tie group
    (:func:`tolerant_ranks`): 0 for an untied item or an exact tie. Above ``tolerance`` only where
    single linkage chained small gaps into a group wider than the tolerance. NaN slices give NaN."""
    tolerance = _check_tolerance(tolerance)
    x = np.moveaxis(np.asarray(oriented_means, dtype=float), axis, -1)
    if x.shape[-1] == 0:
        return np.moveaxis(x.copy(), -1, axis)
    order, s, start, end = _tie_structure(x, tolerance)
    spread_sorted = relative_effect(np.take_along_axis(s, start, axis=-1), np.take_along_axis(s, end, axis=-1))
    spread = np.empty(x.shape)
    np.put_along_axis(spread, order, spread_sorted, axis=-1)
    spread[np.isnan(x).any(axis=-1)] = np.nan
    return np.moveaxis(spread, -1, axis)


def window_ranks(oriented_block, axis: int = -1) -> np.ndarray:
    """Per-window ranks of the schedulers (1 = best), e.g. for Friedman average ranks."""
    return ranks_best_first(oriented_block, axis=axis)


# --------------------------------------------------------------------------- Kendall tau-b

def kendall_tau(x, y) -> float:
    """Kendall tau-b between two rankings (or score vectors) — ``scipy.stats.kendalltau``.

    NaN when either vector is constant (all tied), as in scipy.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.isnan(x).any() or np.isnan(y).any() or len(x) < 2:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input -> NaN, which is what we report
        return float(st.kendalltau(x, y, variant="b").statistic)


def pair_signs(x, axis: int = -1) -> np.ndarray:
    """``sign(x_i - x_j)`` for every pair i < j of the items along ``axis`` (moved last).

    Shape: ``x.shape`` without ``axis``, plus a last axis of n (n - 1) / 2 pairs; float32 (NaN
    propagates from missing values). Items whose values are exactly equal give 0 (a tie).
    """
    x = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    i, j = np.triu_indices(x.shape[-1], 1)
    return np.sign(x[..., i] - x[..., j]).astype(np.float32)


def tau_b_from_signs(sx, sy) -> np.ndarray:
    """Vectorised Kendall tau-b from :func:`pair_signs` of two rankings (pairs on the last axis).

    ``tau_b = sum(sx * sy) / sqrt(#pairs untied in x * #pairs untied in y)``: concordant minus
    discordant pairs over the tau-b denominator ``sqrt((n0 - n1)(n0 - n2))``. NaN where a ranking
    is all tied or has a missing value — exactly where scipy returns NaN.
    """
    sx, sy = np.asarray(sx, dtype=np.float64), np.asarray(sy, dtype=np.float64)
    num = np.sum(sx * sy, axis=-1)
    den = np.sqrt(np.sum(sx != 0, axis=-1, dtype=np.float64) * np.sum(sy != 0, axis=-1, dtype=np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = num / den
    tau = np.where(den > 0, tau, np.nan)
    return np.where(np.isnan(num), np.nan, tau)


def tau_b(x, y, axis: int = -1) -> np.ndarray:
    """Vectorised Kendall tau-b between ``x`` and ``y`` along ``axis`` (equal to scipy's)."""
    return tau_b_from_signs(pair_signs(x, axis), pair_signs(y, axis))


def tau_b_matrix(signs) -> np.ndarray:
    """tau-b between every pair of rankings: ``signs`` ``(..., raters, pairs)`` from
    :func:`pair_signs` -> ``(..., raters, raters)`` (one matrix product; diagonal 1 where defined).
    """
    s = np.asarray(signs, dtype=np.float64)
    num = s @ np.swapaxes(s, -1, -2)
    untied = np.sum(s != 0, axis=-1).astype(np.float64)
    den = np.sqrt(untied[..., :, None] * untied[..., None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def tau_b_max(x, y, axis: int = -1) -> np.ndarray:
    """The largest Kendall tau-b attainable by two rankings with the tie structures of ``x`` and ``y``.

    The tie groups keep their sizes and their rank order; what may change is which item sits in which
    group. The maximum is the comonotone (north-west corner) arrangement: items placed in rank order
    in both rankings, so that no pair is discordant and as many pairs as possible are untied in both
    (Frechet-Hoeffding upper bound). In closed form, with ``n0 = n (n - 1) / 2``, ``T_x``, ``T_y``
    the tied pairs of each ranking and ``T_xy`` the pairs sharing a cell of the north-west-corner
    table of group sizes::

        tau_b,max = (n0 - T_x - T_y + T_xy) / sqrt((n0 - T_x) (n0 - T_y))

    which is tau-b between the two sorted vectors. One item above 12 tied items against a full order
    of 13: ``sqrt(12 / 78)``. NaN where a ranking is all tied or has a missing value.
    """
    xs = np.sort(np.moveaxis(np.asarray(x, dtype=float), axis, -1), axis=-1)
    ys = np.sort(np.moveaxis(np.asarray(y, dtype=float), axis, -1), axis=-1)
    return tau_b(xs, ys)


def tau_b_min(x, y, axis: int = -1) -> np.ndarray:
    """The most negative Kendall tau-b attainable with the tie structures of ``x`` and ``y``: minus the
    :func:`tau_b_max` of ``x`` and the reversed ``y`` (the anti-comonotone arrangement)."""
    return -tau_b_max(x, -np.asarray(y, dtype=float), axis=axis)


def tau_b_norm(tau, tau_max, tau_min) -> np.ndarray:
    """tau-b scaled by what the tie structures allow: ``tau / tau_max`` when tau >= 0, ``tau / |tau_min|``
    otherwise; in [-1, 1], +-1 exactly when no resolved pair is discordant / concordant. NaN where undefined."""
    tau, tmax, tmin = (np.asarray(v, dtype=float) for v in (tau, tau_max, tau_min))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tau >= 0, np.where(tmax > 0, tau / tmax, np.nan), np.where(tmin < 0, tau / -tmin, np.nan))


def pair_counts(sx, sy) -> dict[str, np.ndarray]:
    """Pair counts of two rankings from their :func:`pair_signs` (pairs on the last axis):
    ``concordant``, ``discordant`` (among pairs untied in both), ``untied_x``, ``untied_y``.
    NaN where a sign is missing."""
    sx, sy = np.asarray(sx, dtype=np.float64), np.asarray(sy, dtype=np.float64)
    prod = sx * sy
    out = {"concordant": np.sum(prod > 0, axis=-1).astype(float),
           "discordant": np.sum(prod < 0, axis=-1).astype(float),
           "untied_x": np.sum(sx != 0, axis=-1).astype(float),
           "untied_y": np.sum(sy != 0, axis=-1).astype(float)}
    bad = np.isnan(prod).any(axis=-1)
    return {k: np.where(bad, np.nan, v) for k, v in out.items()}


# --------------------------------------------------------------------------- statistical ties

def pair_matrix(pairs, n: int) -> np.ndarray:
    """A symmetric ``(..., n, n)`` boolean matrix from values over the pairs i < j (last axis, in
    ``np.triu_indices(n, 1)`` order); the diagonal is False."""
    pairs = np.asarray(pairs, dtype=bool)
    i, j = np.triu_indices(n, 1)
    out = np.zeros(pairs.shape[:-1] + (n, n), dtype=bool)
    out[..., i, j] = pairs
    out[..., j, i] = pairs
    return out


def tie_partition(oriented_means, resolved) -> np.ndarray:
    """Tie groups of statistically indistinguishable schedulers: group labels 0 (best group), 1, ...

    ``oriented_means`` ``(..., K)`` (larger = better); ``resolved`` ``(..., K, K)`` symmetric boolean,
    True where the pair is told apart (see :func:`pair_matrix`). Sort the schedulers best first and
    scan: a scheduler joins the current group when it is resolved from *no* member of the group, and
    opens a new group otherwise. Every group is therefore a run of the mean order whose members are
    pairwise unresolved (complete linkage: a chain of unresolved neighbours never ties two resolved
    schedulers), and the scan gives the fewest such runs. Unresolved pairs can still end up in
    different groups when resolution is not transitive (a ~ b, b ~ c, a resolved from c: {a, b}, {c});
    :func:`tie_conflicts` counts them. Slices with a missing mean get label -1 everywhere.
    """
    x = np.asarray(oriented_means, dtype=float)
    res = np.asarray(resolved, dtype=bool)
    lead, K = x.shape[:-1], x.shape[-1]
    xf = x.reshape(-1, K)
    rf = res.reshape(-1, K, K)
    L = xf.shape[0]
    rows = np.arange(L)
    order = np.argsort(-xf, axis=-1, kind="stable")
    members = np.zeros((L, K), dtype=bool)
    labels = np.zeros((L, K), dtype=np.int64)
    g = np.zeros(L, dtype=np.int64)
    for p in range(K):
        it = order[:, p]
        conflict = np.any(rf[rows, it, :] & members, axis=-1)
        g = g + conflict
        members[conflict] = False
        members[rows, it] = True
        labels[rows, it] = g
    labels[np.isnan(xf).any(axis=-1)] = -1
    return labels.reshape(lead + (K,))


def tolerance_labels(oriented_means, tolerance: float) -> np.ndarray:
    """Group labels (0 = best) of the relative-tolerance rule of :func:`tolerant_ranks` (single
    linkage); ``tolerance = 0``: exact ties only. Slices with a missing mean get -1."""
    tolerance = _check_tolerance(tolerance)
    x = np.asarray(oriented_means, dtype=float)
    if x.shape[-1] == 0:
        return np.zeros(x.shape, dtype=np.int64)
    order, s, start, end = _tie_structure(x, tolerance)
    new = np.ones(s.shape, dtype=bool)
    new[..., 1:] = _new_group(s[..., :-1], s[..., 1:], tolerance)
    labels = np.empty(x.shape, dtype=np.int64)
    np.put_along_axis(labels, order, np.cumsum(new, axis=-1) - 1, axis=-1)
    labels[np.isnan(x).any(axis=-1)] = -1
    return labels


def group_values(values, labels, axis: int = -1) -> np.ndarray:
    """Each item's value replaced by the mean of its tie group's values (``labels`` from
    :func:`tie_partition`, shape of ``values`` without the trailing axes after ``axis``).

    ``values`` ``(..., K)`` or ``(..., K, B)`` (``axis=-2``: a bootstrap axis last). Members of a group
    get bit-identical values, so the rankings and pair signs built from them tie exactly. Slices
    labelled -1 give NaN.
    """
    v = np.asarray(values, dtype=float)
    k_axis = axis % v.ndim
    lab = np.asarray(labels)
    extra = v.ndim - 1 - k_axis                      # trailing axes after K (e.g. the bootstrap axis)
    labx = lab.reshape(lab.shape + (1,) * extra)
    K = v.shape[k_axis]
    out = np.full(v.shape, np.nan)
    for g in range(K):
        m = labx == g
        if not m.any():
            continue
        cnt = np.sum(np.broadcast_to(m, v.shape), axis=k_axis, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.sum(np.where(m, v, 0.0), axis=k_axis, keepdims=True) / cnt
        out = np.where(m, np.broadcast_to(mean, v.shape), out)
    return out


def n_groups(labels) -> np.ndarray:
    """Number of tie groups per ranking (0 where the slice is missing)."""
    lab = np.asarray(labels)
    return np.where(np.any(lab < 0, axis=-1), 0, np.max(lab, axis=-1) + 1)


def tie_conflicts(labels, resolved) -> np.ndarray:
    """Pairs that no test resolves but that the partition puts in different groups (the price of a
    proper partition when resolution is not transitive), per ranking."""
    lab = np.asarray(labels)
    i, j = np.triu_indices(lab.shape[-1], 1)
    res = np.asarray(resolved, dtype=bool)[..., i, j]
    return np.sum((lab[..., i] != lab[..., j]) & ~res, axis=-1)


# --------------------------------------------------------------------------- Kendall's W

def tie_sums(ranks, axis: int = -1) -> np.ndarray:
    """``sum over tie groups of (t^3 - t)`` of each ranking along ``axis`` (0 = no ties)."""
    r = np.moveaxis(np.asarray(ranks, dtype=float), axis, -1)
    group_size = np.sum(r[..., :, None] == r[..., None, :], axis=-1)  # t of each item's tie group
    return np.sum(group_size.astype(float) ** 2 - 1.0, axis=-1)        # sum_items (t^2-1) = sum_groups (t^3-t)


def kendall_w(ranks) -> np.ndarray | float:
    """Kendall's coefficient of concordance W with the tie correction.

    ``ranks``: array ``(..., m raters, n items)`` of within-rater ranks (ties averaged). Returns
    W in [0, 1] per leading index. NaN when a ranking ties every item (that rater expresses no
    order, and the tie-corrected W would then only measure the other raters' spread — e.g. W = 1/3
    for three raters of which two tie everything), or has a missing value: the same cases where
    Kendall's tau-b is undefined.
    """
    r = np.asarray(ranks, dtype=float)
    m, n = r.shape[-2], r.shape[-1]
    totals = r.sum(axis=-2)
    s = np.sum((totals - m * (n + 1) / 2.0) ** 2, axis=-1)
    ties = tie_sums(r)                                              # (..., m)
    den = m * m * (n ** 3 - n) - m * ties.sum(axis=-1)
    degenerate = np.any(ties >= n ** 3 - n, axis=-1) | np.isnan(r).any(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where((den > 0) & ~degenerate, 12.0 * s / den, np.nan)
    return float(w) if w.ndim == 0 else w


# --------------------------------------------------------------------------- bootstrap

def bootstrap_indices(n_windows: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_windows)`` window indices drawn with replacement (one resample per row)."""
    return rng.integers(0, n_windows, size=(n_boot, n_windows))


def block_bootstrap_indices(n_windows: int, n_boot: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_windows)`` window indices of the circular block bootstrap (Politis & Romano 1992): each resample
    is ``ceil(n / block)`` runs of ``block`` consecutive windows (in trace order, wrapping at the end) from random
    starts, cut to ``n`` windows. ``block = 1`` is the ordinary bootstrap (:func:`bootstrap_indices`); neighbouring
    windows stay together, so a resample keeps their autocorrelation instead of treating them as independent."""
    block = int(min(max(block, 1), max(n_windows, 1)))
    if block == 1:
        return bootstrap_indices(n_windows, n_boot, rng)
    k = -(-n_windows // block)
    starts = rng.integers(0, n_windows, size=(n_boot, k))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]) % n_windows
    return idx.reshape(n_boot, k * block)[:, :n_windows]


def bootstrap_means(x, idx) -> np.ndarray:
    """Means over the last (window) axis of ``x`` for every resample in ``idx`` ``(B, W)``.

    Result shape ``x.shape[:-1] + (B,)``. Fancy indexing then one reduction: identical rows of
    ``x`` give bit-identical means (so exact ties between schedulers survive resampling).
    Missing values (NaN) are left out of each mean.
    """
    x = np.asarray(x, dtype=float)
    g = x[..., idx]                                     # (..., B, W)
    if np.isnan(x).any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(g, axis=-1)
    return g.mean(axis=-1)


def percentile_ci(samples, level: float = CI_LEVEL, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of ``samples`` along ``axis`` (NaN resamples left out)."""
    q = [(1 - level) / 2, 1 - (1 - level) / 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN slices -> NaN
        lo, hi = np.nanquantile(np.asarray(samples, dtype=float), q, axis=axis)
    return lo, hi


# --------------------------------------------------------------------------- paired tests

@dataclass
class PairedTest:
    """Per-slice Wilcoxon signed-rank results (arrays of the slice shape)."""

    pvalue: np.ndarray      # two-sided p-value (1.0 when every difference is zero)
    statistic: np.ndarray   # scipy's statistic, min(R+, R-)  (NaN when every difference is zero)
    direction: np.ndarray   # sign(R+ - R-): +1 the positive differences dominate the ranks, -1, 0
    n: np.ndarray           # windows with both values present
    n_nonzero: np.ndarray   # of which with a non-zero difference (the Wilcoxon sample size)
    method: np.ndarray      # "exact" | "permutation" | "asymptotic" | "all_zero" | "too_few"


def _has_ties(absd: np.ndarray) -> np.ndarray:
    s = np.sort(absd, axis=-1)
    return np.any(s[..., 1:] == s[..., :-1], axis=-1)


def _wilcoxon_group(d: np.ndarray, method) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = st.wilcoxon(d, axis=-1, zero_method="wilcox", method=method)
    return np.atleast_1d(res.pvalue), np.atleast_1d(res.statistic)


PERMUTATION_MAX_WIDTH = 13   # scipy's "auto": an exact sign-flip permutation test up to 2**13 <= 9999 resamples


def _sign_flip_wilcoxon(d: np.ndarray, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided p-value and statistic of ``scipy.stats.wilcoxon(row, method="auto")`` for rows ``d`` (S, W)
    of at most :data:`PERMUTATION_MAX_WIDTH` complete differences with ties or zeros, where scipy runs an
    exact permutation test (``permutation_test`` over all 2**W sign flips, statistic R+ with zeros dropped
    and average ranks of |d|) -- the same null distribution, counts and tolerance, vectorised over rows
    (scipy evaluates the statistic once per row and sign pattern). ``tests/test_stats.py`` checks equality."""
    S, W = d.shape
    nz = d != 0
    n_nz = nz.sum(axis=-1)
    absd = np.where(nz, np.abs(d), -1.0)                  # zeros rank below every non-zero difference
    r = st.rankdata(absd, axis=-1) - (W - n_nz)[:, None]
    r = np.where(nz, r, 0.0)
    r_plus = np.sum(np.where(d > 0, r, 0.0), axis=-1)
    r_minus = np.sum(np.where(d < 0, r, 0.0), axis=-1)
    signs = ((np.arange(2 ** W)[:, None] >> np.arange(W)) & 1).astype(float)   # (2**W, W): 1 = positive
    gamma = np.abs(np.finfo(float).eps * 100 * r_plus)
    p = np.empty(S)
    for lo in range(0, S, chunk):
        null = r[lo:lo + chunk] @ signs.T                  # R+ of every sign pattern of every row
        obs, g = r_plus[lo:lo + chunk, None], gamma[lo:lo + chunk, None]
        less = np.count_nonzero(null <= obs + g, axis=-1) / 2 ** W
        greater = np.count_nonzero(null >= obs - g, axis=-1) / 2 ** W
        p[lo:lo + chunk] = np.clip(2 * np.minimum(less, greater), 0.0, 1.0)
    return p, np.minimum(r_plus, r_minus)


def paired_wilcoxon(d) -> PairedTest:
    """Two-sided Wilcoxon signed-rank test of each slice of paired differences ``d`` (..., W).

    Zeros are dropped (Wilcoxon's convention, ``zero_method="wilcox"``); a slice whose differences
    are all zero has p = 1 (no evidence of a difference); missing windows (NaN) are left out of
    that slice. The p-value of every slice is what ``scipy.stats.wilcoxon(d_slice)`` returns with
    ``method="auto"`` (exact without ties or zeros for n <= 50; a deterministic permutation test
    for n <= 13 with ties or zeros; the normal approximation with continuity and tie correction
    otherwise). scipy decides the method once per call, so slices are grouped by the method their
    own call would use and each group is tested in one vectorised call.
    """
    d = np.asarray(d, dtype=float)
    shape = d.shape[:-1]
    flat = d.reshape(-1, d.shape[-1])
    n_slices = flat.shape[0]
    valid = ~np.isnan(flat)
    n = valid.sum(axis=-1)
    nonzero = valid & (flat != 0)
    n_nz = nonzero.sum(axis=-1)

    # direction: sign(R+ - R-) with ranks of |d| among the non-zero, present differences
    absd = np.where(nonzero, np.abs(flat), -1.0)          # excluded values rank lowest
    ranks = st.rankdata(absd, axis=-1) - (flat.shape[-1] - n_nz)[:, None]
    r_plus = np.sum(np.where(nonzero & (flat > 0), ranks, 0.0), axis=-1)
    r_minus = np.sum(np.where(nonzero & (flat < 0), ranks, 0.0), axis=-1)
    direction = np.sign(r_plus - r_minus)

    p = np.full(n_slices, np.nan)
    stat = np.full(n_slices, np.nan)
    method = np.full(n_slices, "asymptotic", dtype=object)
    all_zero = n_nz == 0
    p[all_zero], method[all_zero] = 1.0, "all_zero"
    too_few = n < 1
    p[too_few], method[too_few] = np.nan, "too_few"

    complete = valid.all(axis=-1) & ~all_zero & ~too_few
    width = flat.shape[-1]
    has_zero = (flat == 0).any(axis=-1)
    ties = _has_ties(np.abs(np.where(valid, flat, np.nan)))
    clean = complete & ~has_zero & ~ties
    if width <= 50:
        groups = {"exact": clean, "asymptotic": complete & ~clean}
        if width <= PERMUTATION_MAX_WIDTH:
            groups = {"exact": clean, "permutation": complete & ~clean}
    else:
        groups = {"asymptotic": complete}
    for name, mask in groups.items():
        if mask.any():
            if name == "permutation":
                p[mask], stat[mask] = _sign_flip_wilcoxon(flat[mask])
            else:
                p[mask], stat[mask] = _wilcoxon_group(flat[mask], "exact" if name == "exact" else "asymptotic")
            method[mask] = name
    # slices with missing windows: one call each on the windows present (rare)
    for i in np.flatnonzero(~valid.all(axis=-1) & ~all_zero & ~too_few):
        di = flat[i][valid[i]]
        pi, si = _wilcoxon_group(di[None, :], "auto")
        p[i], stat[i] = pi[0], si[0]
        method[i] = "auto_missing"
    return PairedTest(pvalue=p.reshape(shape), statistic=stat.reshape(shape),
                      direction=direction.reshape(shape), n=n.reshape(shape),
                      n_nonzero=n_nz.reshape(shape), method=method.reshape(shape))


def min_wilcoxon_p(n) -> np.ndarray:
    """Smallest two-sided p-value the exact Wilcoxon signed-rank test can give with ``n`` non-zero
    paired differences: every difference of one sign, ``2 / 2^n`` (n = 5: 0.0625, so no test over
    five windows can reject at alpha = 0.05). 1 for n = 0."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 0, np.minimum(1.0, 2.0 ** (1.0 - n)), 1.0)


def adjust_pvalues(p, method: str = "holm", groups=None) -> np.ndarray:
    """Multiple-comparison adjusted p-values (statsmodels ``multipletests``), per family.

    ``groups``: one family label per p-value (None = one family). NaN p-values are left out of
    their family and stay NaN. ``method``: "holm" (family-wise error) or "fdr_bh" (false
    discovery rate, Benjamini-Hochberg).
    """
    if method not in CORRECTIONS:
        raise ValueError(f"correction {method!r}: expected one of {CORRECTIONS}")
    p = np.asarray(p, dtype=float).ravel()
    out = np.full(p.shape, np.nan)
    labels = np.zeros(p.shape, dtype=int) if groups is None else np.asarray(groups).ravel()
    for g in np.unique(labels):
        sel = (labels == g) & ~np.isnan(p)
        if sel.any():
            out[sel] = multipletests(p[sel], method=method)[1]
    return out


# --------------------------------------------------------------------------- effects and verdicts

def relative_effect(mean_a, mean_b) -> np.ndarray:
    """Symmetric relative difference ``|a - b| / ((|a| + |b|) / 2)``; 0 when both are 0."""
    a, b = np.asarray(mean_a, dtype=float), np.asarray(mean_b, dtype=float)
    scale = (np.abs(a) + np.abs(b)) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(a - b) / scale
    return np.where(scale > 0, rel, np.where(np.isnan(scale), np.nan, 0.0))


def effect_size(mean_a, mean_b, scale: str, size: float = 1.0) -> np.ndarray:
    """The practical size of a difference, by the metric's scale (``metrics.Metric.scale``):
    ``"ratio"`` -> :func:`relative_effect`; ``"proportion"`` -> ``|a - b|`` (absolute, 0.05 = 5
    percentage points); ``"count"`` -> ``|a - b| / size`` (percentage points of ``size`` requests)."""
    a, b = np.asarray(mean_a, dtype=float), np.asarray(mean_b, dtype=float)
    if scale == "ratio":
        return relative_effect(a, b)
    if scale == "proportion":
        return np.abs(a - b)
    if scale == "count":
        return np.abs(a - b) / float(size)
    raise ValueError(f"scale {scale!r}: expected ratio, proportion or count")


def side_significant(p_adj, direction, mean_diff, alpha: float) -> np.ndarray:
    """A side rejects: adjusted p < alpha and the test's direction agrees with the mean's sign."""
    p_adj = np.asarray(p_adj, dtype=float)
    with np.errstate(invalid="ignore"):
        return (p_adj < alpha) & (np.asarray(direction) == np.sign(mean_diff)) & (np.sign(mean_diff) != 0)


def reversal_verdicts(diff_1, diff_2, sig_1, sig_2, rel_1, rel_2, delta) -> dict[str, np.ndarray]:
    """Verdict columns of a reversal: each is a separate condition, combine them for the stages.

    ``reversal``: the oriented mean differences have strictly opposite signs;
    ``significant``: both sides reject (see :func:`side_significant`);
    ``practical``: both effects (``rel_1``, ``rel_2``: relative or absolute, :func:`effect_size`) are at
    least ``delta`` (a number, or an array broadcast against them: one threshold per metric).
    """
    reversal = np.sign(diff_1) * np.sign(diff_2) < 0
    significant = np.asarray(sig_1, bool) & np.asarray(sig_2, bool)
    with np.errstate(invalid="ignore"):
        practical = (np.asarray(rel_1) >= delta) & (np.asarray(rel_2) >= delta)
    return {"reversal": reversal, "significant": significant, "practical": practical}


def stage(reversal, significant, practical) -> np.ndarray:
    """Furthest nested stage: none -> sign -> significant -> significant_and_practical."""
    reversal, significant, practical = (np.asarray(v, bool) for v in (reversal, significant, practical))
    out = np.full(reversal.shape, "none", dtype=object)
    out[reversal] = "sign"
    out[reversal & significant] = "significant"
    out[reversal & significant & practical] = "significant_and_practical"
    return out


# --------------------------------------------------------------------------- top-1

def top1_mask(oriented_means, axis: int = -1, tolerance: float = 0.0) -> np.ndarray:
    """True for the best scheduler(s) along ``axis``: every scheduler in the best tie group of
    :func:`tolerant_ranks` (``tolerance = 0``: every scheduler whose mean equals the best).
    Missing values (NaN) are never top-1 and do not stop the others from being ranked."""
    x = np.moveaxis(np.asarray(oriented_means, dtype=float), axis, -1)
    missing = np.isnan(x)
    r = tolerant_ranks(np.where(missing, -np.inf, x), tolerance)       # -inf: ranked last, never tied to a value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mask = (r == np.min(r, axis=-1, keepdims=True)) & ~missing
    return np.moveaxis(mask, -1, axis)


def top1_changes(mask) -> np.ndarray:
    """True where no scheduler is top-1 under every metric (the winner depends on the metric).

    ``mask``: :func:`top1_mask` of shape ``(..., metrics, schedulers)``. With ties, every
    scheduler tied for best counts as top-1, so a change means the metrics' sets of winners have
    no member in common.
    """
    return ~np.any(np.all(np.asarray(mask, bool), axis=-2), axis=-1)


# --------------------------------------------------------------------------- Friedman / Nemenyi

def friedman(block) -> tuple[float, float]:
    """Friedman test over a ``(windows, schedulers)`` block matrix (scipy, tie-corrected).

    Returns (statistic, p). When every window ties every scheduler the statistic is undefined:
    (NaN, 1.0). Windows with a missing value are left out.
    """
    b = np.asarray(block, dtype=float)
    b = b[~np.isnan(b).any(axis=1)]
    if b.shape[0] < 2 or b.shape[1] < 3:
        return float("nan"), float("nan")
    if np.all(b == b[:, :1]):
        return float("nan"), 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = st.friedmanchisquare(*b.T)
    return float(res.statistic), float(res.pvalue)


def nemenyi(block, names):
    """Nemenyi post-hoc p-values (scikit-posthocs ``posthoc_nemenyi_friedman``) as a DataFrame."""
    import pandas as pd
    import scikit_posthocs as sp

    b = np.asarray(block, dtype=float)
    b = b[~np.isnan(b).any(axis=1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sp.posthoc_nemenyi_friedman(pd.DataFrame(b, columns=list(names)))
    out.index, out.columns = list(names), list(names)
    return out.fillna(1.0)


def nemenyi_cd(k: int, n_blocks: int, alpha: float = 0.05) -> float:
    """Nemenyi critical difference of average ranks, ``q_alpha sqrt(k (k + 1) / (6 N))``.

    ``q_alpha`` is the studentized range quantile / sqrt(2) (Demsar 2006), from scipy.
    """
    q = st.studentized_range.ppf(1 - alpha, k, np.inf) / np.sqrt(2)
    return float(q * np.sqrt(k * (k + 1) / (6.0 * n_blocks)))


# --------------------------------------------------------------------------- equivalence and what ports

def tost_paired(d, margin) -> np.ndarray:
    """Two one-sided paired t-tests (TOST) of equivalence: p-value of "the mean difference lies within
    ``(-margin, margin)``" for each slice of paired differences ``d`` (..., W) (``margin`` broadcast against
    the slice shape). ``p = max(p_lower, p_upper)`` with ``p_lower = P(T >= (mean + margin) / se)`` and
    ``p_upper = P(T <= (mean - margin) / se)``, T ~ t(n - 1), se = sd / sqrt(n) -- what statsmodels'
    ``ttost_paired`` returns. Missing windows (NaN) are left out; a slice whose differences are all equal
    (se = 0) has p = 0 when its mean is inside the margin and 1 otherwise; fewer than two windows: NaN."""
    d = np.asarray(d, dtype=float)
    n = np.sum(~np.isnan(d), axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(d, axis=-1)
        sd = np.nanstd(d, axis=-1, ddof=1)
    return tost_from_moments(mean, sd, n, margin)


def tost_from_moments(mean, sd, n, margin) -> np.ndarray:
    """:func:`tost_paired` from the differences' mean, standard deviation (ddof 1) and count."""
    mean, sd, n = (np.asarray(x, dtype=float) for x in (mean, sd, n))
    margin = np.broadcast_to(np.asarray(margin, dtype=float), np.broadcast(mean, sd, n).shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = sd / np.sqrt(n)
        df = np.maximum(n - 1, 1)
        # max(P(T <= -(mean + margin) / se), P(T <= (mean - margin) / se)): the t CDF is monotone, so one call
        # at the larger of the two points (half the work of the headline's resampled TOSTs)
        p = special.stdtr(df, np.maximum(-(mean + margin) / se, (mean - margin) / se))
    flat = (se == 0) & (n >= 2)
    p = np.where(flat, np.where(np.abs(mean) < margin, 0.0, 1.0), p)
    return np.where((n >= 2) & ~np.isnan(margin), p, np.nan)


def adjust_last_axis(p, method: str) -> np.ndarray:
    """Multiple-comparison adjustment of p-values along the last axis (one family per slice), vectorised;
    NaN p-values are left out of their family and stay NaN. ``method``: ``fdr_bh`` (Benjamini-Hochberg),
    ``holm`` or ``none``; equal to statsmodels ``multipletests`` per slice (``tests/test_ports.py``)."""
    p = np.asarray(p, dtype=float)
    if method == "none":
        return p.copy()
    if method not in CORRECTIONS:
        raise ValueError(f"correction {method!r}: expected one of {CORRECTIONS + ('none',)}")
    nan = np.isnan(p)
    m = np.sum(~nan, axis=-1, keepdims=True)
    order = np.argsort(np.where(nan, np.inf, p), axis=-1, kind="stable")
    ps = np.take_along_axis(np.where(nan, np.inf, p), order, axis=-1)
    rank = np.arange(1, p.shape[-1] + 1)
    with np.errstate(invalid="ignore"):
        if method == "fdr_bh":
            adj = ps * m / rank
            adj = np.flip(np.minimum.accumulate(np.flip(np.where(np.isfinite(adj), adj, np.inf), -1), axis=-1), -1)
        else:
            adj = np.maximum.accumulate(np.where(np.isfinite(ps), ps * (m - rank + 1), -np.inf), axis=-1)
    adj = np.clip(adj, 0.0, 1.0)
    out = np.empty(p.shape)
    np.put_along_axis(out, order, adj, axis=-1)
    return np.where(nan, np.nan, out)


# side classes of a scheduler pair in one ranking (portbench.study.analysis.ports)
STRONG_A, STRONG_B, EQUIVALENT, UNDETERMINED, NOT_APPLICABLE = 1, -1, 0, 2, -9


def side_classes(p_adj, direction, mean_diff, effect, p_tost_adj, alpha: float, delta) -> np.ndarray:
    """Class of each pair in its ranking: STRONG_A / STRONG_B (the Wilcoxon test rejects after correction,
    in the direction of the mean, and the effect is at least ``delta``: a or b is better), EQUIVALENT (the
    TOST at +-delta rejects after correction), UNDETERMINED otherwise; NOT_APPLICABLE where the mean
    difference is missing. int8 array of the inputs' shape."""
    sig = side_significant(p_adj, direction, mean_diff, alpha)
    with np.errstate(invalid="ignore"):
        strong = sig & (np.asarray(effect, dtype=float) >= delta)
        equiv = np.asarray(p_tost_adj, dtype=float) < alpha
    diff = np.asarray(mean_diff, dtype=float)
    out = np.full(diff.shape, UNDETERMINED, dtype=np.int8)
    out[equiv & ~strong] = EQUIVALENT
    out[strong & (diff > 0)] = STRONG_A
    out[strong & (diff < 0)] = STRONG_B
    out[np.isnan(diff)] = NOT_APPLICABLE
    return out


FOUR_WAY = ("same_order", "reversal", "one_side", "neither")


def four_way(c1, c2) -> np.ndarray:
    """The four-way class of each comparison of two sides' :func:`side_classes`: 0 strong on both in the same
    order, 1 strong on both in opposite orders (a reversal), 2 strong on one side only, 3 on neither; -1 where
    a side is NOT_APPLICABLE."""
    c1, c2 = np.asarray(c1), np.asarray(c2)
    s1, s2 = np.abs(c1) == 1, np.abs(c2) == 1
    out = np.full(np.broadcast(c1, c2).shape, 3, dtype=np.int8)
    out[s1 ^ s2] = 2
    out[s1 & s2 & (c1 == c2)] = 0
    out[s1 & s2 & (c1 != c2)] = 1
    out[(c1 == NOT_APPLICABLE) | (c2 == NOT_APPLICABLE)] = -1
    return out


def four_way_counts(fw, axis=None) -> np.ndarray:
    """Counts of the four classes (last axis of length 4, in :data:`FOUR_WAY` order) over ``axis`` of
    :func:`four_way` codes (``axis=None``: every axis)."""
    fw = np.asarray(fw)
    return np.stack([np.sum(fw == k, axis=axis) for k in range(4)], axis=-1)


def concordance(counts) -> np.ndarray:
    """Share of comparisons strong on both sides whose order is the same: same / (same + reversal); NaN
    where none is strong on both. ``counts`` from :func:`four_way_counts` (classes on the last axis)."""
    c = np.asarray(counts, dtype=float)
    n = c[..., 0] + c[..., 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, c[..., 0] / n, np.nan)


def signed_rank_normal(d) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Wilcoxon signed-rank test by the normal approximation (zeros dropped, average ranks for tied
    |d|, tie-corrected variance, no continuity correction): ``(p, direction)`` for each slice of ``d`` (..., W)
    -- ``scipy.stats.wilcoxon(d, method="asymptotic")``'s p-value, in one sort (the bootstrap re-runs it
    thousands of times). A missing difference (NaN) counts as a zero (dropped); a slice with no non-zero
    difference has p = 1 and direction 0."""
    d = np.asarray(d, dtype=float)
    W = d.shape[-1]
    a = np.abs(d)
    nz = a > 0                                            # NaN -> False
    key = np.where(nz, a, -1.0)
    order = np.argsort(key, axis=-1, kind="stable")
    s = np.take_along_axis(key, order, axis=-1)
    new = np.ones(s.shape, dtype=bool)
    new[..., 1:] = s[..., 1:] != s[..., :-1]
    pos = np.arange(W)
    start = np.maximum.accumulate(np.where(new, pos, 0), axis=-1)
    is_end = np.ones(s.shape, dtype=bool)
    is_end[..., :-1] = new[..., 1:]
    end = np.flip(np.minimum.accumulate(np.flip(np.where(is_end, pos, W - 1), -1), axis=-1), -1)
    n = nz.sum(axis=-1)
    avg = (start + end) / 2.0 + 1.0 - (W - n)[..., None]  # ranks among the non-zero differences
    t = (end - start + 1).astype(float)
    nz_sorted = s > 0
    ties = np.sum(np.where(nz_sorted, t * t - 1.0, 0.0), axis=-1)     # = sum over tie groups of t^3 - t
    r = np.empty(s.shape)
    np.put_along_axis(r, order, avg, axis=-1)
    r_plus = np.sum(np.where(nz & (d > 0), r, 0.0), axis=-1)
    r_minus = np.sum(np.where(nz & (d < 0), r, 0.0), axis=-1)
    mean = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - ties / 48.0
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.abs(r_plus - mean) / np.sqrt(var)
    p = np.where((n > 0) & (var > 0), 2.0 * st.norm.sf(z), 1.0)
    return np.clip(p, 0.0, 1.0), np.sign(r_plus - r_minus)


def _signed_rank_sums(s, sgn, order, c, signed, n, ties):   # pragma: no cover - compiled (loops.LazyLoop)
    """The sums of :func:`resampled_signed_rank` as one loop: for every row (sorted keys ``s`` (rows, W), signs
    ``sgn`` in that order, ``order`` the windows' positions) and resample (window multiplicities ``c`` (B, W)), the
    tie groups of non-zero |d| in sort order, each with its resampled multiplicity ``tot``, its average rank
    ``before + (tot + 1) / 2`` and its correction ``tot^3 - tot``. Writes ``signed`` (R+ - R-), ``n`` and ``ties``
    (B, rows). Every value is a multiple of 1/2 far below 2^52, so the sums are exact whatever their order: the
    numpy path's numbers, bit for bit (tests)."""
    rows, W = s.shape
    for r in range(rows):
        for b in range(c.shape[0]):
            cum = 0.0
            sg = 0.0
            tt = 0.0
            j = 0
            while j < W:
                if s[r, j] <= 0.0:                       # zero differences (key -1) sort first and drop out
                    j += 1
                    continue
                k = j
                tot = 0.0
                ssum = 0.0
                while k < W and s[r, k] == s[r, j]:
                    m = c[b, order[r, k]]
                    tot += m
                    ssum += m * sgn[r, k]
                    k += 1
                sg += ssum * (cum + (tot + 1.0) / 2.0)
                tt += tot * tot * tot - tot
                cum += tot
                j = k
            signed[b, r] = sg
            n[b, r] = cum
            ties[b, r] = tt


# :func:`_signed_rank_sums` compiled by numba where numba is loaded (the analysis loads it: ``analysis.compute``),
# else None and :func:`resampled_signed_rank` takes its numpy path (``loops.NUMBA_LOADED``: a process that runs
# vLLM's engine in-process must stay free of llvmlite).
SIGNED_RANK_LOOP = LazyLoop(_signed_rank_sums)


def resampled_signed_rank(d, counts) -> tuple[np.ndarray, np.ndarray]:
    """:func:`signed_rank_normal` of every bootstrap resample of ``d`` (rows, W) given as window multiplicities
    ``counts`` (B, W) -- without sorting per resample: a resample's tie groups of |d| are the original groups
    (with multiplicities), so one sort of each row serves every resample. Returns ``(p, direction)`` (B, rows);
    equal to :func:`signed_rank_normal` of the resampled rows (``tests/test_ports.py``). NaN counts as zero."""
    d = np.asarray(d, dtype=float)
    c = np.asarray(counts, dtype=np.float32)
    W = d.shape[-1]
    a = np.abs(d)
    nz = a > 0
    key = np.where(nz, a, -1.0)
    order = np.argsort(key, axis=-1, kind="stable")                      # (rows, W)
    s = np.take_along_axis(key, order, axis=-1)
    sgn = np.take_along_axis(np.sign(np.where(nz, d, 0.0)), order, axis=-1).astype(np.float32)
    nzs = s > 0
    loop = SIGNED_RANK_LOOP()
    if loop is not None:
        shape = (c.shape[0], d.shape[0])
        signed, n, ties = np.empty(shape), np.empty(shape), np.empty(shape)
        loop(np.ascontiguousarray(s), np.ascontiguousarray(sgn, dtype=float), np.ascontiguousarray(order),
             np.ascontiguousarray(c, dtype=float), signed, n, ties)
    else:
        signed, n, ties = _signed_rank_sums_numpy(c, order, s, sgn, nzs, W)
    return _signed_rank_p(signed, n, ties)


def _signed_rank_sums_numpy(c, order, s, sgn, nzs, W):
    """:func:`_signed_rank_sums` with numpy arrays (B, rows, W): the reference path."""
    tied = np.any((s[:, 1:] == s[:, :-1]) & nzs[:, 1:], axis=-1)        # rows with tied non-zero |d|
    cs = c[:, order] * nzs.astype(np.float32)                             # (B, rows, W) multiplicity, zeros dropped
    cum = np.cumsum(cs, axis=-1)
    n = cum[..., -1].astype(float)
    rank = cum - (cs - 1.0) / 2.0                                         # each value its own group: the average rank
    ties = np.sum(cs * cs * cs - cs, axis=-1, dtype=float)
    if tied.any():                                                        # rows with tied values: groups span positions
        t = np.flatnonzero(tied)
        st_, nzt = s[t], nzs[t]
        new = np.ones(st_.shape, dtype=bool)
        new[:, 1:] = st_[:, 1:] != st_[:, :-1]
        pos = np.arange(W)
        start = np.maximum.accumulate(np.where(new, pos, 0), axis=-1)
        is_end = np.ones(st_.shape, dtype=bool)
        is_end[:, :-1] = new[:, 1:]
        end = np.flip(np.minimum.accumulate(np.flip(np.where(is_end, pos, W - 1), -1), axis=-1), -1)
        ct = cum[:, t]
        before = np.where(start > 0, np.take_along_axis(ct, np.broadcast_to(np.maximum(start - 1, 0), ct.shape), -1), 0)
        total = np.take_along_axis(ct, np.broadcast_to(end, ct.shape), -1) - before
        rank[:, t] = before + (total + 1.0) / 2.0
        ties[:, t] = np.sum(np.where(is_end & nzt, total.astype(float) ** 3 - total, 0.0), axis=-1)
    return np.sum(cs * rank * sgn, axis=-1, dtype=float), n, ties            # R+ - R-


def _signed_rank_p(signed, n, ties) -> tuple[np.ndarray, np.ndarray]:
    r_plus = (n * (n + 1) / 2.0 + signed) / 2.0
    mean = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - ties / 48.0
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.abs(r_plus - mean) / np.sqrt(var)
    p = np.where((n > 0) & (var > 0), 2.0 * special.ndtr(-z), 1.0)
    return np.clip(p, 0.0, 1.0), np.sign(signed)
