"""Parameter files: load, merge, validate.

A parameter file is YAML. ``extends: other.yaml`` (relative to the file) merges the file over
another one, so ``smoke.yaml`` and sweep points only state what they change. ``default.yaml``
is also the schema: a key that it does not have is an error (a typo never goes unnoticed),
except inside the *open maps* listed below, whose keys are names chosen by the user.
Relative paths under ``paths`` are resolved against the project root.

This module only reads and merges; :mod:`portbench.params` adds the validation of every section
(it imports the layers that own them).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from .errors import ParameterError

DEFAULT_FILE = "papermill_params/default.yaml"

# Maps whose keys the user names freely (a new SLO, region, source ...).
OPEN_MAPS = {
    "sources",
    "simulation.region_loads",
    "simulation.slo",
    "simulation.scheduler_options",
}
SOURCE_MODES = ("real", "standin", "auto")



def project_root() -> Path:
    """The folder holding ``papermill_params/default.yaml`` (searched upward from the cwd)."""
    env = os.environ.get("PORTBENCH_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / DEFAULT_FILE).is_file():
            return d
    pkg_root = Path(__file__).resolve().parents[2]
    if (pkg_root / DEFAULT_FILE).is_file():
        return pkg_root
    return here


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ParameterError("params_file", str(path), "an existing YAML parameter file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParameterError("params_file", str(path), f"valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ParameterError("params_file", str(path), "a YAML mapping at the top level")
    return data


def _read_chain(path: Path, seen: tuple = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ParameterError("extends", str(path), "no cycle of extends")
    data = _read_yaml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    return deep_merge(_read_chain((path.parent / base), seen + (path,)), data)


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base`` (dicts merge recursively, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def undot(flat: dict) -> dict:
    """``{"a.b": 1, "c": {"d": 2}}`` -> ``{"a": {"b": 1}, "c": {"d": 2}}``."""
    out: dict = {}
    for k, v in (flat or {}).items():
        parts = str(k).split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ParameterError(k, v, "a key path that does not pass through a scalar")
        if isinstance(v, dict) and isinstance(d.get(parts[-1]), dict):
            d[parts[-1]] = deep_merge(d[parts[-1]], undot(v))
        else:
            d[parts[-1]] = undot(v) if isinstance(v, dict) else v
    return out


def _check_schema(params: dict, schema: dict, prefix: str = "") -> None:
    for k, v in params.items():
        name = f"{prefix}{k}"
        if k not in schema:
            raise ParameterError(name, v, "a known parameter: " + ", ".join(f"{prefix}{s}" for s in schema))
        if name in OPEN_MAPS:
            continue
        if isinstance(schema[k], dict) and schema[k]:
            if not isinstance(v, dict):
                raise ParameterError(name, v, "a mapping with keys " + ", ".join(schema[k]))
            _check_schema(v, schema[k], name + ".")


def load(params_file: str | os.PathLike | None = None, overrides: dict | None = None) -> dict:
    """Read a parameter file (default: default.yaml), apply ``overrides``, validate, resolve paths."""
    root = project_root()
    default_path = root / DEFAULT_FILE
    path = Path(params_file) if params_file else default_path
    if not path.is_absolute():
        path = root / path if (root / path).exists() or not path.exists() else path.resolve()
    schema = _read_chain(default_path) if default_path.is_file() else {}
    P = _read_chain(path)
    if schema:
        P = deep_merge(schema, P)
    P = deep_merge(P, undot(overrides or {}))
    if schema:
        _check_schema(P, schema)
    P["_params_file"] = str(path)
    P["_root"] = str(root)
    for key, value in P.get("paths", {}).items():
        if isinstance(value, str) and key != "mirror_env":
            P["paths"][key] = str((root / value) if not Path(value).is_absolute() else Path(value))
    return P


def get(P: dict, dotted: str, default: Any = None) -> Any:
    """``get(P, "simulation.profile")``."""
    d: Any = P
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d
