"""Generic input/output: atomic writes, file checksums, canonical JSON, parquet with metadata.

Every file the project writes goes through :func:`atomic_write` (a temporary file next to the
target, then ``os.replace``), so a reader never sees a half-written file and a killed run leaves
only complete files. :func:`sha256_of` is the one file checksum of the project; it caches digests
by (path, size, mtime) in memory and, given a cache file, on disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import struct
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import outputs

META_KEY = b"portbench"   # parquet schema-metadata key of write_parquet_atomic


# --------------------------------------------------------------------------- atomic writes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Write ``path`` through ``write(tmp_path)`` into a temporary file next to it, then rename it over
    ``path`` (atomic on POSIX): readers never see a half-written file. The file gets ordinary
    permissions (``0o666`` less the umask), not ``mkstemp``'s 0600. The temporary file's name ends in
    ``outputs.TEMP_SUFFIX`` (only such files are ever cleaned up as stale); a file written inside a marked output
    folder is recorded there (:func:`portbench.core.outputs.record`: what ``make clean`` may remove)."""
    path = Path(path)
    outputs.check_write(path)        # a study of the user's own never writes a tracked file of the default study
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=outputs.TEMP_SUFFIX)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    outputs.record(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """``data`` to ``path`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    """``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1, sort_keys: bool = False) -> Path:
    """``obj`` as JSON (numpy values, paths and dataclasses converted) to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=json_default))
    return Path(path)


# --------------------------------------------------------------------------- JSON


def json_default(x: Any) -> Any:
    """``json.dumps(default=...)`` for the values the project serialises: numpy scalars and arrays,
    paths, sets, dataclasses; anything else by its ``repr``."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    return repr(x)


def canonical_json(obj: Any) -> str:
    """Sorted-key compact JSON (the one serialisation hashed for seeds and fingerprints)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=json_default)


def sha256_hex(obj: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def plain(x: Any) -> Any:
    """``x`` with numpy values, tuples and paths turned into JSON types (dict keys as strings)."""
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return [plain(v) for v in x.tolist()]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, Path):
        return x.as_posix()
    return x


# --------------------------------------------------------------------------- parquet


def write_parquet_atomic(df, path: str | os.PathLike, meta: Mapping | None = None) -> None:
    """Write a polars DataFrame to ``path`` via a temporary file + rename, with JSON metadata
    (schema-metadata key ``portbench``)."""
    import pyarrow.parquet as pq

    table = df.to_arrow()
    if meta is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               META_KEY: canonical_json(meta).encode()})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_tables(folder: str | os.PathLike, tables: Mapping[str, Any]) -> dict[str, str]:
    """Each polars DataFrame of ``tables`` as ``{folder}/{name}.parquet`` (polars' writer, atomic);
    returns name -> path. The folder is created."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, df in tables.items():
        path = folder / f"{name}.parquet"
        atomic_write(path, df.write_parquet)
        paths[name] = str(path)
    return paths


def read_meta(path: str | os.PathLike) -> dict | None:
    """The ``portbench`` metadata of a parquet file written by :func:`write_parquet_atomic`."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[META_KEY]) if META_KEY in meta else None


# --------------------------------------------------------------------------- checksums


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_cache(cache: Path) -> dict:
    try:
        data = json.loads(cache.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_cache(cache: Path, data: dict) -> None:
    text = json.dumps(data, indent=1, sort_keys=True)
    try:
        write_text(cache, text)
    except OSError:  # a read-only data folder only costs a re-hash next time
        pass


# In-process memo of file hashes, {(resolved path, size, mtime_ns): sha256}: without an on-disk cache a
# file is still hashed only once per process.
_MEMO: dict[tuple[str, int, int], str] = {}


def sha256_of(path: str | os.PathLike, cache: str | os.PathLike | None = None) -> str:
    """SHA-256 of a file, the one file checksum of the project.

    Cached by (path, size, mtime) in this process and, when ``cache`` (a JSON file) is given, on
    disk, so a large file is hashed once, not on every run.
    """
    path = Path(path).resolve()
    st = path.stat()
    key = str(path)
    memo_key = (key, st.st_size, st.st_mtime_ns)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache = Path(cache) if cache is not None else None
    if cache is not None:
        hit = _load_cache(cache).get(key)
        if isinstance(hit, dict) and all(hit.get(k) == v for k, v in stamp.items()) and hit.get("sha256"):
            _MEMO[memo_key] = hit["sha256"]
            return hit["sha256"]
    digest = _MEMO.get(memo_key) or _hash_file(path)
    _MEMO[memo_key] = digest
    if cache is not None:
        data = _load_cache(cache)  # re-read: another process may have added entries meanwhile
        data[key] = {**stamp, "sha256": digest}
        _save_cache(cache, data)
    return digest


def tree_sha256(folder: str | os.PathLike, cache: str | os.PathLike | None = None) -> str:
    """SHA-256 of a folder: over its files' relative paths and :func:`sha256_of` digests, in sorted
    order, each field length-prefixed (8 bytes, little-endian)."""
    folder = Path(folder)
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        for data in (p.relative_to(folder).as_posix().encode(), sha256_of(p, cache).encode()):
            h.update(struct.pack("<Q", len(data)))
            h.update(data)
    return h.hexdigest()


def code_sha256(module: str) -> str:
    """SHA-256 of the source of ``portbench.<module>`` (every ``.py`` file of a package, in name order): part
    of the fingerprints of cached results, so that changed code never reuses results of the old code."""
    spec = importlib.util.find_spec(f"portbench.{module}")
    h = hashlib.sha256()
    if spec.submodule_search_locations:
        files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    else:
        files = [Path(spec.origin)]
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
