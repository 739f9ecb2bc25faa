"""The three workload sources, their display names and provenance labels.

Provenance is ``"real"`` (windows cut from an official trace file) or ``"standin"`` (a labelled
synthetic workload built from the real evidence available). Every table carries a ``provenance``
column and every figure labels sources through :func:`label`, so a stand-in is never shown as real.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SOURCES = ("azure", "burstgpt", "bailian")  # the study's three sources (built in)
PROVENANCES = ("real", "standin")
# A user's own trace is one more entry under ``sources`` (any name matching this pattern) whose
# ``file`` is a path to a file in one of the supported formats; it has no stand-in.
SOURCE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

DISPLAY = {"azure": "Azure", "burstgpt": "BurstGPT", "bailian": "Bailian"}


def label(source: str, provenance: str) -> str:
    """Display label: ``"Azure"`` for a real source, ``"BurstGPT (stand-in)"`` for a stand-in."""
    name = DISPLAY.get(source, source)
    if provenance == "real":
        return name
    if provenance == "standin":
        return f"{name} (stand-in)"
    raise ValueError(f"provenance {provenance!r}: expected one of {PROVENANCES}")


def labels(provenance_by_source: Mapping[str, str]) -> dict[str, str]:
    """``{source: label}`` for every source in ``provenance_by_source``."""
    return {s: label(s, p) for s, p in provenance_by_source.items()}


def provenance_from_manifest(manifest: Mapping) -> dict[str, str]:
    """``{source: "real" | "standin"}`` as recorded in a manifest's windows."""
    out: dict[str, str] = {}
    for w in manifest.get("windows", []):
        prev = out.setdefault(w["source"], w["provenance"])
        if prev != w["provenance"]:
            raise ValueError(f"source {w['source']!r} mixes provenances in the manifest")
    return out
