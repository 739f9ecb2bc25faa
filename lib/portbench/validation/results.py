"""What a validation run wrote, read back for notebook 08 (:func:`read_results`): the summary, the tables that
exist, the replayed cases, and whether they still belong to the current parameters and reversal table. The prose
and tables made of them are the presentation's (:mod:`portbench.present.validation_report`)."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..core.config import Config
from .common import _case_from_dict, _sha, out_dir, params_fingerprint, reversals_path, summary_path


def read_results(cfg: Config) -> dict:
    """What a validation run wrote (``summary``, the tables that exist, the replayed ``cases``), for
    notebook 08; with ``stale``: reasons the results may not belong to the current parameters / analysis."""
    out = out_dir(cfg.paths)
    res: dict[str, Any] = {"summary": None, "stale": []}
    p = summary_path(cfg.paths)
    if not p.is_file():
        return res
    summary = json.loads(p.read_text())
    res["summary"] = summary
    for name in ("engine_runs", "sim_runs", "sim_runs_insample", "engine_requests", "iterations", "verdicts",
                 "window_errors", "matched_requests", "capacity", "step_grid", "virtual_replays",
                 "repeat_requests"):
        f = out / f"{name}.parquet"
        if f.is_file():
            res[name] = pl.read_parquet(f)
    run_json = out / "raw" / "run.json"
    if summary.get("ran") and run_json.is_file():
        res["cases"] = [_case_from_dict(d) for d in json.loads(run_json.read_text())["cases"]]
    if summary.get("ran"):
        inp = summary.get("inputs", {})
        if inp.get("params_fingerprint") != params_fingerprint(cfg.tree):
            res["stale"].append("the parameters changed since the validation ran")
        rs = inp.get("reversals_sha256")
        if rs not in (None, "given") and rs != _sha(reversals_path(cfg.paths)):
            res["stale"].append("the analysis' reversal table changed since the validation ran")
    return res
