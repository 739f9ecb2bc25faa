"""Figures of notebook 08 (through the project's one figure helper)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import polars as pl

from ..present import figures
from ..sim import metrics
from ..core.errors import ParameterError
from ..core.provenance import label
from .cases import Case
from .verdict import window_values


def _unit(metric: str) -> str:
    try:
        return metrics.metric(metric).unit
    except ParameterError:  # not a registered metric: no unit in the label
        return ""


def case_figure(case: Case, engine_runs: pl.DataFrame, provenance: Mapping[str, str], figures_dir,
                sim_runs: pl.DataFrame | None = None) -> tuple[object, dict]:
    """Per source: the case's metric for a (x) vs b (y), one point per replayed window (engine: filled;
    re-simulation on the fitted profile: hollow). Points below the diagonal: b measured lower."""
    n = len(case.sources)
    fig, axes = figures.figure(1, n, figsize=(4.2 * n, 4.0), squeeze=False)
    unit = _unit(case.metric)
    for ax, src in zip(axes[0], case.sources):
        _, va, vb = window_values(engine_runs, src, case.region, case.metric, case.a, case.b)
        ax.scatter(va, vb, s=28, label="vLLM (measured)", zorder=3)
        allv = [va, vb]
        if sim_runs is not None and sim_runs.height:
            _, sa, sb = window_values(sim_runs, src, case.region, case.metric, case.a, case.b)
            ax.scatter(sa, sb, s=28, facecolors="none", edgecolors="grey", label="simulator (fitted profile)")
            allv += [sa, sb]
        vals = np.concatenate([np.asarray(v, float) for v in allv]) if allv else np.array([])
        vals = vals[np.isfinite(vals)]
        if vals.size:
            lo, hi = float(vals.min()), float(vals.max())
            pad = 0.05 * (hi - lo or abs(hi) or 1.0)
            ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", lw=0.8, ls="--", zorder=1)
        ax.set_xlabel(f"{case.a}: {case.metric} ({unit})")
        ax.set_ylabel(f"{case.b}: {case.metric} ({unit})")
        ax.set_title(label(src, provenance.get(src, "real")))
        ax.legend(loc="best")
    fig.suptitle(f"{case.kind}: {case.a} vs {case.b} at {case.region}, one point per window")
    paths = figures.save(fig, f"08_gpu_validation/{case.kind}_{case.a}_vs_{case.b}", figures_dir,
                         description=f"{case.kind} case: {case.metric} of {case.a} vs {case.b} at region "
                                     f"{case.region}, one point per replayed window (vLLM measured, simulator "
                                     "re-run on the fitted profile)")
    return fig, paths
