"""The typed sections of the parameters: one frozen dataclass per section (:class:`PathsConfig`,
:class:`SourceConfig`, :class:`WindowsConfig`, :class:`StandinsConfig`, :class:`SimulationConfig`,
:class:`EngineConfig`, :class:`CampaignConfig`, :class:`AnalysisConfig`, :class:`AttributionConfig`,
:class:`ValidationConfig`, :class:`PredictorsConfig`), each checking its own values where it is built, the
bundles :class:`DataSettings` (paths, sources, standins: what the data layer's readers need) and
:class:`AnalysisInputs` (what the analysis of a runs table reads), :class:`PlanSettings` (what the campaign's
plan reads), and :func:`build`,
the merged tree (:mod:`portbench.core.paramfile`) -> :class:`Config`."""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ParameterError, check_choice, choice
from .paramfile import DEFAULT_FILE, build_base, deep_merge, project_root, undot

# --------------------------------------------------------------------------------------------
# Typed sections. Each is frozen: a config is built once and read everywhere.
# --------------------------------------------------------------------------------------------


SOURCE_MODES = ("real", "standin", "auto")
# simulation.tenant_model: tenants only where the trace has them (trace), or the manifest's seeded
# Zipf assignment for sources without a tenant field (seeded; labelled synthetic everywhere).
TENANT_MODELS = ("trace", "seeded")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(param: str, v, low: int = 0, what: str | None = None) -> int:
    if not _is_int(v) or v < low:
        raise ParameterError(param, v, what or (f"an integer >= {low}" if low else "a non-negative integer"))
    return int(v)


def _section(P: Mapping, key: str) -> Mapping:
    s = P.get(key)
    if s is None:
        return {}
    if not isinstance(s, Mapping):
        raise ParameterError(key, s, "a mapping (see papermill_params/default.yaml)")
    return s


@dataclass(frozen=True)
class PathsConfig:
    """Where things are: the project root, the parameter file, data, manifest, the window cache and frozen
    predictions (``windows_dir``), results, figures and the configured data mirror (None:
    ``$PORTBENCH_DATA_MIRROR``, else ``../shared/traces``)."""

    root: Path
    params_file: Path
    data_dir: Path
    manifest: Path
    results_dir: Path
    figures_dir: Path
    mirror: Path | None = None
    run_name: str | None = None     # a non-default run's name: its results and figures are under build/<name>/
    windows_dir: Path | None = None     # None: {data_dir}/windows (from_tree always sets it)
    isolated: tuple[str, ...] = ()  # the paths keys moved under build/<run name>/ (see paramfile._isolate)

    @property
    def build_dir(self) -> Path:
        """Where this run's executed notebooks go: ``build/`` for the default study, ``build/<run name>/``
        for any other parameter set (``build`` = ``$PORTBENCH_BUILD`` when set, the Makefile's ``BUILD``)."""
        base = Path(build_base())
        return (base if base.is_absolute() else self.root / base) / (self.run_name or "")

    @classmethod
    def from_tree(cls, P: Mapping) -> "PathsConfig":
        p = _section(P, "paths")
        root = Path(P.get("_root") or project_root())

        def path(key: str, default: str) -> Path:
            v = p.get(key, default)
            if not isinstance(v, (str, os.PathLike)) or not str(v):
                raise ParameterError(f"paths.{key}", v, "a path")
            v = Path(v)
            return v if v.is_absolute() else root / v

        mirror = p.get("mirror")
        if mirror is not None and not isinstance(mirror, (str, os.PathLike)):
            raise ParameterError("paths.mirror", mirror, "null or a folder")
        data_dir = path("data_dir", "data")
        return cls(root=root, params_file=Path(P.get("_params_file") or root / DEFAULT_FILE),
                   data_dir=data_dir, manifest=path("manifest", "data/windows/manifest.json"),
                   results_dir=path("results_dir", "data/results"), figures_dir=path("figures_dir", "figures"),
                   mirror=(Path(mirror) if Path(mirror).is_absolute() else root / mirror) if mirror else None,
                   run_name=P.get("_run_name"),
                   windows_dir=path("windows_dir", "") if p.get("windows_dir") is not None else data_dir / "windows",
                   isolated=tuple(P.get("_isolated") or ()))

    def where(self) -> str:
        """Where this run reads and writes, in words: ``results -> …, figures -> …, windows -> …``."""
        win = (f"windows (manifest, cache, frozen predictions) -> {self.windows_dir}"
               if self.manifest.parent == self.windows_dir else
               f"manifest -> {self.manifest}, window cache and frozen predictions -> {self.windows_dir}")
        return f"results -> {self.results_dir}, figures -> {self.figures_dir}, {win}"


SOURCE_NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
# The generic trace adapter (any CSV / JSONL / parquet file with a column mapping).
GENERIC_FORMATS = ("csv", "jsonl", "parquet")
TIME_UNITS = ("s", "ms", "us", "datetime")
COLUMN_ROLES = ("arrival", "prompt_tokens", "output_tokens", "tenant", "block_hashes")
REQUIRED_ROLES = ("arrival", "prompt_tokens", "output_tokens")
SOURCE_KEYS = ("mode", "file", "format", "columns", "time_unit", "block_size", "windows", "label")


@dataclass(frozen=True)
class SourceConfig:
    """One workload source: the file it reads, whether it is real, a stand-in, or real when the file is
    present (``auto``), how the file is read and how the source is displayed.

    ``format``: None (detected from the content: an official adapter's header, else JSON Lines /
    parquet / CSV), one of the generic formats ``csv | jsonl | parquet``, or an official adapter's
    format name (``azure2023`` ...). ``columns``: the generic adapter's column mapping
    ``{arrival, prompt_tokens, output_tokens, tenant, block_hashes}`` -> the file's column names
    (None: the file is in an official format). ``time_unit``: the unit of the arrival column
    (``s | ms | us`` numbers, or ``datetime`` strings). ``block_size``: tokens per prompt-hash block
    (with ``block_hashes``). ``windows``: how many windows of this source are frozen (None: ``windows.per_source``,
    or for a file of the user's own as many as it holds, up to ``windows.per_source``: see
    :func:`portbench.data.windows.window_count`). ``label``: the display name in tables and figures (None: the name).
    """

    name: str
    mode: str = "auto"
    file: str | None = None
    format: str | None = None
    columns: dict | None = None
    time_unit: str = "s"
    block_size: int | None = None
    windows: int | None = None
    label: str | None = None

    def __post_init__(self):
        if not re.match(SOURCE_NAME_PATTERN, str(self.name)):
            raise ParameterError("sources", self.name, f"a source name matching {SOURCE_NAME_PATTERN}")
        p = f"sources.{self.name}"
        check_choice(f"{p}.mode", self.mode, SOURCE_MODES)
        if self.file is not None and not isinstance(self.file, str):
            raise ParameterError(f"{p}.file", self.file, "a file name or path")
        if self.format is not None and not (isinstance(self.format, str) and self.format):
            raise ParameterError(f"{p}.format", self.format, "null (detected from the content) or one of "
                                 + ", ".join(GENERIC_FORMATS) + " (or an official adapter's format)")
        if self.columns is not None:
            c = self.columns
            if not isinstance(c, Mapping):
                raise ParameterError(f"{p}.columns", c, "a mapping role -> column name, roles "
                                     + ", ".join(COLUMN_ROLES))
            for role, col in c.items():
                if role not in COLUMN_ROLES:
                    raise ParameterError(f"{p}.columns", role, "a role among " + ", ".join(COLUMN_ROLES))
                if col is not None and not (isinstance(col, str) and col):
                    raise ParameterError(f"{p}.columns.{role}", col, "a column name of the file, or null")
            named = [(role, col) for role, col in c.items() if col]
            for role, col in named:
                other = [r for r, x in named if x == col and r != role]
                if other:
                    raise ParameterError(f"{p}.columns.{other[0]}", col, f"a column other than {role}'s: one column "
                                         f"cannot hold both {role} and {other[0]}; map each role to its own column")
            for role in REQUIRED_ROLES:
                if not c.get(role):
                    raise ParameterError(f"{p}.columns.{role}", c.get(role),
                                         "the name of the file's column holding " + _ROLE_TEXT[role])
        check_choice(f"{p}.time_unit", self.time_unit, TIME_UNITS)
        b = self.block_size
        if b is not None and (not _is_int(b) or b <= 0):
            raise ParameterError(f"{p}.block_size", b, "null or a positive integer (tokens per prompt-hash block)")
        if self.columns and self.columns.get("block_hashes") and b is None:
            raise ParameterError(f"{p}.block_size", b, "a positive integer (tokens per hash block) when "
                                 "columns.block_hashes is given")
        if self.windows is not None:
            _int(f"{p}.windows", self.windows, 1, "null (windows.per_source; a file of your own: as many as it holds, up "
                 "to windows.per_source) or a positive integer")
        if self.label is not None and not (isinstance(self.label, str) and self.label.strip()):
            raise ParameterError(f"{p}.label", self.label, "null (the source name) or a non-empty display name")

    @property
    def display(self) -> str:
        """The display name: ``label``, else the source's name."""
        return self.label or self.name

    @property
    def generic(self) -> bool:
        """Read through the generic adapter (a column mapping is given)."""
        return self.columns is not None


_ROLE_TEXT = {"arrival": "each request's arrival time", "prompt_tokens": "prompt (input) tokens",
              "output_tokens": "output tokens"}


@dataclass(frozen=True)
class WindowsConfig:
    """Frozen windows: how many per source (and the fewest a source may have), requests per window, placement seed,
    seeded tenants."""

    per_source: int = 40
    size: int = 200
    seed: int = 0
    tenants: int = 4
    min_per_source: int = 10

    def __post_init__(self):
        for key in ("per_source", "size", "min_per_source"):
            _int(f"windows.{key}", getattr(self, key), 1, "a positive integer")
        _int("windows.seed", self.seed)
        _int("windows.tenants", self.tenants, 1, "a positive integer")


RATE_CHOICES = ("full_file", "slices")
CV_CHOICES = ("window", "pooled")


@dataclass(frozen=True)
class BurstGPTStandinConfig:
    """How the BurstGPT stand-in is built from the real evidence in the mirror (see data.standins)."""

    slices: tuple[str, ...]
    aggregates: str
    rate: str = "full_file"
    cv: str = "window"
    reweight_log_types: bool = False
    bootstrap: int = 2000
    block_length: int = 20

    def __post_init__(self):
        s = self.slices
        if not isinstance(s, tuple) or not s or not all(isinstance(x, str) and x for x in s):
            raise ParameterError("standins.burstgpt.slices", list(s) if isinstance(s, tuple) else s,
                                 "a non-empty list of paths under the mirror")
        if not isinstance(self.aggregates, str):
            raise ParameterError("standins.burstgpt.aggregates", self.aggregates, "a folder under the mirror")
        check_choice("standins.burstgpt.rate", self.rate, RATE_CHOICES)
        check_choice("standins.burstgpt.cv", self.cv, CV_CHOICES)
        if not isinstance(self.reweight_log_types, bool):
            raise ParameterError("standins.burstgpt.reweight_log_types", self.reweight_log_types, "true or false")
        for key, low in (("bootstrap", 100), ("block_length", 1)):
            _int(f"standins.burstgpt.{key}", getattr(self, key), low)


@dataclass(frozen=True)
class BailianStandinConfig:
    """The Bailian stand-in's evidence: ServeGen's client folder and the real Qwen rows (mirror paths)."""

    servegen_dir: str
    qwen_rows: str

    def __post_init__(self):
        for key in ("servegen_dir", "qwen_rows"):
            v = getattr(self, key)
            if not isinstance(v, str) or not v:
                raise ParameterError(f"standins.bailian.{key}", v, "a path under the mirror")


@dataclass(frozen=True)
class CounterfactualConfig:
    """Notebook 02's counterfactual demo: target CV of the burstiness variant, its seed."""

    burstiness_cv: float = 3.0
    seed: int = 0

    def __post_init__(self):
        if not _is_num(self.burstiness_cv) or not self.burstiness_cv > 0:
            raise ParameterError("standins.counterfactual.burstiness_cv", self.burstiness_cv, "a positive number")
        _int("standins.counterfactual.seed", self.seed)


@dataclass(frozen=True)
class StandinsConfig:
    """Stand-ins of the sources whose official file is absent (None: that source has no stand-in)."""

    seed: int
    burstgpt: BurstGPTStandinConfig | None
    bailian: BailianStandinConfig | None
    counterfactual: CounterfactualConfig

    def __post_init__(self):
        _int("standins.seed", self.seed)

    def of(self, source: str):
        """The stand-in settings of ``source`` (None: no stand-in is defined for it)."""
        return getattr(self, source, None) if source in ("burstgpt", "bailian") else None


@dataclass(frozen=True)
class SloConfig:
    """One SLO definition: time-to-first-token and time-per-output-token targets (seconds)."""

    ttft_s: float
    tpot_s: float

    @classmethod
    def from_mapping(cls, param: str, spec) -> "SloConfig":
        if not isinstance(spec, Mapping):
            raise ParameterError(param, spec, "a mapping {ttft_s: seconds, tpot_s: seconds}")
        unknown = set(spec) - {"ttft_s", "tpot_s"}
        if unknown:
            raise ParameterError(param, sorted(unknown)[0], "keys ttft_s, tpot_s")
        for k in ("ttft_s", "tpot_s"):
            v = spec.get(k)
            if not _is_num(v) or not v > 0:
                raise ParameterError(f"{param}.{k}", v, "a number of seconds > 0")
        return cls(float(spec["ttft_s"]), float(spec["tpot_s"]))

    def as_dict(self) -> dict:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}


def _rho(param: str, v) -> float:
    if not _is_num(v) or v <= 0:
        raise ParameterError(param, v, "a finite load rho > 0 (offered rate / capacity)")
    return float(v)


def _names(param: str, v) -> str | tuple[str, ...]:
    """``all`` or a tuple of names (a single string is one name)."""
    if v is None or v == "all":
        return "all"
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ParameterError(param, v, "all or a list of names")
    if not v:
        raise ParameterError(param, list(v), "all or a non-empty list of names")
    dup = sorted({x for x in v if list(v).count(x) > 1})
    if dup:
        raise ParameterError(param, list(v), f"a list of distinct names ({', '.join(dup)} given twice)")
    return tuple(v)


BATCHING_MODES = ("v1", "v0")
PREEMPTION_MODES = ("recompute", "swap")
PREFIX_CACHING_MODES = ("auto", "off")
ENGINE_CORES = ("auto", "reference", "compiled")


@dataclass(frozen=True)
class EngineConfig:
    """The serving engine every policy runs on (the scheduler only orders, admits, preempts and picks
    victims; see :mod:`portbench.sim.engine`).

    * ``batching``: ``v1`` (default) -- vLLM V1's scheduler for every policy: running requests first
      (decodes, then the rest of a started prompt), then waiting requests' prompt chunks in the
      policy's order under ``max_num_batched_tokens``; KV blocks allocated per chunk, admission only
      when the request's whole current sequence fits the free blocks. ``v0`` -- vLLM V0's
      prefill-first batching (whole prompts in prefill-only iterations, decodes wait), except for
      policies that chunk by their own definition (``sarathi``).
    * ``preemption``: ``recompute`` (default, vLLM V1: a victim's KV is freed and its prompt +
      output recomputed on resume) or ``swap`` (its KV is copied to host memory over PCIe and back
      on resume, while the profile's host memory has room; recompute otherwise).
    * ``prefix_caching``: ``auto`` (default) -- vLLM's automatic prefix caching for windows that carry
      prompt block hashes (v1 only; vLLM V0 had it off by default); ``off``.
    * ``core``: which implementation runs the engine -- ``reference`` (the SimPy engine), ``compiled``
      (the numba core, :mod:`portbench.sim.engine.compiled`: bit-identical records; an error naming what
      it does not support) or ``auto`` (default: compiled where it supports the run, else the reference).
      Not part of :meth:`as_dict` (the fingerprints): both cores give the same results.
    """

    batching: str = "v1"
    preemption: str = "recompute"
    prefix_caching: str = "auto"
    core: str = "auto"

    def __post_init__(self):
        check_choice("engine.batching", self.batching, BATCHING_MODES)
        check_choice("engine.preemption", self.preemption, PREEMPTION_MODES)
        object.__setattr__(self, "prefix_caching",   # YAML reads an unquoted off as False
                           choice("engine.prefix_caching", self.prefix_caching, PREFIX_CACHING_MODES))
        check_choice("engine.core", self.core, ENGINE_CORES)

    @classmethod
    def of(cls, spec) -> "EngineConfig":
        """An EngineConfig from None (the defaults), a mapping or an EngineConfig."""
        if spec is None:
            return cls()
        if isinstance(spec, cls):
            return spec
        if not isinstance(spec, Mapping):
            raise ParameterError("engine", spec, "a mapping with keys batching, preemption, prefix_caching, core")
        unknown = set(spec) - {"batching", "preemption", "prefix_caching", "core"}
        if unknown:
            k = sorted(unknown)[0]
            raise ParameterError(f"engine.{k}", spec[k], "one of batching, preemption, prefix_caching, core")
        return cls(**dict(spec))

    def as_dict(self) -> dict:
        return {"batching": self.batching, "preemption": self.preemption, "prefix_caching": self.prefix_caching}

    @property
    def reference(self) -> "EngineConfig":
        """The reference engine on which capacity is measured (issue #10: fcfs on vLLM V1, recompute; the
        same prefix caching), whatever this engine is: every engine variant then sees the same arrivals."""
        return EngineConfig("v1", "recompute", self.prefix_caching, self.core)


@dataclass(frozen=True)
class SimulationConfig:
    """What one simulated run is: profile, schedulers and their options, regions and their loads,
    capacity policy, observation horizon, replicates, base seed, predictor noise, SLO definitions,
    and the engine (the top-level ``engine`` section, carried here so that every function that
    runs the simulator gets it with the section it already takes)."""

    profile: str
    schedulers: str | tuple[str, ...] = "all"
    regions: str | tuple[str, ...] = "all"
    region_loads: dict = field(default_factory=dict)          # name -> rho
    capacity_policy: str = "fcfs"
    horizon_factor: float = 1.5
    replicates: int = 1
    seed: int = 0
    predictor_sigma: float = 0.5
    scheduler_options: dict = field(default_factory=dict)     # scheduler -> {option: value}
    slo: dict = field(default_factory=dict)                   # name -> SloConfig
    edf_slo: str | None = None
    tenant_model: str = "trace"
    engine: EngineConfig = field(default_factory=EngineConfig)  # the top-level ``engine`` section
    arrival_jitter: bool = False   # spread quantised arrivals within their grid (data.trace_checks), seeded
    vllm_schedulers: tuple[str, ...] = ()   # vLLM Scheduler subclasses (MODULE:CLASS) run on the virtual vLLM engine

    def __post_init__(self):
        if not isinstance(self.engine, EngineConfig):
            raise ParameterError("engine", self.engine, "an EngineConfig (the engine: section)")
        if not isinstance(self.profile, (str, os.PathLike)):
            raise ParameterError("simulation.profile", self.profile, "a profile name or a path to a profile JSON")
        if not isinstance(self.region_loads, dict) or not self.region_loads:
            raise ParameterError("simulation.region_loads", self.region_loads, "a non-empty mapping region -> rho > 0")
        for name, rho in self.region_loads.items():
            _rho(f"simulation.region_loads.{name}", rho)
        if self.regions != "all":
            for i, r in enumerate(self.regions):
                check_choice(f"simulation.regions[{i}]", r, list(self.region_loads))
        if not isinstance(self.capacity_policy, str):
            raise ParameterError("simulation.capacity_policy", self.capacity_policy, "a scheduler name")
        if not _is_num(self.horizon_factor) or self.horizon_factor <= 0:
            raise ParameterError("simulation.horizon_factor", self.horizon_factor,
                                 "a number > 0 (horizon = factor x rescaled span)")
        _int("simulation.replicates", self.replicates, 1, "a positive integer")
        _int("simulation.seed", self.seed)
        if not _is_num(self.predictor_sigma) or self.predictor_sigma < 0:
            raise ParameterError("simulation.predictor_sigma", self.predictor_sigma, "a number >= 0")
        if not isinstance(self.slo, dict) or not self.slo:
            raise ParameterError("simulation.slo", self.slo, "a non-empty mapping name -> {ttft_s, tpot_s}")
        check_choice("simulation.edf_slo", self.edf_slo, list(self.slo))
        check_choice("simulation.tenant_model", self.tenant_model, TENANT_MODELS)
        if not isinstance(self.arrival_jitter, bool):
            raise ParameterError("simulation.arrival_jitter", self.arrival_jitter, "true or false")
        if not isinstance(self.scheduler_options, dict):
            raise ParameterError("simulation.scheduler_options", self.scheduler_options,
                                 "a mapping scheduler -> {option: value}")
        for name, o in self.scheduler_options.items():
            if not isinstance(o, Mapping):
                raise ParameterError(f"simulation.scheduler_options.{name}", o, "a mapping option -> value")

    @property
    def loads(self) -> dict[str, float]:
        """``{region: rho}`` of the selected regions, in increasing rho (ties by name)."""
        names = list(self.region_loads) if self.regions == "all" else list(self.regions)
        return dict(sorted(((n, float(self.region_loads[n])) for n in names), key=lambda kv: (kv[1], kv[0])))

    @property
    def slo_dicts(self) -> dict[str, dict]:
        """The SLO definitions as plain ``{name: {ttft_s, tpot_s}}``."""
        return {k: v.as_dict() for k, v in self.slo.items()}

    @property
    def edf_slo_dict(self) -> dict | None:
        return self.slo[self.edf_slo].as_dict() if self.edf_slo in self.slo else None


EXECUTORS = ("process", "dask")


@dataclass(frozen=True)
class RequestRecordsConfig:
    """Which runs keep their per-request records: the first N windows per source (``all``: every
    window), the listed regions (``all``) and replicates (``all``)."""

    windows_per_source: int | str | None = 0
    regions: str | tuple[str, ...] = "all"
    replicates: str | tuple[int, ...] = "all"


@dataclass(frozen=True)
class CampaignConfig:
    """How the campaign is executed (never what it computes): executor, workers, Dask address,
    a window subset for quick runs, and the per-request records to keep."""

    executor: str = "process"
    workers: int = 2
    dask_address: str | None = None
    windows_per_source: int | None = None
    request_records: RequestRecordsConfig | None = None
    time_limit: dict | None = None     # {factor, floor_s}: a plug-in's run may take factor x the slowest built-in's

    def __post_init__(self):
        check_choice("campaign.executor", self.executor, EXECUTORS)
        t = self.time_limit
        if t is not None:
            if not isinstance(t, Mapping) or set(t) - {"factor", "floor_s"}:
                raise ParameterError("campaign.time_limit", t, "a mapping {factor, floor_s}")
            for k in ("factor", "floor_s"):
                if k in t and (not _is_num(t[k]) or not t[k] > 0):
                    raise ParameterError(f"campaign.time_limit.{k}", t[k], "a positive number")
        _int("campaign.workers", self.workers, 1, "a positive integer (worker processes)")
        a = self.dask_address
        if a is not None and not (isinstance(a, str) and a.strip()):
            raise ParameterError("campaign.dask_address", a, "null (a LocalCluster) or a scheduler address "
                                 "such as tcp://host:8786")
        w = self.windows_per_source
        if w is not None:
            _int("campaign.windows_per_source", w, 1, "null (every window) or a positive integer")

    @property
    def limit(self) -> tuple[float, float]:
        """``(factor, floor_s)`` of a plug-in's per-run time limit (see :mod:`portbench.study.campaign.executors`)."""
        t = dict(self.time_limit or {})
        return float(t.get("factor", 20.0)), float(t.get("floor_s", 60.0))


FAMILIES = ("per_metric", "all", "per_region")
CORRECTIONS = ("fdr_bh", "holm")
TIE_RULES = ("significance", "significance_practical", "tolerance", "exact")
TIE_CORRECTIONS = ("fdr_bh", "holm", "none")


@dataclass(frozen=True)
class StudyPresetConfig:
    """The original study's reversal design, reported beside the default: one metric, the heaviest
    ``regions`` operating regions, every comparison corrected together with ``correction``."""

    metric: str = "ttft_p99"
    regions: int = 4
    correction: str = "holm"

    def __post_init__(self):
        if not isinstance(self.metric, str) or not self.metric:
            raise ParameterError("analysis.study_preset.metric", self.metric, "a metric name")
        _int("analysis.study_preset.regions", self.regions, 1, "a positive number of regions (the heaviest ones)")
        check_choice("analysis.study_preset.correction", self.correction, CORRECTIONS)


@dataclass(frozen=True)
class PowerConfig:
    """Simulation-based power: minimal detectable effect of one side test at ``windows`` windows per
    source (``auto``: the fewest windows a source of the run has) with power ``target``."""

    windows: int | str = "auto"
    target: float = 0.8

    def __post_init__(self):
        if self.windows != "auto":
            _int("analysis.power.windows", self.windows, 2, "auto (the windows each source has in this run) or an "
                 "integer >= 2 (windows per source)")
        if not _is_num(self.target) or not 0 < self.target < 1:
            raise ParameterError("analysis.power.target", self.target, "a power strictly between 0 and 1")


@dataclass(frozen=True)
class AnalysisConfig:
    """The portability analysis: metrics (headline and secondary), significance and practical size, statistical
    ties, correction and family, bootstrap, panels of sources, the study preset, power, an optional runs file."""

    metrics: str | tuple[str, ...] = "all"
    headline_metrics: tuple[str, ...] = ()
    alpha: float = 0.05
    delta: float = 0.05
    delta_absolute: float = 0.05
    ties: str = "significance"
    tie_correction: str = "fdr_bh"
    rank_tolerance: float = 0.01
    correction: str = "fdr_bh"
    family: str = "per_metric"
    bootstrap: int = 1000
    seed: int = 0
    panels: dict = field(default_factory=dict)
    study_preset: StudyPresetConfig = field(default_factory=StudyPresetConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    cd_conditions: str | tuple[tuple[str, str, str], ...] = "auto"
    runs_file: Path | None = None

    def __post_init__(self):
        if not _is_num(self.alpha) or not 0 < self.alpha < 1:
            raise ParameterError("analysis.alpha", self.alpha, "a number strictly between 0 and 1")
        if not _is_num(self.delta) or not 0 <= self.delta <= 2:
            raise ParameterError("analysis.delta", self.delta, "a relative difference between 0 and 2 (0.05 = 5%)")
        if not _is_num(self.delta_absolute) or not 0 <= self.delta_absolute <= 1:
            raise ParameterError("analysis.delta_absolute", self.delta_absolute,
                                 "an absolute difference of proportions between 0 and 1 (0.05 = 5 percentage points)")
        check_choice("analysis.ties", self.ties, TIE_RULES)
        check_choice("analysis.tie_correction", self.tie_correction, TIE_CORRECTIONS)
        check_choice("analysis.correction", self.correction, CORRECTIONS)
        check_choice("analysis.family", self.family, FAMILIES)
        _int("analysis.bootstrap", self.bootstrap, 0, "a non-negative integer (0 = no CIs)")
        _int("analysis.seed", self.seed)
        if not _is_num(self.rank_tolerance) or not 0 <= self.rank_tolerance < 1:
            raise ParameterError("analysis.rank_tolerance", self.rank_tolerance,
                                 "a relative difference in [0, 1) (0.01 = means within 1% are tied; 0 = exact ties only)")


ATTRIBUTION_PROPERTIES = ("arrival", "prompt", "output", "coupling", "load")  # = data.hybrids.PROPERTIES
ATTRIBUTION_DISTANCES = ("kendall", "tau_b")


@dataclass(frozen=True)
class AttributionConfig:
    """Counterfactual attribution (notebook 09): which source pairs, which properties are swapped (each
    player of the Shapley decomposition is one property or a group swapped together), and the reduced
    design (regions, windows per source, replicates) that keeps its cost small; bootstrap, seed, and the
    ranking distance the decomposition splits."""

    pairs: str | tuple[tuple[str, str], ...] = "auto"
    properties: tuple[tuple[str, ...], ...] = (("arrival",), ("prompt",), ("output",), ("coupling",), ("load",))
    regions: tuple[str, ...] = ("overload", "severe")
    windows: int = 8
    replicates: int = 1
    bootstrap: int = 1000
    seed: int = 0
    distance: str = "kendall"

    def __post_init__(self):
        if self.pairs != "auto":
            if not isinstance(self.pairs, tuple) or not self.pairs:
                raise ParameterError("attribution.pairs", self.pairs, "auto or a non-empty list of [source_a, source_b]")
            for i, p in enumerate(self.pairs):
                if not (isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) and p[0] != p[1]):
                    raise ParameterError(f"attribution.pairs[{i}]", p, "[source_a, source_b], two different source names")
        flat = [x for g in self.properties for x in g]
        if not self.properties or not all(isinstance(g, tuple) and g for g in self.properties):
            raise ParameterError("attribution.properties", self.properties,
                                 "a non-empty list of properties or groups (lists) of properties")
        for x in flat:
            check_choice("attribution.properties", x, ATTRIBUTION_PROPERTIES)
        if sorted(flat) != sorted(ATTRIBUTION_PROPERTIES):
            raise ParameterError("attribution.properties", [list(g) for g in self.properties],
                                 f"each of {', '.join(ATTRIBUTION_PROPERTIES)} exactly once (group properties in a "
                                 "list to swap them together), so that swapping every player gives the other source")
        if not isinstance(self.regions, tuple) or not self.regions or not all(isinstance(r, str) for r in self.regions):
            raise ParameterError("attribution.regions", self.regions, "a non-empty list of region names")
        _int("attribution.windows", self.windows, 2, "an integer >= 2 (windows per source)")
        _int("attribution.replicates", self.replicates, 1, "a positive integer")
        _int("attribution.bootstrap", self.bootstrap, 0, "a non-negative integer (0 = no CIs)")
        _int("attribution.seed", self.seed)
        check_choice("attribution.distance", self.distance, ATTRIBUTION_DISTANCES)

    @property
    def players(self) -> list[str]:
        """Display names of the players: a property, or a group joined with '+'."""
        return ["+".join(g) for g in self.properties]


DEVICES = ("auto", "cuda", "cpu")
KV_BLOCKS = ("profile", "engine")


@dataclass(frozen=True)
class VllmEngineConfig:
    """One vLLM engine of the validation (``validation.cpu`` or ``validation.gpu``): model, workload
    scaling and the engine settings the re-simulation copies (null = vLLM's platform default)."""

    section: str = "validation.gpu"
    model_config: str = "llama3_8b"
    token_scale: float = 1.0
    requests_per_window: int | None = None
    kv_blocks: str | int = "profile"
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    prefix_caching: str = "off"

    def __post_init__(self):
        p = self.section
        object.__setattr__(self, "prefix_caching",
                           choice(f"{p}.prefix_caching", self.prefix_caching, PREFIX_CACHING_MODES))
        if not isinstance(self.model_config, str) or not self.model_config:
            raise ParameterError(f"{p}.model_config", self.model_config, "a model config name or folder")
        if not _is_num(self.token_scale) or not 0 < self.token_scale <= 1:
            raise ParameterError(f"{p}.token_scale", self.token_scale, "a factor in (0, 1] applied to token counts")
        kb = self.kv_blocks
        if not (kb in KV_BLOCKS or (_is_int(kb) and kb > 0)):
            raise ParameterError(f"{p}.kv_blocks", kb, "profile, engine or a positive integer")
        for key in ("requests_per_window", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            v = getattr(self, key)
            if v is not None:
                _int(f"{p}.{key}", v, 1, "null or a positive integer")
        if self.block_size is not None and self.block_size % 16:
            raise ParameterError(f"{p}.block_size", self.block_size, "null or a multiple of 16 (CPU: of 32)")
        g = self.gpu_memory_utilization
        if not _is_num(g) or not 0 < g <= 1:
            raise ParameterError(f"{p}.gpu_memory_utilization", g, "a number in (0, 1]")
        if not isinstance(self.enforce_eager, bool):
            raise ParameterError(f"{p}.enforce_eager", self.enforce_eager, "true or false")
        if not isinstance(self.dtype, str):
            raise ParameterError(f"{p}.dtype", self.dtype, "a vLLM dtype string (auto, bfloat16, float16, float32)")


@dataclass(frozen=True)
class StepGridConfig:
    """The fixed-shape step timing grid (``validation.step_grid``; engine tokens)."""

    decode_batches: tuple = (1, 4, 16, 64)
    decode_contexts: tuple = (64, 256, 2048, 8192)   # pairs the KV cache cannot hold are left out (steps.grid)
    prefill_tokens: tuple = (64, 256)
    cached_contexts: tuple = (0, 512, 4096)
    mixed: tuple = ((16, 128), (2, 256, 2048))   # [B, P] at the smallest decode context, or [B, P, C per sequence]
    rounds: int = 5
    reduced_rounds: int = 3
    steps_per_shape: int = 4

    def __post_init__(self):
        p = "validation.step_grid"
        for key in ("decode_batches", "decode_contexts", "prefill_tokens", "cached_contexts"):
            v = getattr(self, key)
            if not isinstance(v, (list, tuple)) or not v or not all(_is_int(x) and x >= 0 for x in v):
                raise ParameterError(f"{p}.{key}", v, "a non-empty list of non-negative integers")
        if not isinstance(self.mixed, (list, tuple)) or not all(
                isinstance(x, (list, tuple)) and len(x) in (2, 3) and all(_is_int(y) and y > 0 for y in x)
                for x in self.mixed):
            raise ParameterError(f"{p}.mixed", self.mixed, "a list of [decode batch, prefill tokens] pairs or "
                                                           "[decode batch, prefill tokens, decode context] triples")
        for key in ("rounds", "reduced_rounds", "steps_per_shape"):
            _int(f"{p}.{key}", getattr(self, key), 1, "a positive integer")


@dataclass(frozen=True)
class ValidationConfig:
    """The real-engine (vLLM) validation: device, vLLM version, windows, time budget, the two engines."""

    device: str = "auto"
    vllm_version: str | None = None
    seed: int = 0
    window_seed: int = 14
    windows_per_source: int = 10
    reduced_windows_per_source: int = 3
    time_budget_s: float = 900.0
    reduced_time_budget_s: float = 330.0
    fidelity_region: str = "moderate"
    fidelity_windows: int = 2
    reduced_fidelity_windows: int = 1
    repeat_windows: int = 1    # per source, its first fidelity windows replayed a second time (0: none)
    saturation_requests: int | None = None   # None: the campaign's backlog size (validation.capacity.backlog_size)
    interleave: bool = True
    equivalence_margin: float = 0.05
    step_grid: StepGridConfig = field(default_factory=lambda: StepGridConfig())
    cpu: VllmEngineConfig = field(default_factory=lambda: VllmEngineConfig(section="validation.cpu"))
    gpu: VllmEngineConfig = field(default_factory=VllmEngineConfig)

    def __post_init__(self):
        if self.vllm_version is not None and not isinstance(self.vllm_version, str):
            raise ParameterError("validation.vllm_version", self.vllm_version, "null or a version string")
        check_choice("validation.device", self.device, DEVICES)
        for key in ("seed", "window_seed"):
            _int(f"validation.{key}", getattr(self, key), 0, "a non-negative integer")
        for key in ("windows_per_source", "reduced_windows_per_source"):
            _int(f"validation.{key}", getattr(self, key), 1, "a positive integer")
        if self.saturation_requests is not None:
            _int("validation.saturation_requests", self.saturation_requests, 1, "null or a positive integer")
        for key in ("fidelity_windows", "reduced_fidelity_windows", "repeat_windows"):
            _int(f"validation.{key}", getattr(self, key), 0, "a non-negative integer")
        for key in ("time_budget_s", "reduced_time_budget_s"):
            v = getattr(self, key)
            if not _is_num(v) or v <= 0:
                raise ParameterError(f"validation.{key}", v, "seconds > 0")
        if not isinstance(self.fidelity_region, str):
            raise ParameterError("validation.fidelity_region", self.fidelity_region, "a region name")
        if not isinstance(self.interleave, bool):
            raise ParameterError("validation.interleave", self.interleave, "true or false")
        m = self.equivalence_margin
        if not _is_num(m) or not 0 < m < 1:
            raise ParameterError("validation.equivalence_margin", m, "a number in (0, 1): the TOST margin on effects")

    def engine(self, device: str) -> VllmEngineConfig:
        """The engine section for ``device`` (``cpu`` or ``cuda``)."""
        return self.cpu if device == "cpu" else self.gpu


def _build_validation(V: Mapping) -> ValidationConfig:
    V = dict(V)
    for key, section in (("cpu", "validation.cpu"), ("gpu", "validation.gpu")):
        sub = V.get(key)
        if sub is not None and not isinstance(sub, Mapping):
            raise ParameterError(section, sub, "a mapping (see papermill_params/default.yaml)")
        V[key] = VllmEngineConfig(section=section, **dict(sub or {}))
    for key, cls in (("step_grid", StepGridConfig),):
        sub = V.get(key)
        if sub is not None and not isinstance(sub, Mapping):
            raise ParameterError(f"validation.{key}", sub, "a mapping (see papermill_params/default.yaml)")
        if key == "step_grid" and sub:
            sub = {k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v)
                   for k, v in sub.items()}
        V[key] = cls(**dict(sub or {}))
    return ValidationConfig(**V)


REGRESSOR_KEYS = ("max_iter", "learning_rate", "max_leaf_nodes", "min_samples_leaf", "l2_regularization")
RANKER_KEYS = ("n_estimators", "learning_rate", "num_leaves", "min_child_samples")
DEFAULT_REGRESSOR = {"max_iter": 200, "learning_rate": 0.05, "max_leaf_nodes": 31, "min_samples_leaf": 40,
                     "l2_regularization": 1.0}
DEFAULT_RANKER = {"n_estimators": 200, "learning_rate": 0.05, "num_leaves": 31, "min_child_samples": 40}


@dataclass(frozen=True)
class PredictorTransferConfig:
    """The "does a predictor port?" campaign: a subset of windows and regions on which the
    prediction-based schedulers run with every other source's predictor."""

    windows_per_source: int = 20
    regions: tuple[str, ...] = ("busy", "near_saturation", "overload", "severe")
    schedulers: tuple[str, ...] = ("sjf_predicted", "ltr", "edf")


@dataclass(frozen=True)
class PredictorsConfig:
    """Learned output-length predictors (:mod:`portbench.data.predictors`): training data of the
    stand-ins, cross-fitting, features, the two models' hyper-parameters, bootstrap, transfer campaign."""

    seed: int = 0
    standin_train_requests: int = 20000
    cross_fit_folds: int = 5
    time_of_day_min_span_s: float = 86400.0
    ranker_group_size: int = 200
    ranker_levels: int = 16
    regressor: dict = field(default_factory=lambda: dict(DEFAULT_REGRESSOR))
    ranker: dict = field(default_factory=lambda: dict(DEFAULT_RANKER))
    bootstrap: int = 1000
    transfer: PredictorTransferConfig = field(default_factory=PredictorTransferConfig)

    def __post_init__(self):
        _int("predictors.seed", self.seed)
        _int("predictors.standin_train_requests", self.standin_train_requests, 100, "an integer >= 100")
        _int("predictors.cross_fit_folds", self.cross_fit_folds, 2, "an integer >= 2")
        if not _is_num(self.time_of_day_min_span_s) or self.time_of_day_min_span_s <= 0:
            raise ParameterError("predictors.time_of_day_min_span_s", self.time_of_day_min_span_s, "seconds > 0")
        _int("predictors.ranker_group_size", self.ranker_group_size, 2, "an integer >= 2")
        _int("predictors.ranker_levels", self.ranker_levels, 2, "an integer in [2, 31]")
        if self.ranker_levels > 31:
            raise ParameterError("predictors.ranker_levels", self.ranker_levels, "an integer in [2, 31]")
        _int("predictors.bootstrap", self.bootstrap, 0, "a non-negative integer (0 = no CIs)")
        for sec, keys in (("regressor", REGRESSOR_KEYS), ("ranker", RANKER_KEYS)):
            d = getattr(self, sec)
            if not isinstance(d, dict) or set(d) != set(keys):
                raise ParameterError(f"predictors.{sec}", d, "a mapping with exactly " + ", ".join(keys))
            for k, v in d.items():
                if k in ("learning_rate", "l2_regularization"):
                    if not _is_num(v) or v < 0 or (k == "learning_rate" and v == 0):
                        raise ParameterError(f"predictors.{sec}.{k}", v, "a number > 0" if k == "learning_rate"
                                             else "a number >= 0")
                else:
                    _int(f"predictors.{sec}.{k}", v, 1, "a positive integer")
        t = self.transfer
        _int("predictors.transfer.windows_per_source", t.windows_per_source, 1, "a positive integer")


class _Sources:
    """``source_names()`` and ``display_names`` of a bundle that has the ``sources`` section (name ->
    :class:`SourceConfig`): :class:`DataSettings`, :class:`AnalysisInputs`, :class:`PlanSettings`, :class:`Config`."""

    sources: dict            # name -> SourceConfig

    def source_names(self) -> list[str]:
        """The configured sources in the order of the parameter files (default.yaml's first, then the
        ones a file adds)."""
        return list(self.sources)

    @property
    def display_names(self) -> dict[str, str]:
        """``{source: display name}`` (``sources.<s>.label``, else the source's name)."""
        return {s: c.display for s, c in self.sources.items()}


@dataclass(frozen=True)
class DataSettings(_Sources):
    """The three sections the data layer's readers always need together (canonical tables, window rebuilds,
    predictor training): where the files are (``paths``), how each source is read (``sources``, name ->
    :class:`SourceConfig`) and how the stand-ins are generated (``standins``). :attr:`Config.data` gives it."""

    paths: PathsConfig
    sources: dict            # name -> SourceConfig
    standins: StandinsConfig


@dataclass(frozen=True)
class AnalysisInputs(_Sources):
    """What the analysis of a runs table reads besides the runs (:func:`portbench.study.analysis.compute`, its
    fingerprint, the controls' headlines): the ``analysis`` section, the windows' size (``windows.size``), the
    ``simulation`` section (the SLOs' metrics, the scheduler order, the capacity policy), the sources (their
    order and display names) and the paths (the analysis plan under ``paths.root``, results under
    ``paths.results_dir``). :attr:`Config.analysis_inputs` gives it."""

    analysis: AnalysisConfig
    window_size: int
    simulation: SimulationConfig
    sources: dict            # name -> SourceConfig
    paths: PathsConfig


@dataclass(frozen=True)
class PlanSettings(_Sources):
    """What the campaign's plan reads (:func:`portbench.study.campaign.make_plan`): the ``simulation`` and
    ``campaign`` sections, the sources (the campaign's windows, in their order), ``predictors`` and ``standins``
    (the fingerprint of the frozen predictions), the plug-ins (part of every fingerprint) and the paths (where
    the campaign's files are). :attr:`Config.plan_settings` gives it."""

    simulation: SimulationConfig
    campaign: CampaignConfig
    sources: dict            # name -> SourceConfig
    predictors: PredictorsConfig
    standins: StandinsConfig
    plugins: tuple[str, ...]
    paths: PathsConfig


@dataclass(frozen=True)
class Config(_Sources):
    """The whole parameter set, built once by :func:`build` (``tree`` keeps the merged YAML tree, for
    fingerprints and for printing the effective parameters)."""

    paths: PathsConfig
    sources: dict            # name -> SourceConfig (sources left out with ``null`` are absent)
    windows: WindowsConfig
    standins: StandinsConfig
    simulation: SimulationConfig
    engine: EngineConfig
    campaign: CampaignConfig
    analysis: AnalysisConfig
    validation: ValidationConfig
    plugins: tuple[str, ...] = ()   # plug-in files (absolute paths) and module names, loaded by params.load
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    predictors: PredictorsConfig = field(default_factory=PredictorsConfig)
    tree: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def params_file(self) -> Path:
        return self.paths.params_file

    @property
    def data(self) -> DataSettings:
        """The data layer's settings: ``paths``, ``sources`` and ``standins`` (:class:`DataSettings`)."""
        return DataSettings(self.paths, self.sources, self.standins)

    @property
    def analysis_inputs(self) -> AnalysisInputs:
        """What the analysis of a runs table reads (:class:`AnalysisInputs`)."""
        return AnalysisInputs(self.analysis, self.windows.size, self.simulation, self.sources, self.paths)

    @property
    def plan_settings(self) -> PlanSettings:
        """What the campaign's plan reads (:class:`PlanSettings`)."""
        return PlanSettings(self.simulation, self.campaign, self.sources, self.predictors, self.standins,
                            self.plugins, self.paths)

    def with_overrides(self, overrides: Mapping) -> "Config":
        """A new config: this one's tree with ``overrides`` (dotted keys or nested) merged in."""
        return build(deep_merge(self.tree, undot(dict(overrides))))


def _tuple(v):
    return tuple(v) if isinstance(v, list) else v


def _build_standins(S: Mapping) -> StandinsConfig:
    b, c = S.get("burstgpt"), S.get("bailian")
    if b is not None and not isinstance(b, Mapping):
        raise ParameterError("standins.burstgpt", b, "a mapping (see papermill_params/default.yaml)")
    if c is not None and not isinstance(c, Mapping):
        raise ParameterError("standins.bailian", c, "a mapping (see papermill_params/default.yaml)")
    bg = None
    if b is not None:
        sl = b.get("slices")
        bg = BurstGPTStandinConfig(**{**b, "slices": tuple(sl) if isinstance(sl, list) else sl})
    cf = S.get("counterfactual") or {}
    return StandinsConfig(seed=S.get("seed"), burstgpt=bg,
                          bailian=BailianStandinConfig(**c) if c is not None else None,
                          counterfactual=CounterfactualConfig(**cf))


def _build_simulation(s: Mapping, engine: EngineConfig | None = None) -> SimulationConfig:
    slo = s.get("slo")
    if not isinstance(slo, Mapping) or not slo:
        raise ParameterError("simulation.slo", slo, "a non-empty mapping name -> {ttft_s, tpot_s}")
    loads = s.get("region_loads")
    if not isinstance(loads, Mapping) or not loads:
        raise ParameterError("simulation.region_loads", loads, "a non-empty mapping region -> rho > 0")
    opts = s.get("scheduler_options") or {}
    if not isinstance(opts, Mapping):
        raise ParameterError("simulation.scheduler_options", opts, "a mapping scheduler -> {option: value}")
    return SimulationConfig(**{
        **s,
        "schedulers": _names("simulation.schedulers", s.get("schedulers", "all")),
        "regions": _names("simulation.regions", s.get("regions", "all")),
        "region_loads": {str(k): _rho(f"simulation.region_loads.{k}", v) for k, v in loads.items()},
        "slo": {str(k): SloConfig.from_mapping(f"simulation.slo.{k}", v) for k, v in slo.items()},
        "scheduler_options": {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in opts.items()},
        "engine": engine or EngineConfig(),
        "vllm_schedulers": _vllm_classes(s.get("vllm_schedulers")),
    })


def _vllm_classes(v) -> tuple[str, ...]:
    """``simulation.vllm_schedulers``: a list of ``MODULE:CLASS`` / ``FILE.py:CLASS`` specs (empty by default)."""
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x.count(":") == 1 and all(x.split(":"))
                                                   for x in v):
        raise ParameterError("simulation.vllm_schedulers", v, "a list of vLLM Scheduler subclasses as MODULE:CLASS or "
                             "FILE.py:CLASS, e.g. [mypkg.sched:MySched]")
    return tuple(v)


def _build_campaign(c: Mapping, region_names) -> CampaignConfig:
    rr = c.get("request_records")
    rec = None
    if rr is not None:
        if not isinstance(rr, Mapping):
            raise ParameterError("campaign.request_records", rr, "a mapping with keys windows_per_source, "
                                 "regions, replicates")
        unknown = set(rr) - {"windows_per_source", "regions", "replicates"}
        if unknown:
            k = sorted(unknown)[0]
            raise ParameterError(f"campaign.request_records.{k}", rr[k],
                                 "one of windows_per_source, regions, replicates")
        n = rr.get("windows_per_source", 0)
        if n not in (None, "all") and (not _is_int(n) or n < 0):
            raise ParameterError("campaign.request_records.windows_per_source", n, "'all' or an integer >= 0")
        regs = _names("campaign.request_records.regions", rr.get("regions", "all"))
        if regs != "all":
            for i, r in enumerate(regs):
                check_choice(f"campaign.request_records.regions[{i}]", r, list(region_names))
        reps = rr.get("replicates", "all")
        if reps not in ("all", None):
            if not isinstance(reps, list) or not all(_is_int(r) and r >= 0 for r in reps):
                raise ParameterError("campaign.request_records.replicates", reps, "'all' or a list of integers >= 0")
            reps = tuple(reps)
        rec = RequestRecordsConfig(windows_per_source=n, regions=regs, replicates=reps or "all")
    return CampaignConfig(**{**c, "request_records": rec})


def _cd_parts(c) -> tuple[str, str, str] | None:
    if isinstance(c, str):
        c = c.split("/")
    if isinstance(c, (list, tuple)) and len(c) == 3 and all(isinstance(x, str) for x in c):
        return tuple(c)
    return None


def _build_analysis(a: Mapping, root: Path) -> AnalysisConfig:
    cd = a.get("cd_conditions", "auto")
    if cd != "auto":
        if not isinstance(cd, list):
            raise ParameterError("analysis.cd_conditions", cd, "auto or a list of source/region/metric")
        parts = []
        for i, c in enumerate(cd):
            pc = _cd_parts(c)
            if pc is None:
                raise ParameterError(f"analysis.cd_conditions[{i}]", c,
                                     "'source/region/metric' or [source, region, metric]")
            parts.append(pc)
        cd = tuple(parts)
    hm = a.get("headline_metrics") or []
    if not isinstance(hm, list) or not all(isinstance(m, str) for m in hm) or len(set(hm)) != len(hm):
        raise ParameterError("analysis.headline_metrics", hm, "a list of distinct metric names")
    panels = a.get("panels") or {}
    if not isinstance(panels, Mapping):
        raise ParameterError("analysis.panels", panels, "a mapping panel name -> list of sources")
    built = {}
    for name, srcs in panels.items():
        if srcs is None:             # `panels: {real: null}` drops a panel of the file this one extends
            continue
        if (not isinstance(srcs, list) or len(srcs) < 2 or len(set(srcs)) != len(srcs)
                or not all(isinstance(x, str) for x in srcs)):
            raise ParameterError(f"analysis.panels.{name}", srcs, "a list of at least two distinct source names")
        built[str(name)] = tuple(srcs)
    sp = a.get("study_preset") or {}
    pw = a.get("power") or {}
    for key, v in (("study_preset", sp), ("power", pw)):
        if not isinstance(v, Mapping):
            raise ParameterError(f"analysis.{key}", v, "a mapping (see papermill_params/default.yaml)")
    rf = a.get("runs_file")
    if rf is not None and not isinstance(rf, str):
        raise ParameterError("analysis.runs_file", rf, "null or a path to a runs parquet file")
    return AnalysisConfig(**{**a, "metrics": _names("analysis.metrics", a.get("metrics", "all")),
                             "cd_conditions": cd, "headline_metrics": tuple(hm), "panels": built,
                             "study_preset": StudyPresetConfig(**sp), "power": PowerConfig(**pw),
                             "runs_file": (Path(rf) if Path(rf).is_absolute() else root / rf) if rf else None})


def _build_plugins(v) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in v):
        raise ParameterError("plugins", v, "a list of plug-in files (path/to/file.py) or module names (package.module)")
    out: list[str] = []
    for x in v:
        if x not in out:
            out.append(x)
    return tuple(out)


def _distinct(param: str, values) -> None:
    """ParameterError when a list names something twice (a duplicate would run or count it twice)."""
    seen = [repr(v) for v in values]
    dup = sorted({x for x in seen if seen.count(x) > 1})
    if dup:
        raise ParameterError(param, list(values), f"a list of distinct entries ({', '.join(dup)} given twice)")


def _build_attribution(a: Mapping, sources, region_names) -> AttributionConfig:
    pairs = a.get("pairs", "auto")
    if pairs != "auto":
        if not isinstance(pairs, list) or not all(isinstance(p, list) for p in pairs):
            raise ParameterError("attribution.pairs", pairs, "auto or a list of [source_a, source_b]")
        pairs = tuple(tuple(p) for p in pairs)
        _distinct("attribution.pairs", [tuple(sorted(p)) for p in pairs])
        for i, p in enumerate(pairs):
            for x in p:
                check_choice(f"attribution.pairs[{i}]", x, list(sources))
    props = a.get("properties", None)
    if props is not None:
        if not isinstance(props, list):
            raise ParameterError("attribution.properties", props, "a list of properties or groups (lists) of properties")
        props = tuple(tuple(g) if isinstance(g, list) else (g,) for g in props)
    regions = a.get("regions", None)
    if regions is not None:
        if isinstance(regions, str):
            regions = [regions]
        if not isinstance(regions, list):
            raise ParameterError("attribution.regions", regions, "a list of region names")
        for i, r in enumerate(regions):
            check_choice(f"attribution.regions[{i}]", r, list(region_names))
        _distinct("attribution.regions", regions)
        regions = tuple(regions)
    kw = {k: v for k, v in {**a, "pairs": pairs, "properties": props, "regions": regions}.items() if v is not None}
    return AttributionConfig(**kw)


def _build_predictors(p: Mapping, region_names) -> PredictorsConfig:
    t = p.get("transfer")
    if t is None:  # a tree without the section: the defaults, on the regions it has
        t = {"regions": [r for r in PredictorTransferConfig.regions if r in region_names] or list(region_names)[-1:],
             "schedulers": list(PredictorTransferConfig.schedulers)}
    if not isinstance(t, Mapping):
        raise ParameterError("predictors.transfer", t, "a mapping with keys windows_per_source, regions, schedulers")
    regs = t.get("regions") or []
    if not isinstance(regs, list) or not all(isinstance(r, str) for r in regs) or not regs:
        raise ParameterError("predictors.transfer.regions", regs, "a non-empty list of region names")
    for i, r in enumerate(regs):
        check_choice(f"predictors.transfer.regions[{i}]", r, list(region_names))
    _distinct("predictors.transfer.regions", regs)
    sch = t.get("schedulers") or []
    if not isinstance(sch, list) or not sch or not all(isinstance(x, str) for x in sch):
        raise ParameterError("predictors.transfer.schedulers", sch, "a non-empty list of scheduler names")
    _distinct("predictors.transfer.schedulers", sch)
    transfer = PredictorTransferConfig(**{**t, "regions": tuple(regs), "schedulers": tuple(sch)})
    return PredictorsConfig(**{**p, "regressor": dict(p.get("regressor") or DEFAULT_REGRESSOR),
                               "ranker": dict(p.get("ranker") or DEFAULT_RANKER), "transfer": transfer})


def build(P: Mapping) -> Config:
    """The typed :class:`Config` of a merged parameter tree (ParameterError on a bad value)."""
    paths = PathsConfig.from_tree(P)
    src = _section(P, "sources")
    standins = _build_standins(_section(P, "standins"))
    sources = {}
    for name, spec in src.items():
        if spec is None:      # `sources: {bailian: null}` leaves a source out of the study
            continue
        if not isinstance(spec, Mapping):
            raise ParameterError(f"sources.{name}", spec, "a mapping with keys " + ", ".join(SOURCE_KEYS))
        unknown = [k for k in spec if k not in SOURCE_KEYS]
        if unknown:
            raise ParameterError(f"sources.{name}.{unknown[0]}", spec[unknown[0]],
                                 "a known key of a source: " + ", ".join(SOURCE_KEYS))
        spec = dict(spec)
        if isinstance(spec.get("columns"), Mapping):
            spec["columns"] = dict(spec["columns"])
        sources[str(name)] = SourceConfig(name=str(name), **spec)
        if standins.of(str(name)) is None and (spec.get("mode") == "standin" or not spec.get("file")):
            raise ParameterError(f"sources.{name}", dict(spec), "for a source of your own: mode real or auto and a "
                                 "file (a path to a trace file: an official format, or CSV / JSONL / parquet "
                                 "with a columns mapping); it has no stand-in")
    if not sources and src:
        raise ParameterError("sources", dict(src), "at least one source (every source is left out with null)")
    engine = EngineConfig.of(dict(_section(P, "engine")))
    sim = _build_simulation(_section(P, "simulation"), engine)
    try:
        return Config(paths=paths, sources=sources, windows=WindowsConfig(**_section(P, "windows")),
                      standins=standins, simulation=sim, engine=engine,
                      campaign=_build_campaign(_section(P, "campaign"), sim.region_loads),
                      analysis=_build_analysis(_section(P, "analysis"), paths.root),
                      attribution=_build_attribution(_section(P, "attribution"), sources, sim.region_loads),
                      validation=_build_validation(_section(P, "validation")),
                      predictors=_build_predictors(_section(P, "predictors"), sim.region_loads),
                      plugins=_build_plugins(P.get("plugins")), tree=copy.deepcopy(dict(P)))
    except TypeError as e:   # a key the dataclass does not have (the schema check catches it first)
        raise ParameterError("parameters", str(e), "the keys of papermill_params/default.yaml") from None
