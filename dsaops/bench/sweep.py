"""The concurrency sweep: levels in order, each sized to run about --duration seconds.

The first level sends two requests per slot; each later one sends as many as the previous
level's measured request rate, scaled by the concurrency step, fills in --duration (at least two
per slot, at most --max-requests). A level that fails ends the sweep: later ones would only
wait on the same server.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsaops.bench import generator


@dataclass
class Sweep:
    levels: list[generator.Level] = field(default_factory=list)
    failure: str | None = None     # why the sweep stopped early


def level_requests(concurrency: int, previous: generator.Level | None, *, duration: float, max_requests: int) -> int:
    least = 2 * concurrency
    if previous is None:
        wanted = least
    else:
        wanted = math.ceil(duration * previous.requests_s * concurrency / previous.concurrency)
    return max(least, min(wanted, max_requests))


def run(concurrencies: list[int], *, duration: float, max_requests: int, timeout: float, progress, log,
        **generator_args) -> Sweep:
    sweep = Sweep()
    for i, c in enumerate(concurrencies):
        n = level_requests(c, sweep.levels[-1] if sweep.levels else None, duration=duration,
                           max_requests=max_requests)
        progress(f"[{i + 1}/{len(concurrencies)}] concurrency {c}: {n} requests (at most {timeout:g} s)")
        try:
            level = generator.run_level(concurrency=c, requests=n, timeout=timeout, log=log, **generator_args)
        except generator.LevelFailed as e:
            sweep.failure = f"concurrency {c}: {e}"
            progress(f"    FAILED: {e}")
            break
        sweep.levels.append(level)
        progress(f"    {level.output_tok_s:.1f} output tok/s, TTFT p50 {level.ttft_p50_ms:.0f} ms, "
                 f"{level.completed}/{level.requests} completed in {level.seconds:.1f} s")
        if level.completed < level.requests:
            sweep.failure = (f"concurrency {c}: {level.requests - level.completed} of {level.requests} requests "
                             f"failed ({level.first_error or 'no error text'})")
            progress(f"    FAILED: {sweep.failure}")
            break
    return sweep
