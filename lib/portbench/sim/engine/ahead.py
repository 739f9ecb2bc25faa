"""Compiling the engine's loops ahead of the campaign: numba compiles the compiled core and the metrics' loops on
their first use in a checkout (~50 s on one core of the 2-core development machine) and caches the machine code on
disk. ``make all`` starts this module in a low-priority child process while the notebooks before the simulation run
(:func:`portbench.notebooks.run_notebooks`), so the compile fills the core those notebooks leave idle and the
campaign loads the cached code. Nothing depends on it: a compile that fails or has not finished only means the
campaign compiles (and reports any error) itself, as it always did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..metrics import warm_compiled as warm_metrics
from .compiled import unsupported_here
from .simulate import warm_compiled

NICE = 10      # below the notebooks' kernels: the compile takes only what they leave


def start(log: Path) -> subprocess.Popen:
    """This module in a child process (niced where the system allows), its output in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", __name__], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=_lower_priority if hasattr(os, "nice") else None)


def _lower_priority() -> None:      # pragma: no cover - runs in the child
    os.nice(NICE)


def main() -> int:
    """Compile (or load from the disk cache) the loops a campaign's workers use; prints the seconds it took."""
    why = unsupported_here()
    if why is not None:
        print(f"compiled core unavailable here: {why}")
        return 0
    s = warm_compiled()
    warm_metrics()
    print(f"compiled core ready in {s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
