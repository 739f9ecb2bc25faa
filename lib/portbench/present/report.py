"""The README's results block, written from ``summary.json`` (``portbench report``; ``make all`` runs it).

Every number in the block is read from the summary the analysis wrote; the block sits between the
markers ``<!-- results:start -->`` and ``<!-- results:end -->`` and nothing else in the README changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ..core.errors import DataError
from ..core.provenance import DISPLAY

START, END = "<!-- results:start -->", "<!-- results:end -->"


def _num(x: Mapping, digits: int = 2) -> str:
    """``0.21 [0.18, 0.26]`` from a summary entry ``{"value", "ci"}``."""
    if x is None or x.get("value") is None:
        return "n/a"
    ci = x.get("ci")
    out = f"{x['value']:.{digits}f}"
    if ci and None not in ci:
        out += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return out


def results_markdown(summary: Mapping) -> str:
    """Markdown of the headline numbers of one analysis summary."""
    prov = summary["provenance"]
    labels = {s: v["label"] for s, v in prov.items()}
    data, par = summary["data"], summary["parameters"]
    cs, cr, rv, cm = summary["cross_source"], summary["cross_region"], summary["reversals"], summary["cross_metric"]
    slo = summary.get("slo_sensitivity", {})
    real = [DISPLAY.get(s, s) for s, v in prov.items() if v["provenance"] == "real"]
    stand = [DISPLAY.get(s, s) for s, v in prov.items() if v["provenance"] == "standin"]
    pairs = ", ".join(f"{labels[p.split('|')[0]]} vs {labels[p.split('|')[1]]} {_num(v)}"
                      for p, v in sorted(cs["by_source_pair"].items(), key=lambda kv: -(kv[1]["value"] or 0)))
    md = rv["most_dramatic"]
    t1 = cm["top1_change_rate"]
    lines = [
        f"*{data['n_runs']:,} simulated runs: {len(par['schedulers'])} schedulers × "
        + ", ".join(f"{v['n_windows']} {labels[s]}" for s, v in prov.items())
        + f" windows × {len(par['regions'])} regions × {data['replicates']} replicates; "
        f"real sources: {', '.join(real) or 'none'}"
        + (f"; stand-ins: {', '.join(stand)}" if stand else "") + ". Kendall τ-b means with 95% bootstrap CIs"
        + (f"; ranks tie means within {100 * par['rank_tolerance']:g}% (analysis.rank_tolerance)"
           if par.get("rank_tolerance") else "") + ".*",
        "",
        "| question | answer |",
        "|---|---|",
        f"| Do rankings agree **between sources** (same region, metric)? | mean τ-b {_num(cs['mean_tau'])} "
        f"over {cs['mean_tau']['count']} conditions; by pair: {pairs}; Kendall's W {_num(cs['kendall_w'])} |",
        f"| … **between operating regions** (same source, metric)? | mean τ-b {_num(cr['mean_tau'])}; "
        f"neighbouring regions {_num(cr['adjacent_regions_tau'])}, lightest vs heaviest "
        f"{_num(cr['extreme_regions_tau'])} |",
        f"| … **between metrics** (same source, region)? | mean τ-b {_num(cm['mean_tau'])}; the best scheduler "
        f"depends on the metric in {round(t1['value'] * t1['count'])} of {t1['count']} conditions |",
    ]
    if slo.get("available"):
        s1 = slo["top1_change_rate"]
        lines.append(f"| … **between SLO definitions**? | mean τ-b {_num(slo['mean_tau'])}; the best scheduler "
                     f"depends on the SLO definition in {round(s1['value'] * s1['count'])} of {s1['count']} conditions |")
    lines += [
        f"| How many scheduler-pair orders **reverse between sources**? | of {rv['comparisons']['value']:,} "
        f"comparisons: {rv['sign_reversals']['value']:,} flip sign, {rv['significant']['value']:,} significantly on "
        f"both sources ({par['correction']}, α = {par['alpha']}), {rv['significant_and_practical']['value']:,} "
        f"significantly and by ≥ {par['delta']:.0%} on both |",
    ]
    if md:
        lines.append(
            f"| The most dramatic reversal | **{md['a']} vs {md['b']}**, {md['metric']} at {md['region']}: "
            f"{md['a'] if md['diff_1'] > 0 else md['b']} better on {md['label_1']} by {md['rel_1']:.0%}, "
            f"{md['a'] if md['diff_2'] > 0 else md['b']} better on {md['label_2']} by {md['rel_2']:.0%} |")
    return "\n".join(lines)


def update_readme(readme: str | Path, summary_path: str | Path) -> str:
    """Replace the README's results block with the block for ``summary_path``; returns the block."""
    summary_path, readme = Path(summary_path), Path(readme)
    if not summary_path.is_file():
        raise DataError(summary_path, "no analysis summary: run the notebooks (make all) or portbench analyze first")
    block = results_markdown(json.loads(summary_path.read_text()))
    text = readme.read_text()
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise DataError(readme, f"expected the markers {START} and {END} around the results block")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{block}\n{END}{tail}")
    return block
