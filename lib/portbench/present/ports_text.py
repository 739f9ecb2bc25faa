"""Plain-words text of the headline "what ports" (issue #25), from ``summary.json`` only: the README's results
block (:func:`what_ports_markdown`), notebook 04 and notebook 10 use the same sentences. Every number is read from
the summary; nothing here computes a statistic."""

from __future__ import annotations

from collections.abc import Mapping


def pct(x, digits: int = 0) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def conc(c: Mapping | None, digits: int = 0) -> str:
    """``83% [78, 88] of 412`` from a concordance entry ``{value, ci, n}``."""
    if not c or c.get("value") is None:
        return "n/a (no comparison strong on both sides)"
    ci = c.get("ci") or [None, None]
    out = pct(c["value"], digits)
    if None not in ci and (c.get("ci_degenerate") or ci[0] == ci[1]):
        out += " (the same in every resample)"
    elif None not in ci:
        out += f" [{100 * ci[0]:.{digits}f}, {100 * ci[1]:.{digits}f}]"
    return out + f" of {c['n']:,}"


def four_way_text(fw: Mapping | None) -> str:
    if not fw:
        return "n/a"
    return (f"same order {pct(fw['same_order']['share'], 1)}, reversed {pct(fw['reversal']['share'], 1)}, strong on one "
            f"side only {pct(fw['one_side']['share'], 1)}, on neither {pct(fw['neither']['share'], 1)} "
            f"(of {fw['total']:,})")


def _extreme(group: Mapping, lowest: bool = True):
    """The entry of a breakdown with the lowest (highest) concordance among those with at least 10 comparisons
    strong on both sides."""
    ok = [(k, v) for k, v in (group or {}).items() if v.get("value") is not None and v.get("n", 0) >= 10]
    if not ok:
        return None
    return sorted(ok, key=lambda kv: kv[1]["value"], reverse=not lowest)[0]


def interval_words(h: Mapping) -> str:
    """How the headline's 95% intervals were made, in words (from ``headline.interval_method``)."""
    if h.get("interval_method") == "block":
        return ("95% intervals: runs of consecutive windows resampled, so that neighbouring windows stay together, "
                "every test re-run")
    return "95% intervals: windows resampled, every test re-run"


def both_intervals(summary: Mapping) -> str:
    """The headline's intervals both ways: the block bootstrap (with its block lengths) and the ordinary one."""
    h = summary.get("headline") or {}
    cs, cr = (h.get("concordance") or {}).get("across_sources") or {}, (h.get("concordance") or {}).get("across_regions") or {}
    if h.get("interval_method") != "block" or "ci_window" not in cs:
        return "The intervals above resample windows as if independent."
    labels = {s: v["label"] for s, v in (summary.get("provenance") or {}).items()}
    bl = h.get("block_lengths") or {}

    def ci(c):
        x = c.get("ci") or [None, None]
        return "n/a" if None in x else f"[{100 * x[0]:.1f}, {100 * x[1]:.1f}]"
    return ("So the intervals above resample runs of consecutive windows (block lengths "
            + ", ".join(f"{bl[s]} ({labels.get(s, s)})" for s in h.get("sources", []) if s in bl)
            + f"): across sources {ci(cs)}, across regions {ci(cr)}; resampling single windows as if independent gives "
            f"{ci({'ci': cs.get('ci_window')})} and {ci({'ci': cr.get('ci_window')})}.")


def headline_sentences(summary: Mapping) -> list[str]:
    """The findings in plain words: what ports across sources and regions, how sure, where it reverses most."""
    h = summary.get("headline") or {}
    if not h.get("concordance"):
        return ["The headline (what ports) is not in this summary: rerun the analysis."]
    cs, cr = h["concordance"]["across_sources"], h["concordance"]["across_regions"]
    fs, fr = h["four_way"].get("across_sources"), h["four_way"].get("across_regions")
    labels = {s: v["label"] for s, v in (summary.get("provenance") or {}).items()}
    srcs = ", ".join(labels.get(s, s) for s in h.get("sources", []))
    side = h.get("sides") or {}
    out = [
        (f"**What ports.** Of the scheduler orders that are clearly there on two sources ({srcs}; same region and "
        f"metric; each side significant and at least δ apart), **{conc(cs)} keep their order** across sources; across "
        f"operating regions of one source the same share is **{conc(cr)}** ({interval_words(h)})."),
        (f"But most orders are not clearly there on both sides. Across sources: {four_way_text(fs)}. Across regions: "
        f"{four_way_text(fr)}. Of all the rankings' scheduler pairs, {pct(side.get('strong'))} are strongly ordered, "
        f"{pct(side.get('equivalent'))} equivalent within ±δ and {pct(side.get('undetermined'))} undetermined."),
    ]
    br = (h.get("breakdowns") or {}).get("across_sources") or {}
    worst_pair, worst_metric = _extreme(br.get("by_source_pair")), _extreme(br.get("by_metric"))
    worst_region, worst_fam = _extreme(br.get("by_region")), _extreme(br.get("by_family"))
    fams = (h.get("breakdowns") or {}).get("families") or {}

    def name(what, key):
        if what == "source pair":
            return " vs ".join(labels.get(x, x) for x in key.split(" vs "))
        if what.startswith("scheduler family"):
            return f"{key} ({', '.join(fams.get(key, []))})"
        return key

    parts = []
    for what, e in (("source pair", worst_pair), ("metric", worst_metric), ("region", worst_region),
                    ("scheduler family (pairs involving one)", worst_fam)):
        if e:
            parts.append(f"{what} {name(what, e[0])} ({conc(e[1])})")
    if parts:
        out.append("Where it reverses most (lowest concordance across sources, at least 10 comparisons strong on both): "
                   + "; ".join(parts) + ".")
    return out


def controls_sentences(summary: Mapping) -> list[str]:
    """How far each control of the design moves the headline."""
    c = summary.get("controls") or {}
    h = (summary.get("headline") or {}).get("concordance") or {}
    if not c:
        return []
    base_s, base_r = (h.get("across_sources") or {}).get("value"), (h.get("across_regions") or {}).get("value")

    def move(entry):
        cc = (entry or {}).get("concordance") or {}
        s, r = cc.get("across_sources"), cc.get("across_regions")
        txt = f"across sources {conc(s)}"
        if s and s.get("value") is not None and base_s is not None:
            txt += f" ({100 * (s['value'] - base_s):+.1f} points)"
        if r:
            txt += f", across regions {conc(r)}"
            if r.get("value") is not None and base_r is not None:
                txt += f" ({100 * (r['value'] - base_r):+.1f} points)"
        return txt

    rows = []
    if "without_predictor_policies" in c:
        rows.append(f"without the predictor-informed policies ({', '.join(c['without_predictor_policies']['dropped'])}): "
                    + move(c["without_predictor_policies"]))
    if "without_sarathi" in c:
        rows.append("without sarathi (a token budget more than an order): " + move(c["without_sarathi"]))
    tb = c.get("token_budget") or {}
    if tb.get("by_metric"):
        parts = []
        for m, by in tb["by_metric"].items():
            sb = sum(v.get("sarathi_better", 0) for v in by.values())
            fb = sum(v.get("fcfs_better", 0) for v in by.values())
            n = sum(sum(v.values()) for v in by.values())
            parts.append(f"{m}: sarathi better in {sb}, fcfs better in {fb} of {n} source × region rankings")
        rows.append("the token budget alone (fcfs vs sarathi, same order): " + "; ".join(parts))
    if "matched_congestion" in c:
        mc = c["matched_congestion"]
        n_used, n_un = len(mc.get("matched_regions") or []), len(mc.get("unmatched") or [])
        within = (f", mean queues within a factor {mc['max_ratio']:g}; {n_un} of {n_used + n_un} regions have no "
                  "such match and are left out" if mc.get("max_ratio") else "")
        rows.append(f"regions matched by congestion (mean queue) instead of ρ{within}: " + move(mc))
    e = c.get("equal_information") or {}
    if e.get("available"):
        rows.append("equal information (sjf_predicted, ltr, edf replaced by their noisy-oracle variants, the same noise on "
                    "every source): " + move(e))
    j = c.get("arrival_jitter") or {}
    if j.get("available"):
        rows.append(f"arrivals spread within the timestamp grid of {', '.join(j['jittered_sources'])}: " + move(j))
    elif j:
        rows.append(f"arrival jitter: {j.get('reason')}")
    return [f"- {r}" for r in rows]


def _windows_worth(ew: Mapping) -> str:
    """"the 40 windows are worth about 12, 9, 20" (every source has 40), else "the windows (40, 40, 19) are worth
    about 12, 9, 7" -- the counts of this run, never a fixed number."""
    counts = [int(v["windows"]) for v in ew.values()]
    worth = ", ".join(f"{v['effective_windows']:.0f}" for v in ew.values())
    if len(set(counts)) == 1:
        return f"the {counts[0]} windows are worth about {worth}"
    return f"the windows ({', '.join(map(str, counts))}) are worth about {worth}"


def what_ports_markdown(summary: Mapping) -> str:
    """The README's lead paragraph of results: the headline, its table and the controls."""
    h = summary.get("headline") or {}
    lines = []
    for sentence in headline_sentences(summary):
        lines += [sentence, ""]
    lines = lines[:-1]
    ctl = controls_sentences(summary)
    if ctl:
        lines += ["", "How far the design moves it (concordance among comparisons strong on both sides):", "", *ctl]
    curve = ((h.get("by_windows") or {}).get("points")) or []
    if curve:
        lines += ["", "With fewer windows per source (evenly spaced): " + "; ".join(
            f"{p['windows']}: across sources {conc(p['across_sources'])}, across regions {conc(p['across_regions'])}"
            for p in curve) + "."]
    ew = (h.get("effective_windows") or {}).get("by_source") or {}
    if ew:
        labels = {s: v["label"] for s, v in (summary.get("provenance") or {}).items()}
        lines += ["", "Windows are not independent draws: in trace order, FCFS's per-window values have a lag-1 "
                  "autocorrelation of " + ", ".join(f"{v['lag1_autocorrelation']:.2f} ({labels.get(s, s)})"
                                                    for s, v in ew.items())
                  + "; as AR(1) series " + _windows_worth(ew)
                  + " independent ones (medians over regions × headline metrics). " + both_intervals(summary)]
    sec = h.get("secondary") or {}
    if sec.get("tau_b"):
        def f2(e):
            return "n/a" if not e or e.get("value") is None else f"{e['value']:.2f}"

        lines += ["", "Secondary, on the same classes (equivalent pairs tied, undetermined left out): τ-b across sources "
                  f"{f2(sec['tau_b'].get('across_sources'))}, across regions {f2(sec['tau_b'].get('across_regions'))}; "
                  f"τ-b/τ-b,max {f2(sec['tau_b_norm'].get('across_sources'))} / "
                  f"{f2(sec['tau_b_norm'].get('across_regions'))}"
                  + (f"; Kendall's W across sources {f2(sec['W']['across_sources'])}" if sec.get("W") else "") + "."]
    tc = summary.get("trace_checks") or {}
    q = tc.get("quantised_sources") or []
    if q:
        steps = ", ".join(f"{s} ({tc['sources'][s].get('grid_step_s') or '?'} s grid)" for s in q)
        lines += ["", f"**Trace check:** quantised timestamps in {steps}: many requests share an arrival instant."]
    plan = summary.get("analysis_plan") or {}
    if plan.get("sha256"):
        lines += ["", f"*Analysis plan `{plan['file']}` (SHA-256 `{plan['sha256'][:12]}…`; "
                  + ("this run follows it" if plan.get("follows_plan") else
                     "this run deviates: " + ", ".join(plan.get("deviations") or {}))
                  + f"; {len(plan.get('changes') or [])} dated changes, the first on {plan['changes'][0]['date']}).*"
                  if plan.get("changes") else ")*"]
    return "\n".join(lines)
