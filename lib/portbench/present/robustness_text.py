"""Plain-words text of the headline's robustness (issue #39), from ``summary.json`` only: the README's headline
robustness sentence (:func:`robustness_markdown`, generated block ``robustness``), the paper-vs-portbench table
(:func:`paper_markdown`, generated block ``paper``), and the notebooks' tables of the forks, drivers, uncertainty,
load distance and hardware. Every number is read from the summary; nothing here computes a statistic."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl


def pct(x, digits: int = 0) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def pts(x, digits: int = 0) -> str:
    return "n/a" if x is None else f"{100 * x:+.{digits}f} points"


def _ci(e: Mapping | None, digits: int = 0) -> str:
    """``82% [80, 83]``; an interval that cannot vary is left out (the value is a point)."""
    if not e or e.get("value") is None:
        return "n/a"
    ci = e.get("ci") or [None, None]
    out = pct(e["value"], digits)
    if None in ci or e.get("ci_degenerate") or ci[0] == ci[1]:
        return out
    return out + f" [{100 * ci[0]:.{digits}f}, {100 * ci[1]:.{digits}f}]"


def robustness_markdown(summary: Mapping) -> str:
    """The README's headline robustness sentence: the across-sources concordance's range over the forks of the
    analysis (multi-metric sets), the range over source pairs, and the sources-vs-regions gap at equal load
    distance."""
    mv = summary.get("multiverse") or {}
    h = summary.get("headline") or {}
    if not mv or not h.get("concordance"):
        return "The headline's robustness is not in this summary: rerun the analysis (`make all`)."
    plan = (mv.get("plan_value") or {}).get("across_sources") or {}
    r = (mv.get("range_multi_metric") or {}).get("across_sources") or {}
    r1 = (mv.get("range") or {}).get("across_sources") or {}
    unc = h.get("uncertainty") or {}
    sp = unc.get("source_pair_range") or [None, None]
    ld = summary.get("load_distance") or {}
    lwl = ((ld.get("like_with_like") or {}).get("equal_rho") or {}) if ld.get("available") else {}
    out = (f"The across-sources concordance of {pct(plan.get('concordance'))} is one fork of "
           f"{r.get('forks', 0)} reasonable analyses (metric set × δ 2.5–20 % × correction × tie rule): they give "
           f"**{pct(r.get('min'))} to {pct(r.get('max'))}** ({pct(r1.get('min'))}–{pct(r1.get('max'))} with single "
           f"metrics); by source pair it runs from {pct(sp[0])} to {pct(sp[1])}.")
    if lwl.get("gap") is not None:
        ci = lwl.get("gap_ci") or [None, None]
        out += (f" Compared like with like — regions re-weighted to the sources' load distances — sources keep "
                f"{pct(lwl.get('sources'))} of their orders against {pct(lwl.get('regions_same_distance'))} across "
                f"regions at the same distance: a gap of **{pts(lwl['gap'])}**"
                + (f" [{100 * ci[0]:+.0f}, {100 * ci[1]:+.0f}]" if None not in ci else "")
                + f" (pooled without matching: {pts((ld.get('pooled') or {}).get('gap_pooled'))}).")
    hw = summary.get("across_hardware") or {}
    if hw.get("available"):
        out += (f" Across hardware ({len(hw.get('profiles') or {})} cost profiles) "
                f"{_ci(hw.get('across_hardware'))} of the orders strong on both profiles keep their order.")
    return out


def paper_table(summary: Mapping) -> pl.DataFrame:
    """The paper-vs-portbench table: finding | the study | portbench default | portbench study preset | by chance |
    verdict, one row per finding of ``summary.json["paper_comparison"]``."""
    pc = summary.get("paper_comparison") or {}
    rows = []
    for r in pc.get("rows") or []:
        rows.append({"finding": r["finding"], "the study": r["study"], "portbench default": _cell(r, "default"),
                     "portbench study preset": _cell(r, "study_preset"), "by chance": _chance(r),
                     "verdict": r["verdict"], "why": r.get("why", "")})
    schema = {k: pl.String for k in ("finding", "the study", "portbench default", "portbench study preset",
                                     "by chance", "verdict", "why")}
    return pl.DataFrame(rows, schema=schema)


def _cell(r: Mapping, key: str) -> str:
    v = r.get(key)
    f = r["finding"]
    if not v:
        return "not run" if f == "real-engine result" else "n/a"
    if f == "cross-source agreement":
        pairs = ", ".join(f"{k.replace('|', '–')} {x:.2f}" for k, x in (v.get("by_source_pair") or {}).items())
        return f"τ-b by source pair: {pairs}; highest {v['highest'].replace('|', '–')}"
    if f == "reversal pattern":
        if key == "default":
            return (f"{v.get('count')} of {v.get('comparisons'):,} ({pct(v.get('rate'), 1)}), "
                    f"{v.get('scheduler_pairs_with_reversals')} scheduler pairs, panel {v.get('panel')}")
        return (f"{v.get('count')} of {v.get('comparisons')} ({pct(v.get('rate'), 1)}), "
                f"{len(v.get('scheduler_pairs') or {})} scheduler pairs, source pairs "
                f"{', '.join(k.replace('|', '–') for k in (v.get('source_pairs') or {}))}, regions "
                f"{', '.join(v.get('regions') or {})}")
    if f == "top-1 changes with the metric":
        return f"{pct(v.get('value'), 1)} ({v.get('changed')} of {v.get('count')})"
    if f == "real-engine result":
        return "; ".join(f"{c.get('kind')} {c.get('a')} vs {c.get('b')}: "
                         f"{c.get(v.get('verdict_field') or 'verdict')}" for c in v.get("cases") or [])
    return str(v)


def _chance(r: Mapping) -> str:
    c = r.get("by_chance")
    if not c:
        return "n/a"
    if r["finding"] == "top-1 changes with the metric":
        w = ", ".join(f"{m}: {k}" for m, k in (c.get("usual_winner") or {}).items())
        return f"{pct(c.get('value'), 1)} (each metric's usual winner: {w})"
    if r["finding"] == "reversal pattern":
        return f"≤ {pct(c.get('value'), 2)} per comparison (no differences)"
    if r["finding"] == "cross-source agreement":
        return "τ-b 0 (unrelated rankings)"
    return c.get("definition", "")


def paper_markdown(summary: Mapping) -> str:
    """The paper-vs-portbench table as Markdown (generated block ``paper``)."""
    t = paper_table(summary)
    if not t.height:
        return "The paper comparison is not in this summary: rerun the analysis (`make all`)."
    cols = [c for c in t.columns if c != "why"]
    esc = lambda s: str(s).replace("|", "\\|")           # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(esc(row[c]) for c in cols) + " |" for row in t.iter_rows(named=True)]
    return "\n".join(lines) + ("\n\n*The study's findings are a comparison made after the analysis plan was frozen, "
                               "never a target. Definitions: docs/robustness.md.*")


def multiverse_table(summary: Mapping, one_at_a_time: bool = True) -> pl.DataFrame:
    """The forks as a table (the one-at-a-time rows by default, else every fork)."""
    mv = summary.get("multiverse") or {}
    rows = []
    src = mv.get("one_at_a_time") if one_at_a_time else mv.get("forks")
    for r in src or []:
        a, g = r["across_sources"], r["across_regions"]
        rows.append({"changed": r.get("changed", ""), "value": str(r.get("value", r.get("metric_set", ""))),
                     "plan": bool(r["plan"]),
                     **({} if one_at_a_time else {"delta": r["delta"], "correction": r["correction"],
                                                  "tie_rule": r["tie_rule"]}),
                     "across_sources": a["concordance"], "strong_on_both": a["strong_on_both"],
                     "same_order": a["same_order"], "reversal": a["reversal"], "one_side": a["one_side"],
                     "neither": a["neither"], "across_regions": g["concordance"]})
    return pl.DataFrame(rows)


def drivers_table(summary: Mapping) -> pl.DataFrame:
    """Per headline metric and per TTFT percentile: concordance across sources and regions (plan's fork)."""
    rows = []
    for kind, block in (("headline metric", (summary.get("by_metric") or {}).get("metrics") or {}),
                        ("TTFT percentile", (summary.get("by_percentile") or {}).get("metrics") or {})):
        for m, v in block.items():
            a, g = v["across_sources"], v["across_regions"]
            rows.append({"kind": kind, "metric": m, "across_sources": a["concordance"],
                         "strong_on_both": a["strong_on_both"], "reversals": a["reversals"],
                         "one_side": a["one_side"], "across_regions": g["concordance"]})
    return pl.DataFrame(rows)
