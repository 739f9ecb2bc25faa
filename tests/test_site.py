"""The results site (``portbench site``, ``make report``; built by MkDocs) opens from disk in headless Chromium: no
console errors, every image resolves, no broken internal link on any page, the first screen (1400 x 900) shows the
one-sentence verdict and a figure, the findings and the contact sheet come from summary.json and the figure index,
claim reports are linked and kept. Screenshots are kept under build/test-artifacts/."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import matplotlib.pyplot as plt
import nbformat
import pytest

import headless
from portbench.present import figures, report, site
from test_report import summary_file  # noqa: F401  (the fixture: a planted analysis' summary.json)

FIGS = {"04_cross_workload/what_ports": "what ports: concordance across sources and regions",
        "04_cross_workload/tau_forest": "a forest of tau-b",
        "06_reversals/reversal_concentration": "reversals per metric and region",
        "01_ingest/rates": "request rate over time"}
NOTEBOOKS = (("01_ingest", "01 — Ingest"), ("04_cross_workload", "04 — What ports"))


class _Refs(HTMLParser):
    """Every href / src of a page, and every id on it."""

    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("href", "src"):
            if a.get(key):
                self.refs.append(a[key])
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])


def _parse(page: Path) -> _Refs:
    p = _Refs()
    p.feed(page.read_text(errors="replace"))
    return p


def broken_links(site_dir: Path) -> list[str]:
    """Every internal link of every page of the site that does not resolve: ``page: ref`` (a missing file, or an
    anchor that the target page does not have). Links off the site (``http(s)``, ``mailto``, ``data``) are left out;
    a link that leaves the site's folder counts as broken."""
    pages = {p: _parse(p) for p in site_dir.rglob("*.html")}
    bad = []
    for page, parsed in pages.items():
        for ref in parsed.refs:
            u = urlsplit(ref)
            if u.scheme or ref.startswith("//") or ref.startswith("javascript:"):
                continue
            target = (page.parent / unquote(u.path)).resolve() if u.path else page
            if site_dir.resolve() not in (target, *target.parents):
                bad.append(f"{page.relative_to(site_dir)}: {ref} (leaves the site)")
                continue
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                bad.append(f"{page.relative_to(site_dir)}: {ref}")
            elif u.fragment and target.suffix == ".html" and unquote(u.fragment) not in pages.get(
                    target, _parse(target)).ids:
                bad.append(f"{page.relative_to(site_dir)}: {ref} (no such anchor)")
    return bad


def _make_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """Saved figures of three notebooks, and two notebooks executed (a heading, a cell, its picture)."""
    fig_dir, nb_dir = tmp_path / "figures", tmp_path / "notebooks"
    for k, (name, description) in enumerate(FIGS.items()):
        fig, ax = figures.figure(figsize=(8, 4.5))
        ax.plot([0, 1, 2], [k, 2 * k, k])
        ax.set_title(name)
        figures.save(fig, name, fig_dir, description=description, close=True)
    nb_dir.mkdir()
    for nb_name, title in NOTEBOOKS:
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


# The first screen: where the verdict and the first figure are, and how much of the figure is in view.
FIRST_SCREEN_JS = """(() => {
  const v = document.querySelector('.verdict'), img = document.querySelector('article img');
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom, width: b.width}; };
  return {verdict: v ? v.textContent : null, verdict_box: v ? r(v) : null,
          img: img ? img.getAttribute('src') : null, img_box: img ? r(img) : null,
          img_ok: img ? img.complete && img.naturalWidth > 0 : false, inner: [innerWidth, innerHeight]};
})()"""


@pytest.mark.slow
def test_site_opens_in_a_headless_browser(tmp_path, summary_file, chromium, root):  # noqa: F811
    summary_path, summary = summary_file
    fig_dir, nb_dir = _make_inputs(tmp_path)
    out = tmp_path / "report"
    (out / "claims").mkdir(parents=True)
    (out / "claims" / "my_claim.html").write_text("<!DOCTYPE html><html><head><title>c</title></head><body>c</body></html>")
    index = site.build(out, notebooks_dir=nb_dir, figures_dir=fig_dir, summary_path=summary_path)
    assert index == out / "index.html"
    assert sorted(p.name for p in (out / "notebooks").glob("*.html")) == ["01_ingest.html", "04_cross_workload.html"]
    assert (out / "claims" / "my_claim.html").is_file(), "the claim reports stay"

    # no broken internal link anywhere: the generated pages, the documentation, the notebooks, the theme's files
    assert broken_links(out) == []

    artefacts = root / "build" / "test-artifacts"
    pages = ("index.html", "figures.html", "results.html", "claims.html", "getting-started.html",
             "notebooks/04_cross_workload.html")
    for page in pages:
        shot = artefacts / f"report_{page.replace('/', '_').replace('.html', '')}.png"
        got = headless.open_page(out / page, screenshot=shot, width=1400, height=900)
        assert got.errors == [], f"{page}: {got.errors}"
        assert got.broken_images == [], f"{page}: {got.broken_images}"
        assert shot.stat().st_size > 10_000

    # the first screen (1400 x 900): the verdict, and a figure with most of its height in view
    first = headless.open_page(out / "index.html", width=1400, height=900, evaluate=FIRST_SCREEN_JS).value
    assert first["inner"] == [1400, 900], first
    assert first["verdict"] and report.headline_markdown(summary).replace("**", "") == first["verdict"].strip()
    assert 0 <= first["verdict_box"]["top"] and first["verdict_box"]["bottom"] < 900, first
    assert first["img"] == "figures/04_cross_workload/what_ports.png" and first["img_ok"], first
    assert first["img_box"]["top"] < 900 - 300 and first["img_box"]["width"] >= 900, \
        f"the figure starts too low or is too narrow to read on the first screen: {first}"

    text = index.read_text()
    text = text[text.index("<article"):]            # the page itself, after the theme's navigation
    # the findings: each a sentence from the summary with its figure, the notebooks and documentation after
    sp = summary["reversals"]["significant_and_practical"]["value"]
    assert f"{sp:,} of {summary['reversals']['comparisons']['value']:,} cross-source comparisons" in text
    assert text.index("what_ports.png") < text.index("reversal_concentration.png") < text.index("notebooks/01_ingest.html")
    assert 'href="getting-started.html"' in text and 'href="claims.html"' in text
    # the contact sheet: grouped by question, each figure with its description, linking to its full-size PNG
    sheet = (out / "figures.html").read_text()
    questions = [q for q, nbs in site.QUESTIONS if any(name.split("/")[0] in nbs for name in FIGS)]
    positions = [sheet.index(q) for q in questions]
    assert positions == sorted(positions) and len(questions) == 3
    for name, description in FIGS.items():
        assert f'<a href="figures/{name}.png"><img src="figures/{name}.png"' in sheet and description in sheet
    assert 'href="claims/my_claim.html"' in (out / "claims.html").read_text()
    # the results page carries the full results block, from the same summary
    assert report._num(summary["cross_source"]["tau_b"]) in (out / "results.html").read_text()
    # the search index is there (the theme's search works from disk with the offline plug-in)
    assert json.loads((out / "search" / "search_index.json").read_text())["docs"]


def test_broken_link_check_finds_what_is_broken(tmp_path):
    (tmp_path / "a.html").write_text('<a href="b.html#here">b</a> <a href="b.html#gone">x</a> <a href="c.html">c</a>'
                                     ' <img src="img/p.png"> <a href="https://example.org/x">ext</a>'
                                     ' <a href="../outside.html">out</a> <a href="#top">top</a><h1 id="top">A</h1>')
    (tmp_path / "b.html").write_text('<h2 id="here">B</h2>')
    assert broken_links(tmp_path) == ["a.html: b.html#gone (no such anchor)", "a.html: c.html", "a.html: img/p.png",
                                      "a.html: ../outside.html (leaves the site)"]


def test_site_without_summary_or_notebooks_says_what_to_run(tmp_path):
    fig_dir, _ = _make_inputs(tmp_path)
    index = site.build(tmp_path / "report", notebooks_dir=tmp_path / "none", figures_dir=fig_dir,
                       summary_path=tmp_path / "summary.json")
    text = index.read_text()
    assert "No analysis summary at" in text and "make all" in text
    assert "No executed notebooks yet." in text
    # the figure is still there, first
    assert re.search(r'<img src="figures/04_cross_workload/what_ports.png"', text)


def test_site_keeps_other_files_in_its_folder_and_drops_its_stale_pages(tmp_path):
    fig_dir, nb_dir = _make_inputs(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    site.build(out, notebooks_dir=nb_dir, figures_dir=fig_dir, summary_path=tmp_path / "summary.json")
    assert (out / "notebooks" / "01_ingest.html").is_file()
    (nb_dir / "01_ingest.ipynb").unlink()
    site.build(out, notebooks_dir=nb_dir, figures_dir=fig_dir, summary_path=tmp_path / "summary.json")
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "notebooks" / "01_ingest.html").exists(), "a page of the previous build that is gone"
    assert (out / "notebooks" / "04_cross_workload.html").is_file()
    assert json.loads((fig_dir / "index.json").read_text()).keys() == FIGS.keys()
    plt.close("all")
