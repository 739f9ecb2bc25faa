"""Hybrid windows between two sources: a window of source A with some properties taken from a window of B.

A window of ``n`` requests is split into four *window properties* that together determine it exactly:

* ``arrival`` — the inter-arrival pattern: arrival times relative to the window's span;
* ``prompt`` — the prompt-length distribution: the window's sorted prompt lengths;
* ``output`` — the output-length distribution: the window's sorted output lengths;
* ``coupling`` — which lengths go together and when: the rank pattern of (prompt, output) in arrival
  order (the prompt/output dependence, and the order in time of long and short requests), with the
  requests' tenant labels (who sent each request belongs to the request, not to a length distribution).

A prompt's block hashes (``block_hashes``, the prefix-sharing structure a trace such as Mooncake records)
and its frozen length predictions (``predicted_output``, ``ltr_score``: made from the request's arrival-time
features, whose main one is the prompt length) travel with its prompt length (:data:`PROMPT_BOUND`): each
hybrid request takes those of the request whose prompt length it takes. So swapping the four window
properties gives B's hashes and predictions as well (B's prefix-cache hits, B's predictor on B's
requests); a hybrid whose prompts come from a source without hashes has none; and swapping only the
output lengths leaves A's predictions beside B's outputs -- A's predictor meeting outputs it did not learn.

A fifth property, ``load``, belongs to the *run*, not to the window: the offered load, i.e. the region's
rho on the sustainable throughput of the hybrid's own requests -- the campaign's load definition (issue #10,
:mod:`portbench.sim.regions`), under which every source in a region is at the same load (its steady-state
utilisation is close to min(rho, 1) whatever its lengths). The attribution runs both sources of a pair in the same
regions, so B's load is A's and swapping ``load`` is the identity (:mod:`portbench.study.attribution.runs`
explains why the achieved utilisation of a finite window is not used instead). :func:`hybrid_window` ignores it.

**Joint (prompt, output) pairs** are not a separate construction: swapping ``prompt``, ``output`` and
``coupling`` together (:data:`JOINT`) gives B's requests -- each with B's prompt and output together, B's
tenants and B's order in time -- on A's arrival times (exactly: ``P_B[rp_B[i]]`` is B's i-th prompt). The
coupling cannot be split from the order in time here, because the rank pattern in arrival order is what
pairs the lengths.

**Construction** (:func:`hybrid_window`, deterministic: no random draw). With ``rp``/``ro`` the
ordinal ranks (stable sort, so ties keep their order) of prompt/output lengths and ``P``/``O`` the
sorted lengths, request ``i`` of the hybrid gets

* prompt ``P_src[rp_cpl[i]]`` and output ``O_src[ro_cpl[i]]``, where ``P_src``/``O_src`` come from B
  when ``prompt``/``output`` is swapped (else A), and the ranks ``rp_cpl``/``ro_cpl`` from B when
  ``coupling`` is swapped (else A) — a quantile map: swapping ``prompt`` alone replaces A's prompt
  lengths by B's at the same ranks, so A's coupling and order in time are kept exactly;
* arrival times ``arr_B * (span_A / span_B)`` when ``arrival`` is swapped (B's pattern at A's
  rate, so A's request count and mean rate are kept), else A's times unchanged;
* tenants of the window whose coupling it takes;
* the block hashes of the request whose prompt length it takes (when that window has hashes).

Swapping nothing returns A's table bit for bit; swapping the four window properties gives B's requests
with B's arrival pattern at A's rate (which a region's rescaling removes: :func:`portbench.sim.regions.rescale`
multiplies every arrival by one factor). A swap whose source is identical to A (B = A, or a property
the two windows share exactly) is the identity, bit for bit (``tests/test_attribution.py``). Both
windows must have the same number of requests (``windows.size`` is one parameter for every source).

Each hybrid is recorded by :func:`hybrid_record` (the two source windows with their SHA-256, the swapped
properties, the construction's name and seed, summary statistics, the hybrid's own SHA-256 over its
canonical bytes, :func:`portbench.data.window_table.window_sha256`). **Frozen** means, as for windows: the
SHA-256 of every hybrid of the default design is committed in ``hybrids.json`` next to the window manifest
(:func:`frozen_path`; ``{hybrid id: sha256}``, the id naming both source windows and the swap), and every
rebuilt hybrid with an id there is verified against it (:func:`verify_frozen`: IntegrityError on any
difference); only an explicit refreeze (``portbench attribute --refreeze``) rewrites it. Hybrids of another
design (other pairs, windows or players) are not in it: they are frozen per run
(``{results_dir}/attribution/hybrids/``, :func:`verify_records`) and counted as such.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ..core import io as fileio
from ..core import outputs
from ..core.errors import DataError, IntegrityError, ParameterError
from .predictors import PREDICTION_COLUMNS
from .window_table import HASH_COLUMN, as_window_table, columns_of, window_sha256, window_stats

PROPERTIES = ("arrival", "prompt", "output", "coupling", "load")
# Per-request columns that belong to the prompt: its block hashes (prefix sharing) and the frozen length
# predictions made from its arrival-time features (the prediction-based policies read them)
PROMPT_BOUND = (HASH_COLUMN, *PREDICTION_COLUMNS)
WINDOW_PROPERTIES = ("arrival", "prompt", "output", "coupling")
RUN_PROPERTIES = ("load",)
JOINT = ("prompt", "output", "coupling")      # B's joint (prompt, output) pairs, with B's order in time and tenants
FROZEN_FILE = "hybrids.json"
FROZEN_VERSION = 1
CONSTRUCTION = ("portbench-hybrid-v2 (quantile map of lengths, rank pattern of coupling, arrivals scaled to A's span, "
                "block hashes with their prompts)")
DESCRIPTIONS = {
    "arrival": "inter-arrival pattern (B's arrival times scaled to A's span: A's rate kept)",
    "prompt": "prompt-length distribution (B's sorted prompt lengths at A's ranks)",
    "output": "output-length distribution (B's sorted output lengths at A's ranks)",
    "coupling": "prompt/output coupling and order in time (B's rank pattern of the lengths, with its tenants)",
    "load": "offered load (the region's rho on the hybrid's own sustainable throughput: A's equals B's in a region, "
            "so this swap is the identity)",
}
JOINT_DESCRIPTION = ("joint (prompt, output) pairs: prompt + output + coupling swapped together = B's requests (each "
                     "prompt with its own output, B's tenants and order in time) on A's arrival times")


def check_properties(props: Iterable[str], param: str = "properties") -> tuple[str, ...]:
    """``props`` as a tuple in :data:`PROPERTIES` order; ParameterError on an unknown or repeated name."""
    props = list(props)
    for p in props:
        if p not in PROPERTIES:
            raise ParameterError(param, p, f"one of {', '.join(PROPERTIES)}")
    if len(set(props)) != len(props):
        raise ParameterError(param, props, "each property at most once")
    return tuple(p for p in PROPERTIES if p in props)


def _ordinal_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks, ties in order of appearance (stable sort): ``np.sort(x)[r] == x`` exactly."""
    order = np.argsort(x, kind="stable")
    r = np.empty(x.size, dtype=np.int64)
    r[order] = np.arange(x.size)
    return r


def hybrid_window(a_df: pl.DataFrame, b_df: pl.DataFrame, swap: Iterable[str], *, a_id: str = "A",
                  b_id: str = "B") -> pl.DataFrame:
    """Window ``a_df`` with the window properties in ``swap`` taken from ``b_df`` (see the module
    docstring); ``load`` in ``swap`` is ignored (a run property). Both are window tables of equal
    length; the result is a window table (checked by :func:`~portbench.data.window_table.as_window_table`)."""
    props = check_properties(swap, "swap")
    a = as_window_table(a_df, a_id)
    b = as_window_table(b_df, b_id)
    if a.height != b.height:
        raise DataError(b_id, f"{b.height} requests, but window {a_id} has {a.height}: a hybrid takes properties "
                        "between windows of the same size (windows.size)")
    if not set(props) & set(WINDOW_PROPERTIES):
        return _with_prompt_bound(a, a_df, None)
    cols = {}
    if "arrival" in props:
        arr_a, arr_b = a["arrival_s"].to_numpy(), b["arrival_s"].to_numpy()
        span_a, span_b = float(arr_a[-1]), float(arr_b[-1])
        if not (span_a > 0 and span_b > 0):
            raise DataError(b_id if span_b <= 0 else a_id, "zero span: an arrival pattern cannot be rescaled",
                            column="arrival_s")
        cols["arrival_s"] = pl.Series("arrival_s", arr_b * (span_a / span_b), dtype=pl.Float64)
    prompt_src = b_df if "prompt" in props else a_df
    rows = None                       # the row of prompt_src whose prompt each hybrid request takes (None: same row)
    if {"prompt", "output", "coupling"} & set(props):
        cpl = b if "coupling" in props else a
        for col, prop in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
            if prop not in props and "coupling" not in props:
                continue                                  # A's column, untouched
            src = b if prop in props else a
            order = np.argsort(src[col].to_numpy(), kind="stable")
            ranks = _ordinal_ranks(cpl[col].to_numpy())
            cols[col] = pl.Series(col, src[col].to_numpy()[order][ranks], dtype=pl.Int64)
            if col == "prompt_tokens":
                rows = order[ranks]
        if "coupling" in props:
            cols["tenant"] = b["tenant"]
    out = a.with_columns(list(cols.values())) if cols else a
    return _with_prompt_bound(out.drop(HASH_COLUMN, strict=False), prompt_src, rows)


def _with_prompt_bound(out: pl.DataFrame, prompt_src: pl.DataFrame, rows) -> pl.DataFrame:
    """``out`` (window columns) with the :data:`PROMPT_BOUND` columns of ``prompt_src`` that it has, row
    ``rows[i]`` for request ``i`` (None: row ``i``): a prompt's block hashes and its frozen length
    predictions go wherever its length goes."""
    out = out.select(list(columns_of(out)))
    extra = [c for c in PROMPT_BOUND if c in prompt_src.columns]
    if extra:
        src = prompt_src.select(extra)
        out = out.with_columns((src if rows is None else src[rows]).get_columns())
    return out


def hybrid_record(a_ref: Mapping, b_ref: Mapping, swap: Sequence[str], df: pl.DataFrame, *, seed: int,
                  hybrid_id: str) -> dict:
    """The definition of one hybrid: id, the source windows ``{id, source, provenance, sha256}``, the
    swapped properties (window and run), the construction and seed, the hybrid's summary statistics and
    its SHA-256 (:func:`~portbench.data.window_table.window_sha256`)."""
    props = check_properties(swap, "swap")
    return {"id": hybrid_id, "a": {k: a_ref[k] for k in ("id", "source", "provenance", "sha256")},
            "b": {k: b_ref[k] for k in ("id", "source", "provenance", "sha256")},
            "swap": list(props), "window_swap": [p for p in props if p in WINDOW_PROPERTIES],
            "construction": CONSTRUCTION, "seed": int(seed), "random_draws": False,
            "n_requests": df.height, "stats": window_stats(df), "sha256": definition_sha256(df)}


def definition_sha256(df: pl.DataFrame) -> str:
    """SHA-256 of a hybrid's window columns (its definition; the predictions it carries are not part of it)."""
    return window_sha256(df.select(list(columns_of(df))))


def verify_records(records: Sequence[Mapping], frozen: Mapping[str, Mapping] | None, where: str) -> None:
    """Compare rebuilt hybrid ``records`` with the ``frozen`` ones (``{id: record}``, None = nothing frozen
    yet): every hybrid present in both must have the same source windows, swap and SHA-256, else an
    :class:`~portbench.core.errors.IntegrityError` naming the hybrid (refreezing needs an explicit flag)."""
    if not frozen:
        return
    for r in records:
        old = frozen.get(r["id"])
        if old is None:
            continue
        for key in ("a", "b", "swap", "sha256"):
            if old.get(key) != r[key]:
                raise IntegrityError(f"{where}: hybrid {r['id']}: {key} is {r[key]!r} but the frozen record has "
                                     f"{old.get(key)!r}; the source windows or the construction changed. Refreeze "
                                     "explicitly: `portbench attribute --refreeze` (or attribute.run(..., refreeze=True))")


# --------------------------------------------------------------------------- the committed SHA-256 of each hybrid

def frozen_path(manifest_path) -> Path:
    """The committed hybrid SHA-256s: :data:`FROZEN_FILE` next to the window manifest (``paths.manifest``)."""
    return Path(manifest_path).with_name(FROZEN_FILE)


def read_frozen(path) -> dict[str, str] | None:
    """``{hybrid id: sha256}`` of a frozen file (None when there is none); IntegrityError naming the file
    when it is not one."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
        ok = (obj.get("version") == FROZEN_VERSION and isinstance(obj.get("hybrids"), dict)
              and all(isinstance(v, str) and len(v) == 64 for v in obj["hybrids"].values()))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise IntegrityError(f"{path}: not a frozen hybrid file ({e}); restore it from git or refreeze "
                             "(`portbench attribute --refreeze`)") from None
    if not ok:
        raise IntegrityError(f"{path}: not a frozen hybrid file of version {FROZEN_VERSION} ({{\"version\", "
                             "\"hybrids\": {id: sha256}}); restore it from git or refreeze "
                             "(`portbench attribute --refreeze`)")
    return dict(obj["hybrids"])


def write_frozen(path, shas: Mapping[str, str]) -> None:
    """Write ``{hybrid id: sha256}`` (sorted, one per line) with the construction's name. A study of the user's own
    never rewrites the default study's committed file (:func:`portbench.core.outputs.check_write`)."""
    outputs.check_write(path, hint="Its windows are the default study's: their hybrids are verified against the "
                        "committed file and never refrozen by another study (a study with windows of its own keeps "
                        "its hybrids.json beside its own manifest, under build/<run name>/windows/)")
    fileio.write_text(path, json.dumps({"version": FROZEN_VERSION, "construction": CONSTRUCTION,
                                        "hybrids": dict(sorted(shas.items()))}, indent=1) + "\n")


def verify_frozen(records: Sequence[Mapping], frozen: Mapping[str, str], where: str) -> int:
    """Check every record whose id is in ``frozen`` against its committed SHA-256 (IntegrityError naming the
    first hybrid that differs and how many do); returns how many were verified."""
    bad = [r for r in records if r["id"] in frozen and frozen[r["id"]] != r["sha256"]]
    if bad:
        r = bad[0]
        raise IntegrityError(f"{where}: {len(bad)} hybrid(s) differ from their frozen SHA-256, e.g. {r['id']}: "
                             f"{r['sha256']} but frozen {frozen[r['id']]}; the source windows or the construction "
                             "changed. Refreeze explicitly: `portbench attribute --refreeze` "
                             "(or attribution.run(..., refreeze=True))")
    return sum(r["id"] in frozen for r in records)
