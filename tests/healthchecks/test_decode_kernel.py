"""`dsa_decode_kernel_info{rank,kernel,reason}` from the routing patch's startup line: the parser is
pinned to the line the patch logs (route.Decision.line, and the patch's own line when dsaops does not
import), and the exporter serves one series per rank that logged it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from dsaops.healthchecks import decode_kernel
from dsaops.healthchecks.exporter import Config, Exporter
from dsaops.healthchecks.logparse import LogState
from dsaops.kernels import route

from benchmarks.sglang_standin import log_lines as L
from dsaops import targets
from tests.healthchecks.prometheus_text import exposition

PATCH = Path(route.__file__).parents[1] / "sglang_patches" / "0006-route-raw-fp8-decode-to-dsaops-kernels.patch"


def every_decision():
    """One line for each shape a decision takes: each reason, dsaops from a batch and for all."""
    sm90, sm121, gfx = (targets.get(n) for n in ("sm_90", "sm_121", "gfx942"))
    return [route.decide(sm90, 64, env={}), route.decide(sm90, 8, env={}), route.decide(sm121, 64, env={}),
            route.decide(gfx, 64, env={}), route.decide(None, 64, env={}, gpu_label="NVIDIA B200 (10.0)"),
            route.decide(sm90, 64, env={}, geometry_ok=False), route.decide(sm90, 64, env={"DSAOPS_DECODE": "sglang"}),
            route.Decision("sglang", "bad_setting", "DSAOPS_DECODE='x': set it to auto, dsaops or sglang", 1, "sm_90", 64),
            route.Decision("dsaops", "selftest_passed", "selftest on NVIDIA GB10, 64 heads: ...", 12, "sm_121", 64)]


def test_every_decision_line_parses_back():
    for d in every_decision():
        assert decode_kernel.parse(d.line) == (d.kernel, d.reason, d.min_batch if d.kernel == "dsaops" else 1), d.line
    assert {d.reason for d in every_decision()} | {"not_installed", "not_measured", "selftest_slower",
                                                   "selftest_incorrect"} >= set(route.REASONS)


def test_the_patch_logs_route_s_line_and_its_own_parses():
    text = PATCH.read_text()
    assert "+    logger.info(decision.line)" in text
    own = re.search(r'\+\s+"(DSA decode kernel: [^"]+)"\n\+\s+f"(reason=not_installed: [^"]+)"', text)
    assert own, "the patch's not-installed line changed: update healthchecks/decode_kernel.py"
    assert decode_kernel.parse(own[1] + own[2]) == ("sglang", "not_installed", 1)
    assert own[1].startswith(route.LINE_PREFIX)


def test_negative_control_a_reworded_line_is_not_parsed():
    line = route.decide(targets.get("sm_90"), 64, env={}).line
    assert decode_kernel.parse(line.replace("for every batch size", "for all batches")) is None
    assert decode_kernel.parse("DSA raw fp8 decode kernel: SGLang tilelang_sparse_fwd (heads=16)") is None
    assert decode_kernel.parse(f"Receive: obj=GenerateReqInput(text='{line}')") is None  # a logged prompt quoting it


def test_one_series_per_rank_from_the_log(tmp_path):
    log = tmp_path / "sglang.log"
    sm90, sm121 = targets.get("sm_90"), targets.get("sm_121")
    log.write_text("\n".join([
        L.line(route.decide(sm90, 8, env={}).line, ("TP0",)),
        L.line(route.decide(sm90, 8, env={"DSAOPS_DECODE": "sglang"}).line, ("TP1",)),
        L.line(route.decide(sm121, 64, env={}).line, ("DP1", "TP1")),
        L.line(route.decide(sm121, 64, env={}).line.replace("reason=", "cause=")),  # not the line: ignored
    ]) + "\n")
    state = LogState()
    for line in log.read_text().splitlines():
        state.feed(line)
    assert state.decode_kernel == {"TP0": ("dsaops", "measured", 2), "TP1": ("sglang", "setting", 1),
                                   "DP1_TP1": ("sglang", "not_measured", 1)}
    exporter = Exporter(Config(server_url="http://127.0.0.1:9", node="n1", log_file=str(log)))
    exporter.log = state  # what the follower would have learnt; the scrape reads it
    series = {k: v for k, v in exposition(exporter.scrape().decode()).items() if k.startswith("dsa_decode_kernel_info{")}
    assert series == {
        'dsa_decode_kernel_info{kernel="sglang",node="n1",rank="DP1_TP1",reason="not_measured"}': 1.0,
        'dsa_decode_kernel_info{kernel="dsaops",node="n1",rank="TP0",reason="measured"}': 1.0,
        'dsa_decode_kernel_info{kernel="sglang",node="n1",rank="TP1",reason="setting"}': 1.0}


@pytest.mark.parametrize("rank", [(), ("TP3",)])
def test_the_line_through_the_follower_fast_path(rank):
    """The follower searches whole blocks for keywords (LogState.interesting): the line is found there too."""
    block = "\n".join(["noise", L.line(route.decide(targets.get("gfx942"), 64, env={}).line, rank), "more noise"])
    state = LogState()
    for line in state.interesting(block):
        state.feed(line)
    assert state.decode_kernel == {(rank[0] if rank else "TP0"): ("sglang", "no_hip_kernels", 1)}


def test_the_state_file_keeps_what_the_startup_line_said():
    """A restarted exporter resumes the log after its saved position: the decision, logged once at
    startup, comes back from the state file; a state file from before this series restores none."""
    import json

    state = LogState()
    state.feed(L.line(route.decide(targets.get("sm_90"), 8, env={}).line, ("TP1",)).rstrip("\n"))
    saved = json.loads(json.dumps(state.to_json()))
    again = LogState()
    again.restore(saved)
    assert again.decode_kernel == {"TP1": ("dsaops", "measured", 2)}
    del saved["decode_kernel"]
    older = LogState()
    older.restore(saved)
    assert older.decode_kernel == {}
