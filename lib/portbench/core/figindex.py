"""The index of saved figures, ``<figures_dir>/index.json``: which notebook made each figure and what it
shows (written by :func:`portbench.present.figures.save`, read into ``summary.json`` and notebook 09).

Plain JSON, no plotting library: the compute layers may read and prune it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from . import io

INDEX_FILE = "index.json"


def read_index(figures_dir: str | Path) -> dict[str, dict]:
    """``{name: entry}`` of the index ({} when absent or damaged: the next saves rebuild it)."""
    p = Path(figures_dir) / INDEX_FILE
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def write_index(figures_dir: str | Path, idx: dict[str, dict]) -> None:
    io.write_text(Path(figures_dir) / INDEX_FILE, json.dumps(idx, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def record(figures_dir: str | Path, name: str, entry: dict) -> None:
    """Add or update one entry (an unchanged entry leaves the file untouched)."""
    idx = read_index(figures_dir)
    if idx.get(name) != entry:
        idx[name] = entry
        write_index(figures_dir, idx)


def forget(figures_dir: str | Path, notebooks: Iterable[str]) -> None:
    """Drop the index entries of ``notebooks`` (their figures stay on disk until remade): figures
    made for an earlier analysis are not indexed as if they showed the current one."""
    idx = read_index(figures_dir)
    drop = set(notebooks)
    kept = {k: v for k, v in idx.items() if v.get("notebook") not in drop}
    if kept != idx:
        write_index(figures_dir, kept)


def index(figures_dir: str | Path, root: str | Path | None = None) -> list[dict]:
    """The figures saved under ``figures_dir`` whose PNG and PDF exist, sorted by name:
    ``[{name, file, pdf, notebook, description}]``, ``file``/``pdf`` relative to ``root`` when
    they lie under it (else absolute)."""
    figures_dir = Path(figures_dir)

    def where(rel: str) -> str:
        p = (figures_dir / rel).resolve()
        if root is not None and p.is_relative_to(Path(root).resolve()):
            return p.relative_to(Path(root).resolve()).as_posix()
        return str(p)

    return [{**e, "file": where(e["file"]), "pdf": where(e["pdf"])}
            for _, e in sorted(read_index(figures_dir).items())
            if (figures_dir / e["file"]).is_file() and (figures_dir / e["pdf"]).is_file()]
