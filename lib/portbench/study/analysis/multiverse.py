"""The forks of the headline shown (issue #39): the concordance and four-way shares over every reasonable choice.

The headline (:mod:`.ports`) rests on choices made by the analysis plan: the headline metric set, the practical
size delta, the correction within each ranking and the tie rule (what makes a side *strong*). Only alpha and delta
were fixed before any result was seen (the plan's change log says which choice came after which result). This module
re-computes the headline's point estimates over the grid of those choices -- a *multiverse* -- with the plan's choice
marked, so that a reader sees how far the number moves when a reasonable analyst had chosen otherwise:

* **metric sets**: the first design's (``slo_medium, ttft_p99, e2e_mean, jain_fairness``, of 2026-11-29; its
  ``jain_fairness`` is today's ``slowdown_jain``), today's (the plan's ``headline_metrics``) and each of their
  metrics alone;
* **delta**: 2.5, 5, 10 and 20 % (relative for ratio metrics, the same number of percentage points for proportions);
* **correction** within each ranking's scheduler pairs: Benjamini-Hochberg, Holm, none;
* **tie rule** (what a strong side is): ``test_and_delta`` (the plan's: the Wilcoxon test rejects and the effect is
  at least delta), ``test_only`` (the test rejects, any effect), ``delta_only`` (the effect is at least delta, no test).

The side classes of one (source, region, metric) ranking depend on that ranking's tests only (the correction runs
over its scheduler pairs), so every metric is tested once (:func:`side_inputs`, scipy's exact Wilcoxon as in the
headline) and each fork is a re-classification of stored p-values (:func:`fork_classes`): the whole grid costs
about as much as one headline. Point estimates only: the headline's intervals are in ``summary.json["headline"]``.
The same machinery gives the per-metric (``by_metric``) and per-percentile (``by_percentile``) headlines.
"""

from __future__ import annotations

import warnings
from itertools import product

import numpy as np

from .. import stats
from .common import _num
from .cube import Cube

FIRST_DESIGN = ("slo_medium", "ttft_p99", "e2e_mean", "slowdown_jain")   # 2026-11-29, commit b37f354 (jain_fairness)
DELTAS = (0.025, 0.05, 0.10, 0.20)
CORRECTIONS = ("fdr_bh", "holm", "none")
TIE_RULES = ("test_and_delta", "test_only", "delta_only")
TIE_RULE_TEXT = {
    "test_and_delta": "strong = paired Wilcoxon significant after the correction AND effect >= delta (the plan's)",
    "test_only": "strong = paired Wilcoxon significant after the correction, any effect",
    "delta_only": "strong = mean effect >= delta, no test",
}
PERCENTILES = ("ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99")


def side_inputs(cube: Cube, metric_idx, cfg: dict, na: dict, sources) -> dict[str, dict]:
    """Per source, what every fork's classification needs for the metrics ``metric_idx``: the oriented pair
    differences ``d`` (R, M, P, W), mean difference, both means, the Wilcoxon p-value and direction (scipy's exact
    or asymptotic choice, as the headline) and the pairs compared (``ok``)."""
    from .ports import _pair_ok

    K = len(cube.schedulers)
    ia, ib = np.triu_indices(K, 1)
    ok = _pair_ok(cube, na)
    sign = np.asarray(cube.sign[metric_idx], float)[:, None, None]
    out = {}
    for s in sources:
        raw = np.asarray(cube.values[s][:, metric_idx], float)            # (R, M, K, W)
        xo = raw * sign
        d = xo[..., ia, :] - xo[..., ib, :]
        both = ~np.isnan(d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ma = np.nanmean(np.where(both, raw[..., ia, :], np.nan), axis=-1)
            mb = np.nanmean(np.where(both, raw[..., ib, :], np.nan), axis=-1)
            diff = np.nanmean(d, axis=-1)
        test = stats.paired_wilcoxon(d)
        out[s] = {"d": d, "ma": ma, "mb": mb, "diff": diff, "p": np.where(ok[s], test.pvalue, np.nan),
                  "direction": test.direction, "ok": ok[s]}
    return out


def fork_classes(inp: dict, scales, delta: float, correction: str, tie_rule: str, *, alpha: float,
                 window_size: float, absolute_ratio: float = 1.0) -> np.ndarray:
    """The side classes (R, M, P) of one source (``inp`` from :func:`side_inputs`) under one fork: ``delta`` for
    ratio metrics (relative; proportions and counts: ``delta x absolute_ratio``, the plan's
    delta_absolute / delta), ``correction`` within each ranking,
    ``tie_rule`` (:data:`TIE_RULES`). With the plan's choices, equal to :func:`portbench.study.analysis.ports.classify`
    (``tests/test_multiverse.py``)."""
    from .ports import margins

    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie rule {tie_rule!r}: expected one of {TIE_RULES}")
    dl = np.array([float(delta) if sc == "ratio" else float(delta) * absolute_ratio for sc in scales])
    effect = np.empty(inp["diff"].shape)
    for m, sc in enumerate(scales):
        effect[:, m, :] = stats.effect_size(inp["ma"][:, m, :], inp["mb"][:, m, :], sc, window_size)
    p_tost = np.where(inp["ok"], stats.tost_paired(inp["d"], margins(inp["ma"], inp["mb"], scales, dl, window_size)),
                      np.nan)
    p_adj = stats.adjust_last_axis(inp["p"], correction)
    p_tost_adj = stats.adjust_last_axis(p_tost, correction)
    direction = inp["direction"]
    strong_delta = dl[:, None]
    if tie_rule == "test_only":
        strong_delta = np.zeros_like(strong_delta)
    elif tie_rule == "delta_only":
        p_adj = np.where(np.isnan(inp["p"]), np.nan, 0.0)
        direction = np.sign(inp["diff"])
    cls = stats.side_classes(p_adj, direction, inp["diff"], effect, p_tost_adj, alpha, strong_delta)
    return np.where(inp["ok"], cls, stats.NOT_APPLICABLE).astype(np.int8)


def counts_of(classes: dict[str, np.ndarray], sources: list[str], metrics=None) -> dict[str, np.ndarray]:
    """Four-way counts (4,) across sources and across regions of side classes (R, M, P) per source, over the metric
    positions ``metrics`` (default: all)."""
    from .ports import across_regions, across_sources

    sel = {s: (c if metrics is None else c[:, list(metrics)]) for s, c in classes.items()}
    R = next(iter(sel.values())).shape[0]
    out = {}
    sp, cs = across_sources(sel, sources)
    out["across_sources"] = stats.four_way_counts(cs) if len(sp) else np.zeros(4, np.int64)
    _, cr = across_regions(sel, sources, R)
    out["across_regions"] = stats.four_way_counts(cr)
    return out


def cell(counts: dict[str, np.ndarray]) -> dict:
    """Concordance, comparisons strong on both and the four shares of one fork's counts."""
    out = {}
    for k, c in counts.items():
        c = np.asarray(c, float)
        tot = c.sum()
        out[k] = {"concordance": _num(stats.concordance(c)), "strong_on_both": int(c[0] + c[1]),
                  "reversals": int(c[1]), "comparisons": int(tot),
                  **{f: _num(c[i] / tot) if tot else None for i, f in enumerate(stats.FOUR_WAY)}}
    return out


def metric_sets(cube: Cube, headline: list[str]) -> dict[str, list[str]]:
    """The metric sets of the multiverse: ``first_design``, ``plan`` (today's) and each of their metrics alone
    (those in the cube)."""
    first = [m for m in FIRST_DESIGN if m in cube.metrics]
    out = {"plan": list(headline)}
    if first:
        out["first_design"] = first
    for m in dict.fromkeys(list(headline) + first):
        out[m] = [m]
    return out


def multiverse(cube: Cube, cfg: dict, na: dict, sources: list[str], headline: list[str], *,
               deltas=DELTAS, corrections=CORRECTIONS, tie_rules=TIE_RULES, progress=None) -> dict:
    """``summary.json["multiverse"]``: the headline's concordance and four-way shares (across sources and across
    regions, ``sources``: the headline panel) for every fork of metric set x delta x correction x tie rule, the
    plan's fork marked, the range over the forks (all, and over the multi-metric sets), and the one-at-a-time
    table (the plan with one choice changed)."""
    sets = metric_sets(cube, headline)
    used = list(dict.fromkeys(m for v in sets.values() for m in v))
    idx = [cube.metrics.index(m) for m in used]
    scales = [cube.scales[i] for i in idx]
    inp = side_inputs(cube, idx, cfg, na, sources)
    plan = {"delta": float(cfg["delta"]), "correction": cfg["tie_correction"], "tie_rule": "test_and_delta",
            "metric_set": "plan"}
    dlist = sorted(set(deltas) | {plan["delta"]})
    clist = list(dict.fromkeys(list(corrections) + [plan["correction"]]))
    rows = []
    for dv, corr, rule in product(dlist, clist, tie_rules):
        cls = {s: fork_classes(inp[s], scales, dv, corr, rule, alpha=cfg["alpha"], window_size=cfg["window_size"],
                            absolute_ratio=_abs_ratio(cfg)) for s in sources}
        for name, ms in sets.items():
            pos = [used.index(m) for m in ms]
            c = cell(counts_of(cls, sources, pos))
            is_plan = (name == "plan" and abs(dv - plan["delta"]) < 1e-12 and corr == plan["correction"]
                       and rule == plan["tie_rule"])
            rows.append({"metric_set": name, "metrics": ms, "delta": dv, "correction": corr, "tie_rule": rule,
                         "plan": is_plan, **c})
        if progress:
            progress(f"multiverse: delta {dv:g}, {corr}, {rule}")

    def rng(rs, key="across_sources"):
        v = [r[key]["concordance"] for r in rs if r[key]["concordance"] is not None]
        if not v:
            return {"min": None, "max": None, "forks": 0}
        lo, hi = min(v), max(v)
        arg = [r for r in rs if r[key]["concordance"] in (lo, hi)]
        return {"min": lo, "max": hi, "forks": len(v),
                "min_fork": _fork_name(next(r for r in arg if r[key]["concordance"] == lo)),
                "max_fork": _fork_name(next(r for r in arg if r[key]["concordance"] == hi))}

    multi = [r for r in rows if len(r["metrics"]) > 1]
    plan_row = next(r for r in rows if r["plan"])
    one = []
    for key, values in (("metric_set", [k for k in sets if len(sets[k]) > 1]), ("delta", dlist),
                        ("correction", clist), ("tie_rule", list(tie_rules))):
        for v in values:
            want = {**plan, key: v}
            r = next(r for r in rows if r["metric_set"] == want["metric_set"] and abs(r["delta"] - want["delta"]) < 1e-12
                     and r["correction"] == want["correction"] and r["tie_rule"] == want["tie_rule"])
            one.append({"changed": key, "value": v, "plan": r["plan"], **{k: r[k] for k in ("across_sources",
                                                                                           "across_regions")}})
    return {
        "definition": "the headline's point estimates (concordance = same / (same + reversal), four-way shares) for "
                      "every fork of metric set x delta x correction (within each ranking) x tie rule; the plan's "
                      "fork marked `plan`; intervals: the headline's (summary.json headline)",
        "sources": list(sources), "metric_sets": sets,
        "metric_set_notes": {"first_design": "the first design's headline metrics (2026-11-29, commit b37f354), its "
                                             "jain_fairness being today's slowdown_jain",
                             "plan": "the analysis plan's headline_metrics (changed on 2026-12-01, after the first "
                                     "results had been seen; see the plan's change log)"},
        "deltas": dlist, "corrections": clist, "tie_rules": {k: TIE_RULE_TEXT[k] for k in tie_rules},
        "plan_fork": plan, "plan_value": plan_row,
        "range": {"across_sources": rng(rows), "across_regions": rng(rows, "across_regions")},
        "range_multi_metric": {"across_sources": rng(multi), "across_regions": rng(multi, "across_regions")},
        "one_at_a_time": one, "forks": rows,
    }


def _abs_ratio(cfg: dict) -> float:
    return float(cfg["delta_absolute"]) / float(cfg["delta"]) if cfg["delta"] else 1.0


def _fork_name(r: dict) -> str:
    return f"{r['metric_set']}, delta {100 * r['delta']:g}%, {r['correction']}, {r['tie_rule']}"


def by_metrics(mv: dict, names) -> dict:
    """The plan's fork for single metrics ``names`` (rows of the multiverse): ``{metric: cell}``."""
    pf = mv["plan_fork"]
    out = {}
    for r in mv["forks"]:
        if (r["metric_set"] in names and len(r["metrics"]) == 1 and abs(r["delta"] - pf["delta"]) < 1e-12
                and r["correction"] == pf["correction"] and r["tie_rule"] == pf["tie_rule"]):
            out[r["metric_set"]] = {k: r[k] for k in ("across_sources", "across_regions")}
    return {m: out[m] for m in names if m in out}


def percentile_block(cube: Cube, cfg: dict, na: dict, sources: list[str]) -> dict:
    """``summary.json["by_percentile"]``: the headline (plan's fork) on TTFT at p50 / p90 / p95 / p99 alone."""
    names = [m for m in PERCENTILES if m in cube.metrics]
    if not names:
        return {"available": False, "reason": "no TTFT percentile metrics in the runs"}
    idx = [cube.metrics.index(m) for m in names]
    inp = side_inputs(cube, idx, cfg, na, sources)
    scales = [cube.scales[i] for i in idx]
    cls = {s: fork_classes(inp[s], scales, cfg["delta"], cfg["tie_correction"], "test_and_delta", alpha=cfg["alpha"],
                           window_size=cfg["window_size"], absolute_ratio=_abs_ratio(cfg)) for s in sources}
    return {"definition": "the headline (plan's fork) on each TTFT percentile alone", "available": True,
            "metrics": {m: cell(counts_of(cls, sources, [i])) for i, m in enumerate(names)}}
