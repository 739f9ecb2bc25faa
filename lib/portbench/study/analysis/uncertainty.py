"""Uncertainty that includes the sources, and the "one side" class split (issue #39).

The headline's bootstrap resamples windows within each source; it cannot see the dominant variation, which sources
happen to be in the panel (three). Beside the pooled interval this module reports, from the headline's own side
classes and resamples (:func:`portbench.study.analysis.ports.source_classes`):

* **per source pair** the concordance with its interval, and their range;
* **leave one source out**: the across-sources concordance of the panel without each source, with its interval, and
  their range;
* the **basic** bootstrap interval (2 x point - the percentile bounds) beside the percentile one: where the two
  disagree much, the resampling distribution is skewed or the point sits at its edge;
* **"strong on one side only" split** into strong vs equivalent (the other side is shown to be within +-delta) and
  strong vs undetermined (the other side could not tell), per source pair and by which source is the strong one.

A statistic that does not vary over the resamples (every resample gives the point) has ``ci_degenerate: true``:
printers show it as a point, not as ``64 % [64, 64]``.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from .. import stats
from .common import _num


def interval_entry(point_counts, boot_counts) -> dict:
    """``{value, n, ci (percentile), ci_basic, ci_degenerate}`` of the concordance from counts (4,) and (B, 4)."""
    v = float(stats.concordance(point_counts))
    c = np.asarray(point_counts)
    out: dict = {"value": _num(v), "n": int(c[0] + c[1]), "reversals": int(c[1])}
    if boot_counts is None or not np.isfinite(v):
        return {**out, "ci": [None, None], "ci_basic": [None, None], "ci_degenerate": None}
    bc = stats.concordance(boot_counts)
    lo, hi = stats.percentile_ci(bc)
    out["ci"] = [_num(lo), _num(hi)]
    out["ci_basic"] = [_num(min(max(2 * v - hi, 0.0), 1.0)), _num(min(max(2 * v - lo, 0.0), 1.0))]
    fin = bc[np.isfinite(bc)]
    out["ci_degenerate"] = bool(fin.size and np.all(fin == fin[0]))
    return out


def _pair_counts(point: dict, boot: dict | None, sources: list[str]) -> dict:
    out = {}
    for a, b in combinations(sources, 2):
        pc = stats.four_way_counts(stats.four_way(point[a], point[b]))
        bc = None
        if boot is not None:
            fw = stats.four_way(boot[a], boot[b])
            bc = stats.four_way_counts(fw, axis=tuple(range(1, fw.ndim)))
        out[(a, b)] = (pc, bc)
    return out


def sources_uncertainty(point: dict, boot: dict | None, sources: list[str]) -> dict:
    """``summary.json["headline"]["uncertainty"]``: per source pair, leave one source out, the pooled interval by
    percentile and basic bootstrap, and the ranges."""
    pcs = _pair_counts(point, boot, sources)
    if not pcs:
        return {"available": False, "reason": "fewer than two sources"}
    pooled_p = sum(v[0] for v in pcs.values())
    pooled_b = sum(v[1] for v in pcs.values()) if boot is not None else None
    per_pair = {f"{a} vs {b}": interval_entry(pc, bc) for (a, b), (pc, bc) in pcs.items()}
    loo = {}
    if len(sources) >= 3:
        for s in sources:
            keep = [(k, v) for k, v in pcs.items() if s not in k]
            pc = sum(v[0] for _, v in keep)
            bc = sum(v[1] for _, v in keep) if boot is not None else None
            loo[s] = interval_entry(pc, bc)

    def rng(d):
        v = [e["value"] for e in d.values() if e["value"] is not None]
        return [min(v), max(v)] if v else [None, None]

    return {"definition": "across sources: the pooled concordance with its percentile and basic bootstrap intervals "
                          "(windows resampled within each source), beside the spread that comes from WHICH sources are "
                          "compared: each source pair alone, and the panel without each source (leave one out)",
            "pooled": interval_entry(pooled_p, pooled_b), "by_source_pair": per_pair, "source_pair_range": rng(per_pair),
            "leave_one_source_out": loo, "leave_one_out_range": rng(loo) if loo else [None, None]}


def one_side_split(point: dict, sources: list[str]) -> dict:
    """The comparisons strong on one side only, split by what the other side is: equivalent (shown within +-delta)
    or undetermined (the tests could not tell), overall and per source pair with which source is the strong one."""
    tot = {"strong_vs_equivalent": 0, "strong_vs_undetermined": 0}
    per = {}
    for a, b in combinations(sources, 2):
        ca, cb = point[a], point[b]
        sa, sb = np.abs(ca) == 1, np.abs(cb) == 1
        na = (ca == stats.NOT_APPLICABLE) | (cb == stats.NOT_APPLICABLE)
        row = {}
        for strong, other, sname in ((sa & ~sb, cb, a), (sb & ~sa, ca, b)):
            m = strong & ~na
            eq = int(np.sum(m & (other == stats.EQUIVALENT)))
            un = int(np.sum(m & (other == stats.UNDETERMINED)))
            row[f"strong_on_{sname}"] = {"vs_equivalent": eq, "vs_undetermined": un}
            tot["strong_vs_equivalent"] += eq
            tot["strong_vs_undetermined"] += un
        per[f"{a} vs {b}"] = row
    n = sum(tot.values())
    return {"definition": "comparisons strong on one side only, by the other side's class: equivalent (the TOST "
                          "shows the difference within +-delta: the order is absent there) or undetermined (the tests "
                          "cannot tell: the order may be there, unresolved)",
            "total": n, **{k: {"count": v, "share": _num(v / n) if n else None} for k, v in tot.items()},
            "by_source_pair": per}
