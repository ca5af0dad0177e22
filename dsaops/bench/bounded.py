"""Child processes that nothing outlives: each in its own session, its whole process group
killed when it returns or runs past its wall-clock limit."""
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
        kill_group(proc)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the group a child started with start_new_session, then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
