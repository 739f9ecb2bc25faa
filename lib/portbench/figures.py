"""The project's one figure helper: consistent style, every figure saved as PNG and PDF."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

_STYLED = False


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


def save(fig, name: str, figures_dir: str | Path, *, close: bool = False) -> dict[str, str]:
    """Save ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf``; returns both paths.

    ``name`` may contain a sub-folder (``"03_simulate/load_curves"``). The figure stays open
    (so the notebook shows it) unless ``close`` is true.
    """
    out = Path(figures_dir)
    paths = {}
    for ext in ("png", "pdf"):
        p = out / f"{name}.{ext}"
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p)
        paths[ext] = str(p)
    if close:
        plt.close(fig)
    return paths
