"""Figures of notebook 08, the real-engine validation (through the project's one figure helper).

They show measurements of the machine the validation ran on (engine timings), so they are saved as
*measured* figures (:func:`portbench.present.figures.save`): indexed in ``{figures_dir}/08_gpu_validation/
index.json``, not in the committed top index, and the folder is ignored by git.
"""

from __future__ import annotations

from typing import Mapping

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from ..core import figindex
from ..core.errors import ParameterError
from ..core.provenance import label
from ..sim import metrics
from ..validation.cases import Case
from ..validation.fidelity import window_values
from . import figures


def _unit(metric: str) -> str:
    try:
        return metrics.metric(metric).unit
    except ParameterError:  # not a registered metric: no unit in the label
        return ""


CASES_SHOWN = 6    # case figures shown in notebook 08 (the key reversal, the control, the first further ones)
FOLDER = "08_gpu_validation"
CASE_KINDS = ("reversal", "control")


def case_name(case: Case) -> str:
    """The file name of a case's figure (no folder): kind, pair, metric, region and sources, so two cases of one
    scheduler pair never share a file, and a case keeps its name whichever cases a time budget let run."""
    return f"{case.kind}_{case.a}_vs_{case.b}_{case.metric}_{case.region}_{'-'.join(case.sources)}"


def case_figures(cases, engine_runs: pl.DataFrame, provenance: Mapping[str, str], figures_dir,
                 sim_runs: pl.DataFrame | None = None, names: Mapping[str, str] | None = None,
                 shown: int = CASES_SHOWN) -> list[dict]:
    """:func:`case_figure` of every case with replays (saved and indexed); the first ``shown`` stay open (so a
    notebook displays them), the others are closed. The index entries of earlier runs' case figures are
    dropped first (their files stay until overwritten). Returns the saved paths."""
    figindex.forget_where(figures_dir, lambda name, e: e.get("notebook") == FOLDER
                          and name.split("/")[-1].startswith(tuple(f"{k}_" for k in CASE_KINDS)))
    out: list[dict] = []
    have = set(engine_runs.select("scheduler", "region").unique().iter_rows()) if engine_runs.height else set()
    for c in [c for c in cases if {(c.a, c.region), (c.b, c.region)} <= have]:
        fig, paths = case_figure(c, engine_runs, provenance, figures_dir, sim_runs, names)
        if len(out) >= shown:
            plt.close(fig)
        out.append(paths)
    return out


def case_figure(case: Case, engine_runs: pl.DataFrame, provenance: Mapping[str, str], figures_dir,
                sim_runs: pl.DataFrame | None = None, names: Mapping[str, str] | None = None) -> tuple[object, dict]:
    """Per source: the case's metric for a (x) vs b (y), one point per replayed window (engine: filled;
    re-simulation on the fitted profile: hollow). Points below the diagonal: b measured lower.
    ``names``: the sources' display names (``cfg.display_names``)."""
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
        ax.set_title(label(src, provenance.get(src, "real"), names))
        ax.legend(loc="best")
    fig.suptitle(f"{case.kind}: {case.a} vs {case.b} at {case.region}, one point per window")
    paths = figures.save(fig, f"{FOLDER}/{case_name(case)}", figures_dir, measured=True,
                         description=f"{case.kind} case: {case.metric} of {case.a} vs {case.b} at region "
                                     f"{case.region} on {', '.join(case.sources)}, one point per replayed window "
                                     "(vLLM measured, simulator re-run on the fitted profile)")
    return fig, paths


def residual_figure(iterations: pl.DataFrame, figures_dir) -> tuple[object, dict]:
    """The calibration profile against the engine's steps: measured vs predicted step time (left,
    log-log, coloured by phase) and the residual against the predicted time (right)."""
    fig, (ax1, ax2) = figures.figure(1, 2, figsize=(10.5, 4.2))
    it = iterations.filter(pl.col("phase") != "warmup").with_columns(
        kind=pl.when(pl.col("phase") == "saturation").then(pl.lit("calibration (saturation runs)"))
        .when(pl.col("phase") == "fidelity").then(pl.lit("fidelity replays")).otherwise(pl.lit("case replays")))
    for kind in ("case replays", "fidelity replays", "calibration (saturation runs)"):
        g = it.filter(pl.col("kind") == kind)
        if g.height:
            ax1.scatter(g["predicted_s"] * 1e3, g["step_s"] * 1e3, s=4, alpha=0.35, label=kind)
            ax2.scatter(g["predicted_s"] * 1e3, (g["step_s"] - g["predicted_s"]) * 1e3, s=4, alpha=0.35)
    lo = max(1e-2, float(it["predicted_s"].min() * 1e3) * 0.8) if it.height else 0.1
    hi = float(max(it["predicted_s"].max(), it["step_s"].max()) * 1e3) * 1.2 if it.height else 1.0
    ax1.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--")
    ax1.set_xscale("log"), ax1.set_yscale("log")
    ax1.set_xlabel("predicted step time (ms, calibration profile)")
    ax1.set_ylabel("measured step time (ms)")
    ax1.legend(loc="upper left", markerscale=3)
    ax2.axhline(0, color="black", lw=0.8)
    ax2.set_xlabel("predicted step time (ms)")
    ax2.set_ylabel("measured − predicted (ms)")
    fig.suptitle("Cost model fitted to the vLLM engine's steps")
    paths = figures.save(fig, f"{FOLDER}/profile_fit_residuals", figures_dir, measured=True,
                         description="measured vs predicted engine step time and residuals of the cost model fitted "
                                     "to the calibration (saturation) runs, every step of the validation run")
    return fig, paths


def fidelity_figure(matched: pl.DataFrame, figures_dir, *, title: str = "") -> tuple[object, dict]:
    """Per request, simulator vs engine for TTFT, TPOT and E2E (log-log), below saturation
    (filled) and at or above it (hollow)."""
    fig, axes = figures.figure(1, 3, figsize=(13.0, 4.2))
    for ax, x in zip(axes, ("ttft", "tpot", "e2e")):
        for below, g in ((False, matched.filter(pl.col("rho") >= 1)), (True, matched.filter(pl.col("rho") < 1))):
            g = g.filter(pl.col(x).is_not_null() & pl.col(f"{x}_sim").is_not_null() & (pl.col(x) > 0)
                         & (pl.col(f"{x}_sim") > 0))
            if g.height:
                kw = {"color": "C0"} if below else {"facecolors": "none", "edgecolors": "C1"}
                ax.scatter(g[x] * 1e3, g[f"{x}_sim"] * 1e3, s=5, alpha=0.4,
                           label="below saturation" if below else "at/above saturation", **kw)
        vals = matched.select(pl.col(x), pl.col(f"{x}_sim")).drop_nulls().to_numpy().ravel() * 1e3
        vals = vals[np.isfinite(vals) & (vals > 0)]
        if vals.size:
            ax.plot([vals.min(), vals.max()], [vals.min(), vals.max()], color="black", lw=0.8, ls="--")
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_xlabel(f"engine {x.upper()} (ms)")
        ax.set_ylabel(f"simulator {x.upper()} (ms)")
        ax.legend(loc="upper left", markerscale=3)
    fig.suptitle(title or "Simulator vs engine, per request")
    paths = figures.save(fig, f"{FOLDER}/fidelity_per_request", figures_dir, measured=True,
                         description="per-request TTFT, TPOT and E2E: the simulator re-run with the engine-fitted "
                                     "profile and the engine's settings vs the vLLM engine")
    return fig, paths
