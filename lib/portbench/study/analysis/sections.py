"""Sections of ``summary.json`` written by later stages (e.g. ``attribution``, notebook 09).

A later stage writes its section with :func:`write_section` to ``{results_dir}/summary_sections/<name>.json``;
:func:`portbench.study.analysis.results.write_summary` adds every section found there to ``summary.json``
(:func:`read_sections`), so rewriting the summary never drops them and they never change the analysis' own
sections (a section may not reuse one of their names).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core import io as fileio
from ...core.errors import DataError

SECTIONS_DIR = "summary_sections"


def sections_dir(results_dir: Path) -> Path:
    return Path(results_dir) / SECTIONS_DIR


def write_section(results_dir: Path, name: str, section: dict) -> Path:
    """Write one section (JSON-ready dict) for ``summary.json``; returns its file."""
    path = sections_dir(results_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_json(path, section)
    return path


def read_sections(results_dir: Path, reserved=()) -> dict:
    """``{name: section}`` of every section file (sorted by name); DataError on a file that is not a JSON
    object or whose name is one of ``reserved`` (the analysis' own sections)."""
    out = {}
    folder = sections_dir(results_dir)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.stem in reserved:
            raise DataError(path, f"section name {path.stem!r} is one of summary.json's own sections")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DataError(path, f"not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise DataError(path, "expected a JSON object")
        out[path.stem] = data
    return out
