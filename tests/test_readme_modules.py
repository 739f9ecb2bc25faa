"""The module table of the documentation ("The pipeline in `lib/portbench/`", docs/layout.md, linked from the
README's layout) names every module of the package, and names nothing that does not exist.

Table convention: the first column is the layer folder (``core/`` ...; empty = the row above's;
``top`` = ``lib/portbench/`` itself); the second names modules (``io.py``) or sub-packages (``engine/``)
of that folder in backticks; a row naming one sub-package names its modules (``core.py``) in the third
column. A sub-package's ``__init__.py`` is covered by its name, a layer's by its row.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lib" / "portbench"
HEADING = "## The pipeline in `lib/portbench/`"
PAGE = ROOT / "docs" / "layout.md"


def _table_rows(readme: str) -> list[list[str]]:
    assert HEADING in readme, f"{PAGE} has no section {HEADING!r}"
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    rows = [r for r in rows if not set("".join(r)) <= set("-: ") and r[:2] != ["layer", "module"]]
    assert rows and all(len(r) == 3 for r in rows), f"malformed module table rows: {rows}"
    return rows


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def table_modules(readme: str, pkg: Path = PKG) -> tuple[set[Path], list[str]]:
    """(files the table covers, names in the table that do not exist)."""
    covered, missing, folder = set(), [], None
    for lay, mods, role in _table_rows(readme):
        if lay:
            folder = pkg if lay == "top" else pkg / lay.strip("`").rstrip("/")
            if not folder.is_dir():
                missing.append(lay)
            covered.add(folder / "__init__.py")
        if folder is None:
            missing.append(f"a row before any layer: {mods}")
            continue
        subpackages = []
        for name in _ticked(mods):
            p = folder / name.rstrip("/")
            if name.endswith("/") and (p / "__init__.py").is_file():
                covered.add(p / "__init__.py")
                subpackages.append(p)
            elif name.endswith(".py") and p.is_file():
                covered.add(p)
            else:
                missing.append(f"{folder.relative_to(pkg.parent)}/{name}")
        if len(subpackages) == 1:
            for name in _ticked(role):
                if name.endswith(".py"):
                    p = subpackages[0] / name
                    covered.add(p) if p.is_file() else missing.append(f"{p.relative_to(pkg.parent)}")
    return covered, missing


def test_readme_module_table_names_every_module():
    covered, missing = table_modules(PAGE.read_text())
    absent = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p not in covered)
    assert not absent, f"modules missing from the module table of docs/layout.md ({HEADING}): {absent}"
    assert not missing, f"the module table of docs/layout.md names what does not exist: {missing}"


def test_table_check_fails_on_an_unlisted_or_stale_module():
    readme = PAGE.read_text()
    covered, _ = table_modules(readme)
    # a row dropped: its module is no longer covered
    assert PKG / "core" / "io.py" in covered
    assert PKG / "core" / "io.py" not in table_modules(readme.replace("`io.py`, ", ""))[0]
    assert PKG / "sim" / "engine" / "contract.py" not in table_modules(readme.replace("`contract.py`", "contract"))[0]
    # a name that does not exist is reported
    assert "portbench/core/nothere.py" in table_modules(readme.replace("| `core/` | `config.py`", "| `core/` | `config.py`, `nothere.py`"))[1]
