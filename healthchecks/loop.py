"""The exporter's background readers (log, processes, /server_info) share this loop: turn,
report a heartbeat (`dsa_exporter_loop_age_seconds`), sleep unless there is more to do."""
from __future__ import annotations

import threading

from dsaops.healthchecks.metrics import ErrorCounts


class BackgroundLoop:
    def __init__(self, name: str, errors: ErrorCounts, interval: float):
        self.name, self.errors, self.interval = name, errors, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dsaops-{name}", daemon=True)

    def step(self) -> bool:
        """One turn; True when there is more to do right away."""
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            more = self.step()
            self.errors.beat(self.name)
            if not more:
                self._stop.wait(self.interval)
