"""Run untrusted Python (a model's generated code) in a child process that cannot reach the
network and cannot run away.

- Network: a new network namespace (`unshare --net`: no interface but a loopback that is down)
  where the kernel permits one, as root or in an unprivileged user namespace; elsewhere the
  program starts with the socket module's constructors replaced by a refusal (weaker: code that
  reaches the C library or starts another program could still connect; `isolation()` says which
  is in force).
- Runaway code: address-space, CPU-time, file-size and process-count rlimits; a wall-clock
  limit that kills the process group, and with namespaces a PID namespace whose end takes every
  descendant along (a fork bomb that calls setsid included); without them, as root, a sweep of
  every process with the program's user id, else of the processes still running the program.
  Run as root, the program drops to a user id of its own first (no account has it, no process
  runs as it), so the process-count limit binds, it writes nowhere it may not, and the sweep
  finds a descendant that left the group and runs another program.
- It starts in an empty folder of its own with a bare environment, the interpreter isolated
  (-I -S: no site-packages, no environment variables read).
"""
from __future__ import annotations

import contextlib
import functools
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dsaops.bench import bounded
from dsaops.verify_probes import printable

RUN_UIDS = range(0x70000000, 0x71000000)   # past systemd's container ranges: ids no account is given
OUTPUT_LIMIT = 1 << 20       # bytes a program may write to stdout and stderr together
SPARE_PROCESSES = 32         # processes a program may add to its user's count
UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child"]

# Runs in the child before the program: limits, then drop privileges, then exec the program.
_LAUNCH = """\
import os, resource, sys
mem, cpu, fsize, nproc, uid = map(int, sys.argv[1:6])
prog = sys.argv[6]
for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
if uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
os.execv(sys.executable, [sys.executable, "-I", "-S", prog])
"""

# Run as the program's user id: every process with it but this one (kill -1), none left.
_KILL_ALL = """\
import os, signal
try:
    os.kill(-1, signal.SIGKILL)
except ProcessLookupError:
    pass
"""

# Prepended to the program where no network namespace can be had.
_REFUSE_SOCKETS = """\
import _socket as _dsaops_s, socket as _dsaops_t
def _dsaops_refuse(*args, **kwargs):
    raise PermissionError("network access is refused in the dsaops sandbox")
for _dsaops_m in (_dsaops_s, _dsaops_t):
    for _dsaops_n in ("socket", "socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo"):
        if hasattr(_dsaops_m, _dsaops_n):
            setattr(_dsaops_m, _dsaops_n, _dsaops_refuse)
del _dsaops_s, _dsaops_t, _dsaops_m, _dsaops_n
"""


@dataclass(frozen=True)
class Outcome:
    status: str        # passed | failed | timeout | memory
    detail: str        # the last line the program wrote, or what stopped it
    seconds: float


@functools.cache
def isolation() -> str:
    """`netns` (root), `userns` (an unprivileged user namespace), or `sockets` (the in-process refusal)."""
    if shutil.which("unshare"):
        for mode, extra in (("netns", []), ("userns", ["--map-root-user"])):
            if mode == "netns" and os.geteuid() != 0:
                continue
            ok = subprocess.run(UNSHARE + extra + ["true"], capture_output=True, check=False, timeout=10)
            if ok.returncode == 0:
                return mode
    return "sockets"


@functools.cache
def interpreter() -> str:
    """A Python for the program: this one's base interpreter, or the system's where nobody may not run
    that one (a venv or pyenv under /root)."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if os.geteuid() != 0 or _others_may_run(base):
        return base
    return next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if _others_may_run(p)), base)


def _others_may_run(path: str) -> bool:
    """Every folder on the way searchable, and the file executable, by any user."""
    real = Path(os.path.realpath(path))
    try:
        return real.stat().st_mode & 0o001 and all(d.stat().st_mode & 0o001 for d in real.parents)
    except OSError:
        return False


def run_python(code: str, *, timeout: float, memory_mb: int, mode: str | None = None) -> Outcome:
    """Run `code` as a program; passed when it exits 0 within the limits."""
    mode = mode or isolation()
    folder = Path(tempfile.mkdtemp(prefix="dsaops-sandbox-"))
    try:
        folder.chmod(0o755)   # readable by nobody; written by no one but its owner
        program = folder / "program.py"
        program.write_text((_REFUSE_SOCKETS if mode == "sockets" else "") + code)
        program.chmod(0o644)
        python, uid = interpreter(), -1
        if os.geteuid() == 0 and mode != "userns" and _others_may_run(python):
            uid = _unused_uid()
        prefix = [] if mode == "sockets" else UNSHARE + (["--map-root-user"] if mode == "userns" else []) + ["--"]
        argv = prefix + [python, "-I", "-S", "-c", _LAUNCH, str(memory_mb << 20), str(int(timeout) + 1),
                         str(OUTPUT_LIMIT), str(_process_limit(uid)), str(uid), str(program)]
        with open(folder / "output", "w+b") as output:
            started = time.monotonic()
            rc = bounded.run(argv, timeout, cwd=folder, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                             env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(folder)})
            _kill_strays(str(program), uid, python)
            seconds = round(time.monotonic() - started, 3)
            flooded = os.fstat(output.fileno()).st_size >= OUTPUT_LIMIT
            output.seek(max(0, os.fstat(output.fileno()).st_size - 4096))
            text = output.read().decode(errors="replace")
    finally:
        _remove(folder)
    return _outcome(rc, text, seconds, timeout, flooded)


def _remove(folder: Path) -> None:
    """The program's folder and all in it. A program that ran as the caller may have closed folders
    it made, or this one, to their owner: each is opened to its owner before the walk goes in."""
    _open_to_owner(str(folder))
    for parent, folders, _ in os.walk(folder):    # top-down: a folder's entries are read after it is opened
        for name in folders:
            _open_to_owner(os.path.join(parent, name))
    shutil.rmtree(folder, ignore_errors=True)


def _open_to_owner(path: str) -> None:
    if not os.path.islink(path):     # chmod follows a link: only the folders themselves
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)


def _outcome(rc: int | None, text: str, seconds: float, timeout: float, flooded: bool) -> Outcome:
    """Python ignores SIGXFSZ: a write past the file-size limit raises instead, so a flood is told
    by the output's size. The last line is the generated code's: printed escaped."""
    last = printable(next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")[:300])
    if rc is None or rc == -signal.SIGXCPU:
        return Outcome("timeout", f"stopped after {timeout:g} s", seconds)
    if "MemoryError" in last:
        return Outcome("memory", "ran out of its memory limit", seconds)
    if flooded:
        return Outcome("failed", f"wrote more than {OUTPUT_LIMIT} bytes", seconds)
    if rc == 0:
        return Outcome("passed", last, seconds)
    return Outcome("failed", last or f"exit status {rc}", seconds)


def _unused_uid() -> int:
    """A user id that no account names and no process runs as: the program's alone."""
    running = set(_process_uids())
    while True:
        uid = random.choice(RUN_UIDS)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in running:
                return uid


def _kill_strays(program: str, uid: int, python: str) -> None:
    """Forks that left the process group (setsid) and, without a PID namespace, outlived it: every
    process with the program's own user id; run as the caller's, every process still running the
    program, until none is left."""
    if uid >= 0:
        subprocess.run([python, "-I", "-S", "-c", _KILL_ALL], user=uid, group=uid, extra_groups=[], env={},
                       stdin=subprocess.DEVNULL, capture_output=True, check=False)
        return
    marker = program.encode()
    for _ in range(50):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker in f.read():
                        os.kill(int(entry.name), signal.SIGKILL)
                        found = True
            except (OSError, ValueError):
                pass
        if not found:
            return
        time.sleep(0.02)


def _process_limit(uid: int) -> int:
    """Processes the program's user may have: what it has now, plus a few."""
    return _process_uids().count(os.getuid() if uid < 0 else uid) + SPARE_PROCESSES


def _process_uids() -> list[int]:
    """The owner of each running process."""
    uids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uids.append(entry.stat().st_uid)
            except OSError:
                pass
    return uids

