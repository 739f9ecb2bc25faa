"""The wall-clock engine's parts that need no vLLM (validation/engine.py, stages.py, gpu.py): where each policy runs,
the replay specs' contract, the machine speed, the engine's explicit settings, the window cut, the GPU design's size,
and that the old per-request key path is gone. Hand-computed cases; no engine starts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from portbench.core.errors import ParameterError
from portbench.sim import profiles
from portbench.validation import design, engine, gpu, stages

LIB = Path(__file__).resolve().parents[1] / "lib" / "portbench"


def _settings(**kw):
    base = dict(model="tiny_llama_131k", token_scale=1.0, max_num_batched_tokens=2048, max_num_seqs=256,
                block_size=32, num_blocks=5045, max_model_len=131072, device="cpu")
    return engine.Settings(**{**base, **kw})


def test_the_planted_policy_runs_as_its_own_scheduler_class():
    p = engine.placement(engine.PLANTED, {}, _settings())
    assert p.scheduler_cls == engine.PLANTED_SCHEDULER and p.budget is None and p.options == {}


def test_every_study_policy_runs_as_its_class_and_sarathi_with_its_budget():
    from portbench.sim import schedulers

    S = _settings()
    p = engine.placement("sarathi", {"prefill_token_budget": 512, "chunked_prefill": True}, S)
    assert p.budget == 512 and p.scheduler_cls == "portbench.vllm.FCFS"     # an engine-wide setting: its instance
    las = engine.placement("las", {"quantum_tokens": 32}, S)
    assert las.scheduler_cls == "portbench.vllm.LAS" and las.options == {"portbench": {"quantum_tokens": 32}}
    for name in ("fcfs", "sjf_prompt", "sjf_oracle", "rr", "mlfq", "srpt_oracle", "random"):
        assert engine.placement(name, dict(schedulers.SCHEDULERS[name].option_defaults()), S).scheduler_cls \
            .startswith("portbench.vllm.")


def test_the_engine_reads_the_designs_specs():
    sides = [design.Side("key", "azure", "fcfs", "sjf_prompt", ("azure-1", "azure-2"), 4)]
    specs = design.replay_specs(sides, 0)
    rows = [engine.spec_dict(r) for r in specs.iter_rows(named=True)]
    assert len(rows) == 2 * 4 * 2 and all(set(engine.SPEC_COLUMNS) <= set(r) for r in rows)
    # the A/A replays in slot b are the ones that go to the twin instance
    aa = [r for r in rows if r["is_aa"]]
    assert aa and {r["slot"] for r in aa} == {"a", "b"}
    assert engine.spec_dict({k: 0 for k in ("case", "source", "window", "policy", "pair", "is_aa")} | {"position": 1})[
        "slot"] == "b"
    with pytest.raises(Exception, match="missing"):
        engine.spec_dict({"case": "x"})


def test_machine_speed_is_measured_over_tabled_step_time():
    table = profiles.get_profile(profiles.DEFAULT_PROFILE)
    P, B, C, A = [0, 64, 0], [4, 0, 8], [400, 64, 900], [0, 2080, 0]
    tabled = np.array([table.iteration_time(0, 4, 400), table.iteration_time(64, 0, 64, 2080),
                       table.iteration_time(0, 8, 900)])
    steps = pl.DataFrame({"prefill_tokens": P, "decode_seqs": B, "context_tokens": C, "attention_pairs": A,
                          "iteration_s": (tabled * np.array([2.0, 3.0, 2.5])).tolist()})
    assert engine.speed(steps, table) == pytest.approx(2.5)
    assert math.isnan(engine.speed(steps.head(0), table)) and math.isnan(engine.speed(steps, None))


def test_the_engines_settings_are_the_campaigns_explicitly(tmp_params):
    P = tmp_params(base="papermill_params/default.yaml")
    base = profiles.get_profile(P.simulation.profile)
    S = engine.settings_for(P.validation.cpu, base, device="cpu")
    assert (S.max_num_batched_tokens, S.max_num_seqs, S.max_model_len, S.token_scale) == (2048, 256, 131072, 1.0)
    assert S.num_blocks == math.ceil(161_392 / 32) + 1 and S.kv_tokens >= 161_392
    g = engine.settings_for(P.validation.gpu, base, device="cuda")
    assert (g.max_num_batched_tokens, g.max_num_seqs, g.max_model_len, g.block_size, g.num_blocks) == (
        2048, 256, 131072, 16, base.kv_capacity_blocks + 1)
    # a model whose context cannot hold the engine's: refused, naming the parameter
    import dataclasses
    with pytest.raises(ParameterError, match="model_config"):
        engine.settings_for(dataclasses.replace(P.validation.cpu, model_config="tiny_llama"), base, device="cpu")
    # KV memory of the tiny model at the campaign's cache: ~165 MB (+25 % headroom)
    assert 160e6 < S.spec().kv_bytes() / 1.25 < 170e6


def test_a_window_is_cut_to_its_first_seconds():
    df = pl.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "prompt_tokens": [1] * 6, "output_tokens": [1] * 6})
    assert stages.cut(df, 6.0, 1.5, 2)["arrival_s"].to_list() == [0.0, 1.0, 2.0, 3.0, 4.0]    # arrivals <= 4 s
    assert stages.cut(df, 1.5, 1.5, 3).height == 3                                            # at least 3
    assert stages.cut(df, None, 1.5, 3).height == 6


def test_the_gpu_design_is_sized_to_the_time_left():
    # 4 sides x k windows x 2 pairs x 2 replays x (20 s + overhead) within 900 s: k = 900 // (16 x 23) = 2
    assert gpu.windows_that_fit([20.0], 4, 2, 900.0, 10) == 2
    assert gpu.windows_that_fit([20.0], 4, 2, 9000.0, 10) == 10 and gpu.windows_that_fit([20.0], 4, 2, 1.0, 10) == 2


def test_the_old_per_request_key_path_is_gone():
    """The wall-clock engine runs each policy as a scheduler class on its own instance: nothing in the package keys
    requests by a policy named in their id any more."""
    old = re.compile(r"DYNAMIC_KEYS|dynamic_key|\bdisplace\(|policies\.Live|policy_of\(request|_pb_rekey|"
                     r"PORTBENCH_VLLM_POLICY_OPTIONS")
    hits = [f"{p.relative_to(LIB)}:{i}" for p in LIB.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if old.search(line)]
    assert hits == []


class _StandIn:
    """A stand-in for a started engine instance: records what the replay saw."""

    def __init__(self):
        self.calls: list[str] = []

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset")
        return True

    def replay(self, reqs, *, horizon_s, policy, rejected, window_df, tag):
        import gc

        self.calls.append(f"replay gc_enabled={gc.isenabled()} frozen={gc.get_freeze_count() > 0}")
        n = len(reqs)
        return pl.DataFrame({"req_id": list(range(n)), "arrival_s": [0.0] * n, "first_token_s": [0.1] * n,
                             "finish_s": [0.2] * n, "prompt_tokens": [4] * n, "output_tokens": [2] * n,
                             "generated_tokens": [2] * n, "preemptions": [0] * n, "rejected": [False] * n,
                             "tenant": ["t"] * n})


@pytest.mark.parametrize("caching", [True, False])
def test_every_replay_starts_with_an_empty_prefix_cache_and_the_gc_frozen(tmp_path, caching):
    import gc

    S = _settings(prefix_caching=caching)
    E = engine.Engine(S, {}, out=tmp_path, vocab=1000)
    fake = _StandIn()
    inst = engine.Instance("fcfs@engine", engine.placement("fcfs", {}, S), fake, tmp_path / "none.jsonl")
    df = pl.DataFrame({"arrival_s": [0.0, 0.5], "prompt_tokens": [4, 4], "output_tokens": [2, 2]})
    for _ in range(2):
        got = E.replay(inst, df, 10.0, tag="t", prompt_seed=1)
        assert got["prefix_cache_reset"] is caching and got["gc_frozen"]
    want = (["reset"] if caching else []) + ["replay gc_enabled=False frozen=True"]
    assert fake.calls == want * 2
    assert gc.isenabled() and gc.get_freeze_count() == 0      # as it was after each replay
