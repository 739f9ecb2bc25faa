"""Plug-ins: user code (a scheduler, usually) loaded by file or module name before anything runs.

A plug-in is named in the parameters (``plugins: [path/to/file.py, package.module]``) or on any CLI
command (``--plugin FILE``). It is loaded in the main process by :func:`portbench.params.load`, and
in every campaign worker (process pool, Dask) from :func:`specs` shipped with the work: a file's
*source text* travels with it, so a Dask worker on another machine runs exactly the code the main
process hashed, without a shared file system; a module name is imported on the worker (it must be
installed there). :func:`fingerprint` records each plug-in's SHA-256 in the campaign's shard keys,
so editing a plug-in recomputes the shards it could affect.

A file is executed as a module named ``portbench_plugin_<stem>_<hash of its path>`` (registered in
``sys.modules``, ``__file__`` = the file), once per content: loading the same file again is a no-op,
loading it after an edit re-executes it (a scheduler class re-registered from the same module
replaces the old one).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .config import looks_like_file
from .errors import ParameterError, PortbenchError


class PluginError(PortbenchError):
    """A plug-in could not be found or raised while it was loaded (the message names it and the cause)."""


@dataclass(frozen=True)
class PluginSpec:
    """One plug-in as shipped to workers: what was named, the module it becomes, its SHA-256 and (for
    a file) its source text."""

    spec: str
    module: str
    sha256: str
    source: str | None = None   # a file's text (None: a module imported by name)
    path: str | None = None


# module name -> sha256 of what was executed in this process
_LOADED: dict[str, str] = {}


def _file_module_name(path: Path) -> str:
    stem = re.sub(r"\W", "_", path.stem) or "plugin"
    return f"portbench_plugin_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"


def _module_files(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(name)
    if spec.submodule_search_locations:
        return sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin and spec.origin not in ("built-in", "frozen") else []


def _hash_files(files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def resolve(spec: str) -> PluginSpec:
    """What loading ``spec`` means: a file (its text and SHA-256) or an importable module."""
    if not isinstance(spec, str) or not spec.strip():
        raise ParameterError("plugins", spec, "a plug-in file (path/to/file.py) or a module name (package.module)")
    if looks_like_file(spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ParameterError("plugins", spec, "an existing Python file (relative paths: to the parameter "
                                 "file that names it, else the project root; --plugin: to the current folder)")
        path = path.resolve()
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise PluginError(f"plug-in {spec}: not a UTF-8 Python file") from None
        return PluginSpec(spec=spec, module=_file_module_name(path), sha256=hashlib.sha256(data).hexdigest(),
                          source=text, path=str(path))
    try:
        files = _module_files(spec)
    except (ImportError, ValueError):
        raise ParameterError("plugins", spec, "an importable module (package.module) or a file ending in .py; "
                             f"no module {spec!r} is importable here") from None
    return PluginSpec(spec=spec, module=spec, sha256=_hash_files(files), path=None)


def load_spec(p: PluginSpec, where: str = "this process") -> None:
    """Execute / import one resolved plug-in here (no-op when this content is already loaded)."""
    if _LOADED.get(p.module) == p.sha256 and p.module in sys.modules:
        return
    try:
        if p.source is None:
            importlib.import_module(p.module)
        else:
            spec = importlib.util.spec_from_loader(p.module, loader=None, origin=p.path)
            mod = importlib.util.module_from_spec(spec)
            mod.__file__ = p.path
            sys.modules[p.module] = mod
            try:
                exec(compile(p.source, p.path or p.spec, "exec"), mod.__dict__)
            except BaseException:
                sys.modules.pop(p.module, None)
                raise
    except ModuleNotFoundError as e:
        raise PluginError(f"plug-in {p.spec!r} cannot be loaded in {where}: module {e.name!r} is not installed "
                          "there (install it, or give the plug-in as a .py file: its text is shipped to "
                          "workers)") from None
    except PortbenchError as e:
        raise PluginError(f"plug-in {p.spec!r} failed to load in {where}: {e}") from None
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        at = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                   if p.path and f.filename == p.path), None)
        raise PluginError(f"plug-in {p.spec!r} failed to load in {where}: {type(e).__name__}: {e}"
                          + (f" (at {at})" if at else "")) from None
    _LOADED[p.module] = p.sha256


def loaded_modules() -> list[str]:
    """The module names of the plug-ins executed in this process."""
    return list(_LOADED)


def specs(names: Iterable[str]) -> list[PluginSpec]:
    """The resolved plug-ins of ``plugins`` (in order)."""
    return [resolve(n) for n in names]


def load(names: Iterable[str]) -> list[PluginSpec]:
    """Resolve and load every plug-in of ``names`` in this process; returns what was loaded."""
    out = specs(names)
    for p in out:
        load_spec(p)
    return out


def load_all(plugins: Iterable[PluginSpec], where: str) -> None:
    """Load shipped plug-ins (in a worker)."""
    for p in plugins:
        load_spec(p, where)


def fingerprint(plugins: Iterable[PluginSpec]) -> list[dict]:
    """``[{"plugin", "sha256"}]``: what the campaign's fingerprint records of its plug-ins."""
    return [{"plugin": p.spec if p.source is None else Path(p.path or p.spec).name, "sha256": p.sha256}
            for p in plugins]
