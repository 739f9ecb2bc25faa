"""Before a run: is the data it needs here? One short message saying what is missing and how to get it.

:func:`check` looks, without downloading anything, for every file the run will read: the file of each
source that the committed manifest records as *real* (its windows are verified against that file's
bytes), the file of each configured source of the user's own (``origin: user``), and the real evidence
every stand-in is built from (BurstGPT slices, ServeGen's Bailian statistics). It raises one
:class:`~portbench.core.errors.DataError` of a few lines -- which files, where it looked, the setting
that points at the data mirror and where the files come from -- instead of letting notebook 01 "pass"
with no real source and notebook 02 fail on 120 hash mismatches.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from ..core.config import Config, PathsConfig, SourceConfig, StandinsConfig
from ..core.errors import DataError
from . import registry, windows

MAX_LISTED = 4     # missing files named one per line; the rest are counted


def missing_files(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins: StandinsConfig) -> list[str]:
    """One line per file the run needs and cannot find (empty: everything is here): the configured ``sources``'
    files and the ``standins``' evidence, looked for where ``paths`` says."""
    st = registry.store(paths)
    try:
        manifest = windows.load_manifest(paths)
    except DataError:
        manifest = None                   # no manifest yet: notebook 02 freezes one from what it finds
    frozen = manifest.get("sources", {}) if manifest else {}
    out, evidence = [], []
    for name, src in sources.items():
        rec = frozen.get(name) or {}
        real_in_manifest = rec.get("provenance") == "real"
        own_file = src.file and src.file not in registry.OFFICIAL_FILES
        if src.mode != "standin" and src.file and (real_in_manifest or own_file or src.mode == "real"):
            try:
                registry.locate(src.file, st, download=False)
            except registry.MissingFileError:
                why = "real in the committed manifest" if real_in_manifest else f"mode {src.mode}"
                out.append(f"{name} ({why}): {src.file}")
            continue
        standin = standins.of(name)
        if standin is not None and (rec.get("provenance") in (None, "standin")):
            for rel in _standin_evidence(standins, name):
                if st.mirror is None or not (st.mirror / rel).exists():
                    evidence.append(f"{name} (stand-in, built from real evidence): {rel}")
    return out + evidence


def _standin_evidence(standins: StandinsConfig, source: str) -> list[str]:
    """The mirror-relative files and folders a stand-in is built from."""
    if source == "burstgpt" and standins.burstgpt is not None:
        return list(standins.burstgpt.slices)
    if source == "bailian" and standins.bailian is not None:
        return [standins.bailian.servegen_dir]
    return []


def count_rows(path: Path) -> int:
    """Records in a trace file without reading it as a table: a parquet file's row count from its metadata, else the
    non-blank lines (less a CSV's header line). An upper bound of the valid requests (rows the source defines as
    invalid are excluded later), so a trace too small by this count is too small."""
    with open(path, "rb") as f:
        head = f.read(4)
        if head == b"PAR1":
            return int(pl.scan_parquet(path).select(pl.len()).collect().item())
        f.seek(0)
        lines, first, last = 0, None, b"\n"
        while chunk := f.read(1 << 24):
            if first is None:
                first = chunk.lstrip()[:1]
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    lines += last != b"\n"
    return max(0, lines - (0 if first == b"{" else 1))


def window_budget(cfg: Config, out=None) -> None:
    """Before any notebook: every file of the user's own holds the windows its study freezes
    (:func:`portbench.data.windows.window_count` on the file's record count, an upper bound of its valid requests):
    a one-line note per such source (its requests and windows), a :class:`DataError` naming the source, its request
    count and the windows it allows when it holds fewer than ``windows.min_per_source``."""
    out = out or sys.stderr
    st = registry.store(cfg.paths)
    for name, src in cfg.sources.items():
        if src.mode == "standin" or not src.file or src.file in registry.OFFICIAL_FILES:
            continue
        try:
            path = registry.locate(src.file, st, download=False)
        except registry.MissingFileError:
            continue                     # named by check()
        n = count_rows(path)
        got = windows.window_count(name, src, cfg.windows, n, own=True, file=str(path))
        print(f"[portbench] {name}: {path.name} has {n:,} records (at most): {got} windows of {cfg.windows.size} "
              f"(windows.per_source {cfg.windows.per_source}, at least {min(cfg.windows.min_per_source, cfg.windows.per_source)})",
              file=out, flush=True)


def check(cfg: Config) -> None:
    """DataError (a message of at most ~12 lines) when :func:`missing_files` finds anything, or when a file of the
    user's own is too small for its windows (:func:`window_budget`)."""
    st = registry.store(cfg.paths)
    for name, src in cfg.sources.items():    # a file of the user's own: its own message (not the data mirror's)
        if src.mode != "standin" and src.file and src.file not in registry.OFFICIAL_FILES:
            try:
                registry.locate(src.file, st, download=False)
            except registry.MissingFileError:
                raise DataError(f"sources.{name}.file", registry.user_file_missing(src.file, st)) from None
    missing = missing_files(cfg.paths, cfg.sources, cfg.standins)
    if not missing:
        window_budget(cfg)
        return
    if st.mirror is None:
        where = "no data mirror is set, and ../shared/traces (beside the project) does not exist"
    elif not Path(st.mirror).is_dir():
        where = f"the data mirror {st.mirror} does not exist"
    else:
        where = f"not in the data mirror {st.mirror}"
    lines = [f"{len(missing)} data file(s) this run needs are not here ({where}):"]
    lines += [f"  - {m}" for m in missing[:MAX_LISTED]]
    if len(missing) > MAX_LISTED:
        lines.append(f"  - … and {len(missing) - MAX_LISTED} more")
    lines += ["Point the run at a folder holding the trace files: make all DATA_MIRROR=/path/to/traces",
              "(or $PORTBENCH_DATA_MIRROR, or paths.mirror in the parameter file). The files, their SHA-256 and",
              "official download locations are listed in the README's 'Data' section and by `portbench files`;",
              "a source whose official file is absent runs on its labelled stand-in (sources.<name>.mode: auto)."]
    raise DataError("data mirror", "\n".join(lines))
