"""The follower: tail -F over rotation and truncation, bounded, garbage counted, recovery."""
from __future__ import annotations

import os

import pytest
from dsaops.healthchecks.logfollow import CHUNK, MAX_LINE, LogFollower
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts

from benchmarks.sglang_standin import log_lines as L
from tests.support.polling import wait_for


@pytest.fixture
def follower():
    """Starts followers (with `position`, a restarted exporter's, resuming there); stops them
    after the test."""
    started = []

    def start(path, position=None):
        state, errors = LogState(), ErrorCounts()
        started.append(LogFollower(str(path), state, errors, poll=0.05))
        started[-1].resume(position)
        return started[-1].start(), state, errors

    yield start
    for f in started:
        f.stop()


def kv_line(tokens, rank="TP0"):
    return L.line(L.kv_allocated(tokens, 1.0), (rank,))


def test_starts_at_the_beginning_and_follows(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1))
    _, state, errors = follower(log)
    assert wait_for(lambda: state.kv.get("TP0", (0, 0))[1] == 1, 5)
    with open(log, "a") as out:
        out.write(kv_line(2))
    assert wait_for(lambda: state.kv["TP0"][1] == 2, 5)
    assert errors.counts()["log"] == 0


def test_rotation_reads_the_old_file_to_its_end_then_the_new(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1))
    _, state, errors = follower(log)
    assert wait_for(lambda: "TP0" in state.kv, 5)
    with open(log, "a") as out:  # written just before the rename: must not be lost
        out.write(kv_line(5, "TP5"))
    os.rename(log, tmp_path / "sglang.log.1")
    log.write_text(kv_line(7, "TP7"))
    assert wait_for(lambda: "TP7" in state.kv and "TP5" in state.kv, 5)
    assert errors.counts()["log"] == 0


def test_truncation_starts_over(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) * 50)
    _, state, _ = follower(log)
    assert wait_for(lambda: "TP0" in state.kv, 5)
    log.write_text(kv_line(3, "TP3"))  # shorter than what was read: truncated in place
    assert wait_for(lambda: "TP3" in state.kv, 5)


def test_half_line_waits_for_its_end(tmp_path, follower):
    log = tmp_path / "sglang.log"
    text = kv_line(9)
    log.write_text(text[:30])
    f, state, errors = follower(log)
    assert wait_for(f.caught_up.is_set, 5)
    assert "TP0" not in state.kv
    with open(log, "a") as out:
        out.write(text[30:])
    assert wait_for(lambda: "TP0" in state.kv, 5)
    assert errors.counts()["log"] == 0


def test_garbage_is_counted_and_the_follower_recovers(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"\xff\xfe\x00binary\x00\n" + os.urandom(4096).replace(b"\n", b"") + b"\n" + b"x" * (MAX_LINE * 3)
                    + b"\n" + kv_line(4).encode())
    _, state, errors = follower(log)
    assert wait_for(lambda: "TP0" in state.kv, 5)
    assert errors.counts()["log"] >= 3
    assert state.kv["TP0"][1] == 4


def test_a_line_with_an_impossible_date_or_number_costs_that_line_only(tmp_path, follower):
    """Lines shaped like SGLang's whose date or size does not parse raised out of the chunk:
    the crash line after them was never read."""
    log = tmp_path / "sglang.log"
    log.write_text("[2026-13-45 99:99:99 TP0] SIGTERM received. signum=15 frame=None.\n"
                   + L.line("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 5, KV size: 1.2.3 GB", ("TP0",))
                   + L.line(L.crashed("scheduler_0", 4242, -9)))
    _, state, errors = follower(log)
    assert wait_for(lambda: 4242 in state.exits, 5)
    assert state.exits[4242][0] == -9 and state.events["sigterm"] == 0
    assert errors.counts()["log"] == 2


def test_an_endless_line_is_counted_once_and_memory_stays_bounded(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"y" * (8 * CHUNK) + b"\n" + kv_line(8).encode())
    state, errors = LogState(), ErrorCounts()
    f = LogFollower(str(log), state, errors)
    biggest = 0
    while f.step():  # driven by hand: no thread, to watch the buffer
        biggest = max(biggest, len(f._partial))
    assert state.kv["TP0"][1] == 8
    assert errors.counts()["log"] == 1
    assert biggest <= MAX_LINE + CHUNK


def test_a_line_cut_by_truncation_is_counted(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) + "[2026-11-29 10:00:00 TP0] KV Cache is allo")
    _, state, errors = follower(log)
    assert wait_for(lambda: "TP0" in state.kv, 5)
    log.write_text("")
    assert wait_for(lambda: errors.counts()["log"] == 1, 5)
    with open(log, "a") as out:
        out.write(kv_line(2, "TP2"))
    assert wait_for(lambda: "TP2" in state.kv, 5)


def test_missing_file_is_counted_once_and_waited_for(tmp_path, follower):
    log = tmp_path / "later.log"
    f, state, errors = follower(log)
    assert wait_for(lambda: errors.counts()["log"] == 1, 5)
    wait_for(lambda: False, 0.5)  # several looks: still counted once (again only after a minute)
    assert errors.counts()["log"] == 1 and f.events["missing"] == 1
    log.write_text(kv_line(6))
    assert wait_for(lambda: "TP0" in state.kv, 5)
    assert errors.counts()["log"] == 1


def rewrite_while_held(f, log, text):
    """Truncate `log` and write `text`, longer than what `f` had read, between two of its looks."""
    size = log.stat().st_size
    f._stop.set()
    f._thread.join(5)
    log.write_text(text)
    assert log.stat().st_size > size
    f._stop.clear()
    f.start()


def test_truncation_then_fast_writes_lose_nothing(tmp_path, follower):
    """Truncated, then written past the old offset before the next look: the size alone would not
    show it; the file's first bytes do, and the first new line is read."""
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) * 20)
    f, state, errors = follower(log)
    assert wait_for(f.caught_up.is_set, 5) and state.kv["TP0"][1] == 1
    rewrite_while_held(f, log, kv_line(2, "TP2") + "".join(kv_line(100 + i, "TP3") for i in range(40)))
    assert wait_for(lambda: state.kv.get("TP3", (0, 0))[1] == 139, 5)
    assert state.kv["TP2"][1] == 2  # the first line after the truncation
    assert f.events["truncated"] == 1 and errors.counts()["log"] == 0


def test_a_rewritten_file_is_never_read_from_the_old_offset(tmp_path, follower):
    """Truncated and written past the old offset between two looks: each line counts once, none is
    read from the middle."""
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) * 20)
    f, state, errors = follower(log)
    assert wait_for(f.caught_up.is_set, 5) and state.kv["TP0"][1] == 1
    rewrite_while_held(f, log, L.line(L.health_failed(), ("TP0",)) * 60)
    assert wait_for(lambda: f.events["truncated"] == 1 and state.events["health_check_failed"] >= 60, 5)
    wait_for(lambda: False, 0.3)  # several more looks: nothing counted twice
    assert state.events["health_check_failed"] == 60
    assert errors.counts()["log"] == 0


def test_a_fifo_at_the_path_never_blocks(tmp_path, follower):
    log = tmp_path / "sglang.log"
    os.mkfifo(log)
    f, state, errors = follower(log)
    assert wait_for(lambda: f.events["not_a_file"] == 1, 5)
    assert errors.counts()["log"] == 1
    assert wait_for(lambda: "log" in f.errors.beats(), 2)  # the loop turns: it is not stuck in open()
    beat = f.errors.beats()["log"]
    assert wait_for(lambda: f.errors.beats()["log"] > beat, 2)
    log.unlink()
    log.write_text(kv_line(5))
    assert wait_for(lambda: state.kv.get("TP0", (0, 0))[1] == 5, 5)


def test_a_line_over_the_limit_is_dropped_even_when_clean(tmp_path, follower):
    log = tmp_path / "sglang.log"
    long_line = kv_line(7, "TP7").rstrip("\n") + " " + "x" * (MAX_LINE + 10) + "\n"
    log.write_text(long_line + kv_line(8, "TP8"))
    f, state, errors = follower(log)
    assert wait_for(lambda: "TP8" in state.kv, 5)
    assert "TP7" not in state.kv and f.events["line_dropped"] == 1 and errors.counts()["log"] == 1


def test_a_restarted_follower_resumes_where_it_stopped(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) + "filler line\n" * 50_000)
    f, state, _ = follower(log)
    assert wait_for(f.caught_up.is_set, 10)
    f.stop()
    position = state.position
    assert position["offset"] == log.stat().st_size
    with open(log, "a") as out:
        out.write(kv_line(2, "TP2"))
    f, state, _ = follower(log, position)
    assert wait_for(lambda: "TP2" in state.kv, 5)
    assert "TP0" not in state.kv  # the part before the position was not read again
    assert f.events["resumed"] == 1


def test_a_different_file_at_the_path_is_read_from_its_beginning(tmp_path, follower):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) * 10)
    f, state, _ = follower(log)
    assert wait_for(f.caught_up.is_set, 5)
    f.stop()
    position = dict(state.position)
    log.unlink()
    log.write_text(kv_line(3, "TP3") * 20)  # longer, maybe even the same inode: its first bytes differ
    f, state, _ = follower(log, position)
    assert wait_for(lambda: "TP3" in state.kv, 5) and f.events["reread"] == 1


@pytest.mark.parametrize("second", ["done", "half done"])
def test_a_rotation_while_the_follower_looks_at_one_skips_no_file(tmp_path, monkeypatch, second):
    """The writer rotates again between the follower finding where its file went and opening the
    files after it: done (PATH is a newer file) or half done (PATH missing for a moment)."""
    from dsaops.healthchecks import logfollow

    log = tmp_path / "sglang.log"
    log.write_text(kv_line(0, "TP0"))
    state, errors = LogState(), ErrorCounts()
    f = LogFollower(str(log), state, errors)
    seen = []
    original = state.feed
    state.feed = lambda line: (seen.append(line.split("]")[0].split()[-1]), original(line))

    def drain():
        for _ in range(20):
            f.step()

    def rotate(then_write=None):
        for i in (2, 1):
            if (tmp_path / f"sglang.log.{i}").exists():
                os.replace(tmp_path / f"sglang.log.{i}", tmp_path / f"sglang.log.{i + 1}")
        os.replace(log, tmp_path / "sglang.log.1")
        if then_write:
            log.write_text(then_write)

    try:
        drain()
        rotate(kv_line(1, "TP1"))
        real, calls = logfollow._ident, []

        def ident_then_rotate(name):
            found = real(name)
            if not calls:
                calls.append(name)
                rotate(kv_line(2, "TP2") if second == "done" else None)
            return found

        monkeypatch.setattr(logfollow, "_ident", ident_then_rotate)
        drain()
        if second == "half done":
            log.write_text(kv_line(2, "TP2"))
            drain()
        assert calls and seen == ["TP0", "TP1", "TP2"], seen
        assert errors.counts()["log"] == 0  # PATH missing mid-rotation is no error
    finally:
        f.stop()


def test_rotation_by_the_servers_writer_while_followed_and_while_down(tmp_path):
    """`dsaops log-writer` (the image's own rotation) fed fast by a real process: every line reaches
    the follower in order, across rotations while it follows and while it is down."""
    import subprocess
    import sys

    log = tmp_path / "sglang.log"
    writer = subprocess.Popen([sys.executable, "-m", "dsaops", "log-writer", str(log), "--max-bytes", "65536",
                               "--keep", "9"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)

    def emit(first, n):
        for i in range(first, first + n):
            writer.stdin.write(L.line(L.reduced(i, i), ("TP0",)).encode())
        writer.stdin.flush()

    seen = []
    state, errors = LogState(), ErrorCounts()
    original = state.feed
    state.feed = lambda line: (seen.append(int(line.split("requested ")[1].split()[0])), original(line))
    emit(0, 1)
    assert wait_for(log.exists, 5)
    f = LogFollower(str(log), state, errors, poll=0.02).start()
    try:
        assert wait_for(lambda: seen == [0], 5)
        emit(1, 1499)  # ~250 KB: several rotations while followed, faster than it looks
        assert wait_for(lambda: len(seen) == 1500, 10), len(seen)
        f.stop()
        position = state.position
        emit(1500, 1500)  # rotated on while the follower is down
        assert wait_for(lambda: (tmp_path / "sglang.log.4").exists(), 5)
        f = LogFollower(str(log), state, errors, poll=0.02)
        f.resume(position)
        f.start()
        assert wait_for(lambda: len(seen) == 3000, 10), len(seen)
        assert seen == list(range(3000)) and f.events["resumed"] == 1 and errors.counts()["log"] == 0
    finally:
        writer.stdin.close()
        writer.wait(10)
        f.stop()
