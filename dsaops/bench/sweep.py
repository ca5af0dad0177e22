"""The concurrency sweep: levels in order, each sized to run about --duration seconds.

The first level sends two requests per slot; each later one sends as many as the previous
level's measured request rate, scaled by the concurrency step, fills in --duration (at least two
per slot, at most --max-requests: the command runs only levels that fit both). A level that fails
ends the sweep: later ones would only wait on the same server.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsaops.bench import generator


@dataclass
class Sweep:
    levels: list[generator.Level] = field(default_factory=list)
    failure: str | None = None     # why the sweep stopped early


PER_SLOT = 2   # requests a level sends at least for each slot, so that every slot stays busy past its first


def level_requests(concurrency: int, previous: generator.Level | None, *, duration: float, max_requests: int) -> int:
    least = PER_SLOT * concurrency
    if previous is None:
        wanted = least
    else:
        wanted = math.ceil(duration * previous.requests_s * concurrency / previous.concurrency)
    return min(max(least, wanted), max_requests)


def run(concurrencies: list[int], level, *, duration: float, max_requests: int, timeout: float, progress) -> Sweep:
    """`level(concurrency=, requests=, timeout=)` measures one level (generator.Generator.level)."""
    sweep = Sweep()
    for i, c in enumerate(concurrencies):
        n = level_requests(c, sweep.levels[-1] if sweep.levels else None, duration=duration,
                           max_requests=max_requests)
        progress(f"[{i + 1}/{len(concurrencies)}] concurrency {c}: {n} requests (at most {timeout:g} s)")
        try:
            measured = level(concurrency=c, requests=n, timeout=timeout)
        except generator.LevelFailed as e:
            sweep.failure = f"concurrency {c}: {e}"
            progress(f"    FAILED: {e}")
            break
        sweep.levels.append(measured)
        progress(f"    {measured.output_tok_s:.1f} output tok/s, TTFT p50 {measured.ttft_p50_ms:.0f} ms, "
                 f"{measured.completed}/{measured.requests} completed in {measured.seconds:.1f} s")
        if measured.completed < measured.requests:
            sweep.failure = (f"concurrency {c}: {measured.requests - measured.completed} of {measured.requests} "
                             f"requests failed ({measured.first_error or 'no error text'})")
            progress(f"    FAILED: {sweep.failure}")
            break
    return sweep
