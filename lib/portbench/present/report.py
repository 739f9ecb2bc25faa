"""The generated blocks of the README and of ``docs/results.md``, written from ``summary.json`` (``portbench
report --readme README.md``; ``make all`` runs it).

Every number in a block is read from the summary the analysis wrote. A block sits between the markers
``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, one per name in :data:`BLOCKS` (``study``: what the study
simulates; ``headline``: the headline in one sentence; ``robustness``: its range over the forks and the sources-vs-regions
gap at equal load distance; ``paper``: the original study's findings beside portbench's; ``results``: every headline number), and nothing else in
the file changes. The README holds the short blocks, ``docs/results.md`` (beside it) the full ``results`` block.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ..core import outputs
from ..core.errors import DataError
from . import numbers, ports_text, robustness_text, text

START, END = "<!-- results:start -->", "<!-- results:end -->"


def _num(x: Mapping, digits: int = 2) -> str:
    """``0.21 [0.18, 0.26]`` from a summary entry ``{"value", "ci"}``; with ``ci_conditions``, a second
    interval after a slash: ``0.21 [0.18, 0.26] / [0.10, 0.30]``."""
    if x is None or x.get("value") is None:
        return "n/a"
    num = numbers.fixed(digits)
    return numbers.with_ci(num(x["value"]), x.get("ci"), x.get("ci_conditions"), num=num)


def _pct(x, digits: int = 0) -> str:
    """``31% [30, 33] / [7, 53]``: the value as a percentage, the intervals in percent."""
    if x is None or x.get("value") is None:
        return "n/a"
    return numbers.with_ci(numbers.percent(digits)(x["value"]), x.get("ci"), x.get("ci_conditions"),
                           num=numbers.percent(digits, sign=False))


def _effect(v, scale: str) -> str:
    return f"{v:.0%}" if scale == "ratio" else f"{100 * v:.1f} pp"


def _agreement(sec: Mapping) -> str:
    c = sec["conditions"]
    return (f"τ-b {_num(sec['tau_b'])}, τ-b/τ-b,max {_num(sec['tau_b_norm'])}, discordance {_pct(sec['discordance'], 1)} "
            f"of {sec['discordance']['count']:,} pairs resolved on both sides; {c['defined']} of {c['total']} "
            f"conditions defined, {c['all_tied']} all tied")


def results_markdown(summary: Mapping) -> str:
    """Markdown of the headline numbers of one analysis summary: the default design beside the original study's
    design (``study_preset``) and the old tie rule."""
    prov = summary["provenance"]
    labels = {s: v["label"] for s, v in prov.items()}
    data, par = summary["data"], summary["parameters"]
    cs, cr, rv, cm = summary["cross_source"], summary["cross_region"], summary["reversals"], summary["cross_metric"]
    names = {s: v.get("name") or v["label"].removesuffix(" (stand-in)") for s, v in prov.items()}
    real = [names[s] for s, v in prov.items() if v["provenance"] == "real"]
    stand = [names[s] for s, v in prov.items() if v["provenance"] == "standin"]
    panel = summary.get("headline_panel")
    lines = [
        f"*{data['n_runs']:,} simulated runs: {len(par['schedulers'])} schedulers × "
        + ", ".join(f"{v['n_windows']} {labels[s]}" for s, v in prov.items())
        + f" windows × {len(par['regions'])} regions × {data['replicates']} replicates; "
        f"real sources: {', '.join(real) or 'none'}" + (f"; stand-ins: {', '.join(stand)}" if stand else "")
        + f". Headline metrics (the analysis plan's, chosen after the first results: see its change log): {', '.join(summary['headline_metrics'])}; headline panel: {panel} "
        + f"({', '.join(labels.get(s, s) for s in (summary.get('panels') or {}).get(panel, {}).get('sources', []))}"
        + (f"; the headline because {summary.get('headline_reason')}"
           if ((summary.get("panels") or {}).get(panel) or {}).get("own_sources") else
           "; all real: the headline is the first all-real panel" if ((summary.get("panels") or {}).get(panel) or {})
           .get("all_real") else "; not all real: no all-real panel is available") + "). "
        "Two schedulers are tied in a ranking unless their paired Wilcoxon test over windows tells them apart "
        f"({par['tie_correction']} within the ranking, α = {par['alpha']}). Means with two 95% intervals: "
        "[windows resampled within each source, tie groups fixed] / [conditions resampled]."
        + (" " + na if (na := text.na_schedulers_markdown(cs.get("na_schedulers"), labels)) else "") + "*",
        "",
    ]
    if summary.get("headline"):                 # what ports (issue #25) leads; the tau-b tables below are secondary
        lines += [ports_text.what_ports_markdown(summary), "", "*Secondary: rank agreement on tie-group rankings "
                  "(the earlier headline), reversals and cross-metric changes.*", ""]
    if not cs.get("available", True) or "tau_b" not in cs:
        return "\n".join(lines + [f"Cross-source numbers not available: {cs.get('reason')}."])
    old = (cs.get("by_tie_rule") or {}).get("tolerance") or {}
    exact = (cs.get("by_tie_rule") or {}).get("exact") or {}
    f2 = lambda v: "n/a" if v is None else f"{v:.2f}"                    # noqa: E731
    pairs = "; ".join(f"{labels.get(p.split('|')[0])} vs {labels.get(p.split('|')[1])} {_num(v['tau_b'])}"
                      for p, v in cs["by_source_pair"].items())
    pt = cm["pairwise_top1_change_rate"]
    at = cm["all_metrics_top1_change_rate"]
    lines += [
        "| question | answer (default definitions) |",
        "|---|---|",
        f"| Do rankings agree **between sources** (same region, metric)? | {_agreement(cs)}; by pair (τ-b): {pairs}; "
        f"Kendall's W {_num(cs['kendall_w'])}. Old rule (means within {100 * par['rank_tolerance']:g}% tied): τ-b "
        f"{f2(old.get('tau_b'))}; exact ranks {f2(exact.get('tau_b'))} (headline metrics) |",
        f"| … **between operating regions** (same source, metric)? | {_agreement(cr)}; lightest vs heaviest τ-b "
        f"{_num(cr['extreme_regions']['tau_b'])} |",
        f"| … **between metrics** (same source, region)? | the best group changes between two headline metrics in "
        f"{_pct(pt)} of {pt['count']} (condition, metric pair) cases where both resolve a best group "
        f"({pt['undefined']} undefined); under every one of the {cm['n_metrics']} metrics at once (old rule): "
        f"{at['changed']} of {at['count']} conditions; τ-b/τ-b,max between headline metrics {_num(cm['tau_b_norm'])} |",
    ]
    slo = summary.get("slo_sensitivity") or {}
    if slo.get("available"):
        s1 = slo["top1_change_rate"]
        lines.append(f"| … **between SLO definitions**? | τ-b {_num(slo['tau_b'])}; the best scheduler depends on the SLO "
                     f"definition in {s1['changed']} of {s1['count']} conditions |")
    pre = rv.get("study_preset") or {}
    lines += ["", "| reversals between sources | default | study preset (original design) |", "|---|---|---|"]
    dsc = (f"{', '.join(rv['metrics'])}; {len(par['regions'])} regions; {rv['correction']}, one family per metric; "
           f"δ {rv['delta']['relative']:.0%} relative / {100 * rv['delta']['absolute']:g} pp")
    psc = (f"{pre.get('metric')}; regions {', '.join(pre.get('regions', []))}; {pre.get('correction')}, one family; "
           f"δ {_effect(pre['delta'], pre['scale'])}" if pre.get("available") else pre.get("reason", "n/a"))
    lines.append(f"| design | {dsc} | {psc} |")
    for key, name in (("comparisons", "comparisons"), ("sign_reversals", "flip sign"),
                      ("significant", f"significant on both sources (α = {par['alpha']})"),
                      ("significant_and_practical", "significant and ≥ δ on both")):
        d = rv[key]["value"]
        p_ = pre.get(key) if pre.get("available") else None
        n, pn = rv["comparisons"]["value"], pre.get("comparisons")
        rate = lambda v, t: "" if key == "comparisons" or not t else f" ({v / t:.1%})"    # noqa: E731
        lines.append(f"| {name} | {d:,}{rate(d, n)} | " + (f"{p_:,}{rate(p_, pn)}" if p_ is not None else "n/a") + " |")
    md = rv.get("most_dramatic")
    if md:
        lines.append(
            f"| the most dramatic (default) | **{md['a']} vs {md['b']}**, {md['metric']} at {md['region']}: "
            f"{md['a'] if md['diff_1'] > 0 else md['b']} better on {md['label_1']} by {_effect(md['effect_1'], md['scale'])}, "
            f"{md['a'] if md['diff_2'] > 0 else md['b']} better on {md['label_2']} by "
            f"{_effect(md['effect_2'], md['scale'])} | |")
    mde = (summary.get("power") or {}).get("by_metric") or {}
    if mde:
        lines += ["", "*Minimal detectable effect of one side test at "
                  f"{next(iter(mde.values()))['windows']} windows per source (power "
                  f"{next(iter(mde.values()))['target_power']:g}, α = {par['alpha']}): "
                  + "; ".join(f"{m} {_effect(d['mde'], d['scale']) if d['mde'] is not None else 'not reached'}"
                              + (f" ({_effect(d['mde_family'], d['scale'])} at α / m)" if d.get("mde_family") else "")
                              for m, d in mde.items()) + ", m = the tests of a per-metric family.*"]
    for w in (summary.get("power") or {}).get("warnings", []):
        lines += ["", f"**Warning:** {w}."]
    lines += _panel_table(summary, labels)
    others = [f"{n}: {p['reason']}" for n, p in (summary.get("panels") or {}).items() if not p["available"]]
    if others:
        lines += ["", "*Panels not available — " + "; ".join(others) + ".*"]
    return "\n".join(lines)


def _panel_table(summary: Mapping, labels: Mapping) -> list[str]:
    """Every available panel side by side (the headline first): its cross-source agreement and reversals."""
    head = summary.get("headline_panel")
    avail = {n: p for n, p in (summary.get("panels") or {}).items()
             if p.get("available") and "tau_b" in (p.get("cross_source") or {})}
    if len(avail) < 2:
        return []
    names = sorted(avail, key=lambda n: n != head)
    cols = [f"**{n}** ({', '.join(labels.get(s, s) for s in avail[n]['sources'])}; "
            + ("all real" if avail[n].get("all_real") else "stand-ins: its numbers describe the stand-ins")
            + ("; headline" if n == head else "") + ")" for n in names]

    def row(name, fn):
        return f"| {name} | " + " | ".join(fn(avail[n]) for n in names) + " |"

    def sp(p, key="significant_and_practical"):
        rv = p.get("reversals") or {}
        return f"{rv[key]['value']:,} of {rv['comparisons']['value']:,}" if key in rv else "n/a"

    def preset(p):
        pre = (p.get("reversals") or {}).get("study_preset") or {}
        return f"{pre['significant_and_practical']:,} of {pre['comparisons']:,}" if pre.get("available") else "n/a"

    cs = lambda p: p["cross_source"]                       # noqa: E731
    return ["", "| between sources, every panel | " + " | ".join(cols) + " |", "|---|" + "---|" * len(names),
            row("τ-b", lambda p: _num(cs(p)["tau_b"])),
            row("τ-b / τ-b,max", lambda p: _num(cs(p)["tau_b_norm"])),
            row("discordance (pairs resolved on both sides)",
                lambda p: f"{_pct(cs(p)['discordance'], 1)} ({cs(p)['discordance']['count']:,})"),
            row("conditions defined / all tied / total", lambda p: "{defined} / {all_tied} / {total}".format(
                **cs(p)["conditions"])),
            row("Kendall's W", lambda p: _num(cs(p).get("kendall_w"))),
            row("reversals significant and ≥ δ (default)", sp),
            row("… study preset", preset)]


def study_markdown(summary: Mapping) -> str:
    """What the study simulates, in one paragraph: schedulers, sources (real or stand-in), windows, regions, metrics."""
    par, prov, data = summary["parameters"], summary["provenance"], summary["data"]
    names = {s: v.get("name") or v["label"].removesuffix(" (stand-in)") for s, v in prov.items()}
    real = [names[s] for s, v in prov.items() if v["provenance"] == "real"]
    stand = [names[s] for s, v in prov.items() if v["provenance"] == "standin"]
    rho = data.get("rho") or {}
    loads = [rho[r] for r in par["regions"] if rho.get(r) is not None]
    windows = sorted({v["n_windows"] for v in prov.values()})
    per = (f"{windows[0]} windows of {par['window_size']:,} requests each" if len(windows) == 1 and par.get("window_size")
           else ", ".join(f"{v['n_windows']} {names[s]}" for s, v in prov.items()) + " windows")
    return (f"It simulates **{len(par['schedulers'])} scheduling strategies** ({', '.join(par['schedulers'])}) on "
            f"**{sum(v['n_windows'] for v in prov.values()):,} frozen windows** of {len(prov)} public traces ({per}"
            + (f"; real here: {', '.join(real)}" if real else "")
            + (f"; labelled stand-ins: {', '.join(stand)}" if stand else "")
            + f") in **{len(par['regions'])} operating regions**"
            + (f" from ρ = {min(loads):g} to ρ = {max(loads):g}" if loads else "")
            + f", scores every run on **{len(par['metrics'])} metrics** ({len(summary['headline_metrics'])} headline: "
            f"{', '.join(summary['headline_metrics'])}) — {data['n_runs']:,} runs — and asks, for every pair of "
            "schedulers, whether its order holds across sources, regions and metrics; the key reversals are replayed "
            "through a real vLLM engine.")


def headline_markdown(summary: Mapping) -> str:
    """The headline in one sentence: what ports across sources beside across regions, and how many orders are
    clear on both sides at all."""
    h = summary.get("headline") or {}
    if not h.get("concordance"):
        return "The headline (what ports) is not in this summary: rerun the analysis (`make all`)."
    labels = {s: v["label"] for s, v in (summary.get("provenance") or {}).items()}
    cs, cr = h["concordance"]["across_sources"], h["concordance"]["across_regions"]
    fw = (h.get("four_way") or {}).get("across_sources") or {}
    both = (fw["same_order"]["share"] + fw["reversal"]["share"]) if fw else None
    return (f"**Of the scheduler orders that are clearly there on two sources "
            f"({', '.join(labels.get(s, s) for s in h.get('sources', []))}), {ports_text.conc(cs)} keep their order "
            f"when the workload source changes, against {ports_text.conc(cr)} when only the load changes**; "
            + (f"{ports_text.pct(both)} of the {fw['total']:,} cross-source comparisons are clear on both sides."
               if both is not None else "the four-way table is not in this summary."))


BLOCKS = {"study": study_markdown, "headline": headline_markdown, "robustness": robustness_text.robustness_markdown,
          "paper": robustness_text.paper_markdown, "results": results_markdown}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def update_blocks(path: str | Path, summary: Mapping) -> dict[str, str]:
    """Replace every generated block of :data:`BLOCKS` found in ``path``; returns ``{name: block}``; the file is
    rewritten only when a block changed."""
    path = Path(path)
    text = new = path.read_text()
    found: dict[str, str] = {}
    for name, make in BLOCKS.items():
        start, end = markers(name)
        if start not in new and end not in new:
            continue
        if new.count(start) != 1 or new.count(end) != 1 or new.index(start) > new.index(end):
            raise DataError(path, f"expected the markers {start} and {end} once each, in that order")
        found[name] = block = make(summary)
        head, rest = new.split(start, 1)
        new = f"{head}{start}\n{block}\n{end}{rest.split(end, 1)[1]}"
    if not found:
        raise DataError(path, f"expected the markers {START} and {END} around the results block (or another "
                              f"generated block: {', '.join(BLOCKS)})")
    if new != text:
        outputs.check_write(path)        # a study of the user's own never writes the default study's README
        path.write_text(new)
    return found


def update_readme(readme: str | Path, summary_path: str | Path) -> str:
    """Replace the README's generated blocks with those for ``summary_path``, and the full results block of
    ``docs/results.md`` beside it when that page exists; returns the README's blocks, in file order."""
    summary_path, readme = Path(summary_path), Path(readme)
    if not summary_path.is_file():
        raise DataError(summary_path, "no analysis summary: run the notebooks (make all) or portbench analyze first")
    summary = json.loads(summary_path.read_text())
    found = update_blocks(readme, summary)
    page = readme.parent / "docs" / "results.md"
    if page.is_file():
        update_blocks(page, summary)
    return "\n".join(found.values())
