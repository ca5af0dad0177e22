"""The boot gate: a launch with fp8 KV and mixed DSA backends must be refused at startup.

fp8_e4m3 KV with tilelang prefill and flashmla_sparse decode would write raw fp8 rows that
the other backend reads as the scaled layout. SGLang 0.5.23 refuses it in argument
validation (srt/arg_groups/overrides.py `_check_dsa_backend_constraints`); the patched
image must still refuse it. A launch that prints the refusal and exits non-zero passes;
one that starts serving, keeps running, exits 0 or dies for another reason fails, and is
killed (its whole process group; with --image, the container).
"""
from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from dsaops.kv_layout import MIXED_TILELANG_REFUSAL
from dsaops.launch_args import kv_cache_args

# The refused pairing, spelled by the builder every deployment's command line comes from.
GATE_ARGS = tuple(kv_cache_args("fp8_e4m3", "tilelang", "flashmla_sparse"))
READY_LINE = "The server is fired up and ready to roll!"   # entrypoints/http_server.py, once serving
DOCKER_RUN_FAILED = 125   # `docker run`'s own failure (engine, GPU runtime, image): the container never ran


@dataclass
class GateResult:
    passed: bool
    detail: str
    seconds: float
    exit_code: int | None
    tail: list[str]


def docker_command(image: str, *, model_path: str, name: str, docker_args: list[str], sglang_args: list[str]) -> list[str]:
    """`docker run IMAGE <launch_server args>` (the image contract), the gate flags added; the
    entrypoint tees SGLang's log to the container's stdout, where the refusal is read live."""
    return ["docker", "run", "--rm", "--name", name, "--gpus", "all", "--ipc", "host",
            "-e", "DSAOPS_EXPORTER=0", *docker_args,
            image, "--model-path", model_path, *GATE_ARGS, *sglang_args]


def run_gate(command: list[str] | str, *, timeout: float, grace: float = 10.0, expect: str = MIXED_TILELANG_REFUSAL,
             progress=None, cleanup=None) -> GateResult:
    """Launch `command` (a list, or a shell string) and judge how it ends."""
    start = time.monotonic()
    argv = ["bash", "-c", command] if isinstance(command, str) else command
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    except OSError as e:
        return GateResult(False, f"cannot start the launch: {e}", 0.0, None, [])
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    tail: list[str] = []
    refused_at = ready = closed = None
    while True:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            line = ""
        if line is None:  # output closed: the launch has exited (or closed its output)
            closed = True
            break
        if line:
            tail = (tail + [line.rstrip("\n")])[-20:]
            if progress:
                progress(f"  | {line.rstrip()}")
            if expect in line and refused_at is None:
                refused_at = time.monotonic()
            if READY_LINE in line:
                ready = True
                break
        now = time.monotonic()
        if now - start > timeout or (refused_at and now - refused_at > grace):
            break
    code = _finish(proc, cleanup, exiting=closed)
    seconds = round(time.monotonic() - start, 2)
    if ready:
        return GateResult(False, "the launch started serving instead of refusing", seconds, code, tail)
    if code is None:
        why = "printed the refusal but kept running" if refused_at else f"still running after {timeout:g} s"
        return GateResult(False, f"{why}; killed", seconds, code, tail)
    if refused_at and code != 0:
        return GateResult(True, f"refused at startup with SGLang's message (exit code {code})", seconds, code, tail)
    if code == 0:
        return GateResult(False, "the launch exited 0 without refusing", seconds, code, tail)
    return GateResult(False, f"the launch failed (exit code {code}) without SGLang's refusal: another error, "
                             "see the last lines", seconds, code, tail)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _finish(proc: subprocess.Popen, cleanup, *, exiting: bool) -> int | None:
    """The exit code if the launch ended by itself, else None after killing it (`cleanup`
    first, e.g. `docker rm -f`). Either way, whatever it left in its process group goes too."""
    try:
        code = proc.wait(timeout=2) if exiting else proc.poll()
    except subprocess.TimeoutExpired:
        code = None
    if code is None and cleanup:
        cleanup()
    _kill_group(proc)
    return code


def _kill_group(proc: subprocess.Popen) -> None:
    pgid = proc.pid  # start_new_session: the launch leads its own group
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or its zombie keeps the group alive
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def describe(command: list[str] | str) -> str:
    return command if isinstance(command, str) else shlex.join(command)
