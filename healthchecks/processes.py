"""Scheduler ranks seen from the processes themselves, and their deaths.

SGLang titles each scheduler `sglang::scheduler_<parts>` (scheduler.py, setproctitle; a
bare `sglang::scheduler` with one rank and no DP). The watcher polls about every second in
the background, because nothing in SGLang reliably reports a dead rank: the head node's
watchdog logs only the first child it finds dead, a worker node's launcher joins its
schedulers in order, and /health can stay 200 for minutes.

Every `scan_interval` seconds all of /proc is scanned for new schedulers; between scans only
the known ones are checked, every `interval` seconds.

A vanished rank is a death when its server still ran (its launcher and a sibling rank
alive, and no clean stop in the log) or when the watchdog's "crashed" line names its pid.
Vanishing together with its launcher or all its siblings, or after `SIGTERM received`, is a
server stopping, not a death. The cause: the log's exit code (sigkill, …; a kernel OOM record
for the same pid makes a sigkill `oom_kill`), else the kernel OOM record, else the cgroup's
`memory.events` oom_kill count having grown, else Docker's `OOMKilled` for a watched
container, else `unknown`. The vanished process and the log line are one death: they are
tied by pid.
"""
from __future__ import annotations

import math
import os
import re
import threading
import time
from dataclasses import dataclass

import psutil
from dsaops.healthchecks.containers import Containers
from dsaops.healthchecks.logparse import CAUSES, LogState, cause_of_exit_code, rank_label
from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.oom import KernelOomRecords, cgroup_of, cgroup_oom_kills

TITLE = re.compile(r"^sglang::scheduler(?:_(\S+))?$")
COMM_PREFIX = "sglang::schedul"  # setproctitle also sets comm, cut to 15 bytes: cheap to scan


def _stat(proc_root: str, pid: int) -> tuple[str, str, str]:
    """(comm, "live"|"zombie"|"gone", start ticks) from /proc/PID/stat."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return "", "gone", ""
    comm = raw[raw.find("(") + 1:raw.rfind(")")]
    fields = raw[raw.rfind(")") + 2:].split()
    if len(fields) < 20:
        return comm, "gone", ""
    return comm, "zombie" if fields[0] in "ZX" else "live", fields[19]


def rank_of_title(title: str) -> str | None:
    """`sglang::scheduler_DP3_TP3_EP3` -> `DP3_TP3_EP3`; `sglang::scheduler` -> `TP0`."""
    m = TITLE.match(title.strip())
    if not m:
        return None
    return rank_label(m[1].split("_") if m[1] else [])


@dataclass
class Scheduler:
    pid: int
    rank: str
    launcher: int
    started: float   # epoch seconds, to compare with log line times
    ticks: str       # start time in clock ticks (/proc/PID/stat): tells a reused pid apart
    cgroup: str | None


@dataclass
class _Vanished:
    proc: Scheduler
    seen: float
    deadline: float
    server_ran: bool


class ProcessWatcher(BackgroundLoop):
    def __init__(self, errors: ErrorCounts, log: LogState | None = None, kmsg: KernelOomRecords | None = None,
                 interval: float = 1.0, scan_interval: float = 5.0, grace: float = 3.0,
                 cgroup_root: str = "/sys/fs/cgroup", proc_root: str = "/proc", containers: Containers | None = None):
        super().__init__("processes", errors, interval)
        self.log, self.kmsg, self.scan_interval, self.grace = log, kmsg, scan_interval, grace
        self.cgroup_root, self.proc_root, self.containers = cgroup_root, proc_root, containers
        self._next_scan = 0.0
        self._oom_counts: dict[str, int | None] = {}   # cgroup -> oom_kill at the last poll
        self._oom_grew_at: dict[str, float] = {}       # cgroup -> when that count last grew
        self.live: dict[int, Scheduler] = {}
        self._vanished: list[_Vanished] = []
        self._lock = threading.Lock()
        self._up: dict[str, int] = {}                  # rank -> 1 alive / 0 died (cleanly stopped ranks leave)
        self._deaths: dict[tuple[str, str], int] = {}  # (rank, cause) -> count

    def step(self) -> bool:
        try:
            self.poll()
        except Exception:  # noqa: BLE001 (a surprise from /proc must not end the watching)
            self.errors.inc("processes")
        return False

    def poll(self) -> None:
        now = time.monotonic()
        if now >= self._next_scan:
            seen = self._scan()
            self._next_scan = now + self.scan_interval
        else:  # between scans only the known ranks are checked: a death is still seen within a poll
            seen = {pid: s for pid, s in self.live.items() if _stat(self.proc_root, pid)[1:] == ("live", s.ticks)}
        gone = [s for pid, s in self.live.items() if pid not in seen]
        for pid, sched in seen.items():
            if pid not in self.live:
                self.live[pid] = sched
                with self._lock:
                    self._up[sched.rank] = 1
                    for cause in CAUSES:
                        self._deaths.setdefault((sched.rank, cause), 0)
        for sched in gone:
            del self.live[sched.pid]
        for sched in gone:
            siblings = [s for s in self.live.values() if s.launcher == sched.launcher]
            server_ran = bool(siblings) and psutil.pid_exists(sched.launcher)
            self._vanished.append(_Vanished(sched, now, now + self.grace, server_ran))
        self._refresh_oom_counts(now)
        if self.kmsg is not None:
            self.kmsg.refresh()  # keep up with the kernel log (and say early when it is unreadable)
        self._vanished = [v for v in self._vanished if not self._settle(v, now)]

    def _scan(self) -> dict[int, Scheduler]:
        """Every process whose comm says scheduler; /proc/PID/stat alone for the rest (psutil
        for every process costs about 1% of a core at one poll a second)."""
        seen = {}
        for entry in os.scandir(self.proc_root):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            comm, state, ticks = _stat(self.proc_root, pid)
            if state != "live" or not comm.startswith(COMM_PREFIX):
                continue
            known = self.live.get(pid)
            if known and known.ticks == ticks:
                seen[pid] = known
                continue
            try:
                p = psutil.Process(pid)
                rank = rank_of_title(" ".join(p.cmdline()))
                launcher, started = p.ppid(), p.create_time()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            except psutil.AccessDenied:
                self.errors.inc("processes")
                continue
            if rank is not None:
                seen[pid] = Scheduler(pid, rank, launcher, started, ticks, cgroup_of(pid, self.proc_root))
        return seen

    def _refresh_oom_counts(self, now: float) -> None:
        """Note when each watched cgroup's oom_kill count last grew: the kernel counts the kill a
        moment before the victim is gone, so a poll may see the two apart."""
        groups = {s.cgroup for s in self.live.values()} | {v.proc.cgroup for v in self._vanished}
        for group in groups - {None}:
            count = cgroup_oom_kills(group, self.errors, self.cgroup_root)
            last = self._oom_counts.get(group)
            if count is not None and last is not None and count > last:
                self._oom_grew_at[group] = now
            self._oom_counts[group] = count

    def _settle(self, v: _Vanished, now: float) -> bool:
        """Decide a vanished rank's fate; False while waiting (up to `grace`) for the log's word."""
        since = math.floor(v.proc.started) - 1  # log times have whole seconds
        reported = self.log.exit_of(v.proc.pid, since) if self.log else None
        if reported and reported[1]:
            self._count(v.proc, self._refine(v, cause_of_exit_code(reported[0])))
            return True
        if now < v.deadline:
            return False
        clean_stop = self.log is not None and self.log.clean_stop_since(since)
        if not v.server_ran or clean_stop or (reported and reported[0] == 0):
            with self._lock:
                if self._up.get(v.proc.rank) == 1 and not any(s.rank == v.proc.rank for s in self.live.values()):
                    del self._up[v.proc.rank]
            return True
        cause = cause_of_exit_code(reported[0]) if reported else self._oom_cause(v)
        self._count(v.proc, self._refine(v, cause))
        return True

    def _refine(self, v: _Vanished, cause: str) -> str:
        if cause == "sigkill" and self._oom_cause(v) == "oom_kill":
            return "oom_kill"
        return cause

    def _oom_cause(self, v: _Vanished) -> str:
        if self.kmsg is not None and self.kmsg.was_killed(v.proc.pid):
            return "oom_kill"
        grew = self._oom_grew_at.get(v.proc.cgroup)
        if grew is not None and grew >= v.seen - 2 * self.interval:
            return "oom_kill"
        if self.containers is not None and self.containers.oom_killed():
            return "oom_kill"
        return "unknown"

    def _count(self, proc: Scheduler, cause: str) -> None:
        with self._lock:
            self._deaths[(proc.rank, cause)] = self._deaths.get((proc.rank, cause), 0) + 1
            if not any(s.rank == proc.rank for s in self.live.values()):
                self._up[proc.rank] = 0

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self._up), dict(self._deaths)


class WorkerCollector:
    def __init__(self, watcher: ProcessWatcher, families: Families):
        self.watcher, self.f = watcher, families

    def collect(self):
        up_now, deaths = self.watcher.snapshot()
        up = self.f.gauge("dsa_worker_up", "1 while the scheduler rank's process lives, 0 after it died", ("rank",))
        for rank, v in sorted(up_now.items()):
            up.add(v, rank)
        died = self.f.counter("dsa_worker_deaths_total", "Scheduler ranks that died while their server ran, by cause",
                              ("rank", "cause"))
        for (rank, cause), n in sorted(deaths.items()):
            died.add(n, rank, cause)
        return [up.family, died.family]
