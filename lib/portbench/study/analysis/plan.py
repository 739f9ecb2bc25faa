"""The analysis plan on record: ``papermill_params/analysis_plan.yaml`` (headline metrics, delta, alpha, tie
rule and correction, and a dated log of every change). The analysis reads it, compares the run's ``analysis``
parameters with it, and records its SHA-256 and any deviation in ``summary.json["analysis_plan"]``; the
default parameters must follow it (``tests/test_ports.py``)."""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from ...core.errors import DataError

PLAN_FILE = "papermill_params/analysis_plan.yaml"
FREEZE_FILE = "papermill_params/analysis_plan.frozen.json"   # the plan's SHA-256 and the code version, before a run
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


def code_version() -> str:
    """The version of the analysis code a plan is frozen with (the installed portbench's version)."""
    try:
        return f"portbench {version('portbench')}"
    except PackageNotFoundError:
        return "portbench (not installed)"


def freeze(root: Path) -> dict:
    """Freeze the plan before a run: write :data:`FREEZE_FILE` with the plan file's SHA-256 and the code version
    (canonical JSON, no timestamp: freezing the same plan twice writes the same bytes). Returns the record."""
    path = plan_path(root)
    read_plan(path)                                   # a malformed plan is not frozen
    rec = {"plan_file": PLAN_FILE, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
           "code_version": code_version(),
           "note": "written by portbench.study.analysis.plan.freeze before the run; the analysis refuses a plan or "
                   "code version that differs (change the plan only with a dated entry in its `changes`, then freeze "
                   "again)"}
    out = Path(root) / FREEZE_FILE
    out.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


def check_frozen(root: Path, *, required: bool = False) -> dict | None:
    """The freeze record when the plan file still hashes to it and the code version matches; DataError naming the
    file and the fix otherwise. No freeze file: None, or DataError with ``required``."""
    f = Path(root) / FREEZE_FILE
    path = plan_path(root)
    if not f.is_file():
        if required:
            raise DataError(f, "the analysis plan is not frozen: run "
                               "`python -c 'from portbench.study.analysis import plan; plan.freeze(\".\")'` "
                               "in the repository before the run")
        return None
    try:
        rec = json.loads(f.read_text())
        want, ver = rec["sha256"], rec["code_version"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f, f"cannot read the plan's freeze record ({e}); freeze the plan again") from None
    got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    if got != want:
        raise DataError(path, f"the analysis plan changed after it was frozen (SHA-256 {str(got)[:12]}..., frozen "
                              f"{want[:12]}...): log the change with its date and reason under `changes`, then freeze "
                              f"it again (portbench.study.analysis.plan.freeze) before the run")
    if ver != code_version():
        raise DataError(f, f"the analysis plan was frozen with {ver}, this is {code_version()}: check that the "
                           "analysis still follows the plan, then freeze it again")
    return rec


def plan_block(root: Path, used: dict) -> dict:
    """``summary.json["analysis_plan"]``: file, SHA-256, the plan's settings, its change log, and whether this run
    follows it (``deviations`` lists every setting that differs; a sweep may deviate on purpose)."""
    path = plan_path(root)
    if not path.is_file():
        return {"file": PLAN_FILE, "sha256": None, "follows_plan": None,
                "note": f"no analysis plan at {path}: the headline is not pre-registered in this run"}
    data = read_plan(path)
    frozen = check_frozen(root)
    dev = deviations(data["plan"], used)
    return {"file": PLAN_FILE, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "plan": data["plan"],
            "changes": [{k: str(v) for k, v in c.items()} for c in data["changes"]],
            "frozen": ({"file": FREEZE_FILE, "code_version": frozen["code_version"], "verified": True} if frozen else
                       {"file": FREEZE_FILE, "verified": False, "note": "no freeze record: the plan was not frozen"}),
            "follows_plan": not dev, "deviations": dev}
