"""Parameter files: schema, extends, overrides, clear errors, sweep expansion."""

from __future__ import annotations

import pytest
import yaml

from portbench import params
from portbench.core.errors import ParameterError
from portbench.notebooks import sweep_points


def test_default_and_smoke_load(root):
    P = params.load()
    assert (P.windows.per_source, P.windows.size, P.windows.tenants) == (40, 200, 4)
    S = params.load("papermill_params/smoke.yaml")
    assert S.simulation.replicates == 1
    assert S.windows == P.windows, "smoke must use the committed manifest's windows"
    assert str(S.paths.data_dir).startswith(str(root)), "relative paths resolve against the project root"


def test_unknown_key_names_the_parameter_and_the_known_ones():
    with pytest.raises(ParameterError) as e:
        params.load(overrides={"simulation.schedulerz": ["fcfs"]})
    msg = str(e.value)
    assert "simulation.schedulerz" in msg and "simulation.schedulers" in msg


def test_unknown_source_mode_is_rejected():
    with pytest.raises(ParameterError, match=r"sources\.azure\.mode.*real, standin, auto"):
        params.load(overrides={"sources": {"azure": {"mode": "maybe"}}})


def test_open_maps_accept_new_names():
    P = params.load(overrides={"simulation.slo": {"strict": {"ttft_s": 0.2, "tpot_s": 0.03}}})
    assert "strict" in P.simulation.slo and "tight" in P.simulation.slo
    assert P.simulation.slo["strict"].ttft_s == 0.2


def test_extends_chain_and_cycle(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"extends": "b.yaml", "windows": {"size": 50}}))
    b.write_text(yaml.safe_dump({"extends": "a.yaml"}))
    with pytest.raises(ParameterError, match="cycle"):
        params.load(a)
    b.write_text(yaml.safe_dump({"windows": {"per_source": 5, "size": 10}}))
    P = params.load(a, validate=False)
    assert (P.windows.per_source, P.windows.size) == (5, 50)


def test_missing_file_and_bad_values(tmp_path):
    with pytest.raises(ParameterError, match="params_file"):
        params.load(tmp_path / "nope.yaml")
    with pytest.raises(ParameterError, match="windows.size"):
        params.load(overrides={"windows.size": -3})


def test_config_is_typed_frozen_and_picklable():
    import dataclasses
    import pickle

    P = params.load()
    assert isinstance(P, params.Config) and P.simulation.slo["medium"].tpot_s == 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        P.simulation.seed = 3
    assert pickle.loads(pickle.dumps(P)) == P
    Q = P.with_overrides({"simulation.replicates": 1})
    assert Q.simulation.replicates == 1 and P.simulation.replicates == 3


def test_undot_merges_nested_and_dotted():
    assert params.undot({"a.b": 1, "a": {"c": 2}}) in ({"a": {"b": 1, "c": 2}},)


def test_sweep_grid_is_the_cartesian_product():
    pts = sweep_points({"grid": {"x.a": [1, 2], "y": ["u", "v", "w"]}})
    assert len(pts) == 6 and {"x.a": 2, "y": "w"} in pts
    with pytest.raises(ParameterError):
        sweep_points({"grid": {"x": []}})


def test_every_parameter_is_documented_in_default_yaml():
    """`portbench params` prints each key's documentation from default.yaml's comments: none may be empty
    (a key of a one-line mapping shares that line's comment; a name in an open map, the map's)."""
    from portbench.cli import _leaves
    from portbench.core.config import key_doc, parameter_docs

    docs = parameter_docs()
    tree = {k: v for k, v in params.load().tree.items() if not k.startswith("_")}
    leaves = [k for k, _ in _leaves(tree)]
    assert len(leaves) > 100 and "analysis.alpha" in leaves and "predictors.regressor.max_iter" in leaves
    missing = [k for k in leaves if not key_doc(docs, k)]
    assert not missing, f"undocumented in papermill_params/default.yaml: {missing}"
    assert key_doc(docs, "simulation.replicates") and key_doc(docs, "sources.azure").startswith("(in sources)")
    assert "HistGradientBoostingRegressor" in key_doc(docs, "predictors.regressor.max_iter")


def test_parameter_docs_reads_comments_above_inline_and_continued(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("# a section\nsec:\n  # above\n  a: 1    # inline\n  b: {x: 1, y: 2}   # shared\n"
                 "            # continued\n  c: 3\n")
    from portbench.core.config import parameter_docs

    d = parameter_docs(f)
    assert d["sec"] == "a section" and d["sec.a"] == "above inline" and d["sec.c"] == ""
    assert d["sec.b"] == "shared continued" and d["sec.b.x"] == d["sec.b.y"] == "(in sec.b) shared continued"


@pytest.mark.parametrize("text, want", [("off", "off"), ("false", "off"), ("no", "off"), ("auto", "auto")])
def test_on_off_choice_accepts_yaml_booleans(text, want):
    """`--set engine.prefix_caching=off`: YAML reads an unquoted off (false, no) as False, which means off."""
    from portbench.cli import _kv

    key, value = _kv(f"engine.prefix_caching={text}")
    P = params.load(overrides=params.undot({key: value}))
    assert P.simulation.engine.prefix_caching == want
    with pytest.raises(ParameterError, match="one of auto, off"):   # True has no word among auto / off
        params.load(overrides={"engine": {"prefix_caching": True}})


def test_the_settings_bundles_are_the_configs_own_sections():
    """cfg.data and cfg.analysis_inputs: the sections the data layer's readers and the analysis read, the same
    objects as the Config's (no copy, nothing else)."""
    cfg = params.load(overrides={"sources": {"azure_code": None}})
    d = cfg.data
    assert (d.paths, d.sources, d.standins) == (cfg.paths, cfg.sources, cfg.standins)
    assert d.sources is cfg.sources and "azure_code" not in d.sources
    a = cfg.analysis_inputs
    assert (a.analysis, a.window_size, a.simulation, a.paths) == (cfg.analysis, cfg.windows.size, cfg.simulation,
                                                                   cfg.paths)
    assert a.source_names() == cfg.source_names() and a.display_names == cfg.display_names
