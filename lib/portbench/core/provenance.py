"""The three workload sources, their display names and provenance labels.

Provenance is ``"real"`` (windows cut from an official trace file) or ``"standin"`` (a labelled
synthetic workload built from the real evidence available). Every table carries a ``provenance``
column and every figure labels sources through :func:`label`, so a stand-in is never shown as real.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

SOURCES = ("azure", "burstgpt", "bailian")  # the study's three sources (built in)
PROVENANCES = ("real", "standin")
# A user's own trace is one more entry under ``sources`` (any name matching this pattern) whose
# ``file`` is a path to a file in one of the supported formats; it has no stand-in.
SOURCE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

DISPLAY = {"azure": "Azure", "burstgpt": "BurstGPT", "bailian": "Bailian"}


def configured(P: Mapping) -> list[str]:
    """The sources of a parameter set: the built-in ones it lists, in study order, then the user's own."""
    names = [s for s, spec in (P.get("sources") or {}).items() if spec is not None]  # null = left out
    return [s for s in SOURCES if s in names] + [s for s in names if s not in SOURCES]


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


def banner(provenance_by_source: Mapping[str, str], skipped: Iterable[str] = ()) -> str:
    """Markdown banner opening every notebook: which sources are real in this run."""
    rows = [f"| {DISPLAY.get(s, s)} | **{p}** | {label(s, p)} |" for s, p in provenance_by_source.items()]
    rows += [f"| {DISPLAY.get(s, s)} | skipped | no official file and no stand-in |" for s in skipped]
    real = [DISPLAY[s] for s, p in provenance_by_source.items() if p == "real"]
    stand = [DISPLAY[s] for s, p in provenance_by_source.items() if p == "standin"]
    head = f"**Data in this run.** Real: {', '.join(real) or 'none'}."
    if stand:
        head += (f" Stand-in (synthetic, built from the real evidence available): {', '.join(stand)}."
                 " Results for stand-in sources describe the stand-in, not the official trace.")
    return head + "\n\n| source | provenance | shown as |\n|---|---|---|\n" + "\n".join(rows)
