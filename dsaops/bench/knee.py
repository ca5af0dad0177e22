"""Where throughput stops growing, and whether the caps the server and the plan name agree.

A server that runs at most C requests at once grows its output throughput with concurrency up
to C and holds it beyond. On a sweep c_0 < c_1 < ..., the knee is the first level whose step to
the next level gains less than KNEE_GAIN of what linear scaling would: efficiency
(T[k+1]/T[k] - 1) / (c[k+1]/c[k] - 1) < KNEE_GAIN. Then C lies in (c[k-1], c[k]]. A named cap
agrees with the sweep when it lies there, give or take one level of the sweep either side.
"""
from __future__ import annotations

from dataclasses import dataclass

KNEE_GAIN = 0.15   # under 15% of linear scaling: doubling concurrency bought < 15% more throughput


@dataclass(frozen=True)
class Knee:
    index: int | None       # into the levels; None: throughput still grew at the last level
    level: int | None
    low: int                # the cap lies in (low, high] by the sweep's own steps
    high: int | None        # None: above the last level


def find(levels: list[int], throughput: list[float]) -> Knee:
    """`levels`: two or more, rising."""
    for k in range(len(levels) - 1):
        t0, t1 = throughput[k], throughput[k + 1]
        efficiency = (t1 / t0 - 1) / (levels[k + 1] / levels[k] - 1) if t0 > 0 else 0.0
        if efficiency < KNEE_GAIN:
            return Knee(k, levels[k], levels[k - 1] if k else 0, levels[k])
    return Knee(None, None, levels[-1], None)


def agrees(levels: list[int], knee: Knee, cap: int) -> bool:
    """The cap within the knee's bracket widened by one level of the sweep on each side."""
    if knee.index is None:  # no knee: the cap must lie above the levels that kept growing
        return cap > levels[-2]
    low = levels[knee.index - 2] if knee.index >= 2 else 0
    high = levels[knee.index + 1]
    return low < cap <= high


def findings(levels: list[int], knee: Knee, caps: dict) -> list[str]:
    """One line per disagreement between the sweep, the server's cap and the plan's (`caps`:
    name -> capacity.Cap, e.g. {"server": ..., "plan": ...}; absent ones are skipped)."""
    out = []
    for name, cap in caps.items():
        if cap is None:
            continue
        if not agrees(levels, knee, cap.total):
            where = (f"throughput stopped growing at {knee.level} (the cap lies in {knee.low + 1}..{knee.high})"
                     if knee.level is not None else f"throughput still grew at {levels[-1]}")
            out.append(f"the {name} names {cap.total} running requests ({cap.binding or 'binding unknown'}) "
                       f"but {where}")
    server, plan = caps.get("server"), caps.get("plan")
    if server is not None and plan is not None:
        if server.total != plan.total:
            out.append(f"the plan names {plan.total} running requests, the server runs {server.total}")
        if server.binding and server.binding != plan.binding:
            out.append(f"the plan says {plan.binding} binds, the server's figures say {server.binding}")
    return out
