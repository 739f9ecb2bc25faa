"""The stand-ins beside their real evidence: estimates and comparison tables for notebook 02."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .. import registry, synth, traces
from .bailian import (ServeGenData, load_servegen, read_qwen_rows, servegen_client_table, servegen_estimates,
                      servegen_folder, servegen_length_mixture)
from .build import build_windows
from .burstgpt import (_full_file_row, _reweighted_pool_sample, _rollup_desc, burstgpt_arrival_estimates,
                       burstgpt_evidence, log_type_shares, real_burstgpt_windows, window_normalised_gaps)
from .common import _CACHE, PERCENTILES, StandinInputs


def standin_windows(inp: StandinInputs, source: str) -> list[tuple[dict, pl.DataFrame]]:
    key = ("windows", source, inp)
    if key not in _CACHE:
        _CACHE[key] = build_windows(inp, source, inp.per_source, inp.window_size)
    return _CACHE[key]


def _pooled(windows: Sequence[tuple[dict, pl.DataFrame]]) -> pl.DataFrame:
    return pl.concat([df for _, df in windows])


def _norm_gaps(arrival_s: np.ndarray) -> np.ndarray:
    g = np.diff(np.asarray(arrival_s, dtype=np.float64))
    return g / g.mean() if g.size and g.mean() > 0 else g


def _percentile_row(values: np.ndarray, **cols: Any) -> dict[str, Any]:
    v = np.asarray(values, dtype=np.float64)
    row = {**cols, "n": int(v.size), "mean": float(v.mean())}
    row.update({f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES})
    return row


def _ks_lower_bound(sample: np.ndarray, quantiles: Mapping[int, float]) -> float:
    """max_p |F_sample(x_p) - p/100|: a lower bound on the KS distance to a distribution known only
    through its percentiles ``{p: x_p}`` (approximate: quantile conventions differ)."""
    s = np.sort(np.asarray(sample, dtype=np.float64))
    return float(max(abs(np.searchsorted(s, x, side="right") / s.size - p / 100) for p, x in quantiles.items()))


def _ks_row(a: np.ndarray, b: np.ndarray, **cols: Any) -> dict[str, Any]:
    from scipy.stats import ks_2samp   # scipy.stats only here: a campaign imports this package, never calls it

    res = ks_2samp(a, b)
    return {**cols, "ks": float(res.statistic), "p_value": float(res.pvalue), "n_standin": int(len(a)),
            "n_real": int(len(b))}


def _window_stat_rows(windows: Sequence[tuple[str, pl.DataFrame]], provenance: str, evidence: str) -> list[dict]:
    rows = []
    for name, df in windows:
        rate, cv = synth.sample_rate_cv(df["arrival_s"].to_numpy())
        rows.append({"provenance": provenance, "evidence": evidence, "window": name, "n": df.height,
                     "duration_s": float(df["arrival_s"][-1]), "rate_rps": rate, "interarrival_cv": cv,
                     "prompt_mean": float(df["prompt_tokens"].mean()),
                     "output_mean": float(df["output_tokens"].mean()),
                     "tenants": int(df["tenant"].n_unique())})
    return rows


def _mixture_row(values: np.ndarray, probs: np.ndarray, **cols: Any) -> dict[str, Any]:
    cdf = np.cumsum(probs)
    row = {**cols, "n": None, "mean": float(np.dot(values, probs))}
    row.update({f"p{q}": float(values[min(int(np.searchsorted(cdf, q / 100)), values.size - 1)]) for q in PERCENTILES})
    return row


def _ks_to_discrete(sample: np.ndarray, values: np.ndarray, probs: np.ndarray) -> float:
    """KS distance between a sample's ECDF and a discrete distribution (evaluated on both supports)."""
    s = np.sort(np.asarray(sample, dtype=np.float64))
    grid = np.union1d(values, s)
    f_mix = np.concatenate([[0.0], np.cumsum(probs)])[np.searchsorted(values, grid, side="right")]
    f_s = np.searchsorted(s, grid, side="right") / s.size
    return float(np.max(np.abs(f_mix - f_s)))


def estimates(inp: StandinInputs) -> dict[str, Any]:
    """Numbers for notebook 02's text: BurstGPT rate/CV with CIs and choices; ServeGen counts and
    the stand-in windows' activity."""
    bg = dict(burstgpt_arrival_estimates(inp))
    ev = burstgpt_evidence(inp)
    bg["slices"] = {rel: c for rel, c in ev.counts.items()}
    bg["pairs"] = ev.pool.height
    bg["log_type_shares"] = log_type_shares(inp)
    bg["reweight_log_types"] = inp.standins.burstgpt.reweight_log_types
    sg = servegen_estimates(inp)
    wins = standin_windows(inp, "bailian")
    data = load_servegen(servegen_folder(inp))
    used_pmfs = {(int(c), int(b)) for m, df in wins for c, b in
                 _pmfs_of(data, df, m["t_start"])}
    dropped = [data.pmf(c, b, "output_tokens").dropped_mass for c, b in used_pmfs] + \
              [data.pmf(c, b, "input_tokens").dropped_mass for c, b in used_pmfs]
    sg["standin_windows"] = [{"id_index": k, "t_start_s": m["t_start"], "day": m["t_start"] / 86400.0,
                              "active_clients_at_start": m["active_clients_at_start"], "tenants": m["tenants"],
                              "segments_600s": m["segments_600s"], "duration_s": float(df["arrival_s"][-1])}
                             for k, (m, df) in enumerate(wins)]
    sg["standin_active_at_start"] = {"min": min(w["active_clients_at_start"] for w in sg["standin_windows"]),
                                     "max": max(w["active_clients_at_start"] for w in sg["standin_windows"])}
    sg["pmfs_used"] = len(used_pmfs)
    sg["pmfs_used_with_zero_token_bins"] = int(sum(d > 0 for d in dropped))
    sg["zero_token_mass_dropped_max"] = float(max(dropped)) if dropped else 0.0
    return {"burstgpt": bg, "servegen": sg}


def _pmfs_of(data: ServeGenData, df: pl.DataFrame, t_first: float) -> list[tuple[int, int]]:
    clients = [int(t.split("-", 1)[1]) for t in df["tenant"].to_list()]
    times = t_first + df["arrival_s"].to_numpy()
    return sorted({(c, data.bucket_for(c, float(x))) for c, x in zip(clients, times)})


def evidence_tables(inp: StandinInputs) -> dict[str, pl.DataFrame]:
    """Real evidence beside the stand-ins (tables with a ``provenance`` column where they compare).

    ``burstgpt_arrivals`` (rate/CV estimates and the full-file rates), ``burstgpt_lengths``
    (percentiles: slices, first-60k aggregate, stand-in, reweighted stand-in), ``burstgpt_ks``,
    ``burstgpt_mix`` (model and log-type shares), ``burstgpt_windows`` (per-window stats, real slice
    windows and stand-in windows), ``bailian_lengths``, ``bailian_ks``, ``bailian_windows``,
    ``servegen_clients``.
    """
    key = ("tables", inp)
    if key not in _CACHE:
        _CACHE[key] = _evidence_tables(inp)
    return dict(_CACHE[key])


def _evidence_tables(inp: StandinInputs) -> dict[str, pl.DataFrame]:
    ev = burstgpt_evidence(inp)
    fit = burstgpt_arrival_estimates(inp)
    std_label = inp.label("burstgpt")
    bg_windows = standin_windows(inp, "burstgpt")
    bg = _pooled(bg_windows)
    slices_desc = " + ".join(Path(s).name for s in ev.slices)
    t: dict[str, pl.DataFrame] = {}

    arr_rows = [{"provenance": "real", "evidence": f"{slices_desc}: {ev_desc}", "quantity": q,
                 "estimate": fit[k], "ci_low": fit[f"{k2}_ci"][0], "ci_high": fit[f"{k2}_ci"][1],
                 "ci_iid_low": fit[f"{k2}_ci_iid"][0], "ci_iid_high": fit[f"{k2}_ci_iid"][1], "n": fit["n_gaps"]}
                for q, k, k2, ev_desc in (
                    ("rate_rps", "rate_rps", "rate", "pooled within-slice gaps"),
                    ("interarrival_cv", "cv_pooled", "cv_pooled", "CV of raw pooled within-slice gaps"),
                    ("interarrival_cv", "cv_window", "cv_window",
                     f"CV of gaps over their {fit['cv_window_span_gaps']}-gap moving mean (window scale)"))]
    rw = fit["real_window_cv"]
    if rw["windows"]:
        arr_rows.append({"provenance": "real", "evidence": f"{slices_desc}: median CV of {rw['windows']} overlapping "
                         f"{rw['size']}-request windows (range in the CI columns)", "quantity": "interarrival_cv",
                         "estimate": rw["median"], "ci_low": rw["min"], "ci_high": rw["max"], "ci_iid_low": None,
                         "ci_iid_high": None, "n": rw["windows"]})
    for fid, rph in fit["full_file_rates_rph"].items():
        arr_rows.append({"provenance": "real", "evidence": f"{fid} full file (guanxi aggregate)",
                         "quantity": "rate_rps", "estimate": rph / 3600.0, "ci_low": None, "ci_high": None,
                         "ci_iid_low": None, "ci_iid_high": None,
                         "n": int(_full_file_row(ev, fid)["rows"])})
    for q, k in (("rate_rps", "rate_rps_used"), ("interarrival_cv", "cv_used")):
        arr_rows.append({"provenance": "standin", "evidence": f"{std_label} generator parameter", "quantity": q,
                         "estimate": fit[k], "ci_low": None, "ci_high": None, "ci_iid_low": None,
                         "ci_iid_high": None, "n": None})
    t["burstgpt_arrivals"] = pl.DataFrame(arr_rows)

    len_rows = []
    roll = ev.rollup["numeric_distributions"] if ev.rollup else None
    roll_desc = _rollup_desc(ev)
    reweighted = _reweighted_pool_sample(inp, bg.height)
    for metric, raw_key in (("prompt_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
        len_rows.append(_percentile_row(ev.pool[metric].to_numpy(), provenance="real",
                                        evidence=f"{slices_desc}, valid rows", metric=metric))
        if roll:
            r = roll[raw_key]
            len_rows.append({"provenance": "real", "evidence": f"{roll_desc}, all log types, "
                             "failures included (fnstggl rollup)", "metric": metric, "n": int(r["count"]),
                             "mean": float(r["mean"]), **{f"p{q}": float(r[f"p{q}"]) for q in PERCENTILES}})
        len_rows.append(_percentile_row(bg[metric].to_numpy(), provenance="standin",
                                        evidence=f"{std_label}, {len(bg_windows)} windows pooled", metric=metric))
        if reweighted is not None:
            len_rows.append(_percentile_row(reweighted[metric].to_numpy(), provenance="standin",
                                            evidence=f"{std_label} variant: log types reweighted to "
                                            f"{fit['rate_file']} shares (not used)", metric=metric))
    t["burstgpt_lengths"] = pl.DataFrame(len_rows)

    real_w = real_burstgpt_windows(inp)
    ks = []
    for metric in ("prompt_tokens", "output_tokens"):
        ks.append(_ks_row(bg[metric].to_numpy(), ev.pool[metric].to_numpy(), provenance="standin",
                          compared_with="real slices, valid rows", metric=metric, kind="two-sample KS"))
    ks.append(_ks_row(np.concatenate([_norm_gaps(df["arrival_s"].to_numpy()) for _, df in bg_windows]),
                      np.concatenate([window_normalised_gaps(g, inp.window_size) for g in ev.gaps]),
                      provenance="standin", compared_with="real slices, gaps over their window-scale moving mean",
                      metric="gap / mean gap",
                      kind="two-sample KS"))
    cv_std = np.array([synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in bg_windows])
    cv_real = np.array([synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in real_w])
    ks.append(_ks_row(cv_std, cv_real, provenance="standin",
                      compared_with=f"real slices' {len(real_w)} overlapping {inp.window_size}-request windows",
                      metric="window inter-arrival CV", kind="two-sample KS (real windows overlap)"))
    if roll:
        for metric, raw_key in (("prompt_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
            pct = {p: float(roll[raw_key][f"p{p}"]) for p in PERCENTILES}
            ks.append({"provenance": "standin", "compared_with": f"{roll_desc} ({len(PERCENTILES)} percentiles)",
                       "metric": metric, "kind": "KS lower bound from percentiles",
                       "ks": _ks_lower_bound(bg[metric].to_numpy(), pct), "p_value": None,
                       "n_standin": bg.height, "n_real": int(roll[raw_key]["count"])})
    t["burstgpt_ks"] = pl.DataFrame(ks)

    mix = []
    for dim, col in (("model", "model"), ("log_type", "log_type")):
        for who, frame in (("real", ev.pool), ("standin", bg.with_columns(
                pl.col("tenant").str.split("/").list.get(0 if dim == "model" else 1).alias(col)))):
            counts = frame.group_by(col).len().sort(col)
            n = counts["len"].sum()
            for r in counts.iter_rows(named=True):
                mix.append({"provenance": who, "evidence": f"{slices_desc}, valid rows" if who == "real"
                            else std_label, "dimension": dim, "category": r[col], "count": int(r["len"]),
                            "share": r["len"] / n})
        for r in ev.full_files:
            counts = r["model_counts"] if dim == "model" else r["log_type_counts"]
            n = sum(counts.values())
            for cat, cnt in sorted(counts.items()):
                mix.append({"provenance": "real", "evidence": f"{r['file_id']} full file (guanxi aggregate)",
                            "dimension": dim, "category": cat, "count": int(cnt), "share": cnt / n})
        if ev.rollup:
            counts = ev.rollup["subgroup_counts"]["Model" if dim == "model" else "Log Type"]
            n = sum(counts.values())
            for cat, cnt in sorted(counts.items()):
                mix.append({"provenance": "real", "evidence": f"{roll_desc} (fnstggl rollup)",
                            "dimension": dim, "category": cat, "count": int(cnt), "share": cnt / n})
    t["burstgpt_mix"] = pl.DataFrame(mix)

    wrows = _window_stat_rows(real_w, "real", "BurstGPT slices (overlapping windows)")
    wrows += _window_stat_rows([(f"{k:02d}", df) for k, (_, df) in enumerate(bg_windows)], "standin", std_label)
    t["burstgpt_windows"] = pl.DataFrame(wrows)

    bl_label = inp.label("bailian")
    bl_windows = standin_windows(inp, "bailian")
    bl = _pooled(bl_windows)
    q = read_qwen_rows(inp)
    qdesc = f"Qwen traceA (to-C chat), {q.height} rows of a thinned stratified sample"
    mixture = servegen_length_mixture(inp)
    sg_desc = "ServeGen m-small used clients' PMFs over 14 days, request-weighted (aggregate evidence)"
    brows, bks = [], []
    for metric in ("prompt_tokens", "output_tokens"):
        brows.append(_percentile_row(q[metric].to_numpy(), provenance="real", evidence=qdesc, metric=metric))
        brows.append(_percentile_row(bl[metric].to_numpy(), provenance="standin",
                                     evidence=f"{bl_label} (ServeGen m-small), {len(bl_windows)} windows pooled",
                                     metric=metric))
        bks.append(_ks_row(bl[metric].to_numpy(), q[metric].to_numpy(), provenance="standin",
                           compared_with=qdesc, metric=metric, kind="two-sample KS (different services)"))
        vals, probs = mixture[metric]
        brows.append(_mixture_row(vals, probs, provenance="real", evidence=sg_desc, metric=metric))
        bks.append({"provenance": "standin", "compared_with": sg_desc, "metric": metric,
                    "kind": "KS to the request-weighted PMF mixture (its own evidence)",
                    "ks": _ks_to_discrete(bl[metric].to_numpy(), vals, probs), "p_value": None,
                    "n_standin": bl.height, "n_real": None})
    t["bailian_lengths"] = pl.DataFrame(brows)
    t["bailian_ks"] = pl.DataFrame(bks)
    brw = _window_stat_rows([(f"{k:02d}", df) for k, (_, df) in enumerate(bl_windows)], "standin", bl_label)
    for r, (m, _) in zip(brw, bl_windows):
        r.update({"t_start_s": m["t_start"], "active_clients_at_start": m["active_clients_at_start"]})
    t["bailian_windows"] = pl.DataFrame(brw)
    t["servegen_clients"] = servegen_client_table(inp)
    return t


def real_slices(inp: StandinInputs, source: str) -> dict[str, pl.DataFrame]:
    """The small real slices of a stand-in source held in the mirror (``standins.<source>`` names them),
    read through :func:`portbench.data.traces.read_slice` (the format :data:`portbench.data.registry.SLICES`
    gives): ``{file name: canonical rows}``."""
    spec = inp.standins.of(source)
    if spec is None:
        return {}
    values = [getattr(spec, f.name) for f in dataclasses.fields(spec)]
    names = [v for vals in values for v in (vals if isinstance(vals, tuple) else [vals])
             if isinstance(v, str) and v in registry.SLICES]
    mirror = inp.store.mirror
    return {Path(name).name: traces.read_slice(mirror, name)[0] for name in names
            if mirror is not None and (mirror / name).is_file()}
