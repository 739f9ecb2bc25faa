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
