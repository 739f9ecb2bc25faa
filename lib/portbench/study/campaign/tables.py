"""Tables of a campaign's runs for notebook 03: regions, request accounting, capacity, load curves,
preemptions (computed here; drawn in :mod:`portbench.present.plots_sim`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from ...core.config import SimulationConfig

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
    from .. import stats   # scipy.stats and statsmodels: not imported by the campaign's workers

    return int(len(np.unique(stats.tolerant_ranks(x, tolerance))))


def refusal_table(runs):
    """Requests refused for their context length (a prompt of ``max_model_len`` tokens or more), per
    source × region × scheduler: refused, arrived and their fraction (the same for every scheduler of a
    window, since refusal depends on the prompt alone: :func:`refusal_check` verifies it)."""
    if "refused" not in runs.columns:
        return pl.DataFrame()
    return (runs.group_by(["source", "region", "rho", "scheduler"])
            .agg(pl.col("refused").sum(), pl.col("clipped").sum(), pl.col("arrived").sum())
            .with_columns((pl.col("refused") / pl.col("arrived")).alias("refused_frac"))
            .sort(["source", "rho", "scheduler"]))


def refusal_check(runs) -> dict:
    """Refusals per scheduler, and whether every scheduler refuses the same number of requests in every
    source × region (refusal depends on the prompt alone, so they must): ``by_source_scheduler`` (refused,
    summed over regions and replicates), ``schedulers_agree`` and the ``disagreements`` (source, region,
    {scheduler: refused}) where they do not. Empty without a ``refused`` column."""
    if "refused" not in runs.columns:
        return {}
    t = runs.group_by(["source", "region", "scheduler"]).agg(pl.col("refused").sum(), pl.col("arrived").sum())
    bad = []
    for (src, reg), g in t.sort("scheduler").group_by(["source", "region"], maintain_order=True):
        if g["refused"].n_unique() > 1:
            bad.append({"source": src, "region": reg, "refused_by_scheduler": dict(zip(g["scheduler"], g["refused"]))})
    per = t.group_by(["source", "scheduler"]).agg(pl.col("refused").sum()).sort("source", "scheduler")
    by: dict = {}
    for r in per.iter_rows(named=True):
        by.setdefault(r["source"], {})[r["scheduler"]] = int(r["refused"])
    return {"by_source_scheduler": by, "schedulers_agree": not bad,
            "disagreements": sorted(bad, key=lambda d: (d["source"], d["region"]))}


PREFIX_NA = "n/a — prefix caching inactive (no prompt block hashes in this trace's windows, or caching off)"


def prefix_cache_table(runs, by: Sequence[str] = ("source",), schedulers: Sequence[str] | None = None):
    """Prefix-cache hit rate per group ``by`` (columns of the runs table): tokens served from the cache
    (``prefix_hit_tokens``) over tokens looked up (``prefix_query_tokens``), summed over the group's runs
    (optionally only ``schedulers``' runs); ``hit_rate`` is null where nothing was looked up (caching
    inactive). Empty without the two counters."""
    if not {"prefix_hit_tokens", "prefix_query_tokens"} <= set(runs.columns):
        return pl.DataFrame()
    df = runs if schedulers is None else runs.filter(pl.col("scheduler").is_in(list(schedulers)))
    return (df.group_by(list(by)).agg(pl.col("prefix_hit_tokens").sum().alias("hit_tokens"),
                                      pl.col("prefix_query_tokens").sum().alias("looked_up_tokens"),
                                      (pl.col("prefix_query_tokens") > 0).sum().alias("runs_with_lookups"),
                                      pl.len().alias("runs"))
            .with_columns(pl.when(pl.col("looked_up_tokens") > 0)
                          .then(pl.col("hit_tokens") / pl.col("looked_up_tokens")).otherwise(None).alias("hit_rate"))
            .sort(list(by)))


def prefix_cache_summary(runs, reference: str = "fcfs", order: Sequence[str] = ()) -> dict:
    """The prefix-cache block of ``load`` in summary.json: per source the hit rate of the reference policy's
    runs, of every policy's runs pooled, and per scheduler (pooled over regions); per source × region the
    reference policy's. A source where no run looked anything up is n/a (:data:`PREFIX_NA`). Empty without
    the counters."""
    if prefix_cache_table(runs).height == 0:
        return {}
    key = source_rank(order)
    srcs = sorted(runs["source"].unique().to_list(), key=key)
    ref = reference if reference in runs["scheduler"].unique().to_list() else None
    f = lambda v: None if v is None else float(v)  # noqa: E731
    pooled = {r["source"]: r for r in prefix_cache_table(runs).iter_rows(named=True)}
    refd = {r["source"]: r for r in prefix_cache_table(runs, schedulers=[ref] if ref else None).iter_rows(named=True)}
    by_k = prefix_cache_table(runs, ("source", "scheduler"))
    by_r = prefix_cache_table(runs, ("source", "region"), schedulers=[ref] if ref else None)
    out: dict = {
        "definition": "prefix-cache hit rate = prompt tokens served from the cache / tokens looked up, summed over "
                      "runs; a request looks up its prompt + tokens generated so far each time it is admitted (a "
                      "request preempted by recompute looks up again on resuming and may hit its own blocks, so "
                      "policies that preempt more have higher rates); only windows that carry prompt block hashes "
                      "(engine.prefix_caching: auto) look anything up. hit_rate: the reference policy's runs; "
                      "hit_rate_all_policies: every policy's runs pooled; by_scheduler: each policy's runs pooled over "
                      "regions; by_region: the reference policy's runs per region",
        "reference_policy": ref, "by_source": {}}
    for s in srcs:
        p = pooled[s]
        if not p["looked_up_tokens"]:
            out["by_source"][s] = {"hit_rate": None, "note": PREFIX_NA}
            continue
        r = refd.get(s, p)
        ks = by_k.filter((pl.col("source") == s) & pl.col("hit_rate").is_not_null())
        out["by_source"][s] = {
            "hit_rate": f(r["hit_rate"]), "hit_tokens": int(r["hit_tokens"]), "looked_up_tokens": int(r["looked_up_tokens"]),
            "hit_rate_all_policies": f(p["hit_rate"]),
            "by_scheduler": dict(zip(ks["scheduler"], (float(x) for x in ks["hit_rate"]))),
            "by_region": {row["region"]: f(row["hit_rate"]) for row in by_r.filter(pl.col("source") == s)
                          .join(runs.select("region", "rho").unique(), on="region").sort("rho").iter_rows(named=True)}}
    return out


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


def load_summary(runs, capacities: Mapping, reference: str = "fcfs", order: Sequence[str] = (),
                 max_model_len: int | None = None) -> dict:
    """The ``load`` block of summary.json: per source its capacity (median over its windows, requests/s;
    the range; the earlier burst definition for comparison) and how it was
    measured; per source × region the target ρ, achieved utilisation, mean / p95 queue length,
    refused requests (reference policy) and the number of distinct scheduler means on e2e_mean at 1 %
    resolution; the count of source × region conditions where every scheduler is tied on it; ``refusals``
    per scheduler with the check that every scheduler refuses the same requests (:func:`refusal_check`);
    and ``prefix_cache``, the hit rate per source (:func:`prefix_cache_summary`)."""
    t = load_table(runs, reference, order=order)
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
    rc = refusal_check(runs)
    if rc:
        lim = f"{max_model_len:,} tokens" if max_model_len else "max_model_len tokens"
        out["refusals"] = {
            "rule": f"a request whose prompt has {lim} or more is refused at arrival (as vLLM refuses it), counted "
                    "in refused and rejected and left out of every metric",
            "depends_on": ("the prompt alone: checked, every scheduler refuses the same number of requests in every "
                           "source × region" if rc["schedulers_agree"] else
                           "schedulers disagree in the conditions listed under disagreements (check the engine)"),
            **rc}
    pc = prefix_cache_summary(runs, reference, order)
    if pc:
        out["prefix_cache"] = pc
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
