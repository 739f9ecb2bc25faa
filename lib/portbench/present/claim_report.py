"""The one-page HTML report of a checked claim (``portbench claim``), written into the results site.

Self-contained (inline CSS and SVG, no script, no external file): the verdict, a grid of the sides
(source x region: who is strongly better, the signed effect and its interval), the four-way tables across
sources and across regions, where the order reverses, what the attribution says, and every input a
citation needs (the policy's source hash or class and vLLM version, the windows, regions, metric, delta,
alpha, correction, bootstrap). The page lives at ``<site>/claims/<policy>_vs_<baseline>_<metric>.html``;
the site's index links every page of ``claims/``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from ..core import io as fileio

COLOURS = {"policy_better": "#1a9850", "baseline_better": "#d73027", "equivalent": "#bdbdbd", "undetermined": "#ffffff"}
LEGEND = {"policy_better": "{p} strongly better", "baseline_better": "{b} strongly better",
          "equivalent": "equivalent (within ±δ)", "undetermined": "undetermined"}


def page_name(policy: str, baseline: str, metric: str) -> str:
    """``<policy>_vs_<baseline>_<metric>.html`` with every character outside [A-Za-z0-9_.-] replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{policy}_vs_{baseline}_{metric}") + ".html"


def _e(x) -> str:
    return html.escape(str(x))


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _tag(s: dict, policy: str) -> str:
    if s["class"] == "strong":
        return "policy_better" if s["better"] == policy else "baseline_better"
    return s["class"]


def _grid(res: dict) -> str:
    """An SVG grid: one row per source, one column per region; colour = class, text = signed effect [CI]."""
    c = res["claim"]
    srcs, regs = c["sources"], c["regions"]
    cw, ch, lw, th = 160, 58, 120, 34
    W, H = lw + cw * len(regs) + 2, th + ch * len(srcs) + 2
    by = {(s["source"], s["region"]): s for s in res["sides"]}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
           f'aria-label="sides of the claim: sources by regions">']
    for j, r in enumerate(regs):
        rho = res["inputs"]["rho"].get(r)
        out.append(f'<text x="{lw + j * cw + cw / 2}" y="14" text-anchor="middle" font-size="12">{_e(r)}</text>'
                   f'<text x="{lw + j * cw + cw / 2}" y="28" text-anchor="middle" font-size="11" fill="#555">'
                   f'ρ = {rho}</text>')
    for i, s in enumerate(srcs):
        y = th + i * ch
        out.append(f'<text x="{lw - 8}" y="{y + ch / 2 + 4}" text-anchor="end" font-size="12">{_e(s)}</text>')
        for j, r in enumerate(regs):
            x = lw + j * cw
            side = by.get((s, r))
            if side is None:
                out.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="#f0f0f0" stroke="#999"/>'
                           f'<text x="{x + cw / 2}" y="{y + ch / 2 + 4}" text-anchor="middle" font-size="11">n/a</text>')
                continue
            t = _tag(side, c["policy"])
            fill = COLOURS[t]
            ink = "#fff" if t in ("policy_better", "baseline_better") else "#000"
            ci = side["ci"]
            cis = f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci[0] is not None else ""
            out.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{fill}" stroke="#666">'
                       f'<title>{_e(s)} @ {_e(r)}: {_e(side["class"])}'
                       f'{" (" + _e(side["better"]) + " better)" if side["better"] else ""}; effect {_pct(side["effect"])} '
                       f'{cis}; mean {c["policy"]} {side["mean_policy"]}, {c["baseline"]} {side["mean_baseline"]}; '
                       f'p_adj {side["p_adj"]}, TOST p_adj {side["p_tost_adj"]}; {side["windows"]} windows</title></rect>'
                       f'<text x="{x + cw / 2}" y="{y + 18}" text-anchor="middle" font-size="13" fill="{ink}" '
                       f'font-weight="bold">{_pct(side["effect"])}</text>'
                       f'<text x="{x + cw / 2}" y="{y + 33}" text-anchor="middle" font-size="10" fill="{ink}">{cis}</text>'
                       f'<text x="{x + cw / 2}" y="{y + 47}" text-anchor="middle" font-size="10" fill="{ink}">'
                       f'{c["metric"] + " " + _pct(side["change"]) if side.get("change") is not None else ""}</text>')
    out.append("</svg>")
    return "".join(out)


def _four_way(res: dict) -> str:
    rows = []
    for kind in ("across_sources", "across_regions"):
        fw = res["four_way"].get(kind)
        cc = res["concordance"].get(kind) or {}
        if not fw:
            rows.append(f"<tr><td>{kind.replace('_', ' ')}</td><td colspan=6>n/a ({_e(cc.get('definition', ''))})</td></tr>")
            continue
        ci = cc.get("ci") or [None, None]
        conc = "n/a" if cc.get("value") is None else (
            f"{cc['value']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci[0] is not None else ""))
        rows.append(f"<tr><td>{kind.replace('_', ' ')}</td>" + "".join(
            f"<td>{fw[k]['count']}</td>" for k in ("same_order", "reversal", "one_side", "neither"))
            + f"<td>{fw['total']}</td><td>{conc}</td></tr>")
    return ("<table><tr><th>comparisons</th><th>same order</th><th>reversal</th><th>strong on one side</th>"
            "<th>strong on neither</th><th>total</th><th>concordance [95% CI]</th></tr>" + "".join(rows) + "</table>")


def _reversals(res: dict) -> str:
    rv = res["reversals"]
    if not rv:
        return "<p>No comparison of two sides reverses the order (no pair of sides strong in opposite orders).</p>"
    items = [f"<li>{_e(r['source_1'])} vs {_e(r['source_2'])} at {_e(r['region'])}</li>" if r["kind"] == "across_sources"
             else f"<li>{_e(r['source'])}: {_e(r['region_1'])} vs {_e(r['region_2'])}</li>" for r in rv]
    at = res["attribution"]
    if not at.get("available"):
        att = f"<p>Attribution: {_e(at.get('reason'))}.</p>"
    else:
        parts = []
        for t in at.get("traced", []):
            parts.append(f"<li>traced ({_e(t['pair'])}, {_e(t['region'])}): {_e(t['status'])}"
                         + (f"; smallest reproducing set(s): <b>{_e(t['minimal_sets'])}</b>" if t["minimal_sets"] else "")
                         + "</li>")
        for lead in at.get("leading", []):
            ci = lead["share_ci"]
            parts.append(f"<li>{_e(lead['sources'])} at {_e(lead['region'])}: leading property <b>{_e(lead['property'])}</b>"
                         f" (share {_pct(lead['share'])}" + (f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci[0] is not None else "")
                         + f") -- {_e(lead['what'])}</li>")
        att = ("<p>Attribution:</p><ul>" + "".join(parts) + "</ul>") if parts else f"<p>Attribution: {_e(at.get('note'))}.</p>"
    return f"<p>{len(rv)} comparison(s) reverse:</p><ul>{''.join(items)}</ul>{att}"


def _inputs(res: dict) -> str:
    i = res["inputs"]
    pol = i["policy"]
    pol_txt = "; ".join(f"{_e(k)}: {_e(v)}" for k, v in pol.items())
    ws = ", ".join(f"{_e(s)} {n} ({_e(i['window_ids'][s][0])} … {_e(i['window_ids'][s][1])}, {_e(i['provenance'][s])})"
                   for s, n in i["windows_per_source"].items())
    rows = [("policy", pol_txt), ("baseline", _e(i["baseline"])), ("metric", _e(i["metric"])),
            ("panel", f"{_e(i['panel'])}: {_e(', '.join(i['sources']))}"), ("windows per source", ws),
            ("regions (ρ)", _e(", ".join(f"{r} {v}" for r, v in i["rho"].items()))),
            ("δ", _e(i["delta"])), ("α", _e(i["alpha"])), ("correction within each ranking", _e(i["tie_correction"])),
            ("ranking (correction family)", _e(", ".join(i["schedulers_in_ranking"]))),
            ("interval", _e(i["interval"])), ("block lengths", _e(json.dumps(i["block_lengths"]))),
            ("side classes", _e(i["definition"])), ("runs read (SHA-256, 16 hex)", _e(i["runs_sha256_16"]))]
    if i.get("notes"):
        rows.append(("notes", _e("; ".join(i["notes"]))))
    if i.get("portbench"):
        rows.append(("portbench", _e(i["portbench"])))
    return "<table class=kv>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


CSS = ("body{font-family:system-ui,sans-serif;max-width:1150px;margin:1.2em auto;padding:0 1em;color:#222}"
       "h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.4em}table{border-collapse:collapse;font-size:.9em}"
       "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}"
       ".verdict{font-size:1.15em;padding:.6em .9em;border-radius:6px;margin:.6em 0}"
       ".holds,.holds_where_resolved{background:#e5f5e0}.reverses,.opposite{background:#fde0dd}"
       ".equivalent,.unresolved{background:#f0f0f0}.legend span{display:inline-block;width:14px;height:14px;"
       "border:1px solid #666;margin:0 4px -2px 12px}table.kv th{width:16em;background:#fafafa}")


def render(res: dict) -> str:
    """The page's HTML text."""
    c, n = res["claim"], res["counts"]
    legend = "".join(f'<span style="background:{COLOURS[k]}"></span>{_e(v.format(p=c["policy"], b=c["baseline"]))}'
                     for k, v in LEGEND.items())
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>Claim: {_e(c['policy'])} beats {_e(c['baseline'])} on {_e(c['metric'])}</title><style>{CSS}</style></head><body>
<p><a href="../index.html">← results site</a></p>
<h1>Does “{_e(c['policy'])} beats {_e(c['baseline'])} on {_e(c['metric'])}” port?</h1>
<p>{_e(c['metric'])} ({_e(c['direction'])}); panel <b>{_e(c['panel'])}</b>: {_e(', '.join(c['sources']))}; {len(c['regions'])} operating regions.</p>
<div class="verdict {_e(res['verdict'])}"><b>{_e(res['verdict'].replace('_', ' ').upper())}</b> — {_e(res['verdict_text'])}.
 Sides: {_e(c['policy'])} better on {n['policy_better']}, {_e(c['baseline'])} better on {n['baseline_better']},
 equivalent on {n['equivalent']}, undetermined on {n['undetermined']} of {len(res['sides'])}.</div>
<h2>Each side (source × region)</h2>
<p>Cell: the signed effect (+ = {_e(c['policy'])} better; the headline's effect size, compared with δ) and its 95% interval,
then {_e(c['policy'])}'s {_e(c['metric'])} relative to {_e(c['baseline'])}'s; colour: the side's class.
Hover a cell for the means and adjusted p-values.</p>
{_grid(res)}
<p class="legend">{legend}</p>
<h2>Four-way: across sources and across regions</h2>
{_four_way(res)}
<p>A comparison is two sides of this pair: two sources in one region, or two regions of one source. Concordance =
same order / (same order + reversal), over the comparisons strong on both sides.</p>
<h2>Where it reverses</h2>
{_reversals(res)}
<h2>Inputs (cite these)</h2>
{_inputs(res)}
</body></html>
"""


def write(res: dict, site_dir: Path) -> Path:
    """Write the page into ``<site_dir>/claims/`` (atomically); returns its path."""
    c = res["claim"]
    path = Path(site_dir) / "claims" / page_name(c["policy"], c["baseline"], c["metric"])
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render(res)
    fileio.atomic_write(path, lambda t: Path(t).write_text(text, encoding="utf-8"))
    return path
