"""Figures of notebook 03: the cost model's calibration, capacity, load curves, preemptions.

Computed tables come from :mod:`portbench.study.campaign.tables` and :mod:`portbench.sim.profiles`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.ticker as mticker
from matplotlib.patches import Patch
import numpy as np
import polars as pl

from ..core.errors import ParameterError
from ..core.provenance import label
from ..sim import metrics
from ..sim.profiles import calibration
from ..study.campaign import tables
from ..study.honest import ranked_count
from . import figures
from .figures import figure, scheduler_order, scheduler_styles


def plot_calibration(figures_dir: str | Path, profiles: list[str] | None = None,
                     name: str = "profile_calibration") -> dict[str, str]:
    """Per profile (one column each): top, measured vs modelled token-linear time; bottom, the
    attention terms against the context (roofline): a whole prompt's prefill attention (quadratic)
    next to its GEMM time, and one decode's KV read per iteration (linear). Saved via
    :func:`portbench.present.figures.save`; returns the PNG/PDF paths."""
    names = list(profiles or calibration.PROFILE_SPECS)
    fig, axes = figure(2, len(names), figsize=(4.6 * len(names), 8.6), squeeze=False, layout="constrained")
    for col, pname in enumerate(names):
        ax = axes[0][col]
        p = calibration.PROFILES[pname]
        t = calibration.calibration_table(pname)
        n = t["num_tokens"].to_numpy()
        ax.plot(n, t["measured_ms"], ".", ms=3, color="0.3", label="measured (GEMM path)")
        ax.plot(n, t["decode_fit_ms"], ":", lw=1, label="memory-bound line (N ≤ 256 fit)")
        ax.plot(n, t["prefill_fit_ms"], ":", lw=1, label="compute-bound line (N ≥ 256 fit)")
        ax.plot(n, t["model_ms"], "-", lw=1.8, label="model: max of the two (floor term)")
        ax.axvline(p.floor_tokens, color="0.6", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens in the iteration, N = P + B")
        ax.set_ylabel("token-linear time per iteration (ms)")
        mf = p.provenance["model_fit"]
        ax.set_title(f"{pname}\nknee (dashed) {p.floor_tokens:.0f} tokens\n"
                     f"R² decode-sized {mf['decode']['r2']:.2f}, prefill-sized {mf['prefill']['r2']:.3f}",
                     fontsize="medium")
        # attention (roofline): a whole prompt of x tokens, and one decode at context x
        ax = axes[1][col]
        x = np.unique(np.geomspace(16, max(p.max_model_len or 4096, 4096), 200).astype(int)).astype(float)
        gemm = calibration.model_gemm_ms(p, x)
        attn = p.c_attn_s * x * (x + 1) / 2 * 1e3
        ax.plot(x, gemm, "-", lw=1.5, color="0.3", label="prompt's GEMM time (calibrated)")
        ax.plot(x, attn, "-", lw=1.8, label="prompt's prefill attention (quadratic)")
        ax.plot(x, p.c_kv_s * x * 1e3, "--", lw=1.5, label="one decode's KV read (linear)")
        share = p.provenance["attention"]["prefill_share_of_gemm"]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt length / context (tokens)")
        ax.set_ylabel("ms")
        ax.set_title("attention (roofline); prefill attention / GEMM\n"
                     + ", ".join(f"{v:.0%} at {int(k) // 1024} k" for k, v in share.items()
                                 if int(k) in (4096, 14336, 25600)), fontsize="small")
    axes[0][0].legend(loc="upper left")
    axes[1][0].legend(loc="upper left")
    return figures.save(fig, name, figures_dir,
                        description="measured vs modelled token-linear time per iteration for each hardware "
                                    "profile (memory-bound and compute-bound fits and their maximum: the roofline "
                                    "floor), and the attention terms against the context: quadratic prefill "
                                    "attention and linear decode KV read (roofline)")


def _plain_log_axis(ax, axis: str = "y", subs=(1.0, 2.0, 5.0)) -> None:
    """Log scale with plain-number tick labels at 1-2-5 steps (readable without exponents)."""

    getattr(ax, f"set_{axis}scale")("log")
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    a.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(mticker.NullFormatter())


def _labels_for(runs, labels: Mapping | None) -> dict:
    """``{source: label}`` of the sources in ``runs``, in the order of ``labels`` (then by name)."""
    prov = dict(runs.select(["source", "provenance"]).unique().iter_rows())
    order = sorted(prov, key=tables.source_rank(list(labels or {})))
    return {s: (labels or {}).get(s) or label(s, prov[s]) for s in order}


def plot_capacity(runs, labels: Mapping | None = None):
    """Capacity per window (req/s, log scale), one column of dots per source, median marked."""


    cap = tables.capacity_by_window(runs)
    lab = _labels_for(runs, labels)
    srcs = list(lab)
    fig, ax = figure(figsize=(1.9 * len(srcs) + 2.5, 3.6))
    rng = np.random.default_rng(0)
    for i, s in enumerate(srcs):
        y = cap.filter(cap["source"] == s)["capacity_rps"].to_numpy()
        ax.scatter(i + rng.uniform(-0.18, 0.18, y.size), y, s=14, alpha=0.7, label=None)
        ax.hlines(np.median(y), i - 0.3, i + 0.3, color="black", lw=2)
    ax.set_xticks(range(len(srcs)), [lab[s] for s in srcs])
    _plain_log_axis(ax, subs=(1.0, 2.0, 3.0, 5.0))
    ax.set_ylabel("capacity (requests/s, log scale)")
    ax.set_title("Measured saturation capacity per window (bar = median)")
    return fig


def _metric_axis_label(name: str) -> str:
    if name == "completed_frac":
        return "completed in horizon (fraction)"

    try:
        return f"{name} ({metrics.metric(name).unit})"
    except ParameterError:  # not a registered metric: the bare name
        return name


LOG_METRICS = ("ttft_p50", "ttft_p99", "e2e_mean", "e2e_p99", "tpot_mean", "tpot_p99", "norm_latency_mean",
               "max_slowdown")


def plot_load_curves(runs, labels: Mapping | None = None, metrics: Sequence[str] = ("e2e_p99", "ttft_p50",
                     "completed_frac"), schedulers: Sequence[str] | None = None):
    """Metric against offered load rho: one row per metric, one column per source, one line per
    scheduler (median over windows x replicates, band = inter-quartile range)."""

    schedulers = list(schedulers or tables.curve_schedulers(runs))
    curves = tables.load_curves(runs, metrics, schedulers)
    lab = _labels_for(runs, labels)
    srcs = list(lab)
    fig, axes = figure(len(metrics), len(srcs), figsize=(4.3 * len(srcs), 3.0 * len(metrics)), squeeze=False,
                       sharex=True, sharey="row")
    rho_ticks = runs.select(["region", "rho"]).unique().sort("rho")
    sty = scheduler_styles(schedulers)
    for j, s in enumerate(srcs):
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            for sched in scheduler_order(schedulers):
                c = curves.filter((curves["source"] == s) & (curves["scheduler"] == sched)).sort("rho")
                if c.height == 0:
                    continue
                x = c["rho"].to_numpy()
                st = sty[sched]
                ax.plot(x, c[f"{m}_median"].to_numpy(), marker=st["marker"], ls=st["linestyle"], ms=3.5, lw=1.4,
                        color=st["color"], label=sched)
                ax.fill_between(x, c[f"{m}_q25"].to_numpy(), c[f"{m}_q75"].to_numpy(), color=st["color"], alpha=0.12,
                                lw=0)
            if m in LOG_METRICS:
                _plain_log_axis(ax)
            ax.axvline(1.0, color="0.5", lw=0.8, ls=":")
            if i == 0:
                ax.set_title(lab[s])
            if j == 0:
                ax.set_ylabel(_metric_axis_label(m))
            if i == len(metrics) - 1:
                ax.set_xlabel("offered load ρ (x window capacity)")
                ax.set_xticks(rho_ticks["rho"].to_list(), [f"{r:g}" for r in rho_ticks["rho"].to_list()])
    handles, names = axes[0][-1].get_legend_handles_labels()
    handles.append(Patch(color="0.5", alpha=0.25, lw=0))
    names.append("band: inter-quartile\nrange over windows\n× replicates")
    axes[0][-1].legend(handles, names, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       title="scheduler (line: median)", frameon=False)
    fig.suptitle("Metric against offered load (median over windows × replicates; dotted: ρ = 1)", fontsize=10, y=1.0)
    fig.tight_layout()
    return fig


def plot_preemptions(runs, labels: Mapping | None = None):
    """Heatmaps of mean preemptions per run, scheduler x region, one panel per source."""


    t = tables.preemption_table(runs)
    lab = _labels_for(runs, labels)
    srcs = list(lab)
    regions = runs.select(["region", "rho"]).unique().sort("rho")["region"].to_list()
    scheds = sorted(runs["scheduler"].unique().to_list())

    vmax = max(1.0, float(t["preemptions_per_run"].max() or 0.0))
    norm = mcolors.PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)  # square-root colour scale: small counts stay visible
    fig, axes = figure(1, len(srcs), figsize=(0.75 * len(regions) * len(srcs) + 2.8, 0.32 * len(scheds) + 1.8),
                       squeeze=False, sharey=True)
    im = None
    for j, s in enumerate(srcs):
        ax = axes[0][j]
        grid = np.full((len(scheds), len(regions)), np.nan)
        for r in t.filter(t["source"] == s).iter_rows(named=True):
            grid[scheds.index(r["scheduler"]), regions.index(r["region"])] = r["preemptions_per_run"]
        im = ax.imshow(grid, aspect="auto", cmap="viridis", norm=norm)
        for (a, b), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(b, a, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="center", fontsize=7.5,
                        color="white" if norm(v) < 0.6 else "black")
        ax.set_xticks(range(len(regions)), regions, rotation=35, ha="right")
        ax.set_yticks(range(len(scheds)), scheds)
        ax.set_title(lab[s])
        ax.grid(False)
    axes[0][len(srcs) // 2].set_xlabel("operating region (load increases to the right)")
    fig.colorbar(im, ax=axes[0].tolist(), label="recompute preemptions per run (mean; sqrt scale)", shrink=0.9)
    return fig


def plot_variant_ranks(ranks, labels: Mapping | None = None):
    """Mean rank (among the ranked schedulers) of sjf_predicted / ltr / edf per source with the home predictor,
    each foreign predictor and the oracle variant (:func:`portbench.study.honest.variant_ranks`)."""
    g = (ranks.group_by(["source", "policy", "variant"], maintain_order=True)
         .agg(pl.col("rank").mean().alias("mean_rank")))
    srcs = g["source"].unique(maintain_order=True).to_list()
    pols = g["policy"].unique(maintain_order=True).to_list()
    variants = g["variant"].unique(maintain_order=True).to_list()
    order = ["home"] + sorted(v for v in variants if v.startswith("from ")) + ["oracle"]
    order = [v for v in order if v in variants]
    markers = {"home": "o", "oracle": "*"}
    fig, axes = figure(1, len(srcs), figsize=(4.2 * len(srcs), 3.6), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], srcs):
        part = g.filter(pl.col("source") == s)
        for k, v in enumerate(order):
            q = part.filter(pl.col("variant") == v)
            y = [pols.index(p) + (k - (len(order) - 1) / 2) * 0.15 for p in q["policy"]]
            ax.scatter(q["mean_rank"], y, marker=markers.get(v, "s"), s=60 if v != "oracle" else 110, label=v,
                       color=f"C{k}")
        ax.set_yticks(range(len(pols)), pols)
        ax.set_xlim(0.5, int(ranks["n_ranked"].max()) + 0.5)
        ax.invert_xaxis()
        ax.set_xlabel(f"mean rank of {ranked_count(ranks)} (1 = best, right)")
        ax.set_title((labels or {}).get(s, s))
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.suptitle("Prediction-based policies with the home, a foreign or an oracle predictor", y=1.02)
    fig.tight_layout()
    return fig
