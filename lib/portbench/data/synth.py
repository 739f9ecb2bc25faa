"""Seeded generators of synthetic workload windows: arrival processes and length models.

Every function takes a ``numpy.random.Generator``; the same generator state gives the same output
on every machine. A generated window is a polars table with the window columns (``arrival_s``,
``prompt_tokens``, ``output_tokens``, ``tenant``) and a :func:`generator_record` ``{name, params,
seed}`` saying how to rebuild it; stand-in windows carry ``synthetic: True`` (see ``standins``).

**Arrival processes.** A renewal process is given by its family, its rate ``lambda`` (req/s) and
the coefficient of variation ``c`` of its gaps (std / mean):

* ``poisson``: exponential gaps (``c = 1``);
* ``gamma``: shape ``k = 1/c**2``, scale ``1/(lambda k)``;
* ``weibull``: shape ``k`` solving ``Gamma(1+2/k)/Gamma(1+1/k)**2 - 1 = c**2`` (scipy ``brentq`` on the
  log form, which is monotone in ``k``), scale ``1/(lambda Gamma(1+1/k))``.

:func:`renewal_window` gives ``n`` arrivals starting with one at 0 (a window cut at a request, as
real windows are). :func:`renewal_interval` gives the points of a *stationary* renewal process on
``[t0, t1)``: the first point is drawn from the equilibrium forward-recurrence distribution
(a length-biased gap times a uniform fraction; length-biased Gamma(k, s) is Gamma(k+1, s), and a
length-biased Weibull(k, s) is ``s * G**(1/k)`` with ``G ~ Gamma(1+1/k)``), so an interval that
starts between arrivals has ``E[count] = lambda (t1 - t0)`` exactly. :func:`superpose` merges
per-client streams. :func:`replay_window` replays a real window's gaps.

**Length models.** :func:`resample_pairs` draws (prompt, output) pairs with replacement from real
rows (optionally weighted); :class:`EmpiricalPMF` samples token counts from a ``{tokens:
probability}`` PMF, parsed from text with ``ast.literal_eval`` (never ``eval``).

**Sampling error.** :func:`cv_standard_error` is the delta-method standard error of the sample CV
of ``n`` i.i.d. gaps, ``sqrt((c^4 + (kappa+2) c^2/4 - gamma1 c^3) / n)`` with the gap distribution's
skewness ``gamma1`` and excess kurtosis ``kappa`` (for Gamma it reduces to ``c sqrt((1+c^2)/(2n))``);
the tests derive their tolerances from it.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl
from scipy.special import gammaln

from ..core.errors import DataError, ParameterError

FAMILIES = ("poisson", "gamma", "weibull")
WINDOW_SCHEMA = {"arrival_s": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64,
                 "tenant": pl.String}
# Weibull shapes searched by the CV solver: CV from about 1e-3 (k = 1000) to about 1e33 (k = 0.01).
WEIBULL_SHAPE_RANGE = (0.01, 1000.0)


# --------------------------------------------------------------------------- seeds


def name_key(name: str) -> int:
    """A stable 64-bit integer for a name (first 8 bytes of its SHA-256, little-endian)."""
    return int.from_bytes(hashlib.sha256(str(name).encode()).digest()[:8], "little")


def derive_seed(base_seed: int, *keys: int | str) -> int:
    """A 53-bit seed from ``SeedSequence([base_seed, *keys])`` (strings through :func:`name_key`).

    53 bits keep the seed exact in any JSON reader.
    """
    entropy = [int(base_seed)] + [name_key(k) if isinstance(k, str) else int(k) for k in keys]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(11))


def rng_from(seed: int, *stream: int | str) -> np.random.Generator:
    """``default_rng(SeedSequence([seed, *stream]))``; ``stream`` names independent sub-streams."""
    entropy = [int(seed)] + [name_key(k) if isinstance(k, str) else int(k) for k in stream]
    return np.random.default_rng(np.random.SeedSequence(entropy))


# --------------------------------------------------------------------------- renewal processes


@lru_cache(maxsize=65536)
def weibull_shape_for_cv(cv: float) -> float:
    """The Weibull shape ``k`` whose gaps have coefficient of variation ``cv`` (scipy brentq)."""
    cv = float(cv)
    if not (cv > 0 and math.isfinite(cv)):
        raise ParameterError("cv", cv, "a positive finite coefficient of variation")
    target = math.log1p(cv * cv)
    lo, hi = WEIBULL_SHAPE_RANGE

    def f(k: float) -> float:
        return gammaln(1 + 2 / k) - 2 * gammaln(1 + 1 / k) - target

    if f(lo) < 0 or f(hi) > 0:
        raise ParameterError("cv", cv, f"a CV reachable by a Weibull shape in {WEIBULL_SHAPE_RANGE}")
    from scipy.optimize import brentq   # scipy.optimize only here (campaign workers import this module)

    return float(brentq(f, lo, hi, xtol=1e-14, rtol=1e-13, maxiter=500))


def weibull_cv(shape: float) -> float:
    """Coefficient of variation of a Weibull distribution with shape ``shape``."""
    return math.sqrt(math.expm1(gammaln(1 + 2 / shape) - 2 * gammaln(1 + 1 / shape)))


@dataclass(frozen=True)
class Renewal:
    """A renewal arrival process: ``family`` in :data:`FAMILIES`, ``rate`` (req/s), gap ``cv``."""

    family: str
    rate: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ParameterError("family", self.family, "one of " + ", ".join(FAMILIES))
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ParameterError("rate", self.rate, "a positive finite rate (requests per second)")
        if not (self.cv > 0 and math.isfinite(self.cv)):
            raise ParameterError("cv", self.cv, "a positive finite coefficient of variation")
        if self.family == "poisson" and self.cv != 1.0:
            raise ParameterError("cv", self.cv, "1.0 for a Poisson process")

    @property
    def shape(self) -> float:
        """Shape parameter of the gap distribution (1 for Poisson)."""
        if self.family == "gamma":
            return 1.0 / (self.cv * self.cv)
        if self.family == "weibull":
            return weibull_shape_for_cv(self.cv)
        return 1.0

    @property
    def scale(self) -> float:
        """Scale parameter (seconds) giving mean gap ``1/rate``."""
        k = self.shape
        if self.family == "weibull":
            return 1.0 / (self.rate * math.exp(gammaln(1 + 1 / k)))
        return 1.0 / (self.rate * k)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` i.i.d. inter-arrival gaps (seconds)."""
        if self.family == "poisson":
            return rng.exponential(1.0 / self.rate, n)
        if self.family == "gamma":
            return rng.gamma(self.shape, self.scale, n)
        return self.scale * rng.weibull(self.shape, n)

    def forward_recurrence(self, rng: np.random.Generator) -> float:
        """Time from an arbitrary instant to the next arrival of the stationary process."""
        if self.family == "poisson":
            return float(rng.exponential(1.0 / self.rate))
        k = self.shape
        if self.family == "gamma":
            biased = rng.gamma(k + 1.0, self.scale)
        else:
            biased = self.scale * rng.gamma(1.0 + 1.0 / k) ** (1.0 / k)
        return float(rng.random() * biased)

    def moments(self) -> tuple[float, float]:
        """(skewness, excess kurtosis) of the gap distribution."""
        c = self.cv
        if self.family == "poisson":
            return 2.0, 6.0
        if self.family == "gamma":
            return 2.0 * c, 6.0 * c * c
        k = self.shape
        g = [math.exp(gammaln(1 + r / k)) for r in range(1, 5)]
        m, var = g[0], g[1] - g[0] ** 2
        mu3 = g[2] - 3 * m * g[1] + 2 * m ** 3
        mu4 = g[3] - 4 * m * g[2] + 6 * m * m * g[1] - 3 * m ** 4
        return mu3 / var ** 1.5, mu4 / var ** 2 - 3.0

    def record(self) -> dict[str, Any]:
        """JSON-serialisable description."""
        return {"family": self.family, "rate_rps": float(self.rate), "cv": float(self.cv),
                "shape": float(self.shape), "scale_s": float(self.scale)}


def poisson(rate: float) -> Renewal:
    """A Poisson process of ``rate`` req/s."""
    return Renewal("poisson", rate, 1.0)


def cv_standard_error(process: Renewal, n: int) -> float:
    """Delta-method standard error of the sample CV (population std / mean) of ``n`` i.i.d. gaps."""
    c = process.cv
    skew, kurt = process.moments()
    var = (c ** 4 + (kurt + 2.0) * c * c / 4.0 - skew * c ** 3) / n
    return math.sqrt(max(var, 0.0))


def rate_standard_error(process: Renewal, n: int) -> float:
    """Delta-method standard error of the rate estimate ``n / sum(gaps)`` from ``n`` gaps."""
    return process.rate * process.cv / math.sqrt(n)


def arrivals_from_gaps(gaps: np.ndarray) -> np.ndarray:
    """Arrival times ``[0, g0, g0+g1, ...]`` (``len(gaps) + 1`` values)."""
    out = np.empty(len(gaps) + 1, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(gaps, out=out[1:])
    return out


def renewal_window(process: Renewal, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times of ``process`` starting with an arrival at 0.0."""
    if n <= 0:
        raise ParameterError("n", n, "a positive number of requests")
    return arrivals_from_gaps(process.gaps(n - 1, rng))


def renewal_interval(process: Renewal, t0: float, t1: float, rng: np.random.Generator,
                     max_n: int | None = None) -> np.ndarray:
    """Arrival times of the stationary process in ``[t0, t1)``, at most ``max_n`` (the earliest).

    With ``max_n`` the draw is one batch of ``max_n - 1`` gaps after the first point, so the random
    numbers consumed do not depend on the outcome.
    """
    if t1 <= t0 or (max_n is not None and max_n <= 0):
        return np.empty(0, dtype=np.float64)
    first = t0 + process.forward_recurrence(rng)
    if first >= t1:
        return np.empty(0, dtype=np.float64)
    if max_n is not None:
        times = first + arrivals_from_gaps(process.gaps(max_n - 1, rng))
        return times[times < t1]
    parts, last = [np.array([first])], first
    while True:
        expect = process.rate * (t1 - last)
        batch = int(expect + 4.0 * math.sqrt(expect + 1.0) * max(process.cv, 1.0)) + 16
        times = last + np.cumsum(process.gaps(batch, rng))
        parts.append(times[times < t1])
        if times[-1] >= t1:
            return np.concatenate(parts)
        last = float(times[-1])


def superpose(streams: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-client arrival streams: (sorted times, index of the stream of each arrival).

    Ties keep the stream order (stable sort), so the result is deterministic.
    """
    if not streams:
        return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
    times = np.concatenate([np.asarray(s, dtype=np.float64) for s in streams])
    which = np.concatenate([np.full(len(s), i, dtype=np.int64) for i, s in enumerate(streams)])
    order = np.argsort(times, kind="stable")
    return times[order], which[order]


def replay_window(arrival_s: np.ndarray, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``n`` arrivals replaying a real window's gaps in order, cyclically, from a seeded offset.

    Without ``rng`` the replay starts at the first gap (an exact copy when ``n`` equals the
    window's size).
    """
    gaps = np.diff(np.sort(np.asarray(arrival_s, dtype=np.float64)))
    if gaps.size == 0:
        raise ParameterError("arrival_s", len(arrival_s), "a window with at least two requests")
    start = int(rng.integers(gaps.size)) if rng is not None else 0
    idx = (start + np.arange(n - 1)) % gaps.size
    return arrivals_from_gaps(gaps[idx])


def sample_rate_cv(arrival_s: np.ndarray) -> tuple[float, float]:
    """(rate = (n-1)/span, CV = population std / mean of the gaps) of arrival times."""
    gaps = np.diff(np.asarray(arrival_s, dtype=np.float64))
    if gaps.size == 0 or gaps.sum() <= 0:
        return float("nan"), float("nan")
    return float(gaps.size / gaps.sum()), float(gaps.std() / gaps.mean())


# --------------------------------------------------------------------------- length models


def resample_pairs(n_pool: int, n: int, rng: np.random.Generator,
                   weights: np.ndarray | None = None) -> np.ndarray:
    """Indices of ``n`` rows drawn with replacement from a pool of ``n_pool`` real rows.

    Uniform by default; ``weights`` (one per row, non-negative) reweights rows.
    """
    if n_pool <= 0:
        raise ParameterError("pool", n_pool, "at least one real (prompt, output) pair")
    if weights is None:
        return rng.integers(0, n_pool, size=n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n_pool,) or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ParameterError("weights", w.shape, f"{n_pool} non-negative finite weights, not all zero")
    return rng.choice(n_pool, size=n, p=w / w.sum())


# A PMF text of integer keys and plain decimal numbers ("{12: 0.5, 40: 5e-1}"), read without literal_eval: an
# integer as Python writes one (no leading zero), a float with a point or an exponent.
_INT = r"[-+]?(?:0|[1-9]\d*)"
_NUM = r"[-+]?(?:(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?|(?:0|[1-9]\d*))"
_PMF_PAIR = re.compile(rf"({_INT})\s*:\s*({_NUM})")
_PMF_TEXT = re.compile(rf"[ \t]*\{{\s*(?:{_INT}\s*:\s*{_NUM}\s*(?:,\s*|(?=\}})))*\}}\s*")


@dataclass(frozen=True)
class EmpiricalPMF:
    """A PMF over positive integer token counts; ``values`` ascending, ``probs`` summing to 1."""

    values: np.ndarray
    probs: np.ndarray
    dropped_mass: float = 0.0   # probability of non-positive values removed before renormalising

    @classmethod
    def from_mapping(cls, pmf: Mapping[Any, float], where: str = "pmf") -> EmpiricalPMF:
        """From ``{tokens: probability}``; non-positive token values are dropped and counted."""
        if not isinstance(pmf, Mapping) or not pmf:
            raise DataError(where, "PMF must be a non-empty mapping {tokens: probability}")
        keys, probs = [], []
        for k, p in pmf.items():
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                raise DataError(where, f"PMF key {k!r} is not an integer token count")
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
                raise DataError(where, f"PMF probability {p!r} of {k} is not a finite non-negative number")
            keys.append(int(k))
            probs.append(float(p))
        v = np.asarray(keys, dtype=np.int64)
        pr = np.asarray(probs, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        v, pr = v[order], pr[order]
        total = pr.sum()
        if total <= 0:
            raise DataError(where, "PMF has zero total probability")
        keep = v > 0
        dropped = float(pr[~keep].sum() / total)
        v, pr = v[keep], pr[keep]
        if pr.sum() <= 0:
            raise DataError(where, "PMF has no mass on positive token counts")
        return cls(v, pr / pr.sum(), dropped)

    @classmethod
    def parse(cls, text: str, where: str = "pmf") -> EmpiricalPMF | None:
        """From the text of a dict (``"{12: 0.5, 40: 0.5}"``); ``None`` for ``"{}"``.

        ``ast.literal_eval`` accepts only literals, so the text can never run code. A text of integer keys and
        plain decimal numbers only (ServeGen's PMFs) is read by a regular expression instead, ~4x faster, to the
        same dict (the same keys, values and types; a test holds the two equal); anything else goes to
        ``literal_eval``.
        """
        if _PMF_TEXT.fullmatch(text):
            return cls.from_mapping(
                {int(k): (float(v) if any(c in v for c in ".eE") else int(v)) for k, v in _PMF_PAIR.findall(text)},
                where) if _PMF_PAIR.search(text) else None
        try:
            obj = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
            raise DataError(where, f"PMF text is not a literal dict ({type(e).__name__})") from None
        if not isinstance(obj, dict):
            raise DataError(where, f"PMF text holds a {type(obj).__name__}, expected a dict")
        if not obj:
            return None
        return cls.from_mapping(obj, where)

    @property
    def cdf(self) -> np.ndarray:
        """Cumulative probabilities (last = 1)."""
        c = np.cumsum(self.probs)
        c[-1] = 1.0
        return c

    def mean(self) -> float:
        """Expected token count."""
        return float(np.dot(self.values, self.probs))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draws (inverse CDF of uniforms from ``rng``)."""
        idx = np.searchsorted(self.cdf, rng.random(n), side="right")
        return self.values[np.minimum(idx, self.values.size - 1)]


# --------------------------------------------------------------------------- windows


def window_frame(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 tenant: Sequence[str] | np.ndarray) -> pl.DataFrame:
    """A window table with exactly the window columns; arrivals shifted so the first is 0.0."""
    arr = np.asarray(arrival_s, dtype=np.float64)
    if arr.size == 0:
        raise DataError("window", "empty window")
    if np.any(np.diff(arr) < 0) or not np.isfinite(arr).all():
        raise DataError("window", "arrival times must be finite and non-decreasing", column="arrival_s")
    p = np.asarray(prompt_tokens, dtype=np.int64)
    o = np.asarray(output_tokens, dtype=np.int64)
    if p.min() <= 0 or o.min() <= 0:
        raise DataError("window", "token counts must be positive")
    return pl.DataFrame({"arrival_s": arr - arr[0], "prompt_tokens": p, "output_tokens": o,
                         "tenant": [str(t) for t in tenant]}, schema=WINDOW_SCHEMA)


def generator_record(name: str, params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """``{"name", "params", "seed"}`` of a generated window (what the manifest records)."""
    return {"name": str(name), "params": dict(params), "seed": int(seed)}
