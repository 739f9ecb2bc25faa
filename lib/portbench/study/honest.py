"""Honest information for the informed policies, as results: predictor accuracy, "does a predictor
port?", the ranks of the prediction-based policies with a home, a foreign or an oracle predictor,
and per-tenant (VTC) fairness -- the ``predictors`` and ``fairness`` blocks of ``summary.json``.

**Accuracy** (:func:`accuracy`): per (train source -> target source) pair, the per-window Kendall
tau-b and Spearman rho between the frozen predictions and the true output lengths of the target's
frozen windows, and the MAE of log lengths; means over windows with 95% percentile-bootstrap CIs
(windows resampled, ``predictors.bootstrap`` resamples) -- :mod:`portbench.data.predictors`.

**The transfer campaign** (:func:`run_transfer`, "does a predictor port?"): on the first
``predictors.transfer.windows_per_source`` windows of every source, in the regions
``predictors.transfer.regions``, one replicate (replicate 0: the main campaign's seeds):

* *home*: the 13 policies with each source's own predictor, plus the comparison variants
  ``sjf_noisy_oracle``, ``ltr_noisy_oracle`` (the study's former, noisy-oracle ``sjf_predicted`` /
  ``ltr``) and ``edf_oracle``;
* *from P*: the policies of ``predictors.transfer.schedulers`` (sjf_predicted, ltr, edf) on every
  other source's windows with source P's predictor.

:func:`variant_ranks` ranks each prediction-based policy, in each variant (home predictor, a foreign
predictor, the oracle variant), among the 13 of the home part on the same windows: the variant
takes the policy's place, the other 12 keep theirs (rank 1 = best mean over the windows, ties
averaged; metric directions from the registry).

**Fairness** (:func:`fairness_block`): where the trace has tenants (fields, or the stand-in
generator's real fields / clients), the per-tenant metrics of ``vtc`` and ``fcfs`` from the main
runs; elsewhere "n/a -- no tenants in this trace" unless ``simulation.tenant_model: seeded`` chose
the seeded synthetic assignment (then labelled synthetic).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ..core.config import (AnalysisConfig, CampaignConfig, Config, DataSettings, PathsConfig, PredictorsConfig,
                           PredictorTransferConfig, SimulationConfig)
from ..core.errors import PortbenchError
from ..core import io
from ..core.io import write_parquet_atomic
from ..core.provenance import label
from ..data import predictors as PR
from ..data import windows as windows_mod
from ..sim import metrics as metric_registry
from ..sim import schedulers as scheduler_registry
from . import campaign, stats

ORACLE_VARIANT = {"sjf_predicted": "sjf_noisy_oracle", "ltr": "ltr_noisy_oracle", "edf": "edf_oracle"}
NA_TENANTS = "n/a — no tenants in this trace"


# --------------------------------------------------------------------------- accuracy


def accuracy(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, *, manifest: Mapping,
             workers: int = 1) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(per_window, summary)``: the accuracy of every (train, target) pair's frozen predictions per
    window, and per pair its means with bootstrap CIs (columns ``<stat>``, ``<stat>_ci_low/high``); ``P``: the
    ``predictors`` section, ``sim``: the noisy oracle's sigma, ``workers``: processes that may train predictors."""
    acc = PR.accuracy_table(data, P, sim.predictor_sigma, manifest=manifest, workers=workers)
    summ = PR.accuracy_summary(acc, P.bootstrap, P.seed)
    prov = {s: manifest["sources"][s]["provenance"] for s in PR.sources_of(manifest)}
    rows = []
    for (tr, tg), d in summ.items():
        row = {"train": tr, "target": tg, "train_label": label(tr, prov[tr]), "target_label": label(tg, prov[tg]),
               "home": tr == tg, "windows": d["windows"]}
        for s in PR.ACCURACY_STATS:
            ci = d.get(f"{s}_ci") or [None, None]
            row.update({s: d.get(s), f"{s}_ci_low": ci[0], f"{s}_ci_high": ci[1]})
        rows.append(row)
    schema = {"train": pl.String, "target": pl.String, "train_label": pl.String, "target_label": pl.String,
              "home": pl.Boolean, "windows": pl.Int64}
    for s in PR.ACCURACY_STATS:
        schema.update({s: pl.Float64, f"{s}_ci_low": pl.Float64, f"{s}_ci_high": pl.Float64})
    return acc, pl.DataFrame(rows, schema=schema)


# --------------------------------------------------------------------------- transfer campaign


def transfer_dir(results_dir: Path) -> Path:
    """The transfer campaign's folder, ``{results_dir}/predictor_transfer``."""
    return Path(results_dir) / "predictor_transfer"


def _sub_config(cfg: Config, part: str, schedulers: Sequence[str], windows: int | None = None) -> Config:
    T = cfg.predictors.transfer
    return cfg.with_overrides({
        "paths.results_dir": str(transfer_dir(cfg.paths.results_dir) / part), "simulation.schedulers": list(schedulers),
        "simulation.regions": list(T.regions), "simulation.replicates": 1,
        "campaign.windows_per_source": int(windows or T.windows_per_source), "campaign.request_records": None})


def _home_schedulers() -> list[str]:
    return scheduler_registry.names("all") + [v for v in ORACLE_VARIANT.values() if v in scheduler_registry.SCHEDULERS]


MAIN_RUNS_FILE = "home_from_main.parquet"   # the home part's runs of the main campaign's policies (copied)


def _main_home_runs(T: PredictorTransferConfig, sim: SimulationConfig, main_campaign: CampaignConfig,
                    main: pl.DataFrame | None, refs: Sequence[campaign.WindowRef]) -> pl.DataFrame | None:
    """The main campaign's (``main_campaign``, ``sim``; its runs ``main``) replicate-0 runs of the transfer
    campaign's (``T``) windows ``refs`` and regions, when the main campaign covers them (same seeds, same frozen
    predictions: the runs the home part would simulate)."""
    if not set(T.regions) <= set(sim.loads) or sim.replicates < 1:
        return None
    wps = main_campaign.windows_per_source
    if wps is not None and wps < T.windows_per_source:
        return None
    if main is None:
        return None
    return main.filter((pl.col("replicate") == 0) & pl.col("region").is_in(list(T.regions))
                       & pl.col("window_id").is_in([r.id for r in refs]))


def run_transfer(cfg: Config, *, progress: bool = True, verbose: bool = True) -> pl.DataFrame:
    """Run (or resume) the transfer campaign (module docstring); returns its runs with a column
    ``predictor`` (the source whose predictor the run used; the target itself for home runs).

    The home part's runs of the policies the main campaign already ran are taken from it (replicate 0 of
    the same windows and regions: the same seeds and frozen predictions give the same runs) and only the
    oracle variants are simulated; one window per source of those policies is simulated again as a check
    (:func:`home_matches_main`). Without the main campaign's runs the whole home part is simulated."""
    manifest = windows_mod.load_manifest(cfg.paths)
    T = cfg.predictors.transfer
    srcs = PR.sources_of(manifest)
    home_campaign = dataclasses.replace(cfg.campaign, windows_per_source=int(T.windows_per_source),
                                        request_records=None)     # _sub_config's
    refs = campaign.window_refs(manifest, cfg.source_names(), home_campaign)
    try:
        main_plan = campaign.make_plan(cfg.plan_settings, manifest=manifest)
    except PortbenchError:
        main_plan = None
    main_home = _main_home_runs(T, cfg.simulation, cfg.campaign, main_runs(cfg.paths, main_plan), refs)
    base = transfer_dir(cfg.paths.results_dir)
    if main_home is not None and main_home.height:
        have = set(main_home["scheduler"].unique().to_list())
        simulate = [s for s in _home_schedulers() if s not in have]
        check = _sub_config(cfg, "home-check", sorted(have), windows=1)
        campaign.reuse_capacities(cfg, check)
        campaign.run(check, progress=progress, verbose=verbose)
        base.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(main_home, base / MAIN_RUNS_FILE, {"kind": "transfer-home-from-main"})
    else:
        simulate = _home_schedulers()
        (base / MAIN_RUNS_FILE).unlink(missing_ok=True)
    home_cfg = _sub_config(cfg, "home", simulate)
    campaign.reuse_capacities(cfg, home_cfg)        # the main campaign's measured capacities (same windows)
    campaign.run(home_cfg, progress=progress, verbose=verbose)
    tables = windows_mod.load_windows(cfg.data, per_source=int(T.windows_per_source), manifest=manifest)
    for p in srcs:
        sub = _sub_config(cfg, f"from-{p}", list(T.schedulers))
        given = {r.id: tables[r.id] for r in refs if r.source != p}
        if not given:
            continue
        run = campaign.run_tables(sub.data, sub.predictors, sub.simulation, given, list(T.schedulers),
                                  manifest=manifest, train=p, workers=sub.campaign.workers)
        campaign.reuse_capacities(cfg, sub)
        campaign.run(sub, windows=[(r, run[r.id]) for r in refs if r.id in run], progress=progress,
                     verbose=verbose)
    return load_transfer(cfg.paths.results_dir)


def load_transfer(results_dir: Path) -> pl.DataFrame | None:
    """The transfer campaign's runs (home + every foreign predictor) under ``results_dir``, or None when it has
    not run."""
    base = transfer_dir(results_dir)
    parts = []
    home = base / "home" / "runs.parquet"
    if not home.is_file():
        return None
    h = pl.read_parquet(home)
    if (base / MAIN_RUNS_FILE).is_file():        # the main campaign's policies, taken from it
        h = pl.concat([pl.read_parquet(base / MAIN_RUNS_FILE).select(h.columns), h]).sort(campaign.SORT_COLUMNS)
    parts.append(h.with_columns(pl.col("source").alias("predictor")))
    for f in sorted(base.glob("from-*/runs.parquet")):
        p = f.parent.name.removeprefix("from-")
        parts.append(pl.read_parquet(f).with_columns(pl.lit(p).alias("predictor")))
    return pl.concat(parts, how="diagonal_relaxed")


def _rank(values: np.ndarray, direction: str, tolerance: float) -> np.ndarray:
    """Ranks (1 = best) of means, practically tied as in the analysis (``analysis.rank_tolerance``,
    :func:`portbench.study.stats.tolerant_ranks`); a NaN mean is left out (NaN rank)."""
    r = np.full(values.shape, np.nan)
    ok = np.isfinite(values)
    if ok.any():
        r[ok] = stats.tolerant_ranks(stats.ORIENTATION[direction] * values[ok], tolerance)
    return r


def ranked_count(ranks: pl.DataFrame) -> str:
    """How many schedulers the rankings of ``ranks`` (:func:`variant_ranks`) order: ``"13"``, or
    ``"12–13"`` where some conditions rank fewer (a policy n/a there)."""
    lo, hi = int(ranks["n_ranked"].min()), int(ranks["n_ranked"].max())
    return f"{hi}" if lo == hi else f"{lo}–{hi}"


def variant_ranks(runs: pl.DataFrame, metrics: Sequence[str], schedulers: Sequence[str] | None = None,
                  tolerance: float = 0.0) -> pl.DataFrame:
    """One row per (source, region, metric, policy, variant): the policy's mean over the windows with
    that predictor and its rank among the 13 when it takes the policy's place (module docstring).
    ``variant`` is ``home``, ``from <source>`` or ``oracle`` (the comparison variant); ``tolerance`` =
    ``analysis.rank_tolerance`` (means within it are tied, as in every ranking of the analysis)."""
    policies = [p for p in (schedulers or list(ORACLE_VARIANT)) if p in ORACLE_VARIANT]
    the13 = scheduler_registry.names("all")
    rows = []
    for (src, region), part in runs.group_by(["source", "region"], maintain_order=True):
        home = part.filter((pl.col("predictor") == src) & pl.col("scheduler").is_in(the13))
        wins = sorted(home["window_id"].unique().to_list())
        for m in metrics:
            if m not in part.columns:
                continue
            d = metric_registry.direction(m)
            means = {k: float(np.nanmean(g[m].to_numpy().astype(float))) if g.height else np.nan
                     for (k,), g in home.group_by(["scheduler"])}
            for pol in policies:
                variants = [("home", pol, src)]
                for pred in sorted(part.filter((pl.col("scheduler") == pol) & (pl.col("predictor") != src))
                                   ["predictor"].unique().to_list()):
                    variants.append((f"from {pred}", pol, pred))
                variants.append(("oracle", ORACLE_VARIANT[pol], src))
                for vname, sched, pred in variants:
                    g = part.filter((pl.col("scheduler") == sched) & (pl.col("predictor") == pred)
                                    & pl.col("window_id").is_in(wins))
                    if g.height == 0:
                        continue
                    with np.errstate(all="ignore"):
                        mine = float(np.nanmean(g[m].to_numpy().astype(float))) if g.height else np.nan
                    order = [k for k in the13 if k in means]
                    vals = np.array([mine if k == pol else means[k] for k in order])
                    r = _rank(vals, d, tolerance)
                    rows.append({"source": src, "region": region, "metric": m, "policy": pol, "variant": vname,
                                 "scheduler": sched, "predictor": pred, "mean": mine,
                                 "rank": float(r[order.index(pol)]) if pol in order else np.nan,
                                 "n_ranked": int(np.isfinite(vals).sum()), "n_windows": int(g.height)})
    schema = {"source": pl.String, "region": pl.String, "metric": pl.String, "policy": pl.String,
              "variant": pl.String, "scheduler": pl.String, "predictor": pl.String, "mean": pl.Float64,
              "rank": pl.Float64, "n_ranked": pl.Int64, "n_windows": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def main_runs(paths: PathsConfig, plan: campaign.Plan | None) -> pl.DataFrame | None:
    """The main campaign's runs (:func:`portbench.study.campaign.load_runs`: under ``paths.results_dir``, of
    ``plan``), or None when it has not run (or has no plan)."""
    if plan is None:
        return None
    try:
        return campaign.load_runs(paths, plan)
    except PortbenchError:
        return None


def home_matches_main(main: pl.DataFrame | None, transfer: pl.DataFrame, results_dir: Path,
                      sim: SimulationConfig) -> bool | None:
    """Whether the transfer campaign's home runs (``transfer``, its folder under ``results_dir``) equal the main
    campaign's replicate-0 runs (``main``, :func:`main_runs`) of the same windows, regions and policies (same
    seeds, same frozen predictions); None without main runs. When the home runs were taken from the main
    campaign, the check compares the runs simulated again for it (one window per source, every policy of the
    main campaign). The metrics compared: every metric of ``sim.slo``."""
    if main is None:
        return None
    keys = ["window_id", "region", "scheduler"]
    base = transfer_dir(results_dir)
    check = base / "home-check" / "runs.parquet"
    home = (pl.read_parquet(check) if (base / MAIN_RUNS_FILE).is_file() and check.is_file()
            else transfer.filter(pl.col("predictor") == pl.col("source")))
    both = home.join(main.filter(pl.col("replicate") == 0), on=keys, suffix="_main")
    if both.height == 0:
        return None
    cols = [m for m in metric_registry.metric_names(sim.slo) if m in both.columns
            and f"{m}_main" in both.columns]
    for m in cols:
        a, b = both[m].to_numpy().astype(float), both[f"{m}_main"].to_numpy().astype(float)
        if not np.allclose(a, b, equal_nan=True, rtol=1e-9, atol=1e-12):
            return False
    return True


# --------------------------------------------------------------------------- summary blocks


def _num(x):
    if x is None:
        return None
    x = float(x)
    return None if not np.isfinite(x) else float(f"{x:.6g}")


def _accuracy_key(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, manifest: Mapping) -> str:
    """What :func:`_accuracy_part` depends on: every pair's predictions fingerprint (the ``predictors`` section, the
    manifest's checksum, the stand-ins' seed, the canonical version, the predictors module's code and the libraries),
    the accuracy's bootstrap and the noisy oracle's sigma, and this module's code."""
    fps = [PR.fingerprint_key(PR.fingerprint(P, data.standins, manifest, a, b)) for a, b in PR.all_pairs(manifest)]
    return io.sha256_hex({"pairs": fps, "bootstrap": int(P.bootstrap), "seed": P.seed,
                          "sigma": float(sim.predictor_sigma), "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()})[:16]


def _accuracy_part(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, *, manifest: Mapping,
                   workers: int, summary: pl.DataFrame | None = None) -> dict:
    """The part of :func:`predictors_block` that depends on the frozen predictions only: per source its home
    accuracy, training and checks (``sources``) and every foreign pair's accuracy (``pairs``, ``"a->b"``). Kept beside
    the predictions (``accuracy__<key>.json``, key :func:`_accuracy_key`): notebook 02 computes it, the analysis
    (notebook 04) reads it instead of re-training the past-only check and re-reading every training set (~16 s).
    ``summary``: :func:`accuracy`'s summary table when the caller has it (notebook 02)."""
    path = PR.predictions_dir(data.paths) / f"accuracy__{_accuracy_key(data, P, sim, manifest)}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError:      # a torn or foreign file: computed again and replaced
            pass
    frozen = PR.load_predictions(data, P, PR.all_pairs(manifest), manifest=manifest, workers=workers)
    summ = accuracy(data, P, sim, manifest=manifest, workers=workers)[1] if summary is None else summary
    stats_ = ("tau", "spearman", "mae_log", "ranker_tau", "ranker_spearman", "noisy_oracle_tau")

    def acc_of(row) -> dict:
        d = {}
        for s in stats_:
            if row.get(s) is None:
                continue
            d[s] = _num(row[s])
            d[f"{s}_ci"] = [_num(row[f"{s}_ci_low"]), _num(row[f"{s}_ci_high"])]
        d["windows"] = int(row["windows"])
        return d

    rows = {(r["train"], r["target"]): r for r in summ.iter_rows(named=True)}
    sources = {}
    for s in PR.sources_of(manifest):
        info = frozen[(s, s)].info
        sources[s] = {"label": info.get("train_label"), **acc_of(rows[(s, s)]), "train_rows": int(info["train_rows"]),
                      "features": list(info["features"]), "feature_notes": info.get("notes", {}),
                      "training": info.get("training", {}), "models": info.get("models"),
                      "regressor": info.get("regressor"), "ranker": info.get("ranker"), "key": info.get("key"),
                      "repeats": PR.repeat_share(data, P, s, manifest=manifest),
                      "past_only": PR.past_only_check(data, P, s, manifest=manifest, workers=workers)}
    pairs = {f"{a}->{b}": {"train": a, "target": b, **acc_of(row), "features": list(frozen[(a, b)].info["features"])}
             for (a, b), row in rows.items() if a != b}
    text = json.dumps(io.plain({"sources": sources, "pairs": pairs}))
    io.write_text(path, text)
    return json.loads(text)          # the same values whether computed or read


def predictors_block(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, analysis: AnalysisConfig, *,
                     manifest: Mapping, main: pl.DataFrame | None = None, workers: int = 1,
                     accuracy_summary: pl.DataFrame | None = None) -> dict:
    """``summary.json["predictors"]``: per source its home predictor's accuracy (tau, spearman, mae_log
    with CIs, the ranker's tau, the noisy oracle's tau for reference), train rows and features; under
    ``transfer`` every ordered source pair's accuracy and, when the transfer campaign has run (under
    ``data.paths.results_dir``), the mean rank of sjf_predicted / ltr / edf with that predictor (``analysis``:
    headline metrics, rank tolerance; ``main``: the main campaign's runs, :func:`main_runs`, for the check that the
    transfer campaign's home runs equal them). The accuracy part is computed once per set of frozen predictions
    (:func:`_accuracy_part`; ``accuracy_summary``: :func:`accuracy`'s summary of the same predictions, when the caller
    has computed it)."""
    part = _accuracy_part(data, P, sim, manifest=manifest, workers=workers, summary=accuracy_summary)
    out: dict = {"definition": (
        "per window: Kendall tau-b and Spearman rho between the frozen predicted output length and the true "
        "one, MAE of natural-log lengths; ranker_* = the LambdaRank score (ltr). Mean over the target's frozen "
        "windows, 95% percentile bootstrap CI over windows. noisy_oracle_tau = the study's former predictor "
        "(true length x exp(N(0, simulation.predictor_sigma))) for comparison. Predictors are trained only "
        "on requests outside every frozen window (data.predictors)."),
        "bootstrap": int(P.bootstrap),
        "checks": ("repeats = share of window requests whose exact (prompt, output) pair / prompt length occurs among "
                   "the training requests of the model predicting them (templated traffic, not a leak: no window row "
                   "is a training row); past_only = a real source's predictor trained only on rows before the second "
                   "half of its windows, tau on that half, beside the home predictor's tau there")}
    out.update(part["sources"])
    transfer = load_transfer(data.paths.results_dir)
    ranks = None
    if transfer is not None:
        ranks = variant_ranks(transfer, list(analysis.headline_metrics), tolerance=analysis.rank_tolerance)
    tr_block: dict = {}
    for name, acc in part["pairs"].items():
        a, b = acc["train"], acc["target"]
        d = dict(acc)
        if ranks is not None:
            d["mean_rank"] = {}
            for pol in ORACLE_VARIANT:
                f = ranks.filter((pl.col("source") == b) & (pl.col("policy") == pol))
                foreign = f.filter(pl.col("variant") == f"from {a}")["rank"]
                own = f.filter(pl.col("variant") == "home")["rank"]
                if foreign.len():
                    d["mean_rank"][pol] = {"foreign": _num(foreign.mean()), "home": _num(own.mean())}
        tr_block[name] = d
    out["transfer"] = tr_block
    if ranks is not None:
        T = P.transfer
        out["transfer"]["campaign"] = {
            "windows_per_source": int(T.windows_per_source), "regions": list(T.regions),
            "schedulers": list(T.schedulers), "replicates": 1, "n_runs": int(transfer.height),
            "metrics_ranked": list(analysis.headline_metrics),
            "rank_definition": "rank (1 = best of 13; means within analysis.rank_tolerance tied) of the policy's mean "
                               "over the subset's windows when the variant takes its place among the 13 (home "
                               "predictor runs); mean over regions x metrics",
            "home_runs_equal_main_campaign": home_matches_main(main, transfer, data.paths.results_dir, sim)}
        out["vs_noisy_oracle"] = {}
        for pol, orc in ORACLE_VARIANT.items():
            f = ranks.filter(pl.col("policy") == pol)
            out["vs_noisy_oracle"][pol] = {
                src: {"learned": _num(g.filter(pl.col("variant") == "home")["rank"].mean()),
                      orc: _num(g.filter(pl.col("variant") == "oracle")["rank"].mean())}
                for (src,), g in f.group_by(["source"], maintain_order=True)}
    return out


def tenant_table(manifest: Mapping, tenant_model: str) -> pl.DataFrame:
    """Per source of ``manifest``: where its tenants come from and how the tenant-based results are to be read
    (``tenant_model``: ``simulation.tenant_model``)."""
    rows = []
    for s in PR.sources_of(manifest):
        rec = (manifest["sources"][s].get("tenants") or {})
        lab = windows_mod.tenant_label(manifest, s, tenant_model)
        if lab == "trace":
            origin = ("tenant field(s) " + "/".join(rec.get("fields", [])) if rec.get("rule") == "fields"
                      else f"the stand-in generator's tenants ({rec.get('generator_rule', '')})")
            reading = "reported"
        elif lab == "none":
            origin = reading = NA_TENANTS
        else:
            origin, reading = lab, "reported, labelled synthetic"
        rows.append({"source": s, "label": label(s, manifest["sources"][s]["provenance"]), "tenants": lab,
                     "origin": origin, "tenant_metrics": reading})
    return pl.DataFrame(rows)


def fairness_block(sim: SimulationConfig, runs: pl.DataFrame | None, manifest: Mapping) -> dict:
    """``summary.json["fairness"]``: the metric definitions, where each source's tenants come from, and per
    source x region the mean tenant_service_gap / tenant_jain of vtc and fcfs in the campaign's ``runs`` (None:
    not run; n/a without tenants)."""
    out: dict = {"definitions": {m: metric_registry.metric(m).description
                                 for m in ("tenant_service_gap", "tenant_jain", "slowdown_jain")},
                 "weights": {"prompt": metric_registry.TENANT_WEIGHTS[0],
                             "output": metric_registry.TENANT_WEIGHTS[1]},
                 "tenant_model": sim.tenant_model, "sources": {}}
    for row in tenant_table(manifest, sim.tenant_model).iter_rows(named=True):
        s = row["source"]
        d: dict = {"tenants": row["tenants"], "origin": row["origin"]}
        if row["tenants"] == "none":
            d["vtc"] = NA_TENANTS
        elif runs is not None and "tenant_service_gap" in runs.columns:
            present = set(runs["scheduler"].unique().to_list())
            if "vtc" not in present:
                d["vtc"] = "vtc is not among this campaign's schedulers"
            part = runs.filter((pl.col("source") == s) & pl.col("scheduler").is_in(["vtc", "fcfs"]))
            by: dict = {}
            for (reg, sch), g in part.group_by(["region", "scheduler"], maintain_order=True):
                by.setdefault(reg, {})[sch] = {"tenant_service_gap": _num(g["tenant_service_gap"].mean()),
                                               "tenant_jain": _num(g["tenant_jain"].mean()),
                                               "runs": int(g.height)}
            d["by_region"] = by
        out["sources"][s] = d
    return out


def add_to_summary(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, analysis: AnalysisConfig,
                   summary: dict, *, manifest: Mapping | None, main: pl.DataFrame | None,
                   manifest_error: str = "no window manifest", workers: int = 1) -> dict:
    """``summary`` with the ``predictors`` (:func:`predictors_block`) and ``fairness`` (:func:`fairness_block`)
    blocks added (a failure to build them is recorded in the block rather than losing the rest of the summary).
    ``manifest``: the stage's manifest, None when it could not be loaded (``manifest_error`` says why);
    ``main``: the main campaign's runs (:func:`main_runs`)."""
    if manifest is None:
        for key in ("predictors", "fairness"):
            summary[key] = {"error": manifest_error}
        return summary
    blocks = (("predictors", lambda: predictors_block(data, P, sim, analysis, manifest=manifest, main=main,
                                                      workers=workers)),
              ("fairness", lambda: fairness_block(sim, main, manifest)))
    for key, fn in blocks:
        try:
            summary[key] = fn()
        except (PortbenchError, OSError) as e:
            summary[key] = {"error": f"{type(e).__name__}: {e}"}
    return summary


__all__ = ["ORACLE_VARIANT", "NA_TENANTS", "accuracy", "add_to_summary", "fairness_block", "home_matches_main",
           "load_transfer", "main_runs", "predictors_block", "run_transfer", "tenant_table", "transfer_dir", "variant_ranks"]
