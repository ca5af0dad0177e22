"""The sandbox refuses the network and stops runaway code: each shown against a control that
runs the same program outside it, or a program that stays within the limits."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from dsaops.bench import sandbox
from tests.support.polling import wait_for
from tests.support.prerequisites import need

MODES = ["namespace", "sockets"]


def mode_for(name: str) -> str:
    if name == "sockets":
        return "sockets"
    found = sandbox.isolation()
    need(found != "sockets", "a network namespace (root, or unprivileged user namespaces) for `unshare --net`")
    return found


def run(code: str, mode: str, timeout: float = 5, memory_mb: int = 256) -> sandbox.Outcome:
    return sandbox.run_python(code, timeout=timeout, memory_mb=memory_mb, mode=mode_for(mode))


@pytest.fixture
def listener():
    """A loopback TCP server that counts the connections it accepts."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1], accepted
    srv.close()


CONNECT = "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).close()\nprint('connected')\n"


@pytest.mark.parametrize("mode", MODES)
def test_network_is_refused(listener, mode):
    port, accepted = listener
    control = subprocess.run([sys.executable, "-c", CONNECT.format(port=port)], capture_output=True, text=True,
                             timeout=10, check=True)
    assert control.stdout.strip() == "connected" and wait_for(lambda: len(accepted) == 1, 5)
    outcome = run(CONNECT.format(port=port), mode)
    assert outcome.status == "failed", outcome
    assert ("Network is unreachable" if mode == "namespace" else "network access is refused") in outcome.detail
    time.sleep(0.3)
    assert len(accepted) == 1, "the sandboxed program reached the listener"


@pytest.mark.parametrize("mode", MODES)
def test_a_program_within_its_limits_passes(mode):
    outcome = run("import math\nassert math.factorial(5) == 120\nprint('ok')\n", mode)
    assert (outcome.status, outcome.detail) == ("passed", "ok")


def test_a_terminal_escape_in_the_last_line_is_shown_escaped():
    """The last line is the generated code's, printed in bench eval's progress and table."""
    outcome = run("print('\\x1b]0;pwned\\x07\\x1b[2J')\nraise SystemExit(1)\n", "sockets")
    assert (outcome.status, outcome.detail) == ("failed", "\\x1b]0;pwned\\x07\\x1b[2J")


@pytest.mark.parametrize("mode", MODES)
def test_an_infinite_loop_is_stopped(mode):
    started = time.monotonic()
    outcome = run("while True:\n    pass\n", mode, timeout=1.5)
    assert outcome.status == "timeout" and time.monotonic() - started < 5


@pytest.mark.parametrize("mode", MODES)
def test_a_memory_bomb_is_stopped(mode):
    outcome = run("hoard = []\nwhile True:\n    hoard.append(bytearray(10 ** 7))\n", mode, memory_mb=200)
    assert outcome.status == "memory" and outcome.seconds < 4


@pytest.mark.parametrize("mode", MODES)
def test_an_output_flood_is_stopped(mode):
    outcome = run("while True:\n    print('x' * 10000)\n", mode)
    assert outcome.status == "failed" and "wrote more than" in outcome.detail


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_leaves_nothing_behind(mode):
    need(os.geteuid() == 0 or mode == "namespace", "root (the process-count limit binds once it drops to a user id of its own)")
    bomb = ("import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
            "    except OSError:\n        pass\n")
    outcome = run(bomb, mode, timeout=1.5)
    assert outcome.status == "timeout"

    def strays() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"dsaops-sandbox-" in f.read():
                        found.append(pid)
            except OSError:
                pass
        return found
    assert wait_for(lambda: not strays(), 5), f"bomb processes left: {strays()}"


@pytest.mark.parametrize("mode", MODES)
def test_a_process_that_left_the_group_and_the_program_is_killed_too(mode):
    """A descendant in a session of its own running another program: neither the group nor the
    program's name finds it; its user id (root) or the PID namespace does."""
    need(os.geteuid() == 0 or mode == "namespace", "root (the program runs as a user id of its own)")
    marker = f"{time.time() % 1000 + 1000:.3f}"
    outcome = run(f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n", mode)
    assert outcome.status == "passed", outcome

    def left() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == f"sleep\0{marker}\0".encode():
                        found.append(int(pid))
            except OSError:
                pass
        return found
    survivors = left() if not wait_for(lambda: not left(), 2) else []
    for pid in survivors:
        os.kill(pid, 9)
    assert not survivors, "a process the program started outlived it"


CLOSES_ITS_FOLDERS = ("import os\nos.makedirs('d/e')\nopen('d/e/f', 'w').close()\n"
                      "os.chmod('d/e', 0)\nos.chmod('d', 0)\nos.chmod('.', 0)\nprint('closed')\n")


def run_unprivileged(code: str, mode: str, folder: str) -> list[str]:
    """[isolation, status, detail] of `code` run by a sandbox whose caller is not root (root
    removes any folder): in a forked child, as nobody where the test runs as root, with its
    temporary folders in `folder`."""
    python = sandbox.interpreter()        # as root: one that nobody may run
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        answer = ["error", "", ""]
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            sandbox.interpreter = lambda: python
            sandbox.isolation.cache_clear()
            tempfile.tempdir = folder
            found = "sockets" if mode == "sockets" else sandbox.isolation()
            answer = [found, "", ""]
            if mode == "sockets" or found != "sockets":
                outcome = sandbox.run_python(code, timeout=5, memory_mb=256, mode=found)
                answer = [found, outcome.status, outcome.detail]
        except BaseException as e:  # noqa: BLE001 -- the child must end here, saying why
            answer = ["error", type(e).__name__, str(e)]
        finally:
            os.write(write, json.dumps(answer).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        answer = json.loads(f.read())
    os.waitpid(pid, 0)
    return answer


@pytest.mark.parametrize("mode", MODES)
def test_folders_the_program_closed_go_with_its_own(mode):
    """A program that runs as its (unprivileged) caller may close the folders it made, or its own, to
    their owner: removing them failed, and the sandbox's folder stayed behind."""
    folder = tempfile.mkdtemp(prefix="dsaops-sandbox-test-")   # pytest's tmp_path is closed to nobody
    try:
        if os.geteuid() == 0:
            need(sandbox._others_may_run(sandbox.interpreter()), "a Python that nobody may run (/usr/bin/python3)")
            os.chown(folder, 65534, 65534)
        found, status, detail = run_unprivileged(CLOSES_ITS_FOLDERS, mode, folder)
        need(found != "sockets" or mode == "sockets", "unprivileged user namespaces for `unshare --net`")
        assert (status, detail) == ("passed", "closed"), (found, status, detail)
        assert os.listdir(folder) == []
    finally:
        shutil.rmtree(folder)
