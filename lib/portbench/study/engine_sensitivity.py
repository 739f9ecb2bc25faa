"""How the study's findings depend on the engine model (issue #10): the headline numbers under vLLM V0
batching next to the V1 study, and the preemptive policies under swap next to recompute.

Each variant is a campaign of its own parameters (:func:`variant`: the engine section changed, its
results under ``{results_dir}/sensitivity/<name>``, one replicate), run by the ordinary campaign
code (:func:`run_variant`). Capacity is always measured on the reference engine (FCFS on vLLM V1,
recompute), so every variant replays exactly the same arrivals as the study: only the engine differs. :func:`headline_numbers` reduces an analysis to the numbers the README
and notebook 10 report; :func:`batching_sensitivity` puts them side by side (the V1 study restricted
to the same replicate, so that only the engine differs); :func:`swap_table` compares the preemptive
policies' outcomes under the two preemption modes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from ..core.config import AnalysisConfig, Config, PathsConfig
from ..core.io import write_parquet_atomic
from ..data import windows as windows_mod
from ..sim import schedulers as scheduler_registry
from . import analysis, campaign

PREEMPTIVE = ("srpt_oracle", "mlfq", "las", "rr")
SWAP_REGIONS = ("overload", "severe")
SWAP_METRICS = ("completed", "e2e_mean", "ttft_p99", "tpot_mean")


def headline_sources(source_names: Sequence[str], an: AnalysisConfig, manifest: Mapping) -> list[str]:
    """The sources of the panel the headline numbers come from (the analysis' rule,
    :func:`portbench.study.analysis.headline_panel_of` on ``analysis.panels``: the first available all-real panel,
    else the first available one); every configured source (``source_names``, in order) with windows in
    ``manifest`` when no panel is available."""
    prov = windows_mod.provenance(manifest)
    present = [s for s in source_names if s in prov]
    panels = analysis.panel_sources({k: list(v) for k, v in an.panels.items()}, present, prov)
    head = analysis.headline_panel_of(panels, prov)
    return list(panels[head]["sources"]) if head and panels[head]["available"] else present


def variant(cfg: Config, name: str, *, engine: Mapping | None = None, simulation: Mapping | None = None,
            replicates: int = 1, sources: Sequence[str] | None = None) -> Config:
    """``cfg`` with the engine (and simulation) settings changed, one replicate, only ``sources`` (None: all),
    and its results in ``{results_dir}/sensitivity/<name>`` (shards and runs of its own)."""
    over = {"engine": dict(engine or {}), "simulation": {"replicates": int(replicates), **dict(simulation or {})},
            "paths": {"results_dir": str(cfg.paths.results_dir / "sensitivity" / name)},
            "campaign": {"request_records": {"windows_per_source": 0}}}
    if sources is not None:
        over["sources"] = {s: None for s in cfg.source_names() if s not in sources}
    return cfg.with_overrides(over)


def run_variant(cfg: Config, *, like: Config | None = None, **kw) -> pl.DataFrame:
    """Run (or resume) a variant's campaign; returns its runs table. ``like``: the study whose measured
    capacities the variant reuses (capacity is measured on the reference engine whatever the variant's
    engine, so the records are the same; a record is only read when its key matches)."""
    if like is not None:
        campaign.reuse_capacities(like, cfg)
    return campaign.run(cfg, **kw).runs


def batching_variant(cfg: Config, *, manifest: Mapping) -> Config:
    """The V0 sensitivity campaign: every scheduler, window and region of the headline panel's sources
    (:func:`headline_sources` of the stage's ``manifest``) under the other batching mode (``engine.batching: v0``
    for the V1 study)."""
    other = "v0" if cfg.engine.batching == "v1" else "v1"
    return variant(cfg, f"batching_{other}", engine={"batching": other},
                   sources=headline_sources(cfg.source_names(), cfg.analysis, manifest))


def swap_variant(cfg: Config, regions: Sequence[str] = SWAP_REGIONS, *, manifest: Mapping) -> Config:
    """The swap sensitivity campaign: the preemptive policies and the capacity policy, heavy regions, the
    headline panel's sources, ``engine.preemption: swap``."""
    names = [s for s in scheduler_registry.names(cfg.simulation.schedulers)
             if s in PREEMPTIVE or s == cfg.simulation.capacity_policy]
    regs = [r for r in regions if r in cfg.simulation.loads] or list(cfg.simulation.loads)[-2:]
    return variant(cfg, "preemption_swap", engine={"preemption": "swap"},
                   simulation={"schedulers": names, "regions": regs}, sources=headline_sources(cfg.source_names(), cfg.analysis, manifest))


def headline_numbers(A) -> dict:
    """The numbers the study reports, from one analysis: rank agreement between sources, regions and
    metrics, reversal counts and the most dramatic reversal, all-tied conditions, and how much the
    findings rest on ``sarathi`` (conditions where it is the best on a TPOT / a TTFT metric, reversals
    involving it)."""
    s = A.summary
    cs, cr, cm, rv = s["cross_source"], s["cross_region"], s["cross_metric"], s["reversals"]

    def val(stat):
        return None if stat is None else stat.get("value")

    c = cs.get("conditions") or {}
    out = {
        "cross-source τ-b": val(cs.get("tau_b")),
        "cross-source τ-b/τ-b,max": val(cs.get("tau_b_norm")),
        "cross-source discordance": val(cs.get("discordance")),
        "cross-source Kendall's W": val(cs.get("kendall_w")),
        "cross-source conditions all tied": f"{c.get('all_tied')} of {c.get('total')}",
        "cross-region τ-b": val(cr.get("tau_b")),
        "lightest vs heaviest region τ-b": val((cr.get("extreme_regions") or {}).get("tau_b")),
        "cross-metric τ-b/τ-b,max (headline metrics)": val(cm.get("tau_b_norm")),
        "best group changes between two headline metrics": val(cm.get("pairwise_top1_change_rate")),
        "sign reversals between sources": val(rv.get("sign_reversals")),
        "significant and practical reversals": val(rv.get("significant_and_practical")),
    }

    def effect(v, scale):
        return f"{v:.0%}" if scale == "ratio" else f"{100 * v:.1f} pp"

    md = rv.get("most_dramatic")
    out["most dramatic reversal"] = (
        f"{md['a']} vs {md['b']}, {md['metric']} at {md['region']}: "
        f"{md['a'] if md['diff_1'] > 0 else md['b']} better on {md['label_1']} by {effect(md['effect_1'], md['scale'])}, "
        f"{md['a'] if md['diff_2'] > 0 else md['b']} better on {md['label_2']} by {effect(md['effect_2'], md['scale'])}"
        if md else "none")
    rev = A["reversals"].filter(pl.col("stage") == "significant_and_practical")
    out["significant and practical reversals involving sarathi"] = (
        f"{rev.filter((pl.col('a') == 'sarathi') | (pl.col('b') == 'sarathi')).height} of {rev.height}")
    top1 = A["top1"]
    for label, prefix in (("TPOT", "tpot_"), ("TTFT", "ttft_")):
        t = top1.filter(pl.col("metric").str.starts_with(prefix))
        won = t.filter(pl.col("winner").str.split("+").list.contains("sarathi")).height
        out[f"conditions where sarathi is (tied) best on a {label} metric"] = f"{won} of {t.height}"
    return out


def batching_sensitivity(cfg: Config, runs_main: pl.DataFrame, runs_other: pl.DataFrame, *,
                         replicate: int = 0) -> pl.DataFrame:
    """The headline numbers of the study's engine and of the other batching mode side by side, each
    computed by the study's analysis (its core: the sections these numbers come from; no bootstrap: point values)
    on one replicate, plus the headline study itself (every replicate) for reference."""
    quick = cfg.with_overrides({"analysis": {"bootstrap": 0}})
    runs_main = runs_main.filter(pl.col("source").is_in(runs_other["source"].unique().to_list()))  # the same sources
    def numbers(runs: pl.DataFrame) -> dict:
        return headline_numbers(analysis.compute(quick.analysis_inputs, runs, core=True))

    main = numbers(runs_main)
    a = numbers(runs_main.filter(pl.col("replicate") == replicate))
    b = numbers(runs_other.filter(pl.col("replicate") == replicate))
    this, other = cfg.engine.batching, ("v0" if cfg.engine.batching == "v1" else "v1")

    def cell(v):
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    return pl.DataFrame({"number": list(main),
                         f"{this} (study, all replicates)": [cell(main[k]) for k in main],
                         f"{this} (replicate {replicate})": [cell(a[k]) for k in main],
                         f"{other} (replicate {replicate})": [cell(b.get(k)) for k in main]})


def swap_table(runs_recompute: pl.DataFrame, runs_swap: pl.DataFrame, metrics: Sequence[str] = SWAP_METRICS,
               replicate: int = 0) -> pl.DataFrame:
    """Per source × region × scheduler of the swap campaign: mean preemptions, swaps and each metric
    over windows under recompute (the study, same replicate) and under swap."""
    keys = ["source", "provenance", "region", "scheduler"]
    sel = runs_swap.select(keys).unique()
    cols = [m for m in metrics if m in runs_swap.columns]

    def agg(df, tag):
        df = df.filter(pl.col("replicate") == replicate).join(sel, on=keys)
        return df.group_by(keys).agg(pl.col("preemptions").mean().alias(f"preemptions_{tag}"),
                                     *[pl.col(m).mean().alias(f"{m}_{tag}") for m in cols],
                                     *([pl.col("swaps").mean().alias(f"swaps_{tag}")] if tag == "swap" else []))

    out = agg(runs_recompute, "recompute").join(agg(runs_swap, "swap"), on=keys)
    order = [*keys, "preemptions_recompute", "preemptions_swap", "swaps_swap"]
    for m in cols:
        order += [f"{m}_recompute", f"{m}_swap"]
    return out.select(order).sort(keys)


def swap_means(swap: pl.DataFrame) -> pl.DataFrame:
    """Per scheduler, the means of :func:`swap_table` over sources, regions and windows: preemptions under
    recompute, swaps under swap, completed requests and mean E2E latency under each (notebook 03)."""
    return swap.group_by("scheduler").agg(pl.col("preemptions_recompute").mean(), pl.col("swaps_swap").mean(),
                                          pl.col("completed_recompute").mean(), pl.col("completed_swap").mean(),
                                          pl.col("e2e_mean_recompute").mean(), pl.col("e2e_mean_swap").mean()
                                          ).sort("scheduler")


def paths(p: PathsConfig) -> dict:
    """Where the sensitivity tables are written (read by notebook 04 and summary.json)."""
    d = p.results_dir
    return {"batching": d / "engine_sensitivity.parquet", "swap": d / "swap_sensitivity.parquet"}


def save(p: PathsConfig, batching: pl.DataFrame | None = None, swap: pl.DataFrame | None = None) -> dict:
    """Write the sensitivity tables (parquet, atomically) where :func:`paths` says."""
    out = {}
    for key, df in (("batching", batching), ("swap", swap)):
        if df is not None:
            path = paths(p)[key]
            write_parquet_atomic(df, path, {"kind": f"{key}_sensitivity"})
            out[key] = str(path)
    return out


def load_saved(p: PathsConfig) -> dict[str, pl.DataFrame]:
    """The sensitivity tables written by :func:`save` (only those present)."""
    return {k: pl.read_parquet(f) for k, f in paths(p).items() if f.is_file()}
