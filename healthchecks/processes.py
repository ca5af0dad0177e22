"""Scheduler ranks seen from the processes themselves, and their deaths.

SGLang titles each scheduler `sglang::scheduler_<parts>` (scheduler.py, setproctitle; a
bare `sglang::scheduler` with one rank and no DP). The watcher polls about every second in
the background, because nothing in SGLang reliably reports a dead rank: the head node's
watchdog logs only the first child it finds dead, a worker node's launcher joins its
schedulers in order, and /health can stay 200 for minutes.

A vanished rank is a death when its server still ran (its launcher and a sibling rank
alive, and no clean stop in the log) or when the watchdog's "crashed" line names its pid.
Vanishing together with its launcher or all its siblings, or after `SIGTERM received`, is a
server stopping, not a death. The cause: the log's exit code (sigkill, …; a kernel OOM record
for the same pid makes a sigkill `oom_kill`), else the kernel OOM record, else the cgroup's
`memory.events` oom_kill count having grown, else `unknown`. The vanished process and the
log line are one death: they are tied by pid.
"""
from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass

import psutil
from dsaops.healthchecks.logparse import CAUSES, LogState, cause_of_exit_code, rank_label
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.oom import KernelOomRecords, cgroup_of, cgroup_oom_kills

TITLE = re.compile(r"^sglang::scheduler(?:_(\S+))?$")
COMM_PREFIX = "sglang::schedul"  # setproctitle also sets comm, cut to 15 bytes: cheap to scan


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
    started: float
    cgroup: str | None
    oom_kills: int | None = None


@dataclass
class _Vanished:
    proc: Scheduler
    deadline: float
    server_ran: bool


class ProcessWatcher:
    def __init__(self, errors: ErrorCounts, log: LogState | None = None, kmsg: KernelOomRecords | None = None,
                 interval: float = 1.0, grace: float = 3.0, cgroup_root: str = "/sys/fs/cgroup"):
        self.errors, self.log, self.kmsg = errors, log, kmsg
        self.interval, self.grace, self.cgroup_root = interval, grace, cgroup_root
        self.live: dict[int, Scheduler] = {}
        self._vanished: list[_Vanished] = []
        self._lock = threading.Lock()
        self._up: dict[str, int] = {}                  # rank -> 1 alive / 0 died (cleanly stopped ranks leave)
        self._deaths: dict[tuple[str, str], int] = {}  # (rank, cause) -> count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dsaops-processes", daemon=True)

    def start(self) -> ProcessWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001 (a surprise from /proc must not end the watching)
                self.errors.inc("processes")
            self.errors.beat("processes")
            self._stop.wait(self.interval)

    def poll(self) -> None:
        now = time.monotonic()
        seen = self._scan()
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
            self._vanished.append(_Vanished(sched, now + self.grace, bool(siblings) and psutil.pid_exists(sched.launcher)))
        self._refresh_oom_baselines()
        self._vanished = [v for v in self._vanished if not self._settle(v, now)]

    def _scan(self) -> dict[int, Scheduler]:
        seen = {}
        for p in psutil.process_iter(["name", "status"]):
            if not (p.info["name"] or "").startswith(COMM_PREFIX) or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            known = self.live.get(p.pid)
            try:
                started = p.create_time()
                if known and known.started == started:
                    seen[p.pid] = known
                    continue
                rank = rank_of_title(" ".join(p.cmdline()))
                launcher = p.ppid()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            except psutil.AccessDenied:
                self.errors.inc("processes")
                continue
            if rank is not None:
                seen[p.pid] = Scheduler(p.pid, rank, launcher, started, cgroup_of(p.pid))
        return seen

    def _refresh_oom_baselines(self) -> None:
        counts: dict[str, int | None] = {}
        for s in self.live.values():
            if s.cgroup is not None:
                if s.cgroup not in counts:
                    counts[s.cgroup] = cgroup_oom_kills(s.cgroup, self.errors, self.cgroup_root)
                s.oom_kills = counts[s.cgroup]

    def _settle(self, v: _Vanished, now: float) -> bool:
        """Decide a vanished rank's fate; False while waiting (up to `grace`) for the log's word."""
        since = math.floor(v.proc.started) - 1  # log times have whole seconds
        reported = self.log.exit_of(v.proc.pid, since) if self.log else None
        if reported and reported[1]:
            self._count(v.proc, self._refine(v.proc, cause_of_exit_code(reported[0])))
            return True
        if now < v.deadline:
            return False
        clean_stop = self.log is not None and self.log.clean_stop_since(since)
        if not v.server_ran or clean_stop or (reported and reported[0] == 0):
            with self._lock:
                if self._up.get(v.proc.rank) == 1 and not any(s.rank == v.proc.rank for s in self.live.values()):
                    del self._up[v.proc.rank]
            return True
        cause = cause_of_exit_code(reported[0]) if reported else self._oom_cause(v.proc)
        self._count(v.proc, self._refine(v.proc, cause))
        return True

    def _refine(self, proc: Scheduler, cause: str) -> str:
        if cause == "sigkill" and self._oom_cause(proc) == "oom_kill":
            return "oom_kill"
        return cause

    def _oom_cause(self, proc: Scheduler) -> str:
        if self.kmsg is not None and self.kmsg.was_killed(proc.pid):
            return "oom_kill"
        if proc.cgroup is not None and proc.oom_kills is not None:
            now = cgroup_oom_kills(proc.cgroup, self.errors, self.cgroup_root)
            if now is not None and now > proc.oom_kills:
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
