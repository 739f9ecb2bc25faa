"""Controls for the design beside the headline (issue #25): quantised timestamps (``trace_checks``), the
headline with arrivals spread within the grid (``controls.arrival_jitter``), and congestion beside rho
(``congestion``).

* **Trace checks** (:func:`trace_checks_block`): per source, :func:`portbench.data.trace_checks.windows_check`
  on its frozen windows (what is simulated; stand-ins and a user's trace included) and, for a real source,
  :func:`~portbench.data.trace_checks.timestamp_check` on the whole trace from the ingest report.
* **Arrival jitter** (:func:`run_jitter`, :func:`jitter_control`): the quantised sources' windows simulated again
  with ``simulation.arrival_jitter: true`` (every scheduler, region and replicate, under
  ``{results_dir}/arrival_jitter``); the headline recomputed with those runs in place of the originals.
* **Congestion** (:func:`congestion_block`): per source x region, from the reference policy's runs: the
  time-averaged number of waiting requests (``queue_mean``), the share of the observation with at least one
  request waiting and the share of end-to-end time spent waiting (from the per-request records where kept).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import polars as pl

from ...core import io
from ...core.config import Config, DataSettings
from ...data import trace_checks
from ...data import traces as traces_mod
from ...data import windows as windows_mod
from ...data.windows import Manifest
from .. import campaign
from .common import _num


def trace_checks_block(data: DataSettings, windows_per_source: int | None, *, manifest: Mapping) -> dict:
    """``summary.json["trace_checks"]``: per source (of ``data.sources`` with windows in ``manifest``)
    ``quantised``, ``grid_step_s`` and the measures, on its first ``windows_per_source`` (``campaign`` section)
    windows and (real sources) on the whole trace (the ingest report under ``data.paths``)."""
    sources = [s for s in data.sources if s in manifest.get("sources", {})]
    tables = windows_mod.load_windows(data, sources, per_source=windows_per_source, manifest=manifest)
    by_source: dict[str, list] = {}
    src_of = {e["id"]: e["source"] for e in manifest["windows"]}
    for wid, df in tables.items():
        by_source.setdefault(src_of[wid], []).append(df["arrival_s"].to_numpy())
    report = traces_mod._read_report(data.paths.data_dir).get("sources", {})
    out: dict = {"definition": {
        "quantised": f"at least {trace_checks.ZERO_GAP_FLAG:.0%} of consecutive arrival gaps are zero, or the arrivals "
                     f"sit on a grid of at least {trace_checks.MIN_STEP_S:g} s",
        "grid_step_s": f"the step that at least {trace_checks.GRID_SHARE:.0%} of the non-zero gaps are whole multiples "
                       f"of (within {trace_checks.GRID_TOL:.0%} of a step), else null",
        "distinct_ratio": "distinct arrival times / requests", "zero_gap_share": "share of consecutive gaps that are 0",
        "scope": "windows = the campaign's frozen windows' arrivals (gaps within each window); trace = the whole file "
                 "(ingest report)"},
        "sources": {}}
    for s in sources:
        w = trace_checks.windows_check(by_source.get(s, []))
        d = {"quantised": w["quantised"], "grid_step_s": _num(w["grid_step_s"]),
             "provenance": manifest["sources"][s].get("provenance"),
             "windows": {k: _num(v) if not isinstance(v, bool) else v for k, v in w.items()}}
        tr = (report.get(s) or {}).get("timestamps")
        if tr:
            d["trace"] = tr
            d["quantised"] = bool(d["quantised"] or tr.get("quantised"))
            d["grid_step_s"] = d["grid_step_s"] or _num(tr.get("grid_step_s"))
        out["sources"][s] = d
    out["quantised_sources"] = [s for s, d in out["sources"].items() if d["quantised"]]
    return out


# --------------------------------------------------------------------------- arrival jitter


def jitter_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "arrival_jitter"


def _jitter_config(cfg: Config) -> Config:
    return cfg.with_overrides({"paths.results_dir": str(jitter_dir(cfg.paths.results_dir)), "simulation.arrival_jitter": True,
                               "campaign.request_records": None})


def run_jitter(cfg: Config, sources=None, *, manifest: Manifest, progress: bool = True) -> pl.DataFrame | None:
    """Simulate the quantised sources' windows again with arrivals spread within their grid (every scheduler,
    region and replicate of the campaign); ``sources`` default: the trace checks' quantised sources. Returns
    the runs (None when no source is quantised). ``manifest``: the stage's window manifest."""
    if sources is None:
        sources = trace_checks_block(cfg.data, cfg.campaign.windows_per_source, manifest=manifest)["quantised_sources"]
    sources = list(sources)
    if not sources:
        return None
    sub = _jitter_config(cfg)
    refs = [r for r in campaign.window_refs(manifest, cfg.source_names(), cfg.campaign) if r.source in sources]
    tables = windows_mod.load_windows(cfg.data, sources, per_source=cfg.campaign.windows_per_source, manifest=manifest)
    given = campaign.run_tables(sub.data, sub.predictors, sub.simulation, {r.id: tables[r.id] for r in refs},
                                campaign.make_plan(cfg.plan_settings, manifest=manifest).schedulers, manifest=manifest,
                                workers=sub.campaign.workers)
    campaign.reuse_capacities(cfg, sub)        # capacity is measured on a backlog: arrival times do not enter it
    res = campaign.run(sub, windows=[(r, given[r.id]) for r in refs], progress=progress, verbose=False)
    io.write_text(jitter_dir(cfg.paths.results_dir) / "sources.json", json.dumps(sources))
    return res.runs


def load_jitter(results_dir: Path) -> pl.DataFrame | None:
    """The jittered runs of :func:`run_jitter` (under ``results_dir``), or None when they have not been simulated."""
    p = campaign.runs_path(jitter_dir(results_dir))
    return pl.read_parquet(p) if p.is_file() else None


def jittered_runs(runs: pl.DataFrame, jitter: pl.DataFrame) -> pl.DataFrame:
    """``runs`` with the rows of the jittered sources replaced by their jittered runs."""
    srcs = jitter["source"].unique().to_list()
    return pl.concat([runs.filter(~pl.col("source").is_in(srcs)), jitter.select(runs.columns)], how="vertical")


# --------------------------------------------------------------------------- equal information


def equal_info_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "equal_information"


# The equal-information control's variant of each predictor-informed policy: the same policy on a noisy oracle
# length (true output x exp(N(0, simulation.predictor_sigma))), of the same quality on every source.
EQUAL_INFORMATION = {"sjf_predicted": "sjf_noisy_oracle", "ltr": "ltr_noisy_oracle", "edf": "edf_noisy_oracle"}


def run_equal_information(cfg: Config, sources, *, manifest: Manifest, progress: bool = True) -> pl.DataFrame | None:
    """The equal-information control: the predictor-informed policies' noisy-oracle variants
    (:data:`EQUAL_INFORMATION`: ``sjf_noisy_oracle``, ``ltr_noisy_oracle`` -- the true length
    with the same log-normal noise, ``simulation.predictor_sigma``, on every source -- and ``edf_noisy_oracle``, EDF on
    the deadline of that noisy length) on every window of ``sources``, every region and replicate, under
    ``{results_dir}/equal_information``. Returns the runs (None when none of the policies is in the campaign).
    ``manifest``: the stage's window manifest."""
    main = campaign.make_plan(cfg.plan_settings, manifest=manifest).schedulers
    variants = [v for k, v in EQUAL_INFORMATION.items() if k in main]
    if not variants:
        return None
    sub = cfg.with_overrides({"paths.results_dir": str(equal_info_dir(cfg.paths.results_dir)), "simulation.schedulers": variants,
                              "campaign.request_records": None})
    refs = [r for r in campaign.window_refs(manifest, cfg.source_names(), cfg.campaign)
            if r.source in set(sources)]
    tables = windows_mod.load_windows(cfg.data, sorted({r.source for r in refs}),
                                      per_source=cfg.campaign.windows_per_source, manifest=manifest)
    given = campaign.run_tables(sub.data, sub.predictors, sub.simulation, {r.id: tables[r.id] for r in refs}, variants,
                                manifest=manifest, workers=sub.campaign.workers)
    campaign.reuse_capacities(cfg, sub)
    return campaign.run(sub, windows=[(r, given[r.id]) for r in refs], progress=progress, verbose=False).runs


def load_equal_information(results_dir: Path) -> pl.DataFrame | None:
    """The runs of :func:`run_equal_information` (under ``results_dir``), or None when they have not been simulated."""
    p = campaign.runs_path(equal_info_dir(results_dir))
    return pl.read_parquet(p) if p.is_file() else None


def equal_information_runs(runs: pl.DataFrame, variants: pl.DataFrame) -> pl.DataFrame:
    """``runs`` with each predictor-informed policy's rows replaced, on the sources ``variants`` covers, by its
    noisy-oracle variant's rows (renamed to the policy, so the variant takes its place among the 13); a policy whose
    variant has no runs keeps its own."""
    back = {v: k for k, v in EQUAL_INFORMATION.items()}
    v = (variants.filter(pl.col("scheduler").is_in(list(back)))       # runs of an older control's variants left out
         .with_columns(pl.col("scheduler").replace(back)).select(runs.columns))
    srcs = v["source"].unique().to_list()
    drop = pl.col("source").is_in(srcs) & pl.col("scheduler").is_in(v["scheduler"].unique().to_list())
    return pl.concat([runs.filter(~drop), v], how="vertical")


# --------------------------------------------------------------------------- congestion


def load_records(results_dir: Path) -> pl.DataFrame | None:
    """Every kept per-request record of the campaign (``{results_dir}/requests``), or None."""
    files = sorted((Path(results_dir) / "requests").glob("*.parquet"))
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed") if files else None


def _union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total length of the union of intervals [start, end)."""
    ok = np.isfinite(start) & np.isfinite(end) & (end > start)
    s, e = start[ok], end[ok]
    if s.size == 0:
        return 0.0
    o = np.argsort(s)
    s, e = s[o], np.maximum.accumulate(e[o])
    new = np.r_[True, s[1:] > e[:-1]]                    # a new block where a start passes every earlier end
    idx = np.flatnonzero(new)
    ends = np.r_[e[idx[1:] - 1], e[-1]]
    return float(np.sum(ends - s[idx]))


def waiting_from_records(records: pl.DataFrame, reference: str) -> pl.DataFrame:
    """Per (source, region): the share of the observation with at least one request waiting (union of the
    [arrival, admitted) intervals over the horizon; requests never admitted wait until the horizon), from the
    reference policy's kept per-request records."""
    rows = []
    rec = records.filter((pl.col("scheduler") == reference) & ~pl.col("refused").fill_null(False))
    for (src, reg, _wid, _rep), g in rec.group_by(["source", "region", "window_id", "replicate"], maintain_order=True):
        a = g["arrival_s"].to_numpy().astype(float)
        adm = g["admitted_s"].to_numpy().astype(float)
        fin = g["finish_s"].to_numpy().astype(float)
        horizon = float(np.nanmax(np.r_[fin[np.isfinite(fin)], adm[np.isfinite(adm)], a]))
        span = horizon - float(a.min())
        adm = np.where(np.isfinite(adm), adm, horizon)
        rows.append({"source": src, "region": reg, "share": _union_length(a, adm) / span if span > 0 else np.nan})
    if not rows:
        return pl.DataFrame(schema={"source": pl.String, "region": pl.String, "busy_waiting_share": pl.Float64,
                                    "record_runs": pl.UInt32})
    return (pl.DataFrame(rows).group_by(["source", "region"])
            .agg(pl.col("share").mean().alias("busy_waiting_share"), pl.len().alias("record_runs")))


def congestion_block(runs: pl.DataFrame, reference: str = "fcfs", records: pl.DataFrame | None = None) -> dict:
    """``summary.json["congestion"]``: per source x region, beside rho, the reference policy's mean queue
    (time-averaged waiting requests), utilisation, the share of end-to-end time spent waiting (Little's law:
    queue_mean x horizon / (e2e_mean x completed requests), mean over runs) and, where per-request records
    were kept, the share of time with a waiting request."""
    ref = runs.filter(pl.col("scheduler") == reference)
    if ref.height == 0:
        ref = runs
    cols = [c for c in ("queue_mean", "queue_p95", "utilisation") if c in ref.columns]
    little = []
    if {"queue_mean", "horizon_s", "e2e_mean", "completed_n"} <= set(ref.columns):
        little = [(pl.col("queue_mean") * pl.col("horizon_s") / (pl.col("e2e_mean") * pl.col("completed_n")))
                  .mean().alias("wait_share_e2e")]
    agg = ref.group_by(["source", "region"]).agg(pl.col("rho").first(), *[pl.col(c).mean() for c in cols], *little,
                                                 pl.len().alias("runs")).sort(["source", "rho"])
    out: dict = {"reference_policy": reference, "definition": {
        "queue_mean": "waiting requests, time-averaged over the observation horizon (mean over the reference "
                      "policy's runs)",
        "wait_share_e2e": "share of end-to-end time spent waiting for admission, by Little's law: time-averaged "
                          "queue x horizon / (e2e_mean x completed requests), mean over runs (requests unfinished at "
                          "the horizon add waiting but no E2E, so it can exceed 1 under overload)",
        "busy_waiting_share": "share of the observation (first arrival to last event) with at least one request "
                              "waiting, from the per-request records (campaign.request_records: only the runs kept)"},
        "by_source_region": {}}
    wait = waiting_from_records(records, reference) if records is not None and "admitted_s" in records.columns else None
    for r in agg.iter_rows(named=True):
        d = {"rho": _num(r["rho"]), **{c: _num(r[c]) for c in cols}, "runs": int(r["runs"])}
        if little:
            d["wait_share_e2e"] = _num(r["wait_share_e2e"])
        if wait is not None:
            w = wait.filter((pl.col("source") == r["source"]) & (pl.col("region") == r["region"]))
            if w.height:
                d["busy_waiting_share"] = _num(w["busy_waiting_share"][0])
                d["record_runs"] = int(w["record_runs"][0])
        out["by_source_region"].setdefault(r["source"], {})[r["region"]] = d
    return out


def matched_queue(cong: dict, sources, regions) -> dict:
    """For every source pair, the region pairs whose mean queues are closest (the same congestion rather than the
    same rho): ``{"a vs b": [(region_a, region_b, queue_a, queue_b), ...]}`` one per region of a."""
    out = {}
    by = cong["by_source_region"]
    for i, a in enumerate(sources):
        for b in sources[i + 1:]:
            rows = []
            for ra in regions:
                qa = (by.get(a, {}).get(ra) or {}).get("queue_mean")
                cands = [(abs(np.log1p(qa) - np.log1p(qb)), rb, qb) for rb in regions
                         if qa is not None and (qb := (by.get(b, {}).get(rb) or {}).get("queue_mean")) is not None]
                if cands:
                    _, rb, qb = min(cands)
                    rows.append((ra, rb, qa, qb))
            out[f"{a} vs {b}"] = rows
    return out


MATCH_RATIO = 2.0   # two regions are at matched congestion when their mean queues (+ 1) are within this factor


def split_matches(matched: dict, max_ratio: float = MATCH_RATIO) -> tuple[dict, list[dict]]:
    """``(kept, unmatched)`` of :func:`matched_queue`'s closest regions: a region of a source whose closest region of
    the other source has a mean queue (+ 1) more than ``max_ratio`` times larger or smaller has no match at the same
    congestion -- it is left out of the control (``unmatched``: pair, regions and both queues), instead of being
    compared with a region that is only the least far."""
    kept: dict[str, list] = {}
    dropped: list[dict] = []
    for pair, rows in matched.items():
        kept[pair] = []
        for ra, rb, qa, qb in rows:
            if abs(np.log1p(qa) - np.log1p(qb)) <= np.log(max_ratio):
                kept[pair].append((ra, rb, qa, qb))
            else:
                dropped.append({"pair": pair, "region_a": ra, "closest_b": rb, "queue_a": _num(qa), "queue_b": _num(qb)})
    return kept, dropped


__all__ = [
    "MATCH_RATIO",
    "congestion_block",
    "jitter_dir",
    "jittered_runs",
    "load_jitter",
    "load_records",
    "matched_queue",
    "run_jitter",
    "split_matches",
    "trace_checks_block",
    "waiting_from_records",
]
