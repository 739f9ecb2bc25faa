"""The analysis plan on record: ``papermill_params/analysis_plan.yaml`` (headline metrics, delta, alpha, tie
rule and correction, and a dated log of every change). The analysis reads it, compares the run's ``analysis``
parameters with it, and records its SHA-256 and any deviation in ``summary.json["analysis_plan"]``; the
default parameters must follow it (``tests/test_ports.py``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from ...core.errors import DataError

PLAN_FILE = "papermill_params/analysis_plan.yaml"
CHECKED = ("headline_metrics", "alpha", "delta", "delta_absolute", "ties", "tie_correction", "correction", "family")


def plan_path(root: Path) -> Path:
    return Path(root) / PLAN_FILE


def read_plan(path: Path) -> dict:
    """The plan file as a dict with ``plan`` and ``changes``; DataError naming the file when it is malformed."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DataError(path, f"cannot read the analysis plan ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict) or not isinstance(data.get("changes"), list):
        raise DataError(path, "expected a mapping with `plan` (the settings) and `changes` (a dated list)")
    missing = [k for k in CHECKED if k not in data["plan"]]
    if missing:
        raise DataError(path, f"plan is missing {', '.join(missing)}")
    for i, c in enumerate(data["changes"]):
        if not isinstance(c, dict) or not {"date", "what", "why"} <= set(c):
            raise DataError(path, f"changes[{i}]: expected date, what and why")
    return data


def deviations(plan: dict, used: dict) -> dict:
    """``{key: {"plan": ..., "used": ...}}`` for every checked setting where ``used`` (``settings()``) differs."""
    out = {}
    for k in CHECKED:
        p, u = plan.get(k), used.get(k)
        if isinstance(p, list) or isinstance(u, (list, tuple)):
            same = list(p or []) == list(u or [])
        elif isinstance(p, (int, float)) and isinstance(u, (int, float)):
            same = abs(float(p) - float(u)) < 1e-12
        else:
            same = p == u
        if not same:
            out[k] = {"plan": p, "used": list(u) if isinstance(u, tuple) else u}
    return out


def plan_block(root: Path, used: dict) -> dict:
    """``summary.json["analysis_plan"]``: file, SHA-256, the plan's settings, its change log, and whether this run
    follows it (``deviations`` lists every setting that differs; a sweep may deviate on purpose)."""
    path = plan_path(root)
    if not path.is_file():
        return {"file": PLAN_FILE, "sha256": None, "follows_plan": None,
                "note": f"no analysis plan at {path}: the headline is not pre-registered in this run"}
    data = read_plan(path)
    dev = deviations(data["plan"], used)
    return {"file": PLAN_FILE, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "plan": data["plan"],
            "changes": [{k: str(v) for k, v in c.items()} for c in data["changes"]],
            "follows_plan": not dev, "deviations": dev}
