"""Learned length predictors and honest information: no frozen-window row is ever a training row,
predictions are deterministic and frozen by fingerprint, the campaign hands them to the runs without
touching the frozen windows, and only the *_oracle policies react when the true lengths are
permuted after prediction."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from portbench import params
from portbench.core.errors import IntegrityError
from portbench.data import predictors as PR
from portbench.data import windows as W
from portbench.data.window_table import columns_of
from portbench.sim import profiles, schedulers
from portbench.sim.request import RUNNING, WAITING, requests_from_window
from portbench.study import campaign


@pytest.fixture(scope="module")
def pcfg(tmp_path_factory, shared_traces):
    """Smoke parameters (small predictor models) with data under a temporary folder."""
    d = tmp_path_factory.mktemp("predictors")
    return params.load("papermill_params/smoke.yaml", params.undot({
        "paths.data_dir": str(d / "data"), "paths.results_dir": str(d / "results"),
        "paths.figures_dir": str(d / "figures"), "paths.mirror": str(shared_traces)}))


@pytest.fixture(scope="module")
def manifest(pcfg):
    return W.load_manifest(pcfg.paths)


@pytest.fixture(scope="module")
def frozen(pcfg, manifest):
    return PR.load_predictions(pcfg.data, pcfg.predictors, PR.all_pairs(manifest), manifest=manifest)


# --------------------------------------------------------------------------- training data


REAL_SOURCES = ("azure", "azure_code", "mooncake")     # every real trace of the study (checked against the manifest)


def test_every_real_source_of_the_manifest_is_checked(manifest):
    real = {e["source"] for e in manifest["windows"] if e["provenance"] == "real"}
    assert real == set(REAL_SOURCES)


@pytest.mark.parametrize("source", REAL_SOURCES)
def test_no_frozen_window_row_is_a_training_row(pcfg, manifest, frozen, source):
    from portbench.data import traces

    canon = traces.load_canonical(pcfg.data, source)
    td = PR.training_data(pcfg.predictors, pcfg.paths, pcfg.standins, manifest, source, canon)
    window_rows = set()
    entries = [e for e in manifest["windows"] if e["source"] == source]
    for e in entries:
        window_rows |= set(range(e["row_start"], e["row_end"] + 1))
    train = set(td.rows.tolist())
    assert not (train & window_rows)
    # every valid row is in exactly one of the two
    valid = set(canon["row"].to_list())
    assert train | (window_rows & valid) == valid
    assert td.record["requests"] == canon.height - len(entries) * 200 == len(train)
    assert td.frame.height == len(train)
    # the predictor the campaign uses recorded exactly these training rows
    rec = frozen[(source, source)].info["training"]
    assert rec["rows_sha256"] == td.record["rows_sha256"] and rec["requests"] == len(train)
    # the windows' tables are rebuilt from exactly those window rows (same lengths, same order)
    tables = W.load_windows(pcfg.data, sources=[source], per_source=3, manifest=manifest)
    frames = PR.window_frames(manifest, source, W.load_windows(pcfg.data, sources=[source], manifest=manifest),
                              canon)
    for wid, df in tables.items():
        assert frames[wid]["output_tokens"].to_list() == df["output_tokens"].to_list()


def test_standin_training_data_is_generator_output_outside_the_windows(pcfg, manifest):
    seeds = {int(e["generator"]["seed"]) for e in manifest["windows"] if e["provenance"] == "standin"}
    bg = PR.training_data(pcfg.predictors, pcfg.paths, pcfg.standins, manifest, "burstgpt")
    assert bg.record["seed"] not in seeds and "stand-in generator output" in bg.record["label"]
    assert bg.frame.height == pcfg.predictors.standin_train_requests and bg.folds is not None
    # cross-fitting: a window request's fold model never saw a training request with its (prompt, tenant)
    tables = W.load_windows(pcfg.data, sources=["burstgpt"], per_source=2, manifest=manifest)
    k = pcfg.predictors.cross_fit_folds
    train_key = {(p, f"{m}/{lt}"): f for p, m, lt, f in zip(bg.frame["prompt_tokens"].to_list(),
                                                           bg.frame["model"].to_list(),
                                                           bg.frame["log_type"].to_list(), bg.folds.tolist())}
    for df in tables.values():
        folds = PR._fold_of(df["prompt_tokens"].to_numpy(), df["tenant"].to_list(), k)
        for p, t, f in zip(df["prompt_tokens"].to_list(), df["tenant"].to_list(), folds.tolist()):
            if (p, t) in train_key:
                assert train_key[(p, t)] == f        # same group -> same fold -> excluded from its model
    bl = PR.training_data(pcfg.predictors, pcfg.paths, pcfg.standins, manifest, "bailian")
    assert bl.record["seed"] not in seeds and bl.frame.height == pcfg.predictors.standin_train_requests
    spans = [(e["t_start"], e["t_start"] + e["duration_s"]) for e in manifest["windows"] if e["source"] == "bailian"]
    t = bl.frame["t_s"].to_numpy()
    for a, b in spans:
        assert not ((t >= a) & (t <= b)).any()


def test_features_are_arrival_time_only(pcfg, manifest):
    from portbench.data import traces

    az = PR.feature_spec(pcfg.predictors, manifest, "azure", traces.load_canonical(pcfg.data, "azure"))
    assert az.columns == ("log_prompt",)                     # 58 min trace: no clock; seeded tenants: no
    assert "seeded synthetic" in az.notes["tenant"] and "not used" in az.notes["time_of_day_h"]
    assert PR.feature_spec(pcfg.predictors, manifest, "burstgpt").columns == ("log_prompt", "model", "log_type")
    assert PR.feature_spec(pcfg.predictors, manifest, "bailian").columns == ("log_prompt", "time_of_day_h", "client")
    for spec in (az,):
        assert not ({"output_tokens", "tenant"} & set(spec.columns))


def test_real_trace_with_turns_and_a_clock_gets_those_features(pcfg):
    """A real Bailian-like canonical table spanning two days carries turn, request type and the clock."""
    n = 1000
    canon = pl.DataFrame({"source": ["bailian"] * n, "file": ["x.jsonl"] * n, "row": np.arange(1, n + 1),
                          "arrival_s": np.linspace(0, 2 * 86400, n), "prompt_tokens": np.arange(1, n + 1),
                          "output_tokens": np.arange(1, n + 1), "session_id": ["s"] * n, "turn": [1, 2] * (n // 2),
                          "req_type": ["text"] * n})
    m = {"windows": [{"id": "bailian-00", "source": "bailian", "provenance": "real"}],
         "sources": {"bailian": {"tenants": {"rule": "seeded"}}}}
    spec = PR.feature_spec(pcfg.predictors, m, "bailian", canon)
    assert spec.numeric == ("log_prompt", "time_of_day_h", "turn") and spec.categorical == ("req_type",)
    enc = PR.Encoder.fit(spec, PR._canonical_frame(canon))
    X = enc.matrix(PR._canonical_frame(canon))
    assert X.shape == (n, 4) and X[:, 1].max() < 24 and set(X[:, 2]) == {1.0, 2.0}


def test_prefix_reuse_uses_the_past_only_and_is_a_feature_where_a_trace_has_hashes(pcfg):
    """Planted block hashes: request 2 continues request 1's conversation (its first blocks are request 1's), request 3
    arrives at the same instant as request 2 but after it in row order, request 4 is new. The share of leading blocks
    already seen is the feature; a later request never changes an earlier one's value."""
    canon = pl.DataFrame({"source": ["m"] * 4, "file": ["x"] * 4, "row": [1, 2, 3, 4],
                          "arrival_s": [0.0, 3.0, 3.0, 6.0], "prompt_tokens": [1024, 2048, 1024, 512],
                          "output_tokens": [10, 20, 30, 40],
                          "block_hashes": [[1, 2], [1, 2, 3, 4], [1, 9], [7]]})
    got = PR.prefix_reuse(canon)
    assert got.tolist() == [0.0, 0.5, 0.5, 0.0]
    # shuffled table order: the same values per row (the order is the trace's, not the table's)
    shuf = canon[[3, 1, 0, 2]]
    assert PR.prefix_reuse(shuf).tolist() == [0.0, 0.5, 0.0, 0.5]
    # only the past: dropping the last request changes nothing before it
    assert PR.prefix_reuse(canon.head(3)).tolist() == got[:3].tolist()
    m = {"windows": [{"id": "m-00", "source": "m", "provenance": "real"}], "sources": {"m": {}}}
    spec = PR.feature_spec(pcfg.predictors, m, "m", canon)
    assert "prefix_reuse" in spec.numeric and "prefix cache" in spec.notes["prefix_reuse"]
    frame = PR._canonical_frame(PR.with_history(canon))
    X = PR.Encoder.fit(spec, frame).matrix(frame)
    assert X[:, list(spec.columns).index("prefix_reuse")].tolist() == got.tolist()
    # a trace without hashes: not a feature, and said so
    plain = canon.drop("block_hashes")
    spec2 = PR.feature_spec(pcfg.predictors, m, "m", plain)
    assert "prefix_reuse" not in spec2.numeric and "not used" in spec2.notes["prefix_reuse"]
    assert PR.with_history(plain) is plain


# --------------------------------------------------------------------------- frozen predictions


def test_predictions_are_deterministic_and_frozen_by_fingerprint(pcfg, manifest, frozen, tmp_path):
    fr = frozen[("azure", "azure")]
    assert fr.path.is_file() and fr.info["train_rows"] == 19366 - 8000
    assert fr.info["features"] == ["log_prompt"]
    # the same seed and data -> bit-identical predictions (trained again, from scratch)
    spec = PR.feature_spec(pcfg.predictors, manifest, "bailian")
    td = PR.training_data(pcfg.predictors, pcfg.paths, pcfg.standins, manifest, "bailian")
    tables = W.load_windows(pcfg.data, sources=["bailian"], per_source=1, manifest=manifest)
    frame = PR.window_frames(manifest, "bailian", W.load_windows(pcfg.data, sources=["bailian"], manifest=manifest))
    wid = next(iter(tables))
    a = PR.fit_predictor(pcfg.predictors, spec, td).predict(frame[wid])
    b = PR.fit_predictor(pcfg.predictors, spec, PR.training_data(pcfg.predictors, pcfg.paths, pcfg.standins, manifest,
                                                                 "bailian")).predict(frame[wid])
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    got = frozen[("bailian", "bailian")].window(wid)
    assert np.array_equal(got["predicted_output"].to_numpy(), a[0])
    # another seed -> other stand-in training data -> another fingerprint and other predictions
    other = pcfg.with_overrides({"predictors.seed": 1})
    fp0 = PR.fingerprint_key(PR.fingerprint(pcfg.predictors, pcfg.standins, manifest, "bailian", "bailian"))
    fp1 = PR.fingerprint_key(PR.fingerprint(other.predictors, other.standins, manifest, "bailian", "bailian"))
    assert fp0 != fp1
    c = PR.fit_predictor(other.predictors, spec, PR.training_data(other.predictors, other.paths, other.standins, manifest,
                                                                  "bailian")).predict(frame[wid])
    assert not np.array_equal(a[0], c[0])
    # reading back verifies: a tampered file is an error, never silently used
    reread = PR.load_predictions(pcfg.data, pcfg.predictors, [("azure", "azure")], manifest=manifest)[("azure", "azure")]
    assert reread.table.equals(fr.table)
    backup = fr.path.read_bytes()
    try:
        import pyarrow.parquet as pq

        t = pq.read_table(fr.path)
        col = t.column("predicted_output").to_numpy().copy()
        col[0] += 1.0
        t2 = t.set_column(t.schema.get_field_index("predicted_output"), "predicted_output", pl.Series(col).to_arrow())
        pq.write_table(t2.replace_schema_metadata(t.schema.metadata), fr.path)
        with pytest.raises(IntegrityError, match="checksum"):
            PR.load_predictions(pcfg.data, pcfg.predictors, [("azure", "azure")], manifest=manifest)
    finally:
        fr.path.write_bytes(backup)


def test_attach_adds_columns_and_keeps_the_frozen_window(pcfg, manifest, frozen):
    tables = W.load_windows(pcfg.data, per_source=1, manifest=manifest)
    out = PR.attach(pcfg.data, pcfg.predictors, tables, manifest=manifest)
    for wid, df in tables.items():
        e = next(x for x in manifest["windows"] if x["id"] == wid)
        assert W.window_sha256(df) == e["sha256"]                       # untouched
        got = out[wid]
        cols = list(columns_of(df))                                     # + block_hashes where the trace has them
        assert got.columns == [*cols, "predicted_output", "ltr_score"]
        assert W.window_sha256(got.select(cols)) == e["sha256"]
        assert (got["predicted_output"] >= 1).all()
    foreign = PR.attach(pcfg.data, pcfg.predictors, {k: v for k, v in tables.items() if k.startswith("azure")}, manifest=manifest,
                        train="burstgpt")
    wid = next(iter(foreign))
    assert not foreign[wid]["predicted_output"].equals(out[wid]["predicted_output"])


def test_accuracy_is_honest(pcfg, manifest, frozen):
    acc = PR.accuracy_table(pcfg.data, pcfg.predictors, pcfg.simulation.predictor_sigma, manifest=manifest)
    n_src = len({e['source'] for e in manifest['windows']})
    assert acc.height == n_src * n_src * 40      # every (train, test) source pair x 40 windows
    summ = PR.accuracy_summary(acc, 50, 0)
    assert set(summ) == set(PR.all_pairs(manifest))
    home = summ[("azure", "azure")]
    assert -1 < home["tau"] < 0.99 and home["mae_log"] > 0 and home["tau_ci"][0] <= home["tau"] <= home["tau_ci"][1]
    assert "noisy_oracle_tau" in home and "noisy_oracle_tau" not in summ[("azure", "burstgpt")]


def test_campaign_hands_the_predictions_and_the_tenant_model_to_the_runs(pcfg, manifest, frozen):
    cfg = pcfg.with_overrides({"simulation.schedulers": ["fcfs", "sjf_predicted", "vtc"]})
    plan = campaign.make_plan(cfg.plan_settings, manifest=manifest)
    fp = plan.shards[0].fingerprint
    key = PR.fingerprint_key(PR.fingerprint(cfg.predictors, cfg.standins, manifest, "azure", "azure"))
    assert key in fp and '"tenants":"none"' in fp
    assert plan.shards[0].key != campaign.make_plan(cfg.with_overrides({"predictors.seed": 3}).plan_settings,
                                                    manifest=manifest).shards[0].key
    no_pred = campaign.make_plan(pcfg.plan_settings, manifest=manifest)          # smoke schedulers: no predicted policy
    assert '"predictions":null' in no_pred.shards[0].fingerprint
    tables = W.load_windows(cfg.data, per_source=1, manifest=manifest)
    run = campaign.run_tables(cfg.data, cfg.predictors, cfg.simulation, tables, ["sjf_predicted", "vtc"], manifest=manifest)
    assert set(run["azure-00"]["tenant"].unique()) == {"n/a"}                     # no tenants in the trace
    assert run["burstgpt-00"]["tenant"].equals(tables["burstgpt-00"]["tenant"])   # trace tenants kept
    seeded_cfg = cfg.with_overrides({"simulation.tenant_model": "seeded"})
    seeded = campaign.run_tables(seeded_cfg.data, seeded_cfg.predictors, seeded_cfg.simulation, tables, ["vtc"],
                                 manifest=manifest)
    assert seeded["azure-00"]["tenant"].equals(tables["azure-00"]["tenant"])
    assert "predicted_output" not in seeded["azure-00"].columns
    assert W.tenant_label(manifest, "azure", "seeded").startswith("synthetic")


# --------------------------------------------------------------------------- permutation test


def _decisions(name: str, df: pl.DataFrame, prof) -> list:
    """What a policy decides on a fixed sequence of states of the window: priorities of every request,
    the admission order and the eviction victim, before and after a fixed amount of service."""
    sched = schedulers.get_scheduler(name)
    reqs, ctx = requests_from_window(df, prof, np.random.default_rng(3), {"ttft_s": 1.0, "tpot_s": 0.05})
    sched.reset(ctx)
    now = float(max(r.arrival_s for r in reqs))
    for r in reqs:
        r.state = WAITING
        sched.on_arrival(r, r.arrival_s)
    out = [[sched.priority(r, now) for r in reqs], [r.id for r in sched.admission_order(list(reqs), now)]]
    batch = [r for r in reqs if r.id % 3 == 0]           # a fixed batch runs 2 tokens (every output >= 5)
    for r in batch:
        sched.on_admit(r, now)
        r.state = RUNNING
        r.blocks = 1
    for r in batch:
        r.generated = 2
    sched.on_tokens(batch, 2, lambda i: now + 0.01 * i)
    later = now + 0.02
    waiting = [r for r in reqs if r.state == WAITING]
    out += [[sched.priority(r, later) for r in reqs], [r.id for r in sched.admission_order(waiting, later)],
            sched.victim(batch, later).id, sched.next_decision(batch, waiting, later)]
    return out


def test_only_oracle_policies_react_to_permuted_true_lengths():
    """Predictions are computed first (from the prompt and tenant only); then the true output lengths
    are permuted. Every policy's decisions on the same states must be unchanged, except the *_oracle
    ones (which must change: the test can fail)."""
    rng = np.random.default_rng(0)
    n = 40
    prompt = rng.integers(10, 800, n)
    out = rng.integers(5, 400, n)
    tenant = [f"t{k}" for k in rng.integers(0, 3, n)]
    pred = np.exp(0.5 * np.log(prompt) + 1.0)                  # a "predictor" of the arrival-time features
    df = pl.DataFrame({"arrival_s": np.sort(rng.uniform(0, 2, n)), "prompt_tokens": prompt, "output_tokens": out,
                       "tenant": tenant, "predicted_output": pred, "ltr_score": np.log(pred)})
    perm = df.with_columns(pl.Series("output_tokens", rng.permutation(out)))
    assert not perm["output_tokens"].equals(df["output_tokens"])
    prof = profiles.get_profile(profiles.DEFAULT_PROFILE)
    checked = 0
    for name in schedulers.SCHEDULERS:
        if name.startswith("test_"):
            continue
        same = _decisions(name, df, prof) == _decisions(name, perm, prof)
        if name.endswith("_oracle"):
            assert not same, f"{name} reads the true length but ignored the permutation"
            assert "oracle" in schedulers.uses(name)
        else:
            assert same, f"{name} changed its decisions when only the true lengths changed"
            assert "oracle" not in schedulers.uses(name)
        checked += 1
    assert checked >= 16 and math.isfinite(float(pred.sum()))


# --------------------------------------------------------------------------- ranks of the variants


def test_variant_ranks_put_each_variant_in_the_policys_place():
    """Crafted runs: the 13 policies' e2e_mean is their position in the registry (1 .. 13, lower is better);
    sjf_predicted with a foreign predictor gets 0.5 (best) and its oracle variant 13.5 (worst)."""
    from portbench.study import honest

    the13 = schedulers.names("all")
    rows = []
    for w in ("azure-00", "azure-01"):
        for k, name in enumerate(the13):
            rows.append({"source": "azure", "window_id": w, "region": "overload", "scheduler": name,
                         "predictor": "azure", "e2e_mean": float(k + 1)})
        rows.append({"source": "azure", "window_id": w, "region": "overload", "scheduler": "sjf_noisy_oracle",
                     "predictor": "azure", "e2e_mean": 13.5})
        rows.append({"source": "azure", "window_id": w, "region": "overload", "scheduler": "sjf_predicted",
                     "predictor": "burstgpt", "e2e_mean": 0.5})
    r = honest.variant_ranks(pl.DataFrame(rows), ["e2e_mean"], ["sjf_predicted"])
    got = {v: rk for v, rk in zip(r["variant"], r["rank"])}
    assert got == {"home": float(the13.index("sjf_predicted") + 1), "from burstgpt": 1.0, "oracle": 13.0}
    assert set(r["n_ranked"]) == {13} and set(r["n_windows"]) == {2}


def test_fairness_block_is_na_without_tenants(pcfg, manifest):
    from portbench.study import honest

    runs = pl.DataFrame({"source": ["burstgpt"] * 2, "scheduler": ["vtc", "fcfs"], "region": ["overload"] * 2,
                         "tenant_service_gap": [10.0, 30.0], "tenant_jain": [0.99, 0.8]})
    fb = honest.fairness_block(pcfg.simulation, runs, manifest)
    assert fb["sources"]["azure"]["vtc"] == honest.NA_TENANTS == "n/a — no tenants in this trace"
    assert fb["sources"]["burstgpt"]["by_region"]["overload"]["vtc"]["tenant_service_gap"] == 10.0
    tt = honest.tenant_table(manifest, "seeded")
    az = tt.filter(pl.col("source") == "azure").row(0, named=True)
    assert az["tenants"].startswith("synthetic") and az["tenant_metrics"] == "reported, labelled synthetic"
