"""Deaths seen from real processes titled like SGLang's schedulers (setproctitle), with the
log for the cause; the watcher runs its real background loop."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from dsaops.healthchecks.logfollow import LogFollower
from dsaops.healthchecks.logparse import CAUSES, LogState
from dsaops.healthchecks.metrics import ErrorCounts
from dsaops.healthchecks.oom import KernelOomRecords
from dsaops.healthchecks.processes import ProcessWatcher, read_stat

from benchmarks.sglang_standin import log_lines as L
from tests.healthchecks.watched_ranks import deaths, ranks_up
from tests.support.polling import wait_for

TITLES = [f"sglang::scheduler_TP{i}" for i in range(4)]


@pytest.fixture
def watched(tmp_path):
    """A watcher (0.2 s poll, 0.5 s scan, 1.5 s grace, 2.5 s stop window) over a followed log, a kernel-log
    file and a cgroup tree."""
    log, errors = LogState(), ErrorCounts()
    path = tmp_path / "sglang.log"
    path.write_text("")
    kmsg_path = tmp_path / "kmsg"
    kmsg_path.write_bytes(b"")
    follower = LogFollower(str(path), log, errors, poll=0.05).start()
    kmsg = KernelOomRecords(errors, str(kmsg_path), retry_s=0)
    watcher = ProcessWatcher(errors, log, kmsg, interval=0.2, scan_interval=0.5, grace=1.5, stop_window=2.5,
                             cgroup_root=str(tmp_path / "cgroup")).start()
    watcher.paths = {"log": path, "kmsg": kmsg_path}
    watcher.errors = errors
    yield watcher
    watcher.stop()
    follower.stop()
    kmsg.close()


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_sigkill_with_the_watchdog_line_is_one_death(watched, launcher):
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    assert set(watched.snapshot()[1]) == {(f"TP{i}", c) for i in range(4) for c in CAUSES}  # all start at 0
    victim = lch.pids[1]
    os.kill(victim, signal.SIGKILL)
    append(watched.paths["log"], L.line(L.crashed("scheduler_1", victim, -9)))
    assert wait_for(lambda: deaths(watched) == {("TP1", "sigkill"): 1}, 5), deaths(watched)
    assert watched.snapshot()[0] == {"TP0": 1, "TP1": 0, "TP2": 1, "TP3": 1}
    # SGLang then tears the rest down: not deaths; and the death stays counted once
    lch.kill_all()
    wait_for(lambda: False, 2.5)
    assert deaths(watched) == {("TP1", "sigkill"): 1}


def test_sigkill_without_a_line_is_counted_once(watched, launcher):
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    os.kill(lch.pids[2], signal.SIGKILL)
    # unknown, or sigkill when a poll saw the zombie before the launcher reaped it (0.1 s)
    assert wait_for(lambda: set(deaths(watched)) in ({("TP2", "unknown")}, {("TP2", "sigkill")}), 5), deaths(watched)
    first = deaths(watched)
    wait_for(lambda: False, 2)
    assert deaths(watched) == first and sum(first.values()) == 1


def test_kernel_oom_record_names_the_cause(watched, launcher):
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    victim = lch.pids[3]
    since_boot_us = int(time.clock_gettime(time.CLOCK_BOOTTIME) * 1e6)
    append(watched.paths["kmsg"], f"3,2201,{since_boot_us},-;Out of memory: Killed process {victim} (python3) "
                                  "total-vm:9000kB, anon-rss:8000kB\n")
    os.kill(victim, signal.SIGKILL)
    append(watched.paths["log"], L.line(L.crashed("scheduler_3", victim, -9)))
    assert wait_for(lambda: deaths(watched) == {("TP3", "oom_kill"): 1}, 5), deaths(watched)


def test_an_older_oom_record_for_a_reused_pid_is_not_the_cause(watched, launcher):
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    victim = lch.pids[1]
    append(watched.paths["kmsg"], f"3,2201,1000000,-;Out of memory: Killed process {victim} (python3)\n")  # at boot
    os.kill(victim, signal.SIGKILL)
    append(watched.paths["log"], L.line(L.crashed("scheduler_1", victim, -9)))
    assert wait_for(lambda: deaths(watched) == {("TP1", "sigkill"): 1}, 5), deaths(watched)


def test_cgroup_oom_kill_count_names_the_cause(watched, launcher, tmp_path):
    from dsaops.healthchecks.oom import cgroup_of

    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    group = cgroup_of(lch.pids[0])
    if group is None:
        pytest.skip("no cgroup v2 line in /proc/PID/cgroup here")
    events = tmp_path / "cgroup" / group.lstrip("/") / "memory.events"
    events.parent.mkdir(parents=True, exist_ok=True)
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    assert wait_for(lambda: watched._oom_counts.get(group) == 0, 5)  # a poll has taken the baseline
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    os.kill(lch.pids[0], signal.SIGKILL)
    assert wait_for(lambda: deaths(watched) == {("TP0", "oom_kill"): 1}, 5), deaths(watched)


def test_docker_oom_killed_names_the_cause(watched, launcher):
    """With no log line, kernel record or cgroup count, a watched container marked OOMKilled
    (the Docker Engine's answer; test_containers reads it from a real dockerd) gives the cause."""

    class OomKilledContainer:
        names = ("srv",)

        def inspect(self, name):
            return {"Id": "not-these-ranks", "State": {"Running": True, "OOMKilled": True}}

        def oom_killed(self):
            return True

    watched.containers = OomKilledContainer()
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    os.kill(lch.pids[2], signal.SIGKILL)
    assert wait_for(lambda: deaths(watched) == {("TP2", "oom_kill"): 1}, 5), deaths(watched)


def test_clean_stop_counts_nothing(watched, launcher):
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    append(watched.paths["log"], L.line(L.sigterm()))
    lch.stop()
    assert wait_for(lambda: watched.snapshot()[0] == {}, 5), watched.snapshot()[0]
    assert deaths(watched) == {}


def test_whole_server_killed_at_once_is_not_a_death(watched, launcher):
    """All ranks and the launcher gone together (e.g. `docker kill`): a stop, not a rank death."""
    lch = launcher(TITLES)
    assert ranks_up(watched, lch)
    os.kill(lch.proc.pid, signal.SIGKILL)
    lch.kill_all()
    assert wait_for(lambda: watched.snapshot()[0] == {}, 5)
    assert deaths(watched) == {}


def test_a_restarted_rank_is_up_again(watched, launcher):
    lch = launcher(TITLES[:2])
    assert ranks_up(watched, lch)
    os.kill(lch.pids[1], signal.SIGKILL)
    assert wait_for(lambda: watched.snapshot()[0].get("TP1") == 0, 5)
    launcher(["sglang::scheduler_TP1", "sglang::scheduler_TP5"])
    assert wait_for(lambda: watched.snapshot()[0].get("TP1") == 1, 5)


def test_unreadable_kernel_log_is_counted_and_retried():
    """As `nobody` (a container without CAP_SYSLOG) opening is refused: counted, and reading
    resumes once the record becomes readable. The effective uid is dropped only around the reads."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as nobody and back")
    folder = Path(tempfile.mkdtemp(prefix="dsaops-kmsg-"))  # pytest's tmp_path is closed to nobody
    folder.chmod(0o755)
    kmsg = folder / "kmsg"
    kmsg.write_bytes(b"3,1,1,-;oom-kill:constraint=CONSTRAINT_NONE,task=python3,pid=777,uid=0\n")
    kmsg.chmod(0o000)
    errors = ErrorCounts()
    records = KernelOomRecords(errors, str(kmsg), retry_s=0)

    def as_nobody(pid):
        os.seteuid(65534)
        try:
            return records.was_killed(pid)
        finally:
            os.seteuid(0)

    assert as_nobody(777) is False
    assert errors.counts()["kmsg"] == 1
    kmsg.chmod(0o644)
    assert as_nobody(777) is True
    assert errors.counts()["kmsg"] == 1
    records.close()
    shutil.rmtree(folder)


def test_a_zombies_status_without_ptrace_rights_is_unread():
    """The kernel shows a zombie's exit status as 0 to a reader without ptrace rights over it (here
    `nobody` reading root's process; in the playbook, the capability-less exporter): unread, not a
    clean exit. Its owner reads the real status (the negative control)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as nobody and back")
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        assert wait_for(lambda: read_stat("/proc", pid).state == "zombie", 5)
        assert read_stat("/proc", pid).exit_code == -9
        os.seteuid(65534)
        try:
            seen = read_stat("/proc", pid)
        finally:
            os.seteuid(0)
        assert seen.state == "zombie" and seen.exit_code is None, seen
    finally:
        os.waitpid(pid, 0)


@pytest.mark.parametrize("with_log,sigterm_line", [(True, False), (True, True), (False, False)],
                         ids=["log-without-sigterm-line", "log-with-sigterm-line", "no-log"])
def test_ranks_stopping_seconds_apart_are_no_deaths(watched, launcher, with_log, sigterm_line):
    """A worker node's ranks stop 1.5 s apart, 4.5 s in all, longer than the stop window (2.5 s, counted
    from the last rank that vanished): the launcher's exit tells a whole-server stop, with or without
    the SIGTERM line or a log."""
    if not with_log:
        watched.log = None
    options = ["--stop-gap", "1.5", "--log", str(watched.paths["log"])] + (["--sigterm-line"] if sigterm_line else [])
    lch = launcher(TITLES, *options)
    assert ranks_up(watched, lch)
    lch.stop()
    assert wait_for(lambda: watched.snapshot()[0] == {}, 8), watched.snapshot()[0]
    assert deaths(watched) == {}


def test_negative_control_gaps_wider_than_the_window_read_as_deaths(watched, launcher):
    watched.stop_window = watched.grace = 0.6
    lch = launcher(TITLES[:3], "--stop-gap", "1.5")
    assert ranks_up(watched, lch)
    lch.stop()
    assert wait_for(lambda: sum(deaths(watched).values()) >= 1, 5)


def test_a_zombies_exit_status_is_the_cause(watched, launcher):
    """A worker node's launcher joins in order: TP2, dead first, stays a zombie whose status says
    SIGSEGV; with its launcher and siblings alive it is a death once the window has passed."""
    lch = launcher(TITLES[:3], "--join-in-order")
    assert ranks_up(watched, lch)
    os.kill(lch.pids[2], signal.SIGSEGV)
    assert wait_for(lambda: watched.snapshot()[0].get("TP2") == 0, 3)  # down at once
    assert deaths(watched) == {}  # judged only after the window
    assert wait_for(lambda: deaths(watched) == {("TP2", "sigsegv"): 1}, 5), deaths(watched)


def test_a_stopped_rank_is_down_while_stopped_and_no_death(watched, launcher):
    """SIGSTOP hangs the rank (its siblings wait in NCCL) with its process still there: dsa_worker_up 0,
    DsaWorkerRankDown's series, until it runs again; no death is counted."""
    lch = launcher(TITLES[:3])
    assert ranks_up(watched, lch)
    os.kill(lch.pids[1], signal.SIGSTOP)
    assert wait_for(lambda: watched.snapshot()[0] == {"TP0": 1, "TP1": 0, "TP2": 1}, 3), watched.snapshot()[0]
    wait_for(lambda: False, 1.5)  # past a scan and the grace
    assert watched.snapshot()[0]["TP1"] == 0 and lch.pids[1] in watched.live
    os.kill(lch.pids[1], signal.SIGCONT)
    assert wait_for(lambda: watched.snapshot()[0] == {"TP0": 1, "TP1": 1, "TP2": 1}, 3), watched.snapshot()[0]
    assert deaths(watched) == {}


def test_a_death_while_the_ranks_next_process_is_stopped_leaves_it_no_dead_rank(watched, launcher):
    """A restarted server's rank is stopped while the old one's death is counted: the rank is still held,
    so once it runs again and its server stops cleanly, the rank leaves rather than staying at 0."""
    old = launcher(TITLES[:2])
    assert ranks_up(watched, old)
    new = launcher(TITLES[1:2])
    os.kill(new.pids[0], signal.SIGSTOP)
    assert wait_for(lambda: new.pids[0] in watched.live, 3)
    os.kill(old.pids[1], signal.SIGKILL)
    append(watched.paths["log"], L.line(L.crashed("scheduler_1", old.pids[1], -9)))
    assert wait_for(lambda: deaths(watched) == {("TP1", "sigkill"): 1}, 5), deaths(watched)
    assert watched.snapshot()[0] == {"TP0": 1, "TP1": 0}
    os.kill(new.pids[0], signal.SIGCONT)
    assert wait_for(lambda: watched.snapshot()[0] == {"TP0": 1, "TP1": 1}, 3), watched.snapshot()[0]
    append(watched.paths["log"], L.line(L.sigterm()))
    new.stop()
    assert wait_for(lambda: watched.snapshot()[0] == {"TP0": 1}, 5), watched.snapshot()[0]


def test_a_rank_that_exits_0_alone_is_no_death(watched, launcher):
    lch = launcher(TITLES[:3], "--join-in-order")
    assert ranks_up(watched, lch)
    os.kill(lch.pids[1], signal.SIGTERM)  # the stand-in exits 0 on SIGTERM; its zombie says so
    assert wait_for(lambda: "TP1" not in watched.snapshot()[0], 5), watched.snapshot()[0]
    assert deaths(watched) == {}
