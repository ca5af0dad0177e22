"""A child process with a wall-clock limit: its own session, and its whole process group
killed when it returns or runs past the limit (nothing it started outlives it)."""
from __future__ import annotations

import os
import signal
import subprocess


def run(argv: list[str], timeout: float, **popen) -> int | None:
    """The exit status, or None when the limit stopped it."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
