"""The follower: tail -F over rotation and truncation, bounded, garbage counted, recovery."""
from __future__ import annotations

import os

from dsaops.healthchecks.logfollow import CHUNK, MAX_LINE, LogFollower
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts

from benchmarks.sglang_standin import log_lines as L
from tests.support.polling import wait_for


def follower(path):
    state, errors = LogState(), ErrorCounts()
    return LogFollower(str(path), state, errors, poll=0.05).start(), state, errors


def kv_line(tokens, rank="TP0"):
    return L.line(L.kv_allocated(tokens, 1.0), (rank,))


def test_starts_at_the_beginning_and_follows(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1))
    f, state, errors = follower(log)
    try:
        assert wait_for(lambda: state.kv.get("TP0", (0, 0))[1] == 1, 5)
        with open(log, "a") as out:
            out.write(kv_line(2))
        assert wait_for(lambda: state.kv["TP0"][1] == 2, 5)
        assert errors.counts()["log"] == 0
    finally:
        f.stop()


def test_rotation_reads_the_old_file_to_its_end_then_the_new(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1))
    f, state, errors = follower(log)
    try:
        assert wait_for(lambda: "TP0" in state.kv, 5)
        with open(log, "a") as out:  # written just before the rename: must not be lost
            out.write(kv_line(5, "TP5"))
        os.rename(log, tmp_path / "sglang.log.1")
        log.write_text(kv_line(7, "TP7"))
        assert wait_for(lambda: "TP7" in state.kv and "TP5" in state.kv, 5)
        assert errors.counts()["log"] == 0
    finally:
        f.stop()


def test_truncation_starts_over(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) * 50)
    f, state, _ = follower(log)
    try:
        assert wait_for(lambda: "TP0" in state.kv, 5)
        log.write_text(kv_line(3, "TP3"))  # shorter than what was read: truncated in place
        assert wait_for(lambda: "TP3" in state.kv, 5)
    finally:
        f.stop()


def test_half_line_waits_for_its_end(tmp_path):
    log = tmp_path / "sglang.log"
    text = kv_line(9)
    log.write_text(text[:30])
    f, state, errors = follower(log)
    try:
        assert wait_for(f.caught_up.is_set, 5)
        assert "TP0" not in state.kv
        with open(log, "a") as out:
            out.write(text[30:])
        assert wait_for(lambda: "TP0" in state.kv, 5)
        assert errors.counts()["log"] == 0
    finally:
        f.stop()


def test_garbage_is_counted_and_the_follower_recovers(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"\xff\xfe\x00binary\x00\n" + os.urandom(4096).replace(b"\n", b"") + b"\n" + b"x" * (MAX_LINE * 3)
                    + b"\n" + kv_line(4).encode())
    f, state, errors = follower(log)
    try:
        assert wait_for(lambda: "TP0" in state.kv, 5)
        assert errors.counts()["log"] >= 3
        assert state.kv["TP0"][1] == 4
    finally:
        f.stop()


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


def test_a_line_cut_by_truncation_is_counted(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(kv_line(1) + "[2026-11-29 10:00:00 TP0] KV Cache is allo")
    f, state, errors = follower(log)
    try:
        assert wait_for(lambda: "TP0" in state.kv, 5)
        log.write_text("")
        assert wait_for(lambda: errors.counts()["log"] == 1, 5)
        with open(log, "a") as out:
            out.write(kv_line(2, "TP2"))
        assert wait_for(lambda: "TP2" in state.kv, 5)
    finally:
        f.stop()


def test_missing_file_is_counted_once_and_waited_for(tmp_path):
    log = tmp_path / "later.log"
    f, state, errors = follower(log)
    try:
        assert wait_for(lambda: errors.counts()["log"] == 1, 5)
        wait_for(lambda: False, 0.5)  # several looks: still counted once (again only after a minute)
        assert errors.counts()["log"] == 1 and f.events["missing"] == 1
        log.write_text(kv_line(6))
        assert wait_for(lambda: "TP0" in state.kv, 5)
        assert errors.counts()["log"] == 1
    finally:
        f.stop()
