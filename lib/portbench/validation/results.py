"""What a validation run wrote, read back for notebook 08 (:func:`read_results`): the summary, the per-replay
table and the run record where they exist, the pre-registration, and whether the run still belongs to the
frozen plan. The prose and tables made of them are the presentation's (:mod:`portbench.present.validation_report`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from ..core.config import Config
from ..core.errors import PortbenchError
from . import plan as plan_mod
from .common import out_dir, summary_path


def read_results(cfg: Config, root: Path | None = None) -> dict:
    """``summary`` (None when no run wrote one), ``replays`` (the per-replay table), ``run`` (``raw/run.json``),
    ``plan`` (the checked pre-registration, or ``plan_error``: why it does not check), ``stale``: reasons the run
    may not belong to the frozen plan."""
    out = out_dir(cfg.paths)
    res: dict[str, Any] = {"summary": None, "replays": None, "run": None, "plan": None, "plan_error": None,
                           "stale": []}
    try:
        res["plan"] = plan_mod.check(root or Path(__file__).resolve().parents[3])
    except PortbenchError as e:
        res["plan_error"] = str(e)
    p = summary_path(cfg.paths)
    if not p.is_file():
        return res
    res["summary"] = json.loads(p.read_text())
    if (out / "raw" / "replays.parquet").is_file():
        res["replays"] = pl.read_parquet(out / "raw" / "replays.parquet")
    if (out / "raw" / "run.json").is_file():
        res["run"] = json.loads((out / "raw" / "run.json").read_text())
    pre = (res["summary"] or {}).get("preregistration") or {}
    if res["summary"].get("ran") and res["plan"] and pre.get("sha256") != res["plan"]["sha256"]:
        res["stale"].append("the pre-registration was refrozen since the validation ran")
    return res
