"""`dsaops log-writer FILE`: the server's own log rotation.

The image's entrypoint pipes SGLang's output through it: every byte goes to standard output
(`docker logs`) and is appended to FILE. When FILE would pass `max_bytes`, it is renamed at a
line boundary to FILE.1 (FILE.1 to FILE.2, … up to FILE.KEEP, the oldest dropped) and a new
FILE is started. Renaming, not copying and truncating, loses no line, and a follower that keeps
the old file open reads it to its end before it moves on to the new one. A FILE deleted or renamed
by someone else is started anew at the next write.

It ignores SIGTERM and SIGINT and ends when its input does, so SGLang's last lines (its
shutdown) are written; a write that fails (a full disk) or would wait (a FIFO at FILE) is said
once a minute and the output still reaches standard output.
"""
from __future__ import annotations

import os
import signal
import sys
import time

READ = 1 << 16
SAY_EVERY_S = 60.0


class RotatingFile:
    def __init__(self, path: str, max_bytes: int, keep: int):
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.fd: int | None = None
        self.size = 0
        self.mid_line = False   # the file ends inside a line: a rotation must wait for its end
        self._said = -SAY_EVERY_S
        self._next_open = 0.0
        self._open()

    def _complain(self, what: str, e: OSError) -> None:
        now = time.monotonic()
        if now - self._said >= SAY_EVERY_S:
            self._said = now
            print(f"dsaops log-writer: {what} {self.path}: {e.strerror or e}", file=sys.stderr, flush=True)

    def _open(self) -> None:
        self._next_open = time.monotonic() + 10
        try:
            # O_NONBLOCK: a FIFO put at FILE would otherwise hold the open, and SGLang's output, until read
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
            self.size = os.fstat(self.fd).st_size
            self.mid_line = False
        except OSError as e:
            self.fd = None
            self._complain("cannot open", e)

    def _moved(self) -> bool:
        """FILE is no longer the file open here (deleted, renamed away, its folder gone)."""
        try:
            named = os.stat(self.path)
        except OSError:
            return True
        own = os.fstat(self.fd)
        return (named.st_dev, named.st_ino) != (own.st_dev, own.st_ino)

    def _append(self, data: bytes) -> None:
        while data and self.fd is not None:
            try:
                n = os.write(self.fd, data)
            except OSError as e:
                self._complain("cannot write", e)
                return
            self.size += n
            self.mid_line = data[n - 1:n] != b"\n"
            data = data[n:]

    def _rotate(self) -> bool:
        """Whether FILE was renamed; FILE is open again either way."""
        os.close(self.fd)
        self.fd = None
        try:
            for i in range(self.keep - 1, 0, -1):
                if os.path.exists(f"{self.path}.{i}"):
                    os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
            renamed = True
        except OSError as e:
            self._complain("cannot rotate", e)
            renamed = False
        self._open()
        return renamed

    def write(self, data: bytes) -> None:
        if self.fd is not None and self._moved():  # lines written to a file gone from FILE reach no follower
            self.close()
            self._open()
        if self.fd is None:
            if time.monotonic() < self._next_open:
                return
            self._open()
        while self.fd is not None and self.size + len(data) > self.max_bytes:
            # rotate between lines: after the last one that fits, else before the next one, else (an empty
            # file, or a line begun in it) after the first one
            cut = data.rfind(b"\n", 0, max(self.max_bytes - self.size, 0)) + 1
            if not cut and (self.mid_line or not self.size):
                cut = data.find(b"\n") + 1
                if not cut:  # no line ends here: go on unless one line has taken twice the limit
                    if self.size < 2 * self.max_bytes:
                        break
                    cut = len(data)
            self._append(data[:cut])
            data = data[cut:]
            if self.fd is not None and not self._rotate():
                break
        self._append(data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run(path: str, max_bytes: int, keep: int, source: int = 0, echo: int | None = 1) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    out = RotatingFile(path, max_bytes, keep)
    while data := os.read(source, READ):
        if echo is not None:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(echo, view):]
            except OSError:  # nobody reads standard output any more: the file still gets it
                echo = None
        out.write(data)
    out.close()
    return 0
