"""What ports: the headline of the study as a table of comparisons (DESIGN.md section 9, issue #25).

**Sides.** In every ranking (source, region, metric) each scheduler pair is classified
(:func:`portbench.study.stats.side_classes`):

* *strong* -- the paired two-sided Wilcoxon test over windows rejects at ``alpha`` after
  ``analysis.tie_correction`` over the ranking's pairs, in the direction of the mean difference, and the
  effect is at least delta (relative for ratio metrics, absolute for proportions);
* *equivalent* -- the paired TOST (two one-sided t-tests) at +-delta rejects, after the same correction;
* *undetermined* -- neither. No partition is built: a pair the tests leave open stays open.

**Comparisons.** Two sides of one scheduler pair on the same metric: two sources in the same region
(*across sources*, every source pair of a panel) or two regions of the same source (*across regions*,
every region pair). Each comparison is one of four (:func:`portbench.study.stats.four_way`): strong on
both in the same order, strong on both in opposite orders (a *reversal*), strong on one side only, strong
on neither. The headline number is the **concordance among pairs strong on both** =
same / (same + reversal), across sources beside across regions. Kendall tau-b, tau-b / tau-b,max and W are
secondary rows computed on the same classes (ties = equivalences, undetermined pairs left out).

**Intervals re-run the tests** (:func:`source_classes`): windows are resampled within each source, one index
per resample shared by every region and metric of that source (they are the same windows), and the Wilcoxon
tests, the TOSTs, the correction and the classification are all re-run in every resample; the 95% percentile
interval of each number is over those resamples. **Interval method** (:data:`INTERVAL`, on record in the
analysis plan since 2026-12-02): a circular **block** bootstrap of the windows in trace order, with each
source's block length from its autocorrelation (:func:`block_lengths`: the AR(1) inflation (1 + r1) / (1 - r1)
of the reference policy's per-window values, so about one independent window's worth per block; 1 where the
windows are not positively correlated, which is the ordinary bootstrap). The ordinary window bootstrap (every
window drawn independently) is reported beside it (``ci_window``): it treats neighbouring windows of an
autocorrelated trace as independent evidence, so its intervals are narrower.

A scheduler that is n/a on a source (``vtc`` without tenants) is left out of that source's rankings (its
pairs are not tested there, not in the correction family, and not compared).
"""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from ...sim import schedulers as scheduler_registry
from .. import stats
from .common import _num, _source_rng
from .cube import Cube

INTERVAL = "block"      # the headline's interval method (analysis plan: `interval`); "window" = ordinary bootstrap
INTERVAL_TEXT = {
    "block": "95% percentile circular block bootstrap: runs of consecutive windows (trace order) resampled within "
             "each source, block length per source from its lag-1 autocorrelation ((1 + r1) / (1 - r1), at least 1), "
             "one index for every region and metric of the source, tests and classes re-run in each of {B} resamples",
    "window": "95% percentile hierarchical bootstrap: windows resampled independently within each source (one index "
              "for every region and metric of the source), tests and classes re-run in each of {B} resamples",
}
RANDOM_SUBSETS = 20      # random window subsets per size of the windows curve (beside the evenly spaced subset)
PREDICTOR_POLICIES = ("sjf_predicted", "ltr", "edf")   # the predictor-informed policies (information: predicted)
DEFINITION = ("each side of a scheduler pair (one source, region and metric) is strong (paired Wilcoxon over windows "
              "significant after {corr} within the ranking, alpha = {alpha}, and effect >= delta), equivalent (paired "
              "TOST at +-delta significant after the same correction) or undetermined; a comparison of two sides is "
              "same order / reversal (strong on both) / one side / neither; concordance = same / (same + reversal)")
FOUR_WAY_TEXT = {"same_order": "strong on both sides, same order", "reversal": "strong on both sides, opposite orders",
                 "one_side": "strong on one side only", "neither": "strong on neither side"}


def family_of(scheduler: str) -> str:
    """The information class a scheduler's decisions rest on (its registry ``information``): arrival, prompt,
    predicted, oracle, tenant or none."""
    cls = scheduler_registry.SCHEDULERS.get(scheduler)
    return getattr(cls, "information", "other") if cls is not None else "other"


def margins(means_a, means_b, scales, deltas, window_size: float) -> np.ndarray:
    """The equivalence margin of each pair in the metric's units: delta x the mean of the two means' magnitudes
    for ratio metrics (the relative effect's scale), delta for proportions, delta x the window size for counts.
    ``means_*`` (..., M, P); ``scales``, ``deltas`` per metric."""
    a, b = np.abs(np.asarray(means_a, float)), np.abs(np.asarray(means_b, float))
    out = np.empty(np.broadcast(a, b).shape)
    for m, sc in enumerate(scales):
        dm = deltas[m]
        out[..., m, :] = (dm * (a[..., m, :] + b[..., m, :]) / 2.0 if sc == "ratio"
                          else dm * float(window_size) if sc == "count" else dm)
    return out


def classify(raw, sign, scales, deltas, *, window_size: float, alpha: float, correction: str,
             pair_ok=None, fast: bool = False) -> dict[str, np.ndarray]:
    """Side classes of every scheduler pair of every ranking in ``raw`` (..., M, K, W): per-window values in
    the metrics' own units (``sign`` orients them: +1 higher is better, -1 lower). Returns ``classes``
    (..., M, P) int8 (pairs in ``np.triu_indices(K, 1)`` order), ``diff`` (oriented mean difference, + = a
    better), ``effect``, ``p`` / ``p_tost`` (raw) and ``p_adj`` / ``p_tost_adj`` (adjusted within each
    ranking over the pairs of ``pair_ok``; pairs outside it are NOT_APPLICABLE). ``fast``: the Wilcoxon p-values by
    the normal approximation (:func:`portbench.study.stats.signed_rank_normal`; bootstrap resamples) instead of
    scipy's choice of method."""
    raw = np.asarray(raw, dtype=float)
    K = raw.shape[-2]
    ia, ib = np.triu_indices(K, 1)
    sign = np.asarray(sign, dtype=float)[:, None, None]
    xo = raw * sign
    d = xo[..., ia, :] - xo[..., ib, :]                                   # (..., M, P, W)
    both = ~np.isnan(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ma = np.nanmean(np.where(both, raw[..., ia, :], np.nan), axis=-1)
        mb = np.nanmean(np.where(both, raw[..., ib, :], np.nan), axis=-1)
        diff = np.nanmean(d, axis=-1)
    effect = np.empty(diff.shape)
    for m, sc in enumerate(scales):
        effect[..., m, :] = stats.effect_size(ma[..., m, :], mb[..., m, :], sc, window_size)
    ok = np.ones(len(ia), bool) if pair_ok is None else np.asarray(pair_ok, bool)
    if fast:
        p_w, direction = stats.signed_rank_normal(d)
        n_nonzero = np.sum(d != 0, axis=-1)
    else:
        test = stats.paired_wilcoxon(d)
        p_w, direction, n_nonzero = test.pvalue, test.direction, test.n_nonzero
    p = np.where(ok, p_w, np.nan)
    p_tost = np.where(ok, stats.tost_paired(d, margins(ma, mb, scales, deltas, window_size)), np.nan)
    p_adj = stats.adjust_last_axis(p, correction)
    p_tost_adj = stats.adjust_last_axis(p_tost, correction)
    cls = stats.side_classes(p_adj, direction, diff, effect, p_tost_adj, alpha, np.asarray(deltas)[:, None])
    cls = np.where(ok, cls, stats.NOT_APPLICABLE).astype(np.int8)
    return {"classes": cls, "diff": diff, "effect": effect, "p": p, "p_adj": p_adj, "p_tost": p_tost,
            "p_tost_adj": p_tost_adj, "n_nonzero": n_nonzero}


def classify_resampled(raw, sign, scales, deltas, counts, *, window_size: float, alpha: float, correction: str,
                       pair_ok=None) -> np.ndarray:
    """:func:`classify`'s classes (B, ..., M, P) for every bootstrap resample of the windows, given as window
    multiplicities ``counts`` (B, W): means, standard deviations and the effects by matrix products, the Wilcoxon
    tests by :func:`portbench.study.stats.resampled_signed_rank` (normal approximation), the TOSTs and the
    correction as in :func:`classify`. Missing values drop out of every sum."""
    raw = np.asarray(raw, dtype=float)
    K, W = raw.shape[-2], raw.shape[-1]
    ia, ib = np.triu_indices(K, 1)
    xo = raw * np.asarray(sign, dtype=float)[:, None, None]
    d = xo[..., ia, :] - xo[..., ib, :]                                   # (..., M, P, W)
    lead = d.shape[:-1]
    rows = d.reshape(-1, W)
    v = ~np.isnan(rows)
    c = np.asarray(counts, dtype=float)                                   # (B, W)
    d0 = np.where(v, rows, 0.0)
    n = c @ v.T                                                           # (B, rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (c @ d0.T) / n
        var = ((c @ (d0 * d0).T) - n * mean * mean) / (n - 1)
        ra = np.where(v, raw[..., ia, :].reshape(-1, W), 0.0)
        rb = np.where(v, raw[..., ib, :].reshape(-1, W), 0.0)
        ma, mb = (c @ ra.T) / n, (c @ rb.T) / n
    B = c.shape[0]
    shape = (B,) + lead
    mean, ma, mb, n = (x.reshape(shape) for x in (mean, ma, mb, n))
    sd = np.sqrt(np.maximum(var, 0.0)).reshape(shape)
    effect = np.empty(shape)
    for m, sc in enumerate(scales):
        effect[..., m, :] = stats.effect_size(ma[..., m, :], mb[..., m, :], sc, window_size)
    ok = np.ones(len(ia), bool) if pair_ok is None else np.asarray(pair_ok, bool)
    p_w, direction = stats.resampled_signed_rank(np.where(v, rows, 0.0), c)
    p = np.where(ok, p_w.reshape(shape), np.nan)
    p_tost = np.where(ok, stats.tost_from_moments(mean, sd, n, margins(ma, mb, scales, deltas, window_size)), np.nan)
    cls = stats.side_classes(stats.adjust_last_axis(p, correction), direction.reshape(shape), mean, effect,
                             stats.adjust_last_axis(p_tost, correction), alpha, np.asarray(deltas)[:, None])
    return np.where(ok, cls, stats.NOT_APPLICABLE).astype(np.int8)


# --------------------------------------------------------------------------- the comparisons

def across_sources(classes: dict[str, np.ndarray], sources: list[str]) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Four-way codes of every source pair of ``sources``: ``(pairs, codes)``, codes (..., SP, R, M, P)."""
    pairs = list(combinations(sources, 2))
    if not pairs:
        return pairs, np.zeros((0,), np.int8)
    return pairs, np.stack([stats.four_way(classes[a], classes[b]) for a, b in pairs], axis=-4)


def across_regions(classes: dict[str, np.ndarray], sources: list[str], n_regions: int
                   ) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Four-way codes of every region pair within each source: ``(region pairs, codes)``, codes
    (..., S, RP, M, P)."""
    rp = list(combinations(range(n_regions), 2))
    per = []
    for s in sources:
        c = classes[s]                                                    # (..., R, M, P)
        if not rp:                                                        # one region: nothing to compare
            per.append(np.zeros(c.shape[:-3] + (0,) + c.shape[-2:], dtype=np.int8))
            continue
        per.append(np.stack([stats.four_way(c[..., i, :, :], c[..., j, :, :]) for i, j in rp], axis=-3))
    return rp, np.stack(per, axis=-4)


def _counts(codes, axes) -> np.ndarray:
    return stats.four_way_counts(codes, axis=axes)


def _share_block(counts) -> dict:
    c = np.asarray(counts, dtype=float)
    total = float(c.sum())
    out: dict = {k: {"share": _num(c[i] / total) if total else None, "count": int(c[i])}
                 for i, k in enumerate(stats.FOUR_WAY)}
    out["total"] = int(total)
    return out


def _conc_stat(point_counts, boot_counts, what: str) -> dict:
    """``{value, ci, n, definition}`` of the concordance from counts (4,) and per-resample counts (B, 4)."""
    v = stats.concordance(point_counts)
    ci, med = [None, None], None
    if boot_counts is not None:
        bc = stats.concordance(boot_counts)
        lo, hi = stats.percentile_ci(bc)
        ci = [_num(lo), _num(hi)]
        med = _num(np.nanmedian(bc)) if np.isfinite(bc).any() else None
    c = np.asarray(point_counts)
    return {"value": _num(v), "ci": ci, "boot_median": med, "n": int(c[0] + c[1]), "reversals": int(c[1]),
            "definition": f"share of the comparisons strong on both sides that keep their order, {what}"}


# --------------------------------------------------------------------------- one headline


def _pair_ok(cube: Cube, na: dict, keep=None) -> dict[str, np.ndarray]:
    """Per source, the scheduler pairs that are compared: both schedulers kept and applicable there."""
    K = len(cube.schedulers)
    ia, ib = np.triu_indices(K, 1)
    keep = set(cube.schedulers if keep is None else keep)
    out = {}
    for s in cube.sources:
        good = np.array([k in keep and k not in na.get(s, set()) for k in cube.schedulers])
        out[s] = good[ia] & good[ib]
    return out


def source_classes(cube: Cube, metric_idx, cfg: dict, deltas, na: dict, *, keep=None, windows=None,
                   boot: int = 0, seed: int = 0, chunk: int = 50, sources=None,
                   blocks: dict[str, int] | None = None) -> tuple[dict, dict | None]:
    """Side classes of every source of ``sources`` (default: all): ``(point, boot)``, point[s] (R, Mh, P),
    boot[s] (B, R, Mh, P) or None. ``windows``: per source the window positions to use (default: all);
    ``keep``: the schedulers kept; ``blocks``: per source the block length of a circular block bootstrap
    (:func:`block_lengths`; default: the ordinary bootstrap of the windows)."""
    ok = _pair_ok(cube, na, keep)
    sign = cube.sign[metric_idx]
    scales = [cube.scales[m] for m in metric_idx]
    dl = np.asarray(deltas)[metric_idx]
    kw = {"window_size": cfg["window_size"], "alpha": cfg["alpha"], "correction": cfg["tie_correction"]}
    point, bt = {}, ({} if boot else None)
    for s in (sources or cube.sources):
        raw = cube.values[s][:, metric_idx]
        if windows is not None:
            raw = raw[..., np.asarray(windows[s])]
        point[s] = classify(raw, sign, scales, dl, pair_ok=ok[s], **kw)["classes"]
        if boot:
            L = (blocks or {}).get(s, 1)
            idx = stats.block_bootstrap_indices(raw.shape[-1], boot, L, _source_rng(seed, s))
            counts = np.stack([np.bincount(i, minlength=raw.shape[-1]) for i in idx])
            bt[s] = np.concatenate([classify_resampled(raw, sign, scales, dl, counts[lo:lo + chunk], pair_ok=ok[s], **kw)
                                    for lo in range(0, boot, chunk)])
    return point, bt


def headline_numbers(cube: Cube, classes: dict, boot: dict | None, sources: list[str]) -> dict:
    """The concordance and four-way table across sources and across regions for ``sources`` (from
    :func:`source_classes`)."""
    out: dict = {"concordance": {}, "four_way": {}}
    R = len(cube.regions)
    sp, cs = across_sources(classes, sources)
    _, cr = across_regions(classes, sources, R)
    bs = across_sources(boot, sources)[1] if boot is not None and len(sp) else None
    br = across_regions(boot, sources, R)[1] if boot is not None else None
    for name, point, bc, what in (("across_sources", cs if len(sp) else None, bs,
                                   f"pairs x {len(sp)} source pairs x regions x headline metrics"),
                                  ("across_regions", cr, br, "pairs x region pairs within each source x headline metrics")):
        if point is None:
            out["concordance"][name] = {"value": None, "ci": [None, None], "n": 0, "definition": "fewer than two sources"}
            continue
        pc = _counts(point, None)
        bcounts = _counts(bc, tuple(range(1, bc.ndim))) if bc is not None else None
        out["concordance"][name] = _conc_stat(pc, bcounts, what)
        out["four_way"][name] = _share_block(pc)
    return out


def breakdowns(cube: Cube, classes: dict, boot: dict | None, sources: list[str], metric_idx) -> dict:
    """The four-way table and concordance per source pair, metric, region (across sources), per source, metric
    and region pair (across regions), and per scheduler and scheduler family (pairs involving one), each with
    its bootstrap interval."""
    K = len(cube.schedulers)
    ia, ib = np.triu_indices(K, 1)
    names = [cube.metrics[m] for m in metric_idx]
    R = len(cube.regions)
    sp, cs = across_sources(classes, sources)
    rp, cr = across_regions(classes, sources, R)
    bs = across_sources(boot, sources)[1] if boot is not None and len(sp) else None
    br = across_regions(boot, sources, R)[1] if boot is not None else None

    def by(point, bc, axis, labels):
        res = {}
        for i, lab in enumerate(labels):
            p = np.take(point, i, axis=axis)
            b = np.take(bc, i, axis=axis + 1) if bc is not None else None
            pc = _counts(p, None)
            if pc.sum() == 0:                      # nothing compared (every pair n/a there)
                continue
            res[lab] = {**_conc_stat(pc, _counts(b, tuple(range(1, b.ndim))) if b is not None else None, ""),
                        "four_way": _share_block(pc)}
            res[lab].pop("definition")
        return res

    def by_pairs(point, bc, groups):
        res = {}
        for lab, members in groups.items():
            sel = np.array([cube.schedulers[a] in members or cube.schedulers[b] in members for a, b in zip(ia, ib)])
            if not sel.any():
                continue
            p = point[..., sel]
            b = bc[..., sel] if bc is not None else None
            pc = _counts(p, None)
            if pc.sum() == 0:
                continue
            res[lab] = {**_conc_stat(pc, _counts(b, tuple(range(1, b.ndim))) if b is not None else None, ""),
                        "four_way": _share_block(pc)}
            res[lab].pop("definition")
        return res

    fams: dict[str, set] = {}
    for k in cube.schedulers:
        fams.setdefault(family_of(k), set()).add(k)
    out: dict = {"across_sources": {}, "across_regions": {}}
    if len(sp):
        out["across_sources"] = {
            "by_source_pair": by(cs, bs, 0, [f"{a} vs {b}" for a, b in sp]),
            "by_region": by(cs, bs, 1, cube.regions),
            "by_metric": by(cs, bs, 2, names),
            "by_scheduler": by_pairs(cs, bs, {k: {k} for k in cube.schedulers}),
            "by_family": by_pairs(cs, bs, fams)}
    out["across_regions"] = {
        "by_source": by(cr, br, 0, sources),
        "by_region_pair": by(cr, br, 1, [f"{cube.regions[i]} vs {cube.regions[j]}" for i, j in rp]),
        "by_metric": by(cr, br, 2, names),
        "by_scheduler": by_pairs(cr, br, {k: {k} for k in cube.schedulers}),
        "by_family": by_pairs(cr, br, fams)}
    out["families"] = {f: sorted(v) for f, v in fams.items()}
    return out


# --------------------------------------------------------------------------- secondary: tau-b and W on the classes


def _signs(c) -> np.ndarray:
    """Pair signs of side classes: +1 / -1 strong, 0 equivalent, NaN undetermined or n/a."""
    c = np.asarray(c)
    return np.where(np.abs(c) == 1, c.astype(float), np.where(c == stats.EQUIVALENT, 0.0, np.nan))


def tau_on_classes(c1, c2) -> dict[str, np.ndarray]:
    """Kendall tau-b between two rankings given by their side classes (pairs on the last axis): pairs
    determined on both sides only (strong or equivalent), equivalent pairs as ties. ``tau_b`` =
    (C - D) / sqrt(untied_1 x untied_2); ``tau_b_norm`` = tau-b / tau-b,max = (C - D) / (C + D), tau-b,max
    being the tau-b with every pair strong on both concordant. NaN where a ranking has no untied pair."""
    x, y = _signs(c1), _signs(c2)
    both = ~np.isnan(x) & ~np.isnan(y)
    x, y = np.where(both, x, 0.0), np.where(both, y, 0.0)
    num = np.sum(x * y, axis=-1)
    nx, ny = np.sum(x != 0, axis=-1), np.sum(y != 0, axis=-1)
    strong_both = np.sum((x != 0) & (y != 0), axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        den = np.sqrt(nx * ny.astype(float))
        tau = np.where(den > 0, num / den, np.nan)
        norm = np.where(strong_both > 0, num / strong_both, np.nan)
    return {"tau_b": tau, "tau_b_norm": norm, "determined": np.sum(both, axis=-1)}


def copeland_ranks(c, K: int) -> np.ndarray:
    """Ranks (1 = best, ties averaged) from side classes (..., P): each scheduler's strong wins minus strong
    losses; equivalent and undetermined pairs count as neither (so only strong orders separate schedulers)."""
    ia, ib = np.triu_indices(K, 1)
    s = np.nan_to_num(np.where(np.abs(c) == 1, np.asarray(c, float), 0.0))
    score = np.zeros(s.shape[:-1] + (K,))
    np.add.at(np.moveaxis(score, -1, 0), ia, np.moveaxis(s, -1, 0))
    np.add.at(np.moveaxis(score, -1, 0), ib, -np.moveaxis(s, -1, 0))
    return stats.ranks_best_first(score)


def secondary(cube: Cube, classes: dict, boot: dict | None, sources: list[str]) -> dict:
    """tau-b, tau-b / tau-b,max (across sources and across regions) and Kendall's W across the panel's sources,
    all on the side classes (means over the conditions where defined, with bootstrap intervals)."""
    R = len(cube.regions)
    out: dict = {}

    def mean_ci(point, b):
        v = np.nanmean(point) if np.isfinite(point).any() else np.nan
        ci = [None, None]
        if b is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                bm = np.nanmean(b.reshape(b.shape[0], -1), axis=1)
            lo, hi = stats.percentile_ci(bm)
            ci = [_num(lo), _num(hi)]
        return {"value": _num(v), "ci": ci, "n": int(np.isfinite(point).sum())}

    pairs = list(combinations(sources, 2))
    rp = list(combinations(range(R), 2))
    for name, getp in (("across_sources", lambda C: [(C[a], C[b]) for a, b in pairs]),
                       ("across_regions", lambda C: [(C[s][..., i, :, :], C[s][..., j, :, :]) for s in sources
                                                     for i, j in rp])):
        if not getp(classes):
            continue
        pt = [tau_on_classes(a, b) for a, b in getp(classes)]
        bt = [tau_on_classes(a, b) for a, b in getp(boot)] if boot is not None else None
        for key in ("tau_b", "tau_b_norm"):
            point = np.stack([t[key] for t in pt])
            bb = np.moveaxis(np.stack([t[key] for t in bt]), 1, 0) if bt is not None else None
            out.setdefault(key, {})[name] = mean_ci(point, bb)
    if len(sources) >= 3:
        K = len(cube.schedulers)
        ranks = np.stack([copeland_ranks(classes[s], K) for s in sources], axis=-2)      # (R, M, S, K)
        w = stats.kendall_w(ranks)
        bw = None
        if boot is not None:
            bw = stats.kendall_w(np.stack([copeland_ranks(boot[s], K) for s in sources], axis=-2))
        out["W"] = {"across_sources": mean_ci(np.asarray(w), bw)}
    out["definition"] = ("on the side classes: ties = equivalent pairs, undetermined pairs left out; tau-b,max = the "
                         "tau-b with every pair strong on both concordant; W on Copeland ranks (strong wins minus "
                         "strong losses); means over the conditions where defined")
    return out


# --------------------------------------------------------------------------- everything the summary gets


def side_shares(classes: dict, sources: list[str]) -> dict:
    """Share of the rankings' pairs that are strong, equivalent, undetermined (n/a left out)."""
    c = np.concatenate([classes[s].ravel() for s in sources])
    c = c[c != stats.NOT_APPLICABLE]
    n = c.size
    return {"strong": _num(np.mean(np.abs(c) == 1)) if n else None,
            "equivalent": _num(np.mean(c == stats.EQUIVALENT)) if n else None,
            "undetermined": _num(np.mean(c == stats.UNDETERMINED)) if n else None, "pairs": int(n)}


def evenly_spaced(n_windows: int, n: int) -> np.ndarray:
    """``n`` window positions spread evenly over ``n_windows`` (the windows are stride-sampled across the
    trace, so a subset keeps covering it)."""
    return np.unique(np.round(np.linspace(0, n_windows - 1, n)).astype(int))


def ports_table(cube: Cube, classes: dict, sources: list[str], metric_idx, panel: str) -> pl.DataFrame:
    """One row per comparison (across sources and across regions) with both sides' classes and the four-way class."""
    K = len(cube.schedulers)
    ia, ib = np.triu_indices(K, 1)
    names = {stats.STRONG_A: "a", stats.STRONG_B: "b", stats.EQUIVALENT: "equivalent",
             stats.UNDETERMINED: "undetermined", stats.NOT_APPLICABLE: "n/a"}
    fw_names = {-1: "n/a", **dict(enumerate(stats.FOUR_WAY))}
    rows = []
    R = len(cube.regions)
    for a, b in combinations(sources, 2):
        fw = stats.four_way(classes[a], classes[b])
        for r in range(R):
            for mi, m in enumerate(metric_idx):
                for p in range(len(ia)):
                    rows.append(("across_sources", panel, a, b, cube.regions[r], cube.regions[r], cube.metrics[m],
                                 cube.schedulers[ia[p]], cube.schedulers[ib[p]], names[int(classes[a][r, mi, p])],
                                 names[int(classes[b][r, mi, p])], fw_names[int(fw[r, mi, p])]))
    for s in sources:
        c = classes[s]
        for i, j in combinations(range(R), 2):
            fw = stats.four_way(c[i], c[j])
            for mi, m in enumerate(metric_idx):
                for p in range(len(ia)):
                    rows.append(("across_regions", panel, s, s, cube.regions[i], cube.regions[j], cube.metrics[m],
                                 cube.schedulers[ia[p]], cube.schedulers[ib[p]], names[int(c[i, mi, p])],
                                 names[int(c[j, mi, p])], fw_names[int(fw[mi, p])]))
    cols = ["kind", "panel", "source_1", "source_2", "region_1", "region_2", "metric", "a", "b", "side_1", "side_2",
            "four_way"]
    df = pl.DataFrame(rows, schema=cols, orient="row")
    prov = dict(cube.provenance)
    return df.with_columns(pl.col("source_1").replace_strict(prov, return_dtype=pl.String).alias("provenance_1"),
                           pl.col("source_2").replace_strict(prov, return_dtype=pl.String).alias("provenance_2")
                           ).select(cols[:4] + ["provenance_1", "provenance_2"] + cols[4:])


def headline(cube: Cube, cfg: dict, deltas, na: dict, sources: list[str], metric_idx, *, keep=None, windows=None,
             boot: int | None = None, details: bool = True, blocks: dict[str, int] | None = None) -> tuple[dict, dict]:
    """The headline block for ``sources``: ``(block, classes)``. ``keep`` (schedulers) and ``windows`` (per
    source positions) restrict the data (controls, windows curve); ``boot`` resamples (default
    ``cfg["bootstrap"]``); ``details``: also the breakdowns and the secondary rows; ``blocks``: block lengths of
    the block bootstrap (default: the ordinary window bootstrap)."""
    B = cfg["bootstrap"] if boot is None else boot
    point, bt = source_classes(cube, metric_idx, cfg, deltas, na, keep=keep, windows=windows, boot=B, seed=cfg["seed"],
                               sources=sources, blocks=blocks)
    block = headline_numbers(cube, point, bt, sources)
    block["_boot"] = bt
    block["sides"] = side_shares(point, sources)
    if details:
        block["breakdowns"] = breakdowns(cube, point, bt, sources, metric_idx)
        block["secondary"] = secondary(cube, point, bt, sources)
    return block, point


def compute_block(cube: Cube, cfg: dict, deltas, na: dict, panels: dict, headline_panel: str | None, metric_idx,
                  *, window_counts=(10, 20, 30, 40), curve_boot: int = 200, control_boot: int = 200,
                  matched: dict | None = None, congestion: dict | None = None,
                  random_subsets: int = RANDOM_SUBSETS) -> tuple[dict, dict, pl.DataFrame]:
    """``(headline, controls, table)``: the ``headline`` and ``controls`` blocks of summary.json and the
    per-comparison table, for the headline panel (and the across-sources numbers of every other panel).
    The headline's intervals use ``analysis.bootstrap`` resamples; the windows curve ``curve_boot``, the other
    panels and the controls ``control_boot`` (each re-runs every test per resample). ``matched``: the region
    pairs of equal congestion (:func:`matched_control`); ``congestion``: summary.json's congestion block, for the
    concordance by load distance (``block["load_distance"]``, :mod:`.load_distance`); ``random_subsets``: random
    window subsets per size of the windows curve (point estimates, :func:`random_subset_curve`)."""
    from .load_distance import load_distance
    from .uncertainty import one_side_split, sources_uncertainty

    avail = {n: p for n, p in panels.items() if p["available"]}
    name = headline_panel if headline_panel in avail else next(iter(avail), None)
    sources = avail[name]["sources"] if name else list(cube.sources)
    blocks = block_lengths(cube, metric_idx) if INTERVAL == "block" else None
    block, point = headline(cube, cfg, deltas, na, sources, metric_idx, blocks=blocks)
    head_boot = block.pop("_boot")
    # the same headline's intervals by the ordinary window bootstrap, reported beside the chosen method's
    other, _ = headline(cube, cfg, deltas, na, sources, metric_idx, details=False,
                        blocks=None if INTERVAL == "block" else block_lengths(cube, metric_idx))
    other.pop("_boot")
    other_method = "window" if INTERVAL == "block" else "block"
    for k, c in block["concordance"].items():
        c[f"ci_{other_method}"] = other["concordance"][k]["ci"]
    block = {"panel": name, "sources": sources, "metrics": [cube.metrics[m] for m in metric_idx],
             "definition": DEFINITION.format(corr=cfg["tie_correction"], alpha=cfg["alpha"]),
             "four_way_classes": FOUR_WAY_TEXT,
             "interval_method": INTERVAL, "interval": INTERVAL_TEXT[INTERVAL].format(B=cfg["bootstrap"]),
             f"interval_{other_method}": INTERVAL_TEXT[other_method].format(B=cfg["bootstrap"]),
             "block_lengths": blocks or {}, **block}
    block["effective_windows"] = effective_windows(cube, metric_idx)
    block["panels"] = {}
    for n, p in avail.items():
        if n == name:
            continue
        b, _ = headline(cube, cfg, deltas, na, p["sources"], metric_idx, details=False, boot=control_boot,
                        blocks=blocks)
        b.pop("_boot")
        block["panels"][n] = {"sources": p["sources"], "concordance": b["concordance"], "four_way": b["four_way"]}
    curve = []
    for n in window_counts:
        if n > min(len(cube.windows[s]) for s in sources):
            continue
        if all(n == len(cube.windows[s]) for s in sources):
            b = block                              # every window: the headline itself
        else:
            win = {s: evenly_spaced(len(cube.windows[s]), n) for s in cube.sources}
            b, _ = headline(cube, cfg, deltas, na, sources, metric_idx, windows=win, boot=curve_boot, details=False,
                            blocks=block_lengths(cube, metric_idx, windows=win) if blocks is not None else None)
            b.pop("_boot")
        curve.append({"windows": n, **{k: b["concordance"][k] for k in b["concordance"]},
                      "four_way": b["four_way"], "sides": b["sides"]})
    block["by_windows"] = {"definition": f"the headline on n evenly spaced windows per source ({curve_boot} "
                                         "resamples for the intervals; every window: the headline's)", "points": curve}
    if random_subsets:
        block["by_windows"]["random_subsets"] = random_subset_curve(cube, cfg, deltas, na, sources, metric_idx,
                                                                    window_counts, random_subsets)
    block["by_windows"]["slope_per_10_windows"] = _slope(
        [(p["windows"], (p.get("across_sources") or {}).get("value")) for p in curve])
    block["uncertainty"] = sources_uncertainty(point, head_boot, sources)
    block["one_side_split"] = one_side_split(point, sources)
    if congestion is not None:
        block["load_distance"] = load_distance(point, head_boot, sources, cube.regions, congestion)
    controls = {"headline": {k: block["concordance"][k] for k in block["concordance"]}}
    keep = [k for k in cube.schedulers if k not in PREDICTOR_POLICIES]
    b, _ = headline(cube, cfg, deltas, na, sources, metric_idx, keep=keep, details=False, boot=control_boot,
                    blocks=blocks)
    b.pop("_boot")
    controls["without_predictor_policies"] = {"dropped": [k for k in PREDICTOR_POLICIES if k in cube.schedulers],
                                              "concordance": b["concordance"], "four_way": b["four_way"]}
    if "sarathi" in cube.schedulers:
        b, _ = headline(cube, cfg, deltas, na, sources, metric_idx, keep=[k for k in cube.schedulers if k != "sarathi"],
                        details=False, boot=control_boot, blocks=blocks)
        b.pop("_boot")
        controls["without_sarathi"] = {
            "dropped": ["sarathi"], "why": "sarathi is FCFS order with a 512-token budget (the engine's is larger): "
                                          "its comparisons measure a token budget more than an ordering",
            "concordance": b["concordance"], "four_way": b["four_way"]}
    budget = token_budget(cube, point, sources, metric_idx)
    if budget:
        controls["token_budget"] = budget
    if matched is not None:
        controls["matched_congestion"] = matched_control(cube, point, head_boot, sources, matched)
    for c in controls.values():
        if isinstance(c, dict) and "concordance" in c:
            c["bootstrap"] = control_boot
    return block, controls, ports_table(cube, point, sources, metric_idx, name or "all")


def _slope(points) -> float | None:
    """Least-squares slope of the concordance per 10 windows over ``(windows, value)`` points (None with < 2)."""
    pts = [(n, v) for n, v in points if v is not None]
    if len(pts) < 2:
        return None
    x, y = np.array(pts, float).T
    return _num(10.0 * np.polyfit(x, y, 1)[0])


def random_subset_curve(cube: Cube, cfg: dict, deltas, na: dict, sources: list[str], metric_idx, window_counts,
                        n_subsets: int) -> dict:
    """The headline (point estimates) on ``n_subsets`` random subsets of n windows per source for each n of
    ``window_counts`` below the full count (seeded by ``cfg["seed"]``; Wilcoxon by the normal approximation):
    mean, 2.5 / 97.5 % quantiles over the subsets, and the slope of the means per 10 windows."""
    rng = np.random.default_rng([cfg["seed"], 39])
    ok = _pair_ok(cube, na)
    sign = cube.sign[metric_idx]
    scales = [cube.scales[m] for m in metric_idx]
    dl = np.asarray(deltas)[metric_idx]
    kw = {"window_size": cfg["window_size"], "alpha": cfg["alpha"], "correction": cfg["tie_correction"], "fast": True}
    pts = []
    full = min(len(cube.windows[s]) for s in sources)
    for n in window_counts:
        if n >= full:
            continue
        vals: dict[str, list] = {"across_sources": [], "across_regions": []}
        for _ in range(n_subsets):
            pt = {}
            for s in sources:
                w = np.sort(rng.choice(len(cube.windows[s]), n, replace=False))
                pt[s] = classify(cube.values[s][:, metric_idx][..., w], sign, scales, dl, pair_ok=ok[s], **kw)["classes"]
            h = headline_numbers(cube, pt, None, sources)
            for k in vals:
                vals[k].append((h["concordance"].get(k) or {}).get("value"))
        row: dict = {"windows": n}
        for k, v in vals.items():
            a = np.array([x for x in v if x is not None], float)
            row[k] = {"mean": _num(a.mean()) if a.size else None,
                      "q025": _num(np.quantile(a, 0.025)) if a.size else None,
                      "q975": _num(np.quantile(a, 0.975)) if a.size else None, "subsets": int(a.size)}
        pts.append(row)
    return {"definition": f"{n_subsets} random subsets of n windows per source (seeded), point estimates (Wilcoxon by "
                          "the normal approximation); mean and 2.5-97.5 % range over the subsets",
            "points": pts,
            "slope_per_10_windows": _slope([(p["windows"], p["across_sources"]["mean"]) for p in pts])}


def matched_control(cube: Cube, point: dict, boot: dict | None, sources: list[str], matched: dict[str, list]) -> dict:
    """The across-sources headline at matched congestion: source a's region ra is compared with source b's region
    rb whose mean queue is closest (``matched``: ``{"a vs b": [(ra, rb, queue_a, queue_b), ...]}``, from
    :func:`portbench.study.analysis.hygiene.matched_queue`) instead of with b's same-rho region; ``point`` /
    ``boot``: the headline's side classes (:func:`source_classes`)."""
    ri = {r: i for i, r in enumerate(cube.regions)}
    pc = np.zeros(4, dtype=np.int64)
    bc = np.zeros((next(iter(boot.values())).shape[0], 4), dtype=np.int64) if boot else None
    used = []
    for a, b in combinations(sources, 2):
        for ra, rb, qa, qb in matched.get(f"{a} vs {b}", []):
            pc += _counts(stats.four_way(point[a][ri[ra]], point[b][ri[rb]]), None)
            if bc is not None:
                bc += _counts(stats.four_way(boot[a][:, ri[ra]], boot[b][:, ri[rb]]), (1, 2))
            used.append({"pair": f"{a} vs {b}", "region_a": ra, "region_b": rb, "queue_a": _num(qa), "queue_b": _num(qb)})
    return {"concordance": {"across_sources": _conc_stat(pc, bc, "at matched congestion (each region of a source "
                                                                "against the other source's region of closest mean queue)")},
            "four_way": {"across_sources": _share_block(pc)}, "matched_regions": used}


def token_budget(cube: Cube, point: dict, sources: list[str], metric_idx) -> dict | None:
    """The token budget as an engine factor, apart from ordering: ``sarathi`` is FCFS order with a small token
    budget, so the pair (fcfs, sarathi) differs in the budget alone. Per headline metric and source, how its sides
    are classified over the regions (fcfs better / sarathi better / equivalent / undetermined)."""
    if not {"fcfs", "sarathi"} <= set(cube.schedulers):
        return None
    K = len(cube.schedulers)
    ia, ib = np.triu_indices(K, 1)
    i, j = sorted((cube.schedulers.index("fcfs"), cube.schedulers.index("sarathi")))
    p = int(np.flatnonzero((ia == i) & (ib == j))[0])
    a = cube.schedulers[i]
    out: dict = {"definition": "sarathi = fcfs's order with a 512-token budget instead of the engine's: the pair measures "
                         "the budget alone; per headline metric and source, the pair's side classes over the regions",
           "by_metric": {}}
    for mi, m in enumerate(metric_idx):
        row = {}
        for s in sources:
            c = point[s][:, mi, p]
            better = {stats.STRONG_A: a, stats.STRONG_B: "sarathi" if a == "fcfs" else "fcfs"}
            row[s] = {f"{better[stats.STRONG_A]}_better": int(np.sum(c == stats.STRONG_A)),
                      f"{better[stats.STRONG_B]}_better": int(np.sum(c == stats.STRONG_B)),
                      "equivalent": int(np.sum(c == stats.EQUIVALENT)), "undetermined": int(np.sum(c == stats.UNDETERMINED))}
        out["by_metric"][cube.metrics[m]] = row
    return out


def breakdown_table(block: dict) -> pl.DataFrame:
    """The headline block's breakdowns as one table: kind, grouping, group, the four shares, concordance with its
    interval and the number of comparisons strong on both sides (for notebooks 04 and 10)."""
    rows = []
    for kind in ("across_sources", "across_regions"):
        top = (block.get("concordance") or {}).get(kind) or {}
        fw = (block.get("four_way") or {}).get(kind)
        if fw:
            rows.append((kind, "all", "all", *(fw[k]["share"] for k in stats.FOUR_WAY), fw["total"], top.get("value"),
                         *(top.get("ci") or [None, None]), top.get("n")))
        for grouping, groups in ((block.get("breakdowns") or {}).get(kind) or {}).items():
            for name, v in groups.items():
                f = v["four_way"]
                rows.append((kind, grouping.removeprefix("by_"), name, *(f[k]["share"] for k in stats.FOUR_WAY),
                             f["total"], v.get("value"), *(v.get("ci") or [None, None]), v.get("n")))
    schema = {"kind": pl.String, "grouping": pl.String, "group": pl.String, "same_order": pl.Float64,
              "reversal": pl.Float64, "one_side": pl.Float64, "neither": pl.Float64, "comparisons": pl.Int64,
              "concordance": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "strong_on_both": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def windows_table(block: dict) -> pl.DataFrame:
    """The headline as a function of windows per source (``by_windows``) as a table."""
    rows = []
    for p in (block.get("by_windows") or {}).get("points", []):
        for kind in ("across_sources", "across_regions"):
            c = p.get(kind) or {}
            fw = (p.get("four_way") or {}).get(kind) or {}
            rows.append((p["windows"], kind, c.get("value"), *(c.get("ci") or [None, None]), c.get("n"),
                         (fw.get("reversal") or {}).get("share"), (p.get("sides") or {}).get("strong"),
                         (p.get("sides") or {}).get("equivalent")))
    schema = {"windows": pl.Int64, "kind": pl.String, "concordance": pl.Float64, "ci_low": pl.Float64,
              "ci_high": pl.Float64, "strong_on_both": pl.Int64, "reversal_share": pl.Float64,
              "pairs_strong": pl.Float64, "pairs_equivalent": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def controls_table(controls: dict) -> pl.DataFrame:
    """Every control of ``summary.json["controls"]`` with its concordance across sources and regions."""
    rows = []
    for name, c in controls.items():
        cc = c.get("concordance") if "concordance" in c else (c if name == "headline" else None)
        if name == "token_budget":
            continue                       # a factor apart from ordering: its own table (notebook 04)
        if not cc:
            rows.append((name, None, None, None, None, None, None, c.get("reason")))
            continue
        s, r = cc.get("across_sources") or {}, cc.get("across_regions") or {}
        note = c.get("dropped") or c.get("jittered_sources") or [f"{k} -> {v}" for k, v in (c.get("replaced") or {}).items()]
        rows.append((name, s.get("value"), *(s.get("ci") or [None, None]), r.get("value"), *(r.get("ci") or [None, None]),
                     ", ".join(note)))
    schema = {"control": pl.String, "across_sources": pl.Float64, "as_ci_low": pl.Float64, "as_ci_high": pl.Float64,
              "across_regions": pl.Float64, "ar_ci_low": pl.Float64, "ar_ci_high": pl.Float64, "note": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row")


def lag1(cube: Cube, metric_idx, reference: str = "fcfs", windows=None) -> dict[str, tuple[int, np.ndarray]]:
    """Per source: the number of windows and the lag-1 autocorrelations (one per region x metric with enough
    finite, varying values) of the reference policy's per-window values in trace order (``windows``: per source
    the positions used)."""
    if reference not in cube.schedulers:
        return {}
    k = cube.schedulers.index(reference)
    out = {}
    for s in cube.sources:
        x = cube.values[s][:, metric_idx, k, :]                           # (R, M, W), windows in id (= trace) order
        if windows is not None:
            x = x[..., np.asarray(windows[s])]
        n = x.shape[-1]
        r1 = []
        for v in x.reshape(-1, n):
            v = v[np.isfinite(v)]
            if v.size >= 4 and np.std(v) > 0:
                r1.append(float(np.corrcoef(v[:-1], v[1:])[0, 1]))
        if r1:
            out[s] = (int(n), np.asarray(r1))
    return out


def block_lengths(cube: Cube, metric_idx, reference: str = "fcfs", windows=None) -> dict[str, int]:
    """Per source, the block length of the block bootstrap: the AR(1) variance inflation (1 + r1) / (1 - r1) of
    the median lag-1 autocorrelation r1 (:func:`lag1`) -- the windows that are worth about one independent
    window -- rounded, at least 1 (no positive correlation: the ordinary bootstrap), at most half the windows."""
    out = {}
    for s, (n, r) in lag1(cube, metric_idx, reference, windows).items():
        r1 = float(np.median(r))
        L = 1 if r1 <= 0 else int(round((1 + r1) / (1 - r1))) if r1 < 1 else n
        out[s] = int(min(max(L, 1), max(n // 2, 1)))
    for s in cube.sources:
        out.setdefault(s, 1)
    return out


def effective_windows(cube: Cube, metric_idx, reference: str = "fcfs") -> dict:
    """Per source, how many independent windows its windows are worth: the lag-1 autocorrelation r1 of the reference
    policy's per-window values in trace order (the windows are stride-sampled, so neighbours are close in time and
    may share a trace hour), and the AR(1) effective sample size n (1 - r1) / (1 + r1) (clipped to [1, n]); medians
    over regions x headline metrics."""
    if reference not in cube.schedulers:
        return {}
    out: dict = {"definition": f"{reference}'s per-window values in trace order: lag-1 autocorrelation r1 and the AR(1) "
                         "effective number of windows n (1 - r1) / (1 + r1), medians over regions x headline metrics",
           "by_source": {}}
    for s, (n, r) in lag1(cube, metric_idx, reference).items():
        ess = np.clip(n * (1 - r) / (1 + r), 1, n)
        out["by_source"][s] = {"windows": int(n), "lag1_autocorrelation": _num(np.median(r)),
                               "effective_windows": _num(np.median(ess))}
    return out
