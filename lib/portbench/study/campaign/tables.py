"""Tables of a campaign's runs for notebook 03: regions, request accounting, capacity, load curves,
preemptions (computed here; drawn in :mod:`portbench.present.plots_sim`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from ...core.config import SimulationConfig
from .. import stats

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


def source_rank(order: Sequence[str] = ()):
    """Sort key of source names: their position in ``order`` (e.g. ``cfg.source_names()``), then by name."""
    pos = {s: i for i, s in enumerate(order)}
    return lambda source: (pos.get(source, len(pos)), source)


def capacity_summary(runs, order: Sequence[str] = ()):
    """Per source (in ``order``, e.g. the parameters' source order; others by name): windows and median /
    min / max capacity (req/s) -- one value per source since capacity is measured per source."""

    cap = capacity_by_window(runs).group_by(["source", "provenance"]).agg(
        pl.len().alias("windows"), pl.col("capacity_rps").median().alias("median"),
        pl.col("capacity_rps").min().alias("min"), pl.col("capacity_rps").max().alias("max"))
    key = source_rank(order)
    return cap.sort(pl.col("source").map_elements(lambda s: key(s)[0], return_dtype=pl.Int64), "source")


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


def load_story(runs, schedulers: Sequence[str] | None = None, order: Sequence[str] = ()) -> list[dict]:
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
    key = source_rank(order)
    return sorted(out, key=lambda r: key(r["source"]))


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


# --------------------------------------------------------------------------- engine and load (issue #10)

DISTINCT_METRIC = "e2e_mean"
DISTINCT_TOLERANCE = 0.01


def distinct_means(values, tolerance: float = DISTINCT_TOLERANCE) -> int:
    """Number of distinguishable values at a relative resolution: sorted, a new group starts at every
    relative gap |x − y| / ((|x| + |y|)/2) of at least ``tolerance`` (the analysis' tie rule,
    :func:`portbench.study.stats.tolerant_ranks`). NaNs are ignored."""
    x = np.asarray([v for v in values if v == v], dtype=float)
    if not len(x):
        return 0
    return int(len(np.unique(stats.tolerant_ranks(x, tolerance))))


def refusal_table(runs):
    """Requests refused for their context length (prompt >= max_model_len), per source × region ×
    scheduler: refused, arrived and their fraction (the same for every scheduler of a window: refusal
    depends on the prompt alone)."""
    if "refused" not in runs.columns:
        return pl.DataFrame()
    return (runs.group_by(["source", "region", "rho", "scheduler"])
            .agg(pl.col("refused").sum(), pl.col("clipped").sum(), pl.col("arrived").sum())
            .with_columns((pl.col("refused") / pl.col("arrived")).alias("refused_frac"))
            .sort(["source", "rho", "scheduler"]))


def load_table(runs, reference: str = "fcfs", metric: str = DISTINCT_METRIC, tolerance: float = DISTINCT_TOLERANCE,
               order: Sequence[str] = ()):
    """One row per source × region: target ρ, the windows' median capacity, the achieved utilisation of the
    reference policy's runs (mean, and the 10th-90th percentile over its windows), its time-weighted
    queue length (mean of the runs' time averages and of their 95th percentiles), refused requests,
    and how many schedulers are distinguishable on ``metric`` (distinct means over windows and
    replicates at ``tolerance`` relative resolution; 1 = all tied). Sources in ``order``, others by name."""
    cols = ("utilisation", "queue_mean", "queue_p95", "refused")
    if not all(c in runs.columns for c in cols):
        return pl.DataFrame()
    ref = runs.filter(pl.col("scheduler") == reference)
    if ref.height == 0:
        ref = runs
    per_window = ref.group_by(["source", "region", "rho", "window_id"]).agg(pl.col("utilisation").mean())
    agg = (ref.group_by(["source", "provenance", "region", "rho"])
           .agg(pl.col("capacity_rps").median(), pl.col("utilisation").mean(),
                pl.col("queue_mean").mean(), pl.col("queue_p95").mean(),
                pl.col("refused").sum(), pl.col("arrived").sum())
           .join(per_window.group_by(["source", "region", "rho"]).agg(
               pl.col("utilisation").quantile(0.1).alias("utilisation_p10"),
               pl.col("utilisation").quantile(0.9).alias("utilisation_p90")), on=["source", "region", "rho"]))
    distinct = []
    if metric in runs.columns:
        means = runs.group_by(["source", "region", "scheduler"]).agg(pl.col(metric).mean())
        for (src, reg), g in means.group_by(["source", "region"]):
            distinct.append({"source": src, "region": reg, "distinct_schedulers": distinct_means(g[metric].to_list(),
                                                                                                  tolerance),
                             "n_schedulers": g.height})
    out = agg.with_columns((pl.col("refused") / pl.col("arrived")).alias("refused_frac"))
    if distinct:
        out = out.join(pl.DataFrame(distinct), on=["source", "region"], how="left")
    key = source_rank(order)
    return out.sort(pl.col("source").map_elements(lambda s: key(s)[0], return_dtype=pl.Int64), "source", "rho")


def engine_summary(sim: SimulationConfig, profile) -> dict:
    """The ``engine`` block of summary.json: batching, preemption, prefix caching, the profile and its
    context limit, token budget and running-sequence cap."""
    e = sim.engine
    return {"batching": e.batching, "preemption": e.preemption, "prefix_caching": e.prefix_caching,
            "profile": getattr(profile, "name", str(sim.profile)), "model": getattr(profile, "model", None),
            "gpu": getattr(profile, "gpu", None), "max_model_len": int(getattr(profile, "max_model_len", 0) or 0),
            "max_num_batched_tokens": int(getattr(profile, "max_batched_tokens", 0) or 0),
            "max_num_seqs": int(getattr(profile, "max_num_seqs", 0) or 0),
            "kv_capacity_tokens": int(getattr(profile, "kv_capacity_tokens", 0) or 0),
            "definition": "the serving engine every scheduler ran on (see portbench.sim.engine): vLLM V1 "
                          "batching = running decodes first, then prompt chunks in the policy's order under "
                          "max_num_batched_tokens; v0 = prefill-first whole prompts"}


def capacity_comparison(capacities: Mapping, runs, order: Sequence[str] = ()) -> pl.DataFrame:
    """Per source (in ``order``, others by name): the windows' sustainable throughput (median, min, max,
    requests/s) next to the earlier burst definition (completed / makespan of one burst of the window),
    and their ratio."""
    src = dict(runs.select("window_id", "source").unique().iter_rows())
    rows = [{"source": src[w], "window_id": w, "capacity_rps": c.get("capacity_rps"),
             "burst_rps": c.get("burst_rps", float("nan"))} for w, c in capacities.items() if w in src]
    if not rows:
        return pl.DataFrame()
    df = pl.DataFrame(rows).with_columns((pl.col("capacity_rps") / pl.col("burst_rps")).alias("ratio"))
    out = df.group_by("source").agg(
        pl.len().alias("windows"), pl.col("capacity_rps").median().alias("median_rps"),
        pl.col("capacity_rps").min().alias("min_rps"), pl.col("capacity_rps").max().alias("max_rps"),
        pl.col("burst_rps").median().alias("burst_median_rps"),
        pl.col("ratio").median().alias("ratio_median"), pl.col("ratio").min().alias("ratio_min"),
        pl.col("ratio").max().alias("ratio_max"))
    key = source_rank(order)
    return out.sort(pl.col("source").map_elements(lambda s: key(s)[0], return_dtype=pl.Int64), "source")


def load_summary(runs, capacities: Mapping, reference: str = "fcfs") -> dict:
    """The ``load`` block of summary.json: per source its capacity (median over its windows, requests/s;
    the range; the earlier burst definition for comparison) and how it was
    measured; per source × region the target ρ, achieved utilisation, mean / p95 queue length,
    refused requests and the number of distinct scheduler means on e2e_mean at 1 % resolution; and the
    count of source × region conditions where every scheduler is tied on it."""
    t = load_table(runs, reference)
    method = next((c.get("method") for c in (capacities or {}).values() if c.get("method")), None)
    out: dict = {"capacity": {}, "by_source_region": {}, "reference_policy": reference,
                 "definition": {"capacity": "sustainable throughput of each window's request mix: completions per "
                                            "second in the steady part of a backlogged run (saturation experiment, "
                                            "portbench.sim.regions.saturation); per source the median over its "
                                            "windows",
                                "capacity_method": method,
                                "utilisation": "useful tokens (prompt tokens computed for the first time + tokens "
                                               "generated) done per second between the 10%-quantile and the last "
                                               "arrival, over capacity × the window's mean useful tokens per "
                                               "request; mean over the reference policy's runs",
                                "queue": "waiting requests, time-weighted over the observation horizon: mean of "
                                         "the runs' time averages and of their 95th percentiles (reference policy)",
                                "distinct_schedulers": f"distinct scheduler means of {DISTINCT_METRIC} (over windows and "
                                                       f"replicates) at {DISTINCT_TOLERANCE:.0%} relative resolution"}}
    comp = capacity_comparison(capacities or {}, runs)
    for r in comp.iter_rows(named=True):
        out["capacity"][r["source"]] = {"capacity_rps": r["median_rps"], "range_rps": [r["min_rps"], r["max_rps"]],
                                        "windows": r["windows"],
                                        "burst_capacity_rps": r["burst_median_rps"],
                                        "sustainable_over_burst": {"median": r["ratio_median"],
                                                                   "range": [r["ratio_min"], r["ratio_max"]]}}
    if t.height == 0:
        return out
    all_tied = 0
    for r in t.iter_rows(named=True):
        d = out["by_source_region"].setdefault(r["source"], {})
        d[r["region"]] = {"rho": r["rho"], "utilisation": r["utilisation"],
                          "utilisation_windows_p10_p90": [r["utilisation_p10"], r["utilisation_p90"]],
                          "queue_mean": r["queue_mean"], "queue_p95": r["queue_p95"], "refused": int(r["refused"]),
                          "refused_frac": r["refused_frac"], "distinct_schedulers": r.get("distinct_schedulers"),
                          "n_schedulers": r.get("n_schedulers")}
        all_tied += int(r.get("distinct_schedulers") == 1)
    out["all_tied_conditions"] = {"count": all_tied, "of": t.height,
                                  "definition": f"source × region conditions where every scheduler's {DISTINCT_METRIC} "
                                                f"mean is within {DISTINCT_TOLERANCE:.0%} of the next (one tie group); "
                                                "the rank-agreement statistics leave such rankings out (tau-b undefined) "
                                                "and count them"}
    return out
