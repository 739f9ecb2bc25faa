"""Check a claim: does "policy X beats baseline Y on metric M" port across sources and regions? (issue #40).

Pure analysis of a runs table -- the frozen campaign's, plus the runs of a policy the campaign does not hold
(a plug-in simulated on the panel first, or an imported vLLM scheduler class run on the virtual engine) --
with the headline's own functions (:mod:`portbench.study.analysis.ports`), nothing re-implemented:

* **Sides.** The cube of every scheduler in the runs (the campaign's 13 plus the claimed policy) is classified
  by :func:`~portbench.study.analysis.ports.source_classes` exactly as the headline classifies it: per
  (source, region) the paired Wilcoxon over windows and the TOST at +-delta, corrected with
  ``analysis.tie_correction`` over *every* pair of the ranking (so a claim's side is the very class the
  headline gave that pair; a policy added to the ranking adds its pairs to the correction family). The pair's
  class is strong (the better one named), equivalent or undetermined; a pair n/a on a source (vtc without
  tenants) is left out.
* **Effect.** The headline's effect size (:func:`portbench.study.stats.effect_size`: symmetric relative
  difference of the window means for ratio metrics, absolute for proportions), signed + when the policy is
  better; its 95% interval is the percentile interval over the headline's own circular block bootstrap of the
  windows (same block lengths, same seeds, so the same resamples the headline's intervals use).
* **Four-way.** Every two sides of the pair -- two sources in one region (across sources), two regions of one
  source (across regions) -- are same order / reversal / one side / neither
  (:func:`portbench.study.stats.four_way`); concordance = same / (same + reversal), its interval from the
  classes re-run in every resample (:func:`~portbench.study.analysis.ports.headline_numbers`).
* **Verdict** (:data:`VERDICTS`): from the sides' classes alone.
* **Attribution.** For a reversal across sources, the counterfactual attribution's tracing
  (``{results_dir}/attribution/tracing.parquet``: the smallest set of swapped workload properties whose hybrid
  reproduces the reversal) and the leading Shapley property of the two sources' ranking disagreement
  (``shapley.parquet``), when ``portbench attribute`` has run for that source pair.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ..core.errors import ParameterError
from . import stats
from .analysis import ports
from .analysis.common import _num, _source_rng, panel_sources
from .analysis.cube import Cube, build_cube, metric_direction, metric_names, metric_scale, settings
from .analysis.results import headline_panel_of
from .analysis.reversals import TENANT_METRICS, tenant_na
from .campaign.imported import runs_dir as imported_runs_dir
from .analysis.ties import deltas as metric_deltas

CLASS_NAMES = {stats.STRONG_A: "strong", stats.STRONG_B: "strong", stats.EQUIVALENT: "equivalent",
               stats.UNDETERMINED: "undetermined", stats.NOT_APPLICABLE: "n/a"}
VERDICTS = {
    "holds": "{p} is strongly better than {b} on every side (source x region)",
    "holds_where_resolved": "{p} is strongly better than {b} wherever the tests resolve the pair, and never worse",
    "reverses": "the order reverses: {p} is strongly better on some sides and {b} on others",
    "opposite": "the claim fails: {b} is strongly better than {p} wherever the tests resolve the pair",
    "equivalent": "{p} and {b} are equivalent (within +-delta) on every side",
    "unresolved": "no side resolves the pair strongly: the windows cannot tell {p} from {b}",
}


def sub_config(cfg, names: Sequence[str], sources: Sequence[str], windows_per_source: int | None, *,
               replicates: int | None = None):
    """The campaign of the policies ``names`` alone, on the panel's ``sources`` and the study's regions, without
    request records, in its own results folder (:func:`imported_runs_dir`): its shards never touch the frozen
    campaign's files. ``replicates``: None keeps the study's."""
    drop = {f"sources.{s}": None for s in cfg.sources if s not in sources}
    over = {**drop, "paths.results_dir": str(imported_runs_dir(cfg.paths.results_dir, "+".join(names))),
            "simulation.schedulers": list(names), "simulation.vllm_schedulers": [], "campaign.request_records": None,
            "campaign.windows_per_source": windows_per_source}
    if replicates is not None:
        over["simulation.replicates"] = int(replicates)
    return cfg.with_overrides(over)


def with_extra(runs: pl.DataFrame, extra: pl.DataFrame, policy: str) -> tuple[pl.DataFrame, str | None]:
    """The frozen campaign's ``runs`` with the ``extra`` runs of ``policy``, restricted to the windows and regions
    ``policy`` ran on (so every scheduler of the ranking is on the same windows); a note when that drops any."""
    extra = extra.filter(pl.col("scheduler") == policy).select([c for c in runs.columns if c in extra.columns])
    keys = extra.select("window_id", "region").unique()
    base = runs.filter(pl.col("scheduler") != policy).join(keys, on=["window_id", "region"], how="semi")
    note = None
    if base.select("window_id").n_unique() < runs.select("window_id").n_unique():
        def per_source(df):
            return df.group_by("source").agg(pl.col("window_id").n_unique())["window_id"].max()

        note = (f"{policy} ran on {per_source(extra)} windows per source (the first ones): every scheduler is compared "
                f"on those (the frozen campaign has {per_source(runs)} per source)")
    return pl.concat([base, extra], how="diagonal_relaxed"), note


def claimable_metrics(runs: pl.DataFrame, slo) -> list[str]:
    """The metrics a claim can name: the registry's (with the study's SLO definitions) present in ``runs``."""
    return [m for m in metric_names(slo) if m in runs.columns]


def _choice(param: str, value: str, valid: Sequence[str], what: str) -> str:
    if value not in valid:
        raise ParameterError(param, value, f"one of the {what}: {', '.join(valid)}")
    return value


def _attribution(results_dir: Path | None, policy: str, baseline: str, metric: str, reversed_across: list[dict]) -> dict:
    """What the attribution says about the reversals across sources of the pair (module docstring)."""
    if results_dir is None:
        return {"available": False, "reason": "no results folder given"}
    folder = Path(results_dir) / "attribution"
    tr, sh = folder / "tracing.parquet", folder / "shapley.parquet"
    if not tr.is_file() and not sh.is_file():
        return {"available": False, "reason": f"no attribution results in {folder} (run `portbench attribute`, "
                                              "notebook 09)"}
    out: dict = {"available": True, "traced": [], "leading": []}
    wanted = {(r["source_1"], r["source_2"], r["region"]) for r in reversed_across}
    if tr.is_file():
        t = pl.read_parquet(tr).filter(pl.col("metric") == metric)
        t = t.filter(((pl.col("a") == policy) & (pl.col("b") == baseline)) |
                     ((pl.col("a") == baseline) & (pl.col("b") == policy)))
        for r in t.iter_rows(named=True):
            a_, _, b_ = str(r["pair"]).partition("|")
            if (a_, b_, r["region"]) not in wanted and (b_, a_, r["region"]) not in wanted:
                continue                            # a comparison of this pair that does not reverse here
            out["traced"].append({"pair": r["pair"], "region": r["region"], "status": r["status"],
                                  "minimal_sets": r["minimal_sets"], "sign_sets": r.get("sign_sets")})
    if sh.is_file():
        s = pl.read_parquet(sh).filter(pl.col("metric") == metric)
        for a, b, region in sorted(wanted):
            g = s.filter((pl.col("region") == region) & (((pl.col("source_a") == a) & (pl.col("source_b") == b)) |
                                                          ((pl.col("source_a") == b) & (pl.col("source_b") == a))))
            if not g.height:
                continue
            top = g.sort("share", descending=True, nulls_last=True).row(0, named=True)
            out["leading"].append({"sources": f"{a} vs {b}", "region": region, "property": top["player"],
                                   "share": _num(top["share"]),
                                   "share_ci": [_num(top.get("share_ci_low")), _num(top.get("share_ci_high"))],
                                   "what": "the largest Shapley share of the two sources' whole-ranking disagreement "
                                           "on this metric and region (not of this pair alone)"})
    if not out["traced"] and not out["leading"]:
        out["note"] = "the attribution covers none of this pair's reversals (its source pairs, regions or metric)"
    return out


def runs_hash(runs: pl.DataFrame) -> str:
    """SHA-256 (first 16 hex digits) of the runs the claim read (sorted, as parquet-independent CSV bytes)."""
    keys = [c for c in ("source", "window_id", "region", "scheduler", "replicate") if c in runs.columns]
    return hashlib.sha256(runs.sort(keys).write_csv().encode()).hexdigest()[:16]


def evaluate(runs: pl.DataFrame, inputs, *, policy: str, baseline: str, metric: str, panel: str | None = None,
             results_dir: Path | None = None, scheduler_order=None, provenance_of_policy: Mapping | None = None) -> dict:
    """The claim "``policy`` beats ``baseline`` on ``metric``" on the sources of ``panel`` (default: the headline
    panel), from ``runs``; ``inputs``: what the analysis reads (``cfg.analysis_inputs``). Returns the JSON-ready
    result (module docstring); ParameterError for a name not in the runs / registry / panels, listing the valid
    ones. ``provenance_of_policy``: what the report cites for the policy (its source hash, class, engine)."""
    a = inputs.analysis
    cfg = settings(a, inputs.window_size)
    slo = inputs.simulation.slo
    metrics = claimable_metrics(runs, slo)
    _choice("--metric", metric, metrics, "metrics in the runs")
    present = sorted(runs["scheduler"].unique().to_list())
    _choice("--policy", policy, present, "policies in the runs")
    _choice("--baseline", baseline, present, "policies in the runs")
    if policy == baseline:
        raise ParameterError("--baseline", baseline, "a policy other than --policy")
    want = [metric] + [m for m in TENANT_METRICS if m in runs.columns and m != metric]
    cube = build_cube(runs, metric_spec=want, all_metrics=metric_names(slo),
                      scheduler_order=scheduler_order if scheduler_order is not None else inputs.simulation.schedulers,
                      where="campaign runs table", source_order=inputs.source_names(), names=inputs.display_names)
    for k in (policy, baseline):
        if k not in cube.schedulers:
            raise ParameterError("--policy" if k == policy else "--baseline", k,
                                 "a policy run on every source of the runs table")
    panels = panel_sources(cfg["panels"], cube.sources, cube.provenance)
    avail = [n for n, p in panels.items() if p["available"]]
    name = panel if panel is not None else headline_panel_of(panels, cube.provenance)
    _choice("--panel", name, avail, "panels with runs")
    sources = panels[name]["sources"]
    mi = [cube.metrics.index(metric)]
    dl = metric_deltas(cube, cfg)
    na = tenant_na(cube)
    blocks = ports.block_lengths(cube, mi) if ports.INTERVAL == "block" else {s: 1 for s in cube.sources}
    B = int(cfg["bootstrap"])
    point, boot = ports.source_classes(cube, mi, cfg, dl, na, boot=B, seed=cfg["seed"], sources=sources, blocks=blocks)
    K = len(cube.schedulers)
    ia, ib = np.triu_indices(K, 1)
    kp, kb = cube.schedulers.index(policy), cube.schedulers.index(baseline)
    p = int(np.flatnonzero((ia == min(kp, kb)) & (ib == max(kp, kb)))[0])
    orient = 1.0 if kp < kb else -1.0             # classes and diffs are of the lower-index scheduler minus the other
    sides = _sides(cube, cfg, dl, na, sources, mi, p, kp, kb, orient, blocks, B, policy, baseline, point)
    # the four-way table of this pair alone, from the headline's classes (point and resamples)
    one = {s: point[s][..., p:p + 1] for s in sources}
    one_b = {s: boot[s][..., p:p + 1] for s in sources} if boot is not None else None
    nums = ports.headline_numbers(cube, one, one_b, sources)
    reversals = _reversals(cube, one, sources)
    verdict = verdict_of(sides, policy)
    ws = {s: len(cube.windows[s]) for s in sources}
    out = {
        "claim": {"policy": policy, "baseline": baseline, "metric": metric,
                  "direction": f"{metric_direction(metric)} is better", "scale": metric_scale(metric),
                  "panel": name, "sources": sources, "regions": list(cube.regions)},
        "verdict": verdict,
        "verdict_text": VERDICTS[verdict].format(p=policy, b=baseline),
        "counts": {k: sum(1 for s in sides if _tag(s, policy, baseline) == k)
                   for k in ("policy_better", "baseline_better", "equivalent", "undetermined")},
        "sides": sides,
        "not_applicable": [{"source": s, "region": r} for s in sources for r in cube.regions
                           if int(point[s][cube.regions.index(r), 0, p]) == stats.NOT_APPLICABLE],
        "four_way": nums["four_way"],
        "concordance": nums["concordance"],
        "reversals": reversals,
        "attribution": _attribution(results_dir, policy, baseline, metric,
                                    [r for r in reversals if r["kind"] == "across_sources"]),
        "inputs": {
            "policy": dict(provenance_of_policy or {"name": policy, "kind": "built-in"}),
            "baseline": baseline, "metric": metric, "panel": name, "sources": sources,
            "provenance": {s: cube.provenance[s] for s in sources}, "regions": list(cube.regions),
            "rho": {r: _num(cube.rho[r]) for r in cube.regions}, "windows_per_source": ws,
            "window_ids": {s: [cube.windows[s][0], cube.windows[s][-1]] for s in sources},
            "schedulers_in_ranking": list(cube.schedulers), "delta": _num(dl[mi[0]]), "alpha": cfg["alpha"],
            "tie_correction": cfg["tie_correction"], "bootstrap": B, "seed": cfg["seed"],
            "interval": ports.INTERVAL_TEXT[ports.INTERVAL].format(B=B), "block_lengths": blocks,
            "definition": ports.DEFINITION.format(corr=cfg["tie_correction"], alpha=cfg["alpha"]),
            "runs_sha256_16": runs_hash(runs.filter(pl.col("source").is_in(sources))),
            "notes": [n for n in cube.notes if "non-finite" not in n] + _missing_note(cube, sources, mi[0], kp, kb)},
    }
    return out


def _missing_note(cube: Cube, sources, m: int, kp: int, kb: int) -> list[str]:
    """How many of the pair's per-window values of the metric are missing (non-finite) on the panel."""
    n = sum(int(np.isnan(cube.values[s][:, m][:, [kp, kb]]).sum()) for s in sources)
    tot = sum(int(cube.values[s][:, m][:, [kp, kb]].size) for s in sources)
    return [f"{n} of the pair's {tot} per-window values of the metric are missing (non-finite) and left out"] if n else []


def _tag(side: dict, policy: str, baseline: str) -> str:
    if side["class"] == "strong":
        return "policy_better" if side["better"] == policy else "baseline_better"
    return side["class"]


def _sides(cube: Cube, cfg: dict, dl, na, sources, mi, p, kp, kb, orient, blocks, B, policy, baseline, point) -> list[dict]:
    """One row per (source, region): class, better policy, signed effect with its block-bootstrap interval."""
    kw = {"window_size": cfg["window_size"], "alpha": cfg["alpha"], "correction": cfg["tie_correction"]}
    sign = cube.sign[mi]
    scale = cube.scales[mi[0]]
    rows = []
    for s in sources:
        raw = cube.values[s][:, mi]                                           # (R, 1, K, W)
        res = ports.classify(raw, sign, [scale], dl[mi], pair_ok=ports._pair_ok(cube, na)[s], **kw)
        x = raw[:, 0, kp, :]
        y = raw[:, 0, kb, :]
        both = np.isfinite(x) & np.isfinite(y)
        idx = stats.block_bootstrap_indices(x.shape[-1], B, blocks.get(s, 1), _source_rng(cfg["seed"], s)) if B else None
        for r, region in enumerate(cube.regions):
            c = int(point[s][r, 0, p])
            if c == stats.NOT_APPLICABLE:
                continue
            assert c == int(res["classes"][r, 0, p])
            xs, ys = np.where(both[r], x[r], np.nan), np.where(both[r], y[r], np.nan)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mx, my = np.nanmean(xs), np.nanmean(ys)
            d = orient * float(res["diff"][r, 0, p])                            # oriented: + = policy better
            eff = float(stats.effect_size(mx, my, scale, cfg["window_size"])) * (1.0 if d >= 0 else -1.0)
            ci = [None, None]
            if idx is not None:
                bx, by = stats.bootstrap_means(xs, idx), stats.bootstrap_means(ys, idx)
                bd = (bx - by) * float(sign[0])
                be = stats.effect_size(bx, by, scale, cfg["window_size"]) * np.where(bd >= 0, 1.0, -1.0)
                lo, hi = stats.percentile_ci(be)
                ci = [_num(lo), _num(hi)]
            better = None
            if c in (stats.STRONG_A, stats.STRONG_B):
                first_better = c == stats.STRONG_A
                better = (policy if kp < kb else baseline) if first_better else (baseline if kp < kb else policy)
            rows.append({"source": s, "provenance": cube.provenance[s], "region": region, "rho": _num(cube.rho[region]),
                         "class": CLASS_NAMES[c], "better": better, "effect": _num(eff), "ci": ci,
                         "mean_policy": _num(mx), "mean_baseline": _num(my),
                         "change": _num(mx / my - 1.0) if my not in (0.0,) and np.isfinite(my) else None,
                         "p_adj": _num(res["p_adj"][r, 0, p]), "p_tost_adj": _num(res["p_tost_adj"][r, 0, p]),
                         "windows": int(both[r].sum())})
    return rows


def _reversals(cube: Cube, one: dict, sources: list[str]) -> list[dict]:
    """Every comparison of the pair's sides that is a reversal (strong on both, opposite orders)."""
    rev = stats.FOUR_WAY.index("reversal")
    out = []
    sp, cs = ports.across_sources(one, sources)
    for i, (a, b) in enumerate(sp):
        for r, region in enumerate(cube.regions):
            if int(cs[i, r, 0, 0]) == rev:
                out.append({"kind": "across_sources", "source_1": a, "source_2": b, "region": region})
    rp, cr = ports.across_regions(one, sources, len(cube.regions))
    for si, s in enumerate(sources):
        for j, (r1, r2) in enumerate(rp):
            if int(cr[si, j, 0, 0]) == rev:
                out.append({"kind": "across_regions", "source": s, "region_1": cube.regions[r1],
                            "region_2": cube.regions[r2]})
    return out


def verdict_of(sides: list[dict], policy: str) -> str:
    """The verdict (:data:`VERDICTS`) from the sides' classes alone."""
    strong = [s for s in sides if s["class"] == "strong"]
    better = {s["better"] for s in strong}
    if len(better) == 2:
        return "reverses"
    if strong and len(strong) == len(sides):
        return "holds" if better == {policy} else "opposite"
    if strong:
        return "holds_where_resolved" if better == {policy} else "opposite"
    if sides and all(s["class"] == "equivalent" for s in sides):
        return "equivalent"
    return "unresolved"


def summary_lines(res: dict) -> list[str]:
    """The short terminal summary of :func:`evaluate`'s result."""
    c = res["claim"]
    n = res["counts"]
    lines = [f"claim: {c['policy']} beats {c['baseline']} on {c['metric']} ({c['direction']}), panel {c['panel']} "
             f"({', '.join(c['sources'])}) x {len(c['regions'])} regions",
             f"verdict: {res['verdict'].upper()} -- {res['verdict_text']}",
             f"sides: {c['policy']} better {n['policy_better']}, {c['baseline']} better {n['baseline_better']}, "
             f"equivalent {n['equivalent']}, undetermined {n['undetermined']} (of {len(res['sides'])})"]
    for kind in ("across_sources", "across_regions"):
        fw = res["four_way"].get(kind)
        cc = res["concordance"].get(kind) or {}
        if not fw:
            continue
        ci = cc.get("ci") or [None, None]
        conc = (f"concordance {cc['value']:.2f} [{_f(ci[0])}, {_f(ci[1])}] of {cc['n']}" if cc.get("value") is not None
                else "concordance n/a (no comparison strong on both sides)")
        lines.append(f"{kind.replace('_', ' ')}: same order {fw['same_order']['count']}, reversal "
                     f"{fw['reversal']['count']}, one side {fw['one_side']['count']}, neither {fw['neither']['count']} "
                     f"-- {conc}")
    by_src: dict[str, list[str]] = {}
    for s in res["sides"]:
        mark = {"policy_better": "+", "baseline_better": "-", "equivalent": "=", "undetermined": "?"}[
            _tag(s, c["policy"], c["baseline"])]
        by_src.setdefault(s["source"], []).append(f"{s['region']} {mark} {_pct(s['change'])}")
    for src, items in by_src.items():
        lines.append(f"  {src:11s} " + "  ".join(items))
    lines.append(f"  (+ {c['policy']} strongly better, - {c['baseline']} strongly better, = equivalent, ? undetermined; "
                 f"then {c['policy']}'s {c['metric']} relative to {c['baseline']}'s)")
    if res["reversals"]:
        lines.append("reverses: " + "; ".join(
            f"{r['source_1']} vs {r['source_2']} @ {r['region']}" if r["kind"] == "across_sources"
            else f"{r['source']}: {r['region_1']} vs {r['region_2']}" for r in res["reversals"][:8])
            + (f" (+{len(res['reversals']) - 8} more)" if len(res["reversals"]) > 8 else ""))
        at = res["attribution"]
        for t in [t for t in at.get("traced", []) if t["minimal_sets"]][:3]:
            lines.append(f"attribution: {t['pair'].replace('|', ' vs ')} @ {t['region']}: the reversal is reproduced by "
                         f"swapping {t['minimal_sets']} (smallest set)")
        if at.get("leading"):
            lead = at["leading"][0]
            lines.append(f"attribution: leading property {lead['property']} ({_pct(lead['share'])} of the "
                         f"disagreement, {lead['sources']} @ {lead['region']})")
        elif not at.get("available"):
            lines.append(f"attribution: {at.get('reason')}")
    return lines


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.0f}%"
