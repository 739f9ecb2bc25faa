"""The generic trace adapter: any CSV / JSON Lines / parquet file with a column mapping.

A source of one's own (or a built-in one such as ``mooncake``) names its file's columns::

    sources:
      mytrace:
        file: path/or/mirror-relative/name
        format: csv | jsonl | parquet          # default: detected from the content, not the extension
        columns: {arrival: timestamp, prompt_tokens: input_length, output_tokens: output_length,
                  tenant: null, block_hashes: hash_ids}
        time_unit: s | ms | us | datetime
        block_size: 512                        # tokens per hash block, with block_hashes

**Format** (:func:`sniff`): a file starting with parquet's magic bytes ``PAR1`` is parquet; one whose
first non-blank character is ``{`` is JSON Lines; anything else is CSV (comma-separated, a header
line, double quotes for fields holding commas). A ``format`` that contradicts the content is an error.

**Columns.** ``arrival``, ``prompt_tokens`` and ``output_tokens`` are required; ``tenant`` (any
value, read as text) and ``block_hashes`` are optional. Other columns of the file are ignored.

**Values.** ``arrival``: numbers in the ``time_unit`` (``s``, ``ms``, ``us``; integers or decimals,
>= 0) or, with ``datetime``, date-times as text (ISO 8601: ``2024-05-12 00:00:00.001``, ``T``
separator, optional fraction and UTC offset; a parquet datetime column is also accepted), never
decreasing in file order; the canonical ``arrival_s`` is seconds from the first row. Token counts:
integers > 0. ``block_hashes``: a list of integers per row (JSON array; parquet list column; in CSV
a quoted JSON array ``"[1, 2, 3]"`` or integers separated by spaces, ``;`` or ``|``), exactly
``ceil(prompt_tokens / block_size)`` of them (a different count almost always means a wrong
``block_size``).

**Errors.** Bad input is one :class:`~portbench.core.errors.DataError` naming the file, the row
(1-based data row; JSON Lines: the line number) and the column (the file's own column name), with
the offending value and what was expected: a missing mapped column, an unparsable / missing /
non-positive value, timestamps out of order, a wrong number of block hashes, a blank or ragged
line, invalid UTF-8, an empty file, a file in another format than the one named.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ..core import progress
from ..core.config import GENERIC_FORMATS, REQUIRED_ROLES, SourceConfig
from ..core.errors import DataError

ROW = "__row"
UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000}   # divided (not multiplied): exact for integer ms
CHUNKED_BYTES = 64 << 20   # a CSV file larger than this is read in parts (bounded memory, a progress bar)
CHUNK_ROWS = 1_000_000     # rows per part
_INT_LIST = r"^\s*\[?\s*(-?\d+([\s,;|]+-?\d+)*)?\s*\]?\s*$"   # a CSV cell holding a list of integers
_SHOWN = 120


@dataclass(frozen=True)
class GenericSpec:
    """How to read a file generically (from a :class:`~portbench.core.config.SourceConfig`)."""

    columns: Mapping[str, str | None]
    format: str | None = None
    time_unit: str = "s"
    block_size: int | None = None

    @classmethod
    def of(cls, src: SourceConfig) -> "GenericSpec":
        return cls(columns=dict(src.columns or {}), format=src.format, time_unit=src.time_unit,
                   block_size=src.block_size)

    @property
    def mapped(self) -> dict[str, str]:
        """``{role: file column}`` of the mapped roles."""
        return {role: col for role, col in self.columns.items() if col}


def _shown(v) -> str:
    text = v if isinstance(v, str) else json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else str(v)
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


# --------------------------------------------------------------------------- format


def sniff(path: Path) -> str:
    """``parquet`` | ``jsonl`` | ``csv`` from the file's first bytes (DataError on an empty file)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        raise DataError(path, "empty file: expected a CSV header, JSON Lines or parquet")
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    return "jsonl" if text.startswith(b"{") else "csv"


def container(path: Path, named: str | None) -> str:
    """The container format to read ``path`` as: ``named`` checked against the content, else sniffed."""
    found = sniff(path)
    if named is None:
        return found
    if named not in GENERIC_FORMATS:
        raise DataError(path, f"format {named!r}: expected one of {', '.join(GENERIC_FORMATS)} for a file read "
                              "with a columns mapping")
    if (named == "parquet") != (found == "parquet") or (named == "jsonl") != (found == "jsonl"):
        raise DataError(path, f"format {named} was named, but the content is {found} "
                              f"({'parquet magic bytes PAR1' if found == 'parquet' else 'text'}); "
                              "drop `format` to detect it")
    return named


# --------------------------------------------------------------------------- readers -> raw frames


def _missing_columns(path: Path, found: Sequence[str], spec: GenericSpec) -> None:
    for role, col in spec.mapped.items():
        if col not in found:
            raise DataError(path, f"missing column for {role} (sources.<name>.columns.{role}); the file's columns "
                                  f"are {', '.join(map(str, found)) or '(none)'}", column=col)


def header_text(path: Path, max_bytes: int = 1 << 20) -> str:
    """A CSV file's first line (at most ``max_bytes``), without BOM and line ending; DataError when it is not
    UTF-8 or blank."""
    with open(path, "rb") as f:
        first = f.readline(max_bytes)
    try:
        text = first.decode("utf-8").lstrip("\ufeff").rstrip("\r\n")
    except UnicodeDecodeError:
        raise DataError(path, "header is not valid UTF-8", row=0) from None
    if not text.strip():
        raise DataError(path, "first line is blank: expected a CSV header", row=0)
    return text


def _csv_header(path: Path, spec: GenericSpec) -> list[str]:
    """The CSV header's column names, checked (valid UTF-8, not blank, no duplicate, every mapped column)."""
    header = next(csv.reader([header_text(path)]))
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise DataError(path, "duplicate column name in the header", row=0, column=dup[0])
    _missing_columns(path, header, spec)
    return header


def _raw_parts(path: Path, spec: GenericSpec, kind: str, header: list[str] | None) -> Iterator[pl.DataFrame]:
    """The file's mapped columns and ``ROW`` in batches of :data:`CHUNK_ROWS` rows (CSV cells as text, JSON values
    with the roles' types, parquet columns as stored)."""
    used = list(dict.fromkeys(spec.mapped.values()))
    if kind == "csv":
        lf = pl.scan_csv(path, has_header=True, schema={c: pl.String for c in header or []}, quote_char='"',
                         row_index_name=ROW, row_index_offset=1)
    elif kind == "jsonl":
        lf = pl.scan_ndjson(path, schema=_jsonl_schema(spec)).with_row_index(ROW, offset=1)
    else:
        lf = pl.scan_parquet(path).select(used).with_row_index(ROW, offset=1)
    yield from lf.select(pl.col(ROW).cast(pl.Int64), *used).collect_batches(chunk_size=CHUNK_ROWS)


def read_parts(path: Path, spec: GenericSpec, report: dict) -> Iterator[pl.DataFrame]:
    """A file read, typed and validated in parts of :data:`CHUNK_ROWS` rows, with a progress bar: yields the
    canonical body (as :func:`read` returns it) part by part and fills ``report`` (as :func:`read`'s) once the last
    part is read. Memory: one part's text and columns, whatever the file's size; the same checks and messages as
    reading in one piece (an error is raised where the offending part is read)."""
    path = Path(path)
    kind = _checked_kind(path, spec)
    header = _csv_header(path, spec) if kind == "csv" else None
    if kind == "parquet":
        _parquet_columns(path, spec)
        lines = int(pl.scan_parquet(path).select(pl.len()).collect().item())
    else:
        lines = max(_data_lines(path) - (1 if kind == "csv" else 0), 0)
    used = list(dict.fromkeys(spec.mapped.values()))
    prev, pending_blank, n, first = None, None, 0, None
    bar = progress.bar(lines, f"reading {path.name}", "row")
    try:
        for batch in _raw_parts(path, spec, kind, header):
            if kind == "csv":
                batch, pending_blank = _without_trailing_blanks(path, batch, used, len(header or []), pending_blank)
            if batch.height:
                typed = _typed(batch, path, spec)
                try:
                    _validate(path, typed, spec, kind, len(header) if header else None, prev=prev)
                except DataError as err:
                    if kind == "jsonl":     # a blank line before it shifts the record numbers: name that line
                        raise _diagnose_jsonl(path, spec) or err from None
                    raise
                if first is None:
                    first = typed["t"][0]
                prev = (typed["t"][-1], typed["__raw_arrival"][-1])
                n += batch.height
                yield _body(typed, first)
            bar.update(batch.height)
    except pl.exceptions.PolarsError as e:
        raise _unreadable(path, spec, kind, header, e) from None
    finally:
        bar.close()
    if n != lines and kind != "parquet":   # one record per line: a quoted field spanning lines is not a trace row
        raise (_diagnose_csv(path, header or []) if kind == "csv" else _diagnose_jsonl(path, spec)) or DataError(
            path, f"read {n} records but the file has {lines} data lines (an unbalanced quote?)")
    if n == 0:
        raise DataError(path, "no data rows")
    report.update(_report(spec, kind, n, first, prev[0] if prev else None))


def _without_trailing_blanks(path: Path, batch: pl.DataFrame, used: list[str], ncols: int,
                             pending_blank: int | None) -> tuple[pl.DataFrame, int | None]:
    """A CSV part without its trailing blank lines (records only if nothing but blank lines follows them: a blank
    line inside the file is an error naming it); returns the part and the first blank row still pending."""
    blank = batch.select(pl.all_horizontal([pl.col(c).is_null() for c in used])).to_series()
    if pending_blank is not None and not blank.all():
        raise DataError(path, f"blank line or line with no values: expected {ncols} comma-separated fields",
                        row=pending_blank)
    if blank.any():
        keep = blank.not_().arg_true()
        first_blank = int(batch[ROW][int(blank.arg_true()[0])])
        if len(keep) and int(blank.arg_true()[0]) < int(keep[-1]):
            raise DataError(path, f"blank line or line with no values: expected {ncols} comma-separated fields",
                            row=first_blank)
        pending_blank = pending_blank or first_blank
        batch = batch.head(int(keep[-1]) + 1 if len(keep) else 0)
    return batch, pending_blank


def _unreadable(path: Path, spec: GenericSpec, kind: str, header: list[str] | None, e: Exception) -> DataError:
    if kind == "csv":
        return _diagnose_csv(path, header or []) or DataError(path, f"unreadable as CSV ({e})")
    if kind == "jsonl":
        return _diagnose_jsonl(path, spec) or DataError(path, f"unreadable as JSON Lines ({e})")
    return DataError(path, f"unreadable as parquet ({e})")


def _read_csv(path: Path, spec: GenericSpec) -> pl.DataFrame:
    header = _csv_header(path, spec)
    used = list(dict.fromkeys(spec.mapped.values()))     # only the mapped columns are kept (bounded memory)
    try:
        df = pl.read_csv(path, has_header=True, schema={c: pl.String for c in header}, columns=used, quote_char='"',
                         row_index_name=ROW, row_index_offset=1, raise_if_empty=False)
    except pl.exceptions.PolarsError as e:
        raise _diagnose_csv(path, header) or DataError(path, f"unreadable as CSV ({e})") from None
    blank = df.select(pl.all_horizontal([pl.col(c).is_null() for c in used])).to_series()
    if df.height and blank[-1]:   # trailing blank lines are not records
        keep = blank.not_().arg_true()
        df = df.head(int(keep[-1]) + 1 if len(keep) else 0)
        blank = blank.head(df.height)
    lines = max(_data_lines(path) - 1, 0)
    if df.height != lines:        # one record per line: a quoted field spanning lines is not a trace row
        raise _diagnose_csv(path, header) or DataError(
            path, f"read {df.height} records but the file has {lines} data lines (an unbalanced quote?)")
    if blank.any():
        raise DataError(path, f"blank line or line with no values: expected {len(header)} comma-separated fields",
                        row=int(df[ROW][int(blank.arg_true()[0])]))
    return df.select(pl.col(ROW).cast(pl.Int64), *[pl.col(c) for c in dict.fromkeys(spec.mapped.values())])


def _csv_record(path: Path, row: int) -> list[str] | None:
    """The fields of data row ``row`` (one line per record; error path only; reads up to that line)."""
    for i, line in _lines(path):
        if i == row:
            return next(csv.reader([line]), [])
    return None


def _lines(path: Path):
    """``(row, text)`` of each line, the header as row 0, read line by line (bounded memory): the text decoded
    (BOM and line ending stripped), or ``(row, UnicodeDecodeError)`` where a line is not valid UTF-8; the byte
    offset of that error counts from the start of the file."""
    offset = 0
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            body = raw.rstrip(b"\n")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as e:
                yield i, UnicodeDecodeError(e.encoding, e.object, offset + e.start, offset + e.end, e.reason)
            else:
                yield i, (text.lstrip("\ufeff") if i == 0 else text).rstrip("\r")
            offset += len(raw)


def _diagnose_csv(path: Path, header: Sequence[str]) -> DataError | None:
    """The first line that is not valid UTF-8, holds an unbalanced quote or has the wrong number of fields; the
    file is scanned line by line (any size)."""
    for row, line in _lines(path):
        if isinstance(line, UnicodeDecodeError):
            return DataError(path, f"not valid UTF-8 ({line.reason} at byte {line.start})", row=row)
        if row == 0:
            continue
        if line.count('"') % 2:
            return DataError(path, f"unbalanced double quote (a field may not span lines): {_shown(line)}", row=row)
        fields = next(csv.reader([line]), [])
        if fields and len(fields) != len(header):
            return DataError(path, f"has {len(fields)} fields, expected {len(header)} (truncated or "
                                   f"malformed line): {_shown(line)}", row=row)
    return None


def _json_kind_problem(role: str, value, unit: str) -> str | None:
    if value is None:
        return None   # nulls are reported by validation, with their row
    if role in ("prompt_tokens", "output_tokens"):
        ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63
        return None if ok else "expected an integer number of tokens"
    if role == "arrival":
        if unit == "datetime":
            return None if isinstance(value, str) else "expected a date-time string (time_unit datetime)"
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"expected a number (time_unit {unit})"
    if role == "block_hashes":
        ok = isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**63
                                             for x in value)
        return None if ok else "expected a list of integers (prompt block hashes)"
    return None


def diagnose_jsonl(path: Path, check: Callable[[dict, int], DataError | None],
                   max_shown: int = _SHOWN) -> DataError | None:
    """The first line of a JSON Lines file that is blank (inside the file), not valid UTF-8 or JSON, not a JSON
    object, or that ``check(record, line_no)`` rejects (the error it returns); a line is quoted up to
    ``max_shown`` characters."""
    pending_blank = None
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            body = raw.rstrip(b"\r\n")
            if not body.strip():
                pending_blank = pending_blank or line_no
                continue
            if pending_blank is not None:
                return DataError(path, "blank line: expected one JSON object per line", row=pending_blank)
            try:
                rec = json.loads(body.decode("utf-8"))
            except UnicodeDecodeError as e:
                return DataError(path, f"not valid UTF-8 ({e.reason} at byte {e.start})", row=line_no)
            except ValueError as e:
                text = body.decode("utf-8", "replace")
                return DataError(path, f"not valid JSON ({e}): "
                                 f"{text if len(text) <= max_shown else text[:max_shown] + '...'!r}", row=line_no)
            if not isinstance(rec, dict):
                return DataError(path, f"expected a JSON object, found {type(rec).__name__}", row=line_no)
            problem = check(rec, line_no)
            if problem is not None:
                return problem
    return None


def _diagnose_jsonl(path: Path, spec: GenericSpec) -> DataError | None:
    def check(rec: dict, line_no: int) -> DataError | None:
        for role, col in spec.mapped.items():
            problem = _json_kind_problem(role, rec.get(col), spec.time_unit)
            if problem:
                return DataError(path, f"{_shown(rec.get(col))}: {problem}", row=line_no, column=col)
        return None

    return diagnose_jsonl(path, check)


def _data_lines(path: Path, chunk: int = 1 << 24) -> int:
    """Non-blank-terminated line count of a text file (trailing blank lines not counted), read in chunks (memory
    bounded by ``chunk``, whatever the file's size)."""
    newlines, size = 0, path.stat().st_size
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            newlines += block.count(b"\n")
        tail_len = min(size, chunk)
        while True:            # trailing blank lines: from the end, as far back as the first non-blank byte
            f.seek(size - tail_len)
            tail = f.read(tail_len)
            if tail.strip() or tail_len == size:
                break
            tail_len = min(size, tail_len * 2)
    parts = tail.split(b"\n")
    trailing = 0
    while parts and not parts[-1].strip():
        parts.pop()
        trailing += 1
    return newlines + 1 - trailing


def _jsonl_schema(spec: GenericSpec) -> dict[str, pl.DataType]:
    roles = {col: role for role, col in spec.mapped.items()}
    types = {"arrival": pl.String if spec.time_unit == "datetime" else pl.Float64, "prompt_tokens": pl.Int64,
             "output_tokens": pl.Int64, "tenant": pl.String, "block_hashes": pl.List(pl.Int64)}
    return {c: types[roles[c]] for c in dict.fromkeys(spec.mapped.values())}


def _read_jsonl(path: Path, spec: GenericSpec) -> pl.DataFrame:
    schema = _jsonl_schema(spec)
    try:
        df = pl.read_ndjson(path, schema=schema)
    except pl.exceptions.PolarsError as e:
        raise _diagnose_jsonl(path, spec) or DataError(path, f"unreadable as JSON Lines ({e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _diagnose_jsonl(path, spec) or DataError(path, f"unreadable as JSON Lines ({e})") from None
    lines = _data_lines(path)
    if df.height != lines:    # polars skips blank lines; one inside the file is an error
        raise _diagnose_jsonl(path, spec) or DataError(path, f"read {df.height} records but the file has {lines} lines")
    return df.with_row_index(ROW, offset=1).with_columns(pl.col(ROW).cast(pl.Int64))


def _parquet_columns(path: Path, spec: GenericSpec) -> None:
    """DataError unless ``path`` is readable parquet with every mapped column."""
    try:
        schema = pl.read_parquet_schema(path)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(path, f"unreadable as parquet ({e})") from None
    _missing_columns(path, list(schema), spec)


def _read_parquet(path: Path, spec: GenericSpec) -> pl.DataFrame:
    _parquet_columns(path, spec)
    try:
        df = pl.read_parquet(path, columns=list(dict.fromkeys(spec.mapped.values())))
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(path, f"unreadable as parquet ({e})") from None
    return df.with_row_index(ROW, offset=1).with_columns(pl.col(ROW).cast(pl.Int64))


# --------------------------------------------------------------------------- typing and validation


def _typed(df: pl.DataFrame, path: Path, spec: GenericSpec) -> pl.DataFrame:
    """Columns ``row, t (float seconds or ns since epoch), prompt_tokens, output_tokens, [tenant],
    [block_hashes]`` with nulls where a value is missing or unparsable, plus ``__raw_<role>`` text."""
    m = spec.mapped
    exprs = [pl.col(ROW)]
    raw = []
    for role, col in m.items():
        dtype = df.schema[col]
        c = pl.col(col)
        if role == "arrival":
            if spec.time_unit == "datetime":
                if dtype.is_temporal() and dtype not in (pl.Time, pl.Duration):
                    e = c.cast(pl.Datetime("ns")).dt.epoch("ns").cast(pl.Float64)
                elif dtype == pl.String:
                    e = _parse_datetime(c)
                else:
                    raise DataError(path, f"time_unit datetime needs date-times (text or a datetime column); the "
                                          f"column is {dtype}; use time_unit s, ms or us for numbers", column=col)
                exprs.append((e / 1e9).alias("t"))
            else:
                if dtype.is_temporal():
                    raise DataError(path, f"the column holds date-times ({dtype}): set time_unit: datetime",
                                    column=col)
                if dtype == pl.String:
                    e = c.str.strip_chars().cast(pl.Float64, strict=False)
                elif dtype.is_numeric():
                    e = c.cast(pl.Float64)
                else:
                    raise DataError(path, f"expected numbers in {spec.time_unit}, the column is {dtype}", column=col)
                exprs.append(e.alias("t"))   # in the file's unit; divided in numpy below (exactly rounded)
        elif role in ("prompt_tokens", "output_tokens"):
            if dtype == pl.String:
                e = c.str.strip_chars().cast(pl.Int64, strict=False)
            elif dtype.is_integer():
                e = c.cast(pl.Int64, strict=False)
            elif dtype.is_float():   # integral floats only (a parquet writer may store counts as floats)
                e = pl.when(c.is_finite() & (c == c.round(0)) & (c.abs() < 2**62)).then(c).otherwise(None).cast(pl.Int64)
            else:
                raise DataError(path, f"expected integer token counts, the column is {dtype}", column=col)
            exprs.append(e.alias(role))
        elif role == "tenant":
            exprs.append(c.cast(pl.String).alias("tenant"))
        elif role == "block_hashes":
            if dtype == pl.String:
                ok = c.str.contains(_INT_LIST)
                e = pl.when(ok).then(c.str.extract_all(r"-?\d+").cast(pl.List(pl.Int64), strict=False)).otherwise(None)
            elif isinstance(dtype, (pl.List, pl.Array)) and dtype.inner.is_integer():
                e = c.cast(pl.List(pl.Int64), strict=False)
            else:
                raise DataError(path, f"expected a list of integers per row (prompt block hashes), the column is "
                                      f"{dtype}", column=col)
            exprs.append(e.alias("block_hashes"))
        raw.append(c.cast(pl.String) if not isinstance(dtype, (pl.List, pl.Array)) else
                   c.cast(pl.List(pl.String), strict=False).list.join(", "))
        exprs.append(raw[-1].alias(f"__raw_{role}"))
    out = df.select(exprs)
    if spec.time_unit != "datetime" and spec.time_unit != "s":
        # polars multiplies by the reciprocal (3536999 ms -> 3536.9990000000003 s); numpy divides exactly
        out = out.with_columns(pl.Series("t", out["t"].to_numpy() / UNIT_PER_SECOND[spec.time_unit], dtype=pl.Float64))
    return out


def _parse_datetime(c: pl.Expr) -> pl.Expr:
    """ISO 8601 text -> ns since the epoch (UTC when an offset is given); null where unparsable."""
    s = c.str.strip_chars().str.replace("T", " ", literal=True).str.replace(r"Z$", "+00:00")
    has_tz = s.str.contains(r"[+-]\d{2}:?\d{2}$")
    naive = s.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False)
    naive = pl.coalesce(naive, s.str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="ns", strict=False),
                        s.str.to_datetime("%Y-%m-%d", time_unit="ns", strict=False))
    aware = s.str.to_datetime("%Y-%m-%d %H:%M:%S%.f%:z", time_unit="ns", strict=False, time_zone="UTC")
    aware = pl.coalesce(aware, s.str.to_datetime("%Y-%m-%d %H:%M:%S%:z", time_unit="ns", strict=False,
                                                  time_zone="UTC"),
                        s.str.to_datetime("%Y-%m-%d %H:%M:%S%.f%z", time_unit="ns", strict=False, time_zone="UTC"))
    return pl.when(has_tz).then(aware.dt.epoch("ns")).otherwise(naive.dt.epoch("ns")).cast(pl.Float64)


def _first_bad(df: pl.DataFrame, checks) -> tuple[int, int] | None:
    firsts = df.select([bad.arg_true().first().alias(str(i)) for i, (_, bad, _) in enumerate(checks)]).row(0)
    hits = [(idx, i) for i, idx in enumerate(firsts) if idx is not None]
    return min(hits) if hits else None


def _validate(path: Path, df: pl.DataFrame, spec: GenericSpec, kind: str, header_cols: int | None,
              prev: tuple | None = None) -> None:
    """DataError naming the first row that fails a check. ``prev``: (time, raw text) of the row before ``df``'s
    first, when ``df`` is a part of the file (chunked reading)."""
    m = spec.mapped
    unit = spec.time_unit
    t_expected = ("a date-time such as 2024-05-12 00:00:00.001 (ISO 8601)" if unit == "datetime"
                  else f"a finite number of {dict(s='seconds', ms='milliseconds', us='microseconds')[unit]} >= 0")
    checks = [("arrival", pl.col("t").is_null() | pl.col("t").is_nan() | pl.col("t").is_infinite()
               | ((pl.col("t") < 0) if unit != "datetime" else pl.lit(False)), t_expected)]
    for role in ("prompt_tokens", "output_tokens"):
        checks.append((role, pl.col(role).is_null() | (pl.col(role) <= 0), "an integer number of tokens > 0"))
    if "tenant" in m:
        checks.append(("tenant", pl.col("tenant").is_null() | (pl.col("tenant").str.strip_chars() == ""),
                       "a tenant name (not empty)"))
    if "block_hashes" in m:
        bs = int(spec.block_size)
        need = (pl.col("prompt_tokens") + bs - 1) // bs
        checks.append(("block_hashes", pl.col("block_hashes").is_null()
                       | pl.col("block_hashes").list.eval(pl.element().is_null()).list.any(),
                       "a list of integers (prompt block hashes)"))
        checks.append(("block_hashes", (pl.col("block_hashes").list.len() != need).fill_null(False),
                       f"ceil(prompt_tokens / block_size {bs}) block hashes"))
    first_vs_prev = (pl.col("t") < float(prev[0])) if prev is not None and prev[0] is not None else False
    checks.append(("arrival", (pl.col("t").diff() < 0).fill_null(first_vs_prev),
                   "timestamps in non-decreasing order (sort the file by its arrival column)"))
    hit = _first_bad(df, checks)
    if hit is None:
        return
    idx, i = hit
    role, bad, expected = checks[i]
    col = m[role]
    n_bad = int(df.select(pl.any_horizontal([b for _, b, _ in checks]).sum()).item())
    more = (f" ({n_bad:,} rows{' of this part of the file' if prev is not None or df.height == CHUNK_ROWS else ''} "
            "fail validation; this is the first)") if n_bad > 1 else ""
    row = int(df[ROW][idx])
    value = df[f"__raw_{role}"][idx]
    if value is None and kind == "csv" and header_cols is not None:
        fields = _csv_record(path, row)
        if fields is not None and len(fields) != header_cols:
            raise DataError(path, f"has {len(fields)} fields, expected {header_cols} (truncated or malformed line): "
                                  f"{_shown(','.join(fields))}{more}", row=row)
    shown = "missing or null value" if value is None else _shown(value)
    previous = ""
    if i == len(checks) - 1:
        before = df[f"__raw_{role}"][idx - 1] if idx > 0 else prev[1]
        previous = f" (the previous row has {_shown(before)})"
    elif role == "block_hashes" and value is not None and "ceil" in expected:
        n = df["block_hashes"][idx].len() if df["block_hashes"][idx] is not None else 0
        shown = (f"{n} block hashes for {df['prompt_tokens'][idx]} prompt tokens (is block_size "
                 f"{spec.block_size} right?)")
    raise DataError(path, f"{shown}: expected {expected}{previous}{more}", row=row, column=col)


def _checked_kind(path: Path, spec: GenericSpec) -> str:
    """The container of ``path`` after the mapping's own checks (the required roles, block_size with hashes)."""
    if not path.is_file():
        raise DataError(path, "file not found")
    missing = [r for r in REQUIRED_ROLES if not spec.mapped.get(r)]
    if missing:
        raise DataError(path, f"the columns mapping lacks {missing[0]} (sources.<name>.columns.{missing[0]})")
    if "block_hashes" in spec.mapped and not spec.block_size:
        raise DataError(path, "block_hashes is mapped but block_size is not set (tokens per hash block)")
    return container(path, spec.format)


def _body(df: pl.DataFrame, first) -> pl.DataFrame:
    """The canonical body of typed rows; ``first``: the file's first time (arrivals count from it)."""
    return df.select(pl.col(ROW).alias("row"), (pl.col("t") - first).alias("arrival_s"), "prompt_tokens",
                     "output_tokens", *[c for c in ("tenant", "block_hashes") if c in df.columns])


def _report(spec: GenericSpec, kind: str, rows: int, first, last) -> dict:
    show = (lambda v: _iso(v)) if spec.time_unit == "datetime" else \
        (lambda v: float(v) * UNIT_PER_SECOND[spec.time_unit])
    rep = {"columns": list(dict.fromkeys(spec.mapped.values())), "rows_read": rows, "excluded": {},
           "t_first": show(first), "t_last": show(last), "span_s": float(last - first), "container": kind,
           "time_unit": spec.time_unit, "mapping": dict(spec.mapped)}
    if spec.block_size:
        rep["block_size"] = int(spec.block_size)
    return rep


def large(path: Path) -> bool:
    """A file read in parts (:func:`read_parts`): larger than :data:`CHUNKED_BYTES`."""
    return Path(path).stat().st_size > CHUNKED_BYTES


def read(path: str | Path, spec: GenericSpec) -> tuple[pl.DataFrame, dict]:
    """Read a file through the column mapping; returns ``(body, report)`` where ``body`` has
    ``row, arrival_s, prompt_tokens, output_tokens`` and the mapped optional ``tenant``,
    ``block_hashes``, and the report ``columns, rows_read, excluded ({}), t_first, t_last, span_s,
    container, time_unit``. A file larger than :data:`CHUNKED_BYTES` is read in parts (:func:`read_parts`)."""
    path = Path(path)
    kind = _checked_kind(path, spec)
    if large(path):
        rep: dict = {}
        parts = list(read_parts(path, spec, rep))
        return pl.concat(parts, rechunk=False), rep
    header_cols = None
    if kind == "csv":
        raw = _read_csv(path, spec)
        with open(path, "rb") as f:
            header_cols = len(next(csv.reader([f.readline().decode("utf-8", "replace").lstrip("\ufeff").rstrip("\r\n")])))
    elif kind == "jsonl":
        raw = _read_jsonl(path, spec)
    else:
        raw = _read_parquet(path, spec)
    if raw.height == 0:
        raise DataError(path, "no data rows")
    df = _typed(raw, path, spec)
    _validate(path, df, spec, kind, header_cols)
    del raw
    t = df["t"]
    return _body(df, t[0]), _report(spec, kind, df.height, t[0], t[-1])


def _iso(seconds: float) -> str:
    ns = int(round(seconds * 1e9))
    return str(np.datetime64(ns, "ns"))
