"""A user's files are never deleted or overwritten (issue 27, "a user's files were lost"): one test per case.

Output folders carry a marker that is also the record of what portbench wrote (portbench.core.outputs); `make
clean` deletes only recorded, untracked files; BUILD comes only from the make command line; output paths stay in
the project or in a new (or marked) folder; the stale-temp cleaner deletes only portbench's temporary files; two
parameter files of the same name never share a run folder; a built-in label does not follow another file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from portbench import params
from portbench.core import io, outputs
from portbench.core.errors import ParameterError
from portbench.study.campaign.files import _clean_stale_tmp

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "lib" / "portbench" / "core" / "outputs.py"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def _clean(project: Path, *folders: str) -> subprocess.CompletedProcess:
    """`make clean`'s command, run in ``project`` with the system python (no virtual environment needed)."""
    return subprocess.run([sys.executable, str(SCRIPT), "clean", *folders], cwd=project, capture_output=True,
                          text=True, timeout=120, check=False)


# --------------------------------------------------------------------------- BUILD and make clean


def test_build_is_never_taken_from_the_environment(tmp_path):
    """Case: `make clean` deleted the folder an inherited BUILD environment variable named (thesis.tex lost)."""
    env = {**os.environ, "BUILD": str(tmp_path / "thesis")}
    recipe = subprocess.run(["make", "-n", "clean"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert recipe.returncode == 0, recipe.stderr
    assert str(tmp_path / "thesis") not in recipe.stdout and " clean build " in recipe.stdout
    explicit = subprocess.run(["make", "-n", "clean", f"BUILD={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True,
                              check=False)
    assert f" clean {tmp_path / 'b'} " in explicit.stdout, "BUILD on the command line is honoured"


def test_make_clean_refuses_a_folder_without_the_marker(tmp_path):
    """Case: even a BUILD named on the command line that holds a user's files loses nothing."""
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("\\documentclass{article}")
    r = _clean(ROOT, str(thesis))
    assert r.returncode == 0, r.stderr
    assert (thesis / "thesis.tex").read_text() == "\\documentclass{article}"
    assert "no .portbench-output marker" in r.stdout and "not touching" in r.stdout


@pytest.fixture()
def project(tmp_path):
    """A git checkout with a committed figure and manifest, its output folders claimed, pipeline files written
    through io (recorded) and a user's files beside them."""
    p = tmp_path / "proj"
    (p / "figures").mkdir(parents=True)
    (p / "figures" / "committed.png").write_bytes(b"tracked")
    (p / "data" / "windows").mkdir(parents=True)
    (p / "data" / "windows" / "manifest.json").write_text("{}")
    _git(p, "init", "-q")
    _git(p, "add", "-A")
    _git(p, "commit", "-qm", "init")
    for f in ("build", "data/results", "data/windows", "figures", "build/byo-1a2b3c/windows"):
        outputs.claim(p / f, p)
    written = ["figures/new.png", "figures/committed.png", "data/results/summary.json", "data/results/runs/a.parquet",
               "data/windows/cache/w.parquet", "data/windows/windows.parquet", "build/notebooks/01.ipynb",
               "build/byo-1a2b3c/windows/manifest.json", "build/byo-1a2b3c/windows/hybrids.json",
               "build/byo-1a2b3c/windows/predictions/x.parquet"]
    for f in written:
        io.write_bytes(p / f, b"pipeline")
    mine = ["figures/my_plot.png", "data/windows/mine.parquet", "data/results/notes.txt",
            "build/byo-1a2b3c/windows/my_notes.md"]
    for f in mine:
        (p / f).write_bytes(b"mine")
    return p, written, mine


def test_make_clean_removes_only_what_the_pipeline_wrote(project):
    """Cases: `make clean` deleted a user's untracked files under figures/, data/windows/*.parquet and
    data/results/, and a BYO study's frozen manifest under build/<run>/windows/."""
    p, _, mine = project
    r = _clean(p, "build", "data/canonical", "data/results", "data/windows", "figures")
    assert r.returncode == 0, r.stderr
    for f in mine:
        assert (p / f).read_bytes() == b"mine", f"a user's file was deleted: {f}"
    assert (p / "figures" / "committed.png").is_file(), "a tracked file is never deleted"
    assert (p / "data" / "windows" / "manifest.json").read_text() == "{}"
    for f in ("build/byo-1a2b3c/windows/manifest.json", "build/byo-1a2b3c/windows/hybrids.json"):
        assert (p / f).is_file(), f"a frozen manifest is a study's input: {f}"
    for f in ("figures/new.png", "data/results/summary.json", "data/results/runs/a.parquet",
              "data/windows/cache/w.parquet", "data/windows/windows.parquet", "build/notebooks/01.ipynb",
              "build/byo-1a2b3c/windows/predictions/x.parquet"):
        assert not (p / f).exists(), f"not cleaned: {f}"
    assert not (p / "build" / "notebooks").exists(), "folders that became empty go too"
    again = _clean(p, "build", "data/results", "data/windows", "figures")
    assert again.returncode == 0 and "0 file(s)" in again.stdout


def test_outputs_of_an_earlier_version_are_named_never_adopted(tmp_path):
    """Folders written before output markers: `make clean` adopts nothing (a name cannot prove a file is
    portbench's) but says what it left and how to delete it -- an unmarked project folder, and unrecorded files in
    a folder marked since."""
    p = tmp_path / "proj"
    (p / "data" / "results").mkdir(parents=True)
    (p / "data" / "results" / "summary.json").write_text("old")
    (p / "figures").mkdir()
    (p / "figures" / "fig_old.png").write_bytes(b"old")
    _git(p, "init", "-q")
    outputs.claim(p / "figures", p)            # a project folder, marked on first use by this version
    io.write_bytes(p / "figures" / "fig_new.png", b"new")
    r = _clean(p, "data/results", "figures")
    assert r.returncode == 0, r.stderr
    assert (p / "data" / "results" / "summary.json").read_text() == "old"
    assert (p / "figures" / "fig_old.png").read_bytes() == b"old" and not (p / "figures" / "fig_new.png").exists()
    assert "rm -r data/results" in r.stdout and "version from before output records" in r.stdout, r.stdout
    assert "left in" in r.stdout and "fig_old.png" in r.stdout, r.stdout


# --------------------------------------------------------------------------- output paths


@pytest.mark.parametrize("value, match", [
    ("/", "file system root"), ("../../..", "inside the project"), ("~/results", "literal ~"), ("~", "literal ~"),
    ("..", "inside the project"), ("lib", "project's code"),
])
def test_output_paths_outside_the_project_are_refused(value, match, monkeypatch):
    """Case: paths.results_dir / figures_dir accepted /, ../../.., a literal ~ (a folder named ~ appeared)."""
    monkeypatch.delenv("PORTBENCH_BUILD", raising=False)
    for key in ("results_dir", "figures_dir"):
        with pytest.raises(ParameterError, match=match):
            params.load(overrides={"paths": {key: value}})
    assert not (ROOT / "~").exists()


def test_a_folder_holding_a_users_files_is_never_written_into(tmp_path):
    """Case: results_dir pointed at a user's folder overwrote their summary.json and index.json."""
    mine = tmp_path / "my_results"
    mine.mkdir()
    (mine / "summary.json").write_text('{"mine": true}')
    (mine / "index.json").write_text("[]")
    with pytest.raises(ParameterError, match="already holds files that portbench did not write.*touch"):
        params.load("papermill_params/smoke.yaml", {"paths": {"results_dir": str(mine)}})
    with pytest.raises(ParameterError, match="paths.figures_dir"):
        params.load("papermill_params/smoke.yaml", {"paths": {"figures_dir": str(mine)}})
    assert (mine / "summary.json").read_text() == '{"mine": true}' and sorted(os.listdir(mine)) == [
        "index.json", "summary.json"]
    fresh = params.load("papermill_params/smoke.yaml", {"paths": {"results_dir": str(tmp_path / "new")}})
    assert (fresh.paths.results_dir / outputs.MARKER).is_file(), "a new folder is created and marked"


def test_a_command_that_only_reads_creates_no_folder(tmp_path, capsys):
    """`portbench params` / `report` claim nothing: no output folder appears for a command that writes none."""
    from portbench import cli

    assert cli.main(["params", "--set", f"paths.results_dir={tmp_path / 'new'}", "--show", "paths.results_dir"]) == 0
    assert cli.main(["report", "--set", f"paths.results_dir={tmp_path / 'new'}"]) == 2
    assert not (tmp_path / "new").exists()
    capsys.readouterr()


def test_the_stale_temp_cleaner_deletes_only_portbenchs_temporary_files(tmp_path):
    """Case: the campaign's stale-temp cleaner deleted a user's 2-hour-old .tmp file."""
    out = tmp_path / "results"
    outputs.claim(out, ROOT)
    runs = out / "runs"
    runs.mkdir()
    user = runs / ".draft.tmp"
    ours = runs / f".a.parquet.x1y2{outputs.TEMP_SUFFIX}"
    for f in (user, ours):
        f.write_text("x")
        old = time.time() - 7200
        os.utime(f, (old, old))
    _clean_stale_tmp(runs)
    assert user.is_file() and not ours.exists()
    unmarked = tmp_path / "elsewhere"
    unmarked.mkdir()
    theirs = unmarked / f".b{outputs.TEMP_SUFFIX}"
    theirs.write_text("x")
    os.utime(theirs, (time.time() - 7200,) * 2)
    _clean_stale_tmp(unmarked)
    assert theirs.is_file(), "nothing is deleted in a folder portbench does not own"


def test_two_parameter_files_of_the_same_name_never_share_a_run_folder(tmp_path, monkeypatch):
    """Case: study.yaml in two folders shared build/study/; --refreeze overwrote the other study's manifest."""
    monkeypatch.delenv("PORTBENCH_BUILD", raising=False)
    cfgs = []
    for d in ("a", "b"):
        f = tmp_path / d / "study.yaml"
        f.parent.mkdir()
        f.write_text("extends: default.yaml\nwindows: {per_source: 5}\n")
        cfgs.append(params.load(f))
    a, b = cfgs
    assert a.paths.run_name != b.paths.run_name and a.paths.run_name.startswith("study-")
    assert a.paths.manifest != b.paths.manifest and a.paths.build_dir != b.paths.build_dir
    assert params.load("papermill_params/smoke.yaml").paths.run_name == "smoke", "the project's own files keep their name"


def test_a_label_follows_the_data(tmp_path):
    """Case: sources.azure pointed at a user's file kept the label "Azure" in every table and figure."""
    trace = tmp_path / "my_service.csv"
    trace.write_text("ts,p,o\n0,10,5\n")
    f = tmp_path / "mine.yaml"
    f.write_text("extends: default.yaml\nsources:\n  azure: {file: my_service.csv, columns: {arrival: ts, "
                 "prompt_tokens: p, output_tokens: o}}\n")
    cfg = params.load(f, validate=False)
    assert cfg.display_names["azure"] == "my_service" and cfg.sources["azure"].file == str(trace)
    labelled = tmp_path / "labelled.yaml"
    labelled.write_text(f.read_text().replace("output_tokens: o}", "output_tokens: o}, label: Mine"))
    assert params.load(labelled, validate=False).display_names["azure"] == "Mine"
    assert params.load(validate=False).display_names["azure"] == "Azure", "the official file keeps its label"


def test_outputs_of_renumbered_notebooks_are_retired_never_a_users(tmp_path):
    """After a renumbering (the summary became 10, the attribution 09) the old executed copies and figures do not
    linger beside the new ones: the pipeline's own (recorded) files go, with their index entries; a user's file in
    the same folders and the current notebooks' outputs stay."""
    from portbench.core import figindex
    from portbench.notebooks import notebook_paths, retire_stale

    nb_dir, figs = tmp_path / "build" / "notebooks", tmp_path / "figures"
    for d in (nb_dir, figs):
        outputs.claim(d, tmp_path)
    current = notebook_paths()[-1].name
    for name in ("09_summary.ipynb", "10_attribution.ipynb", current):
        io.write_bytes(nb_dir / name, b"executed")
    (nb_dir / "09_mine.ipynb").write_bytes(b"mine")
    for nb, fig in (("10_attribution", "shapley_bars"), ("04_cross_workload", "tau_forest")):
        for ext in ("png", "pdf"):
            io.write_bytes(figs / nb / f"{fig}.{ext}", b"figure")
        figindex.record(figs, f"{nb}/{fig}", {"name": f"{nb}/{fig}", "file": f"{nb}/{fig}.png",
                                              "pdf": f"{nb}/{fig}.pdf", "notebook": nb, "description": "d"})
    (figs / "10_attribution" / "my_notes.png").write_bytes(b"mine")
    gone = retire_stale(nb_dir, figs)
    assert len(gone) == 4
    assert sorted(p.name for p in nb_dir.glob("*.ipynb")) == sorted(["09_mine.ipynb", current])
    assert not (figs / "10_attribution" / "shapley_bars.png").exists() and (figs / "10_attribution" / "my_notes.png").is_file()
    assert (figs / "04_cross_workload" / "tau_forest.png").is_file()
    assert set(figindex.read_index(figs)) == {"04_cross_workload/tau_forest"}
    assert "10_attribution/shapley_bars.png" not in (figs / outputs.MARKER).read_text()
    assert retire_stale(nb_dir, figs) == []


def test_copies_portbench_makes_are_recorded_and_cleaned(tmp_path):
    """Case: `make clean` left 3,313 files portbench wrote (the sub-campaigns' copied capacity records, the report's
    figure copies) and called them the user's: copies go through outputs.copy, so they are recorded and removed."""
    out = tmp_path / "build"
    outputs.claim(out, tmp_path)
    src = tmp_path / "fig.png"
    src.write_bytes(b"png")
    (out / "report" / "05_cross_region").mkdir(parents=True)      # the site's copy of a figure
    outputs.copy(src, out / "report" / "05_cross_region" / "fig.png")
    (out / "capacity").mkdir()
    outputs.copy(src, out / "capacity" / "w.json")
    assert outputs.clean([str(out)], root=tmp_path) == 2
    assert not out.exists() and src.read_bytes() == b"png"


def test_a_folder_inside_the_build_folder_is_never_refused(tmp_path):
    """Case: a smoke run refused portbench's own build/smoke/ (a folder with files and no marker)."""
    own = tmp_path / "build" / "smoke" / "data"
    own.mkdir(parents=True)
    (own / "old.parquet").write_bytes(b"x")
    assert outputs.claim(own, tmp_path) == own.resolve()
    elsewhere = tmp_path / "thesis"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("x")
    with pytest.raises(outputs.OutputFolderError):
        outputs.claim(elsewhere, tmp_path)
