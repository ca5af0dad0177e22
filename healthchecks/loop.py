"""The exporter's background readers (log, processes, /server_info, state) share this loop: turn,
report a heartbeat (`dsa_exporter_loop_age_seconds`), sleep unless there is more to do.

A turn that raises is counted under the loop's error source and said in the exporter's log, and
the loop goes on; a thread that ended anyway is started again at the next scrape (`revive`)."""
from __future__ import annotations

import threading

from dsaops.healthchecks.metrics import ErrorCounts


class BackgroundLoop:
    def __init__(self, name: str, errors: ErrorCounts, interval: float):
        """`name` is also the error source its failures are counted under."""
        self.name, self.errors, self.interval = name, errors, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> bool:
        """One turn; True when there is more to do right away."""
        raise NotImplementedError

    def start(self):
        self._thread = threading.Thread(target=self._run, name=f"dsaops-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def revive(self) -> None:
        """Start the loop again if its thread ended without being stopped."""
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            self.errors.report(self.name, f"the {self.name} loop had ended; started again")
            self.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                more = self.step()
            except Exception as e:  # noqa: BLE001 (any surprise is counted and said; the loop goes on)
                self.errors.report(self.name, f"the {self.name} loop met an error", e)
                more = False
            self.errors.beat(self.name)
            if not more:
                self._stop.wait(self.interval)
