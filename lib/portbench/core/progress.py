"""Progress bars for the long stages, on the terminal whoever runs them.

Run directly (CLI, a script) a bar goes to standard error as usual. Inside a notebook kernel started by
``portbench notebooks`` / ``make all`` (environment variable :data:`TERMINAL_ENV`), standard error is the
notebook's, which a terminal user never sees while papermill runs; there the bar goes to the kernel's
own standard error (``sys.__stderr__``, the terminal ``make all`` runs in), so that a stage of minutes is
never silent. Redrawn at most every second on a terminal, every 15 s into a file or log; :func:`completed` keeps a bar's
elapsed time moving while a pool computes a long item.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait

from tqdm import tqdm

TERMINAL_ENV = "PORTBENCH_TERMINAL_PROGRESS"


def stream():
    """Where progress is drawn (see the module docstring)."""
    if os.environ.get(TERMINAL_ENV) and sys.__stderr__ is not None:
        return sys.__stderr__
    return sys.stderr


def bar(total: int, desc: str, unit: str, *, disable: bool = False, initial: int = 0) -> tqdm:
    """A tqdm bar on :func:`stream`."""
    out = stream()
    tty = getattr(out, "isatty", lambda: False)()
    return tqdm(total=total, initial=initial, desc=f"[portbench] {desc}", unit=unit, disable=disable, file=out,
                mininterval=1.0 if tty else 15.0, dynamic_ncols=tty)


def completed(futures: Iterable[Future], bar: tqdm) -> Iterator[Future]:
    """The futures as they complete (as ``concurrent.futures.as_completed``), redrawing ``bar`` every
    ``bar.mininterval`` seconds while none does, so that its elapsed time moves during a long item."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=getattr(bar, "mininterval", 1.0), return_when=FIRST_COMPLETED)
        if not done:
            bar.refresh()
        yield from done


def terminal_progress() -> bool:
    """True in the notebooks' kernels of ``make all`` (progress is drawn on the terminal, never in the notebook)."""
    return bool(os.environ.get(TERMINAL_ENV)) and sys.__stderr__ is not None


def note(msg: str) -> None:
    """One line of progress on :func:`stream` (``[portbench] msg``)."""
    print(f"[portbench] {msg}", file=stream(), flush=True)


@contextlib.contextmanager
def stage(what: str, enabled: bool = True):
    """``[portbench] what ...`` when a stage starts and ``what: done in X s`` when it ends, on :func:`stream`."""
    if not enabled:
        yield
        return
    t0 = time.perf_counter()
    note(f"{what} ...")
    yield
    note(f"{what}: done in {time.perf_counter() - t0:.1f} s")
