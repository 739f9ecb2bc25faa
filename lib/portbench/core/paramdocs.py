"""The parameters' documentation: the comments of ``default.yaml`` read as ``{dotted key: text}``
(``portbench params`` prints them; a test keeps every key documented)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from .paramfile import DEFAULT_FILE, OPEN_MAPS, project_root

# --------------------------------------------------------------------------- documentation of the parameters

def parameter_docs(path: Path | None = None) -> dict[str, str]:
    """``{dotted key: its documentation}`` from the comments of default.yaml: the block of comment lines right
    above the key, its own line's comment, and comment lines below it that continue that comment (their
    ``#`` in the same column). The keys of a mapping written on one line (``regressor: {max_iter: 200, …}  # …``)
    share that line's documentation."""
    path = Path(path or project_root() / DEFAULT_FILE)
    docs: dict[str, str] = {}
    flows: dict[str, list[str]] = {}           # key -> the keys of its one-line mapping
    stack: list[tuple[int, str]] = []          # (indent, key) of the enclosing mappings
    above: list[str] = []
    last: tuple[str, int] | None = None        # (key, its indent) while continuations of its comment may follow
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not stripped:
            above, last = [], None
            continue
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if last is not None and raw.index("#") > last[1]:
                docs[last[0]] = f"{docs[last[0]]} {text}".strip()
            else:
                above.append(text)
                last = None
            continue
        if stripped.startswith("-") or ":" not in stripped:
            continue
        indent = len(raw) - len(raw.lstrip())
        key, _, rest = stripped.partition(":")
        key = key.strip().strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        value, hash_, inline = rest.partition(" #")
        docs[dotted] = " ".join(x for x in (" ".join(above), inline.strip()) if x)
        above = []
        last = (dotted, indent) if hash_ else None
        if not value.strip():                       # a mapping opens here
            stack.append((indent, key))
        elif value.strip().startswith("{"):
            try:
                flow = yaml.safe_load(value)
            except yaml.YAMLError:
                flow = None
            if isinstance(flow, dict):
                flows[dotted] = [str(k) for k in flow]
    for parent, keys in flows.items():
        for k in keys:
            docs.setdefault(f"{parent}.{k}", f"(in {parent}) {docs[parent]}" if docs[parent] else "")
    return docs


def key_doc(docs: Mapping[str, str], key: str) -> str:
    """The documentation of a dotted parameter key (``docs`` from :func:`parameter_docs`): its own, else, for
    a name the user chose inside an open map (a source, an SLO, a panel …), the open map's."""
    if docs.get(key):
        return docs[key]
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:n])
        if parent in OPEN_MAPS and docs.get(parent):
            return f"(in {parent}) {docs[parent]}"
    return ""
