"""Who the OOM killer took: the kernel's own record (/dev/kmsg) and cgroup v2 memory.events.

On GB10 a long prefill can exhaust the unified memory and the OOM killer picks a scheduler
rank; these records turn a death's `unknown` into `oom_kill`.
"""
from __future__ import annotations

import os
import re
import time
from collections import OrderedDict

from dsaops.healthchecks.metrics import ErrorCounts

# "Out of memory: Killed process 1234 (python3) …" and "oom-kill:constraint=…,task=python3,pid=1234,uid=0",
# after the record's "priority,sequence,microseconds since boot,flags;" prefix
_OOM_PID = re.compile(rb"(?:Killed process |oom-kill:.*\bpid=)(\d+)")
_STAMP = re.compile(rb"^\d+,\d+,(\d+),")


class KernelOomRecords:
    """Reads the kernel log incrementally (non-blocking) and remembers recent OOM-killed pids.

    /dev/kmsg is unreadable without CAP_SYSLOG where kernel.dmesg_restrict=1 (a container,
    a non-root exporter): that counts as a `kmsg` error, and opening is retried now and then."""

    def __init__(self, errors: ErrorCounts, path: str = "/dev/kmsg", retry_s: float = 30.0, keep: int = 1024):
        self.errors, self.path, self.retry_s, self.keep = errors, path, retry_s, keep
        self._fd: int | None = None
        self._next_try = 0.0
        self.killed: OrderedDict[int, float] = OrderedDict()  # pid -> seconds since boot of the record

    def refresh(self) -> None:
        if self._fd is None and not self._open():
            return
        while True:
            try:
                record = os.read(self._fd, 8192)  # /dev/kmsg hands out one record per read
            except BlockingIOError:
                return
            except BrokenPipeError:  # records were overwritten before we read them; go on
                continue
            except OSError:
                self.errors.inc("kmsg")
                self.close()
                return
            if not record:  # a plain file (tests, a saved dmesg) ends; /dev/kmsg would block
                return
            stamp = _STAMP.match(record)
            for m in _OOM_PID.finditer(record):
                self.killed[int(m[1])] = int(stamp[1]) / 1e6 if stamp else float("inf")
                self.killed.move_to_end(int(m[1]))
            while len(self.killed) > self.keep:
                self.killed.popitem(last=False)

    def was_killed(self, pid: int, since_boot_s: float = 0.0) -> bool:
        """An OOM record for `pid` written after `since_boot_s` (the process's start: the kernel log
        keeps records of processes that had the pid before)."""
        self.refresh()
        return pid in self.killed and self.killed[pid] >= since_boot_s - 1

    def _open(self) -> bool:
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + self.retry_s
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except OSError:
            self.errors.inc("kmsg")
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None


def cgroup_of(pid: int, proc_root: str = "/proc") -> str | None:
    """The process's cgroup v2 path (`0::/…` line), or None on a v1-only host or when it is gone."""
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def cgroup_oom_kills(cgroup: str, errors: ErrorCounts, root: str = "/sys/fs/cgroup") -> int | None:
    """`oom_kill` from the cgroup's memory.events; None where that file does not exist
    (no memory controller on v2, a v1 host). Unreadable or garbled: a `cgroup` error."""
    path = os.path.join(root, cgroup.lstrip("/"), "memory.events")
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        errors.inc("cgroup")
    return None
