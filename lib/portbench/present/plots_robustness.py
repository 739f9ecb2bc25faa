"""Figures of the headline's robustness (issue #39): the "what ports" figure (the four-way table, concordance across
sources vs regions vs hardware, the controls, concordance by load distance, the forks). Reads ``summary.json`` only."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..core.config import PathsConfig
import seaborn as sns

from . import figures

FOUR = ("same_order", "reversal", "one_side", "neither")
FOUR_LABEL = {"same_order": "same order", "reversal": "reversed", "one_side": "strong on one side",
              "neither": "on neither"}
NAME = "04_cross_workload/what_ports"


def _err(c: Mapping) -> tuple[float, float, float] | None:
    """(value, lower, upper) of a concordance entry; a degenerate or missing interval gives zero-length bars."""
    if not c or c.get("value") is None:
        return None
    v = float(c["value"])
    ci = c.get("ci") or [None, None]
    lo = float(ci[0]) if ci[0] is not None else v
    hi = float(ci[1]) if ci[1] is not None else v
    return v, max(v - lo, 0.0), max(hi - v, 0.0)


def _four_way_rows(summary: Mapping) -> list[tuple[str, Mapping]]:
    h = summary.get("headline") or {}
    rows = [("across sources\n(equal ρ)", (h.get("four_way") or {}).get("across_sources")),
            ("across regions", (h.get("four_way") or {}).get("across_regions"))]
    hw = summary.get("across_hardware") or {}
    if hw.get("available"):
        rows.append(("across hardware", (hw.get("across_hardware") or {}).get("four_way")))
    return [(k, v) for k, v in rows if v]


def _concordance_rows(summary: Mapping, controls: Mapping | None) -> list[tuple[str, Mapping, str]]:
    h = summary.get("headline") or {}
    c = h.get("concordance") or {}
    rows = [("across sources", c.get("across_sources"), "main"), ("across regions", c.get("across_regions"), "main")]
    hw = summary.get("across_hardware") or {}
    if hw.get("available"):
        rows.append(("across hardware", hw.get("across_hardware"), "main"))
    ctl = controls if controls is not None else (summary.get("controls") or {})
    names = {"without_predictor_policies": "without predictor policies", "without_sarathi": "without sarathi",
             "matched_congestion": "matched congestion", "arrival_jitter": "arrivals jittered",
             "equal_information": "equal information"}
    for k, lab in names.items():
        e = ((ctl.get(k) or {}).get("concordance") or {}).get("across_sources")
        if e and e.get("value") is not None:
            rows.append((f"{lab} (sources)", e, "control"))
    return rows


def what_ports(paths: PathsConfig, summary: Mapping, controls: Mapping | None = None, close: bool = False):
    """The headline in one figure: (a) the four-way table across sources, regions and hardware; (b) concordance with
    its interval across sources vs regions vs hardware and under each control; (c) concordance by load distance,
    regions vs sources; (d) the across-sources concordance over the forks (metric set x delta x correction x tie
    rule), the plan's marked. Saved as ``04_cross_workload/what_ports``."""
    fig, axes = figures.figure(2, 2, figsize=(12.5, 8.6))
    pal = sns.color_palette("colorblind")
    colors = {"same_order": pal[2], "reversal": pal[3], "one_side": pal[0], "neither": (0.75, 0.75, 0.75)}

    ax = axes[0, 0]
    rows = _four_way_rows(summary)
    for i, (_, fw) in enumerate(rows):
        left = 0.0
        for k in FOUR:
            share = (fw.get(k) or {}).get("share") or 0.0
            ax.barh(i, share, left=left, color=colors[k], label=FOUR_LABEL[k] if i == 0 else None)
            if share >= 0.06:
                ax.text(left + share / 2, i, f"{100 * share:.0f}%", ha="center", va="center", fontsize=8)
            left += share
        ax.text(1.01, i, f"n = {fw.get('total', 0):,}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of comparisons (scheduler pair × condition pair × headline metric)")
    ax.set_title("(a) what ports: the four-way table")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, -0.42), ncol=4, fontsize=8, frameon=False)

    ax = axes[0, 1]
    crow = _concordance_rows(summary, controls)
    for i, (_, e, kind) in enumerate(crow):
        r = _err(e)
        if r is None:
            continue
        v, lo, hi = r
        ax.errorbar(v, i, xerr=[[lo], [hi]], fmt="o" if kind == "main" else "s", color=pal[0] if kind == "main"
                    else pal[7], capsize=3)
        ax.text(min(v + hi + 0.005, 1.0), i, f" {100 * v:.0f}%", va="center", fontsize=8)
    unc = ((summary.get("headline") or {}).get("uncertainty") or {})
    rng = unc.get("source_pair_range") or [None, None]
    if None not in rng:
        ax.axvspan(rng[0], rng[1], color=pal[0], alpha=0.08, label="range over source pairs")
        ax.legend(loc="center right", fontsize=8)
    ax.set_yticks(range(len(crow)), [r[0] for r in crow])
    ax.invert_yaxis()
    ax.set_xlabel("concordance = same / (same + reversed), 95% interval")
    ax.set_title("(b) concordance: sources, regions, hardware, controls")

    ax = axes[1, 0]
    ld = summary.get("load_distance") or {}
    if ld.get("available"):
        bins = ld["bins"]
        style = {"across_regions": ("-o", pal[1], "across regions of a source"),
                 "across_sources_equal_rho": ("s", pal[0], "across sources, equal ρ"),
                 "across_sources_any_rho": ("^", pal[4], "across sources, any ρ (matched congestion at small distance)")}
        for k, (fmt, col, lab) in style.items():
            by = ld["by_distance"].get(k) or {}
            xs = [(i, by[b]) for i, b in enumerate(bins) if b in by and by[b].get("value") is not None]
            if not xs:
                continue
            off = {"across_regions": 0.0, "across_sources_equal_rho": -0.12, "across_sources_any_rho": 0.12}[k]
            x = np.array([i for i, _ in xs]) + off
            vals = np.array([e["value"] for _, e in xs])
            los = np.array([v_ - (e["ci"][0] if e["ci"][0] is not None else v_) for v_, (_, e) in zip(vals, xs)])
            his = np.array([(e["ci"][1] if e["ci"][1] is not None else v_) - v_ for v_, (_, e) in zip(vals, xs)])
            ax.errorbar(x, vals, yerr=[np.maximum(los, 0), np.maximum(his, 0)], fmt=fmt, color=col, capsize=2,
                        label=lab, ms=5)
        ax.set_xticks(range(len(bins)), bins, fontsize=8)
        ax.set_xlabel("load distance |log(1 + mean queue₁) − log(1 + mean queue₂)|")
        ax.set_ylabel("concordance")
        ax.legend(fontsize=7.5, loc="lower left")
        g = (ld.get("like_with_like") or {}).get("equal_rho") or {}
        if g.get("gap") is not None:
            ax.set_title(f"(c) like with like: sources − regions at equal distance {100 * g['gap']:+.0f} points")
        else:
            ax.set_title("(c) concordance by load distance")
    else:
        ax.text(0.5, 0.5, ld.get("reason", "no load distance"), ha="center", va="center", transform=ax.transAxes)
        ax.set_title("(c) concordance by load distance")

    ax = axes[1, 1]
    mv = summary.get("multiverse") or {}
    forks = [f for f in mv.get("forks", []) if len(f.get("metrics", [])) > 1]
    if forks:
        sets = list(dict.fromkeys(f["metric_set"] for f in forks))
        deltas = mv.get("deltas") or sorted({f["delta"] for f in forks})
        marks = {"test_and_delta": "o", "test_only": "v", "delta_only": "D"}
        for f in forks:
            v = f["across_sources"]["concordance"]
            if v is None:
                continue
            xf = deltas.index(f["delta"]) + (0.18 if f["metric_set"] != sets[0] else -0.18) \
                + {"fdr_bh": 0.0, "holm": 0.05, "none": -0.05}.get(f["correction"], 0.0)
            col = pal[0] if f["metric_set"] == "plan" else pal[5]
            ax.scatter(xf, v, marker=marks.get(f["tie_rule"], "o"), color=col, s=60 if f["plan"] else 18,
                       edgecolor="black" if f["plan"] else "none", zorder=3 if f["plan"] else 2, alpha=0.9)
        for k, m in marks.items():
            ax.scatter([], [], marker=m, color="grey", label=k.replace("_", " "))
        ax.scatter([], [], color=pal[0], label="plan's metric set")
        ax.scatter([], [], color=pal[5], label="first design's metric set")
        ax.scatter([], [], color=pal[0], edgecolor="black", s=60, label="the plan's fork")
        ax.set_xticks(range(len(deltas)), [f"δ {100 * d:g}%" for d in deltas])
        rg = (mv.get("range_multi_metric") or {}).get("across_sources") or {}
        ax.set_title(f"(d) the forks: across sources {100 * (rg.get('min') or 0):.0f}–{100 * (rg.get('max') or 0):.0f}%")
        ax.set_ylabel("concordance across sources")
        ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    figures.save(fig, NAME, paths.figures_dir, close=close,
                 description="What ports: the four-way table across sources, regions and hardware; concordance with "
                             "intervals beside the controls; concordance by load distance (sources vs regions at equal "
                             "distance); the across-sources concordance over the forks of the analysis, the plan's "
                             "marked")
    return fig


def across_hardware(paths: PathsConfig, summary: Mapping, labels: Mapping[str, str] | None = None,
                    close: bool = False):
    """Concordance across hardware per profile pair and per source, beside each profile's own across-sources and
    across-regions concordance; profiles by their ``label`` (``hardware_profiles.yaml``), sources by ``labels``
    (display names). Saved as ``04_cross_workload/across_hardware``; None when not available."""
    hw = summary.get("across_hardware") or {}
    if not hw.get("available"):
        return None
    src = dict(labels or {})
    prof = {n: str(p.get("label") or n) for n, p in hw["profiles"].items()}

    def pair_label(key: str) -> str:
        return " vs ".join(prof.get(n, n) for n in key.split(" vs "))

    fig, axes = figures.figure(1, 2, figsize=(13, 3.9))
    pal = sns.color_palette("colorblind")
    ax = axes[0]
    rows = [("all profile pairs", hw["across_hardware"])] + [(pair_label(k), e) for k, e in hw["by_profile_pair"].items()] + \
        [(f"{src.get(s, s)} (all pairs)", e) for s, e in hw["by_source"].items()]
    for i, (_, e) in enumerate(rows):
        er = _err(e)
        if er:
            ax.errorbar(er[0], i, xerr=[[er[1]], [er[2]]], fmt="o", color=pal[0] if i else pal[3], capsize=3)
            ax.text(er[0] + er[2] + 0.003, i, f" {100 * er[0]:.0f}% of {e['n']:,}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("concordance across hardware (95% interval)")
    ax.set_title("same source, region, metric and pair on two cost profiles")
    ax = axes[1]
    names = list(hw["profiles"])
    for j, (k, col) in enumerate((("across_sources", pal[0]), ("across_regions", pal[1]))):
        for i, n in enumerate(names):
            er = _err(hw["profiles"][n]["concordance"].get(k) or {})
            if er:
                ax.errorbar(er[0], i + (j - 0.5) * 0.25, xerr=[[er[1]], [er[2]]], fmt="os"[j], color=col, capsize=3,
                            label=k.replace("_", " ") if i == 0 else None)
    ax.set_yticks(range(len(names)), [prof[n] for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("concordance on each profile")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))   # below: clear of the points
    ax.set_title("each profile's own headline")
    fig.suptitle("Does the ranking port across hardware? The same comparisons on other cost profiles", fontsize=11)
    fig.tight_layout()
    figures.save(fig, "04_cross_workload/across_hardware", paths.figures_dir, close=close,
                 description="Concordance across hardware (cost profiles: A100 and H100 fitted from measured operator "
                             "times, the campaign's profile) per profile pair and source, beside each profile's "
                             "across-sources and across-regions concordance")
    return fig
