"""The knee and the agreement rule on constructed sweeps, with the controls that must not fire."""
from __future__ import annotations

import pytest

from dsaops.bench import generator, knee, serve_report, sweep
from dsaops.bench.capacity import Cap

LEVELS = [1, 2, 4, 8, 16, 32]


def capped_at(cap: int, per_slot: float = 100.0, levels=LEVELS) -> list[float]:
    return [per_slot * min(c, cap) for c in levels]


@pytest.mark.parametrize("cap", [1, 2, 4, 8, 16])
def test_knee_at_a_level_that_is_the_cap(cap):
    found = knee.find(LEVELS, capped_at(cap))
    assert found.level == cap and found.high == cap


def test_a_cap_between_levels_lands_on_the_next_level():
    found = knee.find(LEVELS, capped_at(6))
    assert (found.level, found.low, found.high) == (8, 4, 8)
    assert knee.agrees(LEVELS, found, 6) and knee.agrees(LEVELS, found, 16)
    assert not knee.agrees(LEVELS, found, 17) and not knee.agrees(LEVELS, found, 2)


def test_slow_growth_past_the_cap_is_still_the_knee():
    throughput = capped_at(4)
    throughput[3:] = [t * (1 + 0.05 * i) for i, t in enumerate(throughput[3:], 1)]  # +5% per doubling
    assert knee.find(LEVELS, throughput).level == 4


def test_no_knee_when_throughput_still_grows():
    found = knee.find(LEVELS, capped_at(64))
    assert found.level is None and found.low == 32
    assert knee.agrees(LEVELS, found, 64)
    assert not knee.agrees(LEVELS, found, 8)   # a cap of 8 would have flattened the sweep


def test_findings_flag_only_what_disagrees():
    found = knee.find(LEVELS, capped_at(4))
    server, plan_ok, plan_bad = Cap(4, [2, 2], "mamba", "s"), Cap(4, [2, 2], "mamba", "p"), Cap(16, [8, 8], "dp_split", "p")
    assert knee.findings(LEVELS, found, {"server": server, "plan": plan_ok}) == []
    lines = knee.findings(LEVELS, found, {"server": server, "plan": plan_bad})
    assert len(lines) == 3 and all("plan" in line for line in lines)
    assert knee.findings(LEVELS, found, {"server": None, "plan": None}) == []


@pytest.mark.parametrize("cap", [4, 64])
def test_one_level_shows_no_knee_and_claims_no_agreement(cap):
    """A sweep that measured one level (one asked for, or the next one failed) says nothing of growth."""
    level = generator.Level(8, 16, 16, 2.0, 10.0, 20.0, 1.0, 2.0, 500.0, 8.0, None)
    report = serve_report.build(sweep.Sweep([level]), {"server": Cap(cap, [cap], "kv", "s")}, {})
    text = serve_report.table(report)
    assert report["knee"] is None and report["disagreements"] == []
    assert "knee: one level measured; sweep two or more (--concurrency) to find it" in text
    assert "agree" not in text and "grew" not in text
