"""Like with like: concordance as a function of the distance between the two conditions' congestion (issue #39).

"Across regions" compares two loads of one source, "across sources" two sources at the same rho. But rho is not the
same congestion on every source (the reference policy's mean queue at one rho differs by orders of magnitude between
sources), and most region pairs are far apart in load. So every comparison gets a **load distance**: the difference
of the two conditions' congestion, ``|log(1 + q1) - log(1 + q2)|`` with q the reference policy's time-averaged
queue (``summary.json["congestion"]``), and the concordance is shown per distance bin:

* **across regions** of one source (every region pair), also by region steps (adjacent = 1);
* **across sources at equal rho** (the headline's comparisons);
* **across sources at any rho** (each region of one source against each region of the other: the comparisons at
  matched congestion are the ones at small distance).

The headline's like-with-like gap: across sources minus across regions **at the same distance** -- the regions'
per-bin concordance re-weighted to the distribution of the across-sources comparisons over the bins (direct
standardisation), so that the sources are not compared with mostly-adjacent regions. Intervals from the headline's
window resamples (point classes and resampled classes of :func:`portbench.study.analysis.ports.source_classes`).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from .. import stats
from .common import _num
from .uncertainty import interval_entry

BINS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, np.inf)   # |delta log(1 + mean queue)|


def _bin(d: float) -> int:
    return int(np.searchsorted(BINS, d, side="right") - 1)


def _label(i: int) -> str:
    hi = BINS[i + 1]
    return f"[{BINS[i]:g}, {hi:g})" if np.isfinite(hi) else f">= {BINS[i]:g}"


def queue_of(congestion: dict, source: str, region: str) -> float | None:
    q = ((congestion.get("by_source_region") or {}).get(source, {}).get(region) or {}).get("queue_mean")
    return None if q is None else float(q)


def comparisons(point: dict, boot: dict | None, sources: list[str], regions: list[str], congestion: dict):
    """Every comparison group ``(kind, distance, steps, counts (4,), boot counts (B, 4) | None, label)``: one per
    (source, region pair) across regions, per (source pair, region pair) across sources (equal rho: the same
    region)."""
    out = []

    def add(kind, qa, qb, steps, ca, cb, ba, bb, label):
        if qa is None or qb is None:
            return
        pc = stats.four_way_counts(stats.four_way(ca, cb))
        bc = None
        if ba is not None:
            fw = stats.four_way(ba, bb)
            bc = stats.four_way_counts(fw, axis=tuple(range(1, fw.ndim)))
        out.append((kind, abs(np.log1p(qa) - np.log1p(qb)), steps, pc, bc, label))

    for s in sources:
        for i, j in combinations(range(len(regions)), 2):
            add("across_regions", queue_of(congestion, s, regions[i]), queue_of(congestion, s, regions[j]), j - i,
                point[s][i], point[s][j], None if boot is None else boot[s][:, i], None if boot is None else boot[s][:, j],
                f"{s}: {regions[i]} vs {regions[j]}")
    for a, b in combinations(sources, 2):
        for i in range(len(regions)):
            for j in range(len(regions)):
                kind = "across_sources_equal_rho" if i == j else "across_sources_other_rho"
                add(kind, queue_of(congestion, a, regions[i]), queue_of(congestion, b, regions[j]), abs(j - i),
                    point[a][i], point[b][j], None if boot is None else boot[a][:, i],
                    None if boot is None else boot[b][:, j], f"{a} {regions[i]} vs {b} {regions[j]}")
    return out


def _sum(rows, boot: bool):
    pc = sum(r[3] for r in rows)
    bc = sum(r[4] for r in rows) if boot and rows and rows[0][4] is not None else None
    return pc, bc


def load_distance(point: dict, boot: dict | None, sources: list[str], regions: list[str], congestion: dict) -> dict:
    """``summary.json["load_distance"]``: per distance bin the concordance across regions, across sources at equal
    rho and across sources at any rho (with intervals); across regions by region steps; and the like-with-like gap."""
    rows = comparisons(point, boot, sources, regions, congestion)
    if not rows:
        return {"available": False, "reason": "no congestion (mean queue) recorded for the headline panel"}
    has_boot = boot is not None
    kinds = {"across_regions": [r for r in rows if r[0] == "across_regions"],
             "across_sources_equal_rho": [r for r in rows if r[0] == "across_sources_equal_rho"],
             "across_sources_any_rho": [r for r in rows if r[0].startswith("across_sources")]}
    bins: dict = {}
    for k, rs in kinds.items():
        bins[k] = {}
        for i in range(len(BINS) - 1):
            sel = [r for r in rs if _bin(r[1]) == i]
            if not sel:
                continue
            pc, bc = _sum(sel, has_boot)
            e = interval_entry(pc, bc)
            e["comparisons"] = int(pc.sum())
            e["groups"] = len(sel)
            e["mean_distance"] = _num(np.mean([r[1] for r in sel]))
            bins[k][_label(i)] = e
    steps = {}
    for st in sorted({r[2] for r in kinds["across_regions"]}):
        pc, bc = _sum([r for r in kinds["across_regions"] if r[2] == st], has_boot)
        steps[str(st)] = interval_entry(pc, bc)

    def standardised(target: str) -> dict:
        """Regions' concordance re-weighted to ``target``'s weights (comparisons strong on both) over the bins both
        have, and the target's own over those bins; the gap target - regions, each with an interval."""
        labs = [lab for lab in bins[target] if lab in bins["across_regions"] and bins[target][lab]["n"]
                and bins["across_regions"][lab]["n"]]
        if not labs:
            return {"available": False, "reason": "no distance bin holds both kinds of comparison"}
        w = np.array([bins[target][lab]["n"] for lab in labs], float)
        w /= w.sum()
        reg_rows = {lab: [r for r in kinds["across_regions"] if _label(_bin(r[1])) == lab] for lab in labs}
        tgt_rows = {lab: [r for r in kinds[target] if _label(_bin(r[1])) == lab] for lab in labs}

        def conc_of(rs, boot_=False):
            pc, bc = _sum(rs, boot_)
            return stats.concordance(pc), (stats.concordance(bc) if bc is not None else None)

        reg = [conc_of(reg_rows[lab], has_boot) for lab in labs]
        tgt = [conc_of(tgt_rows[lab], has_boot) for lab in labs]
        r_point = float(np.sum(w * np.array([r[0] for r in reg])))
        t_point = float(np.sum(w * np.array([t[0] for t in tgt])))
        out = {"bins": labs, "weights": [_num(x) for x in w], "sources": _num(t_point), "regions_same_distance": _num(r_point),
               "gap": _num(t_point - r_point)}
        if has_boot:
            rb = np.sum(w[:, None] * np.stack([np.nan_to_num(r[1], nan=r[0]) for r in reg]), axis=0)
            tb = np.sum(w[:, None] * np.stack([np.nan_to_num(t[1], nan=t[0]) for t in tgt]), axis=0)
            lo, hi = stats.percentile_ci(tb - rb)
            out["gap_ci"] = [_num(lo), _num(hi)]
        return out

    all_reg = interval_entry(*_sum(kinds["across_regions"], has_boot))
    all_src = interval_entry(*_sum(kinds["across_sources_equal_rho"], has_boot))
    return {
        "available": True,
        "definition": "load distance of a comparison = |log(1 + q1) - log(1 + q2)|, q = the reference policy's "
                      "time-averaged queue of each condition (summary.json congestion); concordance per distance bin; "
                      "the gap at equal distance = across sources minus across regions re-weighted to the sources' "
                      "distribution over the bins (comparisons strong on both as weights)",
        "bins": [_label(i) for i in range(len(BINS) - 1)],
        "by_distance": bins, "across_regions_by_steps": steps,
        "pooled": {"across_sources_equal_rho": all_src, "across_regions": all_reg,
                   "gap_pooled": _num(all_src["value"] - all_reg["value"])
                   if all_src["value"] is not None and all_reg["value"] is not None else None},
        "like_with_like": {"equal_rho": standardised("across_sources_equal_rho"),
                           "any_rho": standardised("across_sources_any_rho")},
    }
