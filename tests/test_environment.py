"""The environment files agree: pyproject.toml, environment.yml and the constraints lock."""

from __future__ import annotations

import re
import tomllib

import yaml


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject(root):
    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in meta["dependencies"]}
    extras = meta["optional-dependencies"]
    # dask[distributed] is the dask package plus the distributed package
    dist = {_name(r) for r in extras["dist"]} | ({"distributed"} if any("distributed" in r for r in extras["dist"]) else set())
    return core, {_name(r) for r in extras["dev"]}, dist, {_name(r) for r in extras["gpu"]}


def _conda(root):
    env = yaml.safe_load((root / "environment.yml").read_text())
    names = {_name(d) for d in env["dependencies"] if isinstance(d, str)}
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return names - {"python", "pip"}, pip


def test_environment_yml_lists_the_same_dependencies_as_pyproject(root):
    core, dev, dist, _gpu = _pyproject(root)
    conda, pip = _conda(root)
    assert conda == core | dev | dist, (
        f"only in environment.yml: {sorted(conda - (core | dev | dist))}; "
        f"only in pyproject.toml: {sorted((core | dev | dist) - conda)}")
    assert any(p.startswith("-e .") for p in pip), "environment.yml must install the package itself"


def test_constraints_pin_every_dependency(root):
    pins = {}
    for line in (root / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[_name(name)] = version.strip()
    core, dev, dist, _gpu = _pyproject(root)
    missing = sorted((core | dev | dist) - set(pins))
    assert not missing, f"constraints.txt does not pin: {missing}"


def test_gpu_extra_pins_vllm(root):
    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("vllm==") for r in meta["optional-dependencies"]["gpu"]), \
        "the [gpu] extra must pin the tested vLLM version"
