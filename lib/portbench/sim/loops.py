"""One loader for the small compiled loops beside the engine core: the queue statistics
(:mod:`.engine.simulate`) and VTC's tenant service curves (:mod:`.metrics`).

Each loop is plain Python over numpy arrays; :class:`LazyLoop` compiles it with numba (machine code cached on disk)
on first use and only where numba is already loaded (:data:`NUMBA_LOADED`); elsewhere it answers None and the caller
takes its numpy path, which gives the same numbers bit for bit (tests hold the two equal).
"""

from __future__ import annotations

import sys
from typing import Callable

NUMBA_LOADED = """The compiled loops of the metrics and the queue statistics run only in a process where numba is already
loaded (the compiled engine core loads it; a campaign's workers and ``warm_compiled`` do): they never import numba
themselves, so a process that only computes metrics or runs the reference core stays free of numba and llvmlite --
vLLM 0.32's in-process engine cannot start in a process where llvmlite is loaded (its kernel rebinding walks every
module's attributes and trips over llvmlite's library wrapper), which the validation's step grid needs. Both paths
give the same numbers, bit for bit (tests)."""


class LazyLoop:
    """``fn`` compiled by numba on first use, or None (:data:`NUMBA_LOADED`). ``helpers``: names of functions in
    ``fn``'s module that ``fn`` calls; they are compiled too and replace the module's Python ones (numba needs
    compiled callees). ``off``: True makes every call answer None (the tests' switch to the numpy path)."""

    def __init__(self, fn: Callable, helpers: tuple[str, ...] = ()):
        self.fn, self.helpers = fn, tuple(helpers)
        self.off = False
        self._loaded = False
        self._compiled: Callable | None = None

    def __call__(self, *, may_import: bool = False) -> Callable | None:
        """The compiled loop; None when ``off``, when numba is not installed, or when it is not loaded in this
        process yet and ``may_import`` is False (``warm_compiled`` passes True: it runs where the compiled core
        does)."""
        if self.off:
            return None
        if not self._loaded:
            if not may_import and "numba" not in sys.modules:
                return None
            self._loaded = True
            try:
                import numba
            except ImportError:     # pragma: no cover - numba is a dependency; the numpy path stays the reference
                return None
            jit = numba.njit(cache=True, nogil=True)
            module_globals = self.fn.__globals__
            for name in self.helpers:
                module_globals[name] = jit(module_globals[name])
            self._compiled = jit(self.fn)
        return self._compiled
