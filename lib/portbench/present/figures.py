"""The project's one figure helper: consistent style, every figure saved as PNG and PDF, and indexed.

:func:`save` writes byte-reproducible files (no creation date, no software version in the
metadata: the same figure gives the same bytes, so regenerating figures from unchanged results
leaves ``git status`` clean) and records the figure in ``<figures_dir>/index.json`` with the
notebook that made it and a one-line description. :func:`index` reads that index back (the figure
index of ``summary.json`` and notebook 09).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

_STYLED = False
INDEX_FILE = "index.json"
# Metadata that would make two saves of the same figure differ (a timestamp) or tie the bytes to
# the matplotlib version (None removes an entry).
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "Creator": None, "Producer": None}


def style() -> None:
    """Apply the project style once (seaborn whitegrid, readable fonts, tight layout)."""
    global _STYLED
    if _STYLED:
        return
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind")
    plt.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight",
        "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
        "pdf.fonttype": 42,  # editable text in the PDF
    })
    _STYLED = True


def figure(*args, **kwargs):
    """``plt.subplots`` with the project style applied."""
    style()
    return plt.subplots(*args, **kwargs)


def save(fig, name: str, figures_dir: str | Path, *, description: str, notebook: str | None = None,
         close: bool = False) -> dict[str, str]:
    """Save ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf`` and index it; returns both paths.

    ``name`` may contain a sub-folder (``"03_simulate/load_curves"``); the first folder is the
    notebook recorded in the index unless ``notebook`` is given. ``description`` is one line
    saying what the figure shows. The figure stays open (so the notebook shows it) unless ``close``
    is true.
    """
    out = Path(figures_dir)
    paths = {}
    for ext, metadata in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):
        p = out / f"{name}.{ext}"
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, metadata=metadata)
        paths[ext] = str(p)
    folder = Path(name).parent.as_posix()
    _record(out, name, {"name": name, "file": f"{name}.png", "pdf": f"{name}.pdf",
                        "notebook": notebook or (folder if folder != "." else ""),
                        "description": " ".join(description.split())})
    if close:
        plt.close(fig)
    return paths


def _read_index(figures_dir: Path) -> dict[str, dict]:
    p = figures_dir / INDEX_FILE
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except ValueError:  # a damaged index is rebuilt by the next saves
        return {}
    return data if isinstance(data, dict) else {}


def _write_index(figures_dir: Path, idx: dict[str, dict]) -> None:
    from ..data.registry import atomic_write

    text = json.dumps(idx, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write(figures_dir / INDEX_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _record(figures_dir: Path, name: str, entry: dict) -> None:
    idx = _read_index(figures_dir)
    if idx.get(name) != entry:  # an unchanged entry leaves the file untouched
        idx[name] = entry
        _write_index(figures_dir, idx)


def forget(figures_dir: str | Path, notebooks) -> None:
    """Drop the index entries of ``notebooks`` (their figures stay on disk until remade): figures
    made for an earlier analysis are not indexed as if they showed the current one."""
    figures_dir = Path(figures_dir)
    idx = _read_index(figures_dir)
    kept = {k: v for k, v in idx.items() if v.get("notebook") not in set(notebooks)}
    if kept != idx:
        _write_index(figures_dir, kept)


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
            for _, e in sorted(_read_index(figures_dir).items())
            if (figures_dir / e["file"]).is_file() and (figures_dir / e["pdf"]).is_file()]
