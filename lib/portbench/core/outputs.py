"""Output folders: portbench writes only into folders it owns, and `make clean` removes only what it wrote.

An *output folder* (``paths.results_dir``, ``figures_dir``, ``windows_dir``, ``{data_dir}/canonical``, the build
folder) carries a marker file, :data:`MARKER`. :func:`claim` makes a folder one: a new or empty folder is created
and marked; a marked folder is used as it is; a non-empty folder without the marker is refused (it holds a user's
files), except the project's own default folders (``build`` and any folder inside it, ``data/results`` ...), which
are marked on first use.
The marker is also the record of what portbench wrote: :func:`record` (called by ``io.atomic_write`` after every
write) appends the file's path, relative to the nearest marked folder above it, once.

``make clean`` runs this file as a script (standard library only, no virtual environment needed):
``python3 lib/portbench/core/outputs.py clean FOLDER ...`` deletes, in each marked folder at or below each
FOLDER, only the recorded files that git does not track, never a frozen window manifest or hybrid record
(``manifest*.json``, ``hybrids.json``: a study's inputs), then the folders that became empty. A folder without a
marker is left alone, with a message; so are files in a marked folder that are not in its record, listed by name.
Folders and files written by portbench versions from before the marker are never adopted automatically (a name
alone cannot prove a file is portbench's): the message says so and how to delete them by hand. :func:`is_temp` names the temporary files of ``io.atomic_write`` (the only
files the campaign's stale-temp cleaner deletes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

try:
    from .errors import ProtectedFileError
except ImportError:     # run as a script by `make clean` (no package, no venv): check_write is never called there
    ProtectedFileError = PermissionError  # type: ignore[misc,assignment]

MARKER = ".portbench-output"
HEADER = ("# portbench output folder. The lines below are the files portbench wrote here (relative paths);\n"
          "# `make clean` deletes only those (never a frozen manifest). Delete this file to stop portbench writing here.\n")
TEMP_SUFFIX = ".portbench-tmp"   # io.atomic_write's temporary files: .<name>.<random>.portbench-tmp
# The project's own output folders (relative to the project root): marked on first use even when not empty.
PROJECT_OUTPUTS = ("build", "data/results", "data/canonical", "data/windows", "figures")
# Frozen study inputs that live in output folders and are never cleaned (delete them by hand).
KEEP_NAMES = ("manifest*.json", "hybrids.json")

_RECORDED: dict[str, set[str]] = {}     # marked folder -> relative paths recorded (this process)
_PROTECTED: list[str] = []              # why this process may not write a file git tracks (empty: it may)
_TRACKED: dict[str, set[Path]] = {}     # project root -> the files git tracks there (read once per process)
PROJECT_ROOT = Path(__file__).resolve().parents[3]


class OutputFolderError(Exception):
    """A folder portbench may not write into (raised as ParameterError by the callers that know the parameter)."""


def is_temp(path: Path) -> bool:
    """True for a temporary file of ``io.atomic_write`` (``.<name>.<random>.portbench-tmp``)."""
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)


def _project_outputs(root: Path) -> list[Path]:
    return [(root / p).resolve() for p in PROJECT_OUTPUTS]


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _projects_own(folder: Path, root: Path) -> bool:
    """One of the project's own output folders, or any folder inside its build folder (``build/smoke/`` ...: the
    project's build folder is ignored by git and holds nothing but portbench's outputs)."""
    return folder in _project_outputs(root) or _is_within(folder, (root / PROJECT_OUTPUTS[0]).resolve())


def forbidden_reason(folder: Path, root: Path) -> str | None:
    """Why ``folder`` can never be an output folder (the file system root, the home folder, the project itself or
    a folder above it, a project source folder), else None."""
    folder, root = Path(folder).resolve(), Path(root).resolve()
    home = Path.home().resolve()
    if folder == Path(folder.anchor):
        return "the file system root"
    if folder == home:
        return "your home folder"
    if folder == root or _is_within(root, folder):
        return "the project folder itself or a folder above it"
    if _is_within(folder, root) and not any(_is_within(folder, p) or _is_within(p, folder)
                                            for p in _project_outputs(root)):
        top = folder.relative_to(root).parts[0]
        if top in ("lib", "notebooks", "papermill_params", "tests", ".git", ".venv", ".venv-vllm"):
            return f"a folder of the project's code ({top}/)"
    return None


def claim(folder: str | os.PathLike, root: str | os.PathLike) -> Path:
    """Make ``folder`` an output folder (see the module docstring); OutputFolderError when it may not be one."""
    folder, root = Path(folder).resolve(), Path(root).resolve()
    why = forbidden_reason(folder, root)
    if why:
        raise OutputFolderError(f"{folder} is {why}; portbench writes only into its own output folders: give a "
                                "new or empty folder (it is created and marked), e.g. one under build/")
    marker = folder / MARKER
    if marker.is_file():
        return folder
    if folder.exists() and not folder.is_dir():
        raise OutputFolderError(f"{folder} is a file, not a folder")
    inherited = marked_root(folder)       # inside a marked folder (build/<run>/results under build/): fine
    own = not folder.is_dir() or all(p.is_dir() and (p / MARKER).is_file() for p in folder.iterdir())
    if not own and inherited is None and not _projects_own(folder, root):
        raise OutputFolderError(
            f"{folder} already holds files that portbench did not write (it has no {MARKER} marker), so portbench "
            "will not write or delete anything there. Give a new or empty folder (portbench creates and marks it); "
            f"if the folder is the output of an older portbench run, mark it yourself: touch {marker}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(marker, "x", encoding="utf-8") as f:
            f.write(HEADER)
    except FileExistsError:          # another process marked it meanwhile
        pass
    except OSError as e:
        raise OutputFolderError(f"cannot create or mark {folder} ({e.strerror or e}); give a folder you can write "
                                "into") from None
    return folder


def protect_tracked(reason: str) -> None:
    """From now on this process writes no file git tracks in the project (the default study's committed manifest,
    hybrids, figures, README): ``reason`` says why (e.g. it runs a study other than the default one). Sticky: a
    process that loaded a study of its own never writes the default study's files, whatever it loads later."""
    if reason not in _PROTECTED:
        _PROTECTED.append(reason)


def check_write(path: str | os.PathLike, hint: str = "") -> None:
    """Refuse (:class:`~portbench.core.errors.ProtectedFileError`, one message naming the file, why and what to do) to
    write ``path`` when it is a file git tracks in the project and :func:`protect_tracked` was called: a study of the
    user's own never writes a tracked file of the default study. Called by ``io.atomic_write`` before every write."""
    if not _PROTECTED:
        return
    p = Path(path).absolute()
    root = PROJECT_ROOT
    if not _is_within(p, root):
        p = p.resolve()
        if not _is_within(p, root):
            return
    key = str(root)
    if key not in _TRACKED:
        _TRACKED[key] = tracked_files(root) or set()
    if p.resolve() not in _TRACKED[key]:
        return
    raise ProtectedFileError(
        f"{p.relative_to(root) if _is_within(p, root) else p} is a file of the default study (tracked by git), and "
        f"{_PROTECTED[0]}: a study of your own never writes the default study's files"
        + (f". {hint}" if hint else "; its own files go under build/<run name>/ (see `portbench params --show paths`)"))


def copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy a file portbench uses into one of its output folders, recorded there (what ``make clean`` removes)."""
    check_write(dst)
    shutil.copyfile(src, dst)
    record(dst)


def marked_root(path: str | os.PathLike) -> Path | None:
    """The nearest folder at or above ``path`` that carries the marker (None: none)."""
    p = Path(path).absolute()
    for d in (p, *p.parents):
        if (d / MARKER).is_file():
            return d
    return None


def _read_record(folder: Path) -> list[str]:
    try:
        lines = (folder / MARKER).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln and not ln.startswith("#")]


def record(path: str | os.PathLike) -> None:
    """Append ``path`` to the record of its marked folder (once; nothing when no folder above is marked)."""
    path = Path(path).absolute()
    root = marked_root(path.parent)
    if root is None:
        return
    rel = path.relative_to(root).as_posix()
    seen = _RECORDED.get(str(root))
    if seen is None:
        seen = _RECORDED[str(root)] = set(_read_record(root))
    if rel in seen:
        return
    seen.add(rel)
    try:
        fd = os.open(root / MARKER, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    try:
        os.write(fd, (rel + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def remove_recorded(folder: str | os.PathLike, files: Iterable[str | os.PathLike]) -> list[str]:
    """Delete those of ``files`` that portbench recorded writing (in the record of their marked folder) and git does
    not track, drop them from the record and remove the folders they leave empty; returns the deleted paths. A file
    not in a record (a user's) is left alone. Used for outputs of a stage that no longer exists (a renamed
    notebook's executed copy and figures), so that they do not linger beside the current ones."""
    gone: list[str] = []
    tracked: set[Path] | None = None
    for f in files:
        p = Path(folder, f).absolute()
        root = marked_root(p.parent)
        if root is None or not p.is_file() or _keep(p):
            continue
        rel = p.relative_to(root).as_posix()
        if rel not in _read_record(root):
            continue
        if tracked is None:
            tracked = tracked_files(root) or set()
        if p.resolve() in tracked:
            continue
        p.unlink()
        gone.append(str(p))
        kept = [r for r in _read_record(root) if r != rel]
        (root / MARKER).write_text(HEADER + "".join(r + "\n" for r in kept), encoding="utf-8")
        _RECORDED.pop(str(root), None)
        d = p.parent
        while d != root and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
    return gone


# --------------------------------------------------------------------------- make clean


def tracked_files(root: Path) -> set[Path] | None:
    """Files git tracks in ``root``'s repository (None: not a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--full-name"], cwd=root, capture_output=True, check=True)
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, check=True,
                             text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {(Path(top) / p).resolve() for p in out.stdout.decode().split("\0") if p}


def _keep(p: Path) -> bool:
    return any(p.match(pat) for pat in KEEP_NAMES)


def clean(folders: list[str], root: Path | None = None, out=sys.stdout) -> int:
    """Delete what portbench wrote in the marked folders at or below ``folders``; returns the files deleted."""
    root = Path(root or Path.cwd()).resolve()
    tracked = tracked_files(root)
    removed = 0
    for name in folders:
        top = (root / name).resolve() if not Path(name).is_absolute() else Path(name).resolve()
        if not top.exists():
            continue
        why = forbidden_reason(top, root)
        if why:
            print(f"[portbench] clean: not touching {top}: it is {why}", file=out)
            continue
        marked = sorted({m.parent for m in top.rglob(MARKER)} | ({top} if (top / MARKER).is_file() else set()),
                        key=lambda d: -len(d.parts))
        if not marked:
            if any(top.iterdir()):
                older = (" -- if it is the output of a portbench version from before output records (an old "
                         f"{name}/), delete it yourself: rm -r {name}") if top in _project_outputs(root) else ""
                print(f"[portbench] clean: not touching {top}: it has no {MARKER} marker, so portbench has no record "
                      f"of writing anything there{older}", file=out)
            continue
        for folder in marked:
            removed += _clean_folder(folder, tracked, out)
    return removed


def _clean_folder(folder: Path, tracked: set[Path] | None, out) -> int:
    kept, removed = [], 0
    for rel in dict.fromkeys(_read_record(folder)):
        p = (folder / rel).resolve()
        if not _is_within(p, folder) or not p.is_file():
            continue
        if _keep(p) or (tracked is not None and p in tracked) or (tracked is None and "figures" in p.parts):
            kept.append(rel)
            continue
        p.unlink()
        removed += 1
    for tmp in folder.rglob(f".*{TEMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
    for d in sorted((d for d in folder.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(d.iterdir()) and marked_root(d) == folder:
            d.rmdir()
    _unrecorded(folder, kept, out)
    rest = [p for p in folder.iterdir() if p.name != MARKER]
    if not rest:
        (folder / MARKER).unlink()
        folder.rmdir()
    else:
        (folder / MARKER).write_text(HEADER + "".join(r + "\n" for r in kept), encoding="utf-8")
        if kept:
            print(f"[portbench] clean: kept in {folder}: {', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''} "
                  "(tracked by git, or a frozen manifest: a study's input; delete by hand)", file=out)
    _RECORDED.pop(str(folder), None)
    return removed


def _unrecorded(folder: Path, kept: list[str], out) -> None:
    """Say which files were left because portbench has no record of them: a user's, or written by a version from
    before output records (no automatic adoption: a name alone cannot prove whose a file is)."""
    left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name != MARKER and marked_root(p.parent) == folder
                  and p.relative_to(folder).as_posix() not in kept)
    if left:
        print(f"[portbench] clean: left in {folder}: {', '.join(left[:5])}{' ...' if len(left) > 5 else ''} "
              f"({len(left)} file(s) portbench has no record of writing: yours, or outputs of a version from before "
              "output records; delete them by hand if they are old outputs)", file=out)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "clean":
        sys.exit("usage: python3 lib/portbench/core/outputs.py clean FOLDER ...")
    n = clean(sys.argv[2:])
    print(f"[portbench] clean: {n} file(s) portbench wrote removed")
