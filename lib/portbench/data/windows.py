"""Frozen workload windows: stride sampling, the committed manifest, hash verification.

**Placement (stride sampling).** A source's valid requests (the canonical table, in file order)
are split into ``windows.per_source`` equal buckets: bucket ``k`` holds positions
``[k*N//n, (k+1)*N//n)``. One window of ``windows.size`` consecutive valid requests sits at a seeded
offset inside each bucket, so windows never overlap, cover the whole trace evenly and do not all
start at a bucket edge. The offsets come from ``numpy.random.default_rng(SeedSequence([windows.seed,
key(source), key("placement")]))`` where ``key`` is the first 8 bytes of the SHA-256 of the name
(never Python's ``hash()``, which changes between processes).

**Window table.** Columns exactly :data:`COLUMNS`: ``arrival_s`` (seconds from the window's first
request; requests ordered by arrival time, ties by file row), ``prompt_tokens``, ``output_tokens``,
``tenant``; a window of a source whose trace carries prompt block hashes (Mooncake's ``hash_ids``,
Qwen's, a generic file's mapped ``block_hashes``) has a 5th column ``block_hashes`` (List(Int64)),
and the manifest records the source's ``block_size`` (tokens per hash block; the campaign hands it
to the engine with the window, see ``study.campaign.plan.WindowRef``).

**Tenants.** A source whose canonical table has tenant fields (:data:`TENANT_FIELDS`: BurstGPT's
``model`` and ``log_type``, a generic file's mapped ``tenant``) uses them: tenant =
``"<model>/<log_type>"`` (a missing value reads ``unknown``). Sessions (Bailian's ``session_id``) are conversations, not tenants. Every other
source (Azure, Bailian/Qwen) gets a seeded assignment of ``windows.tenants`` tenants ``t1 .. tT``
drawn i.i.d. per request with Zipf shares ``p_k ∝ 1/k`` (multi-tenant traffic is skewed: one big
client and a tail of small ones), from ``SeedSequence([windows.seed, key(source), key("tenant"),
key(window_id)])``. The rule used is recorded per source in the manifest (``sources.<s>.tenants``).

**Manifest.** Canonical JSON (sorted keys, indent 1, ASCII, trailing newline) of
``{"version", "params", "sources", "source_files", "windows", "checksum"}``; ``checksum`` is the
SHA-256 of the canonical JSON of everything else. :func:`load_manifest` re-serialises the parsed
file and compares bytes *and* checksum, so any single-byte change (whitespace included) is an
:class:`~portbench.core.errors.IntegrityError`; each window's ``sha256`` (:func:`window_sha256`) catches
any change to its content.

**Cache.** ``{paths.windows_dir}/windows.parquet`` (default ``{paths.data_dir}/windows``; a run whose
windows differ from default.yaml's has its own, beside its own manifest: ``core.paramfile._isolate``) holds
the materialised windows (long format, ``window_id`` first) tagged with the manifest checksum; a cache
from another manifest is ignored and rebuilt, a cache whose content does not match the manifest is an error.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from . import registry, synth, traces
from ..core import io, progress
from ..core.config import (FROZEN_SECTIONS, Config, DataSettings, PathsConfig, SourceConfig, StandinsConfig,
                           WindowsConfig, frozen_record)  # noqa: F401 - FROZEN_SECTIONS: also read from here
from ..core.errors import DataError, IntegrityError, ParameterError, PortbenchError
from ..core.provenance import label, provenance_from_manifest
from .registry import Store
from .window_table import (COLUMNS, HASH_COLUMN, HASH_DTYPE, SCHEMA, STAT_KEYS, as_window_table, columns_of,  # noqa: F401
                           window_sha256, window_stats)

if TYPE_CHECKING:
    from . import standins

MANIFEST_VERSION = 1
TENANT_FIELDS = ("model", "log_type", "tenant")
TENANT_MISSING = "unknown"
CACHE_FILE = "windows.parquet"
CACHE_META_KEY = b"portbench_manifest_checksum"
# FROZEN_SECTIONS (core.config): the parameter sections a manifest is frozen from; freezing with different
# values needs --refreeze. (A source's display keys, e.g. its label, are not part of it: renaming a source
# needs no refreeze.)


# --------------------------------------------------------------------------- seeds


name_key = synth.name_key  # a stable 64-bit integer for a name (first 8 bytes of its SHA-256)


def source_rng(seed: int, source: str, *stream: str) -> np.random.Generator:
    """Generator seeded from ``(seed, source, *stream)`` via SeedSequence (platform independent)."""
    return synth.rng_from(seed, source, *stream)


# --------------------------------------------------------------------------- placement


def stride_starts(n_rows: int, n_windows: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Start positions of ``n_windows`` windows of ``size`` rows, one at a seeded offset per bucket.

    Bucket ``k`` covers ``[k*n_rows//n_windows, (k+1)*n_rows//n_windows)``; the window starts at
    ``bucket_start + offset`` with ``offset`` uniform on ``0 .. bucket_len - size``.
    """
    if n_windows <= 0 or size <= 0:
        raise ParameterError("windows", {"per_source": n_windows, "size": size}, "positive integers")
    if n_rows < n_windows * size:
        raise ValueError(f"{n_rows} rows cannot hold {n_windows} non-overlapping windows of {size} "
                         f"(need at least {n_windows * size})")
    edges = (np.arange(n_windows + 1, dtype=np.int64) * n_rows) // n_windows
    room = edges[1:] - edges[:-1] - size  # >= 0 because n_rows >= n_windows * size
    offsets = np.array([rng.integers(0, r + 1) for r in room], dtype=np.int64)
    return edges[:-1] + offsets


def window_count(source: str, spec: SourceConfig | None, w: WindowsConfig, valid: int | None, *, own: bool,
                 file: str | None = None) -> int:
    """How many windows of ``source`` are frozen: ``sources.<name>.windows`` when set, else for a file of the
    user's own (``own``) as many as its ``valid`` requests hold, up to ``windows.per_source`` (a small trace gets fewer
    windows; the built-in sources keep theirs), else ``windows.per_source``. The fewest allowed is
    ``windows.min_per_source`` (or ``windows.per_source`` when that is smaller): fewer is a :class:`DataError` naming the
    source, its request count and the windows it allows (``valid`` None: not known yet, not checked)."""
    explicit = spec.windows if spec is not None else None
    fits = None if valid is None else int(valid) // w.size
    if explicit is not None:
        want = int(explicit)
    elif own and fits is not None:
        want = min(w.per_source, fits)
    else:
        want = w.per_source
    least = min(w.min_per_source, w.per_source)
    where = file or source
    if fits is not None and fits < max(least, 1):
        raise DataError(where, f"source {source!r} has {valid:,} valid requests, which hold {fits} window(s) of "
                        f"{w.size}; a source needs at least {least} windows ({least * w.size:,} requests): give a "
                        "longer trace, or lower windows.min_per_source (fewer windows, less power) or windows.size "
                        "(which refreezes every source's windows)")
    if explicit is not None and explicit < least:
        raise ParameterError(f"sources.{source}.windows", explicit, f"at least windows.min_per_source = {least}")
    if fits is not None and want > fits:
        what = f"sources.{source}.windows = {want}" if explicit is not None else f"windows.per_source = {want}"
        raise DataError(where, f"source {source!r} has {valid:,} valid requests, which hold {fits} windows of {w.size}, "
                        f"not the {want} of {what}: set sources.{source}.windows: {fits} (or fewer; at least {least})")
    return want


def window_ids(source: str, n_windows: int) -> list[str]:
    """``["azure-00", ..., "azure-39"]`` (at least two digits, more when needed)."""
    width = max(2, len(str(n_windows - 1)))
    return [f"{source}-{k:0{width}d}" for k in range(n_windows)]


def tenant_fields_of(canonical: pl.DataFrame | pl.LazyFrame) -> list[str]:
    """The tenant fields a canonical table carries (present and not entirely null)."""
    lazy = canonical.lazy()
    present = [f for f in TENANT_FIELDS if f in lazy.collect_schema().names()]
    if not present:
        return []
    counts = lazy.select(pl.len().alias("__n"), *[pl.col(f).null_count() for f in present]
                         ).collect(engine="streaming").row(0)
    return [f for f, nulls in zip(present, counts[1:]) if nulls < counts[0]]


def tenant_shares(n_tenants: int) -> np.ndarray:
    """Zipf shares ``p_k ∝ 1/k`` of the seeded tenants ``t1 .. tT``."""
    w = 1.0 / np.arange(1, n_tenants + 1, dtype=np.float64)
    return w / w.sum()


def seeded_tenants(n: int, n_tenants: int, seed: int, source: str, window_id: str) -> list[str]:
    """The documented seeded tenant assignment of one window (see the module docstring)."""
    if not isinstance(n_tenants, int) or n_tenants <= 0:
        raise ParameterError("windows.tenants", n_tenants, "a positive integer")
    rng = source_rng(seed, source, "tenant", window_id)
    draws = rng.choice(n_tenants, size=n, p=tenant_shares(n_tenants))
    return [f"t{k + 1}" for k in draws]


def window_from_rows(rows: pl.DataFrame, *, window_id: str, source: str, seed: int, n_tenants: int,
                     tenant_fields: Sequence[str], hashes: bool = False) -> pl.DataFrame:
    """Window table from consecutive canonical rows: order by arrival (ties by row), relative time, tenants,
    and (``hashes``) the rows' ``block_hashes``."""
    rows = rows.sort(["arrival_s", "row"], maintain_order=True)
    t0 = rows["arrival_s"][0]
    if tenant_fields:
        tenant = rows.select(pl.concat_str([pl.col(f).cast(pl.String).fill_null(TENANT_MISSING)
                                            for f in tenant_fields], separator="/"))
        tenant = tenant.to_series()
    else:
        tenant = pl.Series(seeded_tenants(rows.height, n_tenants, seed, source, window_id), dtype=pl.String)
    df = rows.select(
        (pl.col("arrival_s") - t0).alias("arrival_s"),
        pl.col("prompt_tokens").cast(pl.Int64),
        pl.col("output_tokens").cast(pl.Int64),
    ).with_columns(tenant.alias("tenant"))
    if hashes:
        df = df.with_columns(rows[HASH_COLUMN].alias(HASH_COLUMN))
    return as_window_table(df, window_id)


def has_hashes(canonical: pl.DataFrame | pl.LazyFrame) -> bool:
    """The canonical table carries prompt block hashes on every row."""
    lazy = canonical.lazy()
    if HASH_COLUMN not in lazy.collect_schema().names():
        return False
    n, nulls = lazy.select(pl.len().alias("__n"), pl.col(HASH_COLUMN).null_count()).collect(engine="streaming").row(0)
    return n > 0 and nulls == 0


def hash_block_size(manifest: Mapping, entry: Mapping) -> int | None:
    """Tokens per hash block of a window's ``block_hashes`` (the manifest's ``sources.<s>.block_size``;
    None: the window has no hashes)."""
    return (manifest.get("sources", {}).get(entry["source"]) or {}).get("block_size")


def cut_windows(canonical: pl.DataFrame | pl.LazyFrame, n_windows: int, size: int, seed: int, source: str,
                n_tenants: int, hashes: bool = False) -> list[tuple[dict, pl.DataFrame]]:
    """Stride-sample ``n_windows`` windows of ``size`` valid requests from one canonical table.

    Returns ``[(meta, window_df)]`` in bucket order; ``meta`` holds ``id``, ``file``,
    ``row_start``/``row_end`` (1-based raw-file rows, inclusive), ``t_start`` (seconds from the
    file's first request) and ``tenant_fields``.
    """
    canon, height = _ordered(canonical, source)
    try:
        starts = stride_starts(height, n_windows, size, source_rng(seed, source, "placement"))
    except ValueError as e:
        raise DataError(_file_of(canon, source, height), f"{e} (valid requests of source {source!r}); "
                        "lower windows.per_source or windows.size") from None
    fields = tenant_fields_of(canon)
    out = []
    for wid, start in zip(window_ids(source, n_windows), starts.tolist()):
        rows = canon.slice(start, size).collect()
        df = window_from_rows(rows, window_id=wid, source=source, seed=seed, n_tenants=n_tenants,
                              tenant_fields=fields, hashes=hashes)
        meta = {"id": wid, "file": rows["file"][0], "row_start": int(rows["row"][0]),
                "row_end": int(rows["row"][-1]), "t_start": float(rows["arrival_s"].min()),
                "tenant_fields": fields}
        if df.height >= 2 and not float(df["arrival_s"].max()) > 0:
            raise DataError(meta["file"], f"source {source!r}, window {wid}: its {df.height} requests (rows "
                            f"{meta['row_start']}-{meta['row_end']}) all share one arrival time, so its request "
                            "rate is undefined and it cannot be scaled to a load; the arrival column is too coarse "
                            f"(check sources.{source}.time_unit and the arrival column) or the rows are duplicated",
                            column="arrival")
        out.append((meta, df))
    return out


def _ordered(canonical: pl.DataFrame | pl.LazyFrame, source: str) -> tuple[pl.LazyFrame, int]:
    """The canonical table in row order (lazily: a stage reads only its windows' rows) and its length."""
    lazy = canonical.lazy()
    need = {"file", "row", "arrival_s", "prompt_tokens", "output_tokens"}
    missing = need - set(lazy.collect_schema().names())
    if missing:
        raise DataError(f"canonical table of {source}", f"missing column(s) {sorted(missing)}")
    files = lazy.select(pl.col("file").unique()).collect(engine="streaming")["file"].to_list()
    if len(files) != 1:
        raise DataError(f"canonical table of {source}", f"expected rows from one file, found {files}")
    height, increasing = _increasing_rows(lazy)
    if not increasing:    # (a table written by the ingest is in file order: strictly increasing rows)
        rows = lazy.select(pl.col("row").n_unique().alias("unique")).collect().item()
        if rows != height:
            raise DataError(files[0], "duplicate row numbers in the canonical table")
        lazy = lazy.sort("row")
    return lazy, int(height)


def _increasing_rows(lazy: pl.LazyFrame) -> tuple[int, bool]:
    """The table's length and whether its row numbers strictly increase, read in blocks of the row column."""
    n, last, increasing = 0, None, True
    for block in lazy.select("row").collect_batches(chunk_size=1 << 22):
        r = block["row"].to_numpy()
        if r.size:
            increasing = increasing and bool((np.diff(r) > 0).all()) and (last is None or r[0] > last)
            last = r[-1]
            n += r.size
    return n, increasing


def _file_of(canonical: pl.LazyFrame, source: str, height: int) -> str:
    return canonical.select(pl.col("file").first()).collect().item() if height else f"canonical table of {source}"


# --------------------------------------------------------------------------- manifest I/O


def canonical_json(obj: Any) -> bytes:
    """The one serialisation of a manifest: sorted keys, indent 1, ASCII, trailing newline."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()


def manifest_checksum(manifest: Mapping) -> str:
    """SHA-256 of the canonical JSON of the manifest without its ``checksum`` field."""
    return hashlib.sha256(canonical_json({k: v for k, v in manifest.items() if k != "checksum"})).hexdigest()


def manifest_path(paths: PathsConfig) -> Path:
    """Where the manifest lives (``paths.manifest``)."""
    return Path(paths.manifest)


def cache_path(paths: PathsConfig) -> Path:
    """The window cache, ``{paths.windows_dir}/windows.parquet`` (default ``{paths.data_dir}/windows``)."""
    return Path(paths.windows_dir) / CACHE_FILE


def parse_manifest(raw: bytes, where: str = "manifest") -> dict:
    """Parse manifest bytes; IntegrityError unless they are exactly the canonical JSON with a valid checksum."""
    try:
        m = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{where}: not a valid manifest ({e})") from None
    if not isinstance(m, dict) or "checksum" not in m:
        raise IntegrityError(f"{where}: not a valid manifest (no checksum field)")
    try:
        canon = canonical_json(m)
    except ValueError as e:  # NaN / infinity smuggled in
        raise IntegrityError(f"{where}: not a valid manifest ({e})") from None
    want, got = m["checksum"], manifest_checksum(m)
    if want != got:
        raise IntegrityError(f"{where}: checksum mismatch: file records {want}, content hashes to {got}")
    if canon != raw:
        raise IntegrityError(f"{where}: bytes differ from the canonical serialisation (edited by hand?); "
                             "the content checksum matches, so only formatting changed")
    if m.get("version") != MANIFEST_VERSION:
        raise IntegrityError(f"{where}: manifest version {m.get('version')!r}, this code reads {MANIFEST_VERSION}")
    return m


class Manifest(dict[str, Any]):
    """The window manifest as frozen (the canonical JSON mapping, unchanged: it serialises and hashes as before),
    with typed views of its parts. :func:`load_manifest` returns one; a stage loads it once and passes it on
    (``manifest=``)."""

    @property
    def windows(self) -> list[dict]:
        """Every window's entry (id, source, rows or generator, SHA-256 …), in manifest order."""
        return self["windows"]

    @property
    def sources(self) -> dict:
        return self["sources"]

    @property
    def checksum(self) -> str:
        return self["checksum"]

    def window_ids(self, source: str | None = None) -> list[str]:
        """The window ids (of one source), in manifest order."""
        return [e["id"] for e in self["windows"] if source is None or e["source"] == source]


def load_manifest(paths: PathsConfig) -> Manifest:
    """The committed manifest, checked byte for byte and by checksum (IntegrityError otherwise)."""
    path = manifest_path(paths)
    if not path.is_file():
        run = paths.run_name and "manifest" in paths.isolated
        raise DataError(path, "no window manifest here; run `portbench freeze` (notebook 02) to create it"
                        + (f" (with the same --params / --set: run {paths.run_name!r} has windows other than the "
                           "default study's, so it has a manifest of its own)" if run else ""))
    return Manifest(parse_manifest(path.read_bytes(), str(path)))


def write_manifest(manifest: dict, path: Path) -> dict:
    """Set the checksum and write the canonical bytes atomically; returns the manifest."""
    manifest = dict(manifest)
    manifest["checksum"] = manifest_checksum(manifest)
    io.write_bytes(path, canonical_json(manifest))
    return manifest


_jsonable = io.plain


# --------------------------------------------------------------------------- sources and evidence


def _loud(msg: str) -> None:
    print(f"[portbench windows] WARNING: {msg}", file=sys.stderr, flush=True)


def _note(msg: str) -> None:
    print(f"[portbench windows] {msg}", file=sys.stderr, flush=True)


def provenance_reason(mode: str | None, provenance: str | None, file: str | None, detail: str = "",
                      origin: str | None = registry.OFFICIAL) -> str:
    """Why a source has its provenance, in words that do not depend on the machine.

    The registry's own reason names local paths and download errors; the committed manifest must
    be byte-identical wherever it is frozen, so it records this fixed wording instead. A user's own
    file (``origin`` user) is never called official or verified.
    """
    if provenance == "real" and origin == registry.USER:
        return (f"mode {mode}: user file {file} (not an official file: its SHA-256 is recorded in source_files, "
                "not checked against an official record)")
    if provenance == "real":
        return f"mode {mode}: official file {file} found and verified (SHA-256 in source_files)"
    if provenance == "standin":
        if mode == "standin":
            return "mode standin: the labelled stand-in was requested"
        return (f"mode {mode}: official file {file} not available in this environment; "
                "labelled stand-in built from the real evidence (see source_files)")
    skipped = detail.rsplit(";", 1)[-1].strip() if "skipped" in detail else "skipped"
    return f"mode {mode}: {skipped}"


def evidence_checksums(inp: standins.StandinInputs, source: str) -> dict[str, str]:
    """``{name: sha256}`` of the real evidence a stand-in is built from (``inp``: :func:`portbench.data.standins.inputs`;
    names relative to the mirror; a folder is recorded as ``"<folder>/"`` with :func:`portbench.core.io.tree_sha256`)."""
    from . import standins   # scipy.stats: not imported by the campaign's workers

    return dict(standins.evidence_sha256(inp, source))


# --------------------------------------------------------------------------- building


def _params_record(tree: Mapping) -> dict:
    """The parameter sections the manifest is frozen from, as written in the parameter files (``tree``: the
    merged parameter tree, ``Config.tree``; without the sources' display keys)."""
    return _jsonable(frozen_record(tree))


def _entry(meta: Mapping, df: pl.DataFrame, *, source: str, provenance: str) -> dict:
    """One manifest window entry from a window's metadata and table."""
    synthetic = provenance != "real"
    extra = {k: v for k, v in meta.items() if k not in ("id", "tenant_fields", "synthetic")}
    e = {
        **_jsonable(extra),
        "id": meta["id"], "source": source, "provenance": provenance,
        "synthetic": bool(meta.get("synthetic", False) or synthetic),
        "file": meta.get("file"),
        "row_start": meta.get("row_start") if not synthetic else None,
        "row_end": meta.get("row_end") if not synthetic else None,
        "n_requests": df.height,
        "t_start": float(meta["t_start"]),
        "duration_s": float(df["arrival_s"][-1]),
        "sha256": window_sha256(df),
        "stats": window_stats(df),
    }
    if provenance == "standin" and "generator" not in e:
        raise DataError(meta.get("file") or source, f"stand-in window {meta['id']} has no generator record")
    return e


def _build_source(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins_cfg: StandinsConfig,
                  w: WindowsConfig, source: str, info: Mapping, record: dict) -> list[tuple[dict, pl.DataFrame]]:
    """Windows of one source (the ``windows`` section ``w``), by its provenance; fills ``record`` (the manifest's
    sources entry)."""
    n, size = w.per_source, w.size
    spec = sources.get(source)
    if info["provenance"] == "real":
        canonical = traces.scan_canonical(paths, sources, standins_cfg, source)
        block_size = registry.hash_block_size(sources[source])
        hashes = has_hashes(canonical)
        if hashes and block_size is None:
            raise ParameterError(f"sources.{source}.block_size", None, "the tokens per block of the trace's prompt "
                                 "block hashes (its windows carry them)")
        valid = int(canonical.select(pl.len()).collect().item())
        n = window_count(source, spec, w, valid, own=info.get("origin") == registry.USER, file=info.get("file"))
        if n < w.per_source:
            _note(f"{source}: {valid:,} valid requests hold {valid // size} windows of {size}: {n} windows frozen "
                  f"(windows.per_source is {w.per_source}; the fewest allowed {min(w.min_per_source, w.per_source)})")
        cut = cut_windows(canonical, n, size, w.seed, source, w.tenants, hashes=hashes)
        fields = cut[0][0]["tenant_fields"] if cut else []
        record["tenants"] = _tenant_rule(fields, w.tenants)
        record["valid_requests"] = valid
        if hashes:
            record["block_size"] = int(block_size)
        return cut
    built = []
    n = window_count(source, spec, w, None, own=False)
    from . import standins   # scipy.stats: not imported by the campaign's workers

    for k, (meta, df) in enumerate(standins.build_windows(standins.inputs(paths, sources, standins_cfg, w), source, n, size)):
        meta = dict(meta)
        meta.setdefault("id", window_ids(source, n)[k])
        if "tenant" not in df.columns:
            df = df.with_columns(pl.Series("tenant", seeded_tenants(df.height, w.tenants, w.seed, source,
                                                                    meta["id"]), dtype=pl.String))
        built.append((meta, as_window_table(df, meta["id"])))
    record["tenants"] = _tenant_rule(None, w.tenants)
    rule = built[0][0].get("generator", {}).get("params", {}).get("tenant") if built else None
    if isinstance(rule, str):
        record["tenants"]["generator_rule"] = rule
    return built


def _tenant_rule(fields: Sequence[str] | None, n_tenants: int) -> dict:
    if fields is None:
        return {"rule": "generator", "note": "tenants come from the stand-in generator (seeded rule if it has none)"}
    if fields:
        return {"rule": "fields", "fields": list(fields)}
    return {"rule": "seeded", "tenants": n_tenants, "shares": "zipf 1/k"}


def build_manifest(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins_cfg: StandinsConfig,
                   windows: WindowsConfig, tree: Mapping) -> tuple[dict, dict[str, pl.DataFrame]]:
    """Build the manifest (without checksum) and the window tables from the current data (the parameter
    ``tree`` is recorded in it)."""
    resolved = registry.resolve_sources(paths, sources, standins_cfg)
    st = registry.store(paths)
    sources_rec: dict[str, dict] = {}
    source_files: dict[str, str] = {}
    entries: list[dict] = []
    tables: dict[str, pl.DataFrame] = {}
    bar = progress.bar(len(sources), "windows: freezing", "source")
    for source in sources:
        bar.set_postfix_str(source)
        info = resolved.get(source) or {"provenance": None, "file": None, "path": None, "reason": "not resolved"}
        spec = sources[source]
        file = info.get("file") or spec.file
        rec = {"mode": spec.mode, "file": file, "provenance": info.get("provenance"), "origin": info.get("origin"),
               "reason": provenance_reason(spec.mode, info.get("provenance"), file,
                                           str(info.get("reason", "")), info.get("origin"))}
        sources_rec[source] = rec
        prov = info.get("provenance")
        if prov is None:
            _loud(f"{source}: SKIPPED ({rec['reason']})")
            bar.update(1)
            continue
        if prov == "real":
            source_files[info["file"]] = st.sha256(info["path"])
        else:
            from . import standins   # scipy.stats: not imported by the campaign's workers

            source_files.update(evidence_checksums(standins.inputs(paths, sources, standins_cfg, windows), source))
        for meta, df in _build_source(paths, sources, standins_cfg, windows, source, info, rec):
            e = _entry(meta, df, source=source, provenance=prov)
            entries.append(e)
            tables[e["id"]] = df
        rec["windows"] = sum(1 for e in entries if e["source"] == source)
        bar.update(1)
    bar.close()
    manifest = {"version": MANIFEST_VERSION, "params": _params_record(tree), "sources": sources_rec,
                "source_files": source_files, "windows": entries}
    return _jsonable(manifest), tables


MAX_PROBLEMS_SHOWN = 5     # windows named in a verification error (the rest are counted)


def freeze(cfg: Config, refreeze: bool = False) -> Manifest:
    """Freeze the windows (no manifest yet, or ``refreeze``) or verify the existing manifest.

    With a manifest present and ``refreeze`` false the manifest is never rewritten: every window
    is rebuilt from the source data and checked against its hash (IntegrityError on any
    mismatch), and the window cache is materialised.
    """
    path = manifest_path(cfg.paths)
    if path.is_file() and not refreeze:
        manifest = load_manifest(cfg.paths)
        _check_params(cfg.paths, cfg.tree, manifest)
        _note_provenance_changes(registry.resolve_sources(cfg.paths, cfg.sources, cfg.standins), manifest)
        ok, total, problems, tables = _verify(cfg.paths, cfg.sources, cfg.standins, manifest, check_cache=False)     # with a progress bar
        if problems:
            shown = problems[:MAX_PROBLEMS_SHOWN]
            more = len(problems) - len(shown)
            raise IntegrityError(f"{path}: {total - ok} of {total} windows fail verification:\n  "
                                 + "\n  ".join(shown) + (f"\n  … and {more} more" if more else "")
                                 + "\n(changed data files? `portbench files` shows what is found where; "
                                 "a deliberate change needs `portbench freeze --refreeze`)")
        _write_cache(cache_path(cfg.paths), manifest, tables)
        return manifest
    built, tables = build_manifest(cfg.paths, cfg.sources, cfg.standins, cfg.windows, cfg.tree)     # with a progress bar
    manifest = Manifest(write_manifest(built, path))
    _write_cache(cache_path(cfg.paths), manifest, tables)
    return manifest


def _check_params(paths: PathsConfig, tree: Mapping, manifest: Mapping) -> None:
    """ParameterError unless the parameter ``tree`` has the values the manifest was frozen with (``standins`` only
    matters when the manifest has stand-in windows)."""
    now, frozen = _params_record(tree), manifest.get("params", {})
    has_standins = any(e["provenance"] == "standin" for e in manifest["windows"])
    for section in [s for s in FROZEN_SECTIONS if s != "standins" or has_standins]:
        if now.get(section) != frozen.get(section):
            raise ParameterError(section, now.get(section),
                                 f"the values the manifest {manifest_path(paths)} was frozen with "
                                 f"({frozen.get(section)!r}); run `portbench freeze --refreeze` to refreeze, "
                                 "or point paths.manifest at another file")


def _note_provenance_changes(resolved: Mapping[str, dict], manifest: Mapping) -> None:
    """A loud note per source whose provenance now (``resolved``: :func:`portbench.data.registry.resolve_sources`)
    differs from the manifest's."""
    for source, rec in manifest.get("sources", {}).items():
        now = (resolved.get(source) or {}).get("provenance")
        if rec.get("provenance") != now:
            _loud(f"{source}: the manifest has provenance {rec.get('provenance')!r} but the data here "
                  f"now resolves to {now!r}; the frozen windows are kept (refreeze to change)")


# --------------------------------------------------------------------------- loading and verifying


def select_entries(manifest: Mapping, sources: Iterable[str] | None = None,
                   per_source: int | None = None) -> list[dict]:
    """Manifest window entries of ``sources`` (default: all), the first ``per_source`` of each."""
    wanted = None if sources is None else ([sources] if isinstance(sources, str) else list(sources))
    seen: dict[str, int] = {}
    out = []
    for e in manifest["windows"]:
        if wanted is not None and e["source"] not in wanted:
            continue
        seen[e["source"]] = seen.get(e["source"], 0) + 1
        if per_source is None or seen[e["source"]] <= per_source:
            out.append(e)
    return out


def _mismatch(entry: Mapping, got: str, where: str) -> str:
    return (f"window {entry['id']} ({where}): sha256 {got} but the manifest records {entry['sha256']}")


def rebuild_window(entry: Mapping, manifest: Mapping, canonical: pl.DataFrame | pl.LazyFrame | None = None,
                   st: Store | None = None) -> pl.DataFrame:
    """A window's table rebuilt from its source: canonical rows ``row_start..row_end`` or the stand-in generator."""
    if entry["provenance"] == "real":
        if canonical is None:
            raise ValueError("a real window needs its source's canonical table")
        lazy = canonical.lazy()
        canon_file = lazy.select(pl.col("file").first()).collect().item()
        if canon_file != entry["file"]:
            raise DataError(entry["file"], f"window {entry['id']} was frozen from this file, but the canonical "
                            f"table of {entry['source']} comes from {canon_file!r}")
        rows = lazy.filter(pl.col("row").is_between(entry["row_start"], entry["row_end"])).collect().sort("row")
        if rows.height != entry["n_requests"]:
            raise IntegrityError(f"window {entry['id']}: rows {entry['row_start']}..{entry['row_end']} of "
                                 f"{entry['file']} hold {rows.height} valid requests, the manifest records "
                                 f"{entry['n_requests']}")
        w = manifest["params"]["windows"]
        rule = manifest["sources"][entry["source"]]["tenants"]
        hashes = hash_block_size(manifest, entry) is not None
        if hashes and not has_hashes(rows):
            raise IntegrityError(f"window {entry['id']}: the manifest records prompt block hashes for "
                                 f"{entry['source']}, but the canonical rows of {entry['file']} have none")
        return window_from_rows(rows, window_id=entry["id"], source=entry["source"], seed=w["seed"],
                                n_tenants=w["tenants"], tenant_fields=rule.get("fields", []), hashes=hashes)
    if st is None:
        raise ValueError("a stand-in window needs the data store holding its evidence")
    from . import standins   # scipy.stats: not imported by the campaign's workers

    df = standins.regenerate(dict(entry), st)
    if "tenant" not in df.columns:
        w = manifest["params"]["windows"]
        df = df.with_columns(pl.Series("tenant", seeded_tenants(df.height, w["tenants"], w["seed"],
                                                                entry["source"], entry["id"]), dtype=pl.String))
    return as_window_table(df, entry["id"])


def _rebuild_many(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins_cfg: StandinsConfig,
                  manifest: Mapping, entries: Sequence[Mapping]) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """Rebuild ``entries`` from source data; returns (verified tables, problems)."""
    tables, problems = {}, []
    st = registry.store(paths)
    by_source: dict[str, list[Mapping]] = {}
    for e in entries:
        by_source.setdefault(e["source"], []).append(e)
    bar = progress.bar(len(entries), "windows: rebuilding from the data and verifying", "window")
    for source, group in by_source.items():
        bar.set_postfix_str(source)
        canonical = None
        try:
            if group[0]["provenance"] == "real":
                canonical = traces.scan_canonical(paths, sources, standins_cfg, source)
        except PortbenchError as err:
            problems += [f"window {e['id']}: cannot read the {source} data ({err})" for e in group]
            bar.update(len(group))
            continue
        for e in group:
            try:
                df = rebuild_window(e, manifest, canonical, st)
            except PortbenchError as err:
                problems.append(f"window {e['id']}: {err}")
            else:
                got = window_sha256(df)
                if got != e["sha256"]:
                    problems.append(_mismatch(e, got, "rebuilt from the source data"))
                else:
                    tables[e["id"]] = df
            bar.update(1)
    bar.close()
    return tables, problems


def _source_file_problems(paths: PathsConfig, manifest: Mapping) -> list[str]:
    """Recorded source-file SHA-256s that the files here do not match (or that cannot be found)."""
    st = registry.store(paths)
    mirror = st.mirror
    real_files = {rec.get("file"): s for s, rec in manifest.get("sources", {}).items()
                  if rec.get("provenance") == "real"}
    problems = []
    for name, want in manifest.get("source_files", {}).items():
        try:
            if name in real_files:
                path = Path(registry.locate(name, st))
            else:
                path = (mirror / name) if mirror is not None else Path(name)
                if not path.exists():
                    raise DataError(path, "evidence file not found")
            got = st.tree_sha256(path) if name.endswith("/") else st.sha256(path)
        except PortbenchError as err:
            problems.append(f"source file {name}: {err}")
            continue
        if got != want:
            problems.append(f"source file {name}: sha256 {got} but the manifest records {want}")
    return problems


def _read_cache(path: Path, manifest: Mapping) -> dict[str, pl.DataFrame]:
    """Window tables in the cache file ``path``, if it belongs to this manifest (else {})."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return {}
    try:
        meta = pq.read_schema(path).metadata or {}
        if meta.get(CACHE_META_KEY, b"").decode(errors="replace") != manifest["checksum"]:
            _loud(f"{path} was built for another manifest; rebuilding it")
            return {}
        df = pl.read_parquet(path)
    except (OSError, ValueError, pl.exceptions.PolarsError) as e:  # pyarrow's errors derive from these
        raise IntegrityError(f"window cache {path} cannot be read ({type(e).__name__}: {e}); "
                             "delete it to rebuild it from the source data") from None
    if df.columns not in (["window_id", *COLUMNS], ["window_id", *COLUMNS, HASH_COLUMN]):
        raise IntegrityError(f"window cache {path} has columns {df.columns}, expected window_id + {list(COLUMNS)} "
                             f"(+ {HASH_COLUMN}); delete it to rebuild it from the source data")
    hashed = {e["id"] for e in manifest["windows"] if hash_block_size(manifest, e) is not None}
    out = {}
    for (wid,), part in df.partition_by("window_id", as_dict=True, maintain_order=True).items():
        part = part.drop("window_id")
        if HASH_COLUMN in part.columns and wid not in hashed:   # windows without hashes keep their 4 columns
            part = part.drop(HASH_COLUMN)
        out[wid] = part
    return out


def _write_cache(path: Path, manifest: Mapping, tables: Mapping[str, pl.DataFrame]) -> Path:
    """Write the window cache (long format, manifest order) atomically, tagged with the manifest checksum."""
    import pyarrow.parquet as pq

    order = [e["id"] for e in manifest["windows"] if e["id"] in tables]
    frames = [tables[i].with_columns(pl.lit(i).alias("window_id")).select(["window_id", *columns_of(tables[i])])
              for i in order]
    if any(HASH_COLUMN in f.columns for f in frames):   # one long table: null hashes for windows without them
        frames = [f if HASH_COLUMN in f.columns else f.with_columns(pl.lit(None, HASH_DTYPE).alias(HASH_COLUMN))
                  for f in frames]
    df = pl.concat(frames) if frames else pl.DataFrame(schema={"window_id": pl.String, **SCHEMA})
    table = df.to_arrow()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           CACHE_META_KEY: manifest["checksum"].encode()})
    io.atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def load_windows(data: DataSettings, sources: Iterable[str] | None = None, per_source: int | None = None,
                 *, manifest: Mapping) -> dict[str, pl.DataFrame]:
    """Verified window tables ``{id: df}`` (manifest order) of ``sources`` (names; default all), from the cache
    under ``data.paths`` or rebuilt from the source data (``data``: paths, sources, standins; ``manifest``: the
    window manifest, :func:`load_manifest`, loaded once by the caller's stage).

    Every table is checked against the manifest's SHA-256; a mismatch raises IntegrityError naming
    the window and both hashes. Windows missing from the cache are rebuilt (ingesting or
    regenerating as needed) and added to it.
    """
    paths = data.paths
    entries = select_entries(manifest, sources, per_source)
    cached = _read_cache(cache_path(paths), manifest)
    out: dict[str, pl.DataFrame] = {}
    for e in entries:
        if e["id"] in cached:
            got = window_sha256(cached[e["id"]])
            if got != e["sha256"]:
                raise IntegrityError(_mismatch(e, got, f"cache {cache_path(paths)}")
                                     + "; delete the cache to rebuild it from the source data")
            out[e["id"]] = cached[e["id"]]
    missing = [e for e in entries if e["id"] not in out]
    if missing:
        built, problems = _rebuild_many(paths, data.sources, data.standins, manifest, missing)
        if problems:
            raise IntegrityError("; ".join(problems))
        out.update(built)
        _write_cache(cache_path(paths), manifest, {**cached, **built})
    return {e["id"]: out[e["id"]] for e in entries}


def _verify(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins_cfg: StandinsConfig, manifest: Mapping,
            *, check_cache: bool = True) -> tuple[int, int, list[str], dict[str, pl.DataFrame]]:
    entries = manifest["windows"]
    problems = _source_file_problems(paths, manifest)
    tables, window_problems = _rebuild_many(paths, sources, standins_cfg, manifest, entries)
    problems += window_problems
    bad = {e["id"] for e in entries if e["id"] not in tables}
    if check_cache and cache_path(paths).is_file():
        cached = _read_cache(cache_path(paths), manifest)
        for e in entries:
            if e["id"] in cached and (got := window_sha256(cached[e["id"]])) != e["sha256"]:
                problems.append(_mismatch(e, got, f"cache {cache_path(paths)}"))
                bad.add(e["id"])
    return len(entries) - len(bad), len(entries), problems, tables


def verify(cfg: Config) -> tuple[int, int, list[str]]:
    """Check the manifest (bytes and checksum), the source files' SHA-256 and every window's hash.

    Windows are rebuilt from the source data (and the cache, when present, is checked too).
    Returns ``(n_ok, n_total, problems)``; a damaged manifest gives ``(0, n_listed, [problem])``.
    """
    path = manifest_path(cfg.paths)
    try:
        manifest = load_manifest(cfg.paths)
    except IntegrityError as e:
        try:
            n_listed = len(json.loads(path.read_bytes())["windows"])
        except Exception:  # noqa: BLE001 - the file is damaged; its window count is unknown
            n_listed = 0
        return 0, n_listed, [str(e)]
    ok, total, problems, _ = _verify(cfg.paths, cfg.sources, cfg.standins, manifest)
    return ok, total, problems


# --------------------------------------------------------------------------- tables for reading


def window_table(manifest: Mapping, names: Mapping[str, str] | None = None) -> pl.DataFrame:
    """One row per window: id, source, label (with the display ``names``, ``cfg.display_names``),
    provenance, synthetic, file, rows, timing, stats, sha256."""
    rows = []
    for e in manifest["windows"]:
        rows.append({
            "id": e["id"], "source": e["source"], "label": label(e["source"], e["provenance"], names),
            "provenance": e["provenance"], "synthetic": e["synthetic"], "file": e["file"],
            "row_start": e["row_start"], "row_end": e["row_end"], "n_requests": e["n_requests"],
            "t_start": e["t_start"], "duration_s": e["duration_s"],
            **{k: e["stats"].get(k) for k in STAT_KEYS}, "sha256": e["sha256"],
        })
    schema = {"id": pl.String, "source": pl.String, "label": pl.String, "provenance": pl.String,
              "synthetic": pl.Boolean, "file": pl.String, "row_start": pl.Int64, "row_end": pl.Int64,
              "n_requests": pl.Int64, "t_start": pl.Float64, "duration_s": pl.Float64,
              **{k: pl.Float64 for k in STAT_KEYS}, "sha256": pl.String}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def has_tenants(manifest: Mapping, source: str) -> bool:
    """Whether ``source``'s windows carry tenants from the trace (a tenant field, or the stand-in
    generator's tenants drawn from real fields / clients) rather than the seeded synthetic assignment."""
    rule = ((manifest.get("sources", {}).get(source) or {}).get("tenants") or {}).get("rule")
    return rule in ("fields", "generator")


def tenant_label(manifest: Mapping, source: str, model: str = "trace") -> str:
    """How a source's tenants are to be read: ``trace``, ``synthetic (seeded Zipf 1/k, T tenants)``
    (``simulation.tenant_model: seeded`` on a source without tenants) or ``none``."""
    if has_tenants(manifest, source):
        return "trace"
    if model == "seeded":
        n = ((manifest.get("sources", {}).get(source) or {}).get("tenants") or {}).get("tenants")
        return f"synthetic (seeded Zipf 1/k, {n} tenants)"
    return "none"


def provenance(manifest: Mapping) -> dict[str, str]:
    """``{source: provenance}`` of the sources with windows in the manifest."""
    return provenance_from_manifest(manifest)


def skipped_sources(manifest: Mapping) -> list[str]:
    """Sources configured but without windows (no official file and no stand-in available)."""
    return [s for s, rec in manifest.get("sources", {}).items() if rec.get("provenance") is None]
