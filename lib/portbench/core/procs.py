"""Worker processes that do not outlive the process that started them.

A campaign's pool workers are started with the ``spawn`` method; if the parent is killed (SIGKILL, an
out-of-memory kill, a closed terminal), nothing tells them to stop, and they would go on computing
shards nobody collects. :func:`die_with_parent` (called first in every pool initializer) asks Linux to
send the worker SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``) and, on every platform,
starts a daemon thread that ends the worker as soon as its parent process id changes. The
multiprocessing resource tracker then sees its last users gone and exits too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def die_with_parent(poll_s: float = POLL_S) -> None:
    """End this process when its parent dies (idempotent)."""
    if getattr(die_with_parent, "_armed", False):
        return
    die_with_parent._armed = True  # type: ignore[attr-defined]  # a flag on the function
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:      # the parent died before the request took effect
        os._exit(1)

    def watch():
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="portbench-parent-watch", daemon=True).start()
