"""The results site (``portbench site``, ``make report``) opens from disk in headless Chromium: no console
errors, every image resolves, every link points at a file of the site, the headline comes from summary.json.
Screenshots are kept under build/test-artifacts/."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat
import pytest

import headless
from portbench.present import figures, report, site
from test_report import summary_file  # noqa: F401  (the fixture: a planted analysis' summary.json)

FIGS = {"01_demo/line": "a line over time", "01_demo/bars": "three bars", "02_more/scatter": "a scatter"}


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("href", "src"):
            if a.get(key):
                self.refs.append(a[key])


def _refs(page: Path) -> list[str]:
    p = _Links()
    p.feed(page.read_text())
    return p.refs


def _make_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """Three saved figures of two notebooks, and the two notebooks executed (a heading, a cell, its picture)."""
    fig_dir, nb_dir = tmp_path / "figures", tmp_path / "notebooks"
    for k, (name, description) in enumerate(FIGS.items()):
        fig, ax = figures.figure(figsize=(4, 3))
        ax.plot([0, 1, 2], [k, 2 * k, k])
        ax.set_title(name)
        figures.save(fig, name, fig_dir, description=description, close=True)
    nb_dir.mkdir()
    for nb_name, title in (("01_demo", "01 — Demo"), ("02_more", "02 — More")):
        png = next((fig_dir / nb_name).glob("*.png")).read_bytes()
        cell = nbformat.v4.new_code_cell("plot()", execution_count=1, outputs=[nbformat.v4.new_output(
            "display_data", data={"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"})])
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat it shows."), cell])
        nbformat.write(nb, nb_dir / f"{nb_name}.ipynb")
    return fig_dir, nb_dir


@pytest.fixture(scope="module")
def chromium():
    if headless.browser() is None:
        pytest.fail("no Chromium on PATH: `make browser` installs Debian's chromium (make test does)")


@pytest.mark.slow
def test_site_opens_in_a_headless_browser(tmp_path, summary_file, chromium, root):  # noqa: F811
    summary_path, summary = summary_file
    fig_dir, nb_dir = _make_inputs(tmp_path)
    index = site.build(tmp_path / "report", notebooks_dir=nb_dir, figures_dir=fig_dir, summary_path=summary_path)
    out = index.parent
    assert sorted(p.name for p in (out / "notebooks").iterdir()) == ["01_demo.html", "02_more.html"]

    artefacts = root / "build" / "test-artifacts"
    for page, n_images in (("index.html", len(FIGS)), ("figures.html", len(FIGS))):
        got = headless.open_page(out / page, screenshot=artefacts / f"report_{page.replace('.html', '')}.png")
        assert got.errors == [], f"{page}: {got.errors}"
        assert len(got.images) == n_images and got.broken_images == [], f"{page}: {got.images}"
        # relative links only, each to a file of the site
        for ref in _refs(out / page):
            assert "://" not in ref and not ref.startswith("/"), f"{page}: {ref}"
            assert (out / ref.split("#")[0]).is_file(), f"{page}: {ref} does not resolve"
        assert (artefacts / f"report_{page.replace('.html', '')}.png").stat().st_size > 10_000
    # a notebook page: offline (no remote script), the picture embedded, and no console error either
    nb_page = out / "notebooks" / "01_demo.html"
    assert not [r for r in _refs(nb_page) if "://" in r and not r.startswith("data:")]
    got = headless.open_page(nb_page)
    assert got.errors == [] and len(got.images) == 1 and got.broken_images == []

    text = index.read_text()
    # the headline findings are the README's results block, read from summary.json
    cs = summary["cross_source"]
    assert f"{cs['conditions']['defined']} of {cs['conditions']['total']} conditions defined" in text
    assert f"τ-b {report._num(cs['tau_b'])}" in text
    # every figure links to the notebook that made it, with its description
    for name, description in FIGS.items():
        nb = name.split("/")[0]
        assert f'<a href="notebooks/{nb}.html"><img src="figures/{name}.png"' in text
        assert description in text
        assert f"<code>{name}</code>" in (out / "figures.html").read_text()


def test_site_without_summary_or_notebooks_says_what_to_run(tmp_path):
    fig_dir, _ = _make_inputs(tmp_path)
    index = site.build(tmp_path / "report", notebooks_dir=tmp_path / "none", figures_dir=fig_dir,
                       summary_path=tmp_path / "summary.json")
    text = index.read_text()
    assert "No analysis summary at" in text and "make all" in text
    assert "(no executed notebook)" in text
    # without a notebook page, a thumbnail links to its own picture
    assert '<a href="figures/01_demo/line.png"><img src="figures/01_demo/line.png"' in text


def test_site_keeps_other_files_in_its_folder(tmp_path):
    fig_dir, nb_dir = _make_inputs(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    site.build(out, notebooks_dir=nb_dir, figures_dir=fig_dir, summary_path=tmp_path / "summary.json")
    site.build(out, notebooks_dir=nb_dir, figures_dir=fig_dir, summary_path=tmp_path / "summary.json")
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((fig_dir / "index.json").read_text()).keys() == FIGS.keys()
    plt.close("all")
