"""Trace adapters on the real files and slices, bad-input errors, and the ingest stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from portbench import params
from portbench.data import registry, traces
from portbench.present import text as present_text
from portbench.core.errors import DataError

CONV = "AzureLLMInferenceTrace_conv.csv"
CODE = "AzureLLMInferenceTrace_code.csv"
SLICE1 = "burstgpt/BurstGPT_1_first400.csv"
SLICE3 = "burstgpt/BurstGPT_3_first400.csv"
QWEN = "qwen_bailian/qwen_traceA_light_stratified_13windows.csv"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    import pooch

    monkeypatch.setattr(pooch, "retrieve", lambda url, **kw: (_ for _ in ()).throw(ConnectionError("offline")))
    monkeypatch.setattr(registry, "_FAILED_DOWNLOADS", {})


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _write(tmp_path: Path, lines: list[str], name: str = "t.csv", end: str = "\n") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + end)
    return p


def _qwen_jsonl(tmp_path: Path, shared_traces: Path) -> Path:
    """The Qwen slice's real records as JSON Lines (hash_ids as an empty list, window dropped)."""
    df = pl.read_csv(shared_traces / QWEN).drop("window")
    recs = [json.dumps({**r, "hash_ids": []}) for r in df.iter_rows(named=True)]
    return _write(tmp_path, recs, "q.jsonl")


# --------------------------------------------------------------------------- real files


@pytest.mark.parametrize("name, rows, span, medians", [
    (CONV, 19_366, 3_502, (1020, 129)),   # PROVENANCE.md
    (CODE, 8_819, 3_436, (1469, 13)),
])
def test_azure_files_match_provenance(shared_traces, name, rows, span, medians):
    df, rep = traces.read_file(shared_traces / "azure2023" / name)
    assert rep["format"] == "azure2023" and rep["rows_read"] == rows == df.height == rep["rows_valid"]
    assert rep["excluded"] == {}
    assert round(rep["span_s"]) == span and df["arrival_s"].max() == pytest.approx(rep["span_s"])
    assert (df["prompt_tokens"].median(), df["output_tokens"].median()) == medians
    assert df["arrival_s"][0] == 0.0 and df["arrival_s"].is_sorted()
    assert df["row"].to_list() == list(range(1, rows + 1))
    assert df.columns == list(traces.CANONICAL_COLUMNS)
    assert dict(df.schema) == {c: traces.CANONICAL_SCHEMA[c] for c in df.columns}
    assert set(df["source"]) == {"azure"} and set(df["file"]) == {name}
    assert rep["t_first"].startswith("2023-11-16 18:1") and rep["rate_rps"] == pytest.approx(rows / rep["span_s"])


def test_azure_seven_fraction_digits_are_exact(tmp_path):
    p = _write(tmp_path, ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,1,1",
                          "2023-11-16 18:15:46.6805901,1,1", "2023-11-16 18:15:47,2,2"])
    df, _ = traces.read_file(p, "azure2023")
    # 100 ns apart: exact to well below what float seconds since 1970 could resolve (~2e-7 s)
    assert df["arrival_s"].to_list() == pytest.approx([0.0, 1e-7, 0.31941], rel=0, abs=1e-12)


def test_azure2024_offsets_and_optional_fraction(tmp_path):
    p = _write(tmp_path, ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-12 00:00:00+00:00,1452,3",
                          "2024-05-12 00:00:00.0093340+00:00,584,3", "2024-05-12 02:00:01.5+02:00,862,38"])
    assert traces.detect_format(p) == "azure2024"
    df, rep = traces.read_file(p)
    assert df["arrival_s"].to_list() == pytest.approx([0.0, 0.009334, 1.5])
    assert rep["t_first"] == "2024-05-12 00:00:00+00:00" and rep["span_s"] == pytest.approx(1.5)


def test_burstgpt_slice_1(shared_traces):
    path = shared_traces / SLICE1
    raw = pl.read_csv(path)
    df, rep = traces.read_file(path)
    assert rep["format"] == "burstgpt" and rep["rows_read"] == 400
    assert rep["excluded"] == {traces.FAILURE_ZERO_RESPONSE: 17} and rep["rows_valid"] == df.height == 383
    assert rep["rows_read"] == rep["rows_valid"] + sum(rep["excluded"].values())
    # exactly the rows with 0 response tokens are excluded, by their 1-based row number
    failed = set((raw.with_row_index("r", 1).filter(pl.col("Response tokens") == 0))["r"].to_list())
    assert set(df["row"]) == set(range(1, 401)) - failed
    assert df.columns == [*traces.CANONICAL_COLUMNS, "model", "log_type"]
    assert (rep["t_first"], rep["t_last"]) == (5.0, 37_274.0)  # PROVENANCE.md
    assert df["arrival_s"].to_list() == (raw["Timestamp"] - 5).cast(pl.Float64).filter(
        raw["Response tokens"] > 0).to_list()
    all_models = raw["Model"].value_counts().sort("Model").rows()
    assert all_models == [("ChatGPT", 320), ("GPT-4", 80)]


def test_burstgpt_slice_3_has_sessions(shared_traces):
    df, rep = traces.read_file(shared_traces / SLICE3)
    assert rep["columns"] == list(traces.BURST8) and rep["rows_read"] == 400
    assert rep["span_s"] == 41_453.0  # PROVENANCE.md
    assert df.columns == [*traces.CANONICAL_COLUMNS, "model", "log_type", "session_id"]
    assert rep["rows_read"] == df.height + sum(rep["excluded"].values())
    # Session ID is empty exactly on API rows (PROVENANCE.md)
    assert (df["session_id"].is_null() == (df["log_type"] == "API log")).all()


def test_qwen_slice_and_jsonl_agree(shared_traces, tmp_path):
    df, rep = traces.read_file(shared_traces / QWEN)
    assert rep["format"] == "qwen_csv" and rep["rows_read"] == df.height == 166
    assert (df["prompt_tokens"].median(), df["output_tokens"].median()) == (877.5, 353.5)  # PROVENANCE.md
    assert df["window"].n_unique() == 13 and set(df["req_type"]) <= {"text", "search", "image", "file"}
    raw = pl.read_csv(shared_traces / QWEN)
    roots = raw.with_row_index("r", 1).filter(pl.col("parent_chat_id") == -1)
    first_turns = df.filter(pl.col("row").is_in(roots["r"].implode()))
    assert first_turns.height == roots.height > 0
    assert (first_turns["session_id"] == roots["chat_id"].cast(pl.String)).all()
    jdf, jrep = traces.read_file(_qwen_jsonl(tmp_path, shared_traces))
    assert jrep["format"] == "qwen_jsonl"
    assert jdf.drop("file", "block_hashes").equals(df.drop("file", "window"))
    assert jdf["block_hashes"].dtype == pl.List(pl.Int64) and jdf["block_hashes"].list.len().sum() == 0


def test_qwen_hash_ids_become_block_hashes(shared_traces, tmp_path):
    df = pl.read_csv(shared_traces / QWEN).drop("window").head(5)
    recs = [{**r, "hash_ids": list(range(k, k + 3))} for k, r in enumerate(df.iter_rows(named=True))]
    got, _ = traces.read_file(_write(tmp_path, [json.dumps(r) for r in recs], "h.jsonl"))
    assert got["block_hashes"].to_list() == [r["hash_ids"] for r in recs]
    no_hashes, _ = traces.read_file(_write(tmp_path, [json.dumps(r) for r in df.iter_rows(named=True)], "n.jsonl"))
    assert "block_hashes" not in no_hashes.columns          # a file without hash_ids: no column
    recs[2].pop("hash_ids")                                  # hashes on some lines only: an error naming the line
    with pytest.raises(DataError, match=r"row 3, column 'hash_ids'"):
        traces.read_file(_write(tmp_path, [json.dumps(r) for r in recs], "p.jsonl"))


def test_read_slice_uses_the_mirror_and_registered_format(P):
    mirror = registry.store(P.paths).mirror
    for rel, fmt in registry.SLICES.items():
        df, rep = traces.read_slice(mirror, rel)
        assert rep["format"] == fmt and rep["rows_read"] == df.height + sum(rep["excluded"].values())
    with pytest.raises(DataError, match="no data mirror"):
        traces.read_slice(None, SLICE1)


def test_qwen_sessions_follow_parent_links(tmp_path):
    recs = [dict(chat_id=10, parent_chat_id=-1, timestamp=0.0, turn=1),
            dict(chat_id=11, parent_chat_id=-1, timestamp=1.0, turn=1),
            dict(chat_id=12, parent_chat_id=10, timestamp=2.0, turn=2),
            dict(chat_id=13, parent_chat_id=12, timestamp=3.0, turn=3),
            dict(chat_id=14, parent_chat_id=99, timestamp=4.0, turn=5)]  # parent before the trace
    lines = [json.dumps({**r, "input_length": 5, "output_length": 3, "type": "text", "hash_ids": [1]}) for r in recs]
    df, _ = traces.read_file(_write(tmp_path, lines, "s.jsonl"))
    assert df["session_id"].to_list() == ["10", "11", "10", "10", "14"]
    assert df["turn"].to_list() == [1, 1, 2, 3, 5] and df["row"].to_list() == [1, 2, 3, 4, 5]


def test_detect_format(shared_traces, tmp_path):
    assert traces.detect_format(shared_traces / "azure2023" / CONV) == "azure2023"
    assert traces.detect_format(shared_traces / SLICE3) == "burstgpt"
    assert traces.detect_format(shared_traces / QWEN) == "qwen_csv"
    with pytest.raises(DataError, match="matches no official adapter.*sources.<name>.columns"):
        traces.detect_format(_write(tmp_path, ["a,b", "1,2"]))
    # JSON Lines are recognised by their content, not the extension: a .jsonl that is not Qwen's
    with pytest.raises(DataError, match="not Qwen's.*sources.<name>.columns"):
        traces.detect_format(_write(tmp_path, ['{"timestamp": 0, "input_length": 5}'], "x.jsonl"))
    assert traces.detect_format(_qwen_jsonl(tmp_path, shared_traces)) == "qwen_jsonl"
    renamed = tmp_path / "qwen_rows.txt"                     # any extension
    renamed.write_bytes(_qwen_jsonl(tmp_path, shared_traces).read_bytes())
    assert traces.detect_format(renamed) == "qwen_jsonl"


# --------------------------------------------------------------------------- bad input


def _azure(shared_traces: Path, n: int = 30) -> list[str]:
    return _lines(shared_traces / "azure2023" / CONV)[: n + 1]


def _burst(shared_traces: Path, n: int = 30) -> list[str]:
    return _lines(shared_traces / SLICE1)[: n + 1]


def _swap(lines, i, j):
    lines = list(lines)
    lines[i], lines[j] = lines[j], lines[i]
    return lines


def _set(lines, i, col, value):
    lines = list(lines)
    f = lines[i].split(",")
    f[col] = value
    lines[i] = ",".join(f)
    return lines


# (name, builder(shared) -> lines | bytes, format, expected row, expected column, message fragment)
BAD = [
    ("renamed column", lambda s: ["TIMESTAMP,ContextTokens,OutputTokens"] + _azure(s)[1:], "azure2023",
     None, "GeneratedTokens", "missing column"),
    ("missing column", lambda s: ["TIMESTAMP,ContextTokens"] + [x.rsplit(",", 1)[0] for x in _azure(s)[1:]],
     "azure2023", None, "GeneratedTokens", "missing column"),
    ("extra column", lambda s: [_azure(s)[0] + ",Extra"] + [x + ",1" for x in _azure(s)[1:]], "azure2023",
     None, "Extra", "unexpected column"),
    ("unparsable token", lambda s: _set(_azure(s), 7, 1, "12x"), "azure2023", 7, "ContextTokens", "'12x'"),
    ("unparsable timestamp", lambda s: _set(_azure(s), 3, 0, "2023-11-16 25:15:46.1"), "azure2023", 3,
     "TIMESTAMP", "a timestamp like"),
    ("zero tokens", lambda s: _set(_azure(s), 12, 2, "0"), "azure2023", 12, "GeneratedTokens", "positive integer"),
    ("negative tokens", lambda s: _set(_burst(s), 4, 2, "-5"), "burstgpt", 4, "Request tokens", "integer >= 0"),
    ("out of order", lambda s: _swap(_azure(s), 5, 6), "azure2023", 6, "TIMESTAMP", "non-decreasing"),
    ("truncated last line", lambda s: _azure(s)[:-1] + [_azure(s)[-1][:15]], "azure2023", 30, None,
     "has 1 fields, expected 3"),
    ("last line missing a field", lambda s: _burst(s)[:-1] + [_burst(s)[-1].rsplit(",", 1)[0]], "burstgpt", 30,
     None, "has 5 fields, expected 6"),
    ("line with an extra field", lambda s: _set(_azure(s), 9, 2, "5,6"), "azure2023", 9, None,
     "has 4 fields, expected 3"),
    ("blank line inside", lambda s: _azure(s)[:4] + [""] + _azure(s)[4:], "azure2023", 4, None, "blank line"),
    ("empty file", lambda s: b"", "azure2023", None, None, "empty file"),
    ("header only", lambda s: _azure(s)[:1], "azure2023", None, None, "no data rows"),
    ("invalid utf-8", lambda s: "\n".join(_azure(s)[:3]).encode() + b"\n2023-11-16 18:15:5\xff,1,1\n",
     "azure2023", 3, None, "UTF-8"),
    ("total mismatch", lambda s: _set(_burst(s), 2, 4, "1"), "burstgpt", 2, "Total tokens", "Request tokens +"),
    ("truncated log type", lambda s: _set(_burst(s), 30, 5, "Conversation l"), "burstgpt", 30, "Log Type",
     "one of"),
    ("zero request, non-zero response", lambda s: _set(_set(_burst(s), 3, 2, "0"), 3, 4, _burst(s)[3].split(",")[3]),
     "burstgpt", 3, "Request tokens", "failures"),
    ("non-finite timestamp", lambda s: _set(_burst(s), 8, 0, "inf"), "burstgpt", 8, "Timestamp", "finite"),
]


@pytest.mark.parametrize("name, build, fmt, row, column, fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gives_one_clear_error(shared_traces, tmp_path, name, build, fmt, row, column, fragment):
    content = build(shared_traces)
    p = tmp_path / "bad.csv"
    p.write_bytes(content if isinstance(content, bytes) else ("\n".join(content) + "\n").encode())
    with pytest.raises(DataError) as e:
        traces.read_file(p, fmt)
    err = e.value
    assert err.file == str(p) and str(p) in str(err)
    assert (err.row, err.column) == (row, column), str(err)
    assert fragment in str(err)
    if row is not None:
        assert f"row {row}" in str(err)


BAD_JSONL = [
    ("malformed line", lambda L: L[:3] + [L[3][:25]] + L[4:], 4, None, "not valid JSON"),
    ("missing key", lambda L: L[:5] + [json.dumps({k: v for k, v in json.loads(L[5]).items() if k != "turn"})]
     + L[6:], 6, "turn", "missing key"),
    ("string for a number", lambda L: L[:2] + [L[2].replace('"input_length": ', '"input_length": "x')
                                                .replace(', "output_length"', '", "output_length"', 1)] + L[3:],
     3, "input_length", "expected an integer"),
    ("zero output", lambda L: L[:7] + [json.dumps({**json.loads(L[7]), "output_length": 0})] + L[8:], 8,
     "output_length", "positive integer"),
    ("null value", lambda L: L[:1] + [json.dumps({**json.loads(L[1]), "timestamp": None})] + L[2:], 2,
     "timestamp", "seconds"),
    ("out of order", lambda L: _swap(L, 9, 10), 11, "timestamp", "non-decreasing"),
    ("blank line inside", lambda L: L[:4] + [""] + L[4:], 5, None, "blank line"),
    ("not an object", lambda L: L[:2] + ["[1, 2]"] + L[3:], 3, None, "JSON object"),
]


@pytest.mark.parametrize("name, build, row, column, fragment", BAD_JSONL, ids=[b[0] for b in BAD_JSONL])
def test_bad_jsonl_gives_one_clear_error(shared_traces, tmp_path, name, build, row, column, fragment):
    good = _lines(_qwen_jsonl(tmp_path, shared_traces))[:20]
    p = _write(tmp_path, build(good), "bad.jsonl")
    with pytest.raises(DataError) as e:
        traces.read_file(p)
    assert (e.value.row, e.value.column) == (row, column), str(e.value)
    assert fragment in str(e.value) and str(p) in str(e.value)


def test_trailing_blank_lines_and_missing_final_newline_are_fine(shared_traces, tmp_path):
    lines = _azure(shared_traces, 10)
    for end in ("", "\n", "\n\n\n", "\r\n"):
        df, rep = traces.read_file(_write(tmp_path, lines, end=end), "azure2023")
        assert rep["rows_read"] == df.height == 10


# --------------------------------------------------------------------------- ingest stage


@pytest.fixture()
def P(tmp_path, shared_traces, monkeypatch):
    monkeypatch.delenv(registry.MIRROR_ENV, raising=False)
    return params.load("papermill_params/default.yaml",
                       {"paths": {"data_dir": str(tmp_path / "data"), "mirror": str(shared_traces)}},
                       validate=False)


def test_ingest_all_writes_tables_and_report(P, capsys):
    report = traces.ingest_all(P)
    out_dir = Path(P.paths.data_dir) / "canonical"
    assert json.loads((out_dir / "ingest_report.json").read_text())["sources"] == report["sources"]
    az = report["sources"]["azure"]
    assert az["provenance"] == "real" and az["rows_valid"] == 19_366
    assert az["sha256"] == registry.OFFICIAL_FILES[CONV].sha256 and az["sha256_verified"]
    assert pl.read_parquet(out_dir / "azure.parquet").equals(traces.read_file(Path(az["path"]))[0])
    for s in ("burstgpt", "bailian"):  # official files absent here: skipped loudly, no table
        assert report["sources"][s]["skipped"] and report["sources"][s]["provenance"] == "standin"
        assert not (out_dir / f"{s}.parquet").exists()
    err = capsys.readouterr().err
    assert "SKIPPED burstgpt" in err and "SKIPPED bailian" in err
    text = present_text.format_report(report)
    assert CONV in text and "19,366" in text and "Skipped sources" in text and "3,502 s" in text


def test_load_canonical_ingests_and_detects_stale_tables(P):
    df = traces.load_canonical(P.data, "azure")
    assert df.height == 19_366 and set(df["file"]) == {CONV}
    target = Path(P.paths.data_dir) / "canonical" / "azure.parquet"
    df.head(5).write_parquet(target)  # tamper with the table, report unchanged: still trusted
    assert traces.load_canonical(P.data, "azure").height == 5
    rp = traces.report_path(P.paths.data_dir)
    rep = json.loads(rp.read_text())
    rep["sources"]["azure"]["sha256"] = "0" * 64  # recorded for another file -> re-ingest
    rp.write_text(json.dumps(rep))
    assert traces.load_canonical(P.data, "azure").height == 19_366
    P = P.with_overrides({"sources.azure.file": CODE})  # another file configured -> re-ingest
    again = traces.load_canonical(P.data, "azure")
    assert again.height == 8_819 and set(again["file"]) == {CODE}


def test_load_canonical_of_a_standin_source_is_an_error(P):
    with pytest.raises(DataError, match="no canonical table for burstgpt"):
        traces.load_canonical(P.data, "burstgpt")


def test_non_official_file_by_path(P, shared_traces, tmp_path):
    own = tmp_path / "my_trace.csv"
    shutil.copy(shared_traces / SLICE3, own)
    P = P.with_overrides({"sources.burstgpt": {"mode": "real", "file": str(own)}})
    df, rep = traces.ingest_source(P.paths, P.sources, P.standins, "burstgpt")
    assert rep["provenance"] == "real" and not rep["sha256_verified"] and rep["format"] == "burstgpt"
    assert rep["origin"] == "user"
    assert set(df["file"]) == {own.name} and df.height == 399
