"""Stand-ins built from the real evidence in the data mirror: parsing, fidelity to the evidence,
determinism, regeneration, tamper detection, counterfactuals and the evidence report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from portbench.core import io
from portbench.data import standins, synth
from portbench.present import plots_data
from portbench.present import text as present_text
from portbench.core.errors import IntegrityError, ParameterError

Z = 4.0  # standard errors allowed (see test_synth.py)
SERVEGEN = "servegen/language/m-small"


@pytest.fixture(scope="module")
def mirror_root(shared_traces) -> Path:
    """The data mirror (conftest's ``shared_traces``), with the stand-in evidence in it."""
    if not (shared_traces / SERVEGEN).is_dir() or not (shared_traces / "burstgpt").is_dir():
        pytest.skip(f"stand-in evidence not found under {shared_traces}")
    return shared_traces


def _inputs(cfg):
    return standins.inputs(cfg.paths, cfg.sources, cfg.standins, cfg.windows)


@pytest.fixture()
def P(tmp_params, mirror_root):
    """What the stand-in builders read (:class:`portbench.data.standins.StandinInputs`)."""
    return _inputs(tmp_params(**{"paths.mirror": str(mirror_root)}))


def _entry(meta: dict, df: pl.DataFrame) -> dict:
    """What the manifest stores for a window: the JSON round trip of its meta plus its hash."""
    from portbench.data import windows

    return {**json.loads(json.dumps(meta, allow_nan=False)), "sha256": windows.window_sha256(df)}


# --------------------------------------------------------------------------- ServeGen parsing


def test_servegen_parsing_counts(P, mirror_root):
    data = standins.load_servegen(mirror_root / SERVEGEN)
    assert len(data.trace_clients) == 43
    assert len(data.clients) == 38
    assert data.excluded == (1, 5, 8, 11, 38)
    assert data.rate.shape == (43, 2016) and data.n_windows == 2016 and data.window_s == 600
    assert data.n_windows * data.window_s == 14 * 86400
    np.testing.assert_array_equal(data.starts, np.arange(2016) * 600)
    # every Gamma window's recorded shape is 1/CV^2: the columns were read in the right order
    gm = data.pattern == "Gamma"
    np.testing.assert_allclose(data.shape[gm] * data.cv[gm] ** 2, 1.0, rtol=1e-5)
    assert set(np.unique(data.pattern)) == {"", "Gamma", "Weibull"}
    assert np.all((data.rate > 0) == (data.pattern != ""))
    est = standins.bailian.servegen_estimates(P)
    assert est["clients_with_trace"] == 43 and est["clients_with_dataset"] == 38
    assert est["excluded"] == [1, 5, 8, 11, 38] and est["n_excluded"] == 5
    assert est["windows_per_client"] == 2016
    assert 0 < est["excluded_share_of_requests"] < 1


def test_servegen_bucket_rule(mirror_root):
    """The PMF of a window is the latest non-empty 6-h bucket at or before it (ServeGen's rule)."""
    data = standins.load_servegen(mirror_root / SERVEGEN)
    c = next(c for c in data.clients if data.bucket_starts[c][0] > 0)
    b = data.bucket_starts[c]
    assert data.bucket_for(c, 0.0) == b[0]
    assert data.bucket_for(c, float(b[0]) + 1.0) == b[0]
    if b.size > 1:
        assert data.bucket_for(c, float(b[1]) - 1.0) == b[0]
        assert data.bucket_for(c, float(b[1])) == b[1]
    assert data.bucket_for(c, 1e9) == b[-1]
    pmf = data.pmf(c, int(b[0]), "output_tokens")
    assert pmf.values.min() > 0 and pmf.probs.sum() == pytest.approx(1.0)


# --------------------------------------------------------------------------- BurstGPT evidence


def test_burstgpt_evidence_and_estimates(P, mirror_root):
    ev = standins.burstgpt_evidence(P)
    assert ev.counts["burstgpt/BurstGPT_1_first400.csv"]["excluded"] == 17   # failures (0/0/0 rows)
    assert ev.counts["burstgpt/BurstGPT_3_first400.csv"]["excluded"] == 1
    assert ev.pool.height == 383 + 399
    assert ev.pool["output_tokens"].min() > 0 and ev.pool["prompt_tokens"].min() > 0
    fit = standins.burstgpt_arrival_estimates(P)
    for k in ("cv_pooled", "cv_window", "rate_rps"):
        lo, hi = fit[f"{'rate' if k == 'rate_rps' else k}_ci"]
        assert lo < fit[k] < hi
    g = np.concatenate(ev.gaps)
    assert fit["rate_rps"] == pytest.approx(g.size / g.sum())
    assert fit["cv_pooled"] == pytest.approx(g.std() / g.mean())
    # the full-file rate comes from the aggregate table row of the configured official file
    import csv

    with open(mirror_root / "burstgpt_aggregates" / standins.common.GUANXI_TABLE) as f:
        row = next(r for r in csv.DictReader(f) if r["file_id"] == "without_fails_2")
    assert fit["rate_rps_used"] == pytest.approx(float(row["mean_raw_requests_per_hour"]) / 3600)
    assert fit["cv_used"] == fit["cv_window"]


def test_window_normalised_gaps_remove_slow_rate_changes():
    rng = synth.rng_from(21)
    slow = np.concatenate([rng.exponential(1.0, 2000), rng.exponential(20.0, 2000)])  # a 20x rate step
    raw_cv = slow.std() / slow.mean()
    z = standins.window_normalised_gaps(slow, 200)
    assert raw_cv > 1.5                                  # the step inflates the raw CV
    assert abs(z.std() / z.mean() - 1.0) < 0.1           # locally it is Poisson (CV 1)


def test_burstgpt_resampled_pairs_match_the_real_pairs(P):
    ev = standins.burstgpt_evidence(P)
    wins = standins.build_windows(P, "burstgpt", 40, 200)
    got = pl.concat([df for _, df in wins])
    real = ev.pool.select("prompt_tokens", "output_tokens", "tenant")
    real_set = set(real.iter_rows())
    assert set(got.select("prompt_tokens", "output_tokens", "tenant").iter_rows()) <= real_set
    # frequencies: chi-square of distinct (prompt, output, tenant) rows against their pool shares
    exp = real.group_by(real.columns).len().rename({"len": "k"})
    obs = got.group_by(real.columns).len().rename({"len": "o"})
    joined = exp.join(obs, on=real.columns, how="left").fill_null(0)
    expected = joined["k"].to_numpy() / real.height * got.height
    assert stats.chisquare(joined["o"].to_numpy(), expected).pvalue > 1e-3
    # arrivals: the windows' CVs scatter around the Gamma CV (sample CV of 199 gaps is biased low,
    # so compare the pooled normalised gaps instead)
    cv = standins.burstgpt_arrival_estimates(P, bootstrap=False)["cv_used"]
    z = np.concatenate([np.diff(df["arrival_s"].to_numpy()) for _, df in wins])
    rate = wins[0][0]["generator"]["params"]["arrivals"]["rate_rps"]
    process = synth.Renewal("gamma", rate, cv)
    assert abs(z.std() / z.mean() - cv) < Z * synth.cv_standard_error(process, z.size)
    assert abs(z.size / z.sum() - rate) < Z * synth.rate_standard_error(process, z.size)


# --------------------------------------------------------------------------- windows


@pytest.mark.parametrize("source", ["burstgpt", "bailian"])
def test_windows_have_the_window_schema_and_records(P, mirror_root, source):
    from portbench.data import windows

    built = standins.build_windows(P, source, 6, 200)
    assert len(built) == 6
    for meta, df in built:
        assert df.columns == ["arrival_s", "prompt_tokens", "output_tokens", "tenant"]
        assert df.schema == pl.Schema(synth.WINDOW_SCHEMA)
        windows.as_window_table(df)  # the windows module accepts it unchanged
        arr = df["arrival_s"].to_numpy()
        assert df.height == 200 and arr[0] == 0.0 and np.all(np.diff(arr) >= 0)
        assert df["prompt_tokens"].min() > 0 and df["output_tokens"].min() > 0
        assert meta["synthetic"] is True and meta["row_start"] is None
        gen = meta["generator"]
        assert set(gen) == {"name", "params", "seed"} and isinstance(gen["seed"], int)
        json.dumps(meta, allow_nan=False)   # JSON-serialisable, no NaN
        for rel, sha in meta["evidence_sha256"].items():
            path = mirror_root / rel.rstrip("/")
            assert sha == (io.tree_sha256(path) if rel.endswith("/") else io.sha256_of(path))
        assert isinstance(meta["t_start"], float) and meta["file"]


def test_bailian_windows_follow_the_servegen_activity(P, mirror_root):
    data = standins.load_servegen(mirror_root / SERVEGEN)
    built = standins.build_windows(P, "bailian", 40, 200)
    starts = [m["generator"]["params"]["start_s"] for m, _ in built]
    total = data.n_windows * data.window_s
    for k, s in enumerate(starts):                     # one start per equal time bucket
        assert k * total / 40 <= s < (k + 1) * total / 40
    for meta, df in built:
        t = meta["t_start"] + df["arrival_s"].to_numpy()
        assert meta["t_start"] >= meta["generator"]["params"]["start_s"]
        clients = np.array([int(x.split("-")[1]) for x in df["tenant"].to_list()])
        assert set(clients) <= set(data.clients)
        rows = np.array([data.row_of(c) for c in clients])
        w = (t // data.window_s).astype(int)
        assert np.all(data.rate[rows, w] > 0)          # every request comes from a client active then


def test_bailian_build_parses_only_the_pmfs_it_uses(P):
    """What keeps the Bailian build fast (no wall-clock bound: CI machines are busy): the 43 clients'
    length PMFs are text parsed on first use, and 40 windows use only a small part of them."""
    standins.common._CACHE.clear()
    standins.build_windows(P, "bailian", 40, 200)
    data = standins.load_servegen(standins.servegen_folder(P))
    n_buckets = sum(len(b) for b in data._raw.values())
    parsed = {(c, b) for c, b, _ in data._pmfs}
    assert 0 < len(parsed) < n_buckets / 4, (len(parsed), n_buckets)


@pytest.mark.parametrize("source", ["burstgpt", "bailian"])
def test_builds_are_deterministic_and_seeded(P, tmp_params, mirror_root, source):
    from portbench.data import windows

    a = standins.build_windows(P, source, 5, 200)
    b = standins.build_windows(P, source, 5, 200)
    assert [windows.window_sha256(df) for _, df in a] == [windows.window_sha256(df) for _, df in b]
    assert [m for m, _ in a] == [m for m, _ in b]
    assert len({windows.window_sha256(df) for _, df in a}) == 5        # windows differ from each other
    other = _inputs(tmp_params(**{"paths.mirror": str(mirror_root), "standins.seed": P.standins.seed + 1}))
    c = standins.build_windows(other, source, 5, 200)
    assert all(windows.window_sha256(x) != windows.window_sha256(y) for (_, x), (_, y) in zip(a, c))


@pytest.mark.parametrize("source", ["burstgpt", "bailian"])
def test_regenerate_equals_build(P, source):
    for meta, df in standins.build_windows(P, source, 4, 200):
        again = standins.regenerate(_entry(meta, df), P.store)
        assert again.equals(df)


def test_tampered_window_is_detected(P):
    from portbench.data import windows

    meta, df = standins.build_windows(P, "burstgpt", 1, 200)[0]
    entry = _entry(meta, df)
    tampered = df.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(pl.col("output_tokens") + 1)
                               .otherwise(pl.col("output_tokens")).alias("output_tokens"))
    assert windows.window_sha256(tampered) != entry["sha256"]
    entry["generator"]["params"]["arrivals"]["cv"] *= 1.001           # a tampered generator record
    with pytest.raises(IntegrityError):
        standins.regenerate(entry, P.store)


def _copy_mirror(src: Path, dst: Path, rels: list[str]) -> None:
    for rel in rels:
        s = src / rel
        files = [p for p in s.rglob("*") if p.is_file()] if s.is_dir() else [s]
        for f in files:
            t = dst / f.relative_to(src)
            t.parent.mkdir(parents=True, exist_ok=True)
            t.symlink_to(f)


@pytest.mark.parametrize("source,victim", [("burstgpt", "burstgpt/BurstGPT_3_first400.csv"),
                                           ("bailian", f"{SERVEGEN}/chunk-12-trace.csv")])
def test_tampered_evidence_is_detected(tmp_path, tmp_params, mirror_root, source, victim):
    fake = tmp_path / "mirror"
    _copy_mirror(mirror_root, fake, ["burstgpt", "burstgpt_aggregates", SERVEGEN, "qwen_bailian"])
    P2 = _inputs(tmp_params(**{"paths.mirror": str(fake)}))
    meta, df = standins.build_windows(P2, source, 1, 200)[0]
    entry = _entry(meta, df)
    assert standins.regenerate(entry, P2.store).equals(df)
    target = fake / victim
    data = bytearray(target.read_bytes())
    target.unlink()
    data[-3] = ord("7") if data[-3] != ord("7") else ord("8")
    target.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=victim.split("/")[0]):
        standins.regenerate(entry, P2.store)


# --------------------------------------------------------------------------- counterfactuals


@pytest.fixture()
def big_window() -> pl.DataFrame:
    n = 20_001
    rng = synth.rng_from(31)
    arr = synth.renewal_window(synth.poisson(4.0), n, rng)
    return synth.window_frame(arr, rng.integers(1, 500, n), rng.integers(1, 300, n),
                              [f"t{k}" for k in rng.integers(1, 4, n)])


def test_counterfactual_burstiness(big_window):
    out, d = standins.counterfactual(big_window, "burstiness", seed=3, window_id="azure-00", cv=2.5)
    assert out.height == big_window.height
    assert out.select("prompt_tokens", "output_tokens", "tenant").equals(
        big_window.select("prompt_tokens", "output_tokens", "tenant"))
    assert out["arrival_s"][-1] == pytest.approx(big_window["arrival_s"][-1], rel=1e-12)   # same mean rate
    _, cv = synth.sample_rate_cv(out["arrival_s"].to_numpy())
    n = big_window.height - 1
    assert abs(cv - 2.5) < Z * synth.cv_standard_error(synth.Renewal("gamma", 1.0, 2.5), n)
    assert d["kind"] == "burstiness" and d["params"]["cv"] == 2.5 and d["seed"] == 3
    assert d["window_id"] == "azure-00"
    json.dumps(d, allow_nan=False)
    again, _ = standins.counterfactual(big_window, "burstiness", seed=3, cv=2.5)
    assert again.equals(out)
    other, _ = standins.counterfactual(big_window, "burstiness", seed=4, cv=2.5)
    assert not other.equals(out)


def test_counterfactual_lengths_and_load(big_window):
    pairs = pl.DataFrame({"prompt_tokens": [10, 2000, 77], "output_tokens": [5, 1, 900]})
    out, d = standins.counterfactual(big_window, "lengths", seed=1, pairs=pairs, label="other")
    assert out.select("arrival_s", "tenant").equals(big_window.select("arrival_s", "tenant"))
    assert set(out.select("prompt_tokens", "output_tokens").iter_rows()) <= set(pairs.iter_rows())
    assert d["params"]["pairs_n"] == 3 and len(d["params"]["pairs_sha256"]) == 64
    out, d = standins.counterfactual(big_window, "load", seed=1, factor=2.0)
    r0, cv0 = synth.sample_rate_cv(big_window["arrival_s"].to_numpy())
    r1, cv1 = synth.sample_rate_cv(out["arrival_s"].to_numpy())
    assert r1 == pytest.approx(2 * r0, rel=1e-12) and cv1 == pytest.approx(cv0, rel=1e-9)
    assert d["after"]["rate_rps"] == pytest.approx(2 * d["before"]["rate_rps"])
    with pytest.raises(ParameterError):
        standins.counterfactual(big_window, "load", seed=1, factor=0)
    with pytest.raises(ParameterError):
        standins.counterfactual(big_window, "shuffle", seed=1)
    with pytest.raises(ParameterError):
        standins.counterfactual(big_window, "burstiness", seed=1)


# --------------------------------------------------------------------------- parameters and evidence report


@pytest.mark.parametrize("key,value", [("standins.seed", -1), ("standins.burstgpt.rate", "median"),
                                       ("standins.burstgpt.cv", "max"), ("standins.burstgpt.bootstrap", 5),
                                       ("standins.counterfactual.burstiness_cv", 0)])
def test_bad_parameters_are_rejected(tmp_params, key, value):
    with pytest.raises(ParameterError, match=key.split(".")[-1]):
        tmp_params(**{key: value})


def test_estimates_and_evidence_tables(P):
    est = standins.estimates(P)
    assert est["servegen"]["n_excluded"] == 5
    assert len(est["servegen"]["standin_windows"]) == P.per_source
    assert est["burstgpt"]["log_type_shares"]["slices"]["Conversation log"] > 0.9
    tables = standins.evidence_tables(P)
    for name in ("burstgpt_lengths", "burstgpt_mix", "burstgpt_windows", "burstgpt_arrivals", "burstgpt_ks",
                 "bailian_lengths", "bailian_ks", "bailian_windows"):
        assert "provenance" in tables[name].columns, name
    assert set(tables["burstgpt_lengths"]["provenance"]) == {"real", "standin"}
    ks = tables["burstgpt_ks"]
    resampled = ks.filter(pl.col("compared_with") == "real slices, valid rows")["ks"]
    assert resampled.max() < 0.05                     # resampling reproduces the real pairs
    own = tables["bailian_ks"].filter(pl.col("kind").str.contains("own evidence"))["ks"]
    assert own.max() < 0.05                           # the superposition reproduces its PMF mixture
    assert tables["servegen_clients"].height == 43


@pytest.mark.slow
def test_evidence_figures_and_counterfactual_demo(P, tmp_path, big_window):
    paths = plots_data.plot_evidence(P, tmp_path / "fig")
    assert len(paths) == 8 and all(Path(p).stat().st_size > 0 for p in paths)
    table, fig = plots_data.counterfactual_demo(P, big_window.head(200), tmp_path / "fig", window_id="azure-00")
    assert table.height == 2 and set(table["provenance"]) == {"real", "counterfactual"}
    assert math.isclose(table["span_s"][0], table["span_s"][1], rel_tol=1e-12)
    assert all(Path(p).is_file() for p in fig.values())


def test_evidence_markdown_quotes_computed_numbers(P):
    text = present_text.evidence_markdown(P)
    est = standins.estimates(P)
    assert "BurstGPT (stand-in)" in text and "Bailian (stand-in)" in text
    assert f"{est['burstgpt']['cv_used']:.2f}" in text
    assert f"{est['servegen']['clients_with_trace']} clients with trace files" in text
    assert "1, 5, 8, 11, 38" in text


def test_counterfactual_markdown_states_what_changed(P, tmp_path, big_window):
    table, _ = plots_data.counterfactual_demo(P, big_window.head(200), tmp_path / "fig", window_id="azure-00")
    text = present_text.counterfactual_markdown(table)
    before, after = table.row(0, named=True), table.row(1, named=True)
    assert f"from {before['interarrival_cv']:.2f} in the window to {after['interarrival_cv']:.2f}" in text
    assert "Only the gaps" in text and "The same 200 requests" in text
    assert f"unchanged at {before['rate_rps']:.3g} req/s" in text
