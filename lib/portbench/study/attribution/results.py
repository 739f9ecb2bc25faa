"""The attribution's numbers: hybrid rankings vs A and B, Shapley decomposition with bootstrap CIs,
interaction, reversal tracing; tables, the ``attribution`` section of ``summary.json``, files."""

from __future__ import annotations

import json
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ...core import io as fileio
from ...core.config import Config
from ...core.errors import DataError
from ...core.provenance import label
from .. import stats
from ..analysis.common import _num, _stat
from ..analysis.sections import write_section
from . import rankings
from .design import Design
from .runs import UTILISATION_DEFINITION, AttributionRuns, attribution_dir
from .game import interaction, shapley, singles, smallest_sets

SECTION = "attribution"
TABLES = ("hybrid_agreement", "shapley", "conditions", "rankings", "tracing", "hybrids", "load")
DEFINITION = ("counterfactual attribution of the disagreement between two sources' scheduler rankings: hybrids of "
              "A's windows take one or more properties of B's; the distance between A's ranking and each hybrid's "
              "is split over the properties by Shapley values (the average effect of swapping a property over every "
              "order of swapping them)")


@dataclass
class Attribution:
    """The attribution's tables (polars) and its ``summary.json`` section."""

    tables: dict
    summary: dict

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.tables[name]


def _rng(seed: int, pair: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(pair.encode()), 17])


def _ci(boot, axis=-1):
    if boot is None:
        return np.nan, np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return stats.percentile_ci(boot, axis=axis)


def _share(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _pair_compute(cfg: Config, design: Design, runs: pl.DataFrame, pair: str) -> dict:
    """Every array of one pair: ranks, comparisons with A and B, distances, Shapley values, bootstrap."""
    cube = rankings.hybrid_cube(runs, cfg, design.metrics)
    masks = design.masks
    names = [f"h{m}" for m in masks]
    missing = [n for n in names if n not in cube.sources]
    if missing:
        raise ValueError(f"attribution {pair}: subsets {missing} have no runs")
    W = len(cube.windows[names[0]])
    B = design.bootstrap
    idx = stats.bootstrap_indices(W, B, _rng(design.seed, pair)) if B > 0 else None
    pts, bts = rankings.ranks(cube, cfg, idx)
    P = np.stack([pts[n] for n in names])                                   # (H, R, M, K)
    vs_a, vs_b = rankings.compare(P, P[0]), rankings.compare(P, P[-1])
    v = rankings.distance(vs_a, design.distance)                            # (H, R, M)
    out = {"cube": cube, "names": names, "P": P, "vs_a": vs_a, "vs_b": vs_b, "v": v, "phi": shapley(v),
           "singles": singles(v), "interaction": interaction(v), "W": W, "B": B}
    if idx is not None:
        Bt = np.stack([np.moveaxis(bts[n], -1, -2) for n in names])        # (H, R, M, B, K)
        vs_a_b, vs_b_b = rankings.compare(Bt, Bt[0]), rankings.compare(Bt, Bt[-1])
        vb = rankings.distance(vs_a_b, design.distance)                     # (H, R, M, B)
        out.update(vs_a_b=vs_a_b, vs_b_b=vs_b_b, vb=vb, phi_b=shapley(vb), singles_b=singles(vb),
                   interaction_b=interaction(vb))
    return out


def _condition_tables(design: Design, pair: str, meta: dict, c: dict) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    cube = c["cube"]
    R, M = cube.regions, cube.metrics
    has_b = "vb" in c
    rows_h, rows_s, rows_c = [], [], []
    for h, mask in enumerate(design.masks):
        for r, reg in enumerate(R):
            for m, met in enumerate(M):
                row = {**meta, "mask": mask, "hybrid": design.code(mask), "swap": ",".join(design.swap(mask)),
                       "region": reg, "metric": met}
                for side, key in (("a", "vs_a"), ("b", "vs_b")):
                    cm = c[key]
                    row.update({f"tau_vs_{side}": cm["tau"][h, r, m], f"tau_norm_vs_{side}": cm["tau_norm"][h, r, m],
                                f"discordance_vs_{side}": cm["discordance"][h, r, m],
                                f"top1_kept_vs_{side}": cm["top1_kept"][h, r, m],
                                f"distance_vs_{side}": rankings.distance(cm, design.distance)[h, r, m]})
                    if has_b:
                        lo, hi = _ci(rankings.distance(c[f"{key}_b"], design.distance)[h, r, m])
                        row[f"distance_vs_{side}_ci_low"], row[f"distance_vs_{side}_ci_high"] = lo, hi
                    else:
                        row[f"distance_vs_{side}_ci_low"] = row[f"distance_vs_{side}_ci_high"] = np.nan
                rows_h.append(row)
    total = c["v"][-1]
    total_b = c["vb"][-1] if has_b else None
    for r, reg in enumerate(R):
        for m, met in enumerate(M):
            tl, th = _ci(total_b[r, m]) if has_b else (np.nan, np.nan)
            il, ih = _ci(c["interaction_b"][r, m]) if has_b else (np.nan, np.nan)
            rows_c.append({**meta, "region": reg, "metric": met, "disagreement": total[r, m], "disagreement_ci_low": tl,
                           "disagreement_ci_high": th, "sum_of_singles": c["singles"][:, r, m].sum(),
                           "interaction": c["interaction"][r, m], "interaction_ci_low": il, "interaction_ci_high": ih,
                           "interact": bool(has_b and (il > 0 or ih < 0))})
            for i, player in enumerate(design.player_names):
                share = _share(c["phi"][i, r, m], total[r, m])
                if has_b:
                    pl_, ph = _ci(c["phi_b"][i, r, m])
                    sl, sh = _ci(_share(c["phi_b"][i, r, m], total_b[r, m]))
                    gl, gh = _ci(c["singles_b"][i, r, m])
                else:
                    pl_ = ph = sl = sh = gl = gh = np.nan
                rows_s.append({**meta, "region": reg, "metric": met, "player": player, "phi": c["phi"][i, r, m],
                               "phi_ci_low": pl_, "phi_ci_high": ph, "share": float(share), "share_ci_low": sl,
                               "share_ci_high": sh, "single": c["singles"][i, r, m], "single_ci_low": gl,
                               "single_ci_high": gh, "disagreement": total[r, m]})
    return pl.DataFrame(rows_h), pl.DataFrame(rows_s), pl.DataFrame(rows_c)


def _rankings_table(design: Design, meta: dict, c: dict) -> pl.DataFrame:
    """Every subset's scheduler means (raw units, over the attribution windows) and ranks (1 = best)."""
    cube = c["cube"]
    frames = []
    for h, mask in enumerate(design.masks):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(cube.values[c["names"][h]], axis=-1)                  # (R, M, K)
        R, M, K = np.meshgrid(np.arange(len(cube.regions)), np.arange(len(cube.metrics)),
                              np.arange(len(cube.schedulers)), indexing="ij")
        frames.append(pl.DataFrame({
            **{k: [v] * R.size for k, v in meta.items()}, "mask": [mask] * R.size, "hybrid": [design.code(mask)] * R.size,
            "region": [cube.regions[i] for i in R.ravel()], "metric": [cube.metrics[i] for i in M.ravel()],
            "scheduler": [cube.schedulers[i] for i in K.ravel()], "mean": mean.ravel(),
            "rank": c["P"][h].ravel()}))
    return pl.concat(frames)


def representativeness(rk: pl.DataFrame, analysis_rankings: pl.DataFrame | None, a: str, b: str) -> dict:
    """How well the attribution's reduced design reproduces the study's rankings: Kendall tau-b between the
    ranking of A (and of B, the full swap) on the attribution windows and the analysis' ranking of that source
    (every window and replicate), averaged over the attribution's regions x metrics."""
    need = {"source", "region", "metric", "scheduler", "rank"}
    if analysis_rankings is None or not need <= set(analysis_rankings.columns):
        return {}
    out = {}
    full = int(rk["mask"].max())
    for side, src, mask in (("a", a, 0), ("b", b, full)):
        ours = rk.filter(pl.col("mask") == mask).select("region", "metric", "scheduler", "rank")
        theirs = analysis_rankings.filter(pl.col("source") == src).select(
            "region", "metric", "scheduler", pl.col("rank").alias("rank_study"))
        j = ours.join(theirs, on=["region", "metric", "scheduler"], how="inner")
        taus = [stats.kendall_tau(g["rank"].to_numpy(), g["rank_study"].to_numpy())
                for _, g in j.group_by(["region", "metric"], maintain_order=True)]
        taus = [t for t in taus if np.isfinite(t)]
        out[side] = _stat(float(np.mean(taus)) if taus else None,
                          f"mean Kendall tau-b between {src}'s ranking on the attribution's windows and the study's "
                          "ranking of it (every window and replicate), over the attribution's regions x metrics",
                          len(taus))
    return out


FLOAT_NOISE = 1e-9   # relative differences below this are floating-point rounding


def endpoint_check(ar: AttributionRuns, campaign_runs: pl.DataFrame | None) -> dict:
    """The two ends of every pair against the campaign's own runs (same window, region, scheduler, replicate):
    the subset that swaps nothing must equal A's runs bit for bit. The full swap is B's requests with B's
    arrival pattern scaled to A's rate before the region's rescaling (so arrival times differ from B's by
    rounding), run with A's seeds (common random numbers across the hybrids): schedulers that draw no random
    number match B's runs to rounding, the others (``schedulers_beyond_rounding``) are another replicate of B."""
    if campaign_runs is None or campaign_runs.height == 0:
        return {}
    design = ar.design
    metrics = [m for m in design.metrics if m in campaign_runs.columns]
    keys = ["window_id", "region", "scheduler", "replicate"]
    out = {}
    for a, b in design.pairs:
        pair = f"{a}|{b}"
        runs = ar.runs.filter(pl.col("pair") == pair)
        res = {}
        for side, mask, wcol in (("a", 0, "window_id"), ("b", design.full, "window_b")):
            ours = runs.filter(pl.col("mask") == mask).select([pl.col(wcol).alias("window_id")] + keys[1:] + metrics)
            j = ours.join(campaign_runs.select(keys + metrics), on=keys, how="inner", suffix="_campaign")
            if j.height == 0:
                continue
            x = j.select(metrics).to_numpy().astype(float)
            y = j.select([f"{m}_campaign" for m in metrics]).to_numpy().astype(float)
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.where(same, 0.0, np.abs(x - y) / np.maximum(np.abs(x), np.abs(y)))
            worst = np.nanmax(rel, axis=1) if rel.size else np.zeros(0)
            beyond = sorted(set(j["scheduler"].to_numpy()[worst > FLOAT_NOISE].tolist()))
            ok = worst <= FLOAT_NOISE
            res[side] = {"runs": j.height, "identical": int(same.all(axis=1).sum()),
                         "within_rounding": int(ok.sum()), "schedulers_beyond_rounding": beyond,
                         "max_relative_difference": _num(float(np.nanmax(rel))) if rel.size else None,
                         "max_relative_difference_others": _num(float(worst[ok].max())) if ok.any() else None}
        out[pair] = res
    return out


def _pooled(c: dict, design: Design) -> dict:
    """Pair-level numbers pooled over every region x metric: shares = sum of phi / sum of the disagreement
    (conditions where it is defined), mean disagreement, mean interaction; bootstrap CIs of each."""
    total = c["v"][-1]                                                      # (R, M)
    ok = np.isfinite(total)
    has_b = "vb" in c
    out = {"n_conditions": int(ok.sum())}
    den = total[ok].sum()
    out["disagreement"] = (float(total[ok].mean()) if ok.any() else np.nan,
                           _ci(np.nanmean(c["vb"][-1][ok], axis=0)) if has_b and ok.any() else (np.nan, np.nan))
    out["interaction"] = (float(c["interaction"][ok].mean()) if ok.any() else np.nan,
                          _ci(np.nanmean(c["interaction_b"][ok], axis=0)) if has_b and ok.any() else (np.nan, np.nan))
    out["sum_of_singles"] = float(c["singles"][:, ok].sum(axis=0).mean()) if ok.any() else np.nan
    out["players"] = {}
    for i, p in enumerate(design.player_names):
        phi = c["phi"][i][ok]
        share = float(phi.sum() / den) if den > 0 else np.nan
        if has_b and ok.any():
            pb = c["phi_b"][i][ok]                                          # (n, B)
            db = c["vb"][-1][ok]
            s_ci = _ci(_share(np.nansum(pb, axis=0), np.nansum(db, axis=0)))
            p_ci = _ci(np.nanmean(pb, axis=0))
            g_ci = _ci(np.nanmean(c["singles_b"][i][ok], axis=0))
        else:
            s_ci = p_ci = g_ci = (np.nan, np.nan)
        out["players"][p] = {"share": share, "share_ci": s_ci, "phi": float(phi.mean()) if ok.any() else np.nan,
                             "phi_ci": p_ci, "single": float(c["singles"][i][ok].mean()) if ok.any() else np.nan,
                             "single_ci": g_ci}
    return out


def trace_reversals(reversals: pl.DataFrame | None, design: Design, pair: str, a: str, b: str, c: dict) -> pl.DataFrame:
    """For every significant-and-practical reversal of the analysis between ``a`` and ``b`` in the
    attribution's regions and metrics: on A's attribution windows, does A's order hold, does B's hold on B,
    and which smallest sets of swapped properties reproduce B's order (sign of the mean oriented difference
    on the hybrid; every set of that size is listed), with the hybrid's relative effect and Wilcoxon p."""
    schema = {"pair": pl.String, "a": pl.String, "b": pl.String, "region": pl.String, "metric": pl.String,
              "sign_a": pl.Float64, "sign_b": pl.Float64, "holds_on_a": pl.Boolean, "holds_on_b": pl.Boolean,
              "status": pl.String, "minimal_sets": pl.String, "minimal_size": pl.Int64, "rel_effect": pl.Float64,
              "p_wilcoxon": pl.Float64}
    if reversals is None or reversals.height == 0:
        return pl.DataFrame(schema=schema)
    rv = reversals
    if "stage" in rv.columns:
        rv = rv.filter(pl.col("stage") == "significant_and_practical")
    else:
        rv = rv.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    rv = rv.filter(((pl.col("source_1") == a) & (pl.col("source_2") == b)) |
                   ((pl.col("source_1") == b) & (pl.col("source_2") == a)))
    rv = rv.unique(subset=["a", "b", "source_1", "source_2", "region", "metric"], maintain_order=True)
    cube = c["cube"]
    rows = []
    for r in rv.iter_rows(named=True):
        on_a = r["source_1"] == a
        sa = float(np.sign(r["diff_1"] if on_a else r["diff_2"]))
        sb = float(np.sign(r["diff_2"] if on_a else r["diff_1"]))
        base = {"pair": pair, "a": r["a"], "b": r["b"], "region": r["region"], "metric": r["metric"],
                "sign_a": sa, "sign_b": sb}
        if r["region"] not in cube.regions or r["metric"] not in cube.metrics:
            rows.append({**base, "holds_on_a": None, "holds_on_b": None, "status": "outside the attribution design",
                         "minimal_sets": None, "minimal_size": None, "rel_effect": None, "p_wilcoxon": None})
            continue
        ri, mi = cube.regions.index(r["region"]), cube.metrics.index(r["metric"])
        ka, kb = cube.schedulers.index(r["a"]), cube.schedulers.index(r["b"])
        d = np.stack([cube.oriented(n)[ri, mi, ka] - cube.oriented(n)[ri, mi, kb] for n in c["names"]])  # (H, W)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            md = np.nanmean(d, axis=-1)
        hit = np.sign(md) == sb
        holds_a, holds_b = bool(np.sign(md[0]) == sa), bool(hit[-1])
        if not holds_a or not holds_b:
            status = ("A's order does not hold on A's attribution windows" if not holds_a else
                      "B's order does not hold on the hybrid that swaps everything")
            rows.append({**base, "holds_on_a": holds_a, "holds_on_b": holds_b, "status": status,
                         "minimal_sets": None, "minimal_size": None, "rel_effect": None, "p_wilcoxon": None})
            continue
        sets = smallest_sets(hit)
        first = sets[0]
        test = stats.paired_wilcoxon(d[first])
        raw_a = cube.values[c["names"][first]][ri, mi, ka]
        raw_b = cube.values[c["names"][first]][ri, mi, kb]
        rel = float(stats.relative_effect(np.nanmean(raw_a), np.nanmean(raw_b)))
        rows.append({**base, "holds_on_a": True, "holds_on_b": True, "status": "traced",
                     "minimal_sets": " | ".join(design.players_of(s) for s in sets),
                     "minimal_size": int(bin(first).count("1")), "rel_effect": rel,
                     "p_wilcoxon": float(test.pvalue)})
    return pl.DataFrame(rows, schema=schema)


def _labels(a, pa, b, pb):
    return label(a, pa), label(b, pb)


def compute(cfg: Config, ar: AttributionRuns, reversals: pl.DataFrame | None = None,
            analysis_rankings: pl.DataFrame | None = None, campaign_runs: pl.DataFrame | None = None) -> Attribution:
    """Every attribution table and the summary section from the runs of :func:`~.runs.run`. Optional, from the
    study: ``reversals`` (the analysis' reversal table: tracing), ``analysis_rankings`` (its rankings table:
    how representative the reduced design is) and ``campaign_runs`` (the campaign's runs: both ends checked)."""
    design = ar.design
    hyb, shp, cond, rks, trc, pairs = [], [], [], [], [], {}
    for a, b in design.pairs:
        pair = f"{a}|{b}"
        runs = ar.runs.filter(pl.col("pair") == pair)
        pa, pb = runs["provenance_a"][0], runs["provenance_b"][0]
        la, lb = _labels(a, pa, b, pb)
        meta = {"pair": pair, "source_a": a, "provenance_a": pa, "source_b": b, "provenance_b": pb}
        c = _pair_compute(cfg, design, runs, pair)
        h, s, cd = _condition_tables(design, pair, meta, c)
        rk = _rankings_table(design, meta, c)
        rks.append(rk)
        hyb.append(h)
        shp.append(s)
        cond.append(cd)
        t = trace_reversals(reversals, design, pair, a, b, c)
        trc.append(t)
        po = _pooled(c, design)
        share_sorted = sorted(po["players"].items(), key=lambda kv: -(kv[1]["share"] if np.isfinite(kv[1]["share"])
                                                                      else -np.inf))
        inter_v, inter_ci = po["interaction"]
        dis_v, dis_ci = po["disagreement"]
        interact = bool(np.isfinite(inter_ci[0]) and (inter_ci[0] > 0 or inter_ci[1] < 0))
        hsum = {}
        for mask in design.masks:
            sel = h.filter(pl.col("mask") == mask)
            hsum[design.code(mask)] = {
                "swap": list(design.swap(mask)),
                "players": [p for i, p in enumerate(design.player_names) if mask >> i & 1],
                "tau_vs_a": _num(sel["tau_vs_a"].drop_nans().mean()), "tau_vs_b": _num(sel["tau_vs_b"].drop_nans().mean()),
                "tau_norm_vs_a": _num(sel["tau_norm_vs_a"].drop_nans().mean()),
                "discordance_vs_a": _num(sel["discordance_vs_a"].drop_nans().mean()),
                "top1_kept_vs_a": _num(sel["top1_kept_vs_a"].drop_nans().mean()),
                "distance_vs_a": _num(sel["distance_vs_a"].drop_nans().mean()),
                "distance_vs_b": _num(sel["distance_vs_b"].drop_nans().mean())}
        pairs[pair] = {
            "source_a": a, "source_b": b, "label_a": la, "label_b": lb, "provenance_a": pa, "provenance_b": pb,
            "all_real": pa == "real" and pb == "real",
            "n_windows": c["W"], "windows": [list(x) for x in ar.windows.get(pair, [])],
            "regions": c["cube"].regions, "metrics": c["cube"].metrics,
            "disagreement": _stat(dis_v, f"mean over region x metric of the ranking distance ({design.distance}) "
                                         f"between A's ranking and the hybrid that swaps every property (= B)",
                                  po["n_conditions"], dis_ci),
            "shares": {p: {"value": _num(d["share"]), "ci": [_num(d["share_ci"][0]), _num(d["share_ci"][1])],
                           "phi": _num(d["phi"]), "phi_ci": [_num(d["phi_ci"][0]), _num(d["phi_ci"][1])],
                           "single": _num(d["single"]), "single_ci": [_num(d["single_ci"][0]), _num(d["single_ci"][1])]}
                       for p, d in po["players"].items()},
            "largest_share": share_sorted[0][0] if share_sorted and np.isfinite(share_sorted[0][1]["share"]) else None,
            "interaction": _stat(inter_v, "mean over region x metric of (full swap) - (sum of the single swaps' "
                                          "distances): 0 when the properties' effects add up", po["n_conditions"],
                                 inter_ci, sum_of_singles=po["sum_of_singles"], interact=interact,
                                 relative=_num(inter_v / dis_v) if dis_v and np.isfinite(dis_v) and dis_v > 0 else None),
            "by_condition": {f"{r['region']}/{r['metric']}": {
                "disagreement": _num(r["disagreement"]),
                "disagreement_ci": [_num(r["disagreement_ci_low"]), _num(r["disagreement_ci_high"])],
                "interaction": _num(r["interaction"]), "interact": r["interact"],
                "shares": {x["player"]: {"value": _num(x["share"]), "ci": [_num(x["share_ci_low"]), _num(x["share_ci_high"])]}
                           for x in s.filter((pl.col("region") == r["region"]) & (pl.col("metric") == r["metric"]))
                           .iter_rows(named=True)}}
                for r in cd.iter_rows(named=True)},
            "hybrids": hsum,
            "representative": representativeness(rk, analysis_rankings, a, b),
            "reversals": {"significant_and_practical": t.height,
                          "traced": int((t["status"] == "traced").sum()) if t.height else 0,
                          "outside_design": int((t["status"] == "outside the attribution design").sum()) if t.height else 0},
        }
    tables = {"hybrid_agreement": pl.concat(hyb), "shapley": pl.concat(shp), "conditions": pl.concat(cond),
              "rankings": pl.concat(rks), "tracing": pl.concat(trc), "hybrids": ar.hybrids, "load": ar.load}
    summary = {
        "definition": DEFINITION,
        "design": {"pairs": [list(p) for p in design.pairs], "players": design.player_names,
                   "subsets_per_pair": 2 ** design.k, "regions": design.regions, "windows_per_source": design.windows,
                   "replicates": len(design.replicates), "schedulers": list(design.schedulers),
                   "metrics": list(design.metrics), "metrics_from": design.metrics_note, "bootstrap": design.bootstrap,
                   "seed": design.seed, "distance": design.distance, "ties": rankings.tie_rule(cfg),
                   "load": UTILISATION_DEFINITION, "runs": ar.runs.height},
        "pairs": pairs,
        "endpoints": endpoint_check(ar, campaign_runs),
        "cost": {k: _num(v) if isinstance(v, float) else v for k, v in ar.cost.items()},
    }
    return Attribution(tables=tables, summary=summary)


def write(cfg: Config, A: Attribution) -> dict[str, str]:
    """Write every table under ``{results_dir}/attribution/``, the section for ``summary.json``
    (:func:`portbench.study.analysis.sections.write_section`) and ``attribution/summary.json``."""
    out = attribution_dir(cfg.paths.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, df in A.tables.items():
        p = out / f"{name}.parquet"
        fileio.atomic_write(p, lambda tmp, df=df: df.write_parquet(tmp))
        paths[name] = str(p)
    fileio.write_json(out / "summary.json", A.summary)
    paths["section"] = str(write_section(cfg.paths.results_dir, SECTION, A.summary))
    return paths


def load(cfg: Config) -> Attribution:
    """The tables and section written by :func:`write` (DataError naming the command when absent)."""
    out = attribution_dir(cfg.paths.results_dir)
    if not (out / "summary.json").is_file():
        raise DataError(out, "no attribution results; run `portbench attribute` (notebook 10)")
    return Attribution(tables={t: pl.read_parquet(out / f"{t}.parquet") for t in TABLES
                               if (out / f"{t}.parquet").is_file()},
                       summary=json.loads(Path(out / "summary.json").read_text()))
