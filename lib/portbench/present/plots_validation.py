"""Figures of notebook 08, the real-engine verdicts (through the project's one figure helper).

They show measurements of the machine the validation ran on, so they are saved as *measured* figures
(:func:`portbench.present.figures.save`): indexed in ``{figures_dir}/08_gpu_validation/index.json``, not in the
committed top index, and the folder is ignored by git.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import polars as pl

from . import figures

FOLDER = "08_gpu_validation"


def effects_figure(summary: Mapping, figures_dir) -> tuple[object, dict] | None:
    """Per case and side: the engine's paired effect (mean over windows of the paired log-ratios, positive = a
    better) with its 95 % interval, the engine-scale prediction (x) and the campaign's sign (arrow's side of 0);
    the planted reversal last. None when no case has an effect."""
    rows = []
    for c in [*summary.get("cases", []), *([summary["planted"]] if summary.get("planted", {}).get("pair") else [])]:
        for src, eff in (c.get("effect") or {}).items():
            lo, hi = (c.get("ci") or {}).get(src, [math.nan, math.nan])
            pred = ((c.get("prediction") or {}).get(src) or {}).get("effect")
            rows.append((f"{c.get('id', 'planted')}: {c['pair'][0]} vs {c['pair'][1]}\n{c['metric']}, {src}",
                         eff, lo, hi, pred, c.get("verdict", "")))
    rows = [r for r in rows if r[1] is not None and math.isfinite(float(r[1]))]
    if not rows:
        return None
    fig, ax = figures.figure(1, 1, figsize=(7.5, 0.55 * len(rows) + 1.5))
    y = np.arange(len(rows))[::-1]
    for yi, (_, eff, lo, hi, pred, _v) in zip(y, rows):
        ax.errorbar([eff], [yi], xerr=[[eff - lo], [hi - eff]] if math.isfinite(lo) else None, fmt="o", color="C0",
                    capsize=3, zorder=3)
        if pred is not None and math.isfinite(float(pred)):
            ax.plot([pred], [yi], marker="x", color="C3", ms=8, zorder=4)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{r[0]}  [{r[5]}]" for r in rows], fontsize=8)
    ax.set_xlabel("paired effect on the engine (log-ratio; > 0: the first policy better); x: engine-scale prediction")
    ax.set_title("Real engine: paired effects per case and side (95 % interval over windows)")
    paths = figures.save(fig, f"{FOLDER}/paired_effects", figures_dir, measured=True,
                         description="per case and side the engine's paired log-ratio with its 95 % interval over "
                                     "windows and the engine-scale prediction")
    return fig, paths


def aa_figure(replays: pl.DataFrame | None, summary: Mapping, figures_dir) -> tuple[object, dict] | None:
    """The A/A pairs' log-ratios (second replay over the first), one point per pair, by case: what the
    replay-to-replay noise sigma_r and the order effect are made of."""
    from ..validation.verdict import pair_effects

    if replays is None or replays.height == 0 or "is_aa" not in replays.columns:
        return None
    metric_of = {c["id"]: c["metric"] for c in [*summary.get("cases", []), summary.get("planted") or {}]
                 if c.get("id") and c.get("metric")}
    fig, ax = figures.figure(1, 1, figsize=(7.0, 3.5))
    shown = 0
    for i, (cid, metric) in enumerate(sorted(metric_of.items())):
        pe = pair_effects(replays.filter(pl.col("case") == cid), metric, aa=True)
        if pe.height:
            x = pe["order_d"].to_numpy()
            ax.scatter(x, np.full(x.size, i) + np.linspace(-0.2, 0.2, x.size), s=14, label=f"{cid} ({metric})")
            shown += 1
    if not shown:
        return None
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks([])
    ax.set_xlabel("A/A pair: log(second replay / first), oriented (> 0: the first replay better)")
    ax.legend(loc="best", fontsize=8)
    ax.set_title(f"A/A pairs: sigma_r = {summary.get('aa', {}).get('sigma_r', float('nan')):.3f}")
    paths = figures.save(fig, f"{FOLDER}/aa_pairs", figures_dir, measured=True,
                         description="A/A pairs' log-ratios by case: the replay-to-replay noise and the order effect")
    return fig, paths
