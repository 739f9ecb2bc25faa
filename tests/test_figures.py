"""The figure helper: byte-reproducible PNG/PDF files and the figure index."""

from __future__ import annotations

import json
import time

import matplotlib.pyplot as plt

from portbench.present import figures


def _draw():
    fig, ax = figures.figure(figsize=(4, 3))
    ax.plot([0, 1, 2], [1, 3, 2], label="a line")
    ax.set_xlabel("x (s)")
    ax.set_ylabel("y (requests)")
    ax.set_title("same figure, saved twice")
    ax.legend()
    return fig


def test_same_figure_saves_to_identical_bytes(tmp_path):
    fig = _draw()
    first = figures.save(fig, "nb/plot", tmp_path / "a", description="a test figure")
    time.sleep(1.1)  # a creation date in the metadata would now differ
    second = figures.save(fig, "nb/plot", tmp_path / "b", description="a test figure")
    plt.close(fig)
    other = _draw()  # the same figure drawn again from scratch
    third = figures.save(other, "nb/plot", tmp_path / "c", description="a test figure", close=True)
    for ext in ("png", "pdf"):
        data = open(first[ext], "rb").read()
        assert data == open(second[ext], "rb").read() == open(third[ext], "rb").read(), ext
    pdf = open(first["pdf"], "rb").read()
    assert b"CreationDate" not in pdf and b"Matplotlib" not in pdf
    assert b"Matplotlib" not in open(first["png"], "rb").read(), "no software version in the PNG metadata"


def test_save_indexes_every_figure_with_notebook_and_description(tmp_path):
    d = tmp_path / "figs"
    for name, text in (("01_ingest/rates", "request  rate\nper bin"), ("05_cross_region/bump", "bump chart")):
        figures.save(_draw(), name, d, description=text, close=True)
    idx = json.loads((d / figures.INDEX_FILE).read_text())
    assert idx["01_ingest/rates"] == {"name": "01_ingest/rates", "file": "01_ingest/rates.png",
                                      "pdf": "01_ingest/rates.pdf", "notebook": "01_ingest",
                                      "description": "request rate per bin"}
    before = (d / figures.INDEX_FILE).read_bytes()
    figures.save(_draw(), "01_ingest/rates", d, description="request rate per bin", close=True)
    assert (d / figures.INDEX_FILE).read_bytes() == before, "re-saving a figure leaves the index unchanged"

    listed = figures.index(d, root=tmp_path)
    assert [e["name"] for e in listed] == ["01_ingest/rates", "05_cross_region/bump"]
    assert listed[0]["file"] == "figs/01_ingest/rates.png" and (tmp_path / listed[0]["pdf"]).is_file()
    assert figures.index(d)[0]["file"] == str((d / "01_ingest/rates.png").resolve()), "absolute without a root"

    figures.forget(d, ["05_cross_region"])
    assert [e["name"] for e in figures.index(d)] == ["01_ingest/rates"]
    (d / "01_ingest/rates.png").unlink()
    assert figures.index(d) == [], "a figure whose file is gone is not listed"


def test_measured_figures_are_indexed_apart_from_the_committed_index(tmp_path):
    """A measured figure (engine timings, different bytes on every run) goes to its folder's own index, never
    to the top index that the repository commits; :func:`figures.index` lists both."""
    import pytest

    from portbench.core import figindex

    d = tmp_path / "figs"
    figures.save(_draw(), "04_cross_workload/tau", d, description="reproducible", close=True)
    figures.save(_draw(), "08_gpu_validation/timing", d, description="measured", measured=True, close=True)
    top = json.loads((d / figures.INDEX_FILE).read_text())
    sub = json.loads((d / "08_gpu_validation" / figures.INDEX_FILE).read_text())
    assert list(top) == ["04_cross_workload/tau"] and "measured" not in top["04_cross_workload/tau"]
    assert list(sub) == ["08_gpu_validation/timing"] and sub["08_gpu_validation/timing"]["measured"] is True
    assert [(e["name"], e.get("measured", False)) for e in figures.index(d)] == [
        ("04_cross_workload/tau", False), ("08_gpu_validation/timing", True)]
    # an entry lives in one index only: a figure saved measured after an unmarked save leaves the top index
    figures.save(_draw(), "08_gpu_validation/fit", d, description="first unmarked", close=True)
    assert "08_gpu_validation/fit" in figindex.read_index(d)
    figures.save(_draw(), "08_gpu_validation/fit", d, description="now measured", measured=True, close=True)
    assert "08_gpu_validation/fit" not in figindex.read_index(d)
    assert figindex.read_all(d)["08_gpu_validation/fit"]["measured"] is True
    figures.forget(d, ["08_gpu_validation"])
    assert [e["name"] for e in figures.index(d)] == ["04_cross_workload/tau"]
    with pytest.raises(ValueError, match="give it a folder"):
        figures.save(_draw(), "loose", d, description="measured without a folder", measured=True, close=True)


def test_validation_figures_are_measured_and_stay_out_of_the_committed_index(tmp_path):
    """The real-engine verdicts' figures (paired effects, A/A pairs) are measurements: saved under the notebook's
    folder, indexed there, never in the committed index; nothing is drawn without data."""
    from portbench.core import figindex
    from portbench.present import plots_validation as plots

    case = {"id": "key", "pair": ["sarathi", "rr"], "metric": "ttft_p90", "region": "overload",
            "sources": ["azure", "mooncake"], "effect": {"azure": 0.3, "mooncake": -0.2},
            "ci": {"azure": [0.1, 0.5], "mooncake": [-0.4, 0.0]}, "verdict": "holds",
            "prediction": {"azure": {"effect": 0.25}, "mooncake": {"effect": -0.3}}}
    d = tmp_path / "figs"
    assert plots.effects_figure({"cases": []}, d) is None
    _, paths = plots.effects_figure({"cases": [case], "planted": {"detected": None}}, d)
    assert paths["png"].endswith("paired_effects.png") and (d / plots.FOLDER / "paired_effects.pdf").is_file()
    assert figindex.read_index(d) == {}, "validation figures are measurements: not in the committed index"
    assert {e["name"] for e in figures.index(d)} == {f"{plots.FOLDER}/paired_effects"}
    assert plots.aa_figure(None, {"cases": [case]}, d) is None
    plt.close("all")


def _git(root, *args, ok=(0,)) -> list[str]:
    import subprocess

    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    assert r.returncode in ok, r.stderr
    return [line for line in r.stdout.splitlines() if line]


def test_every_committed_figure_is_indexed_and_every_indexed_figure_exists(root):
    """The committed figures and the committed index agree: a tracked file under figures/ that the index does
    not list is stale (no notebook writes it any more: `git rm` it), an index entry whose files are missing or
    ignored by git would be absent from a fresh clone, and no tracked file is ignored (measured figures, e.g.
    notebook 08's, are not committed: `git rm --cached` them)."""
    import shutil
    import subprocess

    import pytest

    from portbench import params
    from portbench.core import figindex

    if shutil.which("git") is None or subprocess.run(["git", "rev-parse"], cwd=root, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    figs = params.load().paths.figures_dir
    rel = figs.resolve().relative_to(root.resolve()).as_posix()
    idx = figindex.read_index(figs)
    assert idx, f"{rel}/{figindex.INDEX_FILE} is missing or empty"
    assert not [n for n, e in idx.items() if e.get("measured")], "measured figures in the committed index"
    listed = {f"{rel}/{e[k]}" for e in idx.values() for k in ("file", "pdf")}
    ignored_tracked = _git(root, "ls-files", "--cached", "--ignored", "--exclude-standard", "--", rel)
    assert not ignored_tracked, f"tracked files that .gitignore excludes (git rm --cached them): {ignored_tracked}"
    tracked = set(_git(root, "ls-files", "--", rel)) - {f"{rel}/{figindex.INDEX_FILE}"}
    stale = sorted(tracked - listed)
    assert not stale, f"tracked figures that no notebook indexes (stale; git rm them): {stale}"
    missing = sorted(p for p in listed if not (root / p).is_file())
    assert not missing, f"indexed figures whose files are missing: {missing}"
    ignored_listed = _git(root, "check-ignore", "--no-index", *sorted(listed), ok=(0, 1)) if listed else []
    assert not ignored_listed, f"indexed figures in a folder git ignores: {ignored_listed}"


# --------------------------------------------------------------------------------------------
# The schedulers' palette and the bump chart's labels (issue #41 item 3)
# --------------------------------------------------------------------------------------------

BUILT_IN = ("fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "srpt_oracle", "sjf_predicted", "ltr", "mlfq", "las", "rr",
            "edf", "vtc", "random")


def _lab(rgb):
    from matplotlib.colors import to_rgb
    import numpy as np

    c = np.array(to_rgb(rgb))
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_palette_tells_the_thirteen_schedulers_apart_and_keeps_families_together():
    import numpy as np

    sty = figures.scheduler_styles(BUILT_IN)
    # every scheduler its own (colour, marker, line) and no two colours closer than a visible step (CIE Lab)
    assert len({(tuple(np.round(s["color"], 3)), s["marker"], str(s["linestyle"])) for s in sty.values()}) == 13
    dist = {(a, b): float(np.linalg.norm(_lab(sty[a]["color"]) - _lab(sty[b]["color"])))
            for a in BUILT_IN for b in BUILT_IN if a < b}
    close = {k: round(v, 1) for k, v in dist.items() if v < 10}
    assert not close, f"schedulers drawn in colours too alike: {close}"
    # members of a family differ by lightness and marker, not hue: same family, same hue angle within a few degrees
    for fam, (_, members) in figures.SCHEDULER_FAMILIES.items():
        here = [m for m in members if m in sty]
        hues = [float(np.degrees(np.arctan2(*_lab(sty[m]["color"])[[2, 1]]))) for m in here]
        assert max(hues) - min(hues) < 20, (fam, hues)
        assert len({sty[m]["marker"] for m in here}) == len(here)
    # a plug-in gets the reserved colour, far from every built-in, and two plug-ins differ by marker
    mine = figures.scheduler_styles([*BUILT_IN, "aging_sjf", "lpf"])
    assert mine["aging_sjf"]["color"] == mine["lpf"]["color"] and mine["aging_sjf"]["marker"] != mine["lpf"]["marker"]
    nearest = min(float(np.linalg.norm(_lab(mine["aging_sjf"]["color"]) - _lab(sty[b]["color"]))) for b in BUILT_IN)
    assert nearest > 25, f"the plug-in colour is {nearest:.0f} Lab units from a built-in's"
    assert figures.scheduler_order(["aging_sjf", "random", "fcfs", "las"]) == ["fcfs", "las", "random", "aging_sjf"]


def test_bump_chart_labels_do_not_overlap_even_when_every_scheduler_ties(tmp_path):
    """The real bump chart, on planted rankings where the end ranks crowd (all 13 tied in the last region on one
    metric, six tied at the top on another): no two end labels overlap and every label stays inside its axes."""
    from types import SimpleNamespace

    import polars as pl

    from portbench.present import plots_analysis

    regions, metrics = ["light", "severe"], ["ttft_p90", "tpot_p90"]
    rows = []
    for m in metrics:
        for i, k in enumerate(BUILT_IN):
            end = 7.0 if m == "ttft_p90" else (3.5 if i < 6 else i + 1.0)
            rows += [("azure", m, "light", k, float(i + 1)), ("azure", m, "severe", k, end)]
    rankings = pl.DataFrame(rows, schema=["source", "metric", "region", "scheduler", "rank"], orient="row")

    class FakeAnalysis(SimpleNamespace):
        def __getitem__(self, key):
            return {"rankings": rankings}[key]

    A = FakeAnalysis(labels={"azure": "Azure"}, summary={
        "parameters": {"regions": regions, "schedulers": list(BUILT_IN), "metrics": metrics, "ties": "significance",
                       "tie_correction": "fdr_bh", "alpha": 0.05},
        "data": {"rho": {"light": 0.3, "severe": 2.0}}})
    (fig,) = plots_analysis.bump_charts(SimpleNamespace(figures_dir=tmp_path), A, metrics=metrics)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_text() in BUILT_IN]
        if not labels:
            continue
        assert len(labels) == 13
        boxes = [t.get_window_extent(renderer) for t in labels]
        inside = ax.get_window_extent(renderer)
        for i, a in enumerate(boxes):
            assert inside.y0 <= a.y0 and a.y1 <= inside.y1, f"{labels[i].get_text()} leaves the axes"
            for j in range(i):
                assert not a.overlaps(boxes[j]), f"{labels[i].get_text()} overlaps {labels[j].get_text()}"
        colours = {t.get_text(): t.get_color() for t in labels}
        assert colours["fcfs"] != colours["random"] and colours["las"] != colours["rr"]
    assert fig._suptitle is not None and fig._suptitle.get_text()
    plt.close(fig)


def test_every_plotting_function_gives_its_figure_a_title(root):
    """Static check over present/plots_*.py: a function that makes a figure (``figure(…)`` / ``figures.figure(…)``)
    titles it (``suptitle``, ``set_title`` or ``title=``), so that no figure reaches the site untitled."""
    import ast

    untitled = []
    for path in sorted((root / "lib" / "portbench" / "present").glob("plots_*.py")):
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.FunctionDef):
                continue
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)]
            makes = any((isinstance(c.func, ast.Attribute) and c.func.attr == "figure"
                         and isinstance(c.func.value, ast.Name) and c.func.value.id == "figures")
                        or (isinstance(c.func, ast.Name) and c.func.id == "figure") for c in calls)
            titled = any((isinstance(c.func, ast.Attribute) and c.func.attr in ("suptitle", "set_title"))
                         or any(k.arg == "title" for k in c.keywords) for c in calls)
            if makes and not titled:
                untitled.append(f"{path.name}:{node.name}")
    assert not untitled, f"figures made without a title: {untitled}"


def test_across_hardware_figure_names_profiles_and_sources_by_their_labels(tmp_path):
    """The across-hardware figure on a planted block: every y tick is a display label (a profile's ``label`` from
    hardware_profiles.yaml, a source's display name), none a raw id (``a100_40gb_…``, ``azure_code``)."""
    from types import SimpleNamespace

    from portbench.present import plots_robustness

    c = {"value": 0.9, "ci": [0.85, 0.95], "n": 100}
    prof = {n: {"name": n, "label": lab, "concordance": {"across_sources": c, "across_regions": c}}
            for n, lab in (("a100_40gb_llama3_1_8b", "A100-40GB · Llama-3.1-8B"), ("h100_80gb_llama2_7b", "H100-80GB · Llama-2-7B"))}
    summary = {"across_hardware": {"available": True, "across_hardware": c, "profiles": prof,
                                   "by_profile_pair": {"a100_40gb_llama3_1_8b vs h100_80gb_llama2_7b": c},
                                   "by_source": {"azure": c, "azure_code": c}}}
    fig = plots_robustness.across_hardware(SimpleNamespace(figures_dir=tmp_path), summary,
                                           {"azure": "Azure", "azure_code": "Azure code"})
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    plt.close(fig)
    assert "A100-40GB · Llama-3.1-8B vs H100-80GB · Llama-2-7B" in ticks and "Azure code (all pairs)" in ticks
    assert "H100-80GB · Llama-2-7B" in ticks
    assert not [t for t in ticks if "_" in t], ticks


def test_in_a_notebook_kernel_save_shows_the_saved_png_once_and_closes_the_figure(tmp_path, monkeypatch):
    """With the inline backend in a kernel, save displays the PNG it wrote (at the inline backend's size: figure.dpi /
    savefig.dpi of its width) and closes the figure, so the backend does not render it again; elsewhere the figure
    stays open and nothing is displayed."""
    import sys
    from types import SimpleNamespace

    import matplotlib

    shown = []
    fake = SimpleNamespace(display=lambda obj: shown.append(obj),
                           Image=lambda data, format, width: SimpleNamespace(data=data, format=format, width=width))
    fig = _draw()
    monkeypatch.delitem(sys.modules, "IPython.display", raising=False)
    figures.save(fig, "nb/plain", tmp_path, description="outside a kernel")
    assert not shown and plt.fignum_exists(fig.number)                      # a script: left open, nothing shown
    monkeypatch.setitem(sys.modules, "IPython.display", fake)
    monkeypatch.setattr(matplotlib, "get_backend", lambda: "module://matplotlib_inline.backend_inline")
    paths = figures.save(fig, "nb/shown", tmp_path, description="in a kernel")
    assert len(shown) == 1 and shown[0].data == open(paths["png"], "rb").read()
    width_px = int.from_bytes(shown[0].data[16:20], "big")
    assert shown[0].width == round(width_px * plt.rcParams["figure.dpi"] / plt.rcParams["savefig.dpi"]) < width_px
    assert not plt.fignum_exists(fig.number)
