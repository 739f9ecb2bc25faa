"""Parameters: YAML files read and merged, then built once into typed, validated config objects.

A parameter file is YAML. ``extends: other.yaml`` (relative to the file, else one of the project's
own files in ``papermill_params/`` by name, e.g. ``extends: default.yaml``) merges the file over
another one, so ``smoke.yaml`` and sweep points only state what they change. ``default.yaml``
is also the schema: a key that it does not have is an error (a typo never goes unnoticed),
except inside the *open maps* listed below, whose keys are names chosen by the user.
Relative paths under ``paths`` are resolved against the project root.

:func:`read` gives the merged tree (plain dicts); :func:`build` turns it into a :class:`Config` of
frozen dataclasses, one per section (:class:`PathsConfig`, :class:`SourceConfig`, :class:`WindowsConfig`,
:class:`StandinsConfig`, :class:`SimulationConfig`, :class:`EngineConfig`, :class:`CampaignConfig`,
:class:`AnalysisConfig`, :class:`AttributionConfig`, :class:`ValidationConfig`,
:class:`PredictorsConfig`), checking every value's type and range (ParameterError naming the
parameter and what is allowed). Names that only a registry knows (schedulers, metrics, profiles)
are checked by the layer that owns the registry; :func:`portbench.params.load` runs those checks.
Functions take the section they use (``simulate(..., sim: SimulationConfig)``), not the tree.

The module joins three, one job each, and re-exports their names (``from portbench.core.config import X``
keeps working): :mod:`.paramfile` (files, the ``extends`` chain, schema, isolation: :func:`read`),
:mod:`.sections` (the typed sections, each validated where it is built: :func:`build`) and :mod:`.paramdocs`
(the documentation of every key, from ``default.yaml``'s comments)."""

from __future__ import annotations

import os

from .paramdocs import key_doc, parameter_docs
from .paramfile import (build_base, BUILD_DIR, BUILD_ENV, check_path_value, deep_merge, DEFAULT_FILE,
    DISPLAY_KEYS, frozen_record, FROZEN_SECTIONS, ISOLATED_PATHS, label_follows_data, looks_like_file,
    NEUTRAL_OVERRIDES, OPEN_MAPS, OUTPUT_PATH_KEYS, PARAMS_DIR, project_root, read, resolve_extends, run_name_of,
    undot)
from .sections import (AnalysisConfig, AnalysisInputs, ATTRIBUTION_DISTANCES, ATTRIBUTION_PROPERTIES, AttributionConfig,
    BailianStandinConfig, BATCHING_MODES, build, BurstGPTStandinConfig, CampaignConfig, COLUMN_ROLES, Config,
    CORRECTIONS, CounterfactualConfig, CV_CHOICES, DataSettings, DEFAULT_RANKER, DEFAULT_REGRESSOR, DEVICES,
    EngineConfig, EXECUTORS, FAMILIES, GENERIC_FORMATS, KV_BLOCKS, PathsConfig, PlanSettings, PowerConfig, PredictorsConfig,
    PredictorTransferConfig, PREEMPTION_MODES, PREFIX_CACHING_MODES, RANKER_KEYS, RATE_CHOICES, REGRESSOR_KEYS,
    RequestRecordsConfig, REQUIRED_ROLES, SimulationConfig, SloConfig, SOURCE_KEYS, SOURCE_MODES,
    SOURCE_NAME_PATTERN, SourceConfig, StandinsConfig, StepGridConfig, StudyPresetConfig, TENANT_MODELS,
    TIE_CORRECTIONS, TIE_RULES, TIME_UNITS, ValidationConfig, VllmEngineConfig, WindowsConfig)


def load(params_file: str | os.PathLike | None = None, overrides: dict | None = None) -> Config:
    """:func:`read` then :func:`build` (structural validation only; see :func:`portbench.params.load`)."""
    return build(read(params_file, overrides))


__all__ = ["AnalysisConfig", "AnalysisInputs", "ATTRIBUTION_DISTANCES", "ATTRIBUTION_PROPERTIES", "AttributionConfig",
           "BailianStandinConfig", "BATCHING_MODES", "build", "build_base", "BUILD_DIR", "BUILD_ENV",
           "BurstGPTStandinConfig", "CampaignConfig", "check_path_value", "COLUMN_ROLES", "Config",
           "CORRECTIONS", "CounterfactualConfig", "CV_CHOICES", "DataSettings", "deep_merge",
           "DEFAULT_FILE", "DEFAULT_RANKER", "DEFAULT_REGRESSOR", "DEVICES", "DISPLAY_KEYS",
           "EngineConfig", "EXECUTORS", "FAMILIES", "frozen_record", "FROZEN_SECTIONS", "GENERIC_FORMATS",
           "ISOLATED_PATHS", "key_doc", "KV_BLOCKS", "label_follows_data", "load", "looks_like_file",
           "NEUTRAL_OVERRIDES", "OPEN_MAPS", "OUTPUT_PATH_KEYS", "parameter_docs", "PARAMS_DIR",
           "PathsConfig", "PlanSettings", "PowerConfig", "PredictorsConfig", "PredictorTransferConfig", "PREEMPTION_MODES",
           "PREFIX_CACHING_MODES", "project_root", "RANKER_KEYS", "RATE_CHOICES", "read", "REGRESSOR_KEYS",
           "RequestRecordsConfig", "REQUIRED_ROLES", "resolve_extends", "run_name_of", "SimulationConfig",
           "SloConfig", "SOURCE_KEYS", "SOURCE_MODES", "SOURCE_NAME_PATTERN", "SourceConfig",
           "StandinsConfig", "StepGridConfig", "StudyPresetConfig", "TENANT_MODELS", "TIE_CORRECTIONS",
           "TIE_RULES", "TIME_UNITS", "undot", "ValidationConfig", "VllmEngineConfig", "WindowsConfig"]
