"""The opening of the analysis notebooks (04-07, 10), in one place: the analysis, the banner of real sources
and stand-ins, power warnings, and (04, 05, 07) how the rankings are made."""

from __future__ import annotations

import polars as pl

from ..core.config import Config
from ..study import analysis
from . import text


def open_analysis(cfg: Config, *, rankings: bool = False) -> analysis.Analysis:
    """The analysis of ``cfg`` (computed, or read when it matches the runs and parameters), after showing the
    banner and any power warning and setting polars' display; with ``rankings``, also how the rankings are made
    (:func:`portbench.present.text.rankings_markdown`)."""
    from IPython.display import Markdown, display

    manifest, why = analysis.stage_manifest(cfg.paths, required=cfg.analysis.runs_file is None)   # once
    A = analysis.load(cfg, manifest, manifest_error=why, progress=True)   # the steps of a fresh analysis, timed
    display(Markdown(text.banner(A.provenance, A.skipped, A.names)))
    pl.Config.set_fmt_str_lengths(160)
    pl.Config.set_tbl_rows(40)
    warnings = A.summary["power"]["warnings"]
    if warnings:
        display(Markdown(text.power_markdown({"warnings": warnings})))
    if rankings:
        display(Markdown(text.rankings_markdown(A.summary["parameters"], A.summary["data"], A.labels)))
    return A
