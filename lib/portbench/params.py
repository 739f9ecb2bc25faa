"""Parameter files for notebooks, the CLI and tests: read and merged into a typed :class:`Config`
(:mod:`portbench.core.config`), then every name checked against the layer that knows it (schedulers,
profiles and metrics in :mod:`portbench.sim`, the analysis' metric and condition names in
:mod:`portbench.study.analysis`, the vLLM model config in :mod:`portbench.validation`).

Notebooks take two papermill parameters, ``params_file`` and ``overrides`` (a nested dict or
``{"dotted.key": value}``), and call :func:`load`.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import validation
from .core import outputs, plugins
from .core.config import (  # noqa: F401
    DEFAULT_FILE,
    OPEN_MAPS,
    SOURCE_MODES,
    Config,
    PathsConfig,
    build,
    deep_merge,
    project_root,
    read,
    undot,
)
from .core.errors import ParameterError
from .sim import settings as sim_settings
from .study import analysis


def load(params_file: str | os.PathLike | None = None, overrides: dict | None = None,
         *, validate: bool = True, claim: bool = True) -> Config:
    """Read a parameter file (default: default.yaml), apply ``overrides``, build the typed config, load
    its plug-ins (``plugins``: files or modules, e.g. ones registering schedulers) and (``validate``)
    check every name against its registry; ParameterError names the parameter and what is allowed. With
    ``validate`` and ``claim`` (a run that writes), the output folders are claimed (:func:`claim_outputs`)."""
    cfg = build(read(params_file, overrides))
    if cfg.paths.run_name:
        outputs.protect_tracked(f"run {cfg.paths.run_name!r} is not the default study")
        check_own_folders(cfg.paths)
    plugins.load(cfg.plugins)
    if validate:
        validate_config(cfg)
        if claim:
            claim_outputs(cfg.paths)
    return cfg


def check_own_folders(paths) -> None:
    """A study of the user's own keeps its frozen files (manifest, hybrids, window cache) and its outputs in folders
    of its own: a ``paths`` value other than default.yaml's that puts them beside the default study's committed files
    (a folder holding files git tracks, such as ``data/windows/`` or ``figures/``) is a ParameterError."""
    default = PathsConfig.from_tree(read(None))
    root = Path(paths.root)
    keys = {"manifest": Path(paths.manifest).parent, "results_dir": paths.results_dir,
            "figures_dir": paths.figures_dir, "windows_dir": paths.windows_dir}
    tracked = None
    for key, folder in keys.items():
        value = getattr(paths, key)
        if value is None or Path(value) == Path(getattr(default, key)):
            continue                     # the default study's own value: read (its frozen files), never written
        if tracked is None:
            tracked = outputs.tracked_files(root) or set()
        folder = Path(folder).resolve()
        held = sorted(p for p in tracked if p.parent == folder)
        if held:
            raise ParameterError(f"paths.{key}", str(value), "a folder of your own, not one holding the default "
                                 f"study's committed files ({', '.join(p.name for p in held[:3])} in "
                                 f"{folder.relative_to(root) if folder.is_relative_to(root) else folder}): leave "
                                 f"paths.{key} out (your study's files go under build/<run name>/) or name a new folder")


def claim_outputs(paths) -> None:
    """Make this run's output folders portbench's own (:func:`portbench.core.outputs.claim`): results, figures,
    the window cache, the canonical tables and the build folder are created and marked, or used when marked; a
    folder holding a user's files (no marker) is refused before anything is written."""
    folders = (("BUILD (the build folder)", paths.build_dir), ("paths.results_dir", paths.results_dir),
               ("paths.figures_dir", paths.figures_dir), ("paths.windows_dir", paths.windows_dir),
               ("paths.data_dir", Path(paths.data_dir) / "canonical"))
    for param, folder in folders:
        try:
            outputs.claim(folder, paths.root)
        except outputs.OutputFolderError as e:
            raise ParameterError(param, str(folder), f"a folder portbench may write into: {e}") from None


def validate_config(cfg: Config) -> None:
    """The checks that need a registry (the values' types and ranges were checked by ``build``)."""
    sim_settings.validate(cfg.simulation)
    analysis.validate(cfg.analysis, cfg.simulation, cfg.source_names())
    validation.validate(cfg.validation, cfg.simulation.region_loads)
