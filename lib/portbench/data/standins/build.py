"""Building stand-in windows for the manifest, and rebuilding a frozen one from its generator record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import polars as pl

from .. import synth
from ...core.errors import DataError, IntegrityError, ParameterError, check_choice
from ..registry import Store
from ..window_table import window_sha256
from .bailian import _bailian_params, _bailian_start, _bailian_window, load_servegen, servegen_folder
from .burstgpt import _burstgpt_params, _burstgpt_pool, _burstgpt_window, burstgpt_evidence
from .common import (_CACHE, BAILIAN_GENERATOR, BURSTGPT_GENERATOR, STANDIN_SOURCES, StandinInputs, mirror_of,
                     verify_evidence, window_seed)


def build_windows(inp: StandinInputs, source: str, n_windows: int, size: int) -> list[tuple[dict, pl.DataFrame]]:
    """``n_windows`` stand-in windows of ``size`` requests: ``[(meta, df)]`` (see the module docstring)."""
    check_choice("source", source, STANDIN_SOURCES)
    for name, v in (("n_windows", n_windows), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ParameterError(name, v, "a positive integer")
    out = []
    if source == "burstgpt":
        ev = burstgpt_evidence(inp)
        params = _burstgpt_params(inp, size)
        for k in range(n_windows):
            seed = window_seed(inp, source, k)
            df = _burstgpt_window(ev.pool, params, seed)
            out.append((_meta(BURSTGPT_GENERATOR, params, seed, t_start=0.0,
                              file=_common_folder(params["slices"]),
                              extra={"time_axis": "none: stationary renewal process, t_start is 0"}), df))
        return out
    data = load_servegen(servegen_folder(inp))
    for k in range(n_windows):
        seed = window_seed(inp, source, k)
        params = _bailian_params(inp, data, size, _bailian_start(data, seed, k, n_windows), k, n_windows)
        df, info = _bailian_window(data, params, seed)
        out.append((_meta(BAILIAN_GENERATOR, params, seed, t_start=info["t_first_s"],
                          file=params["servegen_dir"].rstrip("/") + "/",
                          extra={"time_axis": "seconds from the start of the 14-day ServeGen trace",
                                 "active_clients_at_start": info["active_clients_at_start"],
                                 "tenants": info["tenants"], "segments_600s": info["segments"]}), df))
    return out


def _common_folder(paths: Sequence[str]) -> str:
    parents = {Path(p).parent.as_posix() for p in paths}
    return (parents.pop() + "/") if len(parents) == 1 else ", ".join(paths)


def _meta(name: str, params: Mapping, seed: int, *, t_start: float, file: str, extra: Mapping) -> dict:
    return {"generator": synth.generator_record(name, params, seed), "t_start": float(t_start), "file": file,
            "synthetic": True, "evidence_sha256": dict(params["evidence"]), "row_start": None, "row_end": None,
            **extra}


def regenerate(window_entry: Mapping, st: Store) -> pl.DataFrame:
    """Rebuild a frozen stand-in window from its ``generator`` record and the evidence files.

    The evidence checksums are verified first and, when the entry has a ``sha256``, so is the
    rebuilt table (IntegrityError on any mismatch). ``st`` locates the evidence (the data mirror).
    """
    gen = window_entry.get("generator")
    if not isinstance(gen, Mapping) or not {"name", "params", "seed"} <= set(gen):
        raise DataError(window_entry.get("id", "window"), "stand-in entry has no generator {name, params, seed}")
    name, params, seed = gen["name"], gen["params"], int(gen["seed"])
    root = mirror_of(st)
    verify_evidence(st, params["evidence"])
    if name == BURSTGPT_GENERATOR:
        key = ("pool", str(root), tuple(params["slices"]), tuple(sorted(params["evidence"].items())))
        if key not in _CACHE:  # keyed by the verified checksums, so a cached pool is the evidence's
            _CACHE[key] = _burstgpt_pool(root, params["slices"])[0]
        pool = _CACHE[key]
        if pool.height != params["pairs"]["n"]:
            raise IntegrityError(f"BurstGPT stand-in: {pool.height} valid pairs in the slices, "
                                 f"the generator recorded {params['pairs']['n']}")
        df = _burstgpt_window(pool, params, seed)
    elif name == BAILIAN_GENERATOR:
        data = load_servegen(root / params["servegen_dir"])
        if list(data.clients) != [int(c) for c in params["clients"]]:
            raise IntegrityError(f"Bailian stand-in: ServeGen clients {list(data.clients)} differ from the "
                                 f"recorded {params['clients']}")
        df, _ = _bailian_window(data, params, seed)
    else:
        raise DataError(window_entry.get("id", "window"), f"unknown stand-in generator {name!r}")
    want = window_entry.get("sha256")
    if want:
        got = window_sha256(df)
        if got != want:
            raise IntegrityError(f"stand-in window {window_entry.get('id', '?')}: regenerated sha256 {got} differs "
                                 f"from the frozen {want} (generator code or numpy changed?)")
    return df
