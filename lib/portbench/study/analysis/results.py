"""Running the analysis: every table and summary number (:func:`compute`), files and ``summary.json``, tables for the notebooks."""

from __future__ import annotations

import hashlib
import io
import json
import time
import warnings
from pathlib import Path

import numpy as np
import polars as pl

from ...core import figindex
from ...core import io as fileio
from ...core.config import Config
from ...sim import schedulers as scheduler_registry
from .. import stats
from .agreement import _cross_region, _cross_source, _rank_ties, _rankings_table, _window_values_table
from .columns import FIGURE_NOTEBOOKS, SCHEMA, TABLES
from .common import _num, _source_rng, tied_ranks_definition
from .cube import Analysis, build_cube, load_runs, metric_names, settings
from .metric_agreement import _cross_metric, _friedman, _slo_sensitivity
from .reversals import _family_definition, _reversals



def compute(config: Config, runs: pl.DataFrame | None = None, *, progress: bool = False) -> Analysis:
    """Compute every table and the summary numbers (no files written)."""
    t0 = time.perf_counter()
    cfg = settings(config.analysis)
    where = cfg["runs_file"] or "campaign runs table"
    runs = load_runs(config) if runs is None else runs
    cube = build_cube(runs, metric_spec=config.analysis.metrics, all_metrics=metric_names(config.simulation.slo),
                      scheduler_order=config.simulation.schedulers, where=str(where))
    timings = {}

    def tick(name):
        timings[name] = round(time.perf_counter() - t0 - sum(timings.values()), 3)
        if progress:
            print(f"[analysis] {name}: {timings[name]:.2f} s", flush=True)

    B = cfg["bootstrap"]
    means, boot = {}, {}
    for s in cube.sources:
        xo = cube.oriented(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means[s] = np.nanmean(xo, axis=-1)                      # (R, M, K) oriented
        if B > 0:
            idx = stats.bootstrap_indices(len(cube.windows[s]), B, _source_rng(cfg["seed"], s))
            boot[s] = np.stack([stats.bootstrap_means(xo[r], idx) for r in range(len(cube.regions))])
        else:
            boot[s] = None                                          # (R, M, K, B) oriented
    tick("means_and_bootstrap")

    tables: dict[str, pl.DataFrame] = {}
    tables["window_values"] = _window_values_table(cube)
    tol = cfg["rank_tolerance"]
    tables["rankings"] = _rankings_table(cube, means, boot, tol)
    ties = _rank_ties(cube, means, tol)
    tick("rankings")
    cs = _cross_source(cube, means, boot, tables, tol)
    tick("cross_source")
    cr = _cross_region(cube, means, boot, tables, tol)
    tick("cross_region")
    rv = _reversals(cube, cfg, tables)
    tick("reversals")
    cm = _cross_metric(cube, means, boot, tables, tol)
    tick("cross_metric")
    slo = _slo_sensitivity(cube, means, boot, tables, tol)
    tick("slo_sensitivity")
    fr = _friedman(cube, cfg, tables, rv)
    tick("friedman")

    summary = {
        "schema": SCHEMA,
        "parameters": {**{k: cfg[k] for k in ("alpha", "delta", "correction", "family", "bootstrap",
                                              "seed", "ci_level", "rank_tolerance")},
                       "tied_ranks": tied_ranks_definition(tol),
                       "bootstrap_scheme": "percentile bootstrap; windows resampled with replacement "
                                           "within each source, one index matrix per source shared by "
                                           "every scheduler, region and metric",
                       "relative_effect": "|mean_a - mean_b| / ((|mean_a| + |mean_b|) / 2)",
                       "paired_test": "two-sided Wilcoxon signed-rank over windows (scipy, zeros dropped; "
                                      "all-zero differences: p = 1)",
                       "family_definition": _family_definition(cfg["family"]),
                       "metrics": cube.metrics, "schedulers": cube.schedulers, "regions": cube.regions,
                       "sources": cube.sources},
        "provenance": {s: {"provenance": cube.provenance[s], "label": cube.label(s),
                           "n_windows": len(cube.windows[s])} for s in cube.sources},
        "data": {"n_runs": runs.height, "replicates": int(runs["replicate"].n_unique()),
                 "n_windows": {s: len(cube.windows[s]) for s in cube.sources},
                 "rho": {r: _num(cube.rho[r]) for r in cube.regions},
                 "directions": dict(zip(cube.metrics, cube.directions)), "notes": cube.notes},
        "rank_ties": ties, "cross_source": cs, "cross_region": cr, "reversals": rv, "cross_metric": cm,
        "slo_sensitivity": slo, "friedman": fr, "figures": [],
    }
    timings["total"] = round(time.perf_counter() - t0, 3)
    meta = {"fingerprint": fingerprint(runs, config), "timings_s": timings}
    return Analysis(tables=tables, summary=summary, meta=meta)


def analysis_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "analysis"


def summary_path(results_dir: Path) -> Path:
    return Path(results_dir) / "summary.json"


def fingerprint(runs: pl.DataFrame, cfg: Config) -> str:
    """Hash of the runs table and everything in the parameters that changes the analysis."""
    h = hashlib.sha256()
    h.update(json.dumps(settings(cfg.analysis), sort_keys=True, default=str).encode())
    h.update(json.dumps(sorted(runs.columns)).encode())
    h.update(json.dumps(cfg.simulation.slo_dicts, sort_keys=True, default=str).encode())
    h.update(json.dumps(scheduler_registry.names(cfg.simulation.schedulers)).encode())
    buf = io.BytesIO()
    runs.write_ipc(buf)
    h.update(buf.getvalue())
    return h.hexdigest()


def write(results_dir: Path, A: Analysis) -> dict[str, str]:
    """Write every table as parquet under ``{results_dir}/analysis/`` and the summary core."""
    out = analysis_dir(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, df in A.tables.items():
        p = out / f"{name}.parquet"
        fileio.atomic_write(p, lambda tmp, df=df: df.write_parquet(tmp))
        paths[name] = str(p)
    fileio.write_text(out / "summary_core.json", json.dumps(A.summary, indent=1, default=_json_default))
    fileio.write_text(out / "meta.json", json.dumps(A.meta, indent=1))
    return paths


def _json_default(x):
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return _num(x)
    if isinstance(x, np.ndarray):
        return [_num(v) for v in x.tolist()]
    return str(x)


def load(cfg: Config, *, recompute: bool = False, progress: bool = False) -> Analysis:
    """The analysis for ``cfg``: read from ``{results_dir}/analysis`` when it matches the runs table and
    the parameters (fingerprint), else computed and written (tables, summary core and summary.json)."""
    runs = load_runs(cfg)
    fp = fingerprint(runs, cfg)
    d = analysis_dir(cfg.paths.results_dir)
    meta_p = d / "meta.json"
    if not recompute and meta_p.is_file():
        meta = json.loads(meta_p.read_text())
        files = [d / f"{t}.parquet" for t in TABLES]
        if meta.get("fingerprint") == fp and all(f.is_file() for f in files) and (d / "summary_core.json").is_file():
            tables = {t: pl.read_parquet(d / f"{t}.parquet") for t in TABLES}
            summary = json.loads((d / "summary_core.json").read_text())
            return Analysis(tables=tables, summary=summary, meta=meta)
    A = compute(cfg, runs, progress=progress)
    write(cfg.paths.results_dir, A)
    figindex.forget(cfg.paths.figures_dir, FIGURE_NOTEBOOKS)  # figures of an older analysis are not indexed
    write_summary(cfg, A)
    return A


def figure_index(cfg: Config) -> list[dict]:
    """``[{name, file, pdf, notebook, description}]`` of every figure in ``paths.figures_dir`` (notebooks
    01-08, each recorded by ``figures.save``), paths relative to the project root where possible."""
    return figindex.index(cfg.paths.figures_dir, cfg.paths.root)


def write_summary(cfg: Config, A: Analysis | None = None) -> dict:
    """Write ``{results_dir}/summary.json``: the summary numbers plus the index of every figure."""
    A = A or load(cfg)
    summary = dict(A.summary)
    summary["figures"] = figure_index(cfg)
    fileio.write_text(summary_path(cfg.paths.results_dir), json.dumps(summary, indent=1, default=_json_default))
    return summary


def headline_table(summary: dict) -> pl.DataFrame:
    """Every headline number of the summary with its definition, count and CI."""
    rows = []

    def add(section, name, st):
        if isinstance(st, dict) and "value" in st and "definition" in st:
            ci = st.get("ci") or [None, None]
            rows.append({"section": section, "number": name, "value": st["value"] if st["value"] is not None
                         else float("nan"), "ci_low": ci[0], "ci_high": ci[1], "count": st.get("count"),
                         "definition": st["definition"]})

    for section in ("rank_ties", "cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity",
                    "friedman"):
        sec = summary.get(section) or {}
        for name, st in sec.items():
            add(section, name, st)
        for group in ("by_source_pair", "by_source", "by_rank_tolerance"):
            for name, st in (sec.get(group) or {}).items():
                add(section, f"{group}: {name}", st)
    return pl.DataFrame(rows, schema={"section": pl.Utf8, "number": pl.Utf8, "value": pl.Float64,
                                      "ci_low": pl.Float64, "ci_high": pl.Float64, "count": pl.Int64,
                                      "definition": pl.Utf8})


def tolerance_sensitivity_table(A: Analysis) -> pl.DataFrame:
    """The cross-source mean tau-b at each rank tolerance of the sensitivity (``by_rank_tolerance``)."""
    sens = (A.summary.get("cross_source") or {}).get("by_rank_tolerance") or {}
    R = A.summary["parameters"]["regions"]
    rows = [{"rank_tolerance": v["rank_tolerance"], "chosen": v["chosen"], "mean_tau": v["value"],
             "n_defined": v["count"], "n_undefined": v["undefined"], "mean_tau_common": v["common_value"],
             "n_common": v["common_count"], **{f"{r}": v["by_region"][r] for r in R}} for v in sens.values()]
    schema = {"rank_tolerance": pl.Float64, "chosen": pl.Boolean, "mean_tau": pl.Float64, "n_defined": pl.Int64,
              "n_undefined": pl.Int64, "mean_tau_common": pl.Float64, "n_common": pl.Int64,
              **{r: pl.Float64 for r in R}}
    return pl.DataFrame(rows, schema=schema)


def rank_changes(A: Analysis, metrics=None, top: int = 10) -> pl.DataFrame:
    """Schedulers whose rank moves most between the lightest and the heaviest region."""
    R = A.summary["parameters"]["regions"]
    rk = A["rankings"]
    if metrics:
        rk = rk.filter(pl.col("metric").is_in(list(metrics)))
    light = rk.filter(pl.col("region") == R[0]).select("source", "metric", "scheduler",
                                                      pl.col("rank").alias(f"rank_{R[0]}"))
    heavy = rk.filter(pl.col("region") == R[-1]).select("source", "metric", "scheduler",
                                                       pl.col("rank").alias(f"rank_{R[-1]}"))
    return (light.join(heavy, on=["source", "metric", "scheduler"])
            .with_columns((pl.col(f"rank_{R[-1]}") - pl.col(f"rank_{R[0]}")).alias("rank_change"))
            .sort(pl.col("rank_change").abs(), descending=True).head(top))
