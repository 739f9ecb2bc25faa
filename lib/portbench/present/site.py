"""The results site, ``build/report/`` (``portbench site``; ``make report`` and the end of ``make all``), built by
MkDocs (Material theme, its search working offline; the executed notebooks rendered by mkdocs-jupyter).

Static HTML that opens from disk (relative links only, nothing fetched from the network):

* ``index.html``: the headline in one sentence (from ``summary.json``, :func:`report.headline_markdown`), the
  "what ports" figure, the paper-vs-portbench table (a ``paper`` block of :data:`report.BLOCKS`, when there is
  one), three to five findings each with its figure at full width, then the notebooks and the documentation;
* ``results.html``: every headline number (:func:`report.results_markdown`);
* ``figures.html``: the contact sheet, every figure grouped by the question it answers;
* ``claims.html``: every claim report in ``claims/*.html`` of the site's folder (written there by ``portbench
  claim``; the site only links them);
* ``notebooks/<name>.html``: each executed notebook; the pages of ``docs/`` (``mkdocs.yml``'s ``nav``);
* ``figures/``: a copy of the indexed PNGs (:func:`portbench.core.figindex.index`).

The pages are generated into a temporary folder, built there, then copied into the site's folder: only the files of
the previous build (listed in ``.portbench-site``) are replaced, anything else there (the claim reports, a user's
notes) stays.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from ..core import figindex
from ..core import io as fileio
from ..core.errors import DataError
from ..core.paramfile import project_root
from . import ports_text, report

SITE_RECORD = ".portbench-site"
# The Material theme's offline search needs the iframe-worker shim, which its plug-in would fetch from a CDN: the
# site carries its own copy (npm iframe-worker 1.0.4, MIT; assets/LICENSE.iframe-worker).
_ASSETS = Path(__file__).resolve().parent / "assets"
# What MkDocs writes for a web server, not for a site opened from disk (404.html links the theme's files by absolute
# paths): left out.
_SERVER_ONLY = {"404.html", "sitemap.xml", "sitemap.xml.gz"}
HERO = "04_cross_workload/what_ports"
# The contact sheet's groups: the question each notebook's figures answer (a notebook not named: "Other figures").
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What ports across sources, and how sure is it?", ("04_cross_workload",)),
    ("Does the order hold across loads?", ("05_cross_region",)),
    ("Which reversals survive a test and a practical size?", ("06_reversals",)),
    ("Does the best scheduler change with the metric?", ("07_cross_metric",)),
    ("Why do rankings change?", ("09_attribution",)),
    ("Does a real vLLM engine agree?", ("08_gpu_validation",)),
    ("What does the simulator do with the windows?", ("03_simulate",)),
    ("What do the traces and windows look like?", ("01_ingest", "02_freeze_windows")),
)
_CSS = """
.md-grid { max-width: 1440px; }
.md-typeset .verdict { font-size: 1.25em; line-height: 1.45; margin: 0.4em 0 0.8em; }
.md-typeset figure { display: block; width: 100%; margin: 0.6em 0 1.4em; max-width: 100%; }
.md-typeset figure img { display: block; margin: 0 auto; width: auto; height: auto; max-width: 100%; max-height: 86vh; }
.md-typeset figcaption { font-size: 0.8em; max-width: none; }
.md-typeset .sheet { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 1.2em; }
.md-typeset .sheet figure { margin: 0; border: 1px solid #ddd; padding: 6px; width: auto; }
.jp-OutputArea-output img { max-width: 100%; height: auto; }
"""
# mkdocs-jupyter's template loads MathJax from a CDN unless given another address; the site works offline, so it
# gets this empty script instead and LaTeX in a notebook's markdown shows as its source (the notebooks write Greek
# letters as Unicode).
_NO_MATHJAX = "/* MathJax is not loaded: the site works offline (LaTeX shows as its source). */\n"


def _figure_md(e: Mapping, prefix: str = "") -> str:
    """A figure at full width with its description as the caption (HTML, so that the caption stays with it)."""
    src = f"{prefix}figures/{e['png']}"
    alt = _escape(e.get("description") or e["name"])
    return (f'<figure markdown="span">\n  <a href="{src}"><img src="{src}" alt="{alt}"></a>\n'
            f"  <figcaption>{alt}</figcaption>\n</figure>\n")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def copy_figures(figures_dir: str | Path, out_dir: str | Path) -> list[dict]:
    """The indexed figures whose PNG exists, copied to ``<out_dir>/<name>.png``; their index entries with
    ``png`` the copy's path relative to ``out_dir``."""
    figures_dir, out_dir = Path(figures_dir), Path(out_dir)
    out = []
    for e in figindex.index(figures_dir, root=figures_dir):
        target = out_dir / e["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(figures_dir / e["file"], target)
        out.append({**e, "png": Path(e["file"]).as_posix()})
    return out


def _notebook_title(path: Path) -> str:
    """The first markdown heading of a notebook (``# 04 · Cross-workload`` -> ``04 · Cross-workload``)."""
    nb = json.loads(path.read_text())
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return path.stem


# --------------------------------------------------------------------------------------------
# The findings of the index: each a sentence from summary.json and the figure that shows it.
# --------------------------------------------------------------------------------------------

def _reversals(s: Mapping) -> str | None:
    rv = s.get("reversals") or {}
    sp, n = (rv.get("significant_and_practical") or {}).get("value"), (rv.get("comparisons") or {}).get("value")
    if sp is None or not n:
        return None
    where = ports_text.headline_sentences(s)[2:3]
    return (f"{sp:,} of {n:,} cross-source comparisons ({sp / n:.1%}) reverse significantly and by at least δ on "
            "both sources. " + " ".join(where))


def _regions(s: Mapping) -> str | None:
    cr = s.get("cross_region") or {}
    if "tau_b" not in cr:
        return None
    ext = (cr.get("extreme_regions") or {}).get("tau_b")
    return (f"Between operating regions of one source the rankings agree far more than between sources: τ-b "
            f"{report._num(cr['tau_b'])} across regions against {report._num((s.get('cross_source') or {}).get('tau_b'))}"
            " across sources" + (f"; lightest against heaviest region {report._num(ext)}" if ext else "") + ".")


def _metrics(s: Mapping) -> str | None:
    pt = (s.get("cross_metric") or {}).get("pairwise_top1_change_rate")
    if not pt or pt.get("value") is None:
        return None
    return (f"The best scheduler changes between two headline metrics in {report._pct(pt)} of {pt['count']} "
            "(condition, metric pair) cases: each metric has its usual winners, shown below per metric.")


def _attribution(s: Mapping) -> str | None:
    a = s.get("attribution") or {}
    pairs = a.get("pairs") or {}
    if not a.get("available", bool(pairs)) or not isinstance(pairs, Mapping) or not pairs:
        return None
    lead = []
    for name, p in pairs.items():
        shares = {k: v.get("value") for k, v in (p.get("shares") or {}).items() if isinstance(v, Mapping)}
        shares = {k: v for k, v in shares.items() if v is not None}
        if shares:
            k = max(shares, key=lambda x: shares[x])
            lead.append(f"{name.replace('|', ' vs ')}: {k} ({shares[k]:.0%})")
    if not lead:
        return None
    return ("Which property of a workload moves the ranking (the largest Shapley share of the ranking distance, "
            "per source pair): " + "; ".join(lead) + ".")


FINDINGS: tuple[tuple[str, Callable[[Mapping], str | None], tuple[str, ...]], ...] = (
    ("Where orders reverse", _reversals, ("06_reversals/reversal_concentration", "06_reversals/reversal_funnel")),
    ("Across loads", _regions, ("05_cross_region/bump_mooncake", "05_cross_region/region_tau_matrices")),
    ("Across metrics", _metrics, ("07_cross_metric/winners", "07_cross_metric/top1_pairs")),
    ("Why rankings change", _attribution, ("09_attribution/shapley_bars", "09_attribution/share_heatmap")),
)


def findings(summary: Mapping, figs: Mapping[str, Mapping]) -> list[tuple[str, str, Mapping]]:
    """``[(title, text, figure entry)]``: every finding whose text the summary gives and whose figure exists."""
    out = []
    for title, text_of, names in FINDINGS:
        try:
            text = text_of(summary)
        except (KeyError, TypeError, IndexError, AttributeError):
            text = None
        fig = next((figs[n] for n in names if n in figs), None)
        if text and fig:
            out.append((title, text, fig))
    return out


def hero(figs: Mapping[str, Mapping]) -> Mapping | None:
    """The index's figure: "what ports", else the first figure of notebook 04, else the first figure."""
    if HERO in figs:
        return figs[HERO]
    return next((e for n, e in figs.items() if n.startswith("04_")), next(iter(figs.values()), None))


def index_markdown(summary: Mapping | None, figs: Mapping[str, Mapping], notebooks: list[dict], docs: list[dict],
                   summary_path: Path, claims: list[str]) -> str:
    """The index page: the verdict, the figure, the paper table, the findings, then notebooks and documentation."""
    lines = ["---", "hide: [navigation, toc]", "title: Results", "---", "", "# portbench: does a scheduler ranking port?", ""]
    if summary is None:
        lines += [f"No analysis summary at `{summary_path}`: run the notebooks (`make all`) first.", ""]
    else:
        lines += [f'<p class="verdict">{_md_inline(report.headline_markdown(summary))}</p>', ""]
    h = hero(figs)
    if h is not None:
        lines += [_figure_md(h)]
    if summary is not None and "paper" in report.BLOCKS:
        lines += ["## The paper and portbench, side by side", "", report.BLOCKS["paper"](summary), ""]
    found = findings(summary, figs) if summary is not None else []
    if found:
        lines += ["## Findings", ""]
        for k, (title, text, fig) in enumerate(found, 1):
            lines += [f"### {k}. {title}", "", text, "", _figure_md(fig)]
    lines += ["## Every number, every figure", "",
              "- [Results](results.md): every headline number with its interval, the controls and every panel",
              "- [Every figure](figures.md), grouped by the question it answers"]
    if claims:
        lines.append(f"- [Claims](claims.md): {len(claims)} claim report{'s' if len(claims) != 1 else ''}")
    lines += ["", "## The notebooks", ""]
    lines += [f"- [{nb['title']}](notebooks/{nb['name']}.ipynb)" for nb in notebooks] or ["No executed notebooks yet."]
    if docs:
        lines += ["", "## Documentation", ""] + [f"- [{d['title']}]({d['file']})" for d in docs]
    return "\n".join(lines) + "\n"


def _md_inline(md: str) -> str:
    """``**bold**`` of one markdown sentence as HTML (the verdict sits in a ``<p>``)."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", _escape(md))


def figures_markdown(figs: list[dict]) -> str:
    """The contact sheet: every figure, grouped by the question its notebook answers; each links to its PNG."""
    lines = ["---", "title: Every figure", "hide: [navigation]", "---", "", "# Every figure", "",
             f"{len(figs)} figures, grouped by the question they answer; each opens at full size.", ""]
    placed: set[str] = set()
    groups = [(q, [e for e in figs if e["notebook"] in nbs]) for q, nbs in QUESTIONS]
    groups.append(("Other figures", [e for e in figs if not any(e["notebook"] in nbs for _, nbs in QUESTIONS)]))
    for question, members in groups:
        if not members:
            continue
        lines += [f"## {question}", "", '<div class="sheet" markdown>']
        for e in members:
            placed.add(e["name"])
            src = f"figures/{e['png']}"
            lines.append(f'<figure><a href="{src}"><img src="{src}" alt="{_escape(e["name"])}"></a>'
                         f"<figcaption><code>{_escape(e['name'])}</code><br>{_escape(e.get('description', ''))}"
                         "</figcaption></figure>")
        lines += ["</div>", ""]
    return "\n".join(lines) + "\n"


def claims_markdown(claims: list[str]) -> str:
    lines = ["# Claims", "", "Every claim report of this run (`portbench claim`), as its own page:", ""]
    lines += [f'- <a href="claims/{_escape(c)}">{_escape(Path(c).stem)}</a>' for c in claims]
    return "\n".join(lines) + "\n"


def _doc_pages(docs_dir: Path, config: Mapping) -> list[dict]:
    """The documentation pages that exist, in ``mkdocs.yml``'s nav order, then any other page of ``docs/``."""
    pages, seen = [], set()
    for item in config.get("nav") or []:
        (title, file), = item.items()
        if (docs_dir / file).is_file():
            pages.append({"title": title, "file": file})
            seen.add(file)
    for p in sorted(docs_dir.glob("*.md")):
        if p.name not in seen and p.name not in ("index.md", "figures.md", "claims.md"):
            pages.append({"title": p.stem.replace("-", " ").capitalize(), "file": p.name})
    return pages


_LINK_OUT = re.compile(r"\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")
_LINK_IN = re.compile(r"\]\(docs/([^)\s]+)\)")


def _copy_doc(src: Path, dst: Path, summary: Mapping | None) -> None:
    """A documentation page into the site's source: links out of ``docs/`` to the change log or the README point
    at their pages in the site, and its generated blocks are filled from the summary (as ``make all`` does)."""
    text = src.read_text()

    def link(m: re.Match) -> str:
        target = {"CHANGELOG.md": "changelog.md", "README.md": "index.md"}.get(m.group(1))
        return f"]({target}{m.group(2) or ''})" if target else m.group(0)

    text = _LINK_IN.sub(r"](\1)", _LINK_OUT.sub(link, text))     # (the change log, at the root, links docs/x.md)
    dst.write_text(text)
    if summary is not None and any(report.markers(n)[0] in text for n in report.BLOCKS):
        report.update_blocks(dst, summary)


def _config(root: Path, src: Path, site_dir: Path, docs: list[dict], notebooks: list[dict], claims: list[str],
            base: Mapping, title: str) -> dict:
    nav: list = [{"Results": "index.md"}, {"Every number": "results.md"}, {"Every figure": "figures.md"}]
    if claims:
        nav.append({"Claims": "claims.md"})
    if notebooks:
        nav.append({"Notebooks": [{nb["title"]: f"notebooks/{nb['name']}.ipynb"} for nb in notebooks]})
    if docs:
        nav.append({"Documentation": [{d["title"]: d["file"]} for d in docs if d["file"] != "results.md"]
                    + ([{"Change log": "changelog.md"}] if (src / "changelog.md").is_file() else [])})
    cfg = {k: v for k, v in base.items() if k not in ("nav", "docs_dir", "site_dir", "plugins")}
    cfg.update({"site_name": title, "docs_dir": str(src), "site_dir": str(site_dir), "use_directory_urls": False,
                "nav": nav, "extra_css": ["assets/portbench.css"],
                "extra": {**(base.get("extra") or {}), "polyfills": ["assets/iframe-worker-shim.js"]},
                "plugins": ["search", "offline", {"mkdocs-jupyter": {
                    "include": ["*.ipynb"], "ignore_h1_titles": True, "cache": False, "include_requirejs": False,
                    "custom_mathjax_url": "../assets/no-mathjax.js", "toc_depth": 3}}]})
    return cfg


def build(out_dir: str | Path, *, notebooks_dir: str | Path, figures_dir: str | Path, summary_path: str | Path,
          title: str = "portbench results", docs_dir: str | Path | None = None,
          mkdocs_file: str | Path | None = None) -> Path:
    """Write the site into ``out_dir`` (replacing the files of an earlier build, nothing else); returns the index
    page's path. ``docs_dir`` and ``mkdocs_file`` default to the project's ``docs/`` and ``mkdocs.yml`` (the change
    log: the project's ``CHANGELOG.md``)."""
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config

    root = project_root()
    out_dir, summary_path = Path(out_dir), Path(summary_path)
    docs_dir = Path(docs_dir) if docs_dir is not None else root / "docs"
    mkdocs_file = Path(mkdocs_file) if mkdocs_file is not None else root / "mkdocs.yml"
    base = yaml.safe_load(mkdocs_file.read_text()) if mkdocs_file.is_file() else {}
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    claims = sorted(p.name for p in (out_dir / "claims").glob("*.html")) if (out_dir / "claims").is_dir() else []
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="portbench-site-") as tmp:
        src, site_dir = Path(tmp) / "src", Path(tmp) / "site"
        (src / "assets").mkdir(parents=True)
        (src / "assets" / "portbench.css").write_text(_CSS)
        (src / "assets" / "no-mathjax.js").write_text(_NO_MATHJAX)
        shutil.copyfile(_ASSETS / "iframe-worker-shim.js", src / "assets" / "iframe-worker-shim.js")
        figs = {e["name"]: e for e in copy_figures(figures_dir, src / "figures")}
        notebooks = []
        if Path(notebooks_dir).is_dir():
            (src / "notebooks").mkdir()
            for p in sorted(Path(notebooks_dir).glob("*.ipynb")):
                shutil.copyfile(p, src / "notebooks" / p.name)
                notebooks.append({"name": p.stem, "title": _notebook_title(p)})
        docs = _doc_pages(docs_dir, base) if docs_dir.is_dir() else []
        for d in docs:
            _copy_doc(docs_dir / d["file"], src / d["file"], summary)
        if (root / "CHANGELOG.md").is_file() and docs:
            _copy_doc(root / "CHANGELOG.md", src / "changelog.md", None)
        if not (src / "results.md").is_file():
            (src / "results.md").write_text("# Results\n\n" + (
                report.results_markdown(summary) if summary else f"No analysis summary at `{summary_path}`.") + "\n")
        (src / "index.md").write_text(index_markdown(summary, figs, notebooks, [d for d in docs if d["file"] != "results.md"],
                                                     summary_path, claims))
        (src / "figures.md").write_text(figures_markdown(list(figs.values())))
        if claims:
            (src / "claims.md").write_text(claims_markdown(claims))
        cfg = _config(root, src, site_dir, docs, notebooks, claims, base, title)
        cfg_file = Path(tmp) / "mkdocs.yml"
        cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
        try:
            mkdocs_build(load_config(str(cfg_file)))
        except Exception as e:      # mkdocs' own errors (a bad page, a plug-in) name the page; keep that one line
            raise DataError(mkdocs_file, f"the results site did not build: {e}") from e
        _replace(out_dir, site_dir)
    return out_dir / "index.html"


def _replace(out_dir: Path, site_dir: Path) -> None:
    """The built site into ``out_dir``: the files of the previous build (its ``.portbench-site`` list) removed, the
    new ones copied (each recorded in the output folder's record), the list rewritten."""
    record = out_dir / SITE_RECORD
    old = record.read_text().splitlines() if record.is_file() else []
    for rel in old:
        p = out_dir / rel
        if rel and ".." not in Path(rel).parts and p.is_file():
            p.unlink()
    for rel in sorted({str(Path(r).parent) for r in old if r}, key=len, reverse=True):
        d = out_dir / rel
        while d != out_dir and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
    new = []
    for dirpath, _, names in os.walk(site_dir):
        for name in names:
            p = Path(dirpath) / name
            rel = p.relative_to(site_dir).as_posix()
            if rel in _SERVER_ONLY:
                continue
            fileio.write_bytes(out_dir / rel, p.read_bytes())
            new.append(rel)
    fileio.write_text(record, "\n".join(sorted(new)) + "\n")
