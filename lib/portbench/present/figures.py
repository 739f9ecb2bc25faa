"""The project's one figure helper: consistent style, every figure saved as PNG and PDF, and indexed.

:func:`save` writes byte-reproducible files (no creation date, no software version in the
metadata: the same figure gives the same bytes, so regenerating figures from unchanged results
leaves ``git status`` clean) and records the figure in ``<figures_dir>/index.json`` with the
notebook that made it and a one-line description (:mod:`portbench.core.figindex`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import matplotlib
import matplotlib.colors as mcolors
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


# --------------------------------------------------------------------------------------------
# One palette for the schedulers, used by every figure that draws one line or mark per scheduler: each family
# (what its decisions rest on) has a hue, its members differ by lightness and marker, and a scheduler that is none of
# the built-ins (a user's plug-in) gets the reserved colour, which no built-in uses.
# --------------------------------------------------------------------------------------------

SCHEDULER_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    # family: (hue, members, darkest first)
    "arrival order": ("#1f5fa8", ("fcfs", "sarathi")),
    "prompt / true length": ("#2e8b3a", ("sjf_prompt", "sjf_oracle", "srpt_oracle", "edf_oracle")),
    "predicted length": ("#d9760b", ("sjf_predicted", "ltr", "edf", "sjf_noisy_oracle", "ltr_noisy_oracle",
                                     "edf_noisy_oracle")),
    "attained service": ("#6a3d9a", ("mlfq", "las", "rr")),
    "tenant fairness": ("#8c564b", ("vtc",)),
    "baseline": ("#6b6b6b", ("random",)),
}
PLUGIN_COLOR = "#e7298a"     # reserved for schedulers that are not built in (a user's plug-in): no built-in is pink
PLUGIN_MARKERS = ("*", "P", "X", "h")
_MEMBER_MARKERS = ("o", "s", "^", "D", "v", "p")
_MEMBER_LIGHTNESS = (0.0, 0.32, -0.45, 0.18, -0.25, 0.45)   # 0 = the hue; > 0 towards white, < 0 towards black
_MEMBER_LINES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)))


def _lighten(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` moved ``amount`` of the way towards white (``amount`` < 0: towards black)."""
    r, g, b = mcolors.to_rgb(color)
    if amount < 0:
        return (r * (1 + amount), g * (1 + amount), b * (1 + amount))
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def scheduler_family(name: str) -> str | None:
    """The built-in family of a scheduler, or None for one that is not built in (a plug-in)."""
    return next((f for f, (_, members) in SCHEDULER_FAMILIES.items() if name in members), None)


def scheduler_style(name: str, plugins: Iterable[str] = ()) -> dict:
    """``{color, marker, family}`` of a scheduler: its family's hue at its member's lightness and marker; a
    scheduler outside the built-in families (a plug-in) the reserved :data:`PLUGIN_COLOR`, its marker by its place
    in ``plugins`` (the plug-ins of the figure, in order)."""
    fam = scheduler_family(name)
    if fam is None:
        plugins = list(plugins)
        k = plugins.index(name) if name in plugins else 0
        return {"color": _lighten(PLUGIN_COLOR, 0.35 * (k // len(PLUGIN_MARKERS))), "marker": PLUGIN_MARKERS[
            k % len(PLUGIN_MARKERS)], "linestyle": "-", "family": "your plug-in"}
    hue, members = SCHEDULER_FAMILIES[fam]
    i = members.index(name)
    return {"color": _lighten(hue, _MEMBER_LIGHTNESS[i % len(_MEMBER_LIGHTNESS)]),
            "marker": _MEMBER_MARKERS[i % len(_MEMBER_MARKERS)], "linestyle": _MEMBER_LINES[i % len(_MEMBER_LINES)],
            "family": fam}


def scheduler_order(names: Iterable[str]) -> list[str]:
    """The schedulers in the palette's order (family by family, members in order, plug-ins last): legends read by
    family."""
    names = list(names)
    rank = {m: (i, j) for i, (_, (_, members)) in enumerate(SCHEDULER_FAMILIES.items()) for j, m in enumerate(members)}
    return sorted(names, key=lambda n: rank.get(n, (len(SCHEDULER_FAMILIES), names.index(n))))


def scheduler_styles(names: Iterable[str]) -> dict[str, dict]:
    """:func:`scheduler_style` of every scheduler of a figure (the plug-ins numbered in the order given)."""
    names = list(names)
    plugins = [n for n in names if scheduler_family(n) is None]
    return {n: scheduler_style(n, plugins) for n in names}


def figure(*args, **kwargs):
    """``plt.subplots`` with the project style applied."""
    style()
    return plt.subplots(*args, **kwargs)


def save(fig, name: str, figures_dir: str | Path, *, description: str, notebook: str | None = None,
         close: bool = False, measured: bool = False) -> dict[str, str]:
    """Save ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf`` and index it; returns both paths.

    ``name`` may contain a sub-folder (``"03_simulate/load_curves"``); the first folder is the
    notebook recorded in the index unless ``notebook`` is given. ``description`` is one line
    saying what the figure shows. Unless ``close`` is true the figure is shown: in a notebook kernel
    with matplotlib's inline backend as the PNG just saved (:func:`_show_saved`), elsewhere by leaving it open.
    ``measured``: the figure shows timings of this machine (its bytes differ from run to run);
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
    if close or _show_saved(Path(paths["png"])):
        plt.close(fig)
    return paths


def _show_saved(png: Path) -> bool:
    """In a notebook kernel drawing with matplotlib's inline backend, show the PNG just saved -- at the size the
    inline backend would give the figure (``figure.dpi`` / ``savefig.dpi``) -- and answer True (the caller closes
    the figure): the inline backend would render the figure a third time at the end of the cell (text layout
    dominates a figure's cost: ~1 s for a heatmap with annotations). Elsewhere (a script, the tests, the validation
    process) False and nothing happens. Uses IPython only where the kernel has loaded it."""
    ipd = sys.modules.get("IPython.display")
    if ipd is None or "inline" not in str(matplotlib.get_backend()).lower():
        return False
    data = png.read_bytes()
    width_px = int.from_bytes(data[16:20], "big")                    # the PNG header's IHDR width
    scale = float(plt.rcParams["figure.dpi"]) / float(plt.rcParams["savefig.dpi"])
    ipd.display(ipd.Image(data=data, format="png", width=max(1, round(width_px * scale))))
    return True
