"""Official-file registry: PROVENANCE.md agreement, mirror resolution, verification, download, modes.

No test touches the network: pooch.retrieve is replaced for every test in this module.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from portbench import params
from portbench.core import io
from portbench.data import registry, traces
from portbench.core.errors import DataError, ParameterError
from portbench.core.config import GENERIC_FORMATS

SOURCES = tuple(params.load(validate=False).source_names())   # the default study's sources

CONV = "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every download attempt fails as if offline; the per-process failure memo starts empty."""
    import pooch

    def offline(url, **kw):
        raise ConnectionError(f"network disabled in tests ({url})")

    monkeypatch.setattr(pooch, "retrieve", offline)
    monkeypatch.setattr(registry, "_FAILED_DOWNLOADS", {})
    monkeypatch.delenv(registry.OFFLINE_ENV, raising=False)


@pytest.fixture()
def P_for(tmp_path, monkeypatch):
    """Parameters with data under tmp_path and the given mirror / source settings."""
    monkeypatch.delenv(registry.MIRROR_ENV, raising=False)

    def make(mirror, **sources):
        over = {"paths": {"data_dir": str(tmp_path / "data"), "mirror": str(mirror) if mirror else None}}
        if sources:
            over["sources"] = sources
        return params.load("papermill_params/default.yaml", over, validate=False)

    return make


def store(P):
    return registry.store(P.paths)


def resolve(P, source: str) -> dict:
    return registry.resolve_source(store(P), P.sources[source], P.standins.of(source) is not None)


def _provenance_tables(text: str) -> dict[str, tuple[int | None, str | None]]:
    """``{file: (bytes, sha256)}`` from PROVENANCE.md's complete-file and official-file tables."""
    out: dict[str, tuple[int | None, str | None]] = {}
    for m in re.finditer(r"### (?:azure2023|mooncake)/(\S+)[^\n]*\n(.*?)\n\n", text, re.S):
        sha = re.search(r"sha256 \| `([0-9a-f]{64})` \(([\d,]+) bytes\)", m.group(2))
        out[m.group(1)] = (int(sha.group(2).replace(",", "")), sha.group(1))
    for m in re.finditer(r"^\| `([^`]+\.(?:csv|jsonl))`[^|]*\| ([\d,]+) \| `([0-9a-f]{64})` \|", text, re.M):
        out[m.group(1)] = (int(m.group(2).replace(",", "")), m.group(3))
    return out


def test_registry_matches_provenance(shared_traces):
    text = (shared_traces / "PROVENANCE.md").read_text()
    recorded = _provenance_tables(text)
    assert len(recorded) == 2 + 1 + 4 + 4, "PROVENANCE.md tables not parsed as expected"
    for name, (size, sha) in recorded.items():
        spec = registry.OFFICIAL_FILES[name]
        assert (spec.size, spec.sha256) == (size, sha), name
    # every official file name mentioned anywhere (slices excluded) is registered
    mentioned = set(re.findall(r"(?:AzureLLMInferenceTrace|BurstGPT|qwen)_[A-Za-z0-9_]+\.(?:csv|jsonl)", text))
    mentioned = {m for m in mentioned if "first400" not in m and "stratified" not in m}
    mentioned |= {"AzureLLMInferenceTrace_conv_1week.csv", "BurstGPT_without_fails_3.csv"}
    assert mentioned <= set(registry.OFFICIAL_FILES), mentioned - set(registry.OFFICIAL_FILES)
    assert len(registry.OFFICIAL_FILES) == 15
    mc = registry.OFFICIAL_FILES["conversation_trace.jsonl"]
    assert (mc.source, mc.rows, mc.block_size) == ("mooncake", 12_031, 512)   # 12,031 JSON lines, 512-token blocks


def test_registry_entries_are_well_formed():
    for name, spec in registry.OFFICIAL_FILES.items():
        assert spec.name == name and spec.source in SOURCES
        assert spec.fmt in traces.FORMATS or spec.fmt in GENERIC_FORMATS
        assert spec.urls and all(u.startswith("https://") and u.endswith(name) for u in spec.urls)
        assert spec.mirror_path.endswith("/" + name)
        assert spec.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
    assert registry.OFFICIAL_FILES[CONV].rows == 19_366
    assert registry.OFFICIAL_FILES["BurstGPT_3.csv"].sha256 is None  # not recorded
    for fmt in registry.SLICES.values():
        assert fmt in traces.FORMATS


def test_resolve_mirror_precedence(tmp_path, monkeypatch, shared_traces):
    P = params.load("papermill_params/default.yaml", {"paths.data_dir": str(tmp_path)}, validate=False)
    root = P.paths.root
    monkeypatch.delenv(registry.MIRROR_ENV, raising=False)
    # default: <root>/../shared/traces
    assert registry.resolve_mirror(P.paths.mirror, root) == (Path(root) / ".." / "shared" / "traces").resolve()
    assert registry.store(P.paths).mirror == registry.resolve_mirror(None, root)
    monkeypatch.setenv(registry.MIRROR_ENV, "   ")  # empty -> ignored
    assert registry.resolve_mirror(None, root) == shared_traces.resolve()
    monkeypatch.setenv(registry.MIRROR_ENV, str(tmp_path / "env_mirror"))
    assert registry.resolve_mirror(None, root) == tmp_path / "env_mirror"
    Q = P.with_overrides({"paths.mirror": str(tmp_path / "param_mirror")})
    assert registry.store(Q.paths).mirror == tmp_path / "param_mirror"
    monkeypatch.delenv(registry.MIRROR_ENV)
    assert registry.resolve_mirror(None, tmp_path / "project") is None  # no ../shared/traces next to that root


def test_locate_verifies_mirror_copy_and_caches_the_hash(P_for, shared_traces, monkeypatch):
    st = registry.store(P_for(shared_traces).paths)
    path = registry.locate(CONV, st)
    assert path == shared_traces / "azure2023" / CONV
    cache = st.raw_dir / registry.VERIFIED_CACHE
    assert cache == st.hash_cache and registry.OFFICIAL_FILES[CONV].sha256 in cache.read_text()
    calls = []
    monkeypatch.setattr(io, "_hash_file", lambda p: calls.append(p) or "x")
    monkeypatch.setattr(io, "_MEMO", {})
    assert registry.locate(CONV, st) == path and calls == [], "second verification must use the cache"


@pytest.mark.parametrize("layout", ["bare", "by_source"])
def test_locate_finds_bare_and_source_folder_copies(P_for, shared_traces, tmp_path, layout):
    mirror = tmp_path / "m"
    dest = mirror / (CONV if layout == "bare" else f"azure/{CONV}")
    dest.parent.mkdir(parents=True)
    shutil.copy(shared_traces / "azure2023" / CONV, dest)
    assert registry.locate(CONV, store(P_for(mirror))) == dest


def test_wrong_checksum_in_mirror_is_an_error(P_for, shared_traces, tmp_path):
    mirror = tmp_path / "m"
    bad = mirror / "azure2023" / CONV
    bad.parent.mkdir(parents=True)
    data = bytearray((shared_traces / "azure2023" / CONV).read_bytes())
    data[-1:] = b"4" if data[-1:] != b"4" else b"5"  # same size, one digit changed
    bad.write_bytes(bytes(data))
    with pytest.raises(DataError) as e:
        registry.locate(CONV, store(P_for(mirror)))
    msg = str(e.value)
    assert str(bad) in msg and registry.OFFICIAL_FILES[CONV].sha256 in msg and "expected" in msg
    assert io.sha256_of(bad) in msg
    bad.write_bytes(bytes(data[:-10]))  # truncated copy: size check names both sizes
    with pytest.raises(DataError, match=r"size 719,178 bytes.*719,188"):
        registry.locate(CONV, store(P_for(mirror)))


def test_missing_file_without_network_is_a_clear_error(P_for, tmp_path):
    (tmp_path / "empty_mirror").mkdir()
    with pytest.raises(registry.MissingFileError) as e:
        registry.locate("BurstGPT_without_fails_2.csv", store(P_for(tmp_path / "empty_mirror")))
    msg = str(e.value)
    assert "BurstGPT_without_fails_2.csv" in msg and "empty_mirror" in msg
    assert "burstgpt/BurstGPT_without_fails_2.csv" in msg  # where in the mirror it looked
    assert "releases/download/v2.0" in msg and "ConnectionError" in msg  # where it tried to download
    assert str(tmp_path / "data" / "raw") in msg


def test_offline_env_skips_the_download(P_for, tmp_path, monkeypatch):
    monkeypatch.setenv(registry.OFFLINE_ENV, "1")
    with pytest.raises(DataError, match=registry.OFFLINE_ENV):
        registry.locate(CONV, store(P_for(tmp_path / "nowhere")))


def test_download_goes_to_raw_and_is_verified(P_for, shared_traces, tmp_path, monkeypatch):
    import pooch

    seen = {}

    def fake_retrieve(url, known_hash=None, fname=None, path=None, **kw):
        seen.update(url=url, known_hash=known_hash)
        Path(path).mkdir(parents=True, exist_ok=True)
        return str(shutil.copy(shared_traces / "azure2023" / CONV, Path(path) / fname))

    monkeypatch.setattr(pooch, "retrieve", fake_retrieve)
    P = store(P_for(tmp_path / "nowhere"))
    got = registry.locate(CONV, P)
    assert got == P.raw_dir / CONV
    assert seen["known_hash"] == "sha256:" + registry.OFFICIAL_FILES[CONV].sha256
    assert "b469a113cedca53ddc3bdea71a143dc4b7d8700c" in seen["url"]  # the pinned commit first
    monkeypatch.setattr(pooch, "retrieve", lambda *a, **k: pytest.fail("must reuse the earlier download"))
    assert registry.locate(CONV, P) == got


def test_failed_download_is_not_retried_in_the_same_process(P_for, tmp_path, monkeypatch):
    import pooch

    calls = []
    monkeypatch.setattr(pooch, "retrieve", lambda url, **kw: calls.append(url) or (_ for _ in ()).throw(OSError("x")))
    P = store(P_for(tmp_path / "nowhere"))
    for _ in range(2):
        with pytest.raises(DataError):
            registry.locate(CONV, P)
    assert len(calls) == len(registry.OFFICIAL_FILES[CONV].urls)


def test_mode_resolution(P_for, shared_traces, tmp_path):
    conv = {"file": CONV}
    missing = {"file": "BurstGPT_without_fails_2.csv"}
    P = P_for(shared_traces, azure={"mode": "auto", **conv}, burstgpt={"mode": "auto", **missing},
              bailian={"mode": "standin", "file": "qwen_traceB_blksz_16.jsonl"})
    r = registry.resolve_sources(P.paths, P.sources, P.standins)
    assert set(r) == set(SOURCES)
    assert r["azure"]["provenance"] == "real" and r["azure"]["path"] == shared_traces / "azure2023" / CONV
    assert r["burstgpt"]["provenance"] == "standin" and r["burstgpt"]["path"] is None
    assert "not found" in r["burstgpt"]["reason"] and "stand-in" in r["burstgpt"]["reason"]
    assert r["bailian"] == {"provenance": "standin", "origin": None, "file": "qwen_traceB_blksz_16.jsonl",
                            "path": None, "reason": "mode standin requested"}
    assert r["azure"]["origin"] == "official" and r["mooncake"]["origin"] == "official"
    # standin mode for a source without a stand-in is refused (it would never use the real file)
    with pytest.raises(ParameterError, match="sources.azure.*no stand-in"):
        P_for(shared_traces, azure={"mode": "standin", **conv})
    # real mode with the file absent is an error naming the file
    with pytest.raises(DataError, match="BurstGPT_without_fails_2.csv.*mode is real"):
        resolve(P_for(shared_traces, burstgpt={"mode": "real", **missing}), "burstgpt")
    # no stand-in defined for the source -> skipped (provenance None), not an error
    P = P_for(tmp_path / "nowhere", azure={"mode": "auto", **conv})
    assert P.standins.of("azure") is None          # Azure has no stand-in
    info = resolve(P, "azure")
    assert info["provenance"] is None and "no stand-in" in info["reason"]


def test_corrupt_copy_is_an_error_even_in_auto_mode(P_for, shared_traces, tmp_path):
    mirror = tmp_path / "m"
    (mirror / "azure2023").mkdir(parents=True)
    (mirror / "azure2023" / CONV).write_bytes((shared_traces / "azure2023" / CONV).read_bytes()[:-1] + b"9")
    with pytest.raises(DataError, match="SHA-256 mismatch"):
        P = P_for(mirror, azure={"mode": "auto", "file": CONV})
        registry.resolve_sources(P.paths, P.sources, P.standins)


def test_recorded_row_count_is_enforced(P_for, shared_traces, monkeypatch):
    spec = registry.OFFICIAL_FILES[CONV]
    monkeypatch.setitem(registry.OFFICIAL_FILES, CONV, replace(spec, rows=spec.rows + 1))
    with pytest.raises(DataError, match="19,366 data rows, but the official"):
        P = P_for(shared_traces, azure={"mode": "real", "file": CONV})
        traces.ingest_source(P.paths, P.sources, P.standins, "azure", write=False)
