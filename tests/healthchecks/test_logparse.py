"""Log lines (rendered from 0.5.23's format strings) -> LogState."""
from __future__ import annotations

import time

from dsaops.healthchecks.logparse import GIB, LogState, cause_of_exit_code, rank_label
from dsaops.healthchecks.processes import rank_of_title

from benchmarks.sglang_standin import log_lines as L


def feed(*lines: str) -> LogState:
    state = LogState()
    for text in lines:
        state.feed(text.rstrip("\n"))
    return state


def test_kv_allocation_per_rank_from_the_prefix():
    s = feed(L.line(L.kv_allocated(4922240, 32.48), ("DP3", "TP3", "EP3")),
             L.line(L.kv_allocated_split(1000, 1.0, 1.5), ("TP1",)),
             L.line(L.kv_allocated(77, 0.5)))
    assert s.kv["DP3_TP3_EP3"] == ("torch.float8_e4m3fn", 4922240, 32.48 * GIB)
    assert s.kv["TP1"] == ("torch.bfloat16", 1000, 2.5 * GIB)
    assert s.kv["TP0"][1] == 77  # no prefix parts: one rank, no DP


def test_side_pools_do_not_overwrite_the_kv_pool():
    s = feed(L.line(L.kv_allocated(100, 1.0), ("TP0",)), L.line(L.swa_allocated(5, 0.01), ("TP0",)))
    assert s.kv["TP0"][1] == 100


def test_a_speculative_drafts_pool_does_not_overwrite_the_targets():
    """With MTP the draft's one-layer pool logs the same line right after the target's, with the
    target's dtype and tokens; a restart with other tokens (or a same-sized pool) replaces it."""
    s = feed(L.line(L.kv_allocated(168320, 11.52), ("TP0",)), L.line(L.kv_allocated(168320, 0.10), ("TP0",)))
    assert s.kv["TP0"] == ("torch.float8_e4m3fn", 168320, 11.52 * GIB)
    s.feed(L.line(L.kv_allocated(168320, 11.52), ("TP0",)))
    assert s.kv["TP0"][2] == 11.52 * GIB
    s.feed(L.line(L.kv_allocated(90000, 6.16), ("TP0",)))
    assert s.kv["TP0"] == ("torch.float8_e4m3fn", 90000, 6.16 * GIB)


def test_milliseconds_in_the_prefix():
    """SGLANG_LOG_MS: `[%(asctime)s.%(msecs)03d{prefix}]`."""
    s = feed(L.line(L.kv_allocated(5, 1.0), ("TP2",)).replace(" TP2]", ".123 TP2]", 1))
    assert s.kv["TP2"][1] == 5


def test_mamba_lines():
    s = feed(L.line(L.mamba_allocated(40), ("TP0",)), L.line(L.mamba_capped(8, 40, 5), ("TP0",)),
             L.line(L.reduced(64, 12), ("DP1", "TP1")))
    assert s.mamba_slots == {"TP0": 40}
    assert s.mamba_cap == {"TP0": (8, 40, 5)}
    assert s.reduced == {"DP1_TP1": (64, 12)}


def test_exits_tied_by_pid_and_not_older_than_the_process():
    now = time.time()
    s = feed(L.line(L.crashed("scheduler_1", 4242, -9), at=now), L.line(L.terminated(4343, 0), at=now))
    assert s.exit_of(4242, since=now - 5) == (-9, True)
    assert s.exit_of(4343, since=now - 5) == (0, False)
    assert s.exit_of(4242, since=now + 5) is None  # a reused pid does not inherit an old line
    assert s.exit_of(1, since=0) is None


def test_clean_stop_and_alarm_lines():
    now = time.time()
    s = feed(L.line(L.sigterm(), at=now), L.line(L.sigquit()), L.line(L.health_failed()), L.line(L.health_failed()))
    assert s.clean_stop_since(now - 1) and not s.clean_stop_since(now + 5)
    assert s.events == {"sigterm": 1, "sigquit": 1, "health_check_failed": 2}
    worker = feed(L.line(L.sigterm_worker(1), at=now))  # a worker node's launcher
    assert worker.clean_stop_since(now - 1)


def test_a_logged_prompt_quoting_the_alarm_lines_teaches_nothing():
    """--log-requests writes each prompt in a line of its own: its text must not fake a stop, a
    crash, an alarm or a pool; the lines themselves, right after the prefix, still count."""
    now = time.time()
    prompts = [L.line(f"Receive: obj=GenerateReqInput(rid='r1', text='why does my log say {quoted}?')", at=now)
               for quoted in (L.sigterm(), L.sigterm_worker(1), L.sigquit(), L.health_failed(),
                              L.crashed("scheduler_0", 4242, -9), L.terminated(4343, 0), L.mamba_capped(8, 40, 5),
                              L.reduced(64, 32))]
    s = feed(*prompts)
    assert not s.clean_stop_since(now - 1) and s.exit_of(4242, since=0) is None and s.exit_of(4343, since=0) is None
    assert s.events == {"sigterm": 0, "sigquit": 0, "health_check_failed": 0} and not s.mamba_cap and not s.reduced
    s = feed(*prompts, L.line(L.sigterm(), at=now), L.line(L.crashed("scheduler_0", 4242, -9), at=now))
    assert s.clean_stop_since(now - 1) and s.exit_of(4242, since=now - 5) == (-9, True)


def test_foreign_and_broken_lines_teach_nothing():
    s = feed("Traceback (most recent call last):", "[2026-11-29 10:00:00 TP0] KV Cache is allocated. dtype: torch.bf",
             "INFO:     127.0.0.1:5555 - \"GET /health HTTP/1.1\" 200 OK", "[not a date TP0] SIGQUIT received.")
    assert not s.kv and s.events["sigquit"] == 0


def test_causes():
    assert [cause_of_exit_code(c) for c in (-9, -11, -6, -7, -15, 1, 137)] == \
        ["sigkill", "sigsegv", "sigabrt", "sigbus", "signal", "exit_code", "exit_code"]


def test_rank_spelled_the_same_from_title_and_prefix():
    assert rank_of_title("sglang::scheduler_DP3_TP3_EP3") == rank_label(["DP3", "TP3", "EP3"]) == "DP3_TP3_EP3"
    assert rank_of_title("sglang::scheduler") == "TP0"
    assert rank_of_title("sglang::scheduler_TP1 ") == "TP1"
    assert rank_of_title("sglang::detokenizer") is None
    assert rank_of_title("python3 -m sglang.launch_server") is None
