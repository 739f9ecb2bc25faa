"""Figures of the portability analysis (notebooks 04-07). Every figure goes through
``portbench.present.figures.save``, which records it in the figure index (``summary.json``).

Each function takes the ``paths`` section (``cfg.paths``) and an :class:`portbench.study.analysis.Analysis`, saves
its figure(s) under ``{paths.figures_dir}/<notebook>/`` and returns the figure (or a list of figures); the bump
charts also take the metrics to show (``cfg.analysis.headline_metrics``). :func:`make_all` and :func:`run` (the
``portbench analyze`` driver) take the whole parameters.
Sources are labelled with :func:`portbench.core.provenance.label`, so stand-ins say so.

Every figure that compares or pools the sources of a *panel* (``analysis.panels``) exists once per available
panel: the headline panel's file has no suffix, every other panel's file ends in ``_<panel>`` (e.g.
``tau_forest_study``, ``reversal_funnel_study``, ``top1_pairs_study``). Figures of one source at a time (bump
charts, region matrices, SLO sensitivity, critical-difference diagrams) show every source once.
"""

from __future__ import annotations

import time

import matplotlib.colors as mcolors
import numpy as np
import polars as pl

from ..core.config import AnalysisConfig, PathsConfig
from ..study import analysis as an
from . import figures

NB = {name[:2]: name for name in an.FIGURE_NOTEBOOKS}  # "04" -> "04_cross_workload"
TAU_LABEL = "Kendall τ-b (dimensionless; 1 = same order, 0 = unrelated, −1 = reversed)"


def _save(paths: PathsConfig, fig, notebook: str, name: str, shows: str, close: bool = False):
    figures.save(fig, f"{NB[notebook]}/{name}", paths.figures_dir, description=shows, close=close)
    return fig


def _region_ticks(A, oneline: bool = False) -> list[str]:
    rho = A.summary["data"]["rho"]
    sep = " " if oneline else "\n"
    return [f"{r}{sep}(ρ={rho[r]:g})" if oneline else f"{r}{sep}ρ={rho[r]:g}"
            for r in A.summary["parameters"]["regions"]]


def _ties(A) -> str:
    """How ranks are tied, for titles."""
    p = A.summary["parameters"]
    rule = p.get("ties", "significance")
    if rule.startswith("significance"):
        return (f"statistical ties: Wilcoxon over windows, {p['tie_correction']}, α = {p['alpha']}"
                + (", and ≥ δ" if rule == "significance_practical" else ""))
    if rule == "tolerance":
        return f"means within {100 * p['rank_tolerance']:g}% tied"
    return "exact ties only"


def _panels(A) -> list[str]:
    """The available panels, headline first (then in the parameters' order)."""
    avail = [n for n, p in A.summary["panels"].items() if p["available"]]
    return sorted(avail, key=lambda n: n != A.summary["headline_panel"])


def _panel_sources(A, panel: str) -> list[str]:
    return list(A.summary["panels"][panel]["sources"])


def _head(A) -> list[str]:
    return A.summary["headline_metrics"]


def _panel_label(A, name: str) -> str:
    p = A.summary["panels"][name]
    return f"panel {name} ({', '.join(A.labels.get(s, s) for s in p['sources'])}; {'all real' if p['all_real'] else 'not all real'})"


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
             xrot: float = 0, blank_diagonal: bool = False):
    """Annotated heatmap; NaN cells are grey and say ``nan_text``. ``blank_diagonal``: a matrix of every pair
    of one list, whose diagonal (a thing with itself) is left white and unlabelled."""
    import seaborn as sns

    values = np.asarray(values, dtype=float)

    annot = _annot(values, lo, hi, digits) if not fmt_int else np.vectorize(
        lambda v: "" if np.isnan(v) else f"{int(v)}")(values)
    sns.heatmap(values, ax=ax, vmin=vmin, vmax=vmax, cmap=cmap, annot=annot, fmt="",
                annot_kws={"fontsize": fontsize}, xticklabels=col_labels, yticklabels=row_labels,
                cbar=cbar, cbar_kws={"label": cbar_label} if cbar else None, linewidths=0.5, linecolor="white")
    ax.grid(False)
    ax.set_facecolor("0.93")
    if blank_diagonal:
        from matplotlib.patches import Rectangle

        for i in range(min(values.shape)):
            ax.add_patch(Rectangle((i, i), 1, 1, facecolor="white", edgecolor="none"))
    for i, j in zip(*np.nonzero(np.isnan(values))):
        if nan_text and not (blank_diagonal and i == j):
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

def cross_source_heatmaps(paths: PathsConfig, A, close: bool = False) -> list:
    """One heatmap per panel and source pair: tau-b [95% CI] and tau-b / tau-b,max for every metric x region."""
    t = A["cross_source_tau"]
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    head = set(_head(A))
    figs = []
    for (panel, s1, s2), g in t.group_by(["panel", "source_1", "source_2"], maintain_order=True):
        piv = {(r, m): (tau, lo, hi, nm, st) for r, m, tau, lo, hi, nm, st in
               g.select("region", "metric", "tau", "ci_low", "ci_high", "tau_norm", "status").iter_rows()}
        arr = np.array([[piv.get((r, m), (np.nan,) * 4 + ("missing",))[:4] for r in R] for m in M], dtype=float)
        status = [[piv.get((r, m), (None,) * 4 + ("missing",))[4] for r in R] for m in M]
        fig, ax = figures.figure(figsize=(1.35 * len(R) + 3, 0.52 * len(M) + 1.9))
        annot = _annot(arr[..., 0], arr[..., 1], arr[..., 2])
        for i, j in np.ndindex(annot.shape):
            if not np.isnan(arr[i, j, 3]):
                annot[i, j] += f"\n÷max {arr[i, j, 3]:.2f}"
            elif status[i][j] == "all_tied":
                annot[i, j] = "all tied"
        import seaborn as sns
        sns.heatmap(arr[..., 0], ax=ax, vmin=-1, vmax=1, cmap="RdBu", annot=annot, fmt="", annot_kws={"fontsize": 6},
                    xticklabels=_region_ticks(A), yticklabels=[("★ " if m in head else "") + x
                                                               for m, x in zip(M, _metric_ticks(M))],
                    cbar_kws={"label": TAU_LABEL}, linewidths=0.5, linecolor="white")
        ax.grid(False)
        ax.set_facecolor("0.93")
        for i, j in zip(*np.nonzero(np.isnan(arr[..., 0]))):      # seaborn leaves NaN cells blank: say why
            ax.text(j + 0.5, i + 0.5, "all tied" if status[i][j] == "all_tied" else "n/a", ha="center",
                    va="center", fontsize=6, color="0.45")
        ax.tick_params(axis="y", rotation=0)
        ax.tick_params(axis="x", rotation=0)
        l1, l2 = A.labels[s1], A.labels[s2]
        ax.set_title(f"Rank agreement: {l1} vs {l2} (panel {panel}), τ-b [95% CI]", fontsize=10)
        ax.set_xlabel("operating region (offered load ρ relative to capacity)")
        ax.set_ylabel("metric (↑ higher is better, ↓ lower is better)")
        suffix = "" if panel == A.summary["headline_panel"] else f"_{panel}"
        figs.append(_save(paths, fig, "04", f"tau_{s1}_vs_{s2}{suffix}",
                          f"Kendall tau-b with 95% bootstrap CI and tau-b / tau-b,max (÷max) between the scheduler "
                          f"rankings of {l1} and {l2} (panel {panel}), per metric and region; "
                          f"{len(A.summary['parameters']['schedulers'])} schedulers ranked by mean over windows "
                          f"({_ties(A)}); all tied = a ranking ties every scheduler; ★ headline metric", close))
    return figs


def cross_source_forest(paths: PathsConfig, A, close: bool = False) -> list:
    """Forest plot per panel: every headline cross-source tau-b with its CI, by region, metric and source pair."""
    figs = []
    for panel in _panels(A):
        t = A["cross_source_tau"].filter(pl.col("panel") == panel)
        R, M = A.summary["parameters"]["regions"], _head(A)
        pairs = t.select("source_1", "source_2").unique(maintain_order=True).rows()
        ncol = 3 if len(R) > 4 else len(R)
        nrow = int(np.ceil(len(R) / ncol))
        fig, axes = figures.figure(nrow, ncol, figsize=(4.2 * ncol, 0.5 * len(M) * nrow + 1.8), sharex=True,
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
                err = np.clip([vals[:, 0] - vals[:, 1], vals[:, 2] - vals[:, 0]], 0, None)
                ax.errorbar(vals[:, 0], y + off, xerr=np.nan_to_num(err), fmt="o",
                            ms=3, lw=1, color=colors[q % 6], label=f"{A.labels[s1]} vs {A.labels[s2]}")
                for yy in (y + off)[~np.isfinite(vals[:, 0])]:      # undefined: a ranking is all tied
                    ax.text(0, yy, "n/a", fontsize=6.5, ha="center", va="center", color=colors[q % 6])
            ax.axvline(0, color="grey", lw=0.8)
            ax.set_title(f"{r} (ρ={A.summary['data']['rho'][r]:g})")
            ax.set_yticks(y, _metric_ticks(M), fontsize=8)
            ax.set_xlim(-1.05, 1.05)
        for ax in axes.flat[len(R):]:
            ax.set_visible(False)
        axes[0, 0].invert_yaxis()
        for ax in axes[-1]:
            ax.set_xlabel("Kendall τ-b (dimensionless)")
        handles, labels_ = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels_, loc="lower center", ncol=len(pairs), bbox_to_anchor=(0.5, -0.02), frameon=False)
        fig.suptitle(f"Cross-source rank agreement, headline metrics, {_panel_label(A, panel)}", y=1.0, fontsize=10)
        fig.tight_layout(rect=(0, 0.04, 1, 0.98))
        suffix = "" if panel == A.summary["headline_panel"] else f"_{panel}"
        figs.append(_save(paths, fig, "04", f"tau_forest{suffix}", f"forest plot of every cross-source tau-b of the "
                          f"headline metrics with its 95% CI, by region, metric and source pair (panel {panel}; n/a: tau-b "
                          "undefined, a ranking is all tied)", close))
    return figs


def kendall_w_heatmap(paths: PathsConfig, A, close: bool = False) -> list:
    """Kendall's W across the sources of each panel, per metric x region."""
    figs = []
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    for panel in _panels(A):
        t = A["cross_source_w"].filter(pl.col("panel") == panel)
        d = {(r, m): (w, lo, hi) for r, m, w, lo, hi in t.select("region", "metric", "W", "ci_low", "ci_high").iter_rows()}
        arr = np.array([[d.get((r, m), (np.nan,) * 3) for r in R] for m in M], dtype=float)
        fig, ax = figures.figure(figsize=(1.25 * len(R) + 3, 0.48 * len(M) + 1.8))
        _heatmap(ax, arr[..., 0], _metric_ticks(M), _region_ticks(A), lo=arr[..., 1], hi=arr[..., 2], vmin=0, vmax=1,
                 cmap="viridis", cbar_label="Kendall's W (dimensionless; 0 = no agreement, 1 = identical)",
                 nan_text="all tied")
        ax.set_title(f"Kendall's W across sources [95% CI], {_panel_label(A, panel)}", fontsize=10)
        ax.set_xlabel("operating region (offered load ρ relative to capacity)")
        ax.set_ylabel("metric (↑ higher is better, ↓ lower is better)")
        suffix = "" if panel == A.summary["headline_panel"] else f"_{panel}"
        figs.append(_save(paths, fig, "04", f"kendall_w_sources{suffix}", f"Kendall's W across the sources of panel "
                          f"{panel} per metric and region, with 95% bootstrap CI", close))
    return figs


def tie_structure(paths: PathsConfig, A, close: bool = False):
    """How much each ranking resolves: tie groups per source x region for every headline metric."""
    rk = A["rankings"]
    R, K = A.summary["parameters"]["regions"], A.summary["parameters"]["schedulers"]
    M, S = _head(A), list(A.labels)
    fig, axes = figures.figure(1, len(M), figsize=(3.4 * len(M) + 1.5, 0.5 * len(S) + 2.8), squeeze=False, sharey=True)
    g = rk.group_by("source", "region", "metric").agg(pl.col("n_groups").first())
    d = {(s, r, m): n for s, r, m, n in g.iter_rows()}
    for k, m in enumerate(M):
        arr = np.array([[d.get((s, r, m), np.nan) for r in R] for s in S], dtype=float)
        _heatmap(axes[0, k], arr, [A.labels[s] for s in S], [f"{r} ({A.summary['data']['rho'][r]:g})" for r in R],
                 vmin=1, vmax=len(K), cmap="mako", cbar=(k == len(M) - 1),
                 cbar_label=f"tie groups (1 = all tied, {len(K)} = fully resolved)", fmt_int=True, fontsize=8, xrot=45)
        axes[0, k].tick_params(axis="x", labelsize=7)
        axes[0, k].set_title(an.metric_label(m), fontsize=9)
        axes[0, k].set_xlabel("operating region (ρ)")
    fig.suptitle("What the windows resolve: tie groups of each ranking", y=1.0)
    fig.tight_layout()
    return _save(paths, fig, "04", "tie_groups", "number of tie groups (statistically distinguishable levels) of every "
                 f"source x region ranking, per headline metric ({_ties(A)})", close)


# --------------------------------------------------------------------------- 05 cross-region

def cross_region_matrices(paths: PathsConfig, A, close: bool = False):
    """Per source: region x region tau-b averaged over metrics."""
    t = A["cross_region_tau"]
    R = A.summary["parameters"]["regions"]
    S = list(A.labels)
    fig, axes = figures.figure(1, len(S), figsize=(5.2 * len(S) + 1, 5.2), squeeze=False)
    agg = t.filter(pl.col("tau").is_not_nan() & pl.col("metric").is_in(_head(A))) \
        .group_by(["source", "region_1", "region_2"]).agg(pl.col("tau").mean().alias("tau"))
    for k, s in enumerate(S):
        arr = np.full((len(R), len(R)), np.nan)
        for r1, r2, tau in agg.filter(pl.col("source") == s).select("region_1", "region_2", "tau").iter_rows():
            i, j = R.index(r1), R.index(r2)
            arr[i, j] = arr[j, i] = tau
        np.fill_diagonal(arr, np.nan)
        _heatmap(axes[0, k], arr, _region_ticks(A, True), _region_ticks(A, True), fontsize=8, cbar=(k == len(S) - 1),
                 cbar_label="mean Kendall τ-b over metrics (dimensionless)", xrot=35, blank_diagonal=True)
        axes[0, k].set_title(A.labels[s])
        axes[0, k].set_xlabel("operating region (ρ)")
        axes[0, k].set_ylabel("operating region (ρ)" if k == 0 else "")
        axes[0, k].tick_params(axis="x", labelsize=7)
        axes[0, k].tick_params(axis="y", labelsize=7)
    fig.suptitle("Rank agreement between operating regions (mean τ-b, headline metrics)", y=1.0)
    fig.tight_layout()
    return _save(paths, fig, "05", "region_tau_matrices", "per source, Kendall tau-b between the rankings of every "
                 "pair of operating regions, averaged over the headline metrics where defined "
                 f"({_ties(A)})", close)


def cross_region_w_heatmap(paths: PathsConfig, A, close: bool = False):
    """Kendall's W across the regions per source x metric."""
    t = A["cross_region_w"]
    M = A.summary["parameters"]["metrics"]
    S = list(A.labels)
    d = {(s, m): (w, lo, hi) for s, m, w, lo, hi in t.select("source", "metric", "W", "ci_low", "ci_high").iter_rows()}
    arr = np.array([[d.get((s, m), (np.nan,) * 3) for s in S] for m in M], dtype=float)
    fig, ax = figures.figure(figsize=(1.6 * len(S) + 3.5, 0.45 * len(M) + 1.6))
    _heatmap(ax, arr[..., 0], _metric_ticks(M), [A.labels[s] for s in S], lo=arr[..., 1], hi=arr[..., 2],
             vmin=0, vmax=1, cmap="viridis", cbar_label="Kendall's W (dimensionless)", nan_text="all tied")
    ax.set_title("Kendall's W across regions [95% CI]")
    ax.set_xlabel("source")
    ax.set_ylabel("metric (↑ higher is better, ↓ lower is better)")
    return _save(paths, fig, "05", "kendall_w_regions", "Kendall's W across operating regions per source and metric, "
                 "with 95% bootstrap CI", close)


BUMP_LABEL_GAP = 0.72   # end labels of a bump chart at least this many ranks apart (8 pt text at ~0.4 rank)


def _spread(ys, gap: float) -> list[float]:
    """Label positions for sorted values ``ys``: as close to each value as possible, at least ``gap``
    apart (1-D: each run of crowded labels is centred on its values, runs merged until none overlap)."""
    blocks = []                                  # [first index, last index, top position]
    for i, y in enumerate(ys):
        blocks.append([i, i, float(y)])
        while len(blocks) > 1:
            a, b = blocks[-2], blocks[-1]
            if a[2] + (a[1] - a[0] + 1) * gap <= b[2]:
                break
            first, last = a[0], b[1]
            centre = float(np.mean(ys[first:last + 1]))
            blocks[-2:] = [[first, last, centre - (last - first) * gap / 2]]
    out = []
    for first, last, top in blocks:
        out += [top + k * gap for k in range(int(last - first + 1))]
    return out


def bump_charts(paths: PathsConfig, A, metrics=None, close: bool = False) -> list:
    """Per source: rank trajectories of every scheduler across the regions (one panel per metric)."""
    rk = A["rankings"]
    R = A.summary["parameters"]["regions"]
    K = A.summary["parameters"]["schedulers"]
    allm = A.summary["parameters"]["metrics"]
    metrics = [m for m in (list(metrics or ()) or allm[:4]) if m in allm] or allm[:4]
    from matplotlib.lines import Line2D

    sty = figures.scheduler_styles(K)
    figs = []
    for s in A.labels:
        ncol = 2 if len(metrics) > 1 else 1
        nrow = int(np.ceil(len(metrics) / ncol))
        fig, axes = figures.figure(nrow, ncol, figsize=(7.6 * ncol, 5.4 * nrow), squeeze=False)
        for k, m in enumerate(metrics):
            ax = axes.flat[k]
            g = rk.filter((pl.col("source") == s) & (pl.col("metric") == m))
            ranks = {(r, sc): v for r, sc, v in g.select("region", "scheduler", "rank").iter_rows()}
            x = np.arange(len(R))
            end = []
            for i, sc in enumerate(K):
                yv = [ranks.get((r, sc), np.nan) for r in R]
                st = sty[sc]
                ax.plot(x, yv, ls=st["linestyle"], marker=st["marker"], ms=4.5, lw=1.7, color=st["color"])
                if np.isfinite(yv[-1]):
                    end.append((yv[-1], i, sc))
            end.sort()
            at = _spread([e[0] for e in end], BUMP_LABEL_GAP)
            for (yv, _, sc), y_label in zip(end, at):
                ax.text(x[-1] + 0.16, y_label, sc, fontsize=8, va="center", color=sty[sc]["color"], fontweight="bold")
                ax.plot([x[-1] + 0.02, x[-1] + 0.14], [yv, y_label], lw=0.6, color=sty[sc]["color"])
            ax.set_xticks(x, _region_ticks(A), fontsize=8)
            ax.set_xlim(-0.2, len(R) - 1 + max(0.75, 0.26 * (len(R) - 1)))   # room for the end labels
            ax.set_ylim(max([len(K) + 0.7] + [y + 0.4 for y in at]), min([0.3] + [y - 0.4 for y in at]))
            ax.set_yticks(range(1, len(K) + 1))
            ax.set_ylabel("rank (1 = best)" if k % ncol == 0 else "")
            ax.set_xlabel("operating region (offered load ρ)")
            ax.set_title(an.metric_label(m))
        for ax in axes.flat[len(metrics):]:
            ax.set_visible(False)
        order = figures.scheduler_order(K)
        handles = [Line2D([], [], color=sty[sc]["color"], ls=sty[sc]["linestyle"], marker=sty[sc]["marker"], ms=4.5)
                   for sc in order]
        fig.legend(handles, order, loc="lower center", ncol=min(len(K), 7), frameon=False, bbox_to_anchor=(0.5, 0.0),
                   fontsize=8.5)
        fig.suptitle(f"{A.labels[s]}: scheduler ranks across operating regions")
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        figs.append(_save(paths, fig, "05", f"bump_{s}", f"bump chart: rank of every scheduler in each operating region "
                          f"on {A.labels[s]}, for {', '.join(metrics)} (rank of the mean over windows; {_ties(A)}; "
                          "tied schedulers share their average rank)", close))
    return figs


# --------------------------------------------------------------------------- 06 reversals

def _head_reversals(A, panel: str):
    return A["reversals"].filter((pl.col("panel") == panel) & pl.col("headline"))


def _suffix(A, panel: str) -> str:
    """File-name suffix of a panel's figure: none for the headline panel."""
    return "" if panel == A.summary["headline_panel"] else f"_{panel}"


def reversal_funnel(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """Counts (and rates) at each stage, the default design (headline metrics, per-metric families) beside the
    original study's design (study_preset), for one panel (default: the headline panel)."""
    panel = panel or A.summary["headline_panel"]
    rv = A.summary["panels"][panel]["reversals"]
    pre = rv.get("study_preset") or {}
    names = ["comparisons", "sign_reversals", "significant", "significant_and_practical"]
    nice = ["all comparisons", "sign reversal", "+ significant\n(both sides)", "+ practical\n(both sides ≥ δ)"]
    designs = [("default: " + ", ".join(rv.get("metrics", [])) + f"\n{rv['correction']} per {rv['family']}", "C0",
                [rv[k]["value"] for k in names])]
    if pre.get("available"):
        designs.append((f"study preset: {pre['metric']}, {len(pre['regions'])} heaviest regions\n"
                        f"{pre['correction']}, one family", "C3", [pre[k] for k in names]))
    fig, ax = figures.figure(figsize=(9, 4.6))
    x = np.arange(len(names))
    w = 0.8 / len(designs)
    for d, (label, color, vals) in enumerate(designs):
        n = vals[0]
        bars = ax.bar(x + (d - (len(designs) - 1) / 2) * w, [max(v, 0.8) for v in vals], width=w, color=color,
                      label=label)
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, max(v, 0.8) * 1.15, f"{v:,}\n({v / n:.1%})" if n else f"{v}",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, nice)
    ax.set_yscale("log")
    top = max(d[2][0] for d in designs) or 10
    ax.set_ylim(0.5, top * 12)
    ax.set_ylabel("number of comparisons (log scale)")
    ax.set_xlabel("stage of the reversal verdict")
    ax.legend(fontsize=8, loc="upper right")
    dl = rv["delta"]
    ax.set_title(f"Scheduler-pair reversals between sources ({_panel_label(A, panel)}):\n"
                 f"α = {rv['alpha']}, δ = {dl['relative']:.0%} relative (ratio metrics) / "
                 f"{100 * dl['absolute']:g} points (proportions)", fontsize=9)
    return _save(paths, fig, "06", f"reversal_funnel{_suffix(A, panel)}", "number and rate of comparisons that reverse "
                 "in sign, significantly, and significantly and practically: the default design beside the original "
                 f"study's design (panel {panel})", close)


def reversal_concentration(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """Where significant-and-practical reversals concentrate: metric x region (every metric), and per source pair
    (headline metrics), for one panel (default: the headline panel)."""
    panel = panel or A.summary["headline_panel"]
    allrev = A["reversals"].filter(pl.col("panel") == panel)
    R, M = A.summary["parameters"]["regions"], A.summary["parameters"]["metrics"]
    head = set(_head(A))
    b = an.breakdown(allrev, ["region", "metric"]) if allrev.height else None
    d = {(r, m): c for r, m, c in b.select("region", "metric", "significant_and_practical").iter_rows()} if b is not None else {}
    arr = np.array([[d.get((r, m), 0) for r in R] for m in M], dtype=float)
    per_cell = allrev.height / max(len(R) * len(M), 1)
    fig, axes = figures.figure(1, 2, figsize=(14, 0.42 * len(M) + 2.2), gridspec_kw={"width_ratios": [1.3, 1]})
    _heatmap(axes[0], arr, [("★ " if m in head else "") + x for m, x in zip(M, _metric_ticks(M))], _region_ticks(A, True),
             vmin=0, vmax=max(arr.max(), 1), cmap="rocket_r",
             cbar_label=f"significant & practical reversals (of {per_cell:.0f} comparisons per cell)", fmt_int=True,
             fontsize=8, xrot=30)
    axes[0].set_xlabel("operating region (offered load ρ)")
    axes[0].set_ylabel("metric (★ headline; families per metric)")
    axes[0].set_title("by metric and region")
    rev = _head_reversals(A, panel)
    if rev.height:
        sp = an.breakdown(rev, ["source_1", "source_2"])
        lab = [f"{A.labels[a]}\nvs {A.labels[c]}" for a, c in zip(sp["source_1"], sp["source_2"])]
        x = np.arange(len(lab))
        for k, (col, color, name) in enumerate([("sign_reversals", "C0", "sign reversal"),
                                                ("significant", "C1", "significant"),
                                                ("significant_and_practical", "C3", "significant & practical")]):
            axes[1].bar(x + (k - 1) * 0.27, sp[col].to_numpy(), width=0.27, color=color, label=name)
        axes[1].set_xticks(x, lab, fontsize=8)
        axes[1].set_ylim(0, 1.25 * max(int(sp["sign_reversals"].max() or 0), 1))
        axes[1].legend(fontsize=8, loc="upper center", ncol=3)
    axes[1].set_ylabel("number of reversals (headline metrics)")
    axes[1].set_xlabel("source pair")
    axes[1].set_title("by source pair, headline metrics")
    fig.suptitle(f"Where the significant-and-practical reversals concentrate ({_panel_label(A, panel)})", y=1.01)
    fig.tight_layout()
    return _save(paths, fig, "06", f"reversal_concentration{_suffix(A, panel)}", "count of significant-and-practical "
                 f"reversals per metric x region, and reversals at each stage per source pair (panel {panel})", close)


def reversal_pairs(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """Scheduler-pair matrix: significant-and-practical reversals per pair (headline metrics, every condition)."""
    panel = panel or A.summary["headline_panel"]
    rev = _head_reversals(A, panel)
    K = A.summary["parameters"]["schedulers"]
    arr = np.full((len(K), len(K)), np.nan)
    if rev.height:
        b = an.breakdown(rev, ["a", "b"])
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
    ax.set_title(f"Reversals per scheduler pair (panel {panel})", fontsize=10)
    return _save(paths, fig, "06", f"reversal_pairs{_suffix(A, panel)}", "count of significant-and-practical reversals "
                 f"per scheduler pair (headline metrics; all regions and source pairs; panel {panel})", close)


def reversal_forest(paths: PathsConfig, A, top: int = 20, close: bool = False, panel: str | None = None):
    """Forest plot of the strongest significant-and-practical reversals (headline metrics): each side's signed
    effect in multiples of the metric's practical threshold δ."""
    panel = panel or A.summary["headline_panel"]
    rev = (_head_reversals(A, panel).filter(pl.col("stage") == "significant_and_practical")
           .sort("strength", descending=True).head(top))
    fig, ax = figures.figure(figsize=(9, 0.34 * max(rev.height, 3) + 1.8))
    if rev.height == 0:
        ax.text(0.5, 0.5, "no significant-and-practical reversal", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        y = np.arange(rev.height)
        dl = rev["delta"].to_numpy()
        s1 = np.sign(rev["diff_1"].to_numpy()) * rev["effect_1"].to_numpy() / dl
        s2 = np.sign(rev["diff_2"].to_numpy()) * rev["effect_2"].to_numpy() / dl
        ax.hlines(y, s1, s2, color="0.75", lw=1)
        ax.scatter(s1, y, color="C0", zorder=3, label="on source 1 (first source named)")
        ax.scatter(s2, y, color="C3", zorder=3, label="on source 2 (second source named)")
        lbl = [f"{a} vs {b} · {r} · {m} · {A.labels[x]} / {A.labels[z]}" for a, b, r, m, x, z in
               rev.select("a", "b", "region", "metric", "source_1", "source_2").iter_rows()]
        ax.set_yticks(y, lbl, fontsize=7.5)
        ax.invert_yaxis()
        ax.axvline(0, color="k", lw=0.8)
        for v in (-1, 1):
            ax.axvline(v, color="grey", ls=":", lw=0.8)
        ax.set_xlabel("signed effect in multiples of δ (> 0: a better than b; dotted: ±δ; δ relative for ratio "
                      "metrics, percentage points for proportions)", labelpad=2, fontsize=8)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    ax.set_title(f"The {rev.height} strongest reversals (panel {panel})", fontsize=10)
    return _save(paths, fig, "06", f"reversal_forest{_suffix(A, panel)}", "forest plot of the strongest significant-and-"
                 "practical reversals of the headline metrics (ordered by the weaker side): signed effect of a vs b on "
                 f"each source, in multiples of delta (panel {panel})", close)


def power_curves(paths: PathsConfig, A, close: bool = False):
    """Power of one side test against the planted effect, per headline metric (pooled and per region)."""
    pc = A["power_curves"]
    M = [m for m in _head(A) if m in set(pc["metric"])] if pc.height else []
    fig, axes = figures.figure(1, max(len(M), 1), figsize=(3.6 * max(len(M), 1) + 1, 3.8), squeeze=False)
    pw = A.summary["power"]
    if not M:
        axes[0, 0].text(0.5, 0.5, "no null pairs (too few windows or identical schedulers)", ha="center",
                        transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
    R = A.summary["parameters"]["regions"]
    cmap = __import__("matplotlib").colormaps["viridis"]
    for k, m in enumerate(M):
        ax = axes[0, k]
        g = pc.filter(pl.col("metric") == m)
        for i, r in enumerate(R):
            gr = g.filter(pl.col("region") == r).sort("effect")
            if gr.height:
                ax.plot(gr["effect"], gr["power"], color=cmap(i / max(len(R) - 1, 1)), lw=1, alpha=0.8, label=r)
        ga = g.filter(pl.col("region") == "all").sort("effect")
        ax.plot(ga["effect"], ga["power"], color="k", lw=2.2, label="all regions, α")
        ax.plot(ga["effect"], ga["power_family"], color="k", lw=1.4, ls="--", label="all regions, α / m")
        ax.axhline(pw["by_metric"][m]["target_power"], color="C3", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{m}\nMDE {_fmt_effect(pw['by_metric'][m]['mde'], pw['by_metric'][m]['scale'])} (α), "
                     f"{_fmt_effect(pw['by_metric'][m]['mde_family'], pw['by_metric'][m]['scale'])} (α/m)", fontsize=9)
        ax.set_xlabel("planted effect (" + ("relative" if pw["by_metric"][m]["scale"] == "ratio" else "absolute") + ")")
        if k == 0:
            ax.set_ylabel("power of one side test")
    if M:
        axes[0, -1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Power at {pw['by_metric'][M[0]]['windows'] if M else '-'} windows per source, on the study's own "
                 "noise (planted effects)", y=1.02)
    fig.tight_layout()
    return _save(paths, fig, "06", "power_curves", "power of one paired Wilcoxon side test against the planted effect per "
                 "headline metric, per region and pooled, at alpha and at alpha/m", close)


def _fmt_effect(v, scale: str) -> str:
    if v is None:
        return "not reached"
    return f"{v:.1%}" if scale == "ratio" else f"{100 * v:.1f} pp" if scale == "proportion" else f"{100 * v:.1f} pp of the window"


def most_dramatic_paired(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """Per-window paired plot of the most dramatic reversal of a panel of sources, one axis per source."""
    panel = panel or A.summary["headline_panel"]
    md = (A.summary["panels"][panel].get("reversals") or {}).get("most_dramatic")
    fig, axes = figures.figure(1, 2, figsize=(10, 4.8), sharey=True)
    if not md:
        for ax in axes:
            ax.text(0.5, 0.5, "no significant-and-practical reversal", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        return _save(paths, fig, "06", f"most_dramatic{_suffix(A, panel)}", "per-window paired plot of the most dramatic "
                     f"reversal (none found; panel {panel})", close)
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
                     f"mean {np.nanmean(va):.3g} vs {np.nanmean(vb):.3g}, effect "
                     f"{_fmt_effect(md['effect_' + side], md['scale'])}, adj. p = {md['p_adj_' + side]:.2g}", fontsize=9)
        ax.set_xlabel("scheduler")
    v = np.concatenate(allv)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > 30:
        axes[0].set_yscale("log")
    axes[0].set_ylabel(an.metric_label(metric))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Most dramatic reversal: {a} vs {b}, {metric}, region {region} — one line per window "
                 f"(green: {a} better, orange: {b} better)", y=1.02)
    return _save(paths, fig, "06", f"most_dramatic{_suffix(A, panel)}", f"per-window paired plot of the most dramatic reversal ({a} vs {b}, "
                 f"{metric}, {region}, {md['label_1']} vs {md['label_2']})", close)


# --------------------------------------------------------------------------- 07 cross-metric

def metric_agreement(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """Metric x metric tau-b, averaged over the (source, region) conditions of one panel of sources (default:
    the headline panel)."""
    panel = panel or A.summary["headline_panel"]
    t = A["cross_metric_tau"].filter(pl.col("source").is_in(_panel_sources(A, panel)))
    M = A.summary["parameters"]["metrics"]
    agg = t.filter(pl.col("tau").is_not_nan()).group_by(["metric_1", "metric_2"]).agg(pl.col("tau").mean())
    arr = np.full((len(M), len(M)), np.nan)
    for m1, m2, tau in agg.iter_rows():
        i, j = M.index(m1), M.index(m2)
        arr[i, j] = arr[j, i] = tau
    np.fill_diagonal(arr, np.nan)
    fig, ax = figures.figure(figsize=(0.62 * len(M) + 3.5, 0.55 * len(M) + 1.5))
    _heatmap(ax, arr, _metric_ticks(M), _metric_ticks(M), fontsize=7,
             cbar_label="mean Kendall τ-b over sources x regions (dimensionless)", blank_diagonal=True)
    ax.tick_params(axis="x", rotation=60)
    n = t.select("source", "region").n_unique()
    ax.set_title(f"Agreement between metric rankings, {_panel_label(A, panel)}", fontsize=10)
    ax.set_xlabel("metric")
    ax.set_ylabel("metric")
    return _save(paths, fig, "07", f"metric_agreement{_suffix(A, panel)}", "Kendall tau-b between the rankings under "
                 f"every pair of metrics, averaged over the {n} (source, region) conditions of panel {panel} "
                 f"({_ties(A)})", close)


def top1_pairs(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """Pairwise top-1 change rate for every pair of headline metrics (over the (source, region) conditions of one
    panel, default the headline panel, where both rankings resolve a best group)."""
    panel = panel or A.summary["headline_panel"]
    t = A["top1_pairs"]
    srcs = _panel_sources(A, panel) if panel else []
    t = t.filter(pl.col("source").is_in(srcs) & pl.col("defined")) if t.height else t
    M = _head(A)
    arr = np.full((len(M), len(M)), np.nan)
    cnt = np.zeros((len(M), len(M)))
    if t.height:
        for m1, m2, rate, n in (t.group_by("metric_1", "metric_2").agg(pl.col("top1_changes").mean(), pl.len())
                                .iter_rows()):
            i, j = M.index(m1), M.index(m2)
            arr[i, j] = arr[j, i] = rate
            cnt[i, j] = cnt[j, i] = n
    fig, ax = figures.figure(figsize=(1.3 * len(M) + 3, 1.0 * len(M) + 1.5))
    annot = _annot(arr)
    for i, j in np.ndindex(arr.shape):
        if not np.isnan(arr[i, j]):
            annot[i, j] += f"\n(n = {int(cnt[i, j])})"
    import seaborn as sns
    sns.heatmap(arr, ax=ax, vmin=0, vmax=1, cmap="rocket_r", annot=annot, fmt="", annot_kws={"fontsize": 8},
                xticklabels=_metric_ticks(M), yticklabels=_metric_ticks(M),
                cbar_kws={"label": "fraction of conditions whose best groups differ"}, linewidths=0.5, linecolor="white")
    ax.grid(False)
    ax.set_facecolor("0.93")
    ax.tick_params(axis="x", rotation=30)
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(f"Does the best scheduler change with the metric? {_panel_label(A, panel)}", fontsize=10)
    return _save(paths, fig, "07", f"top1_pairs{_suffix(A, panel)}", "for every pair of headline metrics, the fraction "
                 f"of (source, region) conditions of panel {panel} in which the best tie groups share no scheduler "
                 f"(best group = schedulers tied for best; n = conditions where both resolve one; {_ties(A)})", close)


def winners(paths: PathsConfig, A, close: bool = False, panel: str | None = None):
    """How often each scheduler is top-1 under each metric (over the source x region conditions of one panel,
    default the headline panel)."""
    panel = panel or A.summary["headline_panel"]
    srcs = _panel_sources(A, panel)
    t = A["top1"].filter(pl.col("source").is_in(srcs))
    M = A.summary["parameters"]["metrics"]
    K = A.summary["parameters"]["schedulers"]
    arr = np.zeros((len(M), len(K)))
    for m, w in t.select("metric", "winner").iter_rows():
        for sc in filter(None, w.split("+")):
            arr[M.index(m), K.index(sc)] += 1
    n = len(srcs) * len(A.summary["parameters"]["regions"])
    fig, ax = figures.figure(figsize=(0.6 * len(K) + 3.5, 0.45 * len(M) + 1.8))
    _heatmap(ax, np.where(arr > 0, arr, np.nan), _metric_ticks(M), K, vmin=0, vmax=n, cmap="mako_r",
             cbar_label=f"conditions won (of {n} source x region)", fmt_int=True, fontsize=8, nan_text="")
    ax.tick_params(axis="x", rotation=45)
    ax.set_xlabel("scheduler")
    ax.set_ylabel("metric")
    ax.set_title(f"Which scheduler is best under which metric, {_panel_label(A, panel)}", fontsize=10)
    return _save(paths, fig, "07", f"winners{_suffix(A, panel)}", "number of source x region conditions of panel "
                 f"{panel} in which each scheduler is top-1 under each metric (ties count for each; {_ties(A)})", close)


def slo_sensitivity(paths: PathsConfig, A, close: bool = False):
    """tau-b between the rankings under different SLO definitions, per source x region."""
    t = A["slo_tau"]
    fig, ax = figures.figure(figsize=(8, 0.38 * max(t.height // 3, 4) + 2))
    if t.height == 0:
        ax.text(0.5, 0.5, "fewer than two SLO metrics", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _save(paths, fig, "07", "slo_sensitivity", "SLO sensitivity (not available)", close)
    conds = t.select("source", "region").unique(maintain_order=True).rows()
    pairs = t.select("slo_1", "slo_2").unique(maintain_order=True).rows()
    d = {(s, r, a, b): (v, lo, hi) for s, r, a, b, v, lo, hi in
         t.select("source", "region", "slo_1", "slo_2", "tau", "ci_low", "ci_high").iter_rows()}
    arr = np.array([[d[(s, r, a, b)] for a, b in pairs] for s, r in conds], dtype=float)
    _heatmap(ax, arr[..., 0], [f"{A.labels[s]} · {r}" for s, r in conds], [f"{a}\nvs {b}" for a, b in pairs],
             lo=arr[..., 1], hi=arr[..., 2], fontsize=7.5)
    ax.set_xlabel("pair of SLO definitions")
    ax.set_ylabel("source · operating region")
    ax.set_title("SLO-definition sensitivity, τ-b [95% CI]")
    return _save(paths, fig, "07", "slo_sensitivity", "Kendall tau-b between the rankings under every pair of SLO "
                 f"definitions, per source and region, with 95% CI ({_ties(A)})", close)


def _order_crossbars(lines) -> None:
    """scikit-posthocs draws each crossbar through the members of a Python ``set`` of scheduler names, whose
    order depends on ``PYTHONHASHSEED``: the same picture, different bytes. A horizontal line's points are
    put in x order (the line looks the same), so the files do not depend on the hash seed."""
    for ln in lines:
        x, y = np.asarray(ln.get_xdata(), dtype=float), np.asarray(ln.get_ydata(), dtype=float)
        if x.size > 1 and y.size == x.size and np.all(y == y[0]):
            ln.set_data(np.sort(x), y)


def cd_diagrams(paths: PathsConfig, A, close: bool = False):
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
        n_lines = len(ax.lines)
        sty = figures.scheduler_styles(list(ranks.index))
        sp.critical_difference_diagram(ranks, sig, ax=ax, alpha=alpha,
                                       label_props={"fontsize": 8.5, "fontweight": "bold"},
                                       color_palette={k: mcolors.to_hex(sty[k]["color"]) for k in ranks.index},
                                       elbow_props={"linewidth": 1.2}, crossbar_props={"linewidth": 2.2, "color": "0.2"})
        _order_crossbars(ax.lines[n_lines:])
        ax.set_title(f"{A.labels[s]} · {r} · {m}: Friedman χ² = {f['statistic']:.1f}, adj. p = {f['p_adj']:.2g}, "
                     f"{f['n_windows']} windows; bars join schedulers not different (Nemenyi, α = {alpha})",
                     fontsize=9)
    axes[-1, 0].set_xlabel("average rank over windows (1 = best)")
    if not conds:
        axes[0, 0].text(0.5, 0.5, "no condition selected", ha="center", transform=axes[0, 0].transAxes)
    fig.suptitle("Which schedulers the windows tell apart: critical-difference diagrams", fontsize=11)
    fig.tight_layout()
    return _save(paths, fig, "07", "cd_diagrams", "critical-difference diagrams (average per-window ranks, Nemenyi "
                 "post-hoc) for " + "; ".join("/".join(c) for c in conds), close)


# --------------------------------------------------------------------------- all

PANEL_FIGURES = {   # per notebook, the figures drawn once per available panel (file suffix _<panel> but the headline)
    "06": (reversal_funnel, reversal_concentration, reversal_pairs, reversal_forest, most_dramatic_paired),
    "07": (metric_agreement, top1_pairs, winners),
}


def _other_panels(paths: PathsConfig, A, notebook: str, close: bool) -> list:
    return [fn(paths, A, close=close, panel=panel) for panel in _panels(A)[1:] for fn in PANEL_FIGURES[notebook]]


def reversal_figures_other_panels(paths: PathsConfig, A, close: bool = False) -> list:
    """The reversal figures of every available panel other than the headline panel."""
    return _other_panels(paths, A, "06", close)


def cross_metric_figures_other_panels(paths: PathsConfig, A, close: bool = False) -> list:
    """The cross-metric figures that pool a panel's sources (metric agreement, top-1 pairs, winners) for every
    available panel other than the headline panel. The per-source figures (SLO sensitivity, critical-difference
    diagrams) show every source once."""
    return _other_panels(paths, A, "07", close)


FIGURES_BY_NOTEBOOK = {
    "04": (cross_source_heatmaps, cross_source_forest, kendall_w_heatmap, tie_structure),
    "05": (cross_region_matrices, cross_region_w_heatmap, bump_charts),
    "06": (reversal_funnel, reversal_concentration, reversal_pairs, reversal_forest, most_dramatic_paired, power_curves,
           reversal_figures_other_panels),
    "07": (metric_agreement, top1_pairs, winners, slo_sensitivity, cd_diagrams, cross_metric_figures_other_panels),
}


def make_all(paths: PathsConfig, analysis: AnalysisConfig, A, close: bool = True) -> list[dict]:
    """Every figure of notebooks 04-07 (for ``portbench analyze``; the ``analysis`` section names the bump charts'
    headline metrics); returns the figure index."""
    for fns in FIGURES_BY_NOTEBOOK.values():
        for fn in fns:
            if fn is bump_charts:
                bump_charts(paths, A, analysis.headline_metrics, close=close)
            else:
                fn(paths, A, close=close)
    return an.figure_index(paths)


def run(cfg, *, figures: bool = True, progress: bool = True) -> dict:
    """``portbench analyze``: compute every table, make every figure, write summary.json; returns it."""
    t0 = time.perf_counter()
    manifest, why = an.stage_manifest(cfg.paths, required=cfg.analysis.runs_file is None)   # once for the command
    A = an.load(cfg, manifest, manifest_error=why, recompute=True, progress=progress)
    for w in A.summary.get("power", {}).get("warnings", []):
        print(f"[analysis] WARNING: {w}", flush=True)
    if figures:
        make_all(cfg.paths, cfg.analysis, A, close=True)
    summary = an.write_summary(cfg, A)
    if progress:
        print(f"[analysis] tables -> {an.analysis_dir(cfg.paths.results_dir)}; "
              f"summary -> {an.summary_path(cfg.paths.results_dir)}; "
              f"{len(summary['figures'])} figures; {time.perf_counter() - t0:.1f} s", flush=True)
    return summary
