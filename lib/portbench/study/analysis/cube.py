"""The analysis' input: its settings, the runs table, and the replicate-averaged per-window values as dense arrays (:class:`Cube`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from ...core.config import AnalysisConfig, PlanSettings, SimulationConfig
from ...core.errors import DataError, ParameterError, check_choice, check_choices
from ...core.provenance import label
from ...data.windows import Manifest
from ...sim import metrics as metric_registry
from ...sim import schedulers as scheduler_registry
from .. import campaign, stats
from ..campaign import imported



def metric_names(slo) -> list[str]:
    """Every metric the study defines with the SLO definitions ``slo`` (``metrics.metric_names``)."""
    return list(metric_registry.metric_names(slo))


def metric_direction(name: str) -> str:
    """"higher" or "lower" (which way is better), from the metric registry."""
    return metric_registry.direction(name)


def metric_unit(name: str) -> str:
    """The metric's unit (for axis labels), from the metric registry."""
    return metric_registry.metric(name).unit


def metric_scale(name: str) -> str:
    """"ratio", "proportion" or "count" (how a difference is sized), from the metric registry."""
    return metric_registry.scale(name)


def metric_label(name: str) -> str:
    """``"ttft_p99 (s, lower is better)"``."""
    unit = metric_unit(name)
    return f"{name} ({unit + ', ' if unit else ''}{metric_direction(name)} is better)"


def validate(a: AnalysisConfig, sim: SimulationConfig, sources: list[str]) -> None:
    """Check the ``analysis`` section's names against the metric registry (with ``sim``'s SLO metrics), the
    ``sources`` and ``sim``'s regions (the values' types and ranges are checked when the config is built);
    ParameterError otherwise."""
    names = metric_names(sim.slo)
    metrics = check_choices("analysis.metrics", a.metrics, names)
    if len(metrics) < 1:
        raise ParameterError("analysis.metrics", a.metrics, "at least one metric")
    for i, m in enumerate(a.headline_metrics):
        check_choice(f"analysis.headline_metrics[{i}]", m, names)
        if a.metrics != "all" and m not in a.metrics:
            raise ParameterError(f"analysis.headline_metrics[{i}]", m, "one of analysis.metrics")
    check_choice("analysis.study_preset.metric", a.study_preset.metric, names)
    if a.cd_conditions != "auto":
        regions = list(sim.region_loads)
        for i, (src, reg, met) in enumerate(a.cd_conditions):
            check_choice(f"analysis.cd_conditions[{i}] source", src, sources)
            if regions:
                check_choice(f"analysis.cd_conditions[{i}] region", reg, regions)
            check_choice(f"analysis.cd_conditions[{i}] metric", met, names)


def settings(a: AnalysisConfig, window_size: int = 200) -> dict:
    """The analysis parameters as a plain dict (the ``parameters`` block of ``summary.json``);
    ``window_size`` (``windows.size``) sizes the practical threshold of count metrics."""
    return {
        "alpha": float(a.alpha),
        "delta": float(a.delta),
        "delta_absolute": float(a.delta_absolute),
        "ties": a.ties,
        "tie_correction": a.tie_correction,
        "rank_tolerance": float(a.rank_tolerance),
        "correction": a.correction,
        "family": a.family,
        "bootstrap": int(a.bootstrap),
        "seed": int(a.seed),
        "ci_level": stats.CI_LEVEL,
        "metrics": a.metrics if a.metrics == "all" else list(a.metrics),
        "headline_metrics": list(a.headline_metrics),
        "panels": {k: list(v) for k, v in a.panels.items()},
        "study_preset": {"metric": a.study_preset.metric, "regions": int(a.study_preset.regions),
                         "correction": a.study_preset.correction},
        "power": {"windows": a.power.windows if a.power.windows == "auto" else int(a.power.windows),
                  "target": float(a.power.target)},
        "window_size": int(window_size),
        "cd_conditions": a.cd_conditions if a.cd_conditions == "auto" else ["/".join(c) for c in a.cd_conditions],
        "runs_file": str(a.runs_file) if a.runs_file else None,
    }


def runs_file_table(analysis: AnalysisConfig) -> pl.DataFrame:
    """The runs table of ``analysis.runs_file`` (ParameterError when it is not set, DataError when it is not
    there)."""
    path = analysis.runs_file
    if not path:
        raise ParameterError("analysis.runs_file", path, "a runs file (or give the analysis the campaign's runs)")
    if not Path(path).is_file():
        raise DataError(path, "analysis.runs_file does not exist")
    return pl.read_parquet(path)


def load_runs(analysis: AnalysisConfig, plan: PlanSettings, manifest: Mapping | None) -> pl.DataFrame:
    """The runs table: ``analysis.runs_file`` when set, else the campaign's (``campaign.load_runs`` of
    ``campaign.make_plan(plan, manifest=manifest)``, with the runs of ``simulation.vllm_schedulers``; ``plan``: ``cfg.plan_settings``; ``manifest``: the window
    manifest the caller's stage loaded, None only with ``analysis.runs_file``)."""
    if analysis.runs_file:
        return runs_file_table(analysis)
    runs = campaign.load_runs(plan.paths, campaign.make_plan(plan, manifest=manifest))
    return imported.with_classes(runs, plan.simulation, plan.paths.results_dir)   # simulation.vllm_schedulers


@dataclass
class Cube:
    """Replicate-averaged per-window values as dense arrays, one per source.

    ``values[source]`` has shape (regions, metrics, schedulers, windows); NaN = missing.
    """

    sources: list[str]
    provenance: dict[str, str]
    regions: list[str]
    rho: dict[str, float]
    metrics: list[str]
    directions: list[str]
    schedulers: list[str]
    windows: dict[str, list[str]]
    values: dict[str, np.ndarray]
    n_replicates: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)   # display names (``cfg.display_names``)

    @property
    def sign(self) -> np.ndarray:
        return np.array([stats.ORIENTATION[d] for d in self.directions])

    def oriented(self, source: str) -> np.ndarray:
        return self.values[source] * self.sign[None, :, None, None]

    @property
    def scales(self) -> list[str]:
        """Each metric's scale (ratio | proportion | count), from the metric registry."""
        return [metric_scale(m) for m in self.metrics]

    def label(self, source: str) -> str:
        return label(source, self.provenance[source], self.names)


def _scheduler_order(names, want) -> list[str]:
    if isinstance(want, (list, tuple)):
        order = list(want)
    else:
        order = list(scheduler_registry.SCHEDULERS)
    pos = {n: i for i, n in enumerate(order)}
    return sorted(names, key=lambda n: (pos.get(n, len(pos)), n))


def build_cube(runs: pl.DataFrame, *, metric_spec="all", all_metrics: list[str], scheduler_order="all",
               where: str = "runs table", source_order=(), names=None) -> Cube:
    """Average replicates within windows and arrange the values as dense arrays.

    ``metric_spec`` (``analysis.metrics``: "all" or names) picks among ``all_metrics`` (the registry's
    names with the run's SLO definitions); ``scheduler_order`` (``simulation.schedulers``) orders the
    schedulers (the registry's order for "all"); ``source_order`` (``cfg.source_names()``) orders the
    sources (others by name); ``names`` are their display names (``cfg.display_names``)."""
    required = ["source", "provenance", "window_id", "region", "rho", "scheduler", "replicate"]
    missing = [c for c in required if c not in runs.columns]
    if missing:
        raise DataError(where, f"missing column(s) {missing}", column=missing[0])
    if runs.height == 0:
        raise DataError(where, "the runs table is empty")
    notes: list[str] = []
    want = metric_spec
    requested = check_choices("analysis.metrics", want, all_metrics)
    absent = [m for m in requested if m not in runs.columns]
    if absent and want != "all":
        raise DataError(where, f"metric column(s) {absent} requested by analysis.metrics are absent",
                        column=absent[0])
    if absent:
        notes.append(f"metrics absent from the runs table and left out: {', '.join(absent)}")
    metrics = [m for m in requested if m in runs.columns]
    if not metrics:
        raise DataError(where, "no metric column of the metric registry is present")

    sources_present = runs["source"].unique().to_list()
    sources = ([s for s in source_order if s in sources_present]
               + sorted(set(sources_present) - set(source_order)))
    provenance = {}
    for s in sources:
        provs = runs.filter(pl.col("source") == s)["provenance"].unique().to_list()
        if len(provs) != 1:
            raise DataError(where, f"source {s!r} has mixed provenance {provs}", column="provenance")
        provenance[s] = provs[0]
    reg = runs.group_by("region").agg(pl.col("rho").first()).sort(["rho", "region"])
    regions, rho = reg["region"].to_list(), dict(zip(reg["region"], reg["rho"]))

    # schedulers and regions present for every source
    per_source = runs.group_by("source").agg(pl.col("scheduler").unique(), pl.col("region").unique())
    common_sched = set.intersection(*(set(x) for x in per_source["scheduler"]))
    common_reg = set.intersection(*(set(x) for x in per_source["region"]))
    dropped = (set(runs["scheduler"].unique()) - common_sched)
    if dropped:
        notes.append(f"schedulers not run on every source, left out: {', '.join(sorted(dropped))}")
    if set(regions) - common_reg:
        notes.append(f"regions not run on every source, left out: {', '.join(sorted(set(regions) - common_reg))}")
    regions = [r for r in regions if r in common_reg]
    schedulers = _scheduler_order(common_sched, scheduler_order)
    if len(schedulers) < 2:
        raise DataError(where, f"at least 2 schedulers are needed to rank, found {schedulers}")

    finite = [pl.when(pl.col(m).cast(pl.Float64).is_finite()).then(pl.col(m).cast(pl.Float64))
              .otherwise(None).alias(m) for m in metrics]
    nonfinite = int(sum(runs[m].cast(pl.Float64).is_finite().not_().sum() for m in metrics))
    if nonfinite:
        notes.append(f"{nonfinite} non-finite or missing metric values treated as missing")
    agg = (runs.filter(pl.col("scheduler").is_in(schedulers) & pl.col("region").is_in(regions))
           .with_columns(finite)
           .group_by(["source", "window_id", "region", "scheduler"])
           .agg([pl.col(m).mean() for m in metrics] + [pl.len().alias("_n_rep")]))

    values, n_rep, windows = {}, {}, {}
    r_pos = {r: i for i, r in enumerate(regions)}
    k_pos = {k: i for i, k in enumerate(schedulers)}
    for s in sources:
        sub = agg.filter(pl.col("source") == s)
        wins = sorted(sub["window_id"].unique().to_list())
        w_pos = {w: i for i, w in enumerate(wins)}
        ri = np.array([r_pos[x] for x in sub["region"].to_list()])
        ki = np.array([k_pos[x] for x in sub["scheduler"].to_list()])
        wi = np.array([w_pos[x] for x in sub["window_id"].to_list()])
        arr = np.full((len(regions), len(metrics), len(schedulers), len(wins)), np.nan)
        arr[ri, :, ki, wi] = sub.select(metrics).to_numpy().astype(float)
        cnt = np.zeros((len(regions), len(schedulers), len(wins)), dtype=np.int64)
        cnt[ri, ki, wi] = sub["_n_rep"].to_numpy()
        values[s], n_rep[s], windows[s] = arr, cnt, wins
        n_missing = int((cnt == 0).sum())
        if n_missing:
            notes.append(f"{s}: {n_missing} (region, scheduler, window) cells have no run")
    return Cube(sources=sources, provenance=provenance, regions=regions, rho=rho, metrics=metrics,
                directions=[metric_direction(m) for m in metrics], schedulers=schedulers,
                windows=windows, values=values, n_replicates=n_rep, notes=notes, names=dict(names or {}))


@dataclass
class Analysis:
    """Every analysis table (polars) and the summary numbers (JSON-ready dict); ``manifest`` /
    ``manifest_error``: the window manifest :func:`portbench.study.analysis.load` was given (None: it could not
    be loaded, and why), which :func:`portbench.study.analysis.write_summary` reads (not written to disk)."""

    tables: dict[str, pl.DataFrame]
    summary: dict
    meta: dict
    manifest: Manifest | None = field(default=None, repr=False, compare=False)
    manifest_error: str = field(default="", repr=False, compare=False)

    @property
    def provenance(self) -> dict[str, str]:
        return {s: v["provenance"] for s, v in self.summary["provenance"].items()}

    @property
    def skipped(self) -> list[str]:
        """Configured sources without runs (recorded in the summary)."""
        return list(self.summary["data"].get("skipped_sources", []))

    @property
    def labels(self) -> dict[str, str]:
        return {s: v["label"] for s, v in self.summary["provenance"].items()}

    @property
    def names(self) -> dict[str, str]:
        """Display names without the stand-in mark."""
        return {s: v.get("name") or s for s, v in self.summary["provenance"].items()}

    def __getitem__(self, table: str) -> pl.DataFrame:
        return self.tables[table]
