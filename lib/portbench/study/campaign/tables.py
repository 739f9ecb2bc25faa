"""Tables of a campaign's runs for notebook 03: regions, request accounting, capacity, load curves,
preemptions (computed here; drawn in :mod:`portbench.present.plots_sim`)."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from ...core.config import SimulationConfig
from ...core.provenance import SOURCES

CURVE_SCHEDULERS = ("fcfs", "sarathi", "srpt_oracle", "las", "random")


def regions_table(sim: SimulationConfig):
    """One row per campaign region: name and offered load rho (x the window's measured capacity)."""
    loads = sim.loads
    return pl.DataFrame({"region": list(loads), "rho": list(loads.values())})


def conservation_summary(runs):
    """Request accounting per source and overall: arrived = completed + unfinished + rejected, and
    the number of runs where it does not hold (must be 0)."""

    bad = (pl.col("arrived") != pl.col("completed_n") + pl.col("unfinished") + pl.col("rejected"))
    agg = [pl.len().alias("runs"), pl.col("arrived").sum(), pl.col("completed_n").sum(),
           pl.col("unfinished").sum(), pl.col("rejected").sum(), pl.col("preemptions").sum(),
           bad.sum().alias("violations")]
    per = runs.group_by(["source", "provenance"]).agg(agg).sort("source")
    total = runs.select(agg).with_columns(pl.lit("all").alias("source"), pl.lit("").alias("provenance"))
    return pl.concat([per, total.select(per.columns)], how="vertical")


def _source_rank(source: str) -> tuple:
    return (SOURCES.index(source), "") if source in SOURCES else (len(SOURCES), source)


def capacity_summary(runs):
    """Per source (in the study's source order): windows and median / min / max capacity (req/s)."""

    cap = capacity_by_window(runs).group_by(["source", "provenance"]).agg(
        pl.len().alias("windows"), pl.col("capacity_rps").median().alias("median"),
        pl.col("capacity_rps").min().alias("min"), pl.col("capacity_rps").max().alias("max"))
    return cap.sort(pl.col("source").map_elements(lambda s: _source_rank(s)[0], return_dtype=pl.Int64))


def capacity_by_window(runs):
    """One row per window: source, provenance, window id, measured capacity (req/s)."""
    return runs.select(["source", "provenance", "window_id", "capacity_rps"]).unique().sort(["source", "window_id"])


def curve_schedulers(runs, preferred: Sequence[str] = CURVE_SCHEDULERS, k: int = 5) -> list[str]:
    """A few schedulers for load curves: the preferred ones present, topped up in name order."""
    present = sorted(runs["scheduler"].unique().to_list())
    out = [s for s in preferred if s in present]
    return (out + [s for s in present if s not in out])[:k]


def load_curves(runs, metrics: Sequence[str], schedulers: Sequence[str] | None = None):
    """Median and inter-quartile range over windows x replicates of each metric, per (source,
    scheduler, region); ``completed_frac`` = completed_n / arrived is available as a metric."""

    df = runs.with_columns((pl.col("completed_n") / pl.col("arrived")).alias("completed_frac"))
    if schedulers is not None:
        df = df.filter(pl.col("scheduler").is_in(list(schedulers)))
    agg = []
    for m in metrics:
        agg += [pl.col(m).median().alias(f"{m}_median"), pl.col(m).quantile(0.25).alias(f"{m}_q25"),
                pl.col(m).quantile(0.75).alias(f"{m}_q75")]
    return df.group_by(["source", "provenance", "scheduler", "region", "rho"]).agg(agg).sort(
        ["source", "scheduler", "rho"])


def load_story(runs, schedulers: Sequence[str] | None = None) -> list[dict]:
    """Numbers behind the load-curve text, per source: the lightest and heaviest region's median
    completion fraction and e2e_p99 over the given schedulers' runs."""

    df = runs.with_columns((pl.col("completed_n") / pl.col("arrived")).alias("completed_frac"))
    if schedulers is not None:
        df = df.filter(pl.col("scheduler").is_in(list(schedulers)))
    lo, hi = df["rho"].min(), df["rho"].max()
    out = []
    for (s, prov), g in df.group_by(["source", "provenance"], maintain_order=True):
        light, heavy = g.filter(pl.col("rho") == lo), g.filter(pl.col("rho") == hi)
        row = {"source": s, "provenance": prov, "rho_light": lo, "rho_heavy": hi,
               "region_light": light["region"][0], "region_heavy": heavy["region"][0],
               "completed_light": float(light["completed_frac"].median()),
               "completed_heavy": float(heavy["completed_frac"].median())}
        if "e2e_p99" in g.columns:
            row["e2e_p99_light"] = float(light["e2e_p99"].median())
            row["e2e_p99_heavy"] = float(heavy["e2e_p99"].median())
        out.append(row)
    return sorted(out, key=lambda r: _source_rank(r["source"]))


def preemption_table(runs):
    """Mean preemptions per run by (source, scheduler, region)."""

    return runs.group_by(["source", "scheduler", "region", "rho"]).agg(
        pl.col("preemptions").mean().alias("preemptions_per_run"),
        (pl.col("rejected").sum() / pl.col("arrived").sum()).alias("rejected_frac")).sort(
        ["source", "scheduler", "rho"])


# How the attained-service policies rank requests (for :func:`preemption_markdown`).
ATTAINED_RANKING = {
    "las": "`las`: tokens generated",
    "mlfq": "`mlfq`: the feedback level a request has been demoted to",
    "rr": "`rr`: a cyclic queue that a request rejoins at the tail each time it uses up a quantum",
}
