"""Parameters: YAML files read and merged, then built once into typed, validated config objects.

A parameter file is YAML. ``extends: other.yaml`` (relative to the file) merges the file over
another one, so ``smoke.yaml`` and sweep points only state what they change. ``default.yaml``
is also the schema: a key that it does not have is an error (a typo never goes unnoticed),
except inside the *open maps* listed below, whose keys are names chosen by the user.
Relative paths under ``paths`` are resolved against the project root.

:func:`read` gives the merged tree (plain dicts); :func:`build` turns it into a :class:`Config` of
frozen dataclasses, one per section (:class:`PathsConfig`, :class:`SourceConfig`, :class:`WindowsConfig`,
:class:`StandinsConfig`, :class:`SimulationConfig`, :class:`CampaignConfig`, :class:`AnalysisConfig`,
:class:`ValidationConfig`), checking every value's type and range (ParameterError naming the
parameter and what is allowed). Names that only a registry knows (schedulers, metrics, profiles)
are checked by the layer that owns the registry; :func:`portbench.params.load` runs those checks.
Functions take the section they use (``simulate(..., sim: SimulationConfig)``), not the tree.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import ParameterError, check_choice

DEFAULT_FILE = "papermill_params/default.yaml"

# Maps whose keys the user names freely (a new SLO, region, source ...).
OPEN_MAPS = {
    "sources",
    "simulation.region_loads",
    "simulation.slo",
    "simulation.scheduler_options",
}
SOURCE_MODES = ("real", "standin", "auto")


def project_root() -> Path:
    """The folder holding ``papermill_params/default.yaml`` (searched upward from the cwd)."""
    env = os.environ.get("PORTBENCH_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / DEFAULT_FILE).is_file():
            return d
    pkg_root = Path(__file__).resolve().parents[2]
    if (pkg_root / DEFAULT_FILE).is_file():
        return pkg_root
    return here


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ParameterError("params_file", str(path), "an existing YAML parameter file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParameterError("params_file", str(path), f"valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ParameterError("params_file", str(path), "a YAML mapping at the top level")
    return data


def _read_chain(path: Path, seen: tuple = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ParameterError("extends", str(path), "no cycle of extends")
    data = _read_yaml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    return deep_merge(_read_chain((path.parent / base), seen + (path,)), data)


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base`` (dicts merge recursively, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def undot(flat: dict) -> dict:
    """``{"a.b": 1, "c": {"d": 2}}`` -> ``{"a": {"b": 1}, "c": {"d": 2}}``."""
    out: dict = {}
    for k, v in (flat or {}).items():
        parts = str(k).split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ParameterError(k, v, "a key path that does not pass through a scalar")
        if isinstance(v, dict) and isinstance(d.get(parts[-1]), dict):
            d[parts[-1]] = deep_merge(d[parts[-1]], undot(v))
        else:
            d[parts[-1]] = undot(v) if isinstance(v, dict) else v
    return out


def _check_schema(params: dict, schema: dict, prefix: str = "") -> None:
    for k, v in params.items():
        name = f"{prefix}{k}"
        if k not in schema:
            raise ParameterError(name, v, "a known parameter: " + ", ".join(f"{prefix}{s}" for s in schema))
        if name in OPEN_MAPS:
            continue
        if isinstance(schema[k], dict) and schema[k]:
            if not isinstance(v, dict):
                raise ParameterError(name, v, "a mapping with keys " + ", ".join(schema[k]))
            _check_schema(v, schema[k], name + ".")


def read(params_file: str | os.PathLike | None = None, overrides: dict | None = None) -> dict:
    """The merged parameter tree: a file (default: default.yaml) over the defaults, then ``overrides``;
    keys checked against the schema; relative paths resolved against the project root."""
    root = project_root()
    default_path = root / DEFAULT_FILE
    path = Path(params_file) if params_file else default_path
    if not path.is_absolute():
        path = root / path if (root / path).exists() or not path.exists() else path.resolve()
    schema = _read_chain(default_path) if default_path.is_file() else {}
    P = _read_chain(path)
    if schema:
        P = deep_merge(schema, P)
    P = deep_merge(P, undot(overrides or {}))
    if schema:
        _check_schema(P, schema)
    P["_params_file"] = str(path)
    P["_root"] = str(root)
    for key, value in P.get("paths", {}).items():
        if isinstance(value, str) and key != "mirror_env":
            P["paths"][key] = str((root / value) if not Path(value).is_absolute() else Path(value))
    return P


def load(params_file: str | os.PathLike | None = None, overrides: dict | None = None) -> "Config":
    """:func:`read` then :func:`build` (structural validation only; see :func:`portbench.params.load`)."""
    return build(read(params_file, overrides))


# --------------------------------------------------------------------------------------------
# Typed sections. Each is frozen: a config is built once and read everywhere.
# --------------------------------------------------------------------------------------------


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
    """Where things are: the project root, the parameter file, data, manifest, results, figures and
    the configured data mirror (None: ``$PORTBENCH_DATA_MIRROR``, else ``../shared/traces``)."""

    root: Path
    params_file: Path
    data_dir: Path
    manifest: Path
    results_dir: Path
    figures_dir: Path
    mirror: Path | None = None

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
        return cls(root=root, params_file=Path(P.get("_params_file") or root / DEFAULT_FILE),
                   data_dir=path("data_dir", "data"), manifest=path("manifest", "data/windows/manifest.json"),
                   results_dir=path("results_dir", "data/results"), figures_dir=path("figures_dir", "figures"),
                   mirror=(Path(mirror) if Path(mirror).is_absolute() else root / mirror) if mirror else None)


SOURCE_NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
BUILTIN_SOURCES = ("azure", "burstgpt", "bailian")


@dataclass(frozen=True)
class SourceConfig:
    """One workload source: which file it reads and whether it is real, a stand-in, or real when the
    file is present (``auto``)."""

    name: str
    mode: str = "auto"
    file: str | None = None

    def __post_init__(self):
        import re

        if not re.match(SOURCE_NAME_PATTERN, str(self.name)):
            raise ParameterError("sources", self.name, f"a source name matching {SOURCE_NAME_PATTERN} "
                                 f"(built in: {', '.join(BUILTIN_SOURCES)})")
        check_choice(f"sources.{self.name}.mode", self.mode, SOURCE_MODES)
        if self.file is not None and not isinstance(self.file, str):
            raise ParameterError(f"sources.{self.name}.file", self.file, "a file name or path")


@dataclass(frozen=True)
class WindowsConfig:
    """Frozen windows: how many per source, requests per window, placement seed, seeded tenants."""

    per_source: int = 40
    size: int = 200
    seed: int = 0
    tenants: int = 4

    def __post_init__(self):
        for key in ("per_source", "size"):
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
    return tuple(v)


@dataclass(frozen=True)
class SimulationConfig:
    """What one simulated run is: profile, schedulers and their options, regions and their loads,
    capacity policy, observation horizon, replicates, base seed, predictor noise, SLO definitions."""

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

    def __post_init__(self):
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

    def __post_init__(self):
        check_choice("campaign.executor", self.executor, EXECUTORS)
        _int("campaign.workers", self.workers, 1, "a positive integer (worker processes)")
        a = self.dask_address
        if a is not None and not (isinstance(a, str) and a.strip()):
            raise ParameterError("campaign.dask_address", a, "null (a LocalCluster) or a scheduler address "
                                 "such as tcp://host:8786")
        w = self.windows_per_source
        if w is not None:
            _int("campaign.windows_per_source", w, 1, "null (every window) or a positive integer")


FAMILIES = ("all", "per_metric", "per_region")
CORRECTIONS = ("holm", "fdr_bh")


@dataclass(frozen=True)
class AnalysisConfig:
    """The portability analysis: metrics, significance and practical size, ties, correction and
    family, bootstrap, critical-difference conditions, headline metrics, an optional runs file."""

    metrics: str | tuple[str, ...] = "all"
    alpha: float = 0.05
    delta: float = 0.05
    rank_tolerance: float = 0.01
    correction: str = "holm"
    family: str = "all"
    bootstrap: int = 1000
    seed: int = 0
    cd_conditions: str | tuple[tuple[str, str, str], ...] = "auto"
    headline_metrics: tuple[str, ...] = ()
    runs_file: Path | None = None

    def __post_init__(self):
        if not _is_num(self.alpha) or not 0 < self.alpha < 1:
            raise ParameterError("analysis.alpha", self.alpha, "a number strictly between 0 and 1")
        if not _is_num(self.delta) or not 0 <= self.delta <= 2:
            raise ParameterError("analysis.delta", self.delta, "a relative difference between 0 and 2 (0.05 = 5%)")
        check_choice("analysis.correction", self.correction, CORRECTIONS)
        check_choice("analysis.family", self.family, FAMILIES)
        _int("analysis.bootstrap", self.bootstrap, 0, "a non-negative integer (0 = no CIs)")
        _int("analysis.seed", self.seed)
        if not _is_num(self.rank_tolerance) or not 0 <= self.rank_tolerance < 1:
            raise ParameterError("analysis.rank_tolerance", self.rank_tolerance,
                                 "a relative difference in [0, 1) (0.01 = means within 1% are tied; 0 = exact ties only)")


DEVICES = ("auto", "cuda", "cpu")
KV_BLOCKS = ("profile", "engine")


@dataclass(frozen=True)
class ValidationConfig:
    """The real-engine (vLLM) replay: model config, windows, vLLM version, device and engine settings."""

    model_config: str = "llama3_8b"
    max_windows: int = 10
    vllm_version: str | None = None
    device: str = "auto"
    kv_blocks: str | int = "profile"
    calibration_requests: int = 200
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.model_config, str) or not self.model_config:
            raise ParameterError("validation.model_config", self.model_config, "a model config name or folder")
        for key in ("max_windows", "calibration_requests"):
            _int(f"validation.{key}", getattr(self, key), 1, "a positive integer")
        if self.vllm_version is not None and not isinstance(self.vllm_version, str):
            raise ParameterError("validation.vllm_version", self.vllm_version, "null or a version string")
        check_choice("validation.device", self.device, DEVICES)
        kb = self.kv_blocks
        if not (kb in KV_BLOCKS or (_is_int(kb) and kb > 0)):
            raise ParameterError("validation.kv_blocks", kb, "profile, engine or a positive integer")
        g = self.gpu_memory_utilization
        if not _is_num(g) or not 0 < g <= 1:
            raise ParameterError("validation.gpu_memory_utilization", g, "a number in (0, 1]")
        if not isinstance(self.enforce_eager, bool):
            raise ParameterError("validation.enforce_eager", self.enforce_eager, "true or false")
        if not isinstance(self.dtype, str):
            raise ParameterError("validation.dtype", self.dtype, "a vLLM dtype string (auto, bfloat16, float16, float32)")
        if not _is_int(self.seed):
            raise ParameterError("validation.seed", self.seed, "an integer")


@dataclass(frozen=True)
class Config:
    """The whole parameter set, built once by :func:`build` (``tree`` keeps the merged YAML tree, for
    fingerprints and for printing the effective parameters)."""

    paths: PathsConfig
    sources: dict            # name -> SourceConfig (sources left out with ``null`` are absent)
    windows: WindowsConfig
    standins: StandinsConfig
    simulation: SimulationConfig
    campaign: CampaignConfig
    analysis: AnalysisConfig
    validation: ValidationConfig
    tree: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def params_file(self) -> Path:
        return self.paths.params_file

    def source_names(self) -> list[str]:
        """The configured sources, the built-in ones first in study order, then the user's own."""
        return ([s for s in BUILTIN_SOURCES if s in self.sources]
                + [s for s in self.sources if s not in BUILTIN_SOURCES])

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


def _build_simulation(s: Mapping) -> SimulationConfig:
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
    })


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
    if not isinstance(hm, list) or not all(isinstance(m, str) for m in hm):
        raise ParameterError("analysis.headline_metrics", hm, "a list of metric names")
    rf = a.get("runs_file")
    if rf is not None and not isinstance(rf, str):
        raise ParameterError("analysis.runs_file", rf, "null or a path to a runs parquet file")
    return AnalysisConfig(**{**a, "metrics": _names("analysis.metrics", a.get("metrics", "all")),
                             "cd_conditions": cd, "headline_metrics": tuple(hm),
                             "runs_file": (Path(rf) if Path(rf).is_absolute() else root / rf) if rf else None})


def build(P: Mapping) -> Config:
    """The typed :class:`Config` of a merged parameter tree (ParameterError on a bad value)."""
    paths = PathsConfig.from_tree(P)
    src = _section(P, "sources")
    sources = {}
    for name, spec in src.items():
        if spec is None:      # `sources: {bailian: null}` leaves a source out of the study
            continue
        if not isinstance(spec, Mapping):
            raise ParameterError(f"sources.{name}", spec, "a mapping with keys mode, file")
        sources[str(name)] = SourceConfig(name=str(name), **spec)
        if name not in BUILTIN_SOURCES and (spec.get("mode") == "standin" or not spec.get("file")):
            raise ParameterError(f"sources.{name}", dict(spec), "for a source of your own: mode real or auto and a "
                                 "file (a path to a trace in a supported format); it has no stand-in")
    sim = _build_simulation(_section(P, "simulation"))
    try:
        return Config(paths=paths, sources=sources, windows=WindowsConfig(**_section(P, "windows")),
                      standins=_build_standins(_section(P, "standins")), simulation=sim,
                      campaign=_build_campaign(_section(P, "campaign"), sim.region_loads),
                      analysis=_build_analysis(_section(P, "analysis"), paths.root),
                      validation=ValidationConfig(**_section(P, "validation")), tree=copy.deepcopy(dict(P)))
    except TypeError as e:   # a key the dataclass does not have (the schema check catches it first)
        raise ParameterError("parameters", str(e), "the keys of papermill_params/default.yaml") from None
