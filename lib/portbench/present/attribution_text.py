"""Generated text of notebook 09 and ``portbench attribute``: every sentence is written from the computed values
(``summary.json["attribution"]``), so it changes when they do."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from . import numbers
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
    return numbers.with_ci(_pct(s["value"]), s.get("ci"), num=_pct)


def design_markdown(sec: Mapping) -> str:
    """The method paragraph: pairs, players, hybrids, reduced design, distance, ties, bootstrap, load."""
    d = sec["design"]
    pairs = "; ".join(f"{p['label_a']} → {p['label_b']}" for p in sec["pairs"].values())
    regions = ", ".join(f"{r} (ρ = {rho:g})" for r, rho in d["regions"].items())
    dist = {"kendall": "Kendall's distance with ties: (discordant scheduler pairs + ½ × pairs tied in exactly one of "
                       "the two rankings) / all pairs — 0 = the same ranking (ties included), 1 = exactly reversed",
            "tau_b": "1 − Kendall's τ-b"}[d["distance"]]
    plan = (sec.get("cost") or {}).get("plan", {}).get("design", {})
    sim = (f" ({plan['simulated_runs']:,} of them simulated: {plan['window_hybrids']} distinct window-hybrids per window "
           "pair, since subsets that differ only in `load` share their runs)") if plan.get("simulated_runs") else ""
    game = d.get("players_in_game") or d["players"]
    dropped = d.get("players_dropped") or {}
    drop = (f" The game is on the {len(game)} players that can matter ({', '.join(f'`{p}`' for p in game)}): "
            + "; ".join(f"`{p}` is left out — {why}" for p, why in dropped.items()) + ".") if dropped else ""
    return (f"**Design.** Source pairs (A → B; the hybrids are A's windows with properties of B): {pairs}. "
            f"Players of the design ({len(d['players'])}, so {d['subsets_per_pair']} hybrids per pair, from "
            f"A itself to B): {', '.join(f'`{p}`' for p in d['players'])}.{drop} Each pair is simulated on "
            f"{d['windows_per_source']} window pairs (A's i-th with B's i-th, evenly spaced through each source's "
            f"frozen windows), in {regions}, with {len(d['schedulers'])} schedulers and {d['replicates']} "
            f"replicate{'s' if d['replicates'] != 1 else ''} per window: {d['runs']:,} runs{sim}. Rankings are over "
            f"{', '.join(d['metrics'])} ({d['metrics_from']}), with {d['ties']}. The distance decomposed is {dist}. "
            f"CIs: 95% percentile bootstrap, {d['bootstrap']} resamples of the window pairs (seed {d['seed']}), the "
            f"same resample for every hybrid of a pair. Load: {d['load']}.")


def load_markdown(sec: Mapping) -> str:
    """Why the load swap is the identity, with the measured utilisations (finite window vs steady state)."""
    parts = []
    for pr in sec["pairs"].values():
        for reg, u in (pr.get("load") or {}).items():
            if u.get("a_window") is None:
                continue
            steady = (f"; in steady state (each window repeated to ≥ {sec['design'].get('steady_requests', 0):,} "
                      f"requests) {u['a_steady']:.2f} and {u['b_steady']:.2f}") if u.get("a_steady") is not None else ""
            parts.append(f"{pr['label_a']} / {pr['label_b']} at {reg}: {u['a_window']:.2f} and {u['b_window']:.2f} in "
                         f"the attribution's windows{steady}; the hybrids' windows range over "
                         f"{u['hybrids_window_min']:.2f}–{u['hybrids_window_max']:.2f}")
    if not parts:
        return ""
    return ("**Load.** Every hybrid runs at the region's ρ on the sustainable throughput of its own requests — the "
            "study's load, under which the two sources of a pair are equally loaded — so the `load` swap is the "
            "identity and its Shapley value is 0. The achieved utilisation of the reference policy differs between "
            "the sources' finite windows all the same: " + "; ".join(parts) + ". That difference comes from how a "
            "window's requests fill the engine before it ends (how much work its long requests still hold at the "
            "last arrival, how deep its queue gets), i.e. from its lengths and arrival pattern, and the attribution "
            "credits it to them; in steady state the sources' utilisations agree far more closely. (Rescaling a "
            "hybrid to another window's utilisation would count that effect twice, and is not even possible in "
            "general: a finite window's utilisation cannot always be reached by another request mix.)")


def joint_markdown(sec: Mapping) -> str:
    """The joint (prompt, output) pairs as one group, per pair (from the same runs)."""
    parts = []
    for pr in sec["pairs"].values():
        j = pr.get("joint")
        if not j:
            continue
        ci = j.get("share_ci") or [None, None]
        parts.append(f"{pr['label_a']} → {pr['label_b']}: B's requests on A's arrival times (`{j['hybrid']}`) move A's "
                     f"ranking by {j['distance_vs_a']:.2f} and end {j['distance_vs_b']:.2f} from B's (top-1 kept in "
                     f"{_pct(j['top1_kept_vs_a'])} of the conditions); as one player against the arrival pattern its "
                     f"share is {_share({'value': j['share'], 'ci': ci})} (the sum of its members' shares above: "
                     f"{_pct(j['members_share'])})")
    if not parts:
        return ("**Joint (prompt, output) pairs.** Not expressible with these players: a player mixes a joint "
                "property (prompt, output, coupling) with another.")
    what = sec["design"].get("joint", "")
    return ("**Joint (prompt, output) pairs.** " + what[:1].upper() + what[1:] + ". " + "; ".join(parts)
            + ". The group's share comes from the two-player game {joint pairs, the rest} on the same hybrids; it "
              "differs from the sum of its members' shares by how they interact with the arrival pattern.")


def pair_markdown(pr: Mapping, players, robust: Mapping | None = None) -> str:
    """What the decomposition says for one pair (shares, the largest one, interaction), from the values;
    ``robust``: the pair's entry of the robustness section (the claim is qualified when it is not robust)."""
    title = f"{pr['label_a']} → {pr['label_b']}"
    dis = pr["disagreement"]
    if not dis.get("value"):
        return (f"**{title}.** The two sources rank the schedulers identically on these windows (distance "
                f"{fmt(dis)}), so there is nothing to attribute.")
    shares = sorted(((p, pr["shares"][p]) for p in players if p in pr["shares"]),
                    key=lambda kv: -(kv[1]["value"] or -9))
    top, top_s = shares[0]
    inter = pr["interaction"]
    ishare = pr.get("interaction_share") if (pr.get("interaction_share") or {}).get("value") is not None else None
    txt = (f"**{title}.** Swapping every property moves A's ranking by {_num(dis)} (mean over "
           f"{dis.get('count')} region × metric conditions). Of that, **{top}** accounts for {_share(top_s)}; "
           + ", ".join(f"{p} {_share(s)}" for p, s in shares[1:])
           + (f". Beside these shares, the interaction (the full swap minus the sum of the single swaps) is "
              f"{_share(ishare)} of the disagreement" if ishare is not None else "") + ". ")
    lo = top_s.get("ci", [None])[0]
    if lo is not None and len(shares) > 1 and shares[1][1].get("ci", [None, None])[1] is not None \
            and lo > shares[1][1]["ci"][1]:
        txt += f"Its interval lies above every other property's: {top} is the property that moves this ranking"
        txt += (" under this tie rule and metric set, but it is not robust to them (below). "
                if robust is not None and not robust.get("robust") else ". ")
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
                + (f", {abs(rel):.0%} of the full swap" if rel is not None and ishare is None else "")
                + f"). They {kind}; so one swap's effect depends on the others, and each share is an average over the "
                  "orders of swapping, not a separable effect.")
    else:
        txt += (f"The single swaps add up to the full swap within the bootstrap interval (difference {_num(inter)}): "
                "no detectable interaction, so each share is also roughly that property's effect on its own.")
    return txt


def robustness_markdown(sec: Mapping) -> str:
    """Whether each pair's leading property survives every tie rule and each metric alone ("not robust" where it
    flips), from ``summary.json["attribution"]["robustness"]``."""
    rb = sec.get("robustness")
    if not rb or not rb.get("pairs"):
        return ""
    parts = []
    for pair, r in rb["pairs"].items():
        pr = sec["pairs"][pair]
        title = f"{pr['label_a']} → {pr['label_b']}"
        if r["leader"] is None:
            parts.append(f"{title}: no single leading property (its top shares are equal, or nothing to attribute) — "
                         "**not robust**")
            continue
        freq = r.get("bootstrap_leader_frequency")
        boot = f", and in {_pct(freq)} of the bootstrap resamples" if freq is not None else ""
        rules = ", ".join(r["by_tie_rule"])
        if r["robust"]:
            txt = (f"{title}: `{r['leader']}` leads under every tie rule ({rules}) and on every metric alone{boot} — "
                   "**robust**")
        else:
            flips = "; ".join(f"{k} → `{v}`" if v is not None else f"{k} → no single leader"
                              for k, v in r["flips"].items())
            txt = (f"{title}: `{r['leader']}` leads under {r['tie_rule']}{boot}, but not everywhere ({flips}) — "
                   "**not robust**")
        if r.get("nothing_to_attribute"):
            txt += f" (nothing to attribute on {', '.join(r['nothing_to_attribute'])}: the sources rank alike there)"
        parts.append(txt)
    return (f"**Is the leading property robust?** Recomputed from the same runs under every tie rule and on each metric "
            f"alone: {'; '.join(parts)}. Robust in {rb['robust_pairs']} of {rb['n_pairs']} pair(s). The bootstrap "
            "keeps the tie rule and the metrics fixed, so its intervals do not show this; where the verdict is not "
            "robust, the leading property is a finding of this tie rule and metric set, not of the workloads alone.")


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
    """The reversal tracing: how many were traced, which properties reproduce them, which could not be tested."""
    if tracing is None or tracing.height == 0:
        return ("**Reversal tracing.** " + (sec.get("tracing") or "")
                + " No significant-and-practical reversal between these pairs' sources to trace.")
    status = tracing["status"]
    n_out = int((status == "outside the attribution design").sum())
    n_few = int((status == "too few windows to test").sum())
    traced = tracing.filter(status == "traced")
    n_in = tracing.height - n_out
    n_not = n_in - traced.height - n_few
    txt = (f"**Reversal tracing.** The analysis finds {tracing.height} significant-and-practical reversal(s) between "
           f"these pairs' sources; {n_out} lie outside the attribution's regions or metrics. Of the {n_in} inside, ")
    if n_few:
        n_w = tracing.filter(status == "too few windows to test")["n_windows"].max()
        txt += (f"{n_few} cannot be tested on the attribution's windows (with {n_w} windows no Wilcoxon test can "
                "reject: reported as too few, with only the sets that give B's sign); ")
    txt += (f"{traced.height} are reversals on these windows too (A vs the full swap, significant and practical) and are "
            "traced")
    txt += (f"; {n_not} are not (the attribution's {int(tracing['n_windows'].max() or 0)} windows are fewer than the "
            "study's, so weaker effects do not reach significance on them)." if n_not else ".")
    if traced.height:
        sizes = traced["minimal_size"].value_counts().sort("minimal_size")
        txt += (" Smallest number of swapped players that reproduces the reversal (a significant-and-practical "
                "reversal between A and that hybrid): " + ", ".join(f"{c} need {s}" for s, c in sizes.iter_rows()) + ". ")
        firsts = traced["minimal_sets"].str.split(" | ").list.first().value_counts().sort("count", descending=True)
        txt += "The sets that do it most often: " + ", ".join(f"`{s}` ({c})" for s, c in firsts.head(4).iter_rows()) + "."
        weaker = traced.filter(pl.col("sign_sets") != pl.col("minimal_sets")).height
        if weaker:
            txt += (f" In {weaker} of them a smaller or different set already gives B's *sign* without a "
                    "significant-and-practical reversal (column `sign_sets`): a sign is a weaker statement.")
    return txt


def cost_markdown(sec: Mapping, campaign_rate: float | None = None) -> str:
    """Measured cost of this design and the cost of the full one, every number from ``summary.json["attribution"]
    ["cost"]`` (the run counts of :func:`portbench.study.attribution.cost_plan`, the CPU rate measured here)
    (``campaign_rate``: the campaign's runs per CPU second, for a second estimate)."""
    c = sec.get("cost") or {}
    plan = c.get("plan") or {}
    cpu_rate = c.get("runs_per_cpu_s")
    if not cpu_rate or not plan:
        return "**Cost.** Every run was reused from an earlier computation; no timing was recorded."
    w = int(c.get("workers") or 1)
    dz, fz = plan["design"], plan["full"]
    check = (f" The load check added {c['load_check_runs']:,} runs of windows repeated to ≥ "
             f"{sec['design'].get('steady_requests', 0):,} requests ({c['load_check_cpu_s']:.0f} CPU-seconds)."
             if c.get("load_check_runs") else "")
    txt = (f"**Cost.** {'(Timing of the run that computed these results; this one reused them.) ' if c.get('reused') else ''}"
           f"This design has {dz['runs']:,} runs ({dz['subsets']} subsets), of which {dz['simulated_runs']:,} are "
           f"simulated ({dz['window_hybrids']} window-hybrids); {c['simulated_runs']:,} were simulated in "
           f"{c['simulation_wall_s']:.0f} s of wall time on {w} worker process(es), which got "
           f"{100 * (c.get('cpu_share') or 0):.0f}% of a core each (the machine was shared), using "
           f"{c['simulation_cpu_s']:.0f} CPU-seconds: {cpu_rate:.0f} runs per CPU-second, so about "
           f"{c['design_cpu_s'] / w:.0f} s on {w} free core(s) (plus "
           f"{max(0.0, c['wall_s'] - c['simulation_wall_s']):.0f} s for building, verifying and reading, and the "
           f"bootstrap).{check} The full design — the five properties as separate players ({fz['subsets']} subsets, "
           f"{fz['window_hybrids']} window-hybrids), every window ({fz['windows']}), every region ({len(fz['regions'])}) "
           f"and the study's replicates ({fz['replicates']}) for these {fz['pairs']} pair(s) — is {fz['runs']:,} runs, "
           f"{fz['simulated_runs']:,} simulated: "
           + ("this run (its wall time above)" if fz["runs"] == dz["runs"] else
              f"about {duration(c['full_cpu_h'] * 3600 / w)} on {w} core(s) at this design's rate (an upper bound: "
              "the regions it adds are lighter per run, and replicates of a policy that draws no random number are "
              "copied, not simulated)"))
    if campaign_rate and fz["runs"] != dz["runs"]:
        txt += (f", {duration(fz['simulated_runs'] / campaign_rate / w)} at the campaign's all-region rate of "
                f"{campaign_rate:.0f} runs per CPU-second")
    return txt + "."


def duration(s: float) -> str:
    """Seconds in words at a readable unit: ``45 s``, ``9.3 min``, ``2.1 h``."""
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.1f} h"
