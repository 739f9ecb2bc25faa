"""Parameter files: the YAML chain (``extends:``), merging, the schema check against ``default.yaml``, the
run's isolation under ``build/<run name>/`` and the merged tree (:func:`read`). The typed sections it is built
into are in :mod:`portbench.core.sections`; :mod:`portbench.core.config` joins the two (``load``)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from .errors import ParameterError

DEFAULT_FILE = "papermill_params/default.yaml"

# Maps whose keys the user names freely (a new SLO, region, source ...).
OPEN_MAPS = {
    "sources",
    "simulation.region_loads",
    "simulation.slo",
    "simulation.scheduler_options",
    "analysis.panels",
}
# Keys of a source that only change how it is displayed (not part of what a manifest is frozen from).
DISPLAY_KEYS = ("label",)


def project_root() -> Path:
    """The folder holding ``papermill_params/default.yaml`` (searched upward from the cwd)."""
    env = os.environ.get("PORTBENCH_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / DEFAULT_FILE).is_file():
            return d
    pkg_root = Path(__file__).resolve().parents[2]
    if (pkg_root / DEFAULT_FILE).is_file():
        return pkg_root
    return here


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ParameterError("params_file", str(path), "an existing YAML parameter file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParameterError("params_file", str(path), f"valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ParameterError("params_file", str(path), "a YAML mapping at the top level")
    return data


PARAMS_DIR = "papermill_params"


def resolve_extends(base: str, parent: Path) -> Path:
    """The file an ``extends:`` names: relative to the extending file's folder, else one of the
    project's own parameter files by name (``default.yaml``, ``smoke``, ``sweeps/x.yaml``), else a
    ParameterError saying where it looked."""
    if not isinstance(base, str) or not base.strip():
        raise ParameterError("extends", base, "the name or path of a parameter file")
    b = Path(base)
    if b.is_absolute():
        tried = [b]
    else:
        own = project_root() / PARAMS_DIR
        tried = [parent / b, own / b] + ([own / f"{base}.yaml"] if b.suffix not in (".yaml", ".yml") else [])
    for t in tried:
        if t.is_file():
            return t.resolve()
    raise ParameterError("extends", base, "an existing parameter file; looked at " + ", ".join(map(str, tried)))


def _resolve_plugins(data: dict, folder: Path) -> None:
    """Plug-in files of one parameter file, relative to that file's folder (else the project root):
    made absolute here, because the merged tree forgets which file named them."""
    v = data.get("plugins")
    if not isinstance(v, list):
        return
    out = []
    for x in v:
        if isinstance(x, str) and looks_like_file(x) and not Path(x).is_absolute():
            here = folder / x
            x = str(here.resolve()) if here.exists() else str((project_root() / x).resolve())
        out.append(x)
    data["plugins"] = out


def looks_like_file(spec: str) -> bool:
    """A plug-in given as a file (``x.py`` or a path) rather than a module name (``package.module``)."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _resolve_source_files(data: dict, folder: Path) -> None:
    """A source's ``file`` given as a relative path that exists next to the parameter file naming it becomes
    that absolute path (else it stays: a path relative to the project root, or a name in the data mirror)."""
    sources = data.get("sources")
    if not isinstance(sources, Mapping):
        return
    for spec in sources.values():
        f = spec.get("file") if isinstance(spec, dict) else None
        if isinstance(f, str) and f and not Path(f).is_absolute() and (folder / f).is_file():
            spec["file"] = str((folder / f).resolve())


def label_follows_data(P: dict, schema: Mapping) -> None:
    """A built-in source pointed at another file keeps no built-in label: ``sources.azure.file: my.csv`` with
    default.yaml's ``label: Azure`` is labelled ``my`` (the file's stem) unless a label is set explicitly to
    something else."""
    base = schema.get("sources") if isinstance(schema.get("sources"), Mapping) else {}
    for name, spec in (P.get("sources") or {}).items():
        ref = base.get(name)
        if not (isinstance(spec, dict) and isinstance(ref, Mapping)) or not spec.get("file"):
            continue
        if Path(str(spec["file"])).name != Path(str(ref.get("file"))).name and spec.get("label") == ref.get("label"):
            spec["label"] = Path(str(spec["file"])).stem


def _read_chain(path: Path, seen: tuple = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ParameterError("extends", str(path), "no cycle of extends")
    data = _read_yaml(path)
    _resolve_plugins(data, path.parent)
    _resolve_source_files(data, path.parent)
    base = data.pop("extends", None)
    if base is None:
        return data
    return deep_merge(_read_chain(resolve_extends(base, path.parent), seen + (path,)), data)


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base`` (dicts merge recursively, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def undot(flat: dict) -> dict:
    """``{"a.b": 1, "c": {"d": 2}}`` -> ``{"a": {"b": 1}, "c": {"d": 2}}``."""
    out: dict = {}
    for k, v in (flat or {}).items():
        parts = str(k).split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ParameterError(k, v, "a key path that does not pass through a scalar")
        if isinstance(v, dict) and isinstance(d.get(parts[-1]), dict):
            d[parts[-1]] = deep_merge(d[parts[-1]], undot(v))
        else:
            d[parts[-1]] = undot(v) if isinstance(v, dict) else v
    return out


def _check_schema(params: dict, schema: dict, prefix: str = "") -> None:
    for k, v in params.items():
        name = f"{prefix}{k}"
        if k not in schema:
            raise ParameterError(name, v, "a known parameter: " + ", ".join(f"{prefix}{s}" for s in schema))
        if name in OPEN_MAPS:
            continue
        if isinstance(schema[k], dict) and schema[k]:
            if not isinstance(v, dict):
                raise ParameterError(name, v, "a mapping with keys " + ", ".join(schema[k]))
            _check_schema(v, schema[k], name + ".")


BUILD_DIR = "build"
BUILD_ENV = "PORTBENCH_BUILD"     # the build folder (the Makefile's BUILD); default build/ under the project root


def build_base() -> str:
    """The build folder: ``$PORTBENCH_BUILD`` (``make … BUILD=dir`` sets it), else ``build``."""
    return os.environ.get(BUILD_ENV, "").strip() or BUILD_DIR
ISOLATED_PATHS = ("results_dir", "figures_dir")     # what a non-default run writes under build/<run name>/
NEUTRAL_OVERRIDES = ("paths",)                      # overrides that change where things are, not results
# The sections a window manifest is frozen from (without the sources' display keys, see frozen_record).
FROZEN_SECTIONS = ("windows", "sources", "standins")


def frozen_record(P: Mapping) -> dict:
    """The parts of a parameter tree that decide the frozen windows: :data:`FROZEN_SECTIONS`, each source
    without its display keys (a new label changes no window), ``windows`` without ``min_per_source`` (a check)."""
    rec = {k: copy.deepcopy(P.get(k)) for k in FROZEN_SECTIONS if k in P}
    if isinstance(rec.get("windows"), dict):      # a check on the windows, not their definition
        rec["windows"].pop("min_per_source", None)
    if isinstance(rec.get("sources"), Mapping):
        rec["sources"] = {s: ({k: v for k, v in spec.items() if k not in DISPLAY_KEYS}
                              if isinstance(spec, Mapping) else spec) for s, spec in rec["sources"].items()}
    return rec


def run_name_of(path: Path, root: Path) -> str:
    """The run folder's name of a parameter file: its stem for the project's own files (``papermill_params/
    smoke.yaml`` -> ``smoke``), else its stem and a short hash of its resolved path (``/home/me/a/study.yaml`` ->
    ``study-1f3a9c``), so that two files of the same name in different folders never share ``build/<name>/``."""
    path = Path(path).resolve()
    if path.parent == (Path(root) / "papermill_params").resolve():
        return path.stem
    return f"{path.stem}-{hashlib.sha256(str(path).encode()).hexdigest()[:6]}"


# paths keys that name something portbench writes: they must stay inside the project (or be absolute)
OUTPUT_PATH_KEYS = ("results_dir", "figures_dir", "windows_dir", "manifest", "data_dir")


def check_path_value(key: str, value: str, root: Path) -> None:
    """ParameterError for a ``paths`` value that would put files where the user does not expect them: a literal
    ``~`` (never expanded: a folder named ``~`` would appear), and, for what portbench writes
    (:data:`OUTPUT_PATH_KEYS`), a relative path that climbs out of the project with ``..``, the file system root,
    the home folder or the project's own folder (or one above it)."""
    param = f"paths.{key}"
    if "~" in Path(value).parts or value.startswith("~"):
        raise ParameterError(param, value, "a path without a literal ~ (portbench does not expand it): an absolute "
                             "path such as /home/me/out, or a path relative to the project")
    if key not in OUTPUT_PATH_KEYS:
        return
    p = Path(value)
    target = (p if p.is_absolute() else root / p).resolve()
    root = root.resolve()
    if not p.is_absolute() and target != root and root not in target.parents:
        raise ParameterError(param, value, "a path inside the project (a relative path may not leave it with ..); to "
                             "write elsewhere, give the absolute path of a new or empty folder")
    home = Path.home().resolve()
    if target == Path(target.anchor) or target == home or target == root or target in root.parents:
        raise ParameterError(param, value, "a folder of its own (not the file system root, the home folder or the "
                             "project folder): e.g. build/mine, or the absolute path of a new or empty folder")


def _isolate(P: dict, schema: Mapping, path: Path, default_path: Path, over: Mapping) -> str | None:
    """Give a non-default run folders of its own: a parameter file other than default.yaml, or overrides
    other than ``paths.*``, that leaves ``results_dir`` / ``figures_dir`` at default.yaml's values writes them under
    ``build/<run name>/`` instead (run name: :func:`run_name_of`, plus a hash of the overrides), so that it
    never overwrites the full study's results or the committed figures. A run whose windows differ from
    default.yaml's (:func:`frozen_record`: ``windows.*``, ``sources.*`` other than labels, ``standins.*``) also
    gets its own manifest, window cache and frozen predictions, ``build/<run name>/windows/`` (``manifest`` at
    its default value; ``windows_dir`` unset while ``data_dir`` is at its default), so that ``portbench freeze
    --refreeze`` never rewrites the committed manifest. Folders set to other values (by the file or the
    overrides) are kept. Sets ``P["_isolated"]`` (the moved ``paths`` keys); returns the run name (None: the
    default study)."""
    changed = {k: v for k, v in over.items() if k not in NEUTRAL_OVERRIDES}
    P["_isolated"] = []
    if path.resolve() == default_path.resolve() and not changed:
        return None
    name = run_name_of(path, root=default_path.parent.parent)
    if changed:
        name += "-" + hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:8]
    default_paths = schema.get("paths") or {}
    paths = P.setdefault("paths", {})
    run_dir = Path(build_base()) / name
    moved = {key: str(run_dir / key.removesuffix("_dir")) for key in ISOLATED_PATHS
             if key in default_paths and paths.get(key) == default_paths[key]}
    if frozen_record(P) != frozen_record(schema):
        if "manifest" in default_paths and paths.get("manifest") == default_paths["manifest"]:
            moved["manifest"] = str(run_dir / "windows" / Path(str(default_paths["manifest"])).name)
        if paths.get("windows_dir") is None and paths.get("data_dir") == default_paths.get("data_dir"):
            moved["windows_dir"] = str(run_dir / "windows")
    paths.update(moved)
    P["_isolated"] = sorted(moved)
    return name


def read(params_file: str | os.PathLike | None = None, overrides: dict | None = None) -> dict:
    """The merged parameter tree: a file (default: default.yaml) over the defaults, then ``overrides``;
    keys checked against the schema; relative paths resolved against the project root."""
    root = project_root()
    default_path = root / DEFAULT_FILE
    path = Path(params_file) if params_file else default_path
    if not path.is_absolute():
        path = root / path if (root / path).exists() or not path.exists() else path.resolve()
    schema = _read_chain(default_path) if default_path.is_file() else {}
    P = _read_chain(path)
    if schema:
        P = deep_merge(schema, P)
    over = undot(overrides or {})
    if isinstance(over.get("plugins"), list):   # plug-in files given as overrides: relative to the cwd, else the root
        over["plugins"] = [str(Path(x).resolve()) if isinstance(x, str) and looks_like_file(x)
                           and not Path(x).is_absolute() and Path(x).exists() else x for x in over["plugins"]]
        _resolve_plugins(over, root)
    P = deep_merge(P, over)
    if schema:
        _check_schema(P, schema)
        label_follows_data(P, schema)
    P["_params_file"] = str(path)
    P["_root"] = str(root)
    P["_run_name"] = _isolate(P, schema, path, default_path, over)
    for key, value in P.get("paths", {}).items():
        if isinstance(value, str) and key != "mirror_env":
            check_path_value(key, value, root)
            P["paths"][key] = str((root / value) if not Path(value).is_absolute() else Path(value))
    return P
