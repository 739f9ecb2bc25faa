"""What every stand-in builder shares: its inputs, the evidence checksums, per-window seeds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import synth
from ...core.config import PathsConfig, SourceConfig, StandinsConfig, WindowsConfig
from ...core.provenance import label
from ...core.errors import DataError, IntegrityError, ParameterError
from ..registry import Store, store

BURSTGPT_GENERATOR = "burstgpt-standin/gamma-renewal+resampled-pairs/v1"
BAILIAN_GENERATOR = "bailian-standin/servegen-superposed-renewal/v1"
STANDIN_SOURCES = ("burstgpt", "bailian")
GUANXI_TABLE = "guanxi_table_00_data_quality.csv"
FNSTGGL_ROLLUP = "fnstggl_burstgpt1_first60k_statistical_rollups.json"
PERCENTILES = (50, 90, 95, 99)

# Parsed evidence and built windows, once per process (keys include the evidence checksums or the
# frozen inputs, so a cached value always belongs to the data it was built from).
_CACHE: dict[Any, Any] = {}


@dataclass(frozen=True)
class StandinInputs:
    """What the stand-in builders read: the evidence ``store`` (data mirror + checksum cache), the
    ``standins`` section, the window size and count, and the official BurstGPT file whose full-file
    rate the BurstGPT stand-in uses (``sources.burstgpt.file``)."""

    store: Store
    standins: StandinsConfig
    window_size: int
    per_source: int
    burstgpt_file: str | None = None
    names: tuple[tuple[str, str], ...] = ()   # (source, display name): ``cfg.display_names`` (hashable)

    @property
    def mirror(self) -> Path:
        return mirror_of(self.store)

    def label(self, source: str) -> str:
        """The stand-in label of ``source`` with its display name, e.g. ``"BurstGPT (stand-in)"``."""
        return label(source, "standin", dict(self.names))


def inputs(paths: PathsConfig, sources: Mapping[str, SourceConfig], standins: StandinsConfig,
           windows: WindowsConfig) -> StandinInputs:
    """The :class:`StandinInputs` of a parameter set's ``paths``, ``sources``, ``standins`` and ``windows``."""
    bg = sources.get("burstgpt")
    return StandinInputs(store=store(paths), standins=standins, window_size=windows.size,
                         per_source=windows.per_source, burstgpt_file=bg.file if bg is not None else None,
                         names=tuple((s, c.display) for s, c in sources.items()))


def mirror_of(st: Store) -> Path:
    """The data mirror holding the evidence; DataError when there is none."""
    root = st.mirror
    if root is None or not Path(root).is_dir():
        raise DataError(str(root or "data mirror"), "the data mirror with the stand-in evidence was not found "
                        "(set paths.mirror or $PORTBENCH_DATA_MIRROR)")
    return Path(root)


def _evidence_digest(st: Store, rel: str) -> str:
    """SHA-256 of one evidence file, or (``rel`` ending in ``/``) of a folder (``Store.tree_sha256``)."""
    p = mirror_of(st) / rel.rstrip("/")
    if rel.endswith("/"):
        if not p.is_dir():
            raise DataError(p, "evidence folder not found")
        return st.tree_sha256(p)
    if not p.is_file():
        raise DataError(p, "evidence file not found")
    return st.sha256(p)


def _evidence_names(inp: StandinInputs, source: str) -> list[str]:
    S = inp.standins
    if source == "burstgpt" and S.burstgpt is not None:
        b = S.burstgpt
        return [*b.slices, f"{b.aggregates.rstrip('/')}/{GUANXI_TABLE}"]
    if source == "bailian" and S.bailian is not None:
        return [S.bailian.servegen_dir.rstrip("/") + "/"]
    raise ParameterError("source", source, "a source with a stand-in: " + ", ".join(STANDIN_SOURCES))


def evidence_sha256(inp: StandinInputs, source: str) -> dict[str, str]:
    """``{relative path: sha256}`` of a stand-in's evidence (a folder ends with ``/``)."""
    return {rel: _evidence_digest(inp.store, rel) for rel in _evidence_names(inp, source)}


def verify_evidence(st: Store, recorded: Mapping[str, str]) -> None:
    """IntegrityError naming the first evidence file whose SHA-256 differs from ``recorded``."""
    root = mirror_of(st)
    for rel, want in recorded.items():
        try:
            got = _evidence_digest(st, rel)
        except DataError as e:
            raise IntegrityError(f"stand-in evidence {rel}: {e.problem} under {root}") from None
        if got != want:
            raise IntegrityError(f"stand-in evidence {rel} under {root}: sha256 {got}, but the window "
                                 f"was generated from {want}")


def window_seed(inp: StandinInputs, source: str, index: int) -> int:
    """Per-window seed: ``SeedSequence([standins.seed, key(source), index])`` (53 bits)."""
    return synth.derive_seed(inp.standins.seed, source, int(index))
