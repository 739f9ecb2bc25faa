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
