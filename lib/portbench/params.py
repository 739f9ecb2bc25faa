"""Parameter files for notebooks, the CLI and tests: read, merge (:mod:`portbench.core.config`) and
validate every section against the layer that owns it.

Notebooks take two papermill parameters, ``params_file`` and ``overrides`` (a nested dict or
``{"dotted.key": value}``), and call :func:`load`.
"""

from __future__ import annotations

import os

from . import validation
from .core.config import (DEFAULT_FILE, OPEN_MAPS, SOURCE_MODES, deep_merge, get, project_root,  # noqa: F401
                          undot)
from .core import config
from .core.errors import ParameterError, check_choice
from .core.provenance import SOURCE_NAME, SOURCES
from .data import standins
from .study import analysis, campaign

# Sections validated by the module that owns them: each module has validate_params(P) -> None.
SECTION_OWNERS = {"standins": standins, "campaign": campaign, "analysis": analysis, "validation": validation}


def load(params_file: str | os.PathLike | None = None, overrides: dict | None = None,
         *, validate: bool = True) -> dict:
    """Read a parameter file (default: default.yaml), apply ``overrides``, validate, resolve paths."""
    P = config.load(params_file, overrides)
    if validate:
        validate_params(P)
    return P


def validate_params(P: dict) -> None:
    """Check every section; raises ParameterError naming the parameter and what is allowed."""
    for name, spec in P.get("sources", {}).items():
        if spec is None:  # `sources: {bailian: null}` leaves a source out of the study
            continue
        if not SOURCE_NAME.match(str(name)):
            raise ParameterError("sources", name, f"a source name matching {SOURCE_NAME.pattern} "
                                 f"(built in: {', '.join(SOURCES)})")
        if not isinstance(spec, dict):
            raise ParameterError(f"sources.{name}", spec, "a mapping with keys mode, file")
        check_choice(f"sources.{name}.mode", spec.get("mode"), SOURCE_MODES)
        if name not in SOURCES and (spec.get("mode") == "standin" or not spec.get("file")):
            raise ParameterError(f"sources.{name}", spec, "for a source of your own: mode real or auto and a "
                                 "file (a path to a trace in a supported format); it has no stand-in")
    w = P.get("windows", {})
    for key in ("per_source", "size"):
        if key in w and (not isinstance(w[key], int) or w[key] <= 0):
            raise ParameterError(f"windows.{key}", w[key], "a positive integer")
    for section, owner in SECTION_OWNERS.items():
        if section in P:
            owner.validate_params(P)
