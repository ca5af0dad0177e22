"""`dsaops log-writer`: the image's own rotation, as a real process fed through a pipe."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from dsaops.healthchecks.logwriter import RotatingFile

from tests.support.polling import wait_for


def writer(path, *args):
    return subprocess.Popen([sys.executable, "-m", "dsaops", "log-writer", str(path), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_rotates_between_lines_keeps_the_newest_and_echoes_everything(tmp_path):
    log = tmp_path / "sglang.log"
    proc = writer(log, "--max-bytes", "4096", "--keep", "3")
    lines = [f"line {i:05d} " + "x" * 80 + "\n" for i in range(400)]  # ~36 KB: 9 rotations
    out, _ = proc.communicate("".join(lines).encode(), timeout=30)
    assert proc.returncode == 0 and out.decode() == "".join(lines)  # docker logs sees it all
    files = [log.with_name(f"sglang.log.{i}") for i in (3, 2, 1)] + [log]
    assert not log.with_name("sglang.log.4").exists()
    kept = "".join(f.read_text() for f in files)
    assert "".join(lines).endswith(kept)  # the newest lines, in order, none cut
    assert all(f.stat().st_size <= 4096 for f in files)
    assert all(f.read_text().endswith("\n") for f in files)


def test_sigterm_does_not_end_it_before_its_input(tmp_path):
    log = tmp_path / "sglang.log"
    proc = writer(log)
    proc.stdin.write(b"first\n")
    proc.stdin.flush()
    assert wait_for(lambda: log.exists() and log.read_text() == "first\n", 10)  # running, signals set
    proc.send_signal(signal.SIGTERM)  # docker stop reaches every process at the end; the last lines must land
    proc.stdin.write(b"SIGTERM received. last words\n")
    proc.stdin.close()
    assert proc.wait(10) == 0
    assert log.read_text() == "first\nSIGTERM received. last words\n"


def test_bad_settings_are_one_line_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dsaops", "log-writer", str(tmp_path / "x"), "--keep", "0"],
                       capture_output=True, text=True, timeout=30, input="", check=False)
    assert r.returncode == 2 and "DSAOPS_LOG_KEEP" in r.stderr and "Traceback" not in r.stderr


def test_a_log_deleted_or_renamed_away_is_started_anew_at_its_path(tmp_path):
    """An admin's `rm` or a rename-style logrotate: the lines after it land at FILE, where the follower
    looks, not in the old file until the next rotation (256 MiB later)."""
    log = tmp_path / "sglang.log"
    proc = writer(log)
    try:
        proc.stdin.write(b"first\n")
        proc.stdin.flush()
        assert wait_for(lambda: log.exists() and log.read_text() == "first\n", 10)
        log.unlink()
        proc.stdin.write(b"after rm\n")
        proc.stdin.flush()
        assert wait_for(lambda: log.exists() and log.read_text() == "after rm\n", 5)
        log.rename(tmp_path / "sglang.log.old")
        proc.stdin.write(b"after mv\n")
        proc.stdin.flush()
        assert wait_for(lambda: log.exists() and log.read_text() == "after mv\n", 5)
        assert (tmp_path / "sglang.log.old").read_text() == "after rm\n"
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_lines_written_one_at_a_time_never_take_a_file_past_the_limit(tmp_path):
    """As SGLang writes: one line a write. A line that does not fit starts the next file."""
    log = tmp_path / "sglang.log"
    out = RotatingFile(str(log), 4096, 3)
    lines = [f"line {i:05d} " + "x" * 88 + "\n" for i in range(200)]   # 100 bytes each
    for line in lines:
        out.write(line.encode())
    out.close()
    files = [log.with_name(f"sglang.log.{i}") for i in (3, 2, 1)] + [log]
    assert [f.stat().st_size for f in files] == [4000] * 4            # 40 whole lines each
    assert "".join(lines).endswith("".join(f.read_text() for f in files))


def test_a_fifo_at_the_log_path_never_blocks_the_server_output(tmp_path):
    """Opening a FIFO for writing waits for a reader: the writer would stop reading SGLang's output,
    and SGLang would block once the pipe is full."""
    log = tmp_path / "sglang.log"
    os.mkfifo(log)
    proc = writer(log)
    try:
        out, err = proc.communicate(b"x" * 99 + b"\n" + b"y" * (1 << 20), timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0 and len(out) == 100 + (1 << 20)   # all of it echoed, none held
    assert "cannot open" in err.decode()
