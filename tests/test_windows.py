"""Frozen windows: stride placement, window tables and hashes, the manifest, freeze/verify/load.

Placement and manifest logic run on a synthetic canonical table served by patched
``registry``/``traces`` functions (so they do not depend on the ingest code); the real-data tests
freeze windows from the real Azure conversation trace in the data mirror.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portbench import params
from portbench.core import io
from portbench.data import registry, standins, traces
from portbench.data import windows as W
from portbench.core.errors import DataError, IntegrityError, ParameterError

# --------------------------------------------------------------------------- fixtures


def synthetic_canonical(n: int, *, seed: int = 0, file: str = "synthetic.csv", source: str = "azure",
                        tenant_fields: bool = False, drop_every: int = 0) -> pl.DataFrame:
    """A canonical table of ``n`` valid requests; ``drop_every`` leaves gaps in the raw row numbers."""
    rng = np.random.default_rng(seed)
    rows = np.arange(1, n + 1, dtype=np.int64)
    if drop_every:
        rows = rows + rows // drop_every  # every drop_every-th raw row was invalid
    df = pl.DataFrame({
        "source": [source] * n, "file": [file] * n, "row": rows,
        "arrival_s": np.cumsum(rng.exponential(0.5, n)) - 0.0,
        "prompt_tokens": rng.integers(1, 4000, n), "output_tokens": rng.integers(1, 800, n),
    })
    df = df.with_columns(pl.col("arrival_s") - pl.col("arrival_s").first())
    if tenant_fields:
        df = df.with_columns(
            pl.Series("model", rng.choice(["ChatGPT", "GPT-4"], n)),
            pl.Series("log_type", rng.choice(["Conversation log", "API log"], n)),
        )
    return df


@pytest.fixture()
def fake_data(tmp_path, monkeypatch):
    """Patch portbench.data.registry / portbench.data.traces to serve synthetic canonical tables.

    Both sources are "real"; bailian has no file and no stand-in (the registry resolves it to no
    provenance), so it must be skipped loudly.
    """
    raw = tmp_path / "raw"
    raw.mkdir()
    canon = {"azure": synthetic_canonical(3000, seed=1, file="az.csv", drop_every=17),
             "burstgpt": synthetic_canonical(2500, seed=2, file="bg.csv", source="burstgpt", tenant_fields=True)}
    for df in canon.values():
        df.write_csv(raw / df["file"][0])
    state = {"canon": canon, "loads": 0}

    def resolve_sources(paths, sources, standins_cfg):
        out = {s: {"provenance": "real", "file": df["file"][0], "path": raw / df["file"][0],
                   "reason": f"official file found in {raw}"} for s, df in state["canon"].items()}
        out["bailian"] = {"provenance": None, "file": "q.jsonl", "path": None,
                          "reason": "no official file -> skipped: no stand-in is defined"}
        return out

    def load_canonical(P, source):
        state["loads"] += 1
        return state["canon"][source]

    monkeypatch.setattr(registry, "resolve_mirror", lambda configured, root: raw)
    monkeypatch.setattr(registry, "locate", lambda name, st: raw / name)
    monkeypatch.setattr(registry, "resolve_sources", resolve_sources)
    monkeypatch.setattr(traces, "load_canonical", load_canonical)
    monkeypatch.setattr(traces, "scan_canonical", lambda paths, sources, standins_cfg, source: load_canonical(None, source).lazy())
    return state


@pytest.fixture()
def small_params(tmp_params, tmp_path):
    """Parameters with a tmp data dir and manifest and small windows (10 x 50)."""
    def make(**over):
        o = {"paths.manifest": str(tmp_path / "data" / "windows" / "manifest.json"),
             "windows.per_source": 10, "windows.size": 50,
             "sources.azure_code": None, "sources.mooncake": None}   # the fake registry serves azure and burstgpt
        o.update(over)
        return tmp_params(**o)
    return make


# --------------------------------------------------------------------------- placement


def _check_placement(starts: np.ndarray, n_rows: int, n_windows: int, size: int) -> None:
    edges = (np.arange(n_windows + 1) * n_rows) // n_windows
    assert len(starts) == n_windows
    for k, s in enumerate(starts):
        assert edges[k] <= s and s + size <= edges[k + 1], "each window lies inside its own bucket"
    assert np.all(starts[1:] >= starts[:-1] + size), "windows do not overlap"
    assert starts[0] >= 0 and starts[-1] + size <= n_rows, "windows lie inside the trace"


@settings(max_examples=200, deadline=None)
@given(n_windows=st.integers(1, 50), size=st.integers(1, 300), extra=st.integers(0, 5000),
       seed=st.integers(0, 2**32 - 1))
def test_stride_starts_one_per_bucket_non_overlapping(n_windows, size, extra, seed):
    n_rows = n_windows * size + extra
    starts = W.stride_starts(n_rows, n_windows, size, W.source_rng(seed, "azure", "placement"))
    _check_placement(starts, n_rows, n_windows, size)


def test_stride_starts_exact_fit_has_no_freedom():
    starts = W.stride_starts(40 * 200, 40, 200, W.source_rng(1, "x", "placement"))
    assert starts.tolist() == [200 * k for k in range(40)]


def test_stride_starts_too_short_trace_is_an_error():
    with pytest.raises(ValueError, match="need at least 8000"):
        W.stride_starts(7999, 40, 200, W.source_rng(1, "x"))
    canon = synthetic_canonical(100)
    with pytest.raises(DataError, match="synthetic.csv"):
        W.cut_windows(canon, 40, 200, 1, "azure", 4)


def test_placement_is_deterministic_and_seed_and_source_sensitive():
    canon = synthetic_canonical(20_000)
    a = W.cut_windows(canon, 40, 200, 20241129, "azure", 4)
    b = W.cut_windows(canon, 40, 200, 20241129, "azure", 4)
    c = W.cut_windows(canon, 40, 200, 20241130, "azure", 4)
    d = W.cut_windows(canon.with_columns(source=pl.lit("bailian")), 40, 200, 20241129, "bailian", 4)
    rows = [m["row_start"] for m, _ in a]
    assert rows == [m["row_start"] for m, _ in b]
    assert [W.window_sha256(x) for _, x in a] == [W.window_sha256(x) for _, x in b]
    assert rows != [m["row_start"] for m, _ in c], "another seed moves the windows"
    assert rows != [m["row_start"] for m, _ in d], "another source name moves the windows"
    # the placement draws come from SeedSequence, never from Python's (per-process) hash()
    ref = np.random.default_rng(np.random.SeedSequence([20241129, W.name_key("azure"), W.name_key("placement")]))
    assert (np.array(rows) - 1).tolist() == W.stride_starts(20_000, 40, 200, ref).tolist()


def test_cut_windows_rows_ids_and_table():
    canon = synthetic_canonical(5000, drop_every=9)
    out = W.cut_windows(canon, 12, 100, 3, "azure", 4)
    assert [m["id"] for m, _ in out] == [f"azure-{k:02d}" for k in range(12)]
    for meta, df in out:
        assert df.columns == list(W.COLUMNS)
        assert df.dtypes == [pl.Float64, pl.Int64, pl.Int64, pl.String]
        assert df.height == 100
        arr = df["arrival_s"].to_numpy()
        assert arr[0] == 0.0 and np.all(np.diff(arr) >= 0)
        src = canon.filter(pl.col("row").is_between(meta["row_start"], meta["row_end"]))
        assert src.height == 100, "row_start..row_end holds exactly the window's valid requests"
        assert meta["t_start"] == src["arrival_s"][0]
        np.testing.assert_array_equal(arr, src["arrival_s"].to_numpy() - meta["t_start"])
        assert df["prompt_tokens"].to_list() == src["prompt_tokens"].to_list()


def test_window_ids_width():
    assert W.window_ids("azure", 3) == ["azure-00", "azure-01", "azure-02"]
    assert W.window_ids("bailian", 101)[-1] == "bailian-100"


# --------------------------------------------------------------------------- tenants


def test_tenants_from_source_fields():
    canon = synthetic_canonical(3000, tenant_fields=True)
    meta, df = W.cut_windows(canon, 5, 200, 1, "burstgpt", 4)[0]
    assert meta["tenant_fields"] == ["model", "log_type"]
    src = canon.filter(pl.col("row").is_between(meta["row_start"], meta["row_end"]))
    want = [f"{m}/{t}" for m, t in zip(src["model"], src["log_type"])]
    assert df["tenant"].to_list() == want


def test_seeded_tenants_follow_zipf_shares_and_are_deterministic():
    n = 40_000
    a = W.seeded_tenants(n, 4, 7, "azure", "azure-00")
    assert a == W.seeded_tenants(n, 4, 7, "azure", "azure-00")
    assert a != W.seeded_tenants(n, 4, 7, "azure", "azure-01")
    shares = W.tenant_shares(4)
    np.testing.assert_allclose(shares, np.array([12, 6, 4, 3]) / 25)  # 1/k normalised, by hand
    freq = np.array([a.count(f"t{k}") for k in range(1, 5)]) / n
    np.testing.assert_allclose(freq, shares, atol=0.01)
    with pytest.raises(ParameterError):
        W.seeded_tenants(3, 0, 7, "azure", "azure-00")


def test_sessions_are_not_tenants():
    canon = synthetic_canonical(1000).with_columns(session_id=pl.lit("s1"))
    meta, df = W.cut_windows(canon, 2, 100, 1, "bailian", 3)[0]
    assert meta["tenant_fields"] == []
    assert set(df["tenant"]) <= {"t1", "t2", "t3"}


# --------------------------------------------------------------------------- hashing and stats


def test_window_sha256_by_hand():
    df = pl.DataFrame({"arrival_s": [0.0, 1.5], "prompt_tokens": [3, 4], "output_tokens": [5, 6],
                       "tenant": ["a", "bc"]})

    def field(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    blob = field(b"portbench-window-v1") + struct.pack("<QQ", 2, 4)
    blob += field(b"arrival_s") + field(b"f8") + field(struct.pack("<2d", 0.0, 1.5))
    blob += field(b"prompt_tokens") + field(b"i8") + field(struct.pack("<2q", 3, 4))
    blob += field(b"output_tokens") + field(b"i8") + field(struct.pack("<2q", 5, 6))
    blob += field(b"tenant") + field(b"str") + field(b"a") + field(b"bc")
    assert W.window_sha256(df) == hashlib.sha256(blob).hexdigest()


def test_window_sha256_sees_names_types_order_and_chunks():
    df = pl.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [1, 2, 3], "output_tokens": [4, 5, 6],
                       "tenant": ["t1", "t1", "t2"]})
    h = W.window_sha256(df)
    chunked = pl.concat([df.slice(0, 1), df.slice(1, 2)], rechunk=False)
    assert W.window_sha256(chunked) == h
    assert W.window_sha256(df.rename({"tenant": "tenants"})) != h
    assert W.window_sha256(df.with_columns(pl.col("prompt_tokens").cast(pl.Float64))) != h
    assert W.window_sha256(df.select(reversed(df.columns))) != h
    assert W.window_sha256(df.with_columns(tenant=pl.Series(["t1", "t12", ""]))) != \
        W.window_sha256(df.with_columns(tenant=pl.Series(["t1", "t1", "2"]))), "strings are length-prefixed"


def test_window_stats_by_hand():
    df = pl.DataFrame({"arrival_s": [0.0, 1.0, 3.0], "prompt_tokens": [10, 20, 60], "output_tokens": [1, 2, 3],
                       "tenant": ["t1"] * 3})
    s = W.window_stats(df)
    assert s["rate_rps"] == pytest.approx(2 / 3)          # 2 gaps over 3 s
    assert s["interarrival_cv"] == pytest.approx(1 / 3)   # gaps 1, 2: std 0.5 / mean 1.5
    assert s["prompt_mean"] == 30 and s["prompt_p90"] == pytest.approx(52.0)  # 20 + 0.8 * 40
    assert s["output_mean"] == 2 and s["output_p90"] == pytest.approx(2.8)
    flat = df.with_columns(arrival_s=pl.lit(0.0))
    assert W.window_stats(flat)["rate_rps"] is None and W.window_stats(flat)["interarrival_cv"] is None


def test_as_window_table_rejects_bad_tables():
    good = pl.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [1, 2], "output_tokens": [1, 2],
                         "tenant": ["a", "b"], "extra": [1, 2]})
    assert W.as_window_table(good).columns == list(W.COLUMNS)
    with pytest.raises(DataError, match="lacks"):
        W.as_window_table(good.drop("tenant"))
    with pytest.raises(DataError, match="arrival_s"):
        W.as_window_table(good.with_columns(arrival_s=pl.Series([1.0, 0.5])))
    with pytest.raises(DataError, match="positive"):
        W.as_window_table(good.with_columns(output_tokens=pl.Series([0, 1])))


# --------------------------------------------------------------------------- manifest bytes


def _small_manifest() -> dict:
    return {"version": W.MANIFEST_VERSION, "params": {"windows": {"seed": 1}}, "sources": {},
            "source_files": {"f.csv": "0" * 64},
            "windows": [{"id": "azure-00", "sha256": "ab" * 32, "stats": {"rate_rps": 1.25}, "row_end": None}]}


def test_manifest_roundtrip_and_canonical_form(tmp_path):
    m = W.write_manifest(_small_manifest(), tmp_path / "m.json")
    raw = (tmp_path / "m.json").read_bytes()
    assert raw == W.canonical_json(m) and raw.endswith(b"}\n")
    assert W.parse_manifest(raw) == m
    assert m["checksum"] == hashlib.sha256(W.canonical_json(_small_manifest())).hexdigest()


def test_every_single_byte_change_of_a_manifest_is_detected(tmp_path):
    W.write_manifest(_small_manifest(), tmp_path / "m.json")
    raw = (tmp_path / "m.json").read_bytes()
    replacements = [b" ", b"\n", b"0", b"1", b"a", b"\"", b"{", b"\xff"]
    for i in range(len(raw)):
        for r in replacements:
            if raw[i:i + 1] == r:
                continue
            with pytest.raises(IntegrityError):
                W.parse_manifest(raw[:i] + r + raw[i + 1:])
    with pytest.raises(IntegrityError):
        W.parse_manifest(raw + b"\n")
    with pytest.raises(IntegrityError):
        W.parse_manifest(raw[:-1])


# --------------------------------------------------------------------------- freeze / load / verify (synthetic)


def test_freeze_builds_manifest_and_cache(fake_data, small_params, capsys, tmp_path):
    P = small_params()
    m = W.freeze(P)
    err = capsys.readouterr().err
    assert "bailian" in err and "SKIPPED" in err, "a source without data or stand-in is skipped loudly"
    assert [e["id"] for e in m["windows"]] == W.window_ids("azure", 10) + W.window_ids("burstgpt", 10)
    assert m["sources"]["bailian"]["provenance"] is None and W.skipped_sources(m) == ["bailian"]
    assert m["sources"]["azure"]["tenants"] == {"rule": "seeded", "tenants": 4, "shares": "zipf 1/k"}
    assert m["sources"]["burstgpt"]["tenants"] == {"rule": "fields", "fields": ["model", "log_type"]}
    assert str(tmp_path) not in W.manifest_path(P.paths).read_text(), "no machine-specific paths in the manifest"
    assert "official file az.csv found" in m["sources"]["azure"]["reason"]
    assert "no stand-in" in m["sources"]["bailian"]["reason"]
    raw_dir = Path(registry.store(P.paths).mirror)
    assert m["source_files"] == {f: io.sha256_of(raw_dir / f) for f in ("az.csv", "bg.csv")}
    assert m["params"]["windows"] == {k: v for k, v in P.tree["windows"].items() if k != "min_per_source"}  # a check, not frozen
    assert W.manifest_path(P.paths).read_bytes() == W.canonical_json(m)
    assert W.cache_path(P.paths).is_file()
    assert W.manifest_path(P.paths).stat().st_mode & 0o044 == 0o044, "an ordinary, readable file (not mkstemp's 0600)"
    tables = W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    assert list(tables) == [e["id"] for e in m["windows"]]
    for e in m["windows"]:
        assert W.window_sha256(tables[e["id"]]) == e["sha256"]
        assert e["n_requests"] == 50 and e["provenance"] == "real" and e["synthetic"] is False
    t = W.window_table(m)
    assert t.height == 20 and {"provenance", "label", "rate_rps", "row_start"} <= set(t.columns)
    assert W.verify(P) == (20, 20, [])


def test_refreeze_is_byte_identical_and_freeze_never_rewrites(fake_data, small_params, monkeypatch):
    P = small_params()
    W.freeze(P)
    path = W.manifest_path(P.paths)
    first = path.read_bytes()
    W.freeze(P, refreeze=True)
    assert path.read_bytes() == first, "same parameters, same data -> byte-identical manifest"
    W.cache_path(P.paths).unlink()
    stat = path.stat()
    monkeypatch.setattr(W, "write_manifest", lambda *a, **k: pytest.fail("freeze rewrote the manifest"))
    m = W.freeze(P)
    assert path.read_bytes() == first and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert W.cache_path(P.paths).is_file(), "freeze without refreeze materialises the cache"
    assert m == json.loads(first)


def test_freeze_with_other_params_needs_refreeze(fake_data, small_params):
    W.freeze(small_params())
    with pytest.raises(ParameterError, match="refreeze"):
        W.freeze(small_params(**{"windows.seed": 5}))
    m = W.freeze(small_params(**{"windows.seed": 5}), refreeze=True)
    assert m["params"]["windows"]["seed"] == 5


def test_load_windows_subset_and_rebuild_without_cache(fake_data, small_params):
    P = small_params()
    m = W.freeze(P)
    W.cache_path(P.paths).unlink()
    sub = W.load_windows(P.data, manifest=W.load_manifest(P.paths), sources=["burstgpt"], per_source=3)
    assert list(sub) == ["burstgpt-00", "burstgpt-01", "burstgpt-02"]
    assert W.cache_path(P.paths).is_file()
    full = W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    assert all(W.window_sha256(full[e["id"]]) == e["sha256"] for e in m["windows"])


def test_load_windows_detects_a_tampered_cache(fake_data, small_params):
    P = small_params()
    m = W.freeze(P)
    cache = pl.read_parquet(W.cache_path(P.paths))
    target = m["windows"][3]
    idx = cache.with_row_index().filter(pl.col("window_id") == target["id"])["index"][7]
    tampered = cache.with_columns(
        pl.when(pl.int_range(pl.len()) == idx).then(pl.col("output_tokens") + 1)
        .otherwise(pl.col("output_tokens")).alias("output_tokens"))
    W._write_cache(W.cache_path(P.paths), m, {wid: part.drop("window_id") for (wid,), part in
                          tampered.partition_by("window_id", as_dict=True, maintain_order=True).items()})
    with pytest.raises(IntegrityError) as e:
        W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    msg = str(e.value)
    assert target["id"] in msg and target["sha256"] in msg
    got = W.window_sha256(tampered.filter(pl.col("window_id") == target["id"]).drop("window_id"))
    assert got in msg, "the message names both hashes"
    ok, total, problems = W.verify(P)
    assert (ok, total) == (19, 20) and any(target["id"] in p for p in problems)


def test_unreadable_or_foreign_cache(fake_data, small_params, capsys):
    P = small_params()
    m = W.freeze(P)
    cache = W.cache_path(P.paths)
    raw = cache.read_bytes()
    cache.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(IntegrityError, match="delete it"):
        W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    cache.unlink()
    W._write_cache(W.cache_path(P.paths), {**m, "checksum": "0" * 64}, W.load_windows(P.data, manifest=W.load_manifest(P.paths)))  # a cache of another manifest
    tables = W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    assert "another manifest" in capsys.readouterr().err and len(tables) == 20
    assert W._read_cache(W.cache_path(P.paths), m).keys() == tables.keys(), "the foreign cache was replaced"


def test_tampered_source_data_is_detected(fake_data, small_params):
    P = small_params()
    m = W.freeze(P)
    W.cache_path(P.paths).unlink()
    canon = fake_data["canon"]["azure"]
    e = m["windows"][2]
    fake_data["canon"]["azure"] = canon.with_columns(
        pl.when(pl.col("row") == e["row_start"] + 1).then(pl.col("prompt_tokens") * 2)
        .otherwise(pl.col("prompt_tokens")).alias("prompt_tokens"))
    with pytest.raises(IntegrityError, match=e["id"]):
        W.load_windows(P.data, manifest=W.load_manifest(P.paths), sources=["azure"])
    ok, total, problems = W.verify(P)
    assert ok == total - 1 and any(e["id"] in p and e["sha256"] in p for p in problems)
    with pytest.raises(IntegrityError, match=e["id"]):
        W.freeze(P)


def test_changed_source_file_is_reported(fake_data, small_params):
    P = small_params()
    W.freeze(P)
    raw = Path(registry.store(P.paths).mirror) / "bg.csv"
    raw.write_bytes(raw.read_bytes() + b"\n")
    ok, total, problems = W.verify(P)
    assert ok == total and any(p.startswith("source file bg.csv: sha256") for p in problems)


def test_verify_reports_a_damaged_manifest(fake_data, small_params):
    P = small_params()
    W.freeze(P)
    path = W.manifest_path(P.paths)
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b'"size": 50', b'"size": 51'))
    ok, total, problems = W.verify(P)
    assert (ok, total) == (0, 20) and "checksum mismatch" in problems[0]
    with pytest.raises(IntegrityError):
        W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    path.write_bytes(raw[:100])
    assert W.verify(P)[:2] == (0, 0)
    path.unlink()
    with pytest.raises(DataError, match="portbench freeze"):
        W.load_manifest(P.paths)


# --------------------------------------------------------------------------- the real Azure trace


@pytest.fixture()
def azure_only(monkeypatch, shared_traces):
    """The real registry/traces, with every source but Azure switched off (test speed)."""
    monkeypatch.setenv("PORTBENCH_OFFLINE", "1")  # absent official files: no download attempts
    real = registry.resolve_sources

    def only_azure(*sections):
        out = real(*sections)
        for s in out:
            if s != "azure":
                out[s] = {**out[s], "provenance": None, "reason": "switched off in this test"}
        return out

    monkeypatch.setattr(registry, "resolve_sources", only_azure)


def _real_params(tmp_params, d: Path, **over):
    o = {"paths.data_dir": str(d / "data"), "paths.manifest": str(d / "data" / "windows" / "manifest.json")}
    o.update(over)
    return tmp_params(**o)


def test_real_azure_windows_stable_across_freezes(azure_only, tmp_params, tmp_path):
    P1 = _real_params(tmp_params, tmp_path / "one")
    P2 = _real_params(tmp_params, tmp_path / "two")
    m1, m2 = W.freeze(P1), W.freeze(P2)
    az = [e for e in m1["windows"] if e["source"] == "azure"]
    assert len(az) == 40 and all(e["n_requests"] == 200 for e in az)
    assert all(e["file"] == "AzureLLMInferenceTrace_conv.csv" and e["provenance"] == "real" for e in az)
    assert [e["sha256"] for e in az] == [e["sha256"] for e in m2["windows"] if e["source"] == "azure"]
    assert W.manifest_path(P1.paths).read_bytes() == W.manifest_path(P2.paths).read_bytes()
    assert m1["source_files"]["AzureLLMInferenceTrace_conv.csv"] == \
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"  # PROVENANCE.md
    rows = [(e["row_start"], e["row_end"]) for e in az]
    assert all(a <= b < c for (a, b), (c, _) in zip(rows, rows[1:])), "non-overlapping, in trace order"
    assert rows[0][0] >= 1 and rows[-1][1] <= 19_366
    assert all(e["duration_s"] > 0 and e["stats"]["rate_rps"] > 0 for e in az)
    first = W.manifest_path(P1.paths).read_bytes()
    W.freeze(P1, refreeze=True)
    assert W.manifest_path(P1.paths).read_bytes() == first
    assert W.verify(P1) == (40, 40, [])


def test_real_azure_every_tampered_manifest_byte_fails_verify(azure_only, tmp_params, tmp_path):
    P = _real_params(tmp_params, tmp_path, **{"windows.per_source": 8, "windows.size": 50})
    W.freeze(P)
    path = W.manifest_path(P.paths)
    raw = path.read_bytes()
    rng = np.random.default_rng(0)
    positions = rng.choice(len(raw), size=600, replace=False)
    for i in positions:
        new = bytes([(raw[i] + int(rng.integers(1, 256))) % 256])
        path.write_bytes(raw[:i] + new + raw[i + 1:])
        ok, total, problems = W.verify(P)
        assert ok == 0 and problems, f"byte {i} changed from {raw[i:i + 1]!r} to {new!r} went unnoticed"
        with pytest.raises(IntegrityError):
            W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    path.write_bytes(raw)
    assert W.verify(P) == (8, 8, [])


def test_real_azure_every_single_value_change_of_a_window_is_detected(azure_only, tmp_params, tmp_path):
    P = _real_params(tmp_params, tmp_path, **{"windows.per_source": 8, "windows.size": 50})
    m = W.freeze(P)
    tables = W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    rng = np.random.default_rng(1)
    for trial in range(300):
        e = m["windows"][int(rng.integers(len(m["windows"])))]
        df = tables[e["id"]]
        col = W.COLUMNS[int(rng.integers(len(W.COLUMNS)))]
        i = int(rng.integers(df.height))
        v = df[col].to_list()
        if col == "arrival_s":
            v[i] = float(np.nextafter(v[i], np.inf))  # the smallest possible change
        elif col == "tenant":
            v[i] = v[i] + "x"
        else:
            v[i] = v[i] + int(rng.choice([-1, 1])) if v[i] > 1 else v[i] + 1
        changed = df.with_columns(pl.Series(col, v, dtype=df.schema[col]))
        assert W.window_sha256(changed) != e["sha256"], (trial, e["id"], col, i)
        if trial % 60 == 0:  # through the cache too (each check rewrites the parquet)
            W._write_cache(W.cache_path(P.paths), m, {**tables, e["id"]: changed})
            with pytest.raises(IntegrityError, match=e["id"]):
                W.load_windows(P.data, manifest=W.load_manifest(P.paths))
    W._write_cache(W.cache_path(P.paths), m, tables)
    assert list(W.load_windows(P.data, manifest=W.load_manifest(P.paths))) == [e["id"] for e in m["windows"]]


def test_standin_windows_freeze_regenerate_and_verify(monkeypatch, shared_traces, tmp_params, tmp_path):
    """Stand-in sources through the real stand-in module: recorded generator, evidence checksums, regeneration."""
    monkeypatch.setenv("PORTBENCH_OFFLINE", "1")
    real = registry.resolve_sources
    monkeypatch.setattr(registry, "resolve_sources", lambda *sections: {
        s: (r if s != "azure" else {**r, "provenance": None, "reason": "switched off in this test"})
        for s, r in real(*sections).items()})
    P = _real_params(tmp_params, tmp_path, **{"windows.per_source": 3, "windows.size": 40,
                                              "sources.burstgpt.mode": "standin", "sources.bailian.mode": "standin",
                                              "sources.azure_code": None, "sources.mooncake": None})
    m = W.freeze(P)
    assert [e["id"] for e in m["windows"]] == W.window_ids("burstgpt", 3) + W.window_ids("bailian", 3)
    for e in m["windows"]:
        assert e["provenance"] == "standin" and e["synthetic"] is True
        assert e["row_start"] is None and e["row_end"] is None and {"name", "params", "seed"} <= set(e["generator"])
    for s in ("burstgpt", "bailian"):
        assert m["sources"][s]["reason"] == "mode standin: the labelled stand-in was requested"
        for name, sha in standins.evidence_sha256(standins.inputs(P.paths, P.sources, P.standins, P.windows), s).items():
            assert m["source_files"][name] == sha
    W.cache_path(P.paths).unlink()
    assert W.verify(P) == (6, 6, [])
    first = W.manifest_path(P.paths).read_bytes()
    W.freeze(P, refreeze=True)
    assert W.manifest_path(P.paths).read_bytes() == first, "stand-in windows refreeze byte-identically"
    e = m["windows"][4]
    original = standins.regenerate

    def drifted(entry, *a):  # a generator whose output changed by one token in one window
        df = original(entry, *a)
        return df.with_columns(pl.col("output_tokens") + 1) if entry["id"] == e["id"] else df

    monkeypatch.setattr(standins, "regenerate", lambda entry, *a: drifted({**entry, "sha256": None}, *a))
    ok, total, problems = W.verify(P)
    assert (ok, total) == (5, 6) and any(e["id"] in p and e["sha256"] in p for p in problems)


# --------------------------------------------------------------------------- descriptive tables and figures


def test_rate_over_time_by_hand():
    from portbench.present import plots_data

    r = plots_data.rate_over_time(np.arange(10.0), bin_s=5.0)  # last bin covers 5..9 (4 s, kept)
    assert r["t_s"].to_list() == [0.0, 5.0] and r["requests"].to_list() == [5, 5]
    assert r["rate_rps"].to_list() == [1.0, 1.25]
    r = plots_data.rate_over_time(np.arange(11.0), bin_s=5.0)  # last bin covers 10..10 (0 s, dropped)
    assert r["requests"].to_list() == [5, 5]
    assert plots_data.auto_bin_s(3600.0) == 10.0 and plots_data.auto_bin_s(60 * 86400.0) == 21600.0


def test_interarrival_cv_by_bucket_by_hand():
    from portbench.present import plots_data

    periodic = np.arange(0.0, 1200.0, 2.0)                         # gaps all 2 s -> CV 0
    cv = plots_data.interarrival_cv_by_bucket(periodic, bucket_s=600.0)
    assert cv["t_s"].to_list() == [0.0, 600.0] and cv["cv"].to_list() == [0.0, 0.0]
    alternating = np.concatenate([[0.0], np.cumsum(np.tile([1.0, 3.0], 200))])  # gaps 1, 3: std 1 / mean 2
    cv = plots_data.interarrival_cv_by_bucket(alternating, bucket_s=1e6)
    assert cv["cv"][0] == pytest.approx(0.5)
    few = plots_data.interarrival_cv_by_bucket(np.arange(5.0), bucket_s=600.0)
    assert few["cv"].to_list() == [None], "too few requests for a CV"


def test_window_figures_label_stand_ins(fake_data, small_params):
    from portbench.present import plots_data
    from portbench.core import provenance as sources

    P = small_params()
    m = W.freeze(P)
    m = {**m, "windows": [{**e, "provenance": "standin", "synthetic": True} if e["source"] == "burstgpt" else e
                          for e in m["windows"]]}
    table = W.window_table(m, P.display_names)
    labels = sources.labels(W.provenance(m), P.display_names)
    assert labels == {"azure": "Azure", "burstgpt": "BurstGPT (stand-in)"}
    fig = plots_data.plot_window_placement(m, {"azure": fake_data["canon"]["azure"]}, labels)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("Azure:") and titles[1].startswith("BurstGPT (stand-in):")
    fig = plots_data.plot_window_stats(table)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["Azure", "BurstGPT (stand-in)"]     # rotated labels (they overlapped on two lines)
    summary = plots_data.window_summary(table)
    assert summary["windows"].to_list() == [10, 10]
    assert summary["median_rate_rps"][0] == pytest.approx(table.filter(pl.col("source") == "azure")["rate_rps"].median())
    cover = plots_data.placement_coverage(m, {"azure": fake_data["canon"]["azure"]})
    assert cover["requests_in_windows_frac"][0] == pytest.approx(10 * 50 / 3000)
    rep = plots_data.representative_window(table, "real")
    az = table.filter(pl.col("source") == "azure")
    assert rep in az["id"].to_list()
    assert abs(az.filter(pl.col("id") == rep)["interarrival_cv"][0] - az["interarrival_cv"].median()) == \
        (az["interarrival_cv"] - az["interarrival_cv"].median()).abs().min()


def test_standin_params_only_matter_with_standin_windows(fake_data, small_params):
    W.freeze(small_params())  # only real windows (bailian skipped)
    assert W.freeze(small_params(**{"standins.seed": 99}))["params"]["standins"]["seed"] != 99
    with pytest.raises(ParameterError, match="sources"):
        W.freeze(small_params(**{"sources.azure.mode": "real"}))


# --------------------------------------------------------------------------- the committed manifest


WINDOWS_120 = Path(__file__).with_name("windows_120.json")


def test_committed_manifest_keeps_the_original_120_windows():
    """Adding sources never changes a frozen window: the original study's 120 windows keep their ids,
    order and SHA-256 (recorded before azure_code and mooncake were added)."""
    want = json.loads(WINDOWS_120.read_text())["windows"]
    m = W.load_manifest(params.load().paths)
    got = {e["id"]: e["sha256"] for e in m["windows"]}
    assert len(want) == 120 and {k: got.get(k) for k in want} == want
    assert [e["id"] for e in m["windows"]][:120] == list(W.window_ids("azure", 40) + W.window_ids("burstgpt", 40)
                                                          + W.window_ids("bailian", 40))
    # the new sources: 40 windows each, real, frozen from their official files
    for s in ("azure_code", "mooncake"):
        es = [e for e in m["windows"] if e["source"] == s]
        assert [e["id"] for e in es] == W.window_ids(s, 40) and {e["provenance"] for e in es} == {"real"}
        assert m["sources"][s]["origin"] == "official" and m["sources"][s]["provenance"] == "real"
    assert m["sources"]["mooncake"]["block_size"] == 512
    assert all("block_size" not in m["sources"][s] for s in m["sources"] if s != "mooncake")


@pytest.mark.slow
def test_refreezing_the_default_study_reproduces_the_committed_manifest(shared_traces, tmp_path, monkeypatch):
    """Refreezing from the raw data with default.yaml gives the committed manifest byte for byte (so the
    120 original windows are unchanged by the sources section that now also names azure_code and mooncake)."""
    monkeypatch.setenv("PORTBENCH_OFFLINE", "1")
    P = params.load(overrides={"paths": {"data_dir": str(tmp_path / "data"), "mirror": str(shared_traces),
                                         "manifest": str(tmp_path / "manifest.json")}})
    W.freeze(P, refreeze=True)
    assert (tmp_path / "manifest.json").read_bytes() == W.manifest_path(params.load().paths).read_bytes()


def test_mooncake_windows_carry_block_hashes_and_others_do_not(shared_traces, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTBENCH_OFFLINE", "1")
    P = params.load(overrides={"paths": {"data_dir": str(tmp_path / "data"), "mirror": str(shared_traces)}})
    m = W.load_manifest(P.paths)
    tables = W.load_windows(P.data, manifest=W.load_manifest(P.paths), sources=["azure", "azure_code", "mooncake"], per_source=2)
    for wid, df in tables.items():
        entry = next(e for e in m["windows"] if e["id"] == wid)
        assert W.window_sha256(df) == entry["sha256"]
        if wid.startswith("mooncake"):
            assert df.columns == [*W.COLUMNS, W.HASH_COLUMN] and df[W.HASH_COLUMN].dtype == pl.List(pl.Int64)
            n = df[W.HASH_COLUMN].list.len()
            assert (n == (df["prompt_tokens"] + 511) // 512).all(), "ceil(prompt / 512) hashes per request"
            assert W.hash_block_size(m, entry) == 512
            # the hashes are part of the window's hash: another list changes it
            other = df.with_columns(pl.col(W.HASH_COLUMN).list.reverse())
            assert W.window_sha256(other) != entry["sha256"]
        else:
            assert df.columns == list(W.COLUMNS) and W.hash_block_size(m, entry) is None
    # the cache keeps each window's own columns
    again = W.load_windows(P.data, manifest=W.load_manifest(P.paths), sources=["azure", "mooncake"], per_source=2)
    assert {k: v.columns for k, v in again.items()} == {k: tables[k].columns for k in again}


def test_window_table_hash_of_block_hashes_is_exact():
    base = pl.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [600, 10], "output_tokens": [1, 2],
                         "tenant": ["a", "b"]})
    plain = W.window_sha256(W.as_window_table(base))
    h = lambda lists: W.window_sha256(W.as_window_table(base.with_columns(pl.Series(W.HASH_COLUMN, lists))))  # noqa: E731
    assert len({plain, h([[1, 2], [3]]), h([[1], [2, 3]]), h([[1, 2, 3], []]), h([[2, 1], [3]])}) == 5
    assert h([[1, 2], [3]]) == h([[1, 2], [3]])
    with pytest.raises(DataError, match="block_hashes"):
        W.as_window_table(base.with_columns(pl.Series(W.HASH_COLUMN, [[1, None], [3]])))
