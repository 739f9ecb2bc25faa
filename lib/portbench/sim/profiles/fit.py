"""Fitting a profile to measured iterations (e.g. a real engine's) and saving/loading profiles as JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from ...core.config import project_root
from ...core.errors import DataError, ParameterError, check_choice
from .calibration import PROFILES, _errors
from .costmodel import FORMAT, FORMAT_VERSION, Profile


def get_profile(name_or_path: str | Path | Profile) -> Profile:
    """A registered profile by name, or one saved by :func:`save_profile` (a path to its JSON)."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    key = str(name_or_path)
    if key in PROFILES:
        return PROFILES[key]
    path = Path(key)
    if not path.is_file() and not path.is_absolute():
        if (project_root() / path).is_file():
            path = project_root() / path
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise ParameterError("simulation.profile", key, "an existing profile JSON file or one of "
                                 + ", ".join(PROFILES))
        return load_profile(path)
    raise ParameterError("simulation.profile", key,
                         "one of " + ", ".join(PROFILES) + " (or a path to a profile JSON)")


FIT_COLUMNS = ("prefill_tokens", "decode_seqs", "context_tokens", "iteration_s")


FLOOR_MODES = ("auto", "base", "fit", "none")


# Knee candidates tried when the floor is fitted: a geometric grid of this many values between the
# rows' second-smallest and second-largest token counts, plus those token counts when there are at
# most this many of them.
FLOOR_KNEE_GRID = 200


def _nnls(a: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of ``a·coef ≈ y`` with row weights ``w``: (coef, weighted SSE)."""
    from scipy.optimize import nnls   # scipy only where a profile is fitted (not in every campaign worker)

    coef, _ = nnls(a * w[:, None], y * w)
    return coef, float(np.sum(((a @ coef - y) * w) ** 2))


def _knee_candidates(tokens: np.ndarray) -> np.ndarray:
    """Knees at which a floor is estimable from rows with these token counts N = P + B: at least two
    distinct N strictly below the knee (where the floor term is non-zero and not constant) and at
    least two at or above it (where it is 0) — otherwise the floor column is a combination of the
    intercept and the token columns, or zero. Empty when there are fewer than 4 distinct N."""
    u = np.unique(tokens)
    if len(u) < 4:
        return np.empty(0)
    lo, hi = u[1], u[-2]
    parts = [u[2:-1]] if len(u) <= FLOOR_KNEE_GRID + 3 else []
    if hi > max(lo, 1.0):
        parts.append(np.geomspace(max(lo, 1.0), hi, FLOOR_KNEE_GRID))
    cand = np.unique(np.concatenate(parts)) if parts else np.empty(0)
    return cand[(cand > lo) & (cand <= hi)]


def _bic(sse: float, n: int, k: int) -> float:
    """Bayesian information criterion of a least-squares fit with k parameters (lower is better)."""
    return n * math.log(max(sse, 1e-300) / n) + k * math.log(n)


def fit_profile(rows: pl.DataFrame, base: Profile | str, name: str, *, relative: bool = False,
                floor: str = "auto") -> Profile:
    """Fit a profile's iteration-time coefficients to measured iterations.

    ``rows``: one row per iteration with ``prefill_tokens, decode_seqs, context_tokens,
    iteration_s``. ``relative=True`` weights rows by 1/iteration_s (minimises relative error).
    Memory fields (KV blocks, block size, max_num_seqs, max_batched_tokens) come from ``base``.

    The linear coefficients (c0, c_prefill, c_decode, c_kv) >= 0 are fitted by non-negative least
    squares (scipy ``nnls``). The floor term ``floor_s·max(0, 1 − N/floor_tokens)`` (N =
    prefill_tokens + decode_seqs) is linear in ``floor_s`` once the knee ``floor_tokens`` is fixed,
    which gives three ways to treat it:

    * ``"base"``: floor_s and floor_tokens held at ``base``'s values; the floor term is subtracted
      from iteration_s and the four linear coefficients are fitted;
    * ``"fit"``: for each candidate knee (:func:`_knee_candidates`: a geometric grid between the
      rows' token counts, and the counts themselves; only knees with >= 2 distinct N on each side,
      where the floor is estimable) the four coefficients and floor_s are fitted by NNLS; the knee
      with the smallest residual wins. DataError when the rows have fewer than 4 distinct N.
      Near the ends of the data a hinge is almost collinear with c0 and the token slopes, so with
      noisy data this can return a floor the data does not need — use ``"auto"`` unless the floor
      is known to be there;
    * ``"none"``: floor_s = 0 (the strictly linear model);
    * ``"auto"`` (default): "fit the floor if the data identifies it, else hold the base floor":
      the candidates ``"base"`` (4 parameters), ``"none"`` (4) and, when estimable, ``"fit"``
      (6: the four, floor_s and the knee) are compared by BIC, n·ln(SSE/n) + k·ln(n), ties going
      to ``"base"``. A fitted floor must thus cut the residual by a factor exp(2·ln(n)/n) (3 % at
      n = 400 rows) to be chosen; data that cannot tell the floor apart from c0 (e.g. only small N)
      keeps the base's floor; data covering both sides of the base's knee without a floor gets
      none.

    ``provenance`` records the mode used, each candidate's BIC and the fit errors.
    """
    check_choice("floor", floor, FLOOR_MODES)
    base = get_profile(base)
    missing = [c for c in FIT_COLUMNS if c not in rows.columns]
    if missing:
        raise DataError("fit_profile rows", f"missing columns {missing}; expected {list(FIT_COLUMNS)}")
    x = rows.select(FIT_COLUMNS[:3]).to_numpy().astype(float)
    y = rows["iteration_s"].to_numpy().astype(float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise DataError("fit_profile rows", "non-finite values or iteration_s <= 0")
    tokens = x[:, 0] + x[:, 1]
    n = len(y)
    knees = _knee_candidates(tokens) if floor in ("auto", "fit") else np.empty(0)
    if floor == "fit" and not len(knees):
        raise DataError("fit_profile rows", f"{len(np.unique(tokens))} distinct token counts (prefill_tokens + "
                        "decode_seqs); fitting the floor needs at least 4 (use floor='base' or 'none')")
    if n < 4:
        raise DataError("fit_profile rows", f"{n} rows; need at least 4 to fit 4 coefficients")
    a = np.column_stack([np.ones(n), x])
    w = 1.0 / y if relative else np.ones_like(y)
    # candidate -> (c0, c_p, c_d, c_kv), floor_s, floor_tokens, weighted SSE, parameters
    cands: dict[str, tuple] = {}
    if floor in ("auto", "base"):
        coef, sse = _nnls(a, y - base.floor_time(tokens), w)
        cands["base"] = (coef, base.floor_s, base.floor_tokens, sse, 4)
    if floor in ("auto", "none"):
        coef, sse = _nnls(a, y, w)
        cands["none"] = (coef, 0.0, 0.0, sse, 4)
    if len(knees) and n >= 6:
        best = None
        for knee in knees:
            coef5, sse = _nnls(np.column_stack([a, np.maximum(0.0, 1.0 - tokens / knee)]), y, w)
            if best is None or sse < best[-2]:
                best = (coef5[:4], float(coef5[4]), float(knee) if coef5[4] > 0 else 0.0, sse, 6)
        cands["fit"] = best
    if floor == "fit" and "fit" not in cands:
        raise DataError("fit_profile rows", f"{n} rows; fitting the floor needs at least 6")
    bic = {m: _bic(c[3], n, c[4]) for m, c in cands.items()}
    mode = floor if floor != "auto" else min(bic, key=lambda m: (bic[m], ("base", "none", "fit").index(m)))
    coef, floor_s, floor_tokens, _, _ = cands[mode]
    fitted = dataclasses.replace(
        base, name=name, c0_s=float(coef[0]), c_prefill_s=float(coef[1]), c_decode_s=float(coef[2]),
        c_kv_s=float(coef[3]), floor_s=float(floor_s), floor_tokens=float(floor_tokens),
        notes=f"fitted to {n} measured iterations; memory fields of {base.name}", provenance={})
    pred = fitted.iteration_time(x[:, 0], x[:, 1], x[:, 2])
    prov = {"fitted_from_rows": n, "base": base.name, "method": "scipy.optimize.nnls"
            + (" (relative weights)" if relative else ""),
            "floor_requested": floor, "floor_mode": mode,
            "floor": {"base": f"floor_s, floor_tokens held at {base.name}'s values",
                      "fit": f"floor_s by NNLS at the best of {len(knees)} candidate knees",
                      "none": "no floor (strictly linear)"}[mode],
            "floor_bic": bic, "distinct_token_counts": int(len(np.unique(tokens))),
            **_errors(pred, y)}
    return dataclasses.replace(fitted, provenance=prov)


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` as JSON (format version :data:`FORMAT_VERSION`: name, fields, notes,
    provenance)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1, default=_json_default) + "\n")
    return path


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by :func:`save_profile`; DataError names what is wrong.

    Files of format version 1 (before the floor term) have no ``floor_s``/``floor_tokens``: they
    load with floor_s = 0, i.e. the strictly linear model their coefficients were fitted for.
    Files before version 3 have no ``c_attn_s``, ``max_model_len`` or swap fields: no prefill
    attention term, no context limit, no swap.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(path, f"not a readable profile JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "fields" not in data:
        raise DataError(path, f"not a {FORMAT} file (expected keys format, name, fields)")
    version = data.get("version", 1)
    if isinstance(version, bool) or version not in range(1, FORMAT_VERSION + 1):
        raise DataError(path, f"format version {version!r}; this portbench reads versions 1 to {FORMAT_VERSION}")
    known = {f.name for f in dataclasses.fields(Profile)} - {"name", "notes", "provenance"}
    fields = dict(data["fields"])
    unknown, missing = set(fields) - known, {"kv_capacity_blocks", "c0_s", "c_prefill_s", "c_decode_s",
                                             "c_kv_s", "gpu", "model"} - set(fields)
    if unknown or missing:
        raise DataError(path, f"unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
    for c in ("c0_s", "c_prefill_s", "c_decode_s", "c_kv_s", "floor_s", "floor_tokens", "c_attn_s", "pcie_gb_s"):
        v = fields.get(c, 0.0)        # fields absent in older files: no floor / attention term / swap
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise DataError(path, f"{c} = {v!r}; expected a finite number >= 0", column=c)
        fields[c] = float(v)
    if fields["floor_s"] > 0 and fields["floor_tokens"] <= 0:
        raise DataError(path, f"floor_tokens = {fields['floor_tokens']!r} with floor_s > 0; expected the "
                        "knee (> 0 tokens)", column="floor_tokens")
    for c in ("kv_capacity_blocks", "block_size", "max_num_seqs", "max_batched_tokens"):
        v = fields.get(c, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise DataError(path, f"{c} = {v!r}; expected a positive integer", column=c)
    for c in ("max_model_len", "kv_bytes_per_token", "host_kv_blocks"):   # version 3; 0 = none
        v = fields.get(c, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise DataError(path, f"{c} = {v!r}; expected an integer >= 0 (0 = none)", column=c)
    return Profile(name=str(data.get("name", path.stem)), notes=str(data.get("notes", "")),
                   provenance=dict(data.get("provenance") or {}), **fields)
