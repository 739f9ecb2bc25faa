"""The index of saved figures, ``<figures_dir>/index.json``: which notebook made each figure and what it
shows (written by :func:`portbench.present.figures.save`, read into ``summary.json`` and notebook 10).

A figure saved as a *measurement* (``measured=True``: it shows timings of the machine it ran on, e.g.
notebook 08's vLLM validation, so its bytes differ from run to run) is indexed apart, in an ``index.json``
in its own folder (``<figures_dir>/08_gpu_validation/index.json``), with ``"measured": true``. The top
index, which the repository commits, then depends only on reproducible figures; :func:`index` lists both.

Plain JSON, no plotting library: the compute layers may read and prune it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from . import io

INDEX_FILE = "index.json"


def _read(p: Path) -> dict[str, dict]:
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _write(p: Path, idx: dict[str, dict]) -> None:
    io.write_text(p, json.dumps(idx, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def _measured_files(figures_dir: Path) -> list[Path]:
    """The index files of measured figures (one per folder that holds any), sorted."""
    top = figures_dir / INDEX_FILE
    return sorted(p for p in figures_dir.rglob(INDEX_FILE) if p != top) if figures_dir.is_dir() else []


def measured_index_path(figures_dir: str | Path, name: str) -> Path:
    """Where a measured figure ``name`` is indexed: ``index.json`` in the figure's own folder."""
    folder = Path(name).parent
    if folder == Path("."):
        raise ValueError(f"measured figure {name!r}: give it a folder (e.g. '08_gpu_validation/{name}'), its index "
                         "lives there, apart from the top index")
    return Path(figures_dir) / folder / INDEX_FILE


def read_index(figures_dir: str | Path) -> dict[str, dict]:
    """``{name: entry}`` of the top index, the reproducible figures ({} when absent or damaged: the next saves
    rebuild it)."""
    return _read(Path(figures_dir) / INDEX_FILE)


def read_all(figures_dir: str | Path) -> dict[str, dict]:
    """``{name: entry}`` of every figure: the top index and the measured figures' indexes."""
    figures_dir = Path(figures_dir)
    out = read_index(figures_dir)
    for p in _measured_files(figures_dir):
        out.update(_read(p))
    return out


def write_index(figures_dir: str | Path, idx: dict[str, dict]) -> None:
    _write(Path(figures_dir) / INDEX_FILE, idx)


def record(figures_dir: str | Path, name: str, entry: dict, *, measured: bool = False) -> None:
    """Add or update one entry (an unchanged entry leaves the file untouched); a ``measured`` figure goes to
    its folder's index with ``"measured": true`` (and leaves the top index)."""
    figures_dir = Path(figures_dir)
    top = figures_dir / INDEX_FILE
    if measured:
        here, other = measured_index_path(figures_dir, name), top
        entry = {**entry, "measured": True}
    else:
        here = top
        folder = Path(name).parent
        other = figures_dir / folder / INDEX_FILE if folder != Path(".") else None
    idx = _read(here)
    if idx.get(name) != entry:
        idx[name] = entry
        _write(here, idx)
    if other is not None and other.is_file():      # a figure is indexed in one place only
        old = _read(other)
        if name in old:
            del old[name]
            _write(other, old)


def forget_where(figures_dir: str | Path, drop: Callable[[str, dict], bool]) -> None:
    """Drop every entry (top and measured indexes) for which ``drop(name, entry)`` is true."""
    figures_dir = Path(figures_dir)
    for p in [figures_dir / INDEX_FILE, *_measured_files(figures_dir)]:
        idx = _read(p)
        kept = {k: v for k, v in idx.items() if not drop(k, v)}
        if kept != idx:
            _write(p, kept)


def forget(figures_dir: str | Path, notebooks: Iterable[str]) -> None:
    """Drop the index entries of ``notebooks`` (their figures stay on disk until remade): figures
    made for an earlier analysis are not indexed as if they showed the current one."""
    gone = set(notebooks)
    forget_where(figures_dir, lambda _name, e: e.get("notebook") in gone)


def index(figures_dir: str | Path, root: str | Path | None = None) -> list[dict]:
    """The figures saved under ``figures_dir`` (top and measured indexes) whose PNG and PDF exist, sorted by
    name: ``[{name, file, pdf, notebook, description[, measured]}]``, ``file``/``pdf`` relative to ``root`` when
    they lie under it (else absolute)."""
    figures_dir = Path(figures_dir)

    def where(rel: str) -> str:
        p = (figures_dir / rel).resolve()
        if root is not None and p.is_relative_to(Path(root).resolve()):
            return p.relative_to(Path(root).resolve()).as_posix()
        return str(p)

    return [{**e, "file": where(e["file"]), "pdf": where(e["pdf"])}
            for _, e in sorted(read_all(figures_dir).items())
            if (figures_dir / e["file"]).is_file() and (figures_dir / e["pdf"]).is_file()]
