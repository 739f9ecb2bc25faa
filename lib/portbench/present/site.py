"""The results site, ``build/report/`` (``portbench site``; ``make report`` and the end of ``make all``).

Static HTML that opens from disk (relative links only, nothing fetched from the network):

* ``index.html``: the headline findings (the README's results block, from ``summary.json`` through
  :func:`portbench.present.report.results_markdown`), the notebooks, and every figure as a thumbnail that
  links to the notebook that made it;
* ``figures.html``: the contact sheet, every figure side by side at one size, to look at them all together;
* ``notebooks/<name>.html``: each executed notebook (nbconvert's lab template without its remote scripts:
  require.js, MathJax and mermaid are not loaded, so LaTeX in markdown shows as source);
* ``figures/``: a copy of the indexed PNGs (:func:`portbench.core.figindex.index`).
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from ..core import figindex, outputs
from ..core import io as fileio
from . import report

# nbconvert's lab template with the three remote scripts left out (the site works offline).
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(var(--w), 1fr)); gap: 14px; }
figure { margin: 0; border: 1px solid #ddd; padding: 6px; background: #fff; }
figure img { width: 100%; height: auto; display: block; }
figcaption { font-size: 0.82em; margin-top: 4px; } figcaption code { font-size: 0.95em; }
.note { color: #666; }
"""


def _page(title: str, body: str, grid_width: str = "260px") -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{html.escape(title)}</title>\n"
            f"<style>:root {{ --w: {grid_width}; }}{_CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def _markdown_html(md: str) -> str:
    import mistune

    return str(mistune.create_markdown(plugins=["table"])(md))


def _notebook_title(nb: Mapping, default: str) -> str:
    """The first markdown heading of a notebook (``# 04 · Cross-workload`` -> ``04 · Cross-workload``)."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return default


def render_notebooks(notebooks_dir: str | Path, out_dir: str | Path) -> list[dict]:
    """Each ``*.ipynb`` of ``notebooks_dir`` (sorted) as ``<out_dir>/<stem>.html``; ``[{name, title, html}]``
    with ``html`` the file name."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(extra_loaders=[DictLoader({"offline.html.j2": _OFFLINE_TEMPLATE})],
                            template_file="offline.html.j2")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = []
    for path in sorted(Path(notebooks_dir).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
        fileio.write_text(out_dir / f"{path.stem}.html", body)
        pages.append({"name": path.stem, "title": _notebook_title(nb, path.stem), "html": f"{path.stem}.html"})
    return pages


def copy_figures(figures_dir: str | Path, out_dir: str | Path) -> list[dict]:
    """The indexed figures whose PNG exists, copied to ``<out_dir>/<name>.png``; their index entries with
    ``png`` the copy's path relative to ``out_dir``."""
    figures_dir, out_dir = Path(figures_dir), Path(out_dir)
    out = []
    for e in figindex.index(figures_dir, root=figures_dir):
        target = out_dir / e["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        outputs.copy(figures_dir / e["file"], target)
        out.append({**e, "png": Path(e["file"]).as_posix()})
    return out


def _figure_cell(e: Mapping, link: str, caption_name: bool) -> str:
    name = f"<code>{html.escape(e['name'])}</code><br>" if caption_name else ""
    return (f"<figure><a href=\"{html.escape(link)}\"><img src=\"figures/{html.escape(e['png'])}\" "
            f"alt=\"{html.escape(e['name'])}\"></a><figcaption>{name}{html.escape(e.get('description', ''))}"
            "</figcaption></figure>")


def headline_html(summary_path: str | Path) -> str:
    """The headline findings of ``summary.json`` as HTML (the README's results block), or a note saying how
    to make them when the file is absent."""
    summary_path = Path(summary_path)
    if not summary_path.is_file():
        return (f"<p class=\"note\">No analysis summary at <code>{html.escape(str(summary_path))}</code>: "
                "run the notebooks (<code>make all</code>) first.</p>")
    return _markdown_html(report.results_markdown(json.loads(summary_path.read_text())))


def index_html(summary_path: str | Path, pages: list[dict], figs: list[dict], title: str) -> str:
    """The index page: headline findings, the notebooks, the figures by notebook (each links to its notebook)."""
    by_nb = {p["name"]: p for p in pages}
    parts = [f"<h1>{html.escape(title)}</h1>",
             "<p>Every figure side by side: <a href=\"figures.html\">contact sheet</a>.</p>",
             "<h2 id=\"findings\">Headline findings</h2>", headline_html(summary_path),
             "<h2 id=\"notebooks\">Notebooks</h2>", "<ul>"]
    parts += [f"<li><a href=\"notebooks/{html.escape(p['html'])}\">{html.escape(p['title'])}</a></li>" for p in pages]
    parts += ["</ul>", "<h2 id=\"figures\">Figures</h2>"]
    notebooks = sorted({e["notebook"] for e in figs})
    for nb in notebooks:
        page = by_nb.get(nb)
        head = (f"<a href=\"notebooks/{html.escape(page['html'])}\">{html.escape(page['title'])}</a>" if page
                else f"{html.escape(nb)} <span class=\"note\">(no executed notebook)</span>")
        parts.append(f"<h3>{head}</h3>\n<div class=\"grid\">")
        for e in (e for e in figs if e["notebook"] == nb):
            link = f"notebooks/{page['html']}" if page else f"figures/{e['png']}"
            parts.append(_figure_cell(e, link, caption_name=False))
        parts.append("</div>")
    return _page(title, "\n".join(parts))


def contact_sheet_html(figs: list[dict], title: str) -> str:
    """Every figure at one size with its name and description; each links to its full-size PNG."""
    cells = [_figure_cell(e, f"figures/{e['png']}", caption_name=True) for e in figs]
    body = (f"<h1>{html.escape(title)}: every figure</h1>\n<p>{len(figs)} figures. <a href=\"index.html\">Back to the "
            f"results</a>.</p>\n<div class=\"grid\">\n" + "\n".join(cells) + "\n</div>")
    return _page(f"{title}: figures", body, grid_width="420px")


def build(out_dir: str | Path, *, notebooks_dir: str | Path, figures_dir: str | Path, summary_path: str | Path,
          title: str = "portbench results") -> Path:
    """Write the site into ``out_dir`` (replacing the pages and copies of an earlier one, nothing else);
    returns the index page's path."""
    out_dir = Path(out_dir)
    for sub in ("notebooks", "figures"):
        if (out_dir / sub).is_dir():
            shutil.rmtree(out_dir / sub)
    pages = render_notebooks(notebooks_dir, out_dir / "notebooks") if Path(notebooks_dir).is_dir() else []
    figs = copy_figures(figures_dir, out_dir / "figures")
    fileio.write_text(out_dir / "figures.html", contact_sheet_html(figs, title))
    index = out_dir / "index.html"
    fileio.write_text(index, index_html(summary_path, pages, figs, title))
    return index
