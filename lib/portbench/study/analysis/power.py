"""Resolution and power of the paired side tests: can a test reach alpha with the windows given, and which
effect would the run's windows per source (``analysis.power.windows``: auto = the fewest a source has) detect?

**Resolution.** The exact two-sided Wilcoxon signed-rank test over n non-zero differences cannot give a
p-value below ``2 / 2^n`` (n = 5: 0.0625). When that floor is at or above alpha for a source, no side test
of that source can reject, every ranking is all tied under the significance rule and every reversal count is
zero *by construction*: :func:`resolution` says so, and :func:`warn` raises a :class:`ResolutionWarning`
(shown in the terminal and in the notebooks).

**Minimal detectable effect** (:func:`mde`), by simulation on planted effects with the study's own noise:
for a headline metric, every scheduler pair x source x region whose per-window values differ gives a
*null* pair: the pair's per-window log-ratios (ratio metrics) or differences (proportions, counts), centred
at their Hodges-Lehmann location (the centre the Wilcoxon test is about), applied to the second scheduler's values (``a0_w = b_w * exp(c_w)`` or ``b_w + c_w``). An
effect ``e`` is planted by making ``a0`` better by e (ratio: its symmetric relative difference to a0 is e;
proportions: e percentage points; counts: e of the window's requests) and the pair is tested exactly as the
analysis does (Wilcoxon on the raw oriented differences, rejection in the direction of the effect). Power at
e = the fraction of null pairs in which the test rejects, at alpha (one test) and at alpha / m (the first
step of Holm and of Benjamini-Hochberg in a per-metric family of m tests: a lower bound of the corrected
power). With a number of windows other than ``analysis.power.windows``, the centred values are resampled
to that many windows (seeded). The MDE is the smallest effect reaching the target power (linear
interpolation on the grid); pairs that are identical on every window (e.g. at light load) are counted, not
used: any effect is visible there.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from .. import stats
from .common import _num
from .cube import Cube

RATIO_GRID = (0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
ABS_GRID = (0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5)


class ResolutionWarning(UserWarning):
    """A paired test cannot reach alpha with the windows given: its counts are zero by construction."""


def resolution(cube: Cube, side: dict, cfg: dict, head: list[int], family_size: int) -> dict:
    """The ``resolution`` part of the ``power`` section: per source the smallest attainable p-value, whether a
    test can reach alpha at all and after the first correction step, and how many side tests cannot."""
    alpha = cfg["alpha"]
    per_source, msgs, notes = {}, [], []
    for s in cube.sources:
        n = len(cube.windows[s])
        pmin = float(stats.min_wilcoxon_p(n))
        nz = side[s]["test"].n_nonzero[:, head] if head else side[s]["test"].n_nonzero
        short = int((stats.min_wilcoxon_p(nz) >= alpha).sum())
        per_source[s] = {"n_windows": n, "min_p": _num(pmin), "reaches_alpha": bool(pmin < alpha),
                         "reaches_alpha_over_m": bool(pmin < alpha / max(family_size, 1)),
                         "side_tests_that_cannot_reach_alpha": short, "side_tests": int(nz.size)}
        if pmin >= alpha:
            msgs.append(f"{cube.label(s)}: with {n} windows the smallest possible two-sided Wilcoxon p-value is "
                        f"2/2^{n} = {pmin:.3g} >= alpha = {alpha}: no paired test can reject, so every ranking "
                        "is all tied under the significance rule and every reversal count is 0 by construction, "
                        "not because the schedulers agree")
        elif pmin >= alpha / max(family_size, 1):
            notes.append(f"{cube.label(s)}: with {n} windows the smallest possible Wilcoxon p-value {pmin:.3g} is above "
                        f"alpha / m = {alpha / family_size:.3g} (m = {family_size} tests in a family): Holm cannot "
                        "reject anything, and Benjamini-Hochberg only when many tests reach the floor together")
    return {"definition": "the exact two-sided Wilcoxon signed-rank test over n non-zero paired differences cannot "
                          "give p < 2/2^n; side tests counted here have too few non-zero differences to reach alpha",
            "alpha": alpha, "family_size": family_size, "by_source": per_source, "warnings": msgs, "notes": notes}


def warn(res: dict) -> None:
    """Raise a :class:`ResolutionWarning` for each message of :func:`resolution`."""
    for m in res["warnings"]:
        warnings.warn(m, ResolutionWarning, stacklevel=3)


def hodges_lehmann(x) -> float:
    """The Hodges-Lehmann location of ``x``: the median of its Walsh averages (x_i + x_j) / 2, i <= j — the
    centre the Wilcoxon signed-rank test is about, so centred values are a null for it."""
    x = np.asarray(x, dtype=float)
    i, j = np.triu_indices(x.size)
    return float(np.median((x[i] + x[j]) / 2.0))


def _null_pairs(cube: Cube, m: int, n_target: int, seed: int, sources: list[str]):
    """Null pairs of metric ``m``: (b, c, region index) arrays of shape (V, n_target), plus the number of
    pairs left out because the two schedulers are identical on every window."""
    sc = cube.scales[m]
    ia, ib = np.triu_indices(len(cube.schedulers), 1)
    rng = np.random.default_rng([seed, m, n_target])
    bs, cs, regs, identical = [], [], [], 0
    for s in [x for x in sources if x in cube.values]:
        raw = cube.values[s][:, m]                                              # (R, K, W)
        a, b = raw[:, ia], raw[:, ib]                                           # (R, P, W)
        for r in range(a.shape[0]):
            for q in range(a.shape[1]):
                ok = ~np.isnan(a[r, q]) & ~np.isnan(b[r, q])
                x, y = a[r, q][ok], b[r, q][ok]
                if x.size < 2:
                    continue
                if sc == "ratio":
                    if np.any(x <= 0) or np.any(y <= 0):
                        continue
                    c = np.log(x / y)
                else:
                    c = x - y
                if np.all(c == 0):
                    identical += 1
                    continue
                c = c - hodges_lehmann(c)
                if x.size != n_target:
                    idx = rng.integers(0, x.size, n_target)
                    c, y = c[idx], y[idx]
                bs.append(y)
                cs.append(c)
                regs.append(r)
    if not bs:
        return np.zeros((0, n_target)), np.zeros((0, n_target)), np.zeros(0, int), identical
    return np.array(bs), np.array(cs), np.array(regs), identical


def planted_power(b, c, effects, scale: str, direction: str, alphas, size: float = 1.0) -> np.ndarray:
    """Power of the side test at every planted effect: ``(len(effects), len(alphas), V)`` booleans (rejected).

    ``b`` ``(V, W)``: the second scheduler's values; ``c``: centred log-ratios (ratio) or differences;
    the first scheduler is ``b * exp(c)`` or ``b + c`` made better by each effect (see the module docstring).
    """
    sign = stats.ORIENTATION[direction]
    out = np.zeros((len(effects), len(alphas), b.shape[0]), dtype=bool)
    for k, e in enumerate(effects):
        if scale == "ratio":
            f = (2 + e) / (2 - e) if sign > 0 else (2 - e) / (2 + e)            # relative effect e between means
            a = b * np.exp(c) * f
        else:
            a = b + c + sign * e * (size if scale == "count" else 1.0)
        d = sign * (a - b)
        t = stats.paired_wilcoxon(d)
        for j, al in enumerate(alphas):
            out[k, j] = stats.side_significant(t.pvalue, t.direction, d.mean(axis=-1), al)
    return out


def _interp_mde(effects, power, target: float):
    """Smallest effect with power >= target, linearly interpolated on the grid (None if never reached)."""
    effects, power = np.asarray(effects, float), np.asarray(power, float)
    hit = np.flatnonzero(power >= target)
    if not hit.size:
        return None
    k = hit[0]
    if k == 0:
        return float(effects[0])
    e0, e1, p0, p1 = effects[k - 1], effects[k], power[k - 1], power[k]
    return float(e0 + (target - p0) * (e1 - e0) / (p1 - p0)) if p1 > p0 else float(e1)


def mde(cube: Cube, cfg: dict, head: list[int], family_size: int, sources: list[str] | None = None
        ) -> tuple[dict, pl.DataFrame]:
    """Minimal detectable effect of one side test for every headline metric (overall and per region) at
    ``analysis.power.windows`` windows per source, on the noise of ``sources`` (default: every source), and the
    power curves behind it."""
    sources = list(sources or cube.sources)
    n_target, target, alpha = cfg["power"]["windows"], cfg["power"]["target"], cfg["alpha"]
    if n_target == "auto":      # the windows this run has: the fewest of any source (a user's small trace: its own)
        n_target = min((int(cube.values[s].shape[-1]) for s in sources if s in cube.values), default=2)
    alphas = (alpha, alpha / max(family_size, 1))
    out, rows = {}, []
    for m in head:
        metric, sc = cube.metrics[m], cube.scales[m]
        grid = RATIO_GRID if sc == "ratio" else ABS_GRID
        b, c, regs, identical = _null_pairs(cube, m, n_target, cfg["seed"], sources)
        unit = "relative difference" if sc == "ratio" else (
            "percentage points" if sc == "proportion" else f"points of the {cfg['window_size']}-request window")
        entry = {"scale": sc, "unit": unit, "null_pairs": int(b.shape[0]), "identical_pairs": identical,
                 "windows": n_target, "target_power": target}
        if not b.shape[0]:
            out[metric] = {**entry, "mde": None, "mde_family": None, "by_region": {}}
            continue
        det = planted_power(b, c, grid, sc, cube.directions[m], alphas, cfg["window_size"])   # (E, 2, V)
        pw = det.mean(axis=-1)                                                   # (E, 2)
        by_region = {}
        for r, region in enumerate(cube.regions):
            sel = regs == r
            if not sel.any():
                continue
            pr = det[:, :, sel].mean(axis=-1)
            by_region[region] = {"mde": _num(_interp_mde(grid, pr[:, 0], target)),
                                 "mde_family": _num(_interp_mde(grid, pr[:, 1], target)), "null_pairs": int(sel.sum())}
            rows += [{"metric": metric, "region": region, "effect": e, "power": float(pr[k, 0]),
                      "power_family": float(pr[k, 1])} for k, e in enumerate(grid)]
        rows += [{"metric": metric, "region": "all", "effect": e, "power": float(pw[k, 0]),
                  "power_family": float(pw[k, 1])} for k, e in enumerate(grid)]
        out[metric] = {**entry, "mde": _num(_interp_mde(grid, pw[:, 0], target)),
                       "mde_family": _num(_interp_mde(grid, pw[:, 1], target)), "by_region": by_region}
    curves = pl.DataFrame(rows, schema={"metric": pl.Utf8, "region": pl.Utf8, "effect": pl.Float64,
                                        "power": pl.Float64, "power_family": pl.Float64})
    return {"sources": sources, "definition": f"smallest planted effect a single side test detects with power {target:g} at {n_target} "
                          f"windows per source, with the study's own per-window noise (null pairs: every scheduler "
                          f"pair x source x region whose values differ); mde at alpha = {alpha}, mde_family at "
                          f"alpha / m (m = {family_size}, the first step of Holm and Benjamini-Hochberg; an upper "
                          "bound of the corrected MDE)",
            "alpha": alpha, "alpha_family": alphas[1], "by_metric": out}, curves
