"""The README's results block is written from summary.json, and only the block changes."""

from __future__ import annotations

import json

import pytest

import planted
from portbench.study import analysis
from portbench.present import report
from portbench.core.errors import DataError


@pytest.fixture()
def summary_file(tmp_params, tmp_path):
    effects = [planted.Effect("fcfs", "azure", "overload", "e2e_mean", 0.5, 0.05),
               planted.Effect("fcfs", "burstgpt", "overload", "e2e_mean", -0.5, 0.05)]
    runs = planted.make_runs(schedulers=("fcfs", "sarathi", "las"), regions={"busy": 0.7, "overload": 1.2},
                             metrics=("e2e_mean", "slo_medium"), n_windows=12, replicates=1,
                             effects=effects, noise_sd=0.05, seed=1)
    path = planted.write_runs(tmp_path / "results", runs)
    P = tmp_params("papermill_params/default.yaml", **{
        "analysis.runs_file": str(path), "analysis.metrics": ["e2e_mean", "slo_medium"],
        "analysis.bootstrap": 50, "analysis.headline_metrics": ["e2e_mean"], "analysis.study_preset.metric": "e2e_mean",
        "analysis.study_preset.regions": 1})
    A = analysis.compute(P.analysis_inputs)
    out = tmp_path / "summary.json"
    out.write_text(json.dumps(A.summary, default=str))
    return out, A.summary


def test_block_quotes_the_summary(summary_file):
    _, s = summary_file
    md = report.results_markdown(s)
    rv, pre = s["reversals"], s["reversals"]["study_preset"]
    # the default and the study preset side by side, one row per stage
    assert "| reversals between sources | default | study preset (original design) |" in md
    assert f"| comparisons | {rv['comparisons']['value']:,} | {pre['comparisons']:,} |" in md
    sp = rv["significant_and_practical"]["value"]
    assert (f"| significant and ≥ δ on both | {sp:,} ({sp / rv['comparisons']['value']:.1%}) | "
            f"{pre['significant_and_practical']:,}") in md
    assert pre["comparisons"] == 3 * 3 * 1                       # pairs x source pairs x one region
    cs = s["cross_source"]
    assert f"τ-b {cs['tau_b']['value']:.2f}" in md and f"τ-b/τ-b,max {cs['tau_b_norm']['value']:.2f}" in md
    assert f"{cs['conditions']['defined']} of {cs['conditions']['total']} conditions defined" in md
    assert "Azure" in md and "BurstGPT (stand-in)" not in md.split("real sources:")[1].split(";")[0]
    assert "real: not available: sources missing (azure_code, mooncake)" in md
    most = rv["most_dramatic"]
    assert f"**{most['a']} vs {most['b']}**, {most['metric']} at {most['region']}" in md


def test_update_readme_replaces_only_the_block(summary_file, tmp_path):
    path, s = summary_file
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n\n{report.START}\nold numbers\n{report.END}\n\n## after\ntext\n")
    block = report.update_readme(readme, path)
    text = readme.read_text()
    assert "old numbers" not in text and block in text
    assert text.startswith("# title\n\nintro\n\n") and text.endswith("\n\n## after\ntext\n")
    report.update_readme(readme, path)
    assert readme.read_text() == text  # idempotent


def test_update_readme_errors(summary_file, tmp_path):
    path, _ = summary_file
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(DataError, match="markers"):
        report.update_readme(readme, path)
    with pytest.raises(DataError, match="no analysis summary"):
        report.update_readme(readme, tmp_path / "missing.json")


def test_project_readme_has_the_markers(root):
    """The README holds the short blocks (what the study simulates, the headline sentence), docs/results.md the
    full results block."""
    text = (root / "README.md").read_text()
    for name in ("study", "headline"):
        start, end = report.markers(name)
        assert text.count(start) == 1 and text.count(end) == 1, name
    page = (root / "docs" / "results.md").read_text()
    assert page.count(report.START) == 1 and page.count(report.END) == 1


def test_update_readme_writes_every_block_and_the_results_page(summary_file, tmp_path):
    path, s = summary_file
    (tmp_path / "docs").mkdir()
    readme, page = tmp_path / "README.md", tmp_path / "docs" / "results.md"
    a, b = report.markers("study"), report.markers("headline")
    readme.write_text(f"# t\n{a[0]}\nstale text\n{a[1]}\n\nmid\n\n{b[0]}\n{b[1]}\nend\n")
    page.write_text(f"# Results\n\n{report.START}\nstale text\n{report.END}\n")
    report.update_readme(readme, path)
    text = readme.read_text()
    assert "stale text" not in text and report.study_markdown(s) in text and report.headline_markdown(s) in text
    assert "\n\nmid\n\n" in text and text.endswith("\nend\n")
    assert report.results_markdown(s) in page.read_text()
    assert f"{len(s['parameters']['schedulers'])} scheduling strategies" in report.study_markdown(s)
    mtime = readme.stat().st_mtime_ns
    report.update_readme(readme, path)
    assert readme.stat().st_mtime_ns == mtime, "an unchanged block leaves the file alone"
    readme.write_text(f"{a[0]}\n{a[0]}\n{a[1]}\n")
    with pytest.raises(DataError, match="once each"):
        report.update_readme(readme, path)


def test_every_available_panel_gets_a_column(tmp_params, tmp_path):
    """Two available panels (the all-real headline and the study's panel with stand-ins): one table with a
    column per panel, the headline first, each quoting its own summary section."""
    srcs = ("azure", "burstgpt", "bailian", "azure_code", "mooncake")
    prov = {s: ("standin" if s in ("burstgpt", "bailian") else "real") for s in srcs}
    runs = planted.make_runs(schedulers=("fcfs", "sarathi", "las"), regions={"busy": 0.7, "overload": 1.2},
                             metrics=("e2e_mean", "slo_medium"), n_windows=12, replicates=1, effects=[],
                             noise_sd=0.05, sources=srcs, provenance=prov, seed=3)
    path = planted.write_runs(tmp_path / "results", runs)
    P = tmp_params("papermill_params/default.yaml", **{
        "analysis.runs_file": str(path), "analysis.metrics": ["e2e_mean", "slo_medium"], "analysis.bootstrap": 20,
        "analysis.headline_metrics": ["e2e_mean"], "analysis.study_preset.metric": "e2e_mean",
        "analysis.study_preset.regions": 1})
    s = json.loads(json.dumps(analysis.compute(P.analysis_inputs).summary, default=str))
    md = report.results_markdown(s)
    header = next(line for line in md.splitlines() if line.startswith("| between sources, every panel |"))
    assert header.index("**real**") < header.index("**study**") and "headline" in header
    row = next(line for line in md.splitlines() if line.startswith("| τ-b |"))
    for name in ("real", "study"):
        assert f"{s['panels'][name]['cross_source']['tau_b']['value']:.2f}" in row
    # nothing n/a in this table; a scheduler n/a on some sources (vtc without tenants) is named in the header
    assert "is n/a on" not in md.split("\n")[0]
    s["cross_source"]["na_schedulers"] = {"dropped": ["vtc"], "sources": ["azure", "mooncake"],
                                          "headline_conditions": 4, "n_items": 2}
    head = report.results_markdown(s).split("\n")[0]
    assert head.endswith("*") and "`vtc` is n/a on" in head and "no tenants in the trace" in head
