"""The generic trace adapter: any CSV / JSON Lines / parquet file through a column mapping.

Same guarantees as the official adapters: one DataError naming the file, the row and the column on
bad input (hand-made cases below, and a hypothesis fuzz of real Mooncake rows in all three formats),
the same canonical table whatever the container, time unit or list encoding.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_traces_fuzz as fuzz
from portbench.core.errors import DataError
from portbench.data import generic, traces
from portbench.data.generic import GenericSpec

ROOT = Path(__file__).resolve().parents[1]
MIRROR = (ROOT.parent / "shared" / "traces").resolve()
MOONCAKE = MIRROR / "mooncake" / "conversation_trace.jsonl"
N_ROWS = 25

pytestmark = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"Mooncake trace not found at {MOONCAKE}")

MAP = {"arrival": "timestamp", "prompt_tokens": "input_length", "output_tokens": "output_length",
       "block_hashes": "hash_ids"}
SPEC = GenericSpec(columns=MAP, time_unit="ms", block_size=512)


def _rows(n: int = N_ROWS, skip: int = 0) -> list[dict]:
    with open(MOONCAKE) as f:
        lines = f.readlines()[skip: skip + n]
    return [json.loads(x) for x in lines]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _csv(path: Path, rows: list[dict], hashes=lambda h: '"' + json.dumps(h) + '"') -> Path:
    out = ["timestamp,input_length,output_length,hash_ids"]
    out += [f"{r['timestamp']},{r['input_length']},{r['output_length']},{hashes(r['hash_ids'])}" for r in rows]
    path.write_text("\n".join(out) + "\n")
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    pl.DataFrame(rows, schema={"timestamp": pl.Int64, "input_length": pl.Int64, "output_length": pl.Int64,
                               "hash_ids": pl.List(pl.Int64)}).write_parquet(path)
    return path


def read(path: Path, spec: GenericSpec = SPEC):
    return traces.read_file(path, source="mine", mapping=spec)


# --------------------------------------------------------------------------- real data, every container


def test_the_whole_mooncake_file_reads_through_the_mapping():
    df, rep = read(MOONCAKE)
    assert rep["adapter"] == "generic" and rep["format"] == "jsonl" and rep["rows_read"] == df.height == 12_031
    assert rep["span_s"] == pytest.approx(3536.999) and df["arrival_s"][-1] == 3536.999   # ms -> s exactly
    assert df["prompt_tokens"].mean() == pytest.approx(12_035, abs=1) and df["output_tokens"].median() == 350
    assert df.columns == ["source", "file", "row", "arrival_s", "prompt_tokens", "output_tokens", "block_hashes"]
    assert (df["block_hashes"].list.len() == (df["prompt_tokens"] + 511) // 512).all()


def test_csv_jsonl_and_parquet_give_the_same_table(tmp_path):
    rows = _rows(200, skip=5000)
    want, _ = read(_jsonl(tmp_path / "t.jsonl", rows))
    for path in (_csv(tmp_path / "t.csv", rows), _parquet(tmp_path / "t.parquet", rows),
                 _csv(tmp_path / "spaces.csv", rows, lambda h: " ".join(map(str, h))),
                 _csv(tmp_path / "semi.csv", rows, lambda h: ";".join(map(str, h))),
                 _csv(tmp_path / "pipe.csv", rows, lambda h: "|".join(map(str, h)))):
        got, rep = read(path)
        assert got.drop("file").equals(want.drop("file")), path.name
        assert rep["rows_read"] == 200


def test_format_comes_from_the_content_not_the_extension(tmp_path):
    rows = _rows()
    for path, kind in ((_jsonl(tmp_path / "a.csv", rows), "jsonl"), (_csv(tmp_path / "b.jsonl", rows), "csv"),
                       (_parquet(tmp_path / "c.txt", rows), "parquet")):
        assert generic.sniff(path) == kind
        assert read(path)[1]["format"] == kind
    with pytest.raises(DataError, match="format csv was named, but the content is parquet"):
        read(tmp_path / "c.txt", GenericSpec(columns=MAP, format="csv", time_unit="ms", block_size=512))
    with pytest.raises(DataError, match="format jsonl was named, but the content is csv"):
        read(tmp_path / "b.jsonl", GenericSpec(columns=MAP, format="jsonl", time_unit="ms", block_size=512))


@pytest.mark.parametrize("unit, scale", [("s", 1e-3), ("ms", 1), ("us", 1000)])
def test_time_units(tmp_path, unit, scale):
    rows = _rows()
    want = [r["timestamp"] / 1000 for r in rows]
    conv = [{**r, "timestamp": r["timestamp"] * scale if unit != "ms" else r["timestamp"]} for r in rows]
    df, _ = read(_jsonl(tmp_path / "t.jsonl", conv), GenericSpec(columns=MAP, time_unit=unit, block_size=512))
    assert df["arrival_s"].to_list() == pytest.approx([w - want[0] for w in want], abs=1e-9)


def test_datetime_arrivals_text_offsets_and_parquet_datetimes(tmp_path):
    spec = GenericSpec(columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}, time_unit="datetime")
    path = tmp_path / "dt.csv"
    path.write_text("t,p,o\n2024-05-12 00:00:00,5,1\n2024-05-12T00:00:01.5,5,1\n2024-05-12 00:00:03.250+00:00,5,1\n"
                    "2024-05-12T02:00:04Z,5,1\n2024-05-12 04:00:05+02:00,5,1\n")
    df, rep = read(path, spec)
    assert df["arrival_s"].to_list() == [0.0, 1.5, 3.25, 7204.0, 7205.0]
    assert rep["t_first"].startswith("2024-05-12T00:00:00")
    pq = tmp_path / "dt.parquet"
    pl.DataFrame({"t": pl.Series(["2024-05-12 00:00:00", "2024-05-12 00:00:02"]).str.to_datetime(),
                  "p": [3, 4], "o": [1, 1]}).write_parquet(pq)
    assert read(pq, spec)[0]["arrival_s"].to_list() == [0.0, 2.0]
    with pytest.raises(DataError, match=r"column 't'.*set time_unit: datetime"):
        read(pq, GenericSpec(columns=spec.columns, time_unit="s"))


def test_tenant_column_becomes_the_windows_tenant(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t,p,o,who\n0,5,1,alice\n1,5,1,bob\n2,5,1,alice\n")
    spec = GenericSpec(columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o", "tenant": "who"})
    df, _ = read(path, spec)
    assert df["tenant"].to_list() == ["alice", "bob", "alice"]
    from portbench.data import windows
    assert windows.tenant_fields_of(df) == ["tenant"]


# --------------------------------------------------------------------------- bad input, by hand


def _err(path: Path, spec: GenericSpec = SPEC) -> DataError:
    with pytest.raises(DataError) as e:
        read(path, spec)
    assert str(path) in str(e.value)
    return e.value


def test_missing_column_names_it_and_lists_the_files_columns(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "output_length"} for r in _rows()]
    for path in (_csv(tmp_path / "t.csv", [{**r, "output_length": 1} for r in rows]),):
        path.write_text(path.read_text().replace("output_length", "out_len"))
        e = _err(path)
        assert e.column == "output_length" and "out_len" in e.problem and e.row is None
    pq = tmp_path / "t.parquet"
    pl.DataFrame(rows).write_parquet(pq)
    e = _err(pq)
    assert e.column == "output_length" and "timestamp, input_length, hash_ids" in e.problem
    e = _err(_jsonl(tmp_path / "t.jsonl", rows))   # JSON Lines: a key absent from a record
    assert (e.row, e.column) == (1, "output_length") and "missing" in e.problem


@pytest.mark.parametrize("edit, row, column, words", [
    (lambda rs: rs[3].update(input_length=0), 4, "input_length", "integer number of tokens > 0"),
    (lambda rs: rs[5].update(output_length=-2), 6, "output_length", "> 0"),
    (lambda rs: rs[7].update(input_length="many"), 8, "input_length", "expected an integer"),
    (lambda rs: rs[2].update(input_length=12.5), 3, "input_length", "expected an integer"),
    (lambda rs: rs[9].update(timestamp=None), 10, "timestamp", "missing or null"),
    (lambda rs: rs[4].update(timestamp=-5), 5, "timestamp", ">= 0"),
    (lambda rs: rs[10].update(timestamp=0) if rs[9]["timestamp"] > 0 else rs[10].update(timestamp=-1),
     11, "timestamp", "non-decreasing"),
    (lambda rs: rs[1].update(hash_ids=rs[1]["hash_ids"][:-1]), 2, "hash_ids", "is block_size 512 right?"),
    (lambda rs: rs[6].update(hash_ids="0 1 2"), 7, "hash_ids", "list of integers"),
    (lambda rs: rs[6].update(hash_ids=[0, "x"]), 7, "hash_ids", "list of integers"),
])
def test_bad_values_name_the_row_and_column(tmp_path, edit, row, column, words):
    rows = _rows(20, skip=3000)
    edit(rows)
    e = _err(_jsonl(tmp_path / "t.jsonl", rows))
    assert (e.row, e.column) == (row, column) and words in str(e), str(e)


def test_out_of_order_quotes_the_previous_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t,p,o\n0,5,1\n10,5,1\n9,5,1\n")
    e = _err(path, GenericSpec(columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}))
    assert (e.row, e.column) == (3, "t") and "'9': expected timestamps in non-decreasing order" in str(e)
    assert "previous row has '10'" in str(e)


@pytest.mark.parametrize("text, row, words", [
    ("t,p,o\n0,5,1\n\n1,5,1\n", 2, "blank line"),
    ("t,p,o\n0,5,1\n1,5\n", 2, "has 2 fields, expected 3"),
    ("t,p,o\n0,5,1\n1,5,1,9\n", 2, "has 4 fields, expected 3"),
    ("t,p,o\n0,5,1\n1,\"5,1\n2,5,1\n", 2, "unbalanced double quote"),
    ("t,p,o\n0,5,1\n1,x5,1\n", 2, "'x5': expected an integer number of tokens > 0"),
    ("", None, "empty file"),
])
def test_bad_csv_lines(tmp_path, text, row, words):
    path = tmp_path / "t.csv"
    path.write_text(text)
    e = _err(path, GenericSpec(columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}))
    assert e.row == row and words in str(e), str(e)


def test_bad_bytes_and_json(tmp_path):
    spec = GenericSpec(columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"})
    path = tmp_path / "t.csv"
    path.write_bytes(b"t,p,o\n0,5,1\n1,\xff5,1\n")
    e = _err(path, spec)
    assert e.row == 2 and "UTF-8" in str(e)
    path = tmp_path / "t.jsonl"
    path.write_text('{"t": 0, "p": 5, "o": 1}\n[1, 2, 3]\n')
    assert _err(path, spec).row == 2
    path.write_text('{"t": 0, "p": 5, "o": 1}\n{"t": 1, "p": 5, "o": 1\n')
    e = _err(path, spec)
    assert e.row == 2 and "not valid JSON" in str(e)
    path.write_text('{"t": 0, "p": 5, "o": 1}\n\n{"t": 1, "p": 5, "o": 1}\n')
    e = _err(path, spec)
    assert e.row == 2 and "blank line" in str(e)
    header_only = tmp_path / "header.csv"
    header_only.write_text("t,p,o\n")
    assert "no data rows" in str(_err(header_only, spec))


def test_parquet_of_the_wrong_types(tmp_path):
    pq = tmp_path / "t.parquet"
    pl.DataFrame({"t": [0.0, 1.0], "p": ["a", "b"], "o": [1.0, 2.5]}).write_parquet(pq)
    spec = GenericSpec(columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"})
    e = _err(pq, spec)
    assert (e.row, e.column) == (1, "p")
    pl.DataFrame({"t": [0.0, 1.0], "p": [3, 4], "o": [1.0, 2.5]}).write_parquet(pq)
    e = _err(pq, spec)
    assert (e.row, e.column) == (2, "o") and "integer" in str(e)   # 2.5 tokens
    pl.DataFrame({"t": [0.0, 1.0], "p": [3, 4], "o": [1.0, 2.0]}).write_parquet(pq)
    assert read(pq, spec)[0]["output_tokens"].to_list() == [1, 2]   # integral floats are counts


# --------------------------------------------------------------------------- fuzz (as tests/test_traces_fuzz.py)


def _check(path: Path, data: bytes | None, kind: str) -> None:
    if data is not None:
        path.write_bytes(data)
    try:
        df, rep = read(path)
    except DataError as e:
        assert str(path) in str(e)
        return
    assert rep["rows_read"] == rep["rows_valid"] == df.height
    if data is not None:
        assert rep["rows_read"] == fuzz._records(data, kind == "csv")
    assert df["arrival_s"].min() == 0 and df["arrival_s"].is_sorted()
    assert df["row"].is_sorted() and df["row"].n_unique() == df.height
    assert (df["prompt_tokens"] > 0).all() and (df["output_tokens"] > 0).all()
    assert (df["block_hashes"].list.len() == (df["prompt_tokens"] + 511) // 512).all()


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="portbench-generic-fuzz-") as d:
        yield Path(d)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_fuzz_text_containers(kind, workdir):
    rows = _rows(N_ROWS, skip=700)
    path = workdir / f"base.{kind}"
    (_csv if kind == "csv" else _jsonl)(path, rows)
    base = path.read_bytes().rstrip(b"\n").split(b"\n")
    _check(path, None, kind)
    jsonl = kind == "jsonl"

    @settings(max_examples=fuzz.EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(fuzz.mutation(len(base), jsonl), min_size=1, max_size=3))
    def run(mutations):
        lines: list[bytes] | bytes = base
        for m in mutations:
            if isinstance(lines, bytes):
                lines = lines.split(b"\n") or [b""]
            if not lines:
                break
            m = (m[0], m[1] % len(lines), m[2], m[3], m[4], m[5] % len(lines))
            if m[0] in ("json_delete", "json_set"):
                try:
                    if not isinstance(json.loads(lines[m[1]]), dict) or not json.loads(lines[m[1]]):
                        continue
                except ValueError:
                    continue
            lines = fuzz._apply(lines, m, jsonl)
        data = lines if isinstance(lines, bytes) else b"\n".join(lines) + b"\n"
        _check(path, data, kind)

    run()


VALUES = st.one_of(st.none(), st.integers(-10**6, 10**9), st.just(0), st.just(-1))


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, N_ROWS - 1), st.sampled_from(["timestamp", "input_length",
                                                                          "output_length", "hash_ids"]), VALUES,
                                st.integers(0, 3)), min_size=1, max_size=3),
       drop=st.integers(0, N_ROWS))
def test_fuzz_parquet(edits, drop, workdir):
    rows = _rows(N_ROWS, skip=700)
    for i, col, value, k in edits:
        if col == "hash_ids":
            h = rows[i]["hash_ids"]
            rows[i]["hash_ids"] = None if value is None else (h[:-1] if k == 0 else h + [value] if k == 1 else
                                                              [None, *h[1:]] if k == 2 else h)
        else:
            rows[i][col] = value
    rows = rows[:drop] + rows[drop + 1:] if drop < N_ROWS else rows
    path = workdir / "fuzz.parquet"
    try:
        _parquet(path, rows)
    except (pl.exceptions.PolarsError, TypeError, OverflowError):
        return
    _check(path, None, "parquet")
