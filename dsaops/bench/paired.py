"""Is a change in pass@1 more than noise? Both runs answered the same problems, so compare them
problem by problem: the problems one run solved and the other did not carry all the information.

`difference_ci`: a paired bootstrap (problems resampled with replacement, both runs' results kept
together) percentile interval for the difference in pass rate. `mcnemar_p`: the exact two-sided
McNemar test, a binomial test on the discordant problems (lost vs gained).
"""
from __future__ import annotations

import math
import random

RESAMPLES = 10_000


def difference_ci(reference: list[bool], current: list[bool], *, confidence: float = 0.95,
                  resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """(low, high) of current minus reference pass rate, as fractions."""
    if len(reference) != len(current) or not reference:
        raise ValueError("the runs must cover the same, non-empty, problems")
    n = len(reference)
    deltas = [int(c) - int(r) for r, c in zip(reference, current)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(deltas, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    return means[int(tail * resamples)], means[min(resamples - 1, int((1 - tail) * resamples))]


def mcnemar_p(lost: int, gained: int) -> float:
    """Two-sided exact p-value that lost and gained problems differ only by chance."""
    discordant = lost + gained
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(lost, gained) + 1)) / 2 ** discordant
    return min(1.0, 2 * tail)
