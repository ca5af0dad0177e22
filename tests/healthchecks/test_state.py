"""Deaths counted exactly once across restarts of the exporter: the state file on the node, with
real processes titled like SGLang's schedulers under the stand-in launcher, and its log."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from dsaops.healthchecks.containers import Containers
from dsaops.healthchecks.exporter import Config, Exporter
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts
from dsaops.healthchecks.processes import ProcessWatcher, boot_id
from dsaops.healthchecks.state import StateKeeper

from benchmarks.sglang_standin import log_lines as L
from tests.healthchecks.prometheus_text import scrape
from tests.healthchecks.watched_ranks import deaths, ranks_up
from tests.support.polling import wait_for
from tests.support.ports import free_port

TITLES = [f"sglang::scheduler_TP{i}" for i in range(4)]


@pytest.fixture
def node(tmp_path, fake_server):
    """An exporter maker over one node's log and state file; each `start()` is a new exporter
    process's worth of state (fresh objects), the previous one stopped first."""
    running = []

    def start():
        for exp in running:
            exp.stop()
        running.clear()
        exp = Exporter(Config(server_url=fake_server.url, node="n", log_file=str(tmp_path / "sglang.log"),
                              interval=1.0, process_interval=0.2, stop_window=2.0, kmsg=None,
                              state_file=str(tmp_path / "state" / "exporter.json")))
        exp.watcher.scan_interval, exp.watcher.grace = 0.5, 1.0
        exp.follower.interval = 0.05
        running.append(exp.start())
        return exp

    (tmp_path / "state").mkdir()
    (tmp_path / "sglang.log").write_text("")
    yield {"start": start, "log": tmp_path / "sglang.log", "state": tmp_path / "state" / "exporter.json"}
    for exp in running:
        exp.stop()


def up(exp):
    return exp.watcher.snapshot()[0]


def test_a_death_outlives_restarts_of_the_exporter(node, launcher):
    lch = launcher(TITLES, "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    os.kill(lch.pids[1], signal.SIGKILL)  # a worker node: no watchdog line, the server runs on
    # the cause: sigkill when a poll saw the zombie before its launcher reaped it, else unknown
    assert wait_for(lambda: set(deaths(exp.watcher)) in ({("TP1", "unknown")}, {("TP1", "sigkill")}), 8), deaths(exp.watcher)
    first = deaths(exp.watcher)
    assert sum(first.values()) == 1
    for _ in range(2):  # restarted twice: still one death, and TP1 still down while its server runs
        exp = node["start"]()
        assert wait_for(lambda e=exp: {r for r, v in up(e).items() if v} == {"TP0", "TP2", "TP3"}, 10), up(exp)
        wait_for(lambda: False, 3)  # longer than the stop window: nothing more is counted
        assert deaths(exp.watcher) == first
        assert up(exp) == {"TP0": 1, "TP1": 0, "TP2": 1, "TP3": 1}
    assert "TP0" in json.loads(node["state"].read_text())["log"]["kv"]  # the startup lines, not re-read


def test_negative_control_without_the_state_file_a_restart_forgets(node, launcher):
    lch = launcher(TITLES[:2], "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    os.kill(lch.pids[1], signal.SIGKILL)
    assert wait_for(lambda: sum(deaths(exp.watcher).values()) == 1, 8)
    exp.stop()
    node["state"].unlink()
    exp = node["start"]()
    assert wait_for(lambda: up(exp) == {"TP0": 1}, 8) and deaths(exp.watcher) == {}


def test_a_rank_killed_while_the_exporter_is_down_is_counted_once_with_its_cause(node, launcher):
    lch = launcher(TITLES, "--join-in-order", "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    exp.stop()
    os.kill(lch.pids[2], signal.SIGKILL)  # joined after TP0 and TP1: a zombie that says SIGKILL
    exp = node["start"]()
    assert wait_for(lambda: deaths(exp.watcher) == {("TP2", "sigkill"): 1}, 8), deaths(exp.watcher)
    assert up(exp)["TP2"] == 0
    exp = node["start"]()
    wait_for(lambda: False, 3)
    assert deaths(exp.watcher) == {("TP2", "sigkill"): 1} and up(exp)["TP2"] == 0


def test_a_server_that_died_and_restarted_while_the_exporter_was_down(node, launcher):
    """The head node's watchdog logs the crash and ends the server; a new server starts; then the
    exporter comes back: the log read on from its saved position says who died and why."""
    lch = launcher(TITLES, "--watchdog", "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    exp.stop()
    victim = lch.pids[3]
    os.kill(victim, signal.SIGKILL)
    assert lch.proc.wait(10) == 1
    assert f"(pid={victim}) crashed with exit code -9" in node["log"].read_text()
    again = launcher(TITLES, "--watchdog", "--log", str(node["log"]))
    exp = node["start"]()
    assert wait_for(lambda: deaths(exp.watcher) == {("TP3", "sigkill"): 1}, 8), deaths(exp.watcher)
    assert ranks_up(exp.watcher, again)  # the restarted server's ranks are up, TP3 too
    assert exp.follower.events["resumed"] == 1


def test_a_clean_stop_while_the_exporter_is_down_is_no_death(node, launcher):
    lch = launcher(TITLES, "--sigterm-line", "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    exp.stop()
    lch.stop()
    exp = node["start"]()
    assert wait_for(lambda: up(exp) == {}, 8), up(exp)
    assert deaths(exp.watcher) == {}


def test_the_state_file_is_replaced_whole_and_a_bad_one_is_set_aside(node, launcher):
    lch = launcher(TITLES[:2], "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    exp.keeper.save()
    saved = json.loads(node["state"].read_text())
    assert saved["version"] == 1 and {r["rank"] for r in saved["processes"]["ranks"]} == {"TP0", "TP1"}
    assert not list(node["state"].parent.glob("*.tmp"))  # written aside, then renamed over
    exp.stop()
    node["state"].write_text('{"version": 1, "processes": {"up": [')  # cut short
    exp = node["start"]()
    assert exp.errors.counts()["state"] == 1
    assert (node["state"].parent / "exporter.json.bad").exists()
    assert ranks_up(exp.watcher, lch)  # and it serves afresh
    exp.keeper.save()
    assert json.loads(node["state"].read_text())["version"] == 1


def test_a_state_write_that_fails_is_counted_and_retried(node, launcher, tmp_path):
    lch = launcher(TITLES[:1], "--log", str(node["log"]))
    exp = node["start"]()
    assert ranks_up(exp.watcher, lch)
    folder = node["state"].parent
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not available here (needs root and an ext4/xfs-like filesystem)")
    try:
        exp.log.events["sigquit"] += 1  # a change to write
        exp.keeper.save()
        assert exp.errors.counts()["state"] >= 1
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    exp.keeper.save()
    assert json.loads(node["state"].read_text())["log"]["events"]["sigquit"] == 1


def _saved_rank(pid, rank, **changes):
    """A rank as the state file keeps it (ProcessWatcher.to_json)."""
    return {"pid": pid, "ns_pid": pid, "rank": rank, "launcher": 1, "launcher_ticks": "1", "started": 1.0,
            "ticks": "123", "cgroup": None, "container": None, "container_started": None, **changes}


def _state_file(path, boot, ranks=(), vanished=()):
    """What an exporter wrote: TP0 and TP1 up (processes long gone), TP2 dead once."""
    path.write_text(json.dumps({"version": 1, "processes": {
        "boot_id": boot, "up": {"TP0": 1, "TP1": 1, "TP2": 0}, "dead": ["TP2"], "deaths": [["TP2", "sigkill", 1]],
        "settled": [], "ranks": list(ranks), "vanished": list(vanished), "oom_kills": {}}}))


@pytest.mark.parametrize("same_boot", [False, True], ids=["after-a-reboot", "negative-control-same-boot"])
def test_after_a_reboot_the_ranks_it_saw_are_not_up(tmp_path, same_boot):
    """The ranks went with the server at the reboot: not deaths and not up; the dead keep their 0.
    On the same boot the vanished ranks are judged instead (down at once)."""
    watcher = ProcessWatcher(ErrorCounts(), stop_window=60.0)
    _state_file(tmp_path / "state.json", boot_id() if same_boot else "another-boot",
                ranks=[_saved_rank(4_000_001, "TP0"), _saved_rank(4_000_002, "TP1")])
    assert StateKeeper(str(tmp_path / "state.json"), watcher.errors, {"processes": watcher}).restore()
    watcher.poll()
    expected = {"TP0": 0, "TP1": 0, "TP2": 0} if same_boot else {"TP2": 0}
    assert watcher.snapshot() == (expected, {("TP2", "sigkill"): 1})


def test_a_file_without_the_log_section_is_taken_back_with_the_log_empty(tmp_path):
    """Written by an exporter run without --log-file, read by one with it: the deaths stay."""
    errors, watcher, log = ErrorCounts(), ProcessWatcher(ErrorCounts()), LogState()
    path = tmp_path / "state.json"
    _state_file(path, boot_id())
    assert StateKeeper(str(path), errors, {"processes": watcher, "log": log}).restore()
    assert errors.counts()["state"] == 0 and path.exists() and not (tmp_path / "state.json.bad").exists()
    assert watcher.snapshot()[1] == {("TP2", "sigkill"): 1} and log.position is None and not log.kv


@pytest.mark.parametrize("field, value", [("rank", ["TP0"]), ("started", None), ("pid", "4000001"), ("ticks", 123)])
def test_a_saved_rank_of_the_wrong_type_sets_the_file_aside(tmp_path, field, value):
    """Taken back, such a rank would stop the exporter's start or every later poll's judging."""
    errors = ErrorCounts()
    watcher = ProcessWatcher(errors)
    path = tmp_path / "state.json"
    _state_file(path, boot_id(), vanished=[{**_saved_rank(4_000_001, "TP0"), field: value, "exit_code": None}])
    assert not StateKeeper(str(path), errors, {"processes": watcher}).restore()
    assert errors.counts()["state"] == 1 and (tmp_path / "state.json.bad").exists() and not path.exists()
    watcher.poll()
    assert watcher.snapshot() == ({}, {})


def test_a_write_cut_short_keeps_the_old_file(tmp_path):
    """A file-size limit stands in for a disk that fills mid-write: the write fails and is counted,
    and the file written before stays whole."""
    script = """
import json, resource, sys
from dsaops.healthchecks.metrics import ErrorCounts
from dsaops.healthchecks.state import StateKeeper
class Part:
    def __init__(self, n): self.n = n
    def to_json(self): return ["x" * 50] * self.n
    def check(self, saved): pass
    def restore(self, saved): pass
errors = ErrorCounts()
StateKeeper(sys.argv[1], errors, {"p": Part(10)}).save()
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
StateKeeper(sys.argv[1], errors, {"p": Part(100)}).save()
print(errors.counts()["state"])
"""
    path = tmp_path / "state.json"
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1", done.stdout + done.stderr
    assert len(json.loads(path.read_text())["p"]) == 10
    assert not list(tmp_path.glob("*.tmp"))


def test_sigterm_ends_the_exporter_with_its_state_saved(tmp_path, fake_server):
    """`docker stop` sends SIGTERM: the exporter stops as on Ctrl-C and writes what it learnt last."""
    log, state, port = tmp_path / "sglang.log", tmp_path / "state.json", free_port()
    log.write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "exporter", "--server-url", fake_server.url,
                             "--listen", f"127.0.0.1:{port}", "--log-file", str(log), "--state-file", str(state),
                             "--node", "n", "--kmsg", "none"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "serving" in proc.stdout.readline()
        with open(log, "a") as out:
            out.write(L.line(L.kv_allocated(4242, 1.0), ("TP0",)))
        metrics = f"http://127.0.0.1:{port}/metrics"
        assert wait_for(lambda: scrape(metrics).get('dsa_kv_pool_tokens{node="n",rank="TP0"}'), 10, 0.02)
        proc.send_signal(signal.SIGTERM)  # at once: the state loop writes every 2 s
        assert proc.wait(timeout=10) == 130, proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    assert json.loads(state.read_text())["log"]["kv"]["TP0"][1] == 4242


HUGE = 10 ** 400  # valid JSON; no float holds it


@pytest.mark.parametrize("part, change", [
    ("processes", lambda s: s["processes"]["deaths"][0].__setitem__(2, HUGE)),
    ("processes", lambda s: s["processes"]["up"].__setitem__("TP0", HUGE)),
    ("log", lambda s: s["log"]["kv"].__setitem__("TP0", ["torch.bfloat16", HUGE, 1.0])),
    ("log", lambda s: s["log"]["events"].__setitem__("sigquit", HUGE)),
    ("containers", lambda s: s["containers"]["c"].__setitem__("base", HUGE)),
], ids=["death-count", "up", "kv-tokens", "log-event", "container-restarts"])
def test_a_saved_count_too_large_for_a_sample_sets_the_file_aside(tmp_path, part, change):
    """Taken back, it failed every scrape of its collector: all that part's series were gone,
    and the next write kept it."""
    errors = ErrorCounts()
    parts = {"processes": ProcessWatcher(errors), "log": LogState(), "containers": Containers(["c"], errors)}
    path = tmp_path / "state.json"
    _state_file(path, boot_id())
    saved = json.loads(path.read_text())
    saved["log"], saved["containers"] = LogState().to_json(), {"c": {"id": "x", "count": 1, "base": 0}}
    change(saved)
    path.write_text(json.dumps(saved))
    assert not StateKeeper(str(path), errors, parts).restore()
    assert errors.counts()["state"] == 1 and (tmp_path / "state.json.bad").exists()


def test_a_fifo_at_the_state_path_does_not_block_the_start(tmp_path):
    """Opened plainly, a FIFO waited for a writer: the exporter never started its loops or answered."""
    errors, log = ErrorCounts(), LogState()
    path = tmp_path / "state.json"
    os.mkfifo(path)
    keeper = StateKeeper(str(path), errors, {"log": log})
    restored = []
    reader = threading.Thread(target=lambda: restored.append(keeper.restore()), daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # let the blocked open go, so the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert restored == [False] and errors.counts()["state"] == 1
    log.events["sigquit"] += 1
    keeper.save()  # and the next write puts a file there
    assert json.loads(path.read_text())["log"]["events"]["sigquit"] == 1
