"""The paired comparison: exact McNemar values, and bootstrap intervals that tell the seeds'
4.8 points from noise only when the discordant problems say so."""
from __future__ import annotations

import math

import pytest

from dsaops.bench import paired


def runs(n: int, both: int, lost: int, gained: int) -> tuple[list[bool], list[bool]]:
    """Reference and current pass lists: `both` solved by both, `lost` only by the reference, `gained` only now."""
    ref = [True] * both + [True] * lost + [False] * gained
    cur = [True] * both + [False] * lost + [True] * gained
    rest = n - len(ref)
    return ref + [False] * rest, cur + [False] * rest


def test_mcnemar_exact():
    assert paired.mcnemar_p(8, 0) == pytest.approx(2 / 2 ** 8)
    assert paired.mcnemar_p(4, 4) == 1.0
    assert paired.mcnemar_p(0, 0) == 1.0
    assert paired.mcnemar_p(12, 4) == pytest.approx(2 * sum(math.comb(16, k) for k in range(5)) / 2 ** 16)


def test_the_seeds_drop_is_beyond_noise_when_every_change_is_a_loss():
    """164 problems, 148 -> 140 (90.2% -> 85.4%): 8 lost, none gained."""
    ref, cur = runs(164, 140, 8, 0)
    low, high = paired.difference_ci(ref, cur)
    assert high < 0 and low < -8 / 164 < high


def test_the_same_drop_is_noise_when_it_nets_out_of_many_changes():
    """148 -> 140 again, but as 20 lost and 12 gained: the interval straddles 0."""
    ref, cur = runs(164, 128, 20, 12)
    assert sum(ref) == 148 and sum(cur) == 140
    low, high = paired.difference_ci(ref, cur)
    assert low < 0 < high


def test_identical_runs_have_a_zero_interval():
    ref, cur = runs(50, 30, 0, 0)
    assert paired.difference_ci(ref, cur) == (0.0, 0.0)


def test_unpaired_input_is_refused():
    with pytest.raises(ValueError):
        paired.difference_ci([True], [True, False])
