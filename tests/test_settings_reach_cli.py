"""``python tests/settings_reach.py`` as a command: a reader that leaves early (``| head``) ends it quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "settings_reach.py"


def test_a_closed_pipe_ends_the_report_quietly():
    # the reading end is closed before the script writes (it scans the package first): every write meets EPIPE
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and "BrokenPipeError" not in err and err == ""


def test_the_report_still_prints_in_full():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.startswith("functions taking the whole Config:") and "load_manifest call sites:" in out.stdout
