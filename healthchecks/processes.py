"""Scheduler ranks seen from the processes themselves, and their deaths.

SGLang titles each scheduler `sglang::scheduler_<parts>` (scheduler.py, setproctitle; a
bare `sglang::scheduler` with one rank and no DP). The watcher polls about every second in
the background, because nothing in SGLang reliably reports a dead rank: the head node's
watchdog logs only the first child it finds dead, a worker node's launcher joins its
schedulers in order, and /health can stay 200 for minutes.

Every `scan_interval` seconds all of /proc is scanned for new schedulers; between scans only
the known ones are checked, every `interval` seconds. A process is known by its pid and its
start time (clock ticks since boot), so a reused pid is another process. Run in the host's PID
namespace beside the server's container, the watcher also reads each scheduler's pid inside
that container (NSpid), which is the pid SGLang's log lines name.

A rank whose process is stopped (SIGSTOP, or held by a tracer) is `dsa_worker_up` 0 while it stays
so, and 1 again once it runs: not a death, but a hung rank a worker node's /health does not show.
A rank that vanishes (or turns zombie) is `dsa_worker_up` 0 at once; whether it died is settled:
- the watchdog's "crashed" line names its pid: a death, at once;
- within `grace` seconds the log may still say so; after that, a clean-stop line
  (`SIGTERM received`) since it started, or exit status 0 (the launcher's join line, or the
  zombie's own status where the watcher has ptrace rights over it: read_stat), is a clean stop;
- its server stopping as a whole is not a death: its launcher gone, no sibling rank left, or
  the container it ran in stopped or restarted since it started. Ranks of one server may stop
  seconds apart, so this is looked for until `stop_window` seconds have passed since the last
  rank of that server vanished;
- after that, with its launcher and a sibling still there (a dead rank's siblings wait in NCCL
  for minutes), it died.
The cause: the exit code (the log's line, else the zombie's status: sigkill, …; a kernel OOM
record for the same pid makes a sigkill `oom_kill`), else the kernel OOM record, else the
cgroup's `memory.events` oom_kill count having grown, else Docker's `OOMKilled` for a watched
container, else `unknown`. Each process is counted once (by its pid and start time), also
across restarts of the exporter (the state file keeps the counts and the ranks it saw).
"""
from __future__ import annotations

import math
import os
import re
import threading
import time
import typing
from collections import OrderedDict
from dataclasses import asdict, dataclass

import psutil
from dsaops.healthchecks.containers import Containers
from dsaops.healthchecks.logparse import CAUSES, LogState, bounded, cause_of_exit_code, rank_label
from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.oom import KernelOomRecords, cgroup_of, cgroup_oom_kills

TITLE = re.compile(r"^sglang::scheduler(?:_(\S+))?$")
COMM_PREFIX = "sglang::schedul"  # setproctitle also sets comm, cut to 15 bytes: cheap to scan
SETTLED_KEEP = 4096
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CATCH_UP_WAIT_S = 120.0  # a vanished rank waits this long at most for the log to be read to its end


@dataclass(frozen=True)
class ProcStat:
    comm: str
    state: str          # "live" | "zombie" | "gone"
    ticks: str          # start time in clock ticks since boot
    exit_code: int | None  # a zombie's exit status as multiprocessing reports it (-N: signal N); None unseen
    halted: bool = False   # live but stopped (T: SIGSTOP; t: held by a tracer): it runs nothing


def read_stat(proc_root: str, pid: int) -> ProcStat:
    """/proc/PID/stat: comm, state, start ticks, and a zombie's exit status (field 52)."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return ProcStat("", "gone", "", None)
    comm = raw[raw.find("(") + 1:raw.rfind(")")]
    fields = raw[raw.rfind(")") + 2:].split()
    if len(fields) < 20:
        return ProcStat(comm, "gone", "", None)
    if fields[0] not in "ZX":
        return ProcStat(comm, "live", fields[19], None, fields[0] in "Tt")
    code = None
    if len(fields) >= 50 and fields[49].lstrip("-").isdigit() and _status_visible(proc_root, pid):
        status = int(fields[49])
        code = -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
    return ProcStat(comm, "zombie", fields[19], code)


def _status_visible(proc_root: str, pid: int) -> bool:
    """Whether stat's exit status is the zombie's: the kernel writes 0 there for a reader without
    ptrace read rights over it (another user's process, or one with capabilities the reader lacks,
    as a --cap-drop ALL exporter has), which would read as a clean exit. /proc/PID/io asks the same
    check and refuses instead."""
    try:
        with open(f"{proc_root}/{pid}/io", "rb") as f:
            f.read(1)
    except OSError:
        return False
    return True


def ns_pid_of(proc_root: str, pid: int) -> int:
    """The pid in the innermost PID namespace (the server container's), from NSpid."""
    try:
        with open(f"{proc_root}/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id").strip()


def rank_of_title(title: str) -> str | None:
    """`sglang::scheduler_DP3_TP3_EP3` -> `DP3_TP3_EP3`; `sglang::scheduler` -> `TP0`."""
    m = TITLE.match(title.strip())
    if not m:
        return None
    return rank_label(m[1].split("_") if m[1] else [])


@dataclass
class Scheduler:
    pid: int              # in the exporter's PID namespace
    ns_pid: int           # in the server's (what the log says)
    rank: str
    launcher: int
    launcher_ticks: str
    started: float        # epoch seconds, to compare with log line times
    ticks: str            # start time in clock ticks: tells a reused pid apart
    cgroup: str | None
    container: str | None = None       # the watched container it runs in
    container_started: str | None = None  # that container's StartedAt when the rank was seen

    @property
    def ident(self) -> tuple[int, str]:
        return self.pid, self.ticks


_SCHEDULER_TYPES = typing.get_type_hints(Scheduler)  # what each field of a saved rank must be


@dataclass
class _Vanished:
    proc: Scheduler
    seen: float                 # monotonic time it was found gone
    exit_code: int | None       # from its zombie, when it was seen as one


class ProcessWatcher(BackgroundLoop):
    def __init__(self, errors: ErrorCounts, log: LogState | None = None, kmsg: KernelOomRecords | None = None,
                 interval: float = 1.0, scan_interval: float = 5.0, grace: float = 3.0, stop_window: float = 20.0,
                 cgroup_root: str = "/sys/fs/cgroup", proc_root: str = "/proc", containers: Containers | None = None,
                 log_caught_up: threading.Event | None = None):
        super().__init__("processes", errors, interval)
        self.log, self.kmsg, self.scan_interval, self.grace = log, kmsg, scan_interval, grace
        self.stop_window = max(stop_window, grace)
        self.cgroup_root, self.proc_root, self.containers = cgroup_root, proc_root, containers
        self.log_caught_up = log_caught_up
        self.on_death = None                           # called after a death is counted (the state file)
        self._next_scan = 0.0
        self._oom_counts: dict[str, int | None] = {}   # cgroup -> oom_kill at the last poll
        self._oom_grew_at: dict[str, float] = {}       # cgroup -> when that count last grew
        self.live: dict[int, Scheduler] = {}
        self._halted: set[int] = set()                 # pids of live ranks seen stopped at the last poll
        self._vanished: list[_Vanished] = []
        self._lock = threading.Lock()
        self._up: dict[str, int] = {}                  # rank -> 1 alive / 0 not (cleanly stopped ranks leave)
        self._dead: set[str] = set()                   # ranks whose last process died: 0 until one comes back
        self._deaths: dict[tuple[str, str], int] = {}  # (rank, cause) -> count
        self._settled: OrderedDict[tuple[int, str], None] = OrderedDict()  # processes already judged
        self._last_vanish: dict[tuple[int, str], float] = {}  # launcher -> when one of its ranks last vanished
        self._boot = boot_id()

    def step(self) -> bool:
        self.poll()
        return False

    # -- watching ----------------------------------------------------------------------------

    def poll(self) -> None:
        now = time.monotonic()
        if now >= self._next_scan:
            seen, halted = self._scan()
            self._next_scan = now + self.scan_interval
        else:  # between scans only the known ranks are checked: a death is still seen within a poll
            seen, halted = {}, set()
            for pid, sched in self.live.items():
                stat = read_stat(self.proc_root, pid)
                if stat.state == "live" and stat.ticks == sched.ticks:
                    seen[pid] = sched
                    if stat.halted:
                        halted.add(pid)
        gone = [s for pid, s in self.live.items() if pid not in seen]
        with self._lock:
            self._halted = halted
            for pid, sched in seen.items():
                if pid not in self.live:
                    self.live[pid] = sched
                    self._dead.discard(sched.rank)
                    for cause in CAUSES:
                        self._deaths.setdefault((sched.rank, cause), 0)
            for rank in {s.rank for s in self.live.values()}:
                self._up[rank] = int(self._carried(rank))
            for sched in gone:
                del self.live[sched.pid]
                self._vanish(sched, now)
        self._refresh_oom_counts(now)
        if self.kmsg is not None:
            self.kmsg.refresh()  # keep up with the kernel log (and say early when it is unreadable)
        pending = [v for v in self._vanished if not self._settle(v, now)]
        with self._lock:
            self._vanished = pending
            if not pending:
                self._last_vanish.clear()

    def _carried(self, rank: str, *, stopped_too: bool = False) -> bool:
        """A live process, not stopped, runs `rank` (a restarted server's, when an earlier one vanished);
        `stopped_too`: a stopped one counts, as the rank is still held (not dead, nor gone)."""
        return any(s.rank == rank and (stopped_too or s.pid not in self._halted) for s in self.live.values())

    def _vanish(self, sched: Scheduler, now: float) -> None:
        """(under the lock) The process is gone or a zombie: the rank is down unless another
        process carries it."""
        stat = read_stat(self.proc_root, sched.pid)
        code = stat.exit_code if stat.state == "zombie" and stat.ticks == sched.ticks else None
        self._vanished.append(_Vanished(sched, now, code))
        self._last_vanish[(sched.launcher, sched.launcher_ticks)] = now
        if not self._carried(sched.rank):
            self._up[sched.rank] = 0

    def _scan(self) -> tuple[dict[int, Scheduler], set[int]]:
        """Every process whose comm says scheduler, and which of them are stopped; /proc/PID/stat
        alone for the rest (psutil for every process costs about 1% of a core at one poll a second)."""
        seen, halted, containers = {}, set(), None
        for entry in os.scandir(self.proc_root):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = read_stat(self.proc_root, pid)
            if stat.state != "live" or not stat.comm.startswith(COMM_PREFIX):
                continue
            if stat.halted:
                halted.add(pid)
            known = self.live.get(pid)
            if known and known.ticks == stat.ticks:
                seen[pid] = known
                continue
            try:
                p = psutil.Process(pid)
                rank = rank_of_title(" ".join(p.cmdline()))
                launcher, started = p.ppid(), p.create_time()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            except psutil.AccessDenied as e:
                self.errors.report("processes", f"cannot read process {pid}", e)
                continue
            if rank is None:
                continue
            sched = Scheduler(pid, ns_pid_of(self.proc_root, pid), rank, launcher,
                              read_stat(self.proc_root, launcher).ticks, started, stat.ticks,
                              cgroup_of(pid, self.proc_root))
            if containers is None:
                containers = self._containers()
            groups = _read(f"{self.proc_root}/{pid}/cgroup")  # every hierarchy: v1 hosts name the container there
            for name, (cid, started_at) in containers.items():
                if cid in groups:
                    sched.container, sched.container_started = name, started_at
            seen[pid] = sched
        return seen, halted

    def _containers(self) -> dict[str, tuple[str, str]]:
        """name -> (Id, StartedAt) of the watched containers that answer."""
        out = {}
        for name in self.containers.names if self.containers else ():
            if attrs := self.containers.inspect(name):
                out[name] = (str(attrs.get("Id") or "?"), str(attrs["State"].get("StartedAt")))
        return out

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

    # -- judging -----------------------------------------------------------------------------

    def _settle(self, v: _Vanished, now: float) -> bool:
        """Decide a vanished rank's fate; False while the evidence may still come."""
        if v.proc.ident in self._settled:
            return True
        since = math.floor(v.proc.started) - 1  # log times have whole seconds
        reported = self.log.exit_of(v.proc.ns_pid, since) if self.log else None
        done = self._judge(v, now, since, reported)
        if done and reported:
            self.log.forget_exit(v.proc.ns_pid)
        return done

    def _judge(self, v: _Vanished, now: float, since: float, reported: tuple[int, bool] | None) -> bool:
        code = reported[0] if reported else v.exit_code
        if reported and reported[1]:  # the watchdog's "crashed" line
            return self._count(v.proc, self._refine(v, cause_of_exit_code(code)))
        if now < v.seen + self.grace or self._log_behind(v, now):
            return False
        if (self.log is not None and self.log.clean_stop_since(since)) or code == 0 or self._server_stopped(v.proc):
            return self._stopped(v.proc)
        server = (v.proc.launcher, v.proc.launcher_ticks)
        if now < max(v.seen, self._last_vanish.get(server, 0.0)) + self.stop_window:  # a stop may be under way
            return False
        return self._count(v.proc, self._refine(v, cause_of_exit_code(code)) if code is not None
                           else self._oom_cause(v))

    def _log_behind(self, v: _Vanished, now: float) -> bool:
        """The log is still being caught up on (a restarted exporter reading what it missed)."""
        return (self.log_caught_up is not None and not self.log_caught_up.is_set()
                and now < v.seen + CATCH_UP_WAIT_S)

    def _server_stopped(self, proc: Scheduler) -> bool:
        """Its server stopped as a whole: the launcher gone, no sibling rank left, or the
        container it ran in stopped or restarted since the rank was seen."""
        launcher = read_stat(self.proc_root, proc.launcher)
        if launcher.state != "live" or launcher.ticks != proc.launcher_ticks:
            return True
        if not any(s.launcher == proc.launcher and s.launcher_ticks == proc.launcher_ticks
                   for s in self.live.values()):
            return True
        if proc.container and self.containers is not None:
            attrs = self.containers.inspect(proc.container)
            if attrs is not None and (not attrs["State"].get("Running")
                                      or str(attrs["State"].get("StartedAt")) != proc.container_started):
                return True
        return False

    def _refine(self, v: _Vanished, cause: str) -> str:
        if cause == "sigkill" and self._oom_cause(v) == "oom_kill":
            return "oom_kill"
        return cause

    def _oom_cause(self, v: _Vanished) -> str:
        if self.kmsg is not None and self.kmsg.was_killed(v.proc.pid, int(v.proc.ticks or 0) / CLOCK_TICKS):
            return "oom_kill"
        grew = self._oom_grew_at.get(v.proc.cgroup)
        if grew is not None and grew >= v.seen - 2 * self.interval:
            return "oom_kill"
        if self.containers is not None and self.containers.oom_killed():
            return "oom_kill"
        return "unknown"

    def _judged(self, proc: Scheduler) -> None:
        self._settled[proc.ident] = None
        while len(self._settled) > SETTLED_KEEP:
            self._settled.popitem(last=False)

    def _count(self, proc: Scheduler, cause: str) -> bool:
        with self._lock:
            self._judged(proc)
            self._deaths[(proc.rank, cause)] = self._deaths.get((proc.rank, cause), 0) + 1
            if not self._carried(proc.rank, stopped_too=True):   # a stopped one is already 0 (poll)
                self._up[proc.rank] = 0
                self._dead.add(proc.rank)
        if self.on_death is not None:
            self.on_death()
        return True

    def _stopped(self, proc: Scheduler) -> bool:
        """A clean stop: the rank leaves, unless it died before (its 0 stays until it comes back)."""
        with self._lock:
            self._judged(proc)
            if proc.rank not in self._dead and not self._carried(proc.rank, stopped_too=True):
                self._up.pop(proc.rank, None)
        return True

    # -- the state file ----------------------------------------------------------------------

    def to_json(self) -> dict:
        with self._lock:
            return {"boot_id": self._boot, "up": dict(self._up), "dead": sorted(self._dead),
                    "deaths": [[r, c, n] for (r, c), n in sorted(self._deaths.items())],
                    "settled": [list(k) for k in self._settled],
                    "ranks": [asdict(s) for s in self.live.values()],
                    "vanished": [{**asdict(v.proc), "exit_code": v.exit_code} for v in self._vanished],
                    "oom_kills": dict(self._oom_counts)}

    @staticmethod
    def _parse(saved: dict) -> dict:
        def sched(rec):
            rec = dict(rec)
            code = rec.pop("exit_code", None)
            proc = Scheduler(**rec)
            for name, kind in _SCHEDULER_TYPES.items():  # else it fails later, in a loop
                value = getattr(proc, name)
                if isinstance(value, bool) or not isinstance(value, kind):
                    raise TypeError(f"a saved rank's {name} is {value!r}")
            return proc, None if code is None else int(code)

        return {"boot": str(saved["boot_id"]), "up": {str(r): bounded(v) for r, v in saved["up"].items()},
                "dead": {str(r) for r in saved["dead"]},
                "deaths": {(str(r), str(c)): bounded(n) for r, c, n in saved["deaths"]},
                "settled": OrderedDict(((int(p), str(t)), None) for p, t in saved["settled"]),
                "oom": {str(g): None if n is None else int(n) for g, n in saved["oom_kills"].items()},
                "ranks": [sched(r) for r in [*saved["ranks"], *saved["vanished"]]]}

    def check(self, saved: dict) -> None:
        """Raise when `saved` is not what to_json writes."""
        self._parse(saved)

    def restore(self, saved: dict) -> None:
        """Take back what a previous exporter on this node knew: the counts and up states as they
        were, and the ranks it saw, each looked at again now. One still running is watched on; one
        gone since (or a zombie) is judged as if it had just vanished, with the log read on from
        where that exporter stopped and the container's state as evidence. After a reboot the
        ranks it saw went with the server: not deaths, and not up (the dead keep their 0)."""
        p, now = self._parse(saved), time.monotonic()
        with self._lock:
            self._up, self._dead, self._deaths, self._settled = p["up"], p["dead"], p["deaths"], p["settled"]
            if p["boot"] != self._boot:
                self._up = {rank: 0 for rank in self._dead}
                return
            self._oom_counts = p["oom"]
            for sched, code in p["ranks"]:
                if sched.ident in self._settled:
                    continue
                stat = read_stat(self.proc_root, sched.pid)
                if stat.state == "live" and stat.ticks == sched.ticks:
                    self.live[sched.pid] = sched
                else:
                    self._vanished.append(_Vanished(sched, now, stat.exit_code if stat.ticks == sched.ticks else code))
            for v in self._vanished:
                if not self._carried(v.proc.rank):
                    self._up[v.proc.rank] = 0

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self._up), dict(self._deaths)


class WorkerCollector:
    def __init__(self, watcher: ProcessWatcher, families: Families):
        self.watcher, self.f = watcher, families

    def collect(self):
        up_now, deaths = self.watcher.snapshot()
        up = self.f.gauge("dsa_worker_up", "1 while the scheduler rank's process runs, 0 after it died or while it is stopped",
                          ("rank",))
        for rank, v in sorted(up_now.items()):
            up.add(v, rank)
        died = self.f.counter("dsa_worker_deaths_total", "Scheduler ranks that died while their server ran, by cause",
                              ("rank", "cause"))
        for (rank, cause), n in sorted(deaths.items()):
            died.add(n, rank, cause)
        return [up.family, died.family]
