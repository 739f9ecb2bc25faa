"""Large trace files (issue #27): read in parts, the canonical table streamed to parquet, later stages reading it
lazily -- with the same tables, reports, windows and error messages as reading in one piece. Small files with a
small part size stand in for multi-GB ones (the memory target itself is measured by `make bench`: bench/ingest)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from portbench import params
from portbench.core.errors import DataError
from portbench.data import generic, plausibility, trace_checks, traces, windows

SPEC = generic.GenericSpec(columns={"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"})


def _in_parts(monkeypatch, rows: int = 3) -> None:
    monkeypatch.setattr(generic, "CHUNKED_BYTES", 0)
    monkeypatch.setattr(generic, "CHUNK_ROWS", rows)


def _outcome(fn):
    try:
        return fn()
    except DataError as e:
        return e


def _write(path: Path, text: str, kind: str) -> Path:
    """A CSV text as CSV, JSON Lines (one record per line, blank lines kept) or parquet."""
    if kind == "csv":
        path.write_text(text)
        return path
    lines = text.split("\n")
    cols = lines[0].split(",")
    if kind == "jsonl":
        out = []
        for line in lines[1:]:
            if not line:
                out.append("")
                continue
            vals = line.split(",")
            out.append(json.dumps({c: (json.loads(v) if re.fullmatch(r"-?[\d.]+", v) else v)
                                   for c, v in zip(cols, vals)}))
        path.write_text("\n".join(out))
        return path
    rows = [line.split(",") for line in lines[1:] if line]
    pl.DataFrame({c: [r[i] for r in rows] for i, c in enumerate(cols)}).with_columns(
        pl.col("ts").cast(pl.Float64, strict=False), pl.col("p").cast(pl.Int64, strict=False),
        pl.col("o").cast(pl.Int64, strict=False)).write_parquet(path)
    return path


GOOD = "ts,p,o\n" + "".join(f"{i},{5 + i},{1 + i % 3}\n" for i in range(10))


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("text, row, match", [
    (GOOD, None, None),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n1.5,5,1\n4,5,1\n", 4, "non-decreasing order"),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n3,5,1\n4,-2,1\n", 5, "expected an integer number of tokens > 0"),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n3,5,1\n\n5,5,1\n", 5, "blank line"),
])
def test_every_container_read_in_parts_gives_the_same_table_and_errors(tmp_path, monkeypatch, kind, text, row,
                                                                       match):
    """JSON Lines and parquet are read in parts too (not only CSV): the same table, report and messages."""
    if kind == "parquet" and "\n\n" in text:
        pytest.skip("parquet has no blank lines")
    path = _write(tmp_path / f"t.{kind}", text, kind)
    whole = _outcome(lambda: generic.read(path, SPEC))
    _in_parts(monkeypatch)
    parts = _outcome(lambda: generic.read(path, SPEC))
    if row is None:
        assert parts[0].equals(whole[0]) and parts[1] == whole[1] and parts[0].height == 10
    else:
        assert isinstance(whole, DataError) and isinstance(parts, DataError), (whole, parts)
        assert whole.row == parts.row == row and re.search(match, str(parts)), str(parts)


AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         + "".join(f"2023-11-16 18:15:{10 + i // 10:02d}.{i:07d},{100 + i},{1 + i % 7}\n" for i in range(25)))


def test_an_azure_file_streamed_to_parquet_equals_the_one_piece_table(tmp_path, monkeypatch):
    path = tmp_path / "az.csv"
    path.write_text(AZURE)
    table, report = traces.read_file(path, source="mine")
    _in_parts(monkeypatch, 4)
    assert traces.streams(path) and not traces.streams(path, "burstgpt")
    target = tmp_path / "canon.parquet"
    streamed = traces.write_canonical_parts(path, target, source="mine")
    assert pl.read_parquet(target).equals(table)
    assert streamed == report
    assert traces.read_file(path, source="mine")[0].equals(table)      # read_file in parts: the same


@pytest.mark.parametrize("text, row, match", [
    (AZURE.replace("18:15:11.0000012", "18:15:09.0000012"), 13, "non-decreasing order.*previous row has"),
    (AZURE.replace(",107,", ",0,"), 8, "'0': expected a positive integer"),
    (AZURE.replace("2023-11-16 18:15:12.0000020,120,7\n", "2023-11-16 18:15:12.0000020,120\n"), 21, "has 2 fields"),
    (AZURE.replace("\n2023-11-16 18:15:10.0000005", "\n\n2023-11-16 18:15:10.0000005"), 6, "blank line"),
])
def test_an_azure_file_in_parts_names_the_same_row(tmp_path, monkeypatch, text, row, match):
    path = tmp_path / "az.csv"
    path.write_text(text)
    whole = _outcome(lambda: traces.read_file(path, source="mine"))
    _in_parts(monkeypatch, 4)
    parts = _outcome(lambda: traces.write_canonical_parts(path, tmp_path / "c.parquet", source="mine"))
    assert isinstance(whole, DataError) and isinstance(parts, DataError), (whole, parts)
    assert whole.row == parts.row == row and re.search(match, str(parts)), str(parts)


@pytest.mark.parametrize("text, row, match", [
    ("ts,p,o\n0,5,1\n1,5\n2,5,1\n", 2, "has 2 fields, expected 3"),
    ('ts,p,o\n0,5,1\n1,"5,1\n2,5,1\n', 2, "unbalanced double quote"),
    (b"ts,p,o\n0,5,1\n1,5,1\n2,\xff5,1\n", 3, "not valid UTF-8"),
])
@pytest.mark.parametrize("in_parts", [False, True])
def test_the_diagnosis_of_a_bad_csv_reads_line_by_line(tmp_path, monkeypatch, text, row, match, in_parts):
    """The diagnosis after a read error never loads the whole file (a 5 GB file would need 5 GB more) and still
    names the row and what is wrong."""
    path = tmp_path / "t.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    if in_parts:
        _in_parts(monkeypatch)

    def whole_file(*_a, **_k):
        raise AssertionError("the whole file was loaded")

    monkeypatch.setattr(Path, "read_bytes", whole_file)
    monkeypatch.setattr(Path, "read_text", whole_file)
    e = _outcome(lambda: generic.read(path, SPEC))
    assert isinstance(e, DataError) and e.row == row and match in str(e), str(e)


@pytest.mark.parametrize("make", [
    lambda rng: np.cumsum(rng.exponential(0.3, 5000)),                       # continuous
    lambda rng: np.floor(np.cumsum(rng.exponential(0.3, 5000)) / 3) * 3,       # on a 3 s grid, many repeats
    lambda rng: np.round(np.cumsum(rng.exponential(2.0, 5000)), 3),            # millisecond timestamps
    lambda rng: np.zeros(1),
])
def test_the_timestamp_check_in_blocks_equals_the_whole(make):
    t = make(np.random.default_rng(7))
    t = t - t[0]
    blocks = [t[i:i + 333] for i in range(0, len(t), 333)]
    assert trace_checks.sorted_timestamp_check(lambda: iter(blocks)) == trace_checks.timestamp_check(t)


def test_plausibility_on_a_lazy_scan_equals_the_table(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    n = 3000
    body = pl.DataFrame({"arrival_s": np.floor(np.cumsum(rng.exponential(0.001, n)) * 10) / 10,
                         "prompt_tokens": rng.integers(1, 50, n), "output_tokens": rng.integers(100, 500, n)})
    body.write_parquet(tmp_path / "b.parquet", row_group_size=100)
    monkeypatch.setattr(plausibility, "BLOCK", 77)
    kw = dict(source="mine", columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}, time_unit="ms")
    whole = plausibility.check(body, **kw)
    assert len(whole) >= 2 and plausibility.check(pl.scan_parquet(tmp_path / "b.parquet"), **kw) == whole


def test_a_streamed_ingest_freezes_the_same_windows(tmp_path, monkeypatch, shared_traces):
    """The real Azure trace (official adapter) and Mooncake (generic JSON Lines with block hashes) ingested in
    parts: the same canonical tables and reports, and the same frozen manifest, as read in one piece."""
    def cfg(name):
        o = {"paths.data_dir": str(tmp_path / name / "data"), "paths.manifest": str(tmp_path / name / "m.json"),
             "paths.results_dir": str(tmp_path / name / "results"), "paths.mirror": str(shared_traces),
             "sources": {"burstgpt": None, "bailian": None, "azure_code": None},
             "windows": {"per_source": 3, "size": 50}}
        return params.load("papermill_params/default.yaml", params.undot(o))

    one, parts = cfg("one"), cfg("parts")
    rep_one = traces.ingest_all(one)["sources"]
    m_one = windows.freeze(one)
    _in_parts(monkeypatch, 5000)
    rep_parts = traces.ingest_all(parts)["sources"]
    for s in ("azure", "mooncake"):
        a = pl.read_parquet(Path(one.paths.data_dir) / "canonical" / f"{s}.parquet")
        b = pl.read_parquet(Path(parts.paths.data_dir) / "canonical" / f"{s}.parquet")
        assert a.equals(b), s
        strip = {"canonical", "path"}
        assert {k: v for k, v in rep_one[s].items() if k not in strip} == \
            {k: v for k, v in rep_parts[s].items() if k not in strip}, s
    m_parts = windows.freeze(parts)
    assert [w["sha256"] for w in m_parts["windows"]] == [w["sha256"] for w in m_one["windows"]]
    assert m_parts["windows"] == m_one["windows"] and m_parts["sources"] == m_one["sources"]


def test_the_median_from_value_counts_equals_polars_median():
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 4, 11, 1000, 1001):
        for big in (False, True):
            x = rng.integers(1, 10**15 if big else 20, n)
            assert traces._int_median(pl.DataFrame({"c": x}).lazy(), "c") == float(pl.Series(x).median())


def test_a_large_file_with_a_header_only_is_one_message(tmp_path, monkeypatch):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    _in_parts(monkeypatch)
    e = _outcome(lambda: traces.write_canonical_parts(path, tmp_path / "c.parquet", "azure2023", source="mine"))
    assert isinstance(e, DataError) and "no data rows" in str(e), e
