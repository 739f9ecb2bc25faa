"""Figures of the portability analysis (notebooks 04-07). Every figure goes through
``portbench.present.figures.save``, which records it in the figure index (``summary.json``).

Each function takes the parameters ``cfg`` and an :class:`portbench.study.analysis.Analysis`, saves its
figure(s) under ``{figures_dir}/<notebook>/`` and returns the figure (or a list of figures).
Sources are labelled with :func:`portbench.core.provenance.label`, so stand-ins say so.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl

from ..study import analysis as an
from . import figures

NB = {name[:2]: name for name in an.FIGURE_NOTEBOOKS}  # "04" -> "04_cross_workload"
TAU_LABEL = "Kendall τ-b (dimensionless; 1 = same order, 0 = unrelated, −1 = reversed)"


def _save(cfg, fig, notebook: str, name: str, shows: str, close: bool = False):
    figures.save(fig, f"{NB[notebook]}/{name}", cfg.paths.figures_dir, description=shows, close=close)
    return fig


def _region_ticks(A, oneline: bool = False) -> list[str]:
    rho = A.summary["data"]["rho"]
    sep = " " if oneline else "\n"
    return [f"{r}{sep}(ρ={rho[r]:g})" if oneline else f"{r}{sep}ρ={rho[r]:g}"
            for r in A.summary["parameters"]["regions"]]


def _ties(A) -> str:
    """How ranks are tied, for titles: 'means within 1% tied' or 'exact ties only'."""
    tol = A.summary["parameters"].get("rank_tolerance", 0.0)
    return f"means within {100 * tol:g}% tied" if tol else "exact ties only"


def _metric_ticks(metrics) -> list[str]:
    arrow = {"higher": "↑", "lower": "↓"}
    return [f"{m} {arrow[an.metric_direction(m)]}" for m in metrics]


def _annot(values, lo=None, hi=None, digits: int = 2) -> np.ndarray:
    out = np.full(values.shape, "", dtype=object)
    for idx in np.ndindex(values.shape):
        v = values[idx]
        if np.isnan(v):
            out[idx] = "n/a"
            continue
        s = f"{v:.{digits}f}"
        if lo is not None and not np.isnan(lo[idx]):
            s += f"\n[{lo[idx]:.{digits}f}, {hi[idx]:.{digits}f}]"
        out[idx] = s
    return out


def _heatmap(ax, values, row_labels, col_labels, *, lo=None, hi=None, vmin=-1, vmax=1, cmap="RdBu",
             cbar_label=TAU_LABEL, fontsize=7, digits=2, cbar=True, fmt_int=False, nan_text="n/a",
             xrot: float = 0):
    """Annotated heatmap; NaN cells are grey and say ``nan_text``."""
    import seaborn as sns

    values = np.asarray(values, dtype=float)

    annot = _annot(values, lo, hi, digits) if not fmt_int else np.vectorize(
        lambda v: "" if np.isnan(v) else f"{int(v)}")(values)
    sns.heatmap(values, ax=ax, vmin=vmin, vmax=vmax, cmap=cmap, annot=annot, fmt="",
                annot_kws={"fontsize": fontsize}, xticklabels=col_labels, yticklabels=row_labels,
                cbar=cbar, cbar_kws={"label": cbar_label} if cbar else None, linewidths=0.5, linecolor="white")
    ax.grid(False)
    ax.set_facecolor("0.93")
    for i, j in zip(*np.nonzero(np.isnan(values))):
        if nan_text:
            ax.text(j + 0.5, i + 0.5, nan_text, ha="center", va="center", fontsize=fontsize, color="0.45")
    ax.tick_params(axis="y", rotation=0)
    if xrot:
        for t in ax.get_xticklabels():
            t.set_rotation(xrot)
            t.set_ha("right")
    else:
        ax.tick_params(axis="x", rotation=0)
    return ax


# --------------------------------------------------------------------------- 04 cross-workload

def cross_source_heatmaps(cfg, A, close: bool = False) -> list:
    """One heatmap per source pair: tau-b (with 95% CI) for every metric x region."""
    t = A["cross_source_tau"]
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    figs = []
    for (s1, s2), g in t.group_by(["source_1", "source_2"], maintain_order=True):
        piv = {(r, m): (tau, lo, hi) for r, m, tau, lo, hi in
               g.select("region", "metric", "tau", "ci_low", "ci_high").iter_rows()}
        arr = np.array([[piv.get((r, m), (np.nan,) * 3) for r in R] for m in M], dtype=float)
        fig, ax = figures.figure(figsize=(1.25 * len(R) + 3, 0.48 * len(M) + 1.8))
        _heatmap(ax, arr[..., 0], _metric_ticks(M), _region_ticks(A), lo=arr[..., 1], hi=arr[..., 2],
                 nan_text="n/a")
        l1, l2 = A.labels[s1], A.labels[s2]
        ax.set_title(f"Rank agreement between {l1} and {l2}: Kendall τ-b [95% bootstrap CI]\n"
                     f"{len(A.summary['parameters']['schedulers'])} schedulers ranked by mean over windows "
                     f"({_ties(A)}); n/a = a ranking is all ties")
        ax.set_xlabel("operating region (offered load ρ relative to capacity)")
        ax.set_ylabel("metric (↑ higher is better, ↓ lower is better)")
        figs.append(_save(cfg, fig, "04", f"tau_{s1}_vs_{s2}",
                          f"Kendall tau-b with 95% bootstrap CI between the scheduler rankings of {l1} and {l2}, "
                          "per metric and region", close))
    return figs


def cross_source_forest(cfg, A, close: bool = False):
    """Forest plot: every cross-source tau with its CI, by region, metric and source pair."""
    t = A["cross_source_tau"]
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    pairs = t.select("source_1", "source_2").unique(maintain_order=True).rows()
    ncol = 3 if len(R) > 4 else len(R)
    nrow = int(np.ceil(len(R) / ncol))
    fig, axes = figures.figure(nrow, ncol, figsize=(4.2 * ncol, 0.32 * len(M) * nrow + 1.5), sharex=True,
                               sharey=True, squeeze=False)
    colors = ["C0", "C1", "C2", "C3", "C4", "C5"]
    y = np.arange(len(M))
    for k, r in enumerate(R):
        ax = axes.flat[k]
        for q, (s1, s2) in enumerate(pairs):
            g = t.filter((pl.col("region") == r) & (pl.col("source_1") == s1) & (pl.col("source_2") == s2))
            d = {m: (tau, lo, hi) for m, tau, lo, hi in g.select("metric", "tau", "ci_low", "ci_high").iter_rows()}
            vals = np.array([d.get(m, (np.nan,) * 3) for m in M], dtype=float)
            off = (q - (len(pairs) - 1) / 2) * 0.25
            err = np.clip([vals[:, 0] - vals[:, 1], vals[:, 2] - vals[:, 0]], 0, None)  # CI may sit beside tau = 1
            ax.errorbar(vals[:, 0], y + off, xerr=np.nan_to_num(err), fmt="o",
                        ms=3, lw=1, color=colors[q % 6], label=f"{A.labels[s1]} vs {A.labels[s2]}")
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_title(f"{r} (ρ={A.summary['data']['rho'][r]:g})")
        ax.set_yticks(y, _metric_ticks(M), fontsize=8)
        ax.set_xlim(-1.05, 1.05)
    for ax in axes.flat[len(R):]:
        ax.set_visible(False)
    axes[0, 0].invert_yaxis()      # shared y: first metric on top in every panel
    for ax in axes[-1]:
        ax.set_xlabel("Kendall τ-b (dimensionless)")
    handles, labels_ = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels_, loc="lower center", ncol=len(pairs), bbox_to_anchor=(0.5, -0.02), frameon=False)
    fig.suptitle("Cross-source rank agreement per condition: τ-b and 95% bootstrap CI (points left of 0 = "
                 "orders tend to reverse)", y=1.0)
    fig.tight_layout(rect=(0, 0.04, 1, 0.98))
    return _save(cfg, fig, "04", "tau_forest", "forest plot of every cross-source tau-b with its 95% CI, "
                 "by region, metric and source pair", close)


def kendall_w_heatmap(cfg, A, close: bool = False):
    """Kendall's W across all sources, per metric x region."""
    t = A["cross_source_w"]
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    d = {(r, m): (w, lo, hi) for r, m, w, lo, hi in t.select("region", "metric", "W", "ci_low", "ci_high").iter_rows()}
    arr = np.array([[d.get((r, m), (np.nan,) * 3) for r in R] for m in M], dtype=float)
    fig, ax = figures.figure(figsize=(1.25 * len(R) + 3, 0.48 * len(M) + 1.8))
    _heatmap(ax, arr[..., 0], _metric_ticks(M), _region_ticks(A), lo=arr[..., 1], hi=arr[..., 2], vmin=0, vmax=1,
             cmap="viridis", cbar_label="Kendall's W (dimensionless; 0 = no agreement, 1 = identical)")
    names = ", ".join(A.labels.values())
    ax.set_title(f"Concordance of the scheduler rankings across all sources ({names}):\n"
                 f"Kendall's W (tie-corrected; {_ties(A)}) [95% bootstrap CI]; n/a = a source's ranking is all ties")
    ax.set_xlabel("operating region (offered load ρ relative to capacity)")
    ax.set_ylabel("metric (↑ higher is better, ↓ lower is better)")
    return _save(cfg, fig, "04", "kendall_w_sources", "Kendall's W across all sources per metric and region, "
                 "with 95% bootstrap CI", close)


# --------------------------------------------------------------------------- 05 cross-region

def cross_region_matrices(cfg, A, close: bool = False):
    """Per source: region x region tau-b averaged over metrics."""
    t = A["cross_region_tau"]
    R = A.summary["parameters"]["regions"]
    S = list(A.labels)
    fig, axes = figures.figure(1, len(S), figsize=(5.2 * len(S) + 1, 5.2), squeeze=False)
    agg = t.filter(pl.col("tau").is_not_nan()).group_by(["source", "region_1", "region_2"]) \
        .agg(pl.col("tau").mean().alias("tau"))
    for k, s in enumerate(S):
        arr = np.full((len(R), len(R)), np.nan)
        np.fill_diagonal(arr, 1.0)
        for r1, r2, tau in agg.filter(pl.col("source") == s).select("region_1", "region_2", "tau").iter_rows():
            i, j = R.index(r1), R.index(r2)
            arr[i, j] = arr[j, i] = tau
        _heatmap(axes[0, k], arr, _region_ticks(A, True), _region_ticks(A, True), fontsize=8, cbar=(k == len(S) - 1),
                 cbar_label="mean Kendall τ-b over metrics (dimensionless)", xrot=35)
        axes[0, k].set_title(A.labels[s])
        axes[0, k].set_xlabel("operating region (ρ)")
        axes[0, k].set_ylabel("operating region (ρ)" if k == 0 else "")
        axes[0, k].tick_params(axis="x", labelsize=7)
        axes[0, k].tick_params(axis="y", labelsize=7)
    fig.suptitle(f"Rank agreement between operating regions, mean τ-b over the "
                 f"{len(A.summary['parameters']['metrics'])} metrics ({_ties(A)})", y=1.0)
    fig.tight_layout()
    return _save(cfg, fig, "05", "region_tau_matrices", "per source, Kendall tau-b between the rankings of every "
                 "pair of operating regions, averaged over metrics", close)


def cross_region_w_heatmap(cfg, A, close: bool = False):
    """Kendall's W across the regions per source x metric."""
    t = A["cross_region_w"]
    M = A.summary["parameters"]["metrics"]
    S = list(A.labels)
    d = {(s, m): (w, lo, hi) for s, m, w, lo, hi in t.select("source", "metric", "W", "ci_low", "ci_high").iter_rows()}
    arr = np.array([[d.get((s, m), (np.nan,) * 3) for s in S] for m in M], dtype=float)
    fig, ax = figures.figure(figsize=(1.6 * len(S) + 3.5, 0.45 * len(M) + 1.6))
    _heatmap(ax, arr[..., 0], _metric_ticks(M), [A.labels[s] for s in S], lo=arr[..., 1], hi=arr[..., 2],
             vmin=0, vmax=1, cmap="viridis", cbar_label="Kendall's W (dimensionless)")
    ax.set_title(f"Concordance of the rankings across the {len(A.summary['parameters']['regions'])} regions: "
                 "Kendall's W [95% CI]")
    ax.set_xlabel("source")
    ax.set_ylabel("metric (↑ higher is better, ↓ lower is better)")
    return _save(cfg, fig, "05", "kendall_w_regions", "Kendall's W across operating regions per source and metric, "
                 "with 95% bootstrap CI", close)


def bump_charts(cfg, A, metrics=None, close: bool = False) -> list:
    """Per source: rank trajectories of every scheduler across the regions (one panel per metric)."""
    rk = A["rankings"]
    R = A.summary["parameters"]["regions"]
    K = A.summary["parameters"]["schedulers"]
    allm = A.summary["parameters"]["metrics"]
    metrics = [m for m in (metrics or list(cfg.analysis.headline_metrics) or allm[:4]) if m in allm] or allm[:4]
    import seaborn as sns
    from matplotlib.lines import Line2D

    palette = dict(zip(K, sns.color_palette("husl", len(K))))
    styles = ["-", "--", ":", "-."]
    figs = []
    for s in A.labels:
        ncol = 2 if len(metrics) > 1 else 1
        nrow = int(np.ceil(len(metrics) / ncol))
        fig, axes = figures.figure(nrow, ncol, figsize=(7.2 * ncol, 4.6 * nrow), squeeze=False)
        for k, m in enumerate(metrics):
            ax = axes.flat[k]
            g = rk.filter((pl.col("source") == s) & (pl.col("metric") == m))
            ranks = {(r, sc): v for r, sc, v in g.select("region", "scheduler", "rank").iter_rows()}
            x = np.arange(len(R))
            end = {}
            for i, sc in enumerate(K):
                yv = [ranks.get((r, sc), np.nan) for r in R]
                ax.plot(x, yv, styles[i % 4], marker="o", ms=4, lw=1.6, color=palette[sc])
                end.setdefault(yv[-1], []).append(sc)
            for yv, names in end.items():
                for j, sc in enumerate(names):
                    ax.text(x[-1] + 0.12, yv + (j - (len(names) - 1) / 2) * 0.42, sc, fontsize=7.5,
                            va="center", color=palette[sc])
            ax.set_xticks(x, _region_ticks(A), fontsize=8)
            ax.set_xlim(-0.2, len(R) - 1 + max(0.6, 0.22 * (len(R) - 1)))   # room for the end labels
            ax.set_ylim(len(K) + 0.7, 0.3)
            ax.set_yticks(range(1, len(K) + 1))
            ax.set_ylabel(f"rank (1 = best; {_ties(A)}, average rank)")
            ax.set_xlabel("operating region (offered load ρ)")
            ax.set_title(an.metric_label(m))
        for ax in axes.flat[len(metrics):]:
            ax.set_visible(False)
        handles = [Line2D([], [], color=palette[sc], ls=styles[i % 4], marker="o", ms=4) for i, sc in enumerate(K)]
        fig.legend(handles, K, loc="lower center", ncol=min(len(K), 7), frameon=False, bbox_to_anchor=(0.5, -0.04),
                   fontsize=8)
        fig.suptitle(f"{A.labels[s]}: scheduler ranks across operating regions (rank of the mean over windows; "
                     f"{_ties(A)})", y=1.0)
        fig.tight_layout(rect=(0, 0.05, 1, 0.98))
        figs.append(_save(cfg, fig, "05", f"bump_{s}", f"bump chart: rank of every scheduler in each operating region "
                          f"on {A.labels[s]}, for {', '.join(metrics)}", close))
    return figs


# --------------------------------------------------------------------------- 06 reversals

def reversal_funnel(cfg, A, close: bool = False):
    """Counts (and rates) of comparisons at each stage: sign only -> significant -> significant and practical."""
    rv = A.summary["reversals"]
    n = rv["comparisons"]["value"]
    names = ["comparisons", "sign_reversals", "significant", "significant_and_practical"]
    nice = ["all comparisons", "sign reversal", "+ significant\n(both sides)", "+ practical\n(both sides ≥ δ)"]
    vals = [rv[k]["value"] for k in names]
    fig, ax = figures.figure(figsize=(7.5, 4.2))
    bars = ax.bar(nice, [max(v, 0.8) for v in vals], color=["0.7", "C0", "C1", "C3"])
    ax.set_yscale("log")
    for b, v in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, max(v, 0.8) * 1.15, f"{v:,}\n({v / n:.1%})" if n else f"{v}",
                ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0.5, n * 8 if n else 10)
    ax.set_ylabel("number of comparisons (log scale)")
    ax.set_xlabel("stage of the reversal verdict")
    p = rv["parameters"]
    ax.set_title(f"Scheduler-pair reversals between sources: α = {p['alpha']}, {p['correction']} correction "
                 f"(family: {p['family']}), δ = {p['delta']:.0%}")
    return _save(cfg, fig, "06", "reversal_funnel", "number and rate of scheduler-pair x source-pair x region x metric "
                 "comparisons that reverse in sign, significantly, and significantly and practically", close)


def reversal_concentration(cfg, A, close: bool = False):
    """Where significant-and-practical reversals concentrate: metric x region, and per source pair."""
    rev = A["reversals"]
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    b = an.breakdown(rev, ["region", "metric"])
    d = {(r, m): c for r, m, c in b.select("region", "metric", "significant_and_practical").iter_rows()}
    arr = np.array([[d.get((r, m), 0) for r in R] for m in M], dtype=float)
    per_cell = rev.height / max(len(R) * len(M), 1)
    fig, axes = figures.figure(1, 2, figsize=(14, 0.42 * len(M) + 2.2), gridspec_kw={"width_ratios": [1.3, 1]})
    _heatmap(axes[0], arr, _metric_ticks(M), _region_ticks(A, True), vmin=0, vmax=max(arr.max(), 1), cmap="rocket_r",
             cbar_label=f"significant & practical reversals (of {per_cell:.0f} comparisons per cell)", fmt_int=True,
             fontsize=8, xrot=30)
    axes[0].set_xlabel("operating region (offered load ρ)")
    axes[0].set_ylabel("metric")
    axes[0].set_title("by metric and region")
    sp = an.breakdown(rev, ["source_1", "source_2"])
    lab = [f"{A.labels[a]}\nvs {A.labels[c]}" for a, c in zip(sp["source_1"], sp["source_2"])]
    x = np.arange(len(lab))
    for k, (col, color, name) in enumerate([("sign_reversals", "C0", "sign reversal"),
                                            ("significant", "C1", "significant"),
                                            ("significant_and_practical", "C3", "significant & practical")]):
        axes[1].bar(x + (k - 1) * 0.27, sp[col].to_numpy(), width=0.27, color=color, label=name)
    axes[1].set_xticks(x, lab, fontsize=8)
    axes[1].set_ylabel("number of reversals")
    axes[1].set_xlabel("source pair")
    axes[1].set_title("by source pair")
    axes[1].set_ylim(0, 1.25 * max(int(sp["sign_reversals"].max() or 0), 1))
    axes[1].legend(fontsize=8, loc="upper center", ncol=3)
    fig.suptitle("Where the significant-and-practical reversals concentrate", y=1.01)
    fig.tight_layout()
    return _save(cfg, fig, "06", "reversal_concentration", "count of significant-and-practical reversals per metric x "
                 "region, and reversals at each stage per source pair", close)


def reversal_pairs(cfg, A, close: bool = False):
    """Scheduler-pair matrix: significant-and-practical reversals per pair (all conditions and source pairs)."""
    rev = A["reversals"]
    K = A.summary["parameters"]["schedulers"]
    b = an.breakdown(rev, ["a", "b"])
    arr = np.full((len(K), len(K)), np.nan)
    for a, c, v in b.select("a", "b", "significant_and_practical").iter_rows():
        arr[K.index(c), K.index(a)] = v
    per = rev.height / max(len(K) * (len(K) - 1) / 2, 1)
    fig, ax = figures.figure(figsize=(0.62 * len(K) + 3, 0.55 * len(K) + 1.5))
    _heatmap(ax, arr, K, K, vmin=0, vmax=max(np.nanmax(arr) if not np.isnan(arr).all() else 1, 1), cmap="rocket_r",
             cbar_label=f"significant & practical reversals (of {per:.0f} comparisons per pair)", fmt_int=True,
             fontsize=8, nan_text="")
    ax.tick_params(axis="x", rotation=45)
    ax.set_xlabel("scheduler a")
    ax.set_ylabel("scheduler b")
    ax.set_title("Which scheduler pairs reverse between sources (all regions, metrics and source pairs)")
    return _save(cfg, fig, "06", "reversal_pairs", "count of significant-and-practical reversals per scheduler pair", close)


def reversal_forest(cfg, A, top: int = 20, close: bool = False):
    """Forest plot of the largest significant-and-practical reversals: signed relative effect on each side."""
    rev = A["reversals"].filter(pl.col("stage") == "significant_and_practical").sort("min_rel", descending=True).head(top)
    fig, ax = figures.figure(figsize=(9, 0.34 * max(rev.height, 3) + 1.8))
    if rev.height == 0:
        ax.text(0.5, 0.5, "no significant-and-practical reversal", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        y = np.arange(rev.height)
        s1 = np.sign(rev["diff_1"].to_numpy()) * rev["rel_1"].to_numpy()
        s2 = np.sign(rev["diff_2"].to_numpy()) * rev["rel_2"].to_numpy()
        ax.hlines(y, s1, s2, color="0.75", lw=1)
        ax.scatter(s1, y, color="C0", zorder=3, label="on source 1 (first source named)")
        ax.scatter(s2, y, color="C3", zorder=3, label="on source 2 (second source named)")
        lbl = [f"{a} vs {b} · {r} · {m} · {A.labels[x]} / {A.labels[z]}" for a, b, r, m, x, z in
               rev.select("a", "b", "region", "metric", "source_1", "source_2").iter_rows()]
        ax.set_yticks(y, lbl, fontsize=7.5)
        ax.invert_yaxis()
        ax.axvline(0, color="k", lw=0.8)
        d = A.summary["reversals"]["parameters"]["delta"]
        for v in (-d, d):
            ax.axvline(v, color="grey", ls=":", lw=0.8)
        ax.set_xlabel("signed relative effect (> 0: a better than b; dotted: ±δ)", labelpad=2)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2, frameon=False)
    ax.set_title(f"The {rev.height} largest significant-and-practical reversals (ordered by the smaller side)")
    return _save(cfg, fig, "06", "reversal_forest", "forest plot of the largest significant-and-practical reversals: "
                 "signed relative effect of a vs b on each source", close)


def most_dramatic_paired(cfg, A, close: bool = False):
    """Per-window paired plot of the most dramatic reversal, one panel per source."""
    md = A.summary["reversals"].get("most_dramatic")
    fig, axes = figures.figure(1, 2, figsize=(10, 4.8), sharey=True)
    if not md:
        for ax in axes:
            ax.text(0.5, 0.5, "no significant-and-practical reversal", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        return _save(cfg, fig, "06", "most_dramatic", "per-window paired plot of the most dramatic reversal (none found)",
                     close)
    wv = A["window_values"]
    a, b, region, metric = md["a"], md["b"], md["region"], md["metric"]
    direction = an.metric_direction(metric)
    allv = []
    for k, side in enumerate(("1", "2")):
        s = md[f"source_{side}"]
        g = wv.filter((pl.col("source") == s) & (pl.col("region") == region) & (pl.col("metric") == metric)
                      & pl.col("scheduler").is_in([a, b]))
        piv = {(w, sc): v for w, sc, v in g.select("window_id", "scheduler", "value").iter_rows()}
        wins = sorted({w for w, _ in piv})
        va = np.array([piv.get((w, a), np.nan) for w in wins])
        vb = np.array([piv.get((w, b), np.nan) for w in wins])
        allv += [va, vb]
        better_a = (va > vb) if direction == "higher" else (va < vb)
        ax = axes[k]
        for x1, x2, ba in zip(va, vb, better_a):
            ax.plot([0, 1], [x1, x2], color="C2" if ba else "C3", alpha=0.45, lw=1)
        ax.plot([0, 1], [np.nanmean(va), np.nanmean(vb)], color="k", lw=3, marker="o", label="mean over windows")
        ax.set_xticks([0, 1], [a, b])
        ax.set_xlim(-0.3, 1.3)
        na = int(np.sum(better_a))
        ax.set_title(f"{md['label_' + side]}: {a} better on {na}/{len(wins)} windows\n"
                     f"mean {np.nanmean(va):.3g} vs {np.nanmean(vb):.3g}, rel. effect {md['rel_' + side]:.0%}, "
                     f"adj. p = {md['p_adj_' + side]:.2g}", fontsize=9)
        ax.set_xlabel("scheduler")
    v = np.concatenate(allv)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > 30:
        axes[0].set_yscale("log")
    axes[0].set_ylabel(an.metric_label(metric))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Most dramatic reversal: {a} vs {b}, {metric}, region {region} — one line per window "
                 f"(green: {a} better, orange: {b} better)", y=1.02)
    return _save(cfg, fig, "06", "most_dramatic", f"per-window paired plot of the most dramatic reversal ({a} vs {b}, "
                 f"{metric}, {region}, {md['label_1']} vs {md['label_2']})", close)


# --------------------------------------------------------------------------- 07 cross-metric

def metric_agreement(cfg, A, close: bool = False):
    """Metric x metric tau-b, averaged over (source, region) conditions."""
    t = A["cross_metric_tau"]
    M = A.summary["parameters"]["metrics"]
    agg = t.filter(pl.col("tau").is_not_nan()).group_by(["metric_1", "metric_2"]).agg(pl.col("tau").mean())
    arr = np.full((len(M), len(M)), np.nan)
    np.fill_diagonal(arr, 1.0)
    for m1, m2, tau in agg.iter_rows():
        i, j = M.index(m1), M.index(m2)
        arr[i, j] = arr[j, i] = tau
    fig, ax = figures.figure(figsize=(0.62 * len(M) + 3.5, 0.55 * len(M) + 1.5))
    _heatmap(ax, arr, _metric_ticks(M), _metric_ticks(M), fontsize=7,
             cbar_label="mean Kendall τ-b over sources x regions (dimensionless)")
    ax.tick_params(axis="x", rotation=60)
    n = A.summary["cross_metric"]["conditions"]
    ax.set_title(f"Agreement between metric rankings: τ-b averaged over the {n} (source, region) conditions "
                 f"({_ties(A)})")
    ax.set_xlabel("metric")
    ax.set_ylabel("metric")
    return _save(cfg, fig, "07", "metric_agreement", "Kendall tau-b between the rankings under every pair of metrics, "
                 "averaged over sources and regions", close)


def winners(cfg, A, close: bool = False):
    """How often each scheduler is top-1 under each metric (over source x region conditions)."""
    t = A["top1"]
    M = A.summary["parameters"]["metrics"]
    K = A.summary["parameters"]["schedulers"]
    arr = np.zeros((len(M), len(K)))
    for m, w in t.select("metric", "winner").iter_rows():
        for sc in w.split("+"):
            arr[M.index(m), K.index(sc)] += 1
    n = A.summary["cross_metric"]["conditions"]
    fig, ax = figures.figure(figsize=(0.6 * len(K) + 3.5, 0.45 * len(M) + 1.8))
    _heatmap(ax, np.where(arr > 0, arr, np.nan), _metric_ticks(M), K, vmin=0, vmax=n, cmap="mako_r",
             cbar_label=f"conditions won (of {n} source x region)", fmt_int=True, fontsize=8, nan_text="")
    ax.tick_params(axis="x", rotation=45)
    ax.set_xlabel("scheduler")
    ax.set_ylabel("metric")
    ax.set_title("Which scheduler is best under which metric: number of (source, region) conditions won "
                 f"(ties count for each; {_ties(A)})")
    return _save(cfg, fig, "07", "winners", "number of source x region conditions in which each scheduler is top-1 "
                 "under each metric", close)


def slo_sensitivity(cfg, A, close: bool = False):
    """tau-b between the rankings under different SLO definitions, per source x region."""
    t = A["slo_tau"]
    fig, ax = figures.figure(figsize=(8, 0.38 * max(t.height // 3, 4) + 2))
    if t.height == 0:
        ax.text(0.5, 0.5, "fewer than two SLO metrics", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _save(cfg, fig, "07", "slo_sensitivity", "SLO sensitivity (not available)", close)
    conds = t.select("source", "region").unique(maintain_order=True).rows()
    pairs = t.select("slo_1", "slo_2").unique(maintain_order=True).rows()
    d = {(s, r, a, b): (v, lo, hi) for s, r, a, b, v, lo, hi in
         t.select("source", "region", "slo_1", "slo_2", "tau", "ci_low", "ci_high").iter_rows()}
    arr = np.array([[d[(s, r, a, b)] for a, b in pairs] for s, r in conds], dtype=float)
    _heatmap(ax, arr[..., 0], [f"{A.labels[s]} · {r}" for s, r in conds], [f"{a}\nvs {b}" for a, b in pairs],
             lo=arr[..., 1], hi=arr[..., 2], fontsize=7.5)
    ax.set_xlabel("pair of SLO definitions")
    ax.set_ylabel("source · operating region")
    ax.set_title(f"SLO-definition sensitivity: τ-b between the rankings under two SLO definitions [95% CI]; "
                 f"{_ties(A)}")
    return _save(cfg, fig, "07", "slo_sensitivity", "Kendall tau-b between the rankings under every pair of SLO "
                 "definitions, per source and region, with 95% CI", close)


def cd_diagrams(cfg, A, close: bool = False):
    """Critical-difference diagrams (Friedman + Nemenyi) for the chosen conditions."""
    import pandas as pd
    import scikit_posthocs as sp

    conds = A.summary["friedman"]["cd_conditions"]
    K = A.summary["parameters"]["schedulers"]
    alpha = A.summary["parameters"]["alpha"]
    n = max(len(conds), 1)
    fig, axes = figures.figure(n, 1, figsize=(10, 2.6 * n), squeeze=False)
    ar, nm, fr = A["avg_ranks"], A["nemenyi"], A["friedman"]
    for k, (s, r, m) in enumerate(conds):
        ax = axes[k, 0]
        sel = (pl.col("source") == s) & (pl.col("region") == r) & (pl.col("metric") == m)
        ranks = pd.Series(dict(ar.filter(sel).select("scheduler", "avg_rank").iter_rows()))
        sig = pd.DataFrame(1.0, index=K, columns=K)
        for a, b, p in nm.filter(sel).select("a", "b", "p").iter_rows():
            sig.loc[a, b] = sig.loc[b, a] = p
        f = fr.filter(sel).row(0, named=True)
        sp.critical_difference_diagram(ranks, sig, ax=ax, alpha=alpha, label_props={"fontsize": 8})
        ax.set_title(f"{A.labels[s]} · {r} · {m}: Friedman χ² = {f['statistic']:.1f}, adj. p = {f['p_adj']:.2g}, "
                     f"{f['n_windows']} windows; bars join schedulers not different (Nemenyi, α = {alpha})",
                     fontsize=9)
    axes[-1, 0].set_xlabel("average rank over windows (1 = best)")
    if not conds:
        axes[0, 0].text(0.5, 0.5, "no condition selected", ha="center", transform=axes[0, 0].transAxes)
    fig.tight_layout()
    return _save(cfg, fig, "07", "cd_diagrams", "critical-difference diagrams (average per-window ranks, Nemenyi "
                 "post-hoc) for " + "; ".join("/".join(c) for c in conds), close)


# --------------------------------------------------------------------------- all

FIGURES_BY_NOTEBOOK = {
    "04": (cross_source_heatmaps, cross_source_forest, kendall_w_heatmap),
    "05": (cross_region_matrices, cross_region_w_heatmap, bump_charts),
    "06": (reversal_funnel, reversal_concentration, reversal_pairs, reversal_forest, most_dramatic_paired),
    "07": (metric_agreement, winners, slo_sensitivity, cd_diagrams),
}


def make_all(cfg, A, close: bool = True) -> list[dict]:
    """Every figure of notebooks 04-07 (for ``portbench analyze``); returns the figure index."""
    for fns in FIGURES_BY_NOTEBOOK.values():
        for fn in fns:
            fn(cfg, A, close=close)
    return an.figure_index(cfg)


def run(cfg, *, figures: bool = True, progress: bool = True) -> dict:
    """``portbench analyze``: compute every table, make every figure, write summary.json; returns it."""
    t0 = time.perf_counter()
    A = an.load(cfg, recompute=True, progress=progress)
    if figures:
        make_all(cfg, A, close=True)
    summary = an.write_summary(cfg, A)
    if progress:
        print(f"[analysis] tables -> {an.analysis_dir(cfg.paths.results_dir)}; "
              f"summary -> {an.summary_path(cfg.paths.results_dir)}; "
              f"{len(summary['figures'])} figures; {time.perf_counter() - t0:.1f} s", flush=True)
    return summary
