"""Follow the SGLang server log like `tail -F`, and export what it taught.

The follower starts at the beginning of the current file (a restarted exporter re-learns
the startup lines), reads in bounded chunks, survives rotation (the path now names another
file: finish the old one, open the new) and truncation (size below our offset: start over),
and never holds more than one chunk plus one over-long line in memory.
"""
from __future__ import annotations

import os
import threading

from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts, Families

CHUNK = 1 << 20
MAX_LINE = 64 << 10  # longer "lines" are garbage (a binary blob), not SGLang output


class LogFollower(BackgroundLoop):
    def __init__(self, path: str, state: LogState, errors: ErrorCounts, poll: float = 0.25):
        super().__init__("log", errors, poll)
        self.path, self.state = path, state
        self.caught_up = threading.Event()  # set once the first read reached the end of the file
        self._file = None
        self._inode = None
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop bytes until its newline

    def stop(self) -> None:
        super().stop()
        if self._file:
            self._file.close()

    def step(self) -> bool:
        """Read one chunk; True when there may be more to read right away."""
        try:
            return self._read()
        except OSError:
            self.errors.inc("log")
            self._close()
            return False

    def _read(self) -> bool:
        if self._file is None and not self._open():
            return False
        data = self._file.read(CHUNK)
        if data:
            self._feed(data)
            return True
        self.caught_up.set()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:  # rotated away, new file not there yet: keep the old one open
            return False
        if st.st_ino != self._inode:  # rotated: the old file is read to its end, move on
            self._close()
            return self._open()
        if st.st_size < self._file.tell():  # truncated in place
            self._drop_partial()
            self._file.seek(0)
            return True
        return False

    def _open(self) -> bool:
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 (held open across reads, closed in _close)
        except FileNotFoundError:
            return False
        except OSError:
            self.errors.inc("log")
            return False
        self._inode = os.fstat(self._file.fileno()).st_ino
        return True

    def _close(self) -> None:
        self._drop_partial()
        if self._file:
            self._file.close()
        self._file = None

    def _drop_partial(self) -> None:
        if self._partial:  # a line cut in half by rotation or truncation
            self.errors.inc("log")
        self._partial, self._skipping = b"", False

    def _feed(self, data: bytes) -> None:
        cut = data.rfind(b"\n")
        if cut < 0:
            if not self._skipping:  # (the middle of an over-long line is dropped as it comes)
                self._partial += data
        else:
            block, rest = self._partial + data[:cut], data[cut + 1:]
            self._partial = b""
            if self._skipping:  # the tail of an over-long line
                block = block.partition(b"\n")[2]
                self._skipping = False
            self._block(block)
            self._partial = rest
        if len(self._partial) > MAX_LINE:
            self.errors.inc("log")
            self._partial, self._skipping = b"", True

    def _block(self, block: bytes) -> None:
        """Complete lines. Clean text (the usual case) is searched whole for the few lines that
        matter, in C; a block with garbage in it goes line by line so only the bad lines are lost."""
        if b"\x00" not in block:
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                for line in self.state.interesting(text):
                    self.state.feed(line)
                return
        for raw in block.split(b"\n"):
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        if len(raw) > MAX_LINE or b"\x00" in raw:
            self.errors.inc("log")
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.errors.inc("log")
            return
        self.state.feed(text.rstrip("\r"))


class LogCollector:
    """What only the log tells: the KV pool per scheduler rank, SGLang's KV-capacity reduction
    warning, and the counts of its alarm lines. (The mamba figures the log gives are exported
    by the server_info collector, which prefers the /server_info fields when present.)"""

    def __init__(self, state: LogState, families: Families):
        self.state, self.f = state, families

    def collect(self):
        s, f = self.state, self.f
        tokens = f.gauge("dsa_kv_pool_tokens", "KV pool size in tokens, per scheduler rank (log)", ("rank",))
        size = f.gauge("dsa_kv_pool_bytes", "KV pool size in bytes, per scheduler rank (log)", ("rank",))
        reduced = f.gauge("dsa_kv_reduced_max_running_requests", "max_running_requests per DP worker before and "
                          "after SGLang reduced it for KV capacity (log warning)", ("rank", "scope"))
        events = f.counter("dsa_server_log_events_total", "Alarm lines in the server log", ("event",))
        with s.lock:
            for rank, (_, n, nbytes) in sorted(s.kv.items()):
                tokens.add(n, rank)
                size.add(nbytes, rank)
            for rank, (req, eff) in sorted(s.reduced.items()):
                reduced.add(req, rank, "requested").add(eff, rank, "effective")
            for event, n in sorted(s.events.items()):
                events.add(n, event)
        return [tokens.family, size.family, reduced.family, events.family]
