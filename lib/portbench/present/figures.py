"""The project's one figure helper: consistent style, every figure saved as PNG and PDF, and indexed.

:func:`save` writes byte-reproducible files (no creation date, no software version in the
metadata: the same figure gives the same bytes, so regenerating figures from unchanged results
leaves ``git status`` clean) and records the figure in ``<figures_dir>/index.json`` with the
notebook that made it and a one-line description (:mod:`portbench.core.figindex`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

from ..core import figindex, outputs
from ..core.figindex import INDEX_FILE, forget, index  # noqa: F401  (the figure index, re-exported)

_STYLED = False
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
         close: bool = False, measured: bool = False) -> dict[str, str]:
    """Save ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf`` and index it; returns both paths.

    ``name`` may contain a sub-folder (``"03_simulate/load_curves"``); the first folder is the
    notebook recorded in the index unless ``notebook`` is given. ``description`` is one line
    saying what the figure shows. The figure stays open (so the notebook shows it) unless ``close``
    is true. ``measured``: the figure shows timings of this machine (its bytes differ from run to run);
    it is indexed in its folder's own ``index.json``, not the committed top index (:mod:`~portbench.core.figindex`).
    """
    out = Path(figures_dir)
    paths = {}
    for ext, metadata in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):
        p = out / f"{name}.{ext}"
        outputs.check_write(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, metadata=metadata)
        outputs.record(p)
        paths[ext] = str(p)
    folder = Path(name).parent.as_posix()
    figindex.record(out, name, {"name": name, "file": f"{name}.png", "pdf": f"{name}.pdf",
                        "notebook": notebook or (folder if folder != "." else ""),
                        "description": " ".join(description.split())}, measured=measured)
    if close:
        plt.close(fig)
    return paths
