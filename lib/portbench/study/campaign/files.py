"""Where the campaign's files live under ``paths.results_dir`` and when a shard is finished."""

from __future__ import annotations

import time
from pathlib import Path

from ...core import outputs
from .plan import ShardSpec, _safe

def runs_path(results_dir: Path) -> Path:
    return Path(results_dir) / "runs.parquet"


def shard_path(results_dir: Path, shard: ShardSpec) -> Path:
    return Path(results_dir) / "runs" / f"{shard.name}.parquet"


def records_path(results_dir: Path, shard: ShardSpec) -> Path | None:
    return Path(results_dir) / "requests" / f"{shard.records_name}.parquet" if shard.record_replicates else None


def capacity_path(results_dir: Path, window_id: str, key: str) -> Path:
    """The cached capacity record of one window (measured once per window and key)."""
    return Path(results_dir) / "capacity" / f"{_safe(window_id)}__{key}.json"


def _clean_stale_tmp(folder: Path, older_than_s: float = 600.0) -> None:
    """Delete io.atomic_write's temporary files older than ``older_than_s`` left in ``folder`` by a killed run:
    only files with its temporary suffix (never another ``.tmp`` file) and only in a marked output folder."""
    if not folder.is_dir() or outputs.marked_root(folder) is None:
        return
    now = time.time()
    for p in folder.glob(f".*{outputs.TEMP_SUFFIX}"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
        except OSError:
            pass


def shard_done(results_dir: Path, shard: ShardSpec) -> bool:
    """True when the shard's runs file (and its records file, when records are kept) exist."""
    rp = records_path(results_dir, shard)
    return shard_path(results_dir, shard).is_file() and (rp is None or rp.is_file())
