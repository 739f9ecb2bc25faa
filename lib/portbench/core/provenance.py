"""Source provenance and display labels.

Provenance is ``"real"`` (windows cut from a real trace file: an official one, or a user's own) or
``"standin"`` (a labelled synthetic workload built from the real evidence available). Every table
carries a ``provenance`` column and every figure labels sources through :func:`label`, so a
stand-in is never shown as real. Display names come from the parameters (``sources.<s>.label``,
:attr:`portbench.core.config.Config.display_names`; default: the source's name) -- there is no list
of sources in the code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PROVENANCES = ("real", "standin")
# A source is one entry under ``sources`` (any name matching this pattern).
SOURCE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def label(source: str, provenance: str, names: Mapping[str, str] | None = None) -> str:
    """Display label: the display name (``names[source]``, else the source's name) for a real source,
    ``"<name> (stand-in)"`` for a stand-in."""
    name = (names or {}).get(source) or source
    if provenance == "real":
        return name
    if provenance == "standin":
        return f"{name} (stand-in)"
    raise ValueError(f"provenance {provenance!r}: expected one of {PROVENANCES}")


def labels(provenance_by_source: Mapping[str, str], names: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{source: label}`` for every source in ``provenance_by_source``."""
    return {s: label(s, p, names) for s, p in provenance_by_source.items()}


def provenance_from_manifest(manifest: Mapping) -> dict[str, str]:
    """``{source: "real" | "standin"}`` as recorded in a manifest's windows."""
    out: dict[str, str] = {}
    for w in manifest.get("windows", []):
        prev = out.setdefault(w["source"], w["provenance"])
        if prev != w["provenance"]:
            raise ValueError(f"source {w['source']!r} mixes provenances in the manifest")
    return out
