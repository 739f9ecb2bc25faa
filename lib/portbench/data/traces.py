"""Official trace files -> the canonical request table, with a validation report.

One adapter per official format (:data:`FORMATS`):

============  ==========================================================================
azure2023     Azure LLM inference trace 2023: ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``,
              7 fractional digits), ``ContextTokens``, ``GeneratedTokens``
azure2024     Azure week-long traces 2024: the same columns, ``TIMESTAMP`` with a UTC offset
              (``2024-05-12 00:00:00.001163+00:00``; the fraction may be absent)
burstgpt      BurstGPT, 6 columns (v1/v2) or 8 columns (v3 adds ``Session ID``, ``Elapsed time``)
qwen_jsonl    Bailian/Qwen JSON Lines (``chat_id, parent_chat_id, timestamp, input_length,
              output_length, type, turn``; ``hash_ids``, 16-token block hashes, when present)
qwen_csv      the mirror's Qwen slice: the same fields as CSV plus its ``window`` column
============  ==========================================================================

Any other file (and the built-in ``mooncake`` source) is read by the generic adapter
(:mod:`portbench.data.generic`): CSV / JSON Lines / parquet with a column mapping
(``sources.<name>.columns``); a file without a mapping is read by the official adapter whose header
(or, for JSON Lines, whose first record's keys) it matches -- the format comes from the content,
never from the file's extension.

Canonical table: ``source, file, row, arrival_s, prompt_tokens, output_tokens`` and, where the
format has them, ``model, log_type, session_id, turn, req_type, tenant`` and ``block_hashes``
(List(Int64): prompt block hashes -- Qwen's ``hash_ids``, a mapped column of a generic file). ``row`` is the 1-based data row
of the raw file (CSV: header = row 0; JSONL: the line number). ``arrival_s`` is seconds from the
file's first row. Bailian's ``session_id`` is the ``chat_id`` of the conversation's first turn
found by following ``parent_chat_id`` links (the earliest ancestor present in the file).

Validation is strict and vectorised: a missing, renamed or extra column, an unparsable or missing
value, zero or negative tokens, timestamps out of order, a blank line, an empty file, or a line
with the wrong number of fields is one :class:`~portbench.core.errors.DataError` that names the file,
the first offending row (or the column) and what was expected. Rows the source itself defines as
invalid are excluded and counted in the report, never silently: BurstGPT failures (0 response
tokens) as ``failure_zero_response``. BurstGPT rows must also satisfy Request + Response = Total
and use the published ``Model`` / ``Log Type`` vocabularies (true of every row of the published
files according to third-party full-file audits), which catches truncated values.

**Large files** (issue #27): a file over :data:`generic.CHUNKED_BYTES` read in an Azure format or through a column
mapping is read, typed and validated in parts of :data:`generic.CHUNK_ROWS` rows (:func:`write_canonical_parts`),
its canonical table written to parquet part by part; the report's medians, the plausibility and timestamp checks
read that file back in blocks, and later stages take what they need from :func:`scan_canonical`. The tables,
reports and messages are those of reading in one piece (``tests/test_large_traces.py``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from . import generic, plausibility, registry, trace_checks
from ..core import io, progress
from ..core.config import Config, DataSettings, PathsConfig, SourceConfig, StandinsConfig
from ..core.errors import DataError

FORMATS = ("azure2023", "azure2024", "burstgpt", "qwen_jsonl", "qwen_csv")
SOURCE_OF_FORMAT = {"azure2023": "azure", "azure2024": "azure", "burstgpt": "burstgpt",
                    "qwen_jsonl": "bailian", "qwen_csv": "bailian"}
CANONICAL_VERSION = 2  # bump when an adapter's output changes: cached canonical tables are rebuilt
CANONICAL_COLUMNS = ("source", "file", "row", "arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("model", "log_type", "session_id", "turn", "req_type", "tenant", "block_hashes")
CANONICAL_SCHEMA = {"source": pl.String, "file": pl.String, "row": pl.Int64, "arrival_s": pl.Float64,
                    "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "model": pl.String,
                    "log_type": pl.String, "session_id": pl.String, "turn": pl.Int64, "req_type": pl.String,
                    "tenant": pl.String, "block_hashes": pl.List(pl.Int64)}
GENERIC = "generic"   # the report's adapter name for a file read through a column mapping
FAILURE_ZERO_RESPONSE = "failure_zero_response"

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
AZURE_TS_FORMAT = {"azure2023": "%Y-%m-%d %H:%M:%S%.f", "azure2024": "%Y-%m-%d %H:%M:%S%.f%:z"}
AZURE_TS_EXAMPLE = {"azure2023": "2023-11-16 18:15:46.6805900", "azure2024": "2024-05-12 00:00:00.001163+00:00"}
BURST6 = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
BURST8 = ("Timestamp", "Session ID", "Elapsed time", "Model", "Request tokens", "Response tokens",
          "Total tokens", "Log Type")
BURST_MODELS = ("ChatGPT", "GPT-4")
BURST_LOG_TYPES = ("Conversation log", "API log")
QWEN_FIELDS = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn")
QWEN_CSV_COLUMNS = QWEN_FIELDS + ("window",)
QWEN_HASHES = "hash_ids"   # optional: 16-token prompt block hashes
QWEN_SCHEMA = {"chat_id": pl.Int64, "parent_chat_id": pl.Int64, "timestamp": pl.Float64,
               "input_length": pl.Int64, "output_length": pl.Int64, "type": pl.String, "turn": pl.Int64}
HEADERS = {"azure2023": (AZURE_COLUMNS,), "azure2024": (AZURE_COLUMNS,), "burstgpt": (BURST6, BURST8),
           "qwen_csv": (QWEN_CSV_COLUMNS,)}

_ROW = "__row"      # 1-based data row
_BLANK = "__blank"  # every field of the line is empty
_MAX_SHOWN = 160    # characters of a raw line quoted in an error message
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class _Check:
    """A vectorised validity rule: ``bad`` is True on offending rows."""

    column: str | None
    bad: pl.Expr
    expected: str
    versus_previous: bool = False  # the message also quotes the previous row's value


# --------------------------------------------------------------------------- raw file helpers


def _data_lines(path: Path, header: bool) -> int:
    """Lines of the file, not counting trailing blank lines, minus the header line.

    Blank: empty but for a carriage return (CSV); JSON Lines (no header) also allows other whitespace.
    """
    newlines, tail = 0, b""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            newlines += chunk.count(b"\n")
            tail = chunk[-(1 << 16):] if len(chunk) >= 1 << 16 else (tail + chunk)[-(1 << 16):]
    if not tail:
        return 0
    lines = newlines + (0 if tail.endswith(b"\n") else 1)
    parts = tail.split(b"\n")
    if tail.endswith(b"\n"):
        parts.pop()
    trailing = 0
    for part in reversed(parts):
        if (part.strip(b"\r") if header else part.strip()):
            break
        trailing += 1
    return max(lines - trailing - (1 if header else 0), 0)


def _raw_lines(path: Path, numbers: Sequence[int]) -> dict[int, str]:
    """The text of the given 1-based line numbers (decoded leniently, line ending stripped)."""
    want, out = set(numbers), dict[int, str]()
    if not want:
        return out
    top = max(want)
    with open(path, "rb") as f:
        for i, line in enumerate(f, start=1):
            if i in want:
                out[i] = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
            if i >= top:
                break
    return out


def _shown(text: str) -> str:
    return repr(text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...")


def _read_header(path: Path) -> list[str]:
    """The CSV header's column names (DataError on an empty or unreadable file)."""
    if path.stat().st_size == 0:
        raise DataError(path, "empty file: expected a CSV header and data rows")
    return generic.header_text(path, 1 << 16).split(",")


def _check_header(path: Path, found: list[str], accepted: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The accepted header equal to ``found``, else a DataError naming the offending column."""
    for h in accepted:
        if tuple(found) == tuple(h):
            return tuple(h)
    best = min(accepted, key=lambda h: len(set(h) ^ set(found)))
    want = " | ".join(",".join(h) for h in accepted)
    missing = [c for c in best if c not in found]
    extra = [c for c in found if c not in best]
    if missing:
        raise DataError(path, f"missing column (renamed or absent); expected header {want}, found {','.join(found)}",
                        column=missing[0])
    if extra:
        raise DataError(path, f"unexpected column; expected header {want}, found {','.join(found)}", column=extra[0])
    raise DataError(path, f"columns in an unexpected order; expected header {want}, found {','.join(found)}")


# --------------------------------------------------------------------------- diagnosis (error path only)


def _diagnose_csv(path: Path, ncols: int) -> DataError | None:
    """The first line with invalid UTF-8, a wrong field count, or an interior blank line."""
    pending_blank = None
    with open(path, "rb") as f:
        f.readline()
        for row, raw in enumerate(f, start=1):
            body = raw.rstrip(b"\r\n")
            if not body.strip(b"\r"):
                pending_blank = pending_blank or row
                continue
            if pending_blank is not None:
                return DataError(path, f"blank line: expected {ncols} comma-separated fields", row=pending_blank)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as e:
                return DataError(path, f"not valid UTF-8 ({e.reason} at byte {e.start})", row=row)
            fields = text.split(",")
            if len(fields) != ncols:
                return DataError(path, f"has {len(fields)} fields, expected {ncols} (truncated or malformed "
                                       f"line): {_shown(text)}", row=row)
            if not any(fields):
                return DataError(path, f"line with no values: expected {ncols} comma-separated fields", row=row)
    return None


def _json_type_problem(key: str, value: Any) -> str | None:
    if value is None:
        return "null"
    if key == "type":
        return None if isinstance(value, str) else f"{value!r}: expected a string"
    if key == "timestamp":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"{value!r}: expected a number of seconds"
    ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _INT64_MAX
    return None if ok else f"{value!r}: expected an integer"


def _diagnose_jsonl(path: Path) -> DataError | None:
    """The first line that is blank (inside the file), not a JSON object, or lacks a field of the right type."""
    def check(rec: dict, line_no: int) -> DataError | None:
        for key in QWEN_FIELDS:
            if key not in rec:
                return DataError(path, "missing key", row=line_no, column=key)
            problem = _json_type_problem(key, rec[key])
            if problem:
                return DataError(path, problem, row=line_no, column=key)
        h = rec.get(QWEN_HASHES)
        if h is not None and not (isinstance(h, list) and all(
                isinstance(x, int) and not isinstance(x, bool) and abs(x) <= _INT64_MAX for x in h)):
            return DataError(path, f"{_shown(json.dumps(h))}: expected a list of integers (block hashes)",
                             row=line_no, column=QWEN_HASHES)
        return None

    return generic.diagnose_jsonl(path, check, _MAX_SHOWN)


# --------------------------------------------------------------------------- readers (typed, with row numbers)


def _scan_csv(path: Path, header: Sequence[str], typed: Mapping[str, pl.Expr]) -> pl.DataFrame:
    """Read ``path`` as strings and apply the per-column casts in ``typed`` (nulls where unparsable)."""
    lf = pl.scan_csv(path, has_header=True, schema={c: pl.String for c in header}, quote_char=None,
                     raise_if_empty=False, row_index_name=_ROW, row_index_offset=1)
    lf = lf.select(pl.col(_ROW).cast(pl.Int64),
                   pl.all_horizontal([pl.col(c).is_null() for c in header]).alias(_BLANK),
                   *[e.alias(name) for name, e in typed.items()])
    try:
        df = lf.collect(engine="streaming")  # batches: the raw strings are never all in memory
    except pl.exceptions.PolarsError as e:
        raise _diagnose_csv(path, len(header)) or DataError(path, f"unreadable as CSV ({e})") from None
    lines = _data_lines(path, header=True)
    trailing = 0
    if df.height and df[_BLANK][-1]:  # trailing blank lines are not records
        nonblank = df[_BLANK].not_().arg_true()
        trailing = df.height - (int(nonblank[-1]) + 1 if len(nonblank) else 0)
        df = df.head(df.height - trailing)
    if df.height != lines:
        raise _diagnose_csv(path, len(header)) or DataError(
            path, f"read {df.height} rows but the file has {lines} data lines")
    blank = df[_BLANK].arg_true()
    if len(blank):
        raise DataError(path, f"blank line or line with no values: expected {len(header)} comma-separated "
                              "fields", row=int(df[_ROW][int(blank[0])]))
    return df.drop(_BLANK)


def _csv_parts(path: Path, header: Sequence[str], typed: Mapping[str, pl.Expr]) -> Iterator[pl.DataFrame]:
    """:func:`_scan_csv` in parts of :data:`generic.CHUNK_ROWS` rows (memory: one part, whatever the file's size),
    with a progress bar: the same rows, blank-line rules and messages."""
    lf = pl.scan_csv(path, has_header=True, schema={c: pl.String for c in header}, quote_char=None,
                     raise_if_empty=False, row_index_name=_ROW, row_index_offset=1)
    lf = lf.select(pl.col(_ROW).cast(pl.Int64),
                   pl.all_horizontal([pl.col(c).is_null() for c in header]).alias(_BLANK),
                   *[e.alias(name) for name, e in typed.items()])
    lines = _data_lines(path, header=True)
    n, pending_blank = 0, None
    blank_line = f"blank line or line with no values: expected {len(header)} comma-separated fields"
    bar = progress.bar(lines, f"reading {path.name}", "row")
    try:
        for batch in lf.collect_batches(chunk_size=generic.CHUNK_ROWS):
            blank = batch[_BLANK]
            if pending_blank is not None and not blank.all():
                raise DataError(path, blank_line, row=pending_blank)
            if blank.any():
                keep = blank.not_().arg_true()
                first_blank = int(blank.arg_true()[0])
                if len(keep) and first_blank < int(keep[-1]):
                    raise DataError(path, blank_line, row=int(batch[_ROW][first_blank]))
                pending_blank = pending_blank or int(batch[_ROW][first_blank])
                batch = batch.head(int(keep[-1]) + 1 if len(keep) else 0)
            n += batch.height
            bar.update(batch.height)
            if batch.height:
                yield batch.drop(_BLANK)
    except pl.exceptions.PolarsError as e:
        raise _diagnose_csv(path, len(header)) or DataError(path, f"unreadable as CSV ({e})") from None
    finally:
        bar.close()
    if n != lines:
        raise _diagnose_csv(path, len(header)) or DataError(path, f"read {n} rows but the file has {lines} data lines")


def _validated_parts(path: Path, parts: Iterator[pl.DataFrame], checks: Sequence[_Check],
                     header: Sequence[str]) -> Iterator[pl.DataFrame]:
    """Each part validated as :func:`_validate` validates a whole file; the previous part's last row goes first
    so that the order checks see the boundary (it passed already, so the first failure is in this part)."""
    last = None
    for part in parts:
        _validate(path, part if last is None else pl.concat([last, part]), checks, header=header)
        last = part.tail(1)
        yield part


def _scan_jsonl(path: Path) -> pl.DataFrame:
    """Read a Qwen JSON Lines file with its typed schema; ``row`` = line number."""
    if path.stat().st_size == 0:
        raise DataError(path, "empty file: expected one JSON object per line")
    try:
        df = pl.scan_ndjson(path, schema={**QWEN_SCHEMA, QWEN_HASHES: pl.List(pl.Int64)}).collect()
    except (pl.exceptions.PolarsError, ValueError) as e:
        raise _diagnose_jsonl(path) or DataError(path, f"unreadable as JSON Lines ({e})") from None
    lines = _data_lines(path, header=False)
    if df.height != lines:  # polars skips blank lines; a blank line inside the file is an error
        raise _diagnose_jsonl(path) or DataError(path, f"read {df.height} records but the file has {lines} lines")
    return df.with_row_index(_ROW, offset=1).with_columns(pl.col(_ROW).cast(pl.Int64))


# --------------------------------------------------------------------------- validation


def _positive_int(col: str) -> _Check:
    return _Check(col, pl.col(col).is_null() | (pl.col(col) <= 0), "a positive integer")


def _non_negative_int(col: str) -> _Check:
    return _Check(col, pl.col(col).is_null() | (pl.col(col) < 0), "an integer >= 0")


def _seconds(col: str) -> _Check:
    c = pl.col(col)
    return _Check(col, c.is_null() | c.is_nan() | c.is_infinite() | (c < 0), "a finite number of seconds >= 0")


def _ordered(col: str) -> _Check:
    return _Check(col, (pl.col(col).diff() < 0).fill_null(False), "timestamps in non-decreasing order",
                  versus_previous=True)


def _validate(path: Path, df: pl.DataFrame, checks: Sequence[_Check], *, header: Sequence[str] | None) -> None:
    """Raise one DataError at the first row (in file order) that fails any check."""
    if not checks or df.height == 0:
        return
    firsts = df.select([c.bad.arg_true().first().alias(str(i)) for i, c in enumerate(checks)]).row(0)
    hits = [(idx, i) for i, idx in enumerate(firsts) if idx is not None]
    if not hits:
        return
    idx, i = min(hits)
    check = checks[i]
    n_bad = int(df.select(pl.any_horizontal([c.bad for c in checks]).sum()).item())
    row = int(df[_ROW][idx])
    more = f" ({n_bad:,} rows fail validation; this is the first)" if n_bad > 1 else ""
    line_no = row + 1 if header is not None else row
    raw = _raw_lines(path, [line_no - 1, line_no])
    text = raw.get(line_no, "")

    def value_of(line: str) -> str:
        if header is not None:
            fields = line.split(",")
            return _shown(fields[list(header).index(check.column)]) if len(fields) == len(header) else _shown(line)
        try:
            rec = json.loads(line)
        except ValueError:
            return _shown(line)
        return json.dumps(rec.get(check.column)) if isinstance(rec, dict) else _shown(line)

    if header is not None and len(text.split(",")) != len(header):
        raise DataError(path, f"has {len(text.split(','))} fields, expected {len(header)} (truncated or "
                              f"malformed line): {_shown(text)}{more}", row=row)
    if header is None and check.column not in (_json_object(text) or {check.column: None}):
        raise DataError(path, f"missing key: expected {check.expected}{more}", row=row, column=check.column)
    previous = f" (the previous row has {value_of(raw.get(line_no - 1, ''))})" if check.versus_previous else ""
    raise DataError(path, f"{value_of(text)}: expected {check.expected}{previous}{more}", row=row,
                    column=check.column)


def _json_object(text: str) -> dict | None:
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


# --------------------------------------------------------------------------- adapters


def _origin(col: pl.Expr) -> pl.Expr:
    return col - col.first()


def _times(ts: pl.Series, show, per_second: float = 1.0) -> dict:
    """First/last timestamp in the file's own terms and the span in seconds."""
    if len(ts) == 0:
        return {"t_first": None, "t_last": None, "span_s": 0.0}
    return {"t_first": show(ts[0]), "t_last": show(ts[-1]), "span_s": float(ts[-1] - ts[0]) / per_second}


def _azure_rules(path: Path, fmt: str) -> tuple[list[str], dict[str, pl.Expr], list[_Check]]:
    """The header, the typed columns and the validity checks of an Azure file."""
    header = list(_check_header(path, _read_header(path), HEADERS[fmt]))
    typed = {"ts_ns": pl.col("TIMESTAMP").str.to_datetime(
                 AZURE_TS_FORMAT[fmt], time_unit="ns", strict=False).dt.epoch("ns"),
             "prompt_tokens": pl.col("ContextTokens").cast(pl.Int64, strict=False),
             "output_tokens": pl.col("GeneratedTokens").cast(pl.Int64, strict=False)}
    example = AZURE_TS_EXAMPLE[fmt]
    checks = [_Check("TIMESTAMP", pl.col("ts_ns").is_null(), f"a timestamp like {example}"),
              _positive_int("prompt_tokens"), _positive_int("output_tokens"), _ordered("ts_ns")]
    names = {"prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens", "ts_ns": "TIMESTAMP"}
    return header, typed, [replace(c, column=names.get(c.column, c.column)) for c in checks]


def _azure_body(df: pl.DataFrame, first_ns) -> pl.DataFrame:
    """Canonical rows; ``first_ns``: the file's first timestamp. Seconds = ns times 1e-9 (as polars computed
    ``(ts - ts.first()) / 1e9`` for the tables already written; the same whether the file is read whole or in
    parts)."""
    since = (pl.col("ts_ns") - pl.lit(first_ns, pl.Int64)).cast(pl.Float64) * (1 / 1e9)
    return df.select(pl.col(_ROW).alias("row"), since.alias("arrival_s"),
                     "prompt_tokens", "output_tokens")


def _azure_times(fmt: str, first_ns: int | None, last_ns: int | None) -> dict:
    tz = timezone.utc if fmt == "azure2024" else None

    def stamp(ns: int) -> str:
        try:
            return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).replace(tzinfo=tz).isoformat(sep=" ")
        except (OverflowError, ValueError, OSError):  # outside Python's datetime range
            return f"{ns} ns since 1970-01-01"

    if first_ns is None or last_ns is None:
        return {"t_first": None, "t_last": None, "span_s": 0.0}
    return {"t_first": stamp(first_ns), "t_last": stamp(last_ns), "span_s": float(last_ns - first_ns) / 1e9}


def _read_azure(path: Path, fmt: str) -> tuple[pl.DataFrame, dict]:
    header, typed, checks = _azure_rules(path, fmt)
    df = _scan_csv(path, header, typed)
    _validate(path, df, checks, header=header)
    ns = df["ts_ns"]
    first, last = (ns[0], ns[-1]) if len(ns) else (None, None)
    return _azure_body(df, first), {"columns": list(header), "rows_read": df.height, "excluded": {},
                                    **_azure_times(fmt, first, last)}


def _azure_parts(path: Path, fmt: str, report: dict) -> Iterator[pl.DataFrame]:
    """:func:`_read_azure` in parts (a large file); fills ``report`` after the last part."""
    header, typed, checks = _azure_rules(path, fmt)
    first = last = None
    n = 0
    for part in _validated_parts(path, _csv_parts(path, header, typed), checks, header):
        first = part["ts_ns"][0] if first is None else first
        last = part["ts_ns"][-1]
        n += part.height
        yield _azure_body(part, first)
    report.update({"columns": list(header), "rows_read": n, "excluded": {}, **_azure_times(fmt, first, last)})


def _read_burstgpt(path: Path) -> tuple[pl.DataFrame, dict]:
    header = _check_header(path, _read_header(path), HEADERS["burstgpt"])
    v3 = len(header) == len(BURST8)
    typed = {"ts": pl.col("Timestamp").cast(pl.Float64, strict=False),
             "model": pl.col("Model"),
             "req": pl.col("Request tokens").cast(pl.Int64, strict=False),
             "resp": pl.col("Response tokens").cast(pl.Int64, strict=False),
             "total": pl.col("Total tokens").cast(pl.Int64, strict=False),
             "log_type": pl.col("Log Type")}
    if v3:
        typed |= {"session_id": pl.col("Session ID"),
                  "elapsed": pl.col("Elapsed time").cast(pl.Float64, strict=False)}
    df = _scan_csv(path, header, typed)
    checks = [_seconds("ts"),
              _Check("model", pl.col("model").is_in(BURST_MODELS).not_().fill_null(True),
                     "one of " + ", ".join(BURST_MODELS)),
              _non_negative_int("req"), _non_negative_int("resp"),
              _Check("total", (pl.col("total") != pl.col("req") + pl.col("resp")).fill_null(True),
                     "Request tokens + Response tokens"),
              _Check("log_type", pl.col("log_type").is_in(BURST_LOG_TYPES).not_().fill_null(True),
                     "one of " + ", ".join(BURST_LOG_TYPES)),
              _Check("req", ((pl.col("req") == 0) & (pl.col("resp") > 0)).fill_null(False),
                     "Request tokens > 0 (BurstGPT defines only rows with 0 response tokens as failures)"),
              _ordered("ts")]
    if v3:
        checks.insert(1, _seconds("elapsed"))
    names = {"ts": "Timestamp", "model": "Model", "req": "Request tokens", "resp": "Response tokens",
             "total": "Total tokens", "log_type": "Log Type", "elapsed": "Elapsed time"}
    _validate(path, df, [replace(c, column=names.get(c.column, c.column)) for c in checks], header=header)
    failed = pl.col("resp") == 0
    n_failed = int(df.select(failed.sum()).item())
    extra = [pl.col("session_id").str.strip_chars()] if v3 else []
    out = (df.with_columns(_origin(pl.col("ts")).alias("arrival_s"))
             .filter(~failed)
             .select(pl.col(_ROW).alias("row"), "arrival_s", pl.col("req").alias("prompt_tokens"),
                     pl.col("resp").alias("output_tokens"), "model", "log_type", *extra))
    if v3:  # API rows have no session: empty -> null
        out = out.with_columns(pl.when(pl.col("session_id") == "").then(None)
                               .otherwise(pl.col("session_id")).alias("session_id"))
    return out, {"columns": list(header), "rows_read": df.height,
                 "excluded": {FAILURE_ZERO_RESPONSE: n_failed} if n_failed else {}, **_times(df["ts"], float)}


def _session_roots(chat_id: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, int | None]:
    """Root chat_id of each request by pointer jumping over parent links; index of a cycle row, if any."""
    n = len(chat_id)
    order = np.argsort(chat_id, kind="stable")
    ids_sorted = chat_id[order]
    pos = np.clip(np.searchsorted(ids_sorted, parent), 0, max(n - 1, 0))
    found = (parent != -1) & (ids_sorted[pos] == parent) if n else np.zeros(0, bool)
    ptr = np.where(found, order[pos], np.arange(n))
    for _ in range(64):  # depth doubles each step: 2**64 covers any chain
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            return chat_id[ptr], None
        ptr = nxt
    return chat_id[ptr], int(np.argmax(ptr[ptr] != ptr))


def _read_qwen(path: Path, fmt: str) -> tuple[pl.DataFrame, dict]:
    if fmt == "qwen_csv":
        header = _check_header(path, _read_header(path), HEADERS["qwen_csv"])
        typed = {k: (pl.col(k) if t == pl.String else pl.col(k).cast(t, strict=False))
                 for k, t in QWEN_SCHEMA.items()}
        typed["window"] = pl.col("window").cast(pl.Int64, strict=False)
        df = _scan_csv(path, header, typed)
    else:
        header = None
        df = _scan_jsonl(path)
    if df.height == 0:
        raise DataError(path, "no data rows")
    checks = [_Check("chat_id", pl.col("chat_id").is_null(), "an integer"),
              _Check("parent_chat_id", pl.col("parent_chat_id").is_null() | (pl.col("parent_chat_id") < -1),
                     "an integer >= -1 (-1 for a first turn)"),
              _seconds("timestamp"),
              _positive_int("input_length"), _positive_int("output_length"),
              _Check("type", pl.col("type").is_null() | (pl.col("type").str.strip_chars() == ""), "a request type"),
              _Check("turn", pl.col("turn").is_null(), "an integer"),
              _ordered("timestamp")]
    if fmt == "qwen_csv":
        checks.append(_Check("window", pl.col("window").is_null(), "an integer"))
    hashed = QWEN_HASHES in df.columns and df[QWEN_HASHES].null_count() < df.height
    if hashed:   # block hashes on some lines: on every line
        checks.append(_Check(QWEN_HASHES, pl.col(QWEN_HASHES).is_null(),
                             "a list of integers (block hashes), as on the file's other lines"))
    _validate(path, df, checks, header=header)
    roots, cycle = _session_roots(df["chat_id"].to_numpy(), df["parent_chat_id"].to_numpy())
    if cycle is not None:
        raise DataError(path, "parent_chat_id links form a cycle", row=int(df[_ROW][cycle]), column="parent_chat_id")
    extra = ["window"] if fmt == "qwen_csv" else []
    extra += [pl.col(QWEN_HASHES).alias("block_hashes")] if hashed else []
    out = df.select(pl.col(_ROW).alias("row"), _origin(pl.col("timestamp")).alias("arrival_s"),
                    pl.col("input_length").alias("prompt_tokens"), pl.col("output_length").alias("output_tokens"),
                    pl.Series("session_id", roots).cast(pl.String), "turn", pl.col("type").alias("req_type"), *extra)
    return out, {"columns": list(header or QWEN_FIELDS), "rows_read": df.height, "excluded": {},
                 **_times(df["timestamp"], float)}


# --------------------------------------------------------------------------- public API


_OFFSET = re.compile(r"(Z|[+-]\d{2}:?\d{2})\s*$")


def _first_json_keys(path: Path) -> set[str]:
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                rec = _json_object(raw.decode("utf-8", errors="replace"))
                return set(rec) if rec else set()
    return set()


def detect_format(path: str | os.PathLike) -> str:
    """The official adapter format of a file, from its content (header and first data row, or the
    first JSON record's keys) -- never from its extension. DataError when no official adapter fits
    (such a file needs the generic adapter: ``sources.<name>.columns``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found")
    kind = generic.sniff(path)
    mapping_hint = ("; read it with the generic adapter: give sources.<name>.columns {arrival, prompt_tokens, "
                    "output_tokens} (and time_unit) -- see the README's 'Your own trace'")
    if kind == "jsonl":
        keys = _first_json_keys(path)
        if set(QWEN_FIELDS) <= keys:
            return "qwen_jsonl"
        raise DataError(path, "JSON Lines whose first record has keys " + ", ".join(sorted(keys))
                        + f", not Qwen's ({', '.join(QWEN_FIELDS)})" + mapping_hint)
    if kind == "parquet":
        raise DataError(path, "a parquet file: no official adapter reads parquet" + mapping_hint)
    found = tuple(_read_header(path))
    if found == AZURE_COLUMNS:
        first = _raw_lines(path, [2]).get(2, "").split(",")[0]
        return "azure2024" if _OFFSET.search(first) else "azure2023"
    if found in (BURST6, BURST8):
        return "burstgpt"
    if found == QWEN_CSV_COLUMNS:
        return "qwen_csv"
    raise DataError(path, "unknown trace format: header " + ",".join(found) + " matches no official adapter ("
                    + ", ".join(FORMATS) + ")" + mapping_hint)


def read_file(path: str | os.PathLike, fmt: str | None = None, *, source: str | None = None,
              mapping: "generic.GenericSpec | None" = None) -> tuple[pl.DataFrame, dict]:
    """Read one trace file into the canonical table; returns ``(table, report)``.

    ``mapping`` (a :class:`~portbench.data.generic.GenericSpec`) reads it with the generic adapter;
    else ``fmt`` is one of :data:`FORMATS` (detected from the content when None). ``source``
    defaults to the format's source. The report has ``file, path, format, adapter, source, columns,
    rows_read, rows_valid, excluded {reason: n}, t_first, t_last`` (the file's first/last
    timestamps in its own terms), ``span_s``, ``rate_rps`` (valid requests per second of span),
    token medians and ``sha256`` (None here; filled by :func:`ingest_source`).
    ``rows_read == rows_valid + sum(excluded)``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found")
    if mapping is not None:
        body, rep = generic.read(path, mapping)
        fmt, adapter = rep["container"], GENERIC
    else:
        fmt = fmt or detect_format(path)
        if fmt not in FORMATS:
            raise DataError(path, f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
        adapter = fmt
        if fmt.startswith("azure"):
            body, rep = _read_azure(path, fmt)
        elif fmt == "burstgpt":
            body, rep = _read_burstgpt(path)
        else:
            body, rep = _read_qwen(path, fmt)
    if rep["rows_read"] == 0:
        raise DataError(path, "has a header but no data rows")
    source = source or SOURCE_OF_FORMAT.get(fmt) or path.stem
    table = _canonical(body, source, path.name)
    if sum(rep["excluded"].values()) + table.height != rep["rows_read"]:  # a bug, never bad data
        raise AssertionError(f"{path}: rows do not add up: {rep}")
    report = _full_report(path, fmt, adapter, source, rep, table.lazy(), table.height)
    if mapping is not None:
        report["warnings"] = plausibility.check(body, source=source, columns=dict(mapping.mapped),
                                                time_unit=mapping.time_unit)
    return table, report


def _canonical(body: pl.DataFrame, source: str, file: str) -> pl.DataFrame:
    return body.select(pl.lit(source, pl.String).alias("source"), pl.lit(file, pl.String).alias("file"),
                       pl.all()).with_columns([pl.col(c).cast(t) for c, t in CANONICAL_SCHEMA.items()
                                               if c in body.columns])


def _full_report(path: Path, fmt: str, adapter: str, source: str, rep: dict, table: pl.LazyFrame, rows: int) -> dict:
    """The report of :func:`read_file` from the adapter's ``rep`` and the canonical table (lazily: medians only)."""
    med = [_int_median(table, c) for c in ("prompt_tokens", "output_tokens")]
    return {"file": path.name, "path": str(path), "format": fmt, "adapter": adapter, "source": source, **rep,
            "rows_valid": rows,
            "rate_rps": (rows / rep["span_s"]) if rep["span_s"] > 0 else None,
            "prompt_tokens_median": float(med[0]) if rows else None,
            "output_tokens_median": float(med[1]) if rows else None,
            "sha256": None}


def _int_median(table: pl.LazyFrame, col: str) -> float | None:
    """The median of an integer column from its value counts (memory: one row per distinct value, not the
    column): the middle value, or the mean of the two middle ones -- what ``Series.median`` gives."""
    counts = (table.group_by(col).agg(pl.len().alias("n")).collect(engine="streaming").sort(col))
    n = int(counts["n"].sum()) if counts.height else 0
    if n == 0:
        return None
    ends = np.cumsum(counts["n"].to_numpy())
    values = counts[col].to_numpy()
    lo, hi = values[np.searchsorted(ends, (n - 1) // 2, side="right")], values[np.searchsorted(ends, n // 2,
                                                                                                side="right")]
    return (float(lo) + float(hi)) / 2


def streams(path: str | os.PathLike, fmt: str | None = None, mapping: "generic.GenericSpec | None" = None) -> bool:
    """Whether :func:`ingest_source` reads ``path`` in parts and streams its canonical table to parquet: a file
    larger than :data:`generic.CHUNKED_BYTES` read with the generic adapter (CSV, JSON Lines, parquet) or in an
    Azure format. (Bailian/Qwen files are read in one piece: their sessions link rows across the whole file;
    BurstGPT's official files are at most 0.2 GB.)"""
    path = Path(path)
    if not path.is_file() or not generic.large(path):
        return False
    if mapping is not None:
        return True
    return (detect_format(path) if fmt is None else fmt).startswith("azure")


def write_canonical_parts(path: str | os.PathLike, target: str | os.PathLike, fmt: str | None = None, *,
                          source: str, file: str | None = None,
                          mapping: "generic.GenericSpec | None" = None) -> dict:
    """Read ``path`` in parts (:func:`streams` is True) and write its canonical table to the parquet file
    ``target`` part by part (one row group per part); returns :func:`read_file`'s report, computed from the written
    file lazily. Memory: one part plus one column of the table at a time (the token medians, the plausibility
    and timestamp checks read the file back in blocks)."""
    import pyarrow.parquet as pq

    path = Path(path)
    rep: dict = {}
    if mapping is not None:
        parts, fmt, adapter = generic.read_parts(path, mapping, rep), None, GENERIC
    else:
        fmt = fmt or detect_format(path)
        parts, adapter = _azure_parts(path, fmt, rep), fmt
    writer = None
    rows = 0
    try:
        for body in parts:
            table = _canonical(body, source, file or path.name).to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(str(target), table.schema, compression="zstd")
            writer.write_table(table)
            rows += body.height
    finally:
        if writer is not None:
            writer.close()
    if rows == 0:
        raise DataError(path, "has a header but no data rows")
    fmt = rep.get("container", fmt) if mapping is not None else fmt
    lazy = pl.scan_parquet(target)
    report = _full_report(path, str(fmt), adapter, source, rep, lazy, rows)
    if mapping is not None:
        report["warnings"] = plausibility.check(lazy, source=source, columns=dict(mapping.mapped),
                                                time_unit=mapping.time_unit)
    return report


def read_slice(mirror: Path | None, relpath: str) -> tuple[pl.DataFrame, dict]:
    """A real slice in the data ``mirror`` (e.g. ``burstgpt/BurstGPT_1_first400.csv``) through its adapter.

    The format comes from :data:`portbench.data.registry.SLICES` (detected for other files).
    """
    if mirror is None:
        raise DataError(relpath, "no data mirror (set paths.mirror or $PORTBENCH_DATA_MIRROR)")
    return read_file(mirror / relpath, registry.SLICES.get(relpath))


# --------------------------------------------------------------------------- ingest stage


def canonical_dir(data_dir: Path) -> Path:
    """``{paths.data_dir}/canonical``."""
    return Path(data_dir) / "canonical"


def report_path(data_dir: Path) -> Path:
    """``{paths.data_dir}/canonical/ingest_report.json``."""
    return canonical_dir(data_dir) / "ingest_report.json"


def _loud(msg: str) -> None:
    print(f"[portbench ingest] {msg}", file=sys.stderr, flush=True)


def _read_report(data_dir: Path) -> dict:
    try:
        data = json.loads(report_path(data_dir).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_report(data_dir: Path, entries: Mapping[str, dict]) -> dict:
    """Merge ``entries`` into ingest_report.json; returns the whole report."""
    report = _read_report(data_dir)
    report.setdefault("sources", {}).update(entries)
    report["canonical_version"] = CANONICAL_VERSION
    text = json.dumps(report, indent=1, sort_keys=True, default=str) + "\n"
    io.write_text(report_path(data_dir), text)
    return report


def read_with(src: SourceConfig) -> dict:
    """The parameters that decide how a source's file is read (a change makes its canonical table stale)."""
    return {"format": src.format, "columns": src.columns, "time_unit": src.time_unit, "block_size": src.block_size}


def read_source_file(src: SourceConfig, path: Path, spec: "registry.OfficialFile | None" = None
                     ) -> tuple[pl.DataFrame, dict]:
    """Read a source's file the way its parameters say: the generic adapter when ``columns`` is given,
    else the named official ``format``, the official file's adapter, or the one detected from the content."""
    if src.generic:
        return read_file(path, source=src.name, mapping=generic.GenericSpec.of(src))
    fmt = src.format if src.format in FORMATS else (spec.fmt if spec is not None and spec.fmt in FORMATS else None)
    if src.format is not None and src.format not in FORMATS:
        raise DataError(path, f"sources.{src.name}.format is {src.format!r}: a generic format needs "
                              f"sources.{src.name}.columns (the column mapping); official formats: {', '.join(FORMATS)}")
    return read_file(path, fmt, source=src.name)


def ingest_source(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins: StandinsConfig, source: str,
                  *, write: bool = True) -> tuple[pl.DataFrame | None, dict]:
    """Ingest one source's official file (``sources.<source>.file``) into its canonical table.

    A source with no real file in this run (mode standin, or auto with the file absent) is
    skipped with a loud message and ``(None, report)`` is returned; mode real with the file absent
    raises DataError (from :func:`portbench.data.registry.resolve_source`). With ``write`` the table goes
    to ``{data_dir}/canonical/{source}.parquet`` and the report entry into ``ingest_report.json``.
    """
    st = registry.store(paths)
    data_dir = paths.data_dir
    info = registry.resolve_source(st, sources[source], standins.of(source) is not None)
    if info["provenance"] != "real":
        _loud(f"SKIPPED {source}: no real file in this run -> {info['provenance'] or 'not used'} "
              f"({info['reason']})")
        rep = {"source": source, "file": info["file"], "provenance": info["provenance"], "skipped": True,
               "reason": info["reason"]}
        if write:
            _write_report(data_dir, {source: rep})
        return None, rep
    name, path = info["file"], Path(info["path"])
    spec = registry.OFFICIAL_FILES.get(name) if info.get("origin") == registry.OFFICIAL else None
    target = canonical_dir(data_dir) / f"{source}.parquet"
    src = sources[source]
    mapping = generic.GenericSpec.of(src) if src.generic else None
    table: pl.DataFrame | None = None
    fmt = None
    if write and path.is_file() and generic.large(path) and streams(
            path, fmt := (None if mapping is not None else _format_of(src, path, spec)), mapping):   # large: read in parts, the table streamed to parquet
        reports: list[dict] = []
        io.atomic_write(target, lambda tmp: reports.append(write_canonical_parts(
            path, tmp, fmt, source=source, file=Path(name).name, mapping=mapping)))
        rep = reports[0]
        arrivals = _arrival_blocks(target)
    else:
        table, rep = read_source_file(src, path, spec)
        table = table.with_columns(pl.lit(Path(name).name, pl.String).alias("file"))
        arrivals = None
    for w in rep.get("warnings") or []:
        _loud(f"WARNING {source} ({Path(name).name}): {w}")
    rep["file"] = Path(name).name
    rep["timestamps"] = (trace_checks.timestamp_check(table["arrival_s"].to_numpy()) if table is not None
                         else trace_checks.sorted_timestamp_check(arrivals))   # quantised arrivals?
    if rep["timestamps"]["quantised"]:
        step = rep["timestamps"]["grid_step_s"]
        _loud(f"{source}: quantised timestamps -- {rep['timestamps']['zero_gap_share']:.0%} of consecutive gaps are "
              f"zero" + (f", arrivals on a {step:g} s grid" if step else "") + " (simulation.arrival_jitter spreads "
              "them within the grid)")
    if spec is not None and spec.rows is not None and rep["rows_read"] != spec.rows:
        raise DataError(path, f"read {rep['rows_read']:,} data rows, but the official {name} has {spec.rows:,}")
    rep |= {"provenance": "real", "origin": info.get("origin"), "skipped": False, "sha256": st.sha256(path),
            "sha256_verified": bool(spec and spec.sha256), "canonical_version": CANONICAL_VERSION,
            "read_with": read_with(src)}
    if write:
        if table is not None:
            io.atomic_write(target, lambda tmp: table.write_parquet(tmp))
        rep["canonical"] = str(target)
        _write_report(data_dir, {source: rep})
    return table, rep


def _format_of(src: SourceConfig, path: Path, spec: "registry.OfficialFile | None") -> str | None:
    """The official format a source's file is read in (as :func:`read_source_file` chooses it)."""
    if src.format in FORMATS:
        return src.format
    if spec is not None and spec.fmt in FORMATS:
        return spec.fmt
    if src.format is not None:
        return ""       # not an official format: read_source_file names the problem
    return detect_format(path)


def _arrival_blocks(target: Path):
    """A function giving the canonical parquet file's arrival column in blocks (for the checks on a large table)."""
    def blocks():
        for part in pl.scan_parquet(target).select("arrival_s").collect_batches(chunk_size=generic.CHUNK_ROWS):
            yield part["arrival_s"].to_numpy()
    return blocks


def ingest_all(cfg: Config) -> dict:
    """Ingest every configured source; writes the canonical parquet files and ``ingest_report.json``."""
    entries = {}
    for source in cfg.source_names():
        _, entries[source] = ingest_source(cfg.paths, cfg.sources, cfg.standins, source, write=True)
    report = _write_report(cfg.paths.data_dir, entries)
    return {**report, "sources": {s: report["sources"][s] for s in entries}}


def scan_canonical(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins: StandinsConfig,
                   source: str) -> pl.LazyFrame:
    """The canonical table of ``source`` as a lazy scan of its parquet file (nothing read yet: a stage takes the
    rows and columns it needs), ingesting first when it is missing or stale (:func:`load_canonical`)."""
    st = registry.store(paths)
    info = registry.resolve_source(st, sources[source], standins.of(source) is not None)
    if info["provenance"] != "real":
        raise DataError(info["file"] or f"sources.{source}.file",
                        f"no canonical table for {source}: {info['reason']}")
    target = canonical_dir(paths.data_dir) / f"{source}.parquet"
    entry = _read_report(paths.data_dir).get("sources", {}).get(source) or {}
    fresh = (target.is_file() and entry.get("file") == Path(info["file"]).name
             and entry.get("canonical_version") == CANONICAL_VERSION
             and entry.get("read_with") == read_with(sources[source])
             and entry.get("sha256") == st.sha256(info["path"]))
    if not fresh:
        ingest_source(paths, sources, standins, source, write=True)
    return pl.scan_parquet(target)


def load_canonical(data: DataSettings, source: str) -> pl.DataFrame:
    """The canonical table of ``source``, ingesting first when it is missing or stale.

    Stale: the recorded file name, SHA-256, adapter version or reading parameters (format, column
    mapping, time unit, block size) differ from now.
    DataError when the source has no real file in this run. (The whole table in memory: a stage that can read
    only what it needs uses :func:`scan_canonical`.)
    """
    return scan_canonical(data.paths, data.sources, data.standins, source).collect()
