"""Generated text of notebook 10 and ``portbench attribute``: every sentence is written from the computed values
(``summary.json["attribution"]``), so it changes when they do."""

from __future__ import annotations

from collections.abc import Mapping

from .text import fmt


def _pct(x) -> str:
    if x is None:
        return "n/a"
    v = round(100 * x)
    return f"{0 if v == 0 else v}%"


def _num(stat: Mapping, digits: int = 2) -> str:
    """``0.43 [0.37, 0.49]`` (value and CI, no count)."""
    return fmt({k: v for k, v in stat.items() if k != "count"}, digits)


def _share(s: Mapping) -> str:
    if s.get("value") is None:
        return "n/a"
    ci = s.get("ci") or [None, None]
    return f"{_pct(s['value'])}" + (f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci[0] is not None else "")


def design_markdown(sec: Mapping) -> str:
    """The method paragraph: pairs, players, hybrids, reduced design, distance, ties, bootstrap, load."""
    d = sec["design"]
    pairs = "; ".join(f"{p['label_a']} → {p['label_b']}" for p in sec["pairs"].values())
    regions = ", ".join(f"{r} (ρ = {rho:g})" for r, rho in d["regions"].items())
    dist = {"kendall": "Kendall's distance with ties: (discordant scheduler pairs + ½ × pairs tied in exactly one of "
                       "the two rankings) / all pairs — 0 = the same ranking (ties included), 1 = exactly reversed",
            "tau_b": "1 − Kendall's τ-b"}[d["distance"]]
    return (f"**Design.** Source pairs (A → B; the hybrids are A's windows with properties of B): {pairs}. "
            f"Players of the decomposition ({len(d['players'])}, so {d['subsets_per_pair']} hybrids per pair, from "
            f"A itself to B): {', '.join(f'`{p}`' for p in d['players'])}. Each pair is simulated on "
            f"{d['windows_per_source']} window pairs (A's i-th with B's i-th, evenly spaced through each source's "
            f"frozen windows), in {regions}, with {len(d['schedulers'])} schedulers and {d['replicates']} "
            f"replicate{'s' if d['replicates'] != 1 else ''} per window: {d['runs']:,} runs. Rankings are over {', '.join(d['metrics'])} ({d['metrics_from']}), "
            f"with {d['ties']}. The distance decomposed is {dist}. CIs: 95% percentile bootstrap, {d['bootstrap']} "
            f"resamples of the window pairs (seed {d['seed']}), the same resample for every hybrid of a pair. "
            f"Load: {d['load']}.")


def pair_markdown(pr: Mapping, players) -> str:
    """What the decomposition says for one pair (shares, the largest one, interaction), from the values."""
    title = f"{pr['label_a']} → {pr['label_b']}"
    dis = pr["disagreement"]
    if not dis.get("value"):
        return (f"**{title}.** The two sources rank the schedulers identically on these windows (distance "
                f"{fmt(dis)}), so there is nothing to attribute.")
    shares = sorted(((p, pr["shares"][p]) for p in players), key=lambda kv: -(kv[1]["value"] or -9))
    top, top_s = shares[0]
    inter = pr["interaction"]
    txt = (f"**{title}.** Swapping every property moves A's ranking by {_num(dis)} (mean over "
           f"{dis.get('count')} region × metric conditions). Of that, **{top}** accounts for {_share(top_s)}; "
           + ", ".join(f"{p} {_share(s)}" for p, s in shares[1:]) + ". ")
    lo = top_s.get("ci", [None])[0]
    if lo is not None and len(shares) > 1 and shares[1][1].get("ci", [None, None])[1] is not None \
            and lo > shares[1][1]["ci"][1]:
        txt += f"Its interval lies above every other property's: {top} is the property that moves this ranking. "
    elif len(shares) > 1:
        txt += (f"Its interval overlaps {shares[1][0]}'s, so the data do not single out one property. ")
    neg = [p for p, s in shares if s.get("value") is not None and s["value"] < 0]
    if neg:
        txt += (f"A negative share ({', '.join(neg)}) means that swapping that property moves the ranking back "
                "towards A's on average over the orders of swapping. ")
    rel = inter.get("relative")
    if inter.get("interact"):
        kind = ("overlap or offset: together they move the ranking less than the sum of their separate moves (the "
                "distance saturates — two unrelated rankings are about 0.5 apart — and two swaps can flip the same "
                "scheduler pair, or flip it back)") if inter["value"] < 0 else \
            "reinforce each other: together they move the ranking more than the sum of their separate moves"
        txt += (f"**The properties interact**: the sum of the single swaps is {inter['sum_of_singles']:.2f} but the "
                f"full swap is {dis['value']:.2f} (difference {_num(inter)}"
                + (f", {abs(rel):.0%} of the full swap" if rel is not None else "")
                + f"). They {kind}; so one swap's effect depends on the others, and each share is an average over the "
                  "orders of swapping, not a separable effect.")
    else:
        txt += (f"The single swaps add up to the full swap within the bootstrap interval (difference {_num(inter)}): "
                "no detectable interaction, so each share is also roughly that property's effect on its own.")
    return txt


def singles_markdown(sec: Mapping) -> str:
    """What each single swap does on its own (distance from A's ranking, top-1 kept), per pair."""
    parts = []
    for pr in sec["pairs"].values():
        singles = [(h["players"][0], h) for h in pr["hybrids"].values() if len(h["players"]) == 1]
        singles.sort(key=lambda kv: -(kv[1]["distance_vs_a"] or 0))
        if not singles:
            continue
        full = pr["hybrids"].get("all", {})
        parts.append(f"{pr['label_a']} → {pr['label_b']}: "
                     + ", ".join(f"{p} alone moves A's ranking by {h['distance_vs_a']:.2f} (top-1 kept in "
                                 f"{_pct(h['top1_kept_vs_a'])} of the conditions)" for p, h in singles)
                     + f"; all together by {full.get('distance_vs_a', float('nan')):.2f} (top-1 kept in "
                       f"{_pct(full.get('top1_kept_vs_a'))})")
    return ("**Single swaps.** " + "; ".join(parts) + ". Distances are means over the region × metric conditions; "
            "the Shapley values above average each property's effect over every order of swapping.") if parts else ""


def checks_markdown(sec: Mapping) -> str:
    """The endpoint checks against the campaign's runs and how representative the reduced design is."""
    parts = []
    for pair, e in (sec.get("endpoints") or {}).items():
        pr = sec["pairs"][pair]
        a, b = e.get("a"), e.get("b")
        if a:
            parts.append(f"{pr['label_a']} → {pr['label_b']}: the hybrid that swaps nothing reproduces the campaign's "
                         f"{a['runs']} runs of A bit for bit in {a['identical']} of {a['runs']}")
        if b:
            beyond = ", ".join(b["schedulers_beyond_rounding"]) or "none"
            tol = b.get("max_relative_difference_others")
            parts.append("the hybrid that swaps everything matches the campaign's runs of B to rounding "
                         + (f"(relative difference ≤ {tol:.1g}) " if tol is not None else "")
                         + f"in {b['within_rounding']} of {b['runs']}; the rest are runs of {beyond}: schedulers "
                         "that draw random numbers are run with A's seeds on every hybrid (common random numbers), "
                         "so there they are another replicate of B")
    rep = []
    for pr in sec["pairs"].values():
        r = pr.get("representative") or {}
        if r.get("a") and r["a"].get("value") is not None:
            rep.append(f"{pr['label_a']} {r['a']['value']:.2f}, {pr['label_b']} "
                       + (f"{r['b']['value']:.2f}" if r.get("b") and r["b"].get("value") is not None else "n/a"))
    txt = ""
    if parts:
        txt += "**Checks.** " + "; ".join(parts) + ". "
    if rep:
        txt += ("How well the reduced design reproduces the study's rankings (mean τ-b between a source's ranking on "
                "the attribution's windows and its ranking over every window and replicate of the campaign, same "
                "regions and metrics): " + "; ".join(rep) + ". The decomposition explains the disagreement *on these "
                "windows*; where that τ-b is low, the study's own A → B disagreement may differ.")
    return txt or "No campaign runs to check the attribution against (run notebook 03 and the analysis first)."


def tracing_markdown(tracing, sec: Mapping) -> str:
    """The reversal tracing: how many were traced and which properties reproduce them."""
    if tracing is None or tracing.height == 0:
        return ("**Reversal tracing.** " + (sec.get("tracing") or "")
                + " No significant-and-practical reversal between these pairs' sources to trace.")
    traced = tracing.filter(tracing["status"] == "traced")
    n_out = int((tracing["status"] == "outside the attribution design").sum())
    n_not = tracing.height - traced.height - n_out
    txt = (f"**Reversal tracing.** The analysis finds {tracing.height} significant-and-practical reversal(s) between "
           f"these pairs' sources; {n_out} lie outside the attribution's regions or metrics. Of the "
           f"{tracing.height - n_out} inside, {traced.height} hold on the attribution's windows (A's order on A, B's "
           f"order on the full swap) and are traced")
    txt += f"; {n_not} do not hold on these windows (fewer windows than the study's)." if n_not else "."
    if traced.height:
        sizes = traced["minimal_size"].value_counts().sort("minimal_size")
        txt += (" Smallest number of swapped players that reproduces B's order: "
                + ", ".join(f"{c} reversal(s) need {s}" for s, c in sizes.iter_rows()) + ". ")
        firsts = traced["minimal_sets"].str.split(" | ").list.first().value_counts().sort("count", descending=True)
        txt += "The sets that do it most often: " + ", ".join(f"`{s}` ({c})" for s, c in firsts.head(4).iter_rows()) + "."
    return txt


def cost_markdown(sec: Mapping, campaign_rate: float | None = None) -> str:
    """Measured cost of this design and the extrapolated cost of the full one (from the CPU time per run, so
    that other jobs on the machine do not inflate it; ``campaign_rate``: the campaign's runs per CPU second)."""
    c, d = sec.get("cost") or {}, sec["design"]
    cpu_rate = c.get("runs_per_cpu_s")
    if not cpu_rate:
        return "**Cost.** Every run was reused from an earlier computation; no timing was recorded."
    w = int(c.get("workers") or 1)
    n_pairs = len(sec["pairs"])
    full = n_pairs * 32 * len(d["schedulers"]) * 40 * 6 * 3
    txt = (f"**Cost.** {'(Timing of the run that computed these results; this one reused them.) ' if c.get('reused') else ''}"
           f"{c['simulated_runs']:,} runs were simulated in {c['simulation_wall_s']:.0f} s of wall time on {w} worker "
           f"process(es), which got {100 * (c.get('cpu_share') or 0):.0f}% of a core each (the machine was shared); "
           f"they used {c['simulation_cpu_s']:.0f} CPU-seconds, {cpu_rate:.0f} runs per CPU-second, so on {w} free "
           f"core(s) this design takes about {c['simulated_runs'] / cpu_rate / w:.0f} s "
           f"(plus {max(0.0, c['wall_s'] - c['simulation_wall_s']):.0f} s for building, freezing and reading, and the "
           f"bootstrap). The full design — the five properties separately (32 hybrids), every window (40), every region "
           f"(6) and the study's replicates (3) for these {n_pairs} pair(s) — is {full:,} runs: about "
           f"{full / cpu_rate / w / 3600:.1f} h on {w} core(s) at this design's rate")
    if campaign_rate:
        txt += (f" ({full / campaign_rate / w / 3600:.1f} h at the campaign's all-region rate of {campaign_rate:.0f} "
                "runs per CPU-second; heavy regions cost more per run than light ones)")
    return txt + "."
