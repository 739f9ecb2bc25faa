"""Figures of the counterfactual attribution (notebook 09, ``portbench attribute``). Every figure goes through
:func:`portbench.present.figures.save` (PNG + PDF, indexed); sources are labelled with
:func:`portbench.core.provenance.label`, so a stand-in says so and a hybrid is never shown as a real source."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from ..core.config import PathsConfig
from ..core.provenance import label
from ..data import hybrids
from ..study import attribution as at
from . import figures

NB = "09_attribution"
PLAYER_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")


def _save(paths: PathsConfig, fig, name: str, shows: str, close: bool = False):
    figures.save(fig, f"{NB}/{name}", paths.figures_dir, description=shows, close=close)
    return fig


def pair_title(pr: dict, names: Mapping[str, str] | None = None) -> str:
    """``"Azure → Azure code"``, from the sources' display names (``names``: ``cfg.display_names``; without them
    the summary's labels) (hybrids are A's windows with B's properties)."""
    if names:
        return (f"{label(pr['source_a'], pr['provenance_a'], names)} → "
                f"{label(pr['source_b'], pr['provenance_b'], names)}")
    return f"{pr['label_a']} → {pr['label_b']}"


def _ecdf(ax, values, **kw):
    x = np.sort(np.asarray(values, dtype=float))
    ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", **kw)


def hybrid_definitions(paths: PathsConfig, a_df: pl.DataFrame, b_df: pl.DataFrame, *, a_label: str, b_label: str, window_a: str,
                       window_b: str, load: pl.DataFrame | None = None, close: bool = False):
    """One window pair and its single-property hybrids beside their originals: the arrival pattern, the prompt
    and output length distributions, the coupling (prompt vs output of every request) and, when given (the
    ``load`` table of the pair), every window-hybrid's achieved utilisation in the attribution's windows per
    region beside A's and B's steady-state utilisation (all run at the region's rho)."""
    fig, axes = figures.figure(2, 3, figsize=(15, 8.2))
    axes = axes.ravel()
    ca, cb, ch = "#4C72B0", "#DD8452", "0.1"
    style_a: dict[str, Any] = {"color": ca, "lw": 1.8}
    style_b: dict[str, Any] = {"color": cb, "lw": 1.8}
    style_h: dict[str, Any] = {"color": ch, "lw": 1.1, "ls": "--"}
    ax = axes[0]
    h_arr = hybrids.hybrid_window(a_df, b_df, ["arrival"])
    for df, st in ((a_df, style_a), (b_df, style_b), (h_arr, style_h)):
        arr = df["arrival_s"].to_numpy()
        ax.plot(arr / arr[-1], np.arange(1, arr.size + 1), **st)
    ax.set(xlabel="time / window span (dimensionless)", ylabel="requests arrived (count)",
           title="arrival pattern (hybrid: B's, at A's rate)")
    for ax, col, prop, ttl in ((axes[1], "prompt_tokens", "prompt", "prompt lengths"),
                               (axes[2], "output_tokens", "output", "output lengths")):
        h = hybrids.hybrid_window(a_df, b_df, [prop])
        for values, st in ((a_df[col], style_a), (b_df[col], style_b), (h[col], style_h)):
            _ecdf(ax, values, **st)
        ax.set(xscale="log", xlabel=f"{ttl} (tokens, log scale)", ylabel="fraction of requests (ECDF)",
               title=f"{ttl} (hybrid: B's, at A's ranks)")
    ax = axes[3]
    hc = hybrids.hybrid_window(a_df, b_df, ["coupling"])
    ax.scatter(a_df["prompt_tokens"], a_df["output_tokens"], s=9, alpha=0.55, color=ca)
    ax.scatter(b_df["prompt_tokens"], b_df["output_tokens"], s=9, alpha=0.55, color=cb)
    ax.scatter(hc["prompt_tokens"], hc["output_tokens"], s=12, marker="x", color=ch, lw=0.7)
    ax.set(xscale="log", yscale="log", xlabel="prompt (tokens, log scale)", ylabel="output (tokens, log scale)",
           title="coupling (hybrid: A's lengths in B's rank pattern)")
    ax = axes[4]
    if load is not None and load.height:
        lt = load.sort(["rho_region", "mask"])
        regs = lt["region"].unique(maintain_order=True).to_list()
        hyb = lt.filter(pl.col("region") == regs[0])["hybrid"].to_list()
        y = np.arange(len(hyb))
        h = 0.8 / len(regs)
        for j, (reg, shade) in enumerate(zip(regs, ("0.35", "0.65", "0.8", "0.9"))):
            lr = lt.filter(pl.col("region") == reg)
            ax.barh(y + j * h, lr["utilisation_window"].to_numpy(), height=h, color=shade, label=f"{reg}: window")
            for side, mask, col in (("A", 0, ca), ("B", int(lr["mask"].max()), cb)):
                st = lr.filter(pl.col("mask") == mask)["utilisation_steady"][0]
                if st is not None:
                    ax.axvline(st, color=col, lw=1.0, ls=("-", ":", "-.", "--")[j % 4],
                               label=f"{reg}: {side} in steady state")
        ax.set_yticks(y + 0.4 - h / 2, hyb, fontsize=6.5)
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.04, 1.0), frameon=False)   # into the free panel
        ax.set(xlabel="achieved utilisation (fraction of capacity)",
               title="load: every hybrid at the region's ρ;\nutilisation of its 200-request windows vs steady state")
    else:
        ax.axis("off")
    ax = axes[5]
    ax.axis("off")
    handles = [Line2D([], [], **style_a), Line2D([], [], **style_b), Line2D([], [], **style_h)]
    ax.legend(handles, [f"A: {a_label}, window {window_a}", f"B: {b_label}, window {window_b}",
                        "hybrid: A with that one property of B"], loc="lower center", fontsize=9, frameon=False)
    fig.suptitle(f"Hybrids of one window pair: A = {a_label} with one property of B = {b_label}", fontsize=11)
    fig.tight_layout()
    return _save(paths, fig, "hybrid_definitions", f"one window pair ({a_label} {window_a}, {b_label} {window_b}) and "
                 "the hybrids that take one property of B (arrival pattern, prompt lengths, output lengths, coupling), and "
                 "the achieved utilisation of every window-hybrid at the region's rho vs A's and B's steady state", close)


def game_players(sec) -> list[str]:
    """The players of the Shapley game (those that can matter; older results: every player of the design)."""
    return list(sec["design"].get("players_in_game") or sec["design"]["players"])


def shapley_bars(paths: PathsConfig, A: at.Attribution, close: bool = False, names: Mapping[str, str] | None = None):
    """Per source pair: for every region x metric (and pooled over them), the Shapley values of the players
    stacked (distance units; they add up to the A -> B distance), with the sum of the single swaps as a
    marker (away from the bar's end when the properties interact) and the total's bootstrap CI."""
    pairs = A.summary["pairs"]
    players = game_players(A.summary)
    shp, cond = A["shapley"], A["conditions"]
    fig, axes = figures.figure(1, len(pairs), figsize=(6.2 * len(pairs), 0.55 * (cond.height // max(1, len(pairs)) + 2)
                                                         + 1.8), squeeze=False)
    dist = A.summary["design"]["distance"]
    for ax, (pair, pr) in zip(axes[0], pairs.items()):
        cd = cond.filter(pl.col("pair") == pair)
        rows = [("all (pooled)", None, None)] + [(f"{r} / {m}", r, m) for r, m in zip(cd["region"], cd["metric"])]
        for y, (_name, reg, met) in enumerate(rows):
            if reg is None:
                phis = [pr["shares"][p]["phi"] or 0.0 for p in players]
                total, ci = pr["disagreement"]["value"] or 0.0, pr["disagreement"]["ci"]
                single = pr["interaction"]["sum_of_singles"]
            else:
                s = shp.filter((pl.col("pair") == pair) & (pl.col("region") == reg) & (pl.col("metric") == met))
                phis = [float(s.filter(pl.col("player") == p)["phi"][0]) for p in players]
                c = cd.filter((pl.col("region") == reg) & (pl.col("metric") == met)).row(0, named=True)
                total, ci, single = c["disagreement"], [c["disagreement_ci_low"], c["disagreement_ci_high"]], \
                    c["sum_of_singles"]
            pos = neg = 0.0
            for i, v in enumerate(phis):
                v = 0.0 if v is None or not np.isfinite(v) else v
                left = pos if v >= 0 else neg + v
                ax.barh(y, abs(v), left=left, color=PLAYER_COLORS[i % len(PLAYER_COLORS)], edgecolor="white",
                        label=players[i] if y == 0 else None)
                pos, neg = (pos + v, neg) if v >= 0 else (pos, neg + v)
            if ci and ci[0] is not None and np.isfinite(ci[0]):
                ax.errorbar(total, y, xerr=[[max(0, total - ci[0])], [max(0, ci[1] - total)]], color="k", capsize=3,
                            lw=0.9)
            if single is not None and np.isfinite(single):
                ax.plot(single, y, marker="D", color="k", ms=4, mfc="white",
                        label="sum of single swaps" if y == 0 else None)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="k", lw=0.6)
        ax.set_xlabel(f"ranking distance from A ({dist}; Shapley values stacked)")
        ax.set_title(pair_title(pr, names), fontsize=10)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Which property of a workload moves the ranking: Shapley values of the ranking distance between two "
                 "sources (A's windows given B's properties)", fontsize=11)
    fig.tight_layout()
    return _save(paths, fig, "shapley_bars", "Shapley decomposition of the ranking distance between each source pair "
                 "over the swapped properties, per region x metric and pooled (bars add up to the A -> B distance; "
                 "error bar: its 95% bootstrap CI; diamond: the sum of the single swaps)", close)


def share_heatmap(paths: PathsConfig, A: at.Attribution, close: bool = False, names: Mapping[str, str] | None = None):
    """Shapley shares (phi / A -> B distance) of every player by condition (region / metric), one panel per
    source pair; cells annotated with the share and its 95% bootstrap CI."""
    import seaborn as sns

    pairs = A.summary["pairs"]
    players = game_players(A.summary)
    shp = A["shapley"]
    fig, axes = figures.figure(1, len(pairs), figsize=(1.3 * len(players) * len(pairs) + 3, 4.2), squeeze=False)
    for ax, (pair, pr) in zip(axes[0], pairs.items()):
        s = shp.filter(pl.col("pair") == pair)
        conds = s.select("region", "metric").unique(maintain_order=True)
        vals = np.full((conds.height, len(players)), np.nan)
        annot = np.full(vals.shape, "", dtype=object)
        for i, (reg, met) in enumerate(conds.iter_rows()):
            for j, p in enumerate(players):
                r = s.filter((pl.col("region") == reg) & (pl.col("metric") == met) & (pl.col("player") == p)).row(
                    0, named=True)
                vals[i, j] = r["share"]
                lo, hi = r["share_ci_low"], r["share_ci_high"]
                annot[i, j] = "n/a" if not np.isfinite(r["share"]) else (
                    f"{r['share']:.2f}" + (f"\n[{lo:.2f}, {hi:.2f}]" if lo is not None and np.isfinite(lo) else ""))
        sns.heatmap(vals, ax=ax, vmin=-0.5, vmax=1.0, cmap="viridis", annot=annot, fmt="", annot_kws={"fontsize": 7},
                    xticklabels=players, yticklabels=[f"{r} / {m}" for r, m in conds.iter_rows()],
                    cbar_kws={"label": "Shapley share of the A → B distance"})
        ax.grid(False)
        ax.set_title(pair_title(pr, names), fontsize=10)
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle("Share of each property in the ranking distance between two sources, per region / metric",
                 fontsize=11)
    fig.tight_layout()
    return _save(paths, fig, "share_heatmap", "Shapley share of each property (column) in the ranking distance between "
                 "the two sources, per region / metric (row), with 95% bootstrap CIs", close)


def hybrid_paths(paths: PathsConfig, A: at.Attribution, close: bool = False, names: Mapping[str, str] | None = None):
    """Every hybrid's mean distance to A's ranking (x) and to B's (y), per source pair: the single swaps,
    the pairs of swaps ... on the way from A (0, d) to B (d, 0); subsets that differ only in ``load`` (the
    identity) are one point."""
    pairs = A.summary["pairs"]
    h = A["hybrid_agreement"]
    fig, axes = figures.figure(1, len(pairs), figsize=(5.2 * len(pairs), 4.6), squeeze=False)
    for ax, (pair, pr) in zip(axes[0], pairs.items()):
        g = (h.filter(pl.col("pair") == pair).group_by("mask", "hybrid")
             .agg(pl.col("distance_vs_a").mean(), pl.col("distance_vs_b").mean()).sort("mask"))
        players = A.summary["design"]["players"]
        if "load" in players:          # the load swap is the identity: a subset with it is the same point without it
            lb, full = 1 << players.index("load"), 2 ** len(players) - 1
            g = g.filter(((pl.col("mask") & lb) == 0) & (pl.col("mask") != full ^ lb) | (pl.col("mask") == full))
        size = np.array([bin(m).count("1") for m in g["mask"]])
        k = len(A.summary["design"]["players"])
        sc = ax.scatter(g["distance_vs_a"], g["distance_vs_b"], c=size, cmap=plt.get_cmap("viridis", k + 1),
                        vmin=-0.5, vmax=k + 0.5, s=30, zorder=3)
        for x, y, name, k in zip(g["distance_vs_a"], g["distance_vs_b"], g["hybrid"], size):
            if k <= 1 or name == "all":
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        d = pr["disagreement"]["value"] or 0.0
        ax.plot([0, d], [d, 0], color="0.6", lw=0.8, ls=":")
        ax.set(xlabel="distance to A's ranking (mean over conditions)", ylabel="distance to B's ranking",
               title=pair_title(pr, names))
        fig.colorbar(sc, ax=ax, label="players swapped (count)", ticks=range(k + 1))
    fig.suptitle("From A's ranking to B's: every hybrid's distance to both, by the number of properties swapped",
                 fontsize=11)
    fig.tight_layout()
    return _save(paths, fig, "hybrid_paths", "every hybrid's ranking distance to A's and to B's ranking (mean over "
                 "regions x metrics), coloured by the number of swapped properties", close)


def make_all(paths: PathsConfig, A: at.Attribution, close: bool = True, names: Mapping[str, str] | None = None) -> list:
    """The attribution's summary figures (not the hybrid definitions, which need window tables)."""
    return [shapley_bars(paths, A, close, names), share_heatmap(paths, A, close, names), hybrid_paths(paths, A, close, names)]


def example_sources(A: at.Attribution) -> list[str]:
    """The two sources of the first pair (whose window tables :func:`example_pair` needs)."""
    pr = next(iter(A.summary["pairs"].values()))
    return [pr["source_a"], pr["source_b"]]


def example_pair(A: at.Attribution, tables: Mapping[str, pl.DataFrame], names: Mapping[str, str] | None = None) -> dict:
    """The first pair's first window pair, for :func:`hybrid_definitions`; ``tables``: the verified window tables
    of :func:`example_sources` (``portbench.data.windows.load_windows``)."""
    pair, pr = next(iter(A.summary["pairs"].items()))
    wa, wb = pr["windows"][0]
    load = A["load"].filter(pl.col("pair") == pair) if "load" in A.tables else None
    return {"a_df": tables[wa], "b_df": tables[wb], "a_label": label(pr["source_a"], pr["provenance_a"], names),
            "b_label": label(pr["source_b"], pr["provenance_b"], names), "window_a": wa, "window_b": wb, "load": load}
