"""Fuzz: corrupted variants of real rows, per adapter.

Every variant must either raise one DataError (never another exception) or be read into a table
whose rows add up: rows read == valid rows + excluded rows, rows read == the file's record count,
and the table satisfies the canonical invariants.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portbench.data import traces
from portbench.core.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
MIRROR = (ROOT.parent / "shared" / "traces").resolve()
N_ROWS = 25  # real rows per base file
EXAMPLES = 300  # corrupted variants per adapter

pytestmark = pytest.mark.skipif(not (MIRROR / "azure2023").is_dir(), reason=f"data mirror not found at {MIRROR}")


def _csv_base(rel: str, skip: int = 0) -> list[bytes]:
    lines = (MIRROR / rel).read_bytes().splitlines()
    return [lines[0], *lines[1 + skip: 1 + skip + N_ROWS]]


def _jsonl_base() -> list[bytes]:
    df = pl.read_csv(MIRROR / "qwen_bailian/qwen_traceA_light_stratified_13windows.csv").drop("window")
    return [json.dumps({**r, "hash_ids": [1, 2]}).encode() for r in df.head(N_ROWS).iter_rows(named=True)]


def _bases() -> dict[str, tuple[str, list[bytes], bool]]:
    """``{case: (format, lines, has_header)}``; BurstGPT 1 starts at its first failure rows."""
    if not (MIRROR / "azure2023").is_dir():
        return {}
    return {"azure2023": ("azure2023", _csv_base("azure2023/AzureLLMInferenceTrace_conv.csv"), True),
            "burstgpt6": ("burstgpt", _csv_base("burstgpt/BurstGPT_1_first400.csv", skip=40), True),
            "burstgpt8": ("burstgpt", _csv_base("burstgpt/BurstGPT_3_first400.csv", skip=360), True),
            "qwen_csv": ("qwen_csv", _csv_base("qwen_bailian/qwen_traceA_light_stratified_13windows.csv"), True),
            "qwen_jsonl": ("qwen_jsonl", _jsonl_base(), False)}


BASES = _bases()

VALUES = st.one_of(
    st.sampled_from([b"0", b"-1", b"", b" ", b"1.5", b"nan", b"inf", b"1e3", b"99999999999999999999",
                     b"ChatGPT", b"API log", b"2023-11-16 18:15:46.6805900", b"-0", b"+3", b"\"5\"", b"null"]),
    st.integers(-10**6, 10**7).map(lambda i: str(i).encode()),
    st.binary(max_size=6),
)
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**20), st.floats(allow_nan=False),
                        st.text(max_size=5), st.just([]), st.just({}))


@st.composite
def mutation(draw, n_lines: int, jsonl: bool):
    """One corruption: (kind, arguments)."""
    i = draw(st.integers(0, n_lines - 1))
    kind = draw(st.sampled_from(["delete_field", "duplicate_field", "alter_field", "zero_tokens", "insert_bytes",
                                 "truncate_line", "swap_lines", "delete_line", "duplicate_line", "blank_line",
                                 "truncate_file"] + (["json_delete", "json_set"] if jsonl else [])))
    return kind, i, draw(st.integers(0, 10)), draw(VALUES), draw(JSON_VALUES), draw(st.integers(0, n_lines - 1))


def _apply(lines: list[bytes], m, jsonl: bool) -> list[bytes] | bytes:
    kind, i, k, value, jvalue, j = m
    lines = list(lines)
    sep = b", " if jsonl else b","
    fields = lines[i].split(sep)
    f = k % len(fields)
    if kind == "delete_field" and len(fields) > 1:
        del fields[f]
    elif kind == "duplicate_field":
        fields.insert(f, fields[f])
    elif kind == "alter_field":
        fields[f] = value
    elif kind == "zero_tokens":
        fields = [(b"0" if x.strip().isdigit() and n > 0 else x) for n, x in enumerate(fields)]
    elif kind == "insert_bytes":
        pos = k % (len(lines[i]) + 1)
        lines[i] = lines[i][:pos] + value + lines[i][pos:]
        return lines
    elif kind == "truncate_line":
        lines[i] = lines[i][: k % max(len(lines[i]), 1)]
        return lines
    elif kind == "swap_lines":
        lines[i], lines[j] = lines[j], lines[i]
        return lines
    elif kind == "delete_line":
        del lines[i]
        return lines
    elif kind == "duplicate_line":
        lines.insert(i, lines[i])
        return lines
    elif kind == "blank_line":
        lines.insert(i, b"")
        return lines
    elif kind == "truncate_file":
        data = b"\n".join(lines) + b"\n"
        return data[: len(data) * (k + 1) // 12]
    elif kind in ("json_delete", "json_set"):
        rec = json.loads(lines[i])
        key = sorted(rec)[k % len(rec)]
        if kind == "json_delete":
            del rec[key]
        else:
            rec[key] = jvalue
        lines[i] = json.dumps(rec).encode()
        return lines
    lines[i] = sep.join(fields)
    return lines


def _records(data: bytes, has_header: bool) -> int:
    """Independent count of records: lines (trailing blank lines excluded) minus the header."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    while lines and not lines[-1].strip(b"\r"):
        lines.pop()
    return max(len(lines) - (1 if has_header else 0), 0)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="portbench-fuzz-") as d:
        yield Path(d)


def _check_variant(path: Path, fmt: str, data: bytes, has_header: bool) -> None:
    path.write_bytes(data)
    try:
        df, rep = traces.read_file(path, fmt)
    except DataError as e:
        assert str(path) in str(e)
        return
    excluded = sum(rep["excluded"].values())
    assert rep["rows_read"] == rep["rows_valid"] + excluded == df.height + excluded
    assert rep["rows_read"] == _records(data, has_header)
    assert df.height == 0 or df["arrival_s"].min() >= 0
    assert df["arrival_s"].is_sorted() and df["row"].is_sorted() and df["row"].n_unique() == df.height
    assert (df["prompt_tokens"] > 0).all() and (df["output_tokens"] > 0).all()
    assert df.height == 0 or 1 <= df["row"].min() <= df["row"].max() <= rep["rows_read"]


@pytest.mark.parametrize("case", sorted(BASES))
def test_corrupted_variants_error_cleanly_or_add_up(case, workdir):
    fmt, base, has_header = BASES[case]
    jsonl = fmt == "qwen_jsonl"
    path = workdir / (f"{case}.jsonl" if jsonl else f"{case}.csv")
    _check_variant(path, fmt, b"\n".join(base) + b"\n", has_header)  # the unmodified rows read cleanly
    assert traces.read_file(path, fmt)[1]["rows_read"] == len(base) - has_header

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(mutation(len(base), jsonl), min_size=1, max_size=3))
    def run(mutations):
        lines: list[bytes] | bytes = base
        for m in mutations:
            if isinstance(lines, bytes):  # the file was truncated: further edits apply to its lines
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
            lines = _apply(lines, m, jsonl)
        data = lines if isinstance(lines, bytes) else b"\n".join(lines) + b"\n"
        _check_variant(path, fmt, data, has_header)

    run()
