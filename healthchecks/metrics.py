"""Plumbing every collector shares: metric families that carry `node`, the error counts, and
the one place a failure is both counted and said (in the exporter's own log, rate-limited)."""
from __future__ import annotations

import sys
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

ERROR_SOURCES = ("server_info", "log", "processes", "kmsg", "cgroup", "hostmem", "docker", "state",
                 "exporter")
SAY_EVERY_S = 60.0  # the same complaint is printed at most once a minute


class Families:
    """Builds metric families whose first label is `node`, so no series can lack it."""

    def __init__(self, node: str):
        self.node = node

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> _Family:
        return _Family(GaugeMetricFamily(name, doc, labels=("node", *labels)), self.node)

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> _Family:
        # prometheus_client appends `_total` to counter names; give the base name.
        return _Family(CounterMetricFamily(name.removesuffix("_total"), doc, labels=("node", *labels)), self.node)


class _Family:
    def __init__(self, family, node: str):
        self.family, self.node = family, node

    def add(self, value: float, *labels: str) -> _Family:
        self.family.add_metric([self.node, *labels], value)
        return self


class ErrorCounts:
    """`dsa_exporter_errors_total{source}`: bad input met, per source; every source starts at 0
    so that `increase()` sees the first error. Also each background loop's last heartbeat."""

    def __init__(self, say=None):
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(ERROR_SOURCES, 0)
        self._beats: dict[str, float] = {}
        self._said: dict[str, float] = {}
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    def inc(self, source: str) -> None:
        with self._lock:
            self._counts[source] += 1

    def report(self, source: str, what: str, exc: BaseException | None = None) -> None:
        """Count an error of `source` and say it in one line (the same line at most once a minute):
        a failure is never silent, and a flood of the same one does not fill the log."""
        self.inc(source)
        line = f"dsaops exporter: {source}: {what}" + (f": {type(exc).__name__}: {exc}"[:300] if exc else "")
        now = time.monotonic()
        with self._lock:
            if now - self._said.get(line, -SAY_EVERY_S) < SAY_EVERY_S:
                return
            self._said[line] = now
            if len(self._said) > 256:
                self._said = {k: v for k, v in self._said.items() if now - v < SAY_EVERY_S}
        self._say(line)

    def beat(self, loop: str) -> None:
        self._beats[loop] = time.monotonic()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def beats(self) -> dict[str, float]:
        return dict(self._beats)

    def collector(self, families: Families):
        return _ErrorsCollector(self, families)


class _ErrorsCollector:
    def __init__(self, errors: ErrorCounts, families: Families):
        self.errors, self.f = errors, families

    def collect(self):
        errs = self.f.counter("dsa_exporter_errors_total", "Bad or missing input met by the exporter, by source",
                              ("source",))
        for source, n in self.errors.counts().items():
            errs.add(n, source)
        age = self.f.gauge("dsa_exporter_loop_age_seconds", "Seconds since each background loop last completed",
                           ("loop",))
        now = time.monotonic()
        for loop, beat in sorted(self.errors.beats().items()):
            age.add(now - beat, loop)
        return [errs.family, age.family]
