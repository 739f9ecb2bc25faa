"""The official trace files: what they are, where they come from, and how to get a verified copy.

Every file named in ``../shared/traces/PROVENANCE.md`` is listed in :data:`OFFICIAL_FILES` with its
source, adapter format (see :mod:`portbench.data.traces`), size, SHA-256 and data-row count where that
document records them (``None`` where it does not), its official download locations, and its path
inside the data mirror.

:func:`locate` finds a file in this order and says everywhere it looked when it cannot:

1. the data mirror (:func:`resolve_mirror`): ``<mirror>/<mirror_path>``, ``<mirror>/<name>``,
   ``<mirror>/<source>/<name>``;
2. an earlier download in ``{paths.data_dir}/raw/<name>``;
3. a download with pooch from each official URL in turn, verified against the recorded SHA-256
   (skipped when the environment variable ``PORTBENCH_OFFLINE`` is non-empty, and for a source in mode
   ``auto`` when a data mirror is configured: the mirror is then where the files come from, and a file
   it lacks means the stand-in, without network traffic on every run).

A copy whose size or SHA-256 differs from the record is a :class:`~portbench.core.errors.DataError`,
never a silent fallback. Hashes are cached in ``{paths.data_dir}/raw/.verified.json`` keyed by
(path, size, mtime), so a large file is hashed once, not on every load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core import io
from ..core.config import PathsConfig, SourceConfig, StandinsConfig
from ..core.errors import DataError

MIRROR_ENV = "PORTBENCH_DATA_MIRROR"
OFFLINE_ENV = "PORTBENCH_OFFLINE"
VERIFIED_CACHE = ".verified.json"
DOWNLOAD_TIMEOUT_S = (10, 60)  # (connect, read) timeouts of one HTTP request (pooch -> requests)


@dataclass(frozen=True)
class OfficialFile:
    """One official trace file.

    ``rows`` counts data rows (CSV: lines after the header; JSONL: records). ``urls`` are tried in
    order. ``mirror_path`` is the file's path relative to the data mirror. ``fmt`` is its official
    adapter's format, or a generic container (``jsonl``) for a file read through its source's
    column mapping (Mooncake).
    """

    name: str
    source: str
    fmt: str
    size: int | None
    sha256: str | None
    rows: int | None
    urls: tuple[str, ...]
    mirror_path: str
    note: str = ""
    block_size: int | None = None   # tokens per prompt block hash, for files that carry block hashes


class MissingFileError(DataError):
    """The file is in none of the places :func:`locate` looks (as opposed to a corrupt copy)."""


# --- Download locations (checked with the project's code-search tools, not live) -----------------
# Azure 2023: raw GitHub URLs of Azure/AzurePublicDataset data/, pinned to the commit PROVENANCE.md
# names, then master. Sure: the files are plain git blobs there and the SHA-256 is recorded.
_AZURE_COMMIT = "b469a113cedca53ddc3bdea71a143dc4b7d8700c"
_AZURE_RAW = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/{ref}/data/{name}"
# Azure 2024 week files: the blob URLs listed in the repo's AzureLLMInferenceDataset2024Links.txt
# (and used by its analysis notebook). Fairly sure. The repo has a workflow that migrates blobs to
# GitHub release assets (tag "dataset-llm-2024", asset = blob path); a third-party script downloads
# from there, so it is the fallback. No checksum is recorded: a third-party record gives
# a0cc9b96...3941 for the conv week file, not adopted because it is not verified here.
_AZURE_BLOB = "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/{name}"
_AZURE_RELEASE = "https://github.com/Azure/AzurePublicDataset/releases/download/dataset-llm-2024/{name}"
# BurstGPT: release assets of HPMLL/BurstGPT. v2.0 holds parts 1-3 with and without failures
# (several independent scripts download from it; the BurstGPT_1.csv size there equals the one
# recorded); v1.1 holds parts 1-2. Sure for the v2.0 names, fairly sure for v1.1. The repo's data/
# copies are Git LFS objects. For BurstGPT_3.csv a third-party record gives 231,682,327 bytes,
# 5,344,021 rows, 387,963 failures, sha256 2299986a...3b8f: not adopted (not verified here).
_BURST_RELEASE = "https://github.com/HPMLL/BurstGPT/releases/download/{tag}/{name}"
# Qwen/Bailian: Git LFS objects in GitHub repo alibaba-edu/qwen-bailian-usagetraces-anon, branch
# main (its LFS pointers carry the recorded sizes/SHA-256 for qwen_coder and qwen_thinking).
# media.githubusercontent.com serves LFS content; github.com/.../raw/ redirects there. Fairly sure;
# no Hugging Face copy of this dataset was found.
_QWEN_LFS = "https://media.githubusercontent.com/media/alibaba-edu/qwen-bailian-usagetraces-anon/main/{name}"
_QWEN_RAW = "https://github.com/alibaba-edu/qwen-bailian-usagetraces-anon/raw/main/{name}"
# Mooncake: a plain git blob of kvcache-ai/Mooncake (FAST25-release/traces/), commit named in
# PROVENANCE.md (abbreviated there), then main. Sure of the path; the SHA-256 guards the content.
_MOONCAKE_RAW = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/{ref}/FAST25-release/traces/{name}"


def _azure2023(name: str, size: int, sha: str, rows: int) -> OfficialFile:
    urls = tuple(_AZURE_RAW.format(ref=ref, name=name) for ref in (_AZURE_COMMIT, "master"))
    return OfficialFile(name, "azure", "azure2023", size, sha, rows, urls, f"azure2023/{name}",
                        "Splitwise (ISCA 2024) trace, 2023-11-16, CC-BY")


def _azure2024(name: str, note: str) -> OfficialFile:
    urls = (_AZURE_BLOB.format(name=name), _AZURE_RELEASE.format(name=name))
    return OfficialFile(name, "azure", "azure2024", None, None, None, urls, f"azure2024/{name}", note)


def _burst(name: str, size: int | None, sha: str | None, rows: int | None, note: str,
           tags: tuple[str, ...] = ("v2.0", "v1.1")) -> OfficialFile:
    urls = tuple(_BURST_RELEASE.format(tag=t, name=name) for t in tags)
    return OfficialFile(name, "burstgpt", "burstgpt", size, sha, rows, urls, f"burstgpt/{name}", note)


def _qwen(name: str, size: int, sha: str, rows: int | None, note: str) -> OfficialFile:
    urls = (_QWEN_LFS.format(name=name), _QWEN_RAW.format(name=name))
    return OfficialFile(name, "bailian", "qwen_jsonl", size, sha, rows, urls, f"qwen_bailian/{name}", note,
                        block_size=16)


_FILES: tuple[OfficialFile, ...] = (
    _azure2023("AzureLLMInferenceTrace_conv.csv", 719_188,
               "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 19_366),
    _azure2023("AzureLLMInferenceTrace_code.csv", 320_117,
               "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 8_819),
    # Azure's own analysis notebook reads 27,303,999 / 16,803,695 rows; PROVENANCE.md records
    # only "about 27.3 M / 16.8 M", so no exact count is enforced.
    _azure2024("AzureLLMInferenceTrace_conv_1week.csv", "DynamoLLM trace, 2024-05-12..18, ~27.3 M rows"),
    _azure2024("AzureLLMInferenceTrace_code_1week.csv", "DynamoLLM trace, 2024-05-10..16, ~16.8 M rows"),
    _burst("BurstGPT_1.csv", 52_283_111,
           "4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122", 1_429_737,
           "first 2 months, with failures (25,443 rows with 0 response tokens)"),
    _burst("BurstGPT_without_fails_1.csv", 51_429_517,
           "a4d068a7113ec0290e74063a1b3447dc6001a30e4298eb313581b71006dda1f4", 1_404_294,
           "first 2 months, failures removed"),
    _burst("BurstGPT_2.csv", 144_819_209,
           "44bf5942b03fca42c01a226a545ad3a750ec62688faecd67b6831c56a8928bf7", None,
           "second 2 months, with failures (about 3,858.4 k rows)"),
    _burst("BurstGPT_without_fails_2.csv", 142_376_815,
           "56193aa9b2bb26128ded43d2d29a960df6bf5af062bcfc9b005f3fcaa4e6e501", 3_784_213,
           "second 2 months, failures removed"),
    _burst("BurstGPT_3.csv", None, None, None,
           "release v2.0, 110 days, 8 columns (Session ID, Elapsed time), about 5,344.0 k rows",
           tags=("v2.0",)),
    _burst("BurstGPT_without_fails_3.csv", None, None, 4_956_058,
           "release v2.0, 110 days, 8 columns, failures removed", tags=("v2.0",)),
    _qwen("qwen_traceA_blksz_16.jsonl", 56_354_493,
          "07cedc9ed8aff301994ac68ed4aede8123b7603673575eeba9dd677de663db17", None,
          "to-C chat, 2 hours, about 43 k requests"),
    _qwen("qwen_traceB_blksz_16.jsonl", 96_209_982,
          "68e3f98e2d601d60d0abf4b89bc8a3654372abab7b1cde6373a13d0054379d59", None,
          "to-B API calls, 2024-12, 2 hours"),
    _qwen("qwen_thinking_blksz_16.jsonl", 27_901_454,
          "41ac36d9d1b54d084eeb6b05e9d142ba9d02f8bf79cfc9fff418d8ab7cdee906", None,
          "thinking model, 2 hours"),
    _qwen("qwen_coder_blksz_16.jsonl", 132_054_902,
          "3d74974cebb7bccb69b1ca6ea210a44d9a3033443c0271ed015327284dea1aff", 43_011,
          "coder model, 2 hours"),
)
_FILES += (
    OfficialFile("conversation_trace.jsonl", "mooncake", "jsonl", 3_029_533,
                 "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 12_031,
                 tuple(_MOONCAKE_RAW.format(ref=ref, name="conversation_trace.jsonl") for ref in ("3b5a59413", "main")),
                 "mooncake/conversation_trace.jsonl",
                 "Mooncake (FAST 2025) Kimi conversation trace, one hour, ms timestamps, 512-token block "
                 "hashes; Apache-2.0", block_size=512),
)
OFFICIAL_FILES: dict[str, OfficialFile] = {f.name: f for f in _FILES}
# Where a real source's file comes from: an official file (verified against its record) or a user's file.
OFFICIAL, USER = "official", "user"

# Real slices in the mirror (not official files; read by the stand-in builder through traces.read_file).
SLICES: dict[str, str] = {
    "burstgpt/BurstGPT_1_first400.csv": "burstgpt",
    "burstgpt/BurstGPT_3_first400.csv": "burstgpt",
    "qwen_bailian/qwen_traceA_light_stratified_13windows.csv": "qwen_csv",
}


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class Store:
    """Where trace files are found and how they are verified: the project ``root``, the data
    ``mirror`` (None: no mirror) and ``raw_dir`` (``{paths.data_dir}/raw``: downloads and the
    checksum cache ``.verified.json``)."""

    root: Path
    mirror: Path | None
    raw_dir: Path

    @property
    def hash_cache(self) -> Path:
        return self.raw_dir / VERIFIED_CACHE

    def sha256(self, path: str | os.PathLike) -> str:
        """:func:`portbench.core.io.sha256_of` with this store's on-disk cache."""
        return io.sha256_of(path, self.hash_cache)

    def tree_sha256(self, folder: str | os.PathLike) -> str:
        """:func:`portbench.core.io.tree_sha256` (how a folder of evidence is recorded in the manifest)."""
        return io.tree_sha256(folder, self.hash_cache)


def resolve_mirror(configured: Path | None, root: Path) -> Path | None:
    """The data mirror: ``configured`` (``paths.mirror``), else ``$PORTBENCH_DATA_MIRROR``, else
    ``<root>/../shared/traces`` when it exists."""
    if configured:
        return Path(configured)
    env = os.environ.get(MIRROR_ENV, "").strip()
    if env:
        return Path(env)
    default = (Path(root) / ".." / "shared" / "traces").resolve()
    return default if default.is_dir() else None


def store(paths: PathsConfig) -> Store:
    """The :class:`Store` of a parameter set's ``paths`` section."""
    return Store(root=paths.root, mirror=resolve_mirror(paths.mirror, paths.root),
                 raw_dir=Path(paths.data_dir) / "raw")


def verify(path: str | os.PathLike, spec: OfficialFile, st: Store | None = None) -> str:
    """Check ``path`` against the recorded size and SHA-256; returns its SHA-256 (DataError on mismatch)."""
    path = Path(path)
    size = path.stat().st_size
    if spec.size is not None and size != spec.size:
        raise DataError(path, f"size {size:,} bytes, but the official {spec.name} has {spec.size:,} bytes "
                              "(a truncated or different copy)")
    digest = st.sha256(path) if st is not None else io.sha256_of(path)
    if spec.sha256 is not None and digest != spec.sha256:
        raise DataError(path, f"SHA-256 mismatch for {spec.name}: expected {spec.sha256}, got {digest}")
    return digest


# --------------------------------------------------------------------------- locating


def mirror_candidates(name: str, st: Store) -> list[Path]:
    """Where :func:`locate` looks for ``name`` inside the mirror, in order."""
    mirror = st.mirror
    if mirror is None:
        return []
    spec = OFFICIAL_FILES.get(name)
    rel = [spec.mirror_path] if spec else []
    rel += [name] + ([f"{spec.source}/{name}"] if spec else [])
    out: list[Path] = []
    for r in rel:
        p = mirror / r
        if p not in out:
            out.append(p)
    return out


# Downloads that failed in this process, {(name, raw dir): reasons}: a blocked network costs its
# timeouts once per process, not on every resolve.
_FAILED_DOWNLOADS: dict[tuple[str, str], list[str]] = {}


def _short(e: BaseException) -> str:
    """Exception class and the first line of its message, shortened."""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[:120]}" if text else type(e).__name__


def _download(spec: OfficialFile, st: Store) -> tuple[Path | None, list[str]]:
    """Fetch ``spec`` with pooch into ``{data_dir}/raw``; returns (path or None, failure reasons)."""
    if os.environ.get(OFFLINE_ENV, "").strip():
        return None, [f"not attempted (${OFFLINE_ENV} is set)"]
    target = st.raw_dir
    key = (spec.name, str(target))
    if key in _FAILED_DOWNLOADS:
        return None, _FAILED_DOWNLOADS[key] + ["(not retried in this process)"]
    import pooch

    known = f"sha256:{spec.sha256}" if spec.sha256 else None
    tried = []
    for url in spec.urls:
        try:
            downloader = pooch.HTTPDownloader(progressbar=True, timeout=DOWNLOAD_TIMEOUT_S)
            return Path(pooch.retrieve(url, known_hash=known, fname=spec.name, path=target,
                                       downloader=downloader)), []
        except Exception as e:  # network, HTTP and checksum errors all mean "try the next URL"
            tried.append(f"{url} -> {_short(e)}")
    _FAILED_DOWNLOADS[key] = tried
    return None, tried


def locate(name: str, st: Store, *, download: bool = True) -> Path:
    """A verified local copy of official file ``name`` (mirror, earlier download, or -- with ``download``
    -- a new download).

    A name that is not an official file is looked up as a path, then in the mirror, unverified.
    """
    spec = OFFICIAL_FILES.get(name)
    looked: list[str] = []
    mirror = st.mirror
    if spec is None:
        direct = Path(name)
        for p in ([direct] if direct.is_absolute() else [st.root / direct]) + mirror_candidates(name, st):
            if p.is_file():
                return p
            looked.append(str(p))
        raise MissingFileError(name, "not an official file (see portbench.data.registry.OFFICIAL_FILES) and not "
                                     "found at " + "; ".join(looked or ["(no data mirror configured)"]))
    for p in mirror_candidates(name, st):
        if p.is_file():
            verify(p, spec, st)
            return p
        looked.append(str(p.relative_to(mirror)))
    where = (f"not in the data mirror {mirror} (looked at {', '.join(looked)})" if mirror is not None
             else "no data mirror (set paths.mirror or $PORTBENCH_DATA_MIRROR)")
    cached = st.raw_dir / name
    if cached.is_file():
        verify(cached, spec, st)
        return cached
    if not download:
        raise MissingFileError(name, f"official file not found: {where}; not downloaded before ({cached}); "
                                     "no download attempted" + (" (the data mirror is the source of data files "
                                     "for mode auto; mode real downloads a file the mirror lacks)"
                                     if mirror is not None else ""))
    got, tried = _download(spec, st)
    if got is not None:
        verify(got, spec, st)
        return got
    raise MissingFileError(name, f"official file not found: {where}; not downloaded before ({cached}); "
                                 "download failed: " + "; ".join(tried))


# --------------------------------------------------------------------------- sources


def resolve_source(st: Store, source: SourceConfig, has_standin: bool) -> dict:
    """``{"provenance", "origin", "file", "path", "reason"}`` of one source (see :func:`resolve_sources`)."""
    mode, name = source.mode, source.file
    fallback = ("standin", "using the stand-in") if has_standin else (None, "skipped: no stand-in is defined")
    if mode == "standin":
        reason = "mode standin requested" + ("" if has_standin else "; skipped: no stand-in is defined")
        return {"provenance": fallback[0], "origin": None, "file": name, "path": None, "reason": reason}
    if not name:
        if mode == "real":
            raise DataError(f"sources.{source.name}.file", "mode real needs a file (an official file name or a path)")
        return {"provenance": fallback[0], "origin": None, "file": None, "path": None,
                "reason": f"no file configured; {fallback[1]}"}
    try:
        # auto with a data mirror: a file the mirror lacks is not downloaded (the stand-in is used, with no
        # network traffic on every run); mode real, or no mirror at all, downloads it from the official URLs
        path = locate(name, st, download=mode == "real" or st.mirror is None)
    except MissingFileError as e:
        if name not in OFFICIAL_FILES:      # a file of the user's own: never silently skipped or replaced
            raise DataError(f"sources.{source.name}.file", user_file_missing(name, st)) from None
        if mode == "real":
            raise DataError(e.file, f"sources.{source.name}.mode is real, but the {e.problem}") from None
        return {"provenance": fallback[0], "origin": None, "file": name, "path": None,
                "reason": f"{e.problem} -> {fallback[1]}"}
    if name in OFFICIAL_FILES:
        return {"provenance": "real", "origin": OFFICIAL, "file": name, "path": path,
                "reason": f"official file found at {path} and verified"}
    return {"provenance": "real", "origin": USER, "file": name, "path": path,
            "reason": f"user file found at {path} (not an official file: recorded by its SHA-256, not verified)"}


def user_file_missing(name: str, st: Store) -> str:
    """The message for a trace file of the user's own (not an official file) that is not there."""
    looked = [str(Path(name) if Path(name).is_absolute() else st.root / name)]
    looked += [str(p) for p in mirror_candidates(name, st)][:2]
    return (f"your trace file {name!r} was not found (looked at {'; '.join(looked)}). Give its absolute path, or a "
            "path relative to the parameter file that names it (else to the project root); fix the path or leave "
            "the source out with `sources.<name>: null`")


def hash_block_size(source: SourceConfig) -> int | None:
    """Tokens per prompt-hash block of a source: ``sources.<s>.block_size``, else its official file's."""
    if source.block_size:
        return int(source.block_size)
    spec = OFFICIAL_FILES.get(source.file or "")
    return spec.block_size if spec is not None else None


def resolve_sources(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins: StandinsConfig
                    ) -> dict[str, dict]:
    """Per configured source: provenance ``real`` / ``standin`` / ``None`` (skipped), origin (``official``
    or ``user`` for a real source), file, path, reason.

    Mode ``auto``: real when the official file can be located, else the stand-in; ``standin``:
    always the stand-in; ``real``: DataError when the file is absent. A corrupt copy (size or
    SHA-256 mismatch) is an error in every mode. A source without a stand-in (no ``standins.<source>``
    entry) that would need one is skipped (provenance ``None``).
    """
    st = store(paths)
    return {s: resolve_source(st, spec, standins.of(s) is not None) for s, spec in sources.items()}
