"""The original study's four findings side by side with portbench's numbers and a null (issue #39).

``summary.json["paper_comparison"]``: one row per finding of ``../shared/STUDY_FINDINGS.md`` -- cross-source
agreement, the reversal pattern, the top-1 change with the metric, the real-engine result -- with what the study
reported, portbench's default (headline panel, plan's settings), portbench's study preset on the study's panel, what
chance alone gives (a null), and a verdict: *reproduced*, *not reproduced* or *different question* (the numbers do
not answer the same question: another definition, stand-in data, or not run). The study's findings are a comparison
made after the plan was frozen, never a target: nothing here feeds back into a setting.

Nulls: tau-b of two unrelated rankings is 0 in expectation; a reversal that is significant on both sides needs two
tests that reject at alpha in opposite directions, at most (alpha / 2)^2 per comparison before any correction when no
scheduler differs; the top-1 change rate when each metric always had its usual winner (the scheduler most often in
its best group over the panel's conditions) -- fixed winners per metric, no fragility.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl

from .. import stats
from .common import _num

STUDY = {
    "cross_source_tau": "Azure and Bailian/Qwen agree almost perfectly; comparisons with BurstGPT agree markedly less, "
                        "correlation as low as 0.55 (coefficient not named)",
    "reversal_pattern": "about 3.6 % of nearly 1,000 comparisons; under heavy load; every one involves the same pair "
                        "of strategies and has BurstGPT on one side",
    "top1_change": "the top scheduler changes with the metric in 68.1 % of test conditions",
    "real_engine": "the most dramatic simulated reversal did not occur on a real GPU (one scheduler won on both "
                   "traffic types); a stable ranking held",
}


def _tau_pairs(summary: dict, panel: str) -> dict:
    bp = (((summary.get("panels") or {}).get(panel) or {}).get("cross_source") or {}).get("by_source_pair") or {}
    return {k: (v.get("tau_b") or {}).get("value") for k, v in bp.items()}


def cross_source_row(summary: dict, tables: dict) -> dict:
    """Finding 1: tau-b per source pair of the study panel (default metrics; preset: its metric and heavy regions)."""
    default = _tau_pairs(summary, "study")
    preset = {}
    sp = summary["parameters"].get("study_preset") or {}
    t = tables.get("cross_source_tau")
    regions = (((summary.get("panels") or {}).get("study") or {}).get("reversals") or {}).get("study_preset", {}).get(
        "regions") or []
    if t is not None and t.height and sp:
        f = t.filter((pl.col("panel") == "study") & (pl.col("metric") == sp["metric"]) & pl.col("region").is_in(regions)
                     & pl.col("tau").is_not_nan())
        for (a, b), g in f.group_by(["source_1", "source_2"], maintain_order=True):   # the order of the README row
            preset[f"{a}|{b}"] = _num(g["tau"].mean())
    prov = summary.get("provenance") or {}
    standin = sorted({s for k in default for s in k.split("|") if (prov.get(s) or {}).get("provenance") != "real"})

    def pattern(d):
        v = {k: x for k, x in d.items() if x is not None}
        if not v:
            return None
        hi = max(v, key=lambda k: v[k])
        lo = min(v, key=lambda k: v[k])
        return {"by_source_pair": v, "highest": hi, "lowest": lo, "lowest_value": v[lo],
                "azure_bailian_highest": set(hi.split("|")) == {"azure", "bailian"},
                "burstgpt_in_lowest": "burstgpt" in lo.split("|")}

    pd, pp = pattern(default), pattern(preset)
    same = bool(pd and pd["azure_bailian_highest"] and pd["burstgpt_in_lowest"])
    verdict = ("different question" if standin and same else "reproduced" if same else "not reproduced")
    return {"finding": "cross-source agreement", "study": STUDY["cross_source_tau"],
            "default": pd, "study_preset": pp,
            "by_chance": {"value": 0.0, "definition": "tau-b of two unrelated rankings (scheduler labels permuted): 0 in "
                                                      "expectation"},
            "verdict": verdict,
            "why": (f"the study's pattern (Azure-Bailian highest, BurstGPT in the lowest pair) is "
                    f"{'' if same else 'not '}what portbench's study panel shows"
                    + (f"; {', '.join(standin)} are stand-ins here, so the traces are not the study's"
                       if standin else ""))}


def _preset_reversals(tables: dict, summary: dict, panel: str) -> dict | None:
    """The study preset's significant-and-practical reversals of ``panel`` re-derived from the reversal table (its
    metric, heavy regions, one Holm family over the side tests): counts by scheduler pair, source pair and region."""
    r = tables.get("reversals")
    sp = (((summary.get("panels") or {}).get(panel) or {}).get("reversals") or {}).get("study_preset") or {}
    if r is None or not sp.get("available"):
        return None
    f = r.filter((pl.col("panel") == panel) & (pl.col("metric") == sp["metric"]) & pl.col("region").is_in(sp["regions"]))
    sides = pl.concat([f.select("a", "b", pl.col("source_1").alias("s"), "region", pl.col("p_1").alias("p")),
                       f.select("a", "b", pl.col("source_2").alias("s"), "region", pl.col("p_2").alias("p"))]).unique(
        ["a", "b", "s", "region"]).filter(pl.col("p").is_not_nan())
    adj = stats.adjust_pvalues(sides["p"].to_numpy(), sp["correction"])
    key = {(a, b, s, g): q for a, b, s, g, q in zip(sides["a"], sides["b"], sides["s"], sides["region"], adj)}
    hits = []
    for row in f.filter(pl.col("reversal")).iter_rows(named=True):
        q1 = key.get((row["a"], row["b"], row["source_1"], row["region"]))
        q2 = key.get((row["a"], row["b"], row["source_2"], row["region"]))
        if q1 is None or q2 is None:
            continue
        if q1 < sp["alpha"] and q2 < sp["alpha"] and row["min_rel"] >= sp["delta"]:
            hits.append(row)
    return {"count": len(hits), "recorded": sp.get("significant_and_practical"), "comparisons": sp.get("comparisons"),
            "rate": sp.get("rate") if sp.get("comparisons") else None,
            "scheduler_pairs": dict(Counter(f"{h['a']}|{h['b']}" for h in hits).most_common()),
            "source_pairs": dict(Counter(f"{h['source_1']}|{h['source_2']}" for h in hits).most_common()),
            "regions": dict(Counter(h["region"] for h in hits).most_common())}


def reversal_row(summary: dict, tables: dict) -> dict:
    """Finding 2: share of reversals, how many scheduler pairs, which sources, which regions."""
    rv = summary.get("reversals") or {}
    sp = rv.get("significant_and_practical") or {}
    pairs = {k: v.get("significant_and_practical", 0) for k, v in (rv.get("by_scheduler_pair") or {}).items()}
    srcs = {k: v.get("significant_and_practical", 0) for k, v in (rv.get("by_source_pair") or {}).items()}
    regs = {k: v.get("significant_and_practical", 0) for k, v in (rv.get("by_region") or {}).items()}
    default = {"panel": summary.get("headline_panel"), "count": sp.get("value"), "comparisons": sp.get("count"),
               "rate": sp.get("rate"), "scheduler_pairs_with_reversals": sum(1 for v in pairs.values() if v),
               "by_source_pair": srcs, "by_region": regs}
    preset = _preset_reversals(tables, summary, "study")
    alpha = float(summary["parameters"]["alpha"])
    null = (alpha / 2) ** 2
    pattern = None
    if preset:
        one_pair = len(preset["scheduler_pairs"]) == 1
        burst_side = bool(preset["source_pairs"]) and all("burstgpt" in k.split("|") for k in preset["source_pairs"])
        heavy = bool(preset["regions"]) and set(preset["regions"]) <= {"overload", "severe"}
        pattern = {"one_scheduler_pair": one_pair, "burstgpt_on_one_side": burst_side, "heavy_load_only": heavy}
        same = one_pair and burst_side and preset["rate"] is not None and abs(preset["rate"] - 0.036) < 0.02
    else:
        same = False
    return {"finding": "reversal pattern", "study": STUDY["reversal_pattern"], "default": default,
            "study_preset": {**(preset or {}), "pattern": pattern},
            "by_chance": {"value": _num(null), "definition": f"no scheduler differs: a comparison is a significant "
                                                             f"reversal only if both sides' tests reject in opposite "
                                                             f"directions, at most (alpha/2)^2 = {100 * null:.2f} % "
                                                             "before any correction"},
            "verdict": "reproduced" if same else "not reproduced",
            "why": "share, one scheduler pair and BurstGPT on one side all needed for reproduced (study preset, study "
                   "panel; BurstGPT and Bailian are stand-ins here)"}


def usual_winner_null(top1_pairs: pl.DataFrame, sources: list[str]) -> dict | None:
    """The top-1 change rate if every metric always had its usual winner: per metric the scheduler most often in its
    best group over the panel's (source, region) conditions; a defined (condition, metric pair) case counts as a
    change when the two metrics' usual winners differ."""
    f = top1_pairs.filter(pl.col("source").is_in(sources) & pl.col("defined"))
    if not f.height:
        return None
    wins: dict[str, Counter] = {}
    seen = set()
    for row in f.iter_rows(named=True):
        for m, w in ((row["metric_1"], row["winners_1"]), (row["metric_2"], row["winners_2"])):
            k = (row["source"], row["region"], m)
            if k in seen:
                continue
            seen.add(k)
            wins.setdefault(m, Counter()).update(str(w).split("+"))
    usual = {m: c.most_common(1)[0][0] for m, c in wins.items()}
    ch = np.array([usual[a] != usual[b] for a, b in zip(f["metric_1"], f["metric_2"])])
    return {"value": _num(ch.mean()), "count": int(ch.size), "usual_winner": usual}


def top1_row(summary: dict, tables: dict) -> dict:
    """Finding 3: the top-1 change with the metric, beside the usual-winner null."""
    cm = summary.get("cross_metric") or {}
    d = cm.get("pairwise_top1_change_rate") or {}
    st = ((((summary.get("panels") or {}).get("study") or {}).get("cross_metric") or {})
          .get("pairwise_top1_change_rate") or {})
    t = tables.get("top1_pairs")
    null = usual_winner_null(t, cm.get("sources") or []) if t is not None else None
    v, n = d.get("value"), (null or {}).get("value")
    within = v is not None and abs(v - 0.681) <= 0.05
    verdict = ("different question" if within and n is not None and abs(v - n) <= 0.05 else
               "reproduced" if within else "not reproduced")
    return {"finding": "top-1 changes with the metric", "study": STUDY["top1_change"],
            "default": {"value": v, "changed": d.get("changed"), "count": d.get("count"), "ci": d.get("ci"),
                        "ci_conditions": d.get("ci_conditions")},
            "study_preset": {"value": st.get("value"), "changed": st.get("changed"), "count": st.get("count"),
                             "panel": "study"},
            "by_chance": {**(null or {"value": None}),
                          "definition": "each metric always won by its usual winner (most often in its best group): "
                                        "the change rate that fixed per-metric winners give, without any fragility"},
            "verdict": verdict,
            "why": ("portbench's rate is within 5 points of the study's, but also within 5 points of what fixed "
                    "per-metric winners give: it measures that different metrics have different winners, not that the "
                    "winner is fragile" if verdict == "different question" else
                    "within 5 points of the study's 68.1 %" if within else "more than 5 points from the study's 68.1 %")}


def real_engine_row(results_dir: Path) -> dict:
    """Finding 4: the validation's cases (data/results/validation/summary.json ``cases``), or not run."""
    f = Path(results_dir) / "validation" / "summary.json"
    base = {"finding": "real-engine result", "study": STUDY["real_engine"], "study_preset": None}
    null = {"definition": "no difference between the two schedulers on the engine: the validation's one-sided "
                          "confirmatory tests (Holm) reject with probability at most alpha"}
    if not f.is_file():
        return {**base, "default": None, "by_chance": null, "verdict": "different question",
                "why": "not run: no validation summary (data/results/validation/summary.json)"}
    try:
        v = json.loads(f.read_text())
    except ValueError:
        return {**base, "default": None, "by_chance": null, "verdict": "different question",
                "why": f"{f} is not readable JSON"}
    cases = v.get("cases") or []
    rows = []
    for c in cases if isinstance(cases, list) else []:
        if isinstance(c, dict):
            rows.append({k: c.get(k) for k in ("kind", "a", "b", "metric", "region", "verdict", "held", "reproduced",
                                                "engine_verdict") if k in c})
    if not rows:
        return {**base, "default": None, "by_chance": null, "verdict": "different question",
                "why": "the validation summary holds no cases"}
    key = next((k for k in ("verdict", "engine_verdict", "held", "reproduced") if any(k in r for r in rows)), None)
    rev = [r for r in rows if str(r.get("kind", "")).startswith("rev")]
    stable = [r for r in rows if str(r.get("kind", "")).startswith("stab")]
    return {**base, "default": {"cases": rows, "verdict_field": key},
            "by_chance": null,
            "verdict": "different question",
            "why": f"{len(rev)} reversal case(s), {len(stable)} stable case(s) replayed on the CPU engine with a tiny "
                   "model, not the study's GPU; see validation summary for each verdict"}


def paper_comparison(summary: dict, tables: dict, results_dir: Path) -> dict:
    """``summary.json["paper_comparison"]``: the four rows."""
    rows = [cross_source_row(summary, tables), reversal_row(summary, tables), top1_row(summary, tables),
            real_engine_row(results_dir)]
    return {"definition": "the study's reported findings (../shared/STUDY_FINDINGS.md) beside portbench's default "
                          "(headline panel, plan's settings), portbench's study preset on the study's panel and a "
                          "null; verdicts: reproduced / not reproduced / different question. A comparison made after "
                          "the plan was frozen, never a target",
            "rows": rows, "verdicts": {r["finding"]: r["verdict"] for r in rows}}
