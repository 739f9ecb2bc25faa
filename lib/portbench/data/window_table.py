"""The window table: its columns, its canonical bytes and hash, and its summary statistics.

A window table has :data:`COLUMNS`: ``arrival_s`` (seconds from the window's first request,
never decreasing), ``prompt_tokens``, ``output_tokens`` (> 0) and ``tenant``; a window of a source
whose trace carries prompt block hashes has a 5th column :data:`HASH_COLUMN` (``block_hashes``,
List(Int64): the ids of the prompt's blocks of the source's ``block_size`` tokens; equal ids = equal
prefix content), and only such a window. :func:`window_sha256` hashes its canonical bytes (what
the manifest records and every load verifies), the hashes included; a 4-column window hashes
exactly as before the column existed.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import polars as pl

from ..core.errors import DataError

COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "tenant")
SCHEMA = {"arrival_s": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "tenant": pl.String}
HASH_COLUMN = "block_hashes"   # optional 5th column: prompt block hashes (List(Int64))
HASH_DTYPE = pl.List(pl.Int64)
STAT_KEYS = ("rate_rps", "interarrival_cv", "prompt_mean", "prompt_p90", "output_mean", "output_p90")
STATS_SIGNIFICANT_DIGITS = 10  # stats are rounded so float summation order can never change the manifest
P90 = 90
HASH_MAGIC = b"portbench-window-v1"


def columns_of(df: pl.DataFrame) -> tuple[str, ...]:
    """The window columns of ``df``: :data:`COLUMNS`, plus :data:`HASH_COLUMN` when it has one."""
    return COLUMNS + ((HASH_COLUMN,) if HASH_COLUMN in df.columns else ())


def as_window_table(df: pl.DataFrame, window_id: str = "window") -> pl.DataFrame:
    """``df`` checked and cast to the window schema (:data:`COLUMNS` in order, then ``block_hashes`` when
    ``df`` has it); DataError otherwise."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataError(window_id, f"window table lacks column(s) {missing}")
    schema = {**SCHEMA, **({HASH_COLUMN: HASH_DTYPE} if HASH_COLUMN in df.columns else {})}
    try:
        out = df.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
    except pl.exceptions.PolarsError as e:
        raise DataError(window_id, f"window table has a column of the wrong type ({e})") from None
    for c in schema:
        if out[c].null_count():
            raise DataError(window_id, "missing value", column=c)
    if HASH_COLUMN in schema and out[HASH_COLUMN].list.eval(pl.element().is_null().any()).explode().any():
        raise DataError(window_id, "missing value inside a list of block hashes", column=HASH_COLUMN)
    if out.height == 0:
        raise DataError(window_id, "empty window")
    arr = out["arrival_s"].to_numpy()
    if not np.all(np.isfinite(arr)) or arr[0] != 0.0 or np.any(np.diff(arr) < 0):
        raise DataError(window_id, "arrival_s must be finite, start at 0.0 and never decrease", column="arrival_s")
    for c in ("prompt_tokens", "output_tokens"):
        if out[c].min() <= 0:
            raise DataError(window_id, "token counts must be positive", column=c)
    return out


def _hash_field(h, data: bytes) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def window_sha256(df: pl.DataFrame) -> str:
    """SHA-256 of a table's canonical bytes: column names, dtypes and little-endian values.

    Layout: magic, row and column counts, then per column its name, a dtype code (``f8``, ``i8``,
    ``str``, ``list<i8>``) and its values (``<f8`` / ``<i8`` arrays; strings as length-prefixed
    UTF-8; a list column as its ``<i8`` row lengths, then all its values as one ``<i8`` array).
    Every field is length-prefixed, so the bytes do not depend on the platform, polars' chunking
    or its version. Nulls are not allowed.
    """
    h = hashlib.sha256()
    _hash_field(h, HASH_MAGIC)
    h.update(struct.pack("<QQ", df.height, df.width))
    for name in df.columns:
        s = df[name]
        if s.null_count():
            raise DataError("window", "cannot hash a column with missing values", column=name)
        _hash_field(h, name.encode())
        if s.dtype == pl.Float64:
            _hash_field(h, b"f8")
            _hash_field(h, np.ascontiguousarray(s.to_numpy(), dtype="<f8").tobytes())
        elif s.dtype == pl.Int64:
            _hash_field(h, b"i8")
            _hash_field(h, np.ascontiguousarray(s.to_numpy(), dtype="<i8").tobytes())
        elif s.dtype == pl.String:
            _hash_field(h, b"str")
            for v in s.to_list():
                _hash_field(h, v.encode())
        elif s.dtype == HASH_DTYPE:
            _hash_field(h, b"list<i8>")
            _hash_field(h, np.ascontiguousarray(s.list.len().to_numpy(), dtype="<i8").tobytes())
            flat = s.explode().drop_nulls()      # an empty list explodes to one null
            if int(s.list.len().sum() or 0) != flat.len():
                raise DataError("window", "cannot hash a list with missing values", column=name)
            _hash_field(h, np.ascontiguousarray(flat.to_numpy(), dtype="<i8").tobytes())
        else:
            raise DataError("window", f"cannot hash dtype {s.dtype}", column=name)
    return h.hexdigest()


def _round(x: float) -> float | None:
    if x is None or not np.isfinite(x):
        return None
    return float(f"{float(x):.{STATS_SIGNIFICANT_DIGITS}g}")


def window_stats(df: pl.DataFrame) -> dict[str, float | None]:
    """Summary of one window table.

    ``rate_rps`` = (n-1)/duration (the reciprocal of the mean inter-arrival gap),
    ``interarrival_cv`` = population std / mean of the gaps, token means and 90th percentiles
    (numpy's linear interpolation). ``None`` where undefined (zero duration).
    """
    arr = df["arrival_s"].to_numpy()
    gaps = np.diff(arr)
    duration = float(arr[-1] - arr[0])
    mean_gap = float(gaps.mean()) if gaps.size else 0.0
    p = df["prompt_tokens"].to_numpy().astype(np.float64)
    o = df["output_tokens"].to_numpy().astype(np.float64)
    return {
        "rate_rps": _round(gaps.size / duration) if duration > 0 else None,
        "interarrival_cv": _round(gaps.std() / mean_gap) if mean_gap > 0 else None,
        "prompt_mean": _round(p.mean()), "prompt_p90": _round(np.percentile(p, P90)),
        "output_mean": _round(o.mean()), "output_p90": _round(np.percentile(o, P90)),
    }
