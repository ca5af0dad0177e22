"""Follow the SGLang server log like `tail -F`, and export what it taught.

The follower reads in bounded chunks and never holds more than one chunk plus one over-long
line in memory. What it survives, and how each shows in `dsa_log_follower_events_total`:

- rotation (`rotated`): the path now names another file; the old one is read to its end first.
- truncation in place (`truncated`): the file is shorter than what was read, or its first bytes
  changed (a truncation followed by fast writes can make it longer again before the next look, so
  the first bytes are compared before reading on after the end was reached).
- a FIFO or another non-regular file at the path (`not_a_file`): never opened, so never blocks.
- a missing file (`missing`): waited for.
- lines over `MAX_LINE` bytes (`line_dropped`): dropped.

The last three are bad input and count as `log` errors too (missing or not-a-file once when
found, then once a minute while it lasts).

Its position (device, inode, the offset after the last whole line, and a hash of the file's
first bytes) is kept in the LogState, so a restarted exporter resumes there (`resumed`) instead
of reading gigabytes again, in the file it was reading even if that was rotated to `PATH.1` …
`PATH.9` meanwhile, then in the newer ones; a file whose first bytes differ is another file,
read from its beginning (`reread`).
"""
from __future__ import annotations

import hashlib
import os
import stat as st_mode
import threading
import time

from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts, Families

CHUNK = 1 << 20
MAX_LINE = 64 << 10  # longer "lines" are garbage (a binary blob), not SGLang output
HEAD = 4096          # the first bytes of a file, which tell it from another one at the same path
ROTATED = 9          # PATH.1 … PATH.9 are looked at for the file a restarted exporter was reading
SAY_EVERY_S = 60.0
EVENTS = ("rotated", "truncated", "resumed", "reread", "missing", "not_a_file", "line_dropped")


class _File:
    def __init__(self, fd: int, st: os.stat_result, offset: int = 0):
        self.fd, self.ident, self.offset = fd, (st.st_dev, st.st_ino), offset
        self.consumed = offset       # after the last whole line handed on
        self.at_end = False          # the last read found no more bytes
        self.head = os.pread(fd, HEAD, 0)[:offset] if offset else b""
        self.head_sha = hashlib.sha256(self.head).hexdigest()

    def close(self) -> None:
        os.close(self.fd)


def _ident(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(name)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class LogFollower(BackgroundLoop):
    def __init__(self, path: str, state: LogState, errors: ErrorCounts, poll: float = 0.25):
        super().__init__("log", errors, poll)
        self.path, self.state = path, state
        self.caught_up = threading.Event()  # set once reading first reached the end of the file
        self.events = dict.fromkeys(EVENTS, 0)
        self._file: _File | None = None
        self._queue: list[_File] = []       # rotated files still to read after the current one, in order
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop bytes until its newline
        self._absent: tuple[str, float] | None = None  # (why, when last counted) while the path is unusable

    # -- position ----------------------------------------------------------------------------

    def _names(self) -> list[str]:
        return [self.path] + [f"{self.path}.{i}" for i in range(1, ROTATED + 1)]

    def resume(self, position: dict | None) -> None:
        """Before start: continue where a previous exporter stopped (LogState.position)."""
        if not position:
            return
        for name in self._names():
            found = self._open(name, quiet=True)
            if found is None:
                continue
            fd, st = found
            try:
                same = ((st.st_dev, st.st_ino) == (position["dev"], position["ino"])
                        and st.st_size >= max(position["offset"], position["head_len"])
                        and hashlib.sha256(os.pread(fd, position["head_len"], 0)).hexdigest() == position["head_sha256"])
            except (KeyError, TypeError, OSError):
                same = False
            if not same:
                os.close(fd)
                continue
            self._file = _File(fd, st, position["offset"])  # at its end, the rotation look finds the newer ones
            self.events["resumed"] += 1
            return
        self.events["reread"] += 1

    def _note_position(self) -> None:
        f = self._file
        with self.state.lock:
            self.state.position = {"dev": f.ident[0], "ino": f.ident[1], "offset": f.consumed,
                                   "head_len": len(f.head), "head_sha256": f.head_sha}

    # -- the loop ----------------------------------------------------------------------------

    def stop(self) -> None:
        super().stop()
        for f in [self._file, *self._queue]:
            if f:
                f.close()
        self._file, self._queue = None, []

    def step(self) -> bool:
        """Read one chunk; True when there may be more to read right away."""
        try:
            return self._read()
        except OSError as e:
            self.errors.report("log", f"reading {self.path}", e)
            self._next()
            return False

    def _read(self) -> bool:
        if self._file is None and not self._next():
            return False
        f = self._file
        if f.at_end and f.head and os.pread(f.fd, len(f.head), 0) != f.head:  # rewritten since the last look
            return self._truncated(f)
        data = os.pread(f.fd, CHUNK, f.offset)
        f.at_end = not data
        if data:
            if f.offset < HEAD:
                f.head = (f.head + data)[:HEAD]
                f.head_sha = hashlib.sha256(f.head).hexdigest()
            f.offset += len(data)
            self._feed(data)
            f.consumed = f.offset - len(self._partial)
            self._note_position()
            return True
        self.caught_up.set()
        if self._queue:  # an older, rotated file ends here: the newer ones follow
            return self._next()
        try:
            now = os.stat(self.path)
        except FileNotFoundError:  # rotated away, new file not there yet: keep the old one open
            return False
        if (now.st_dev, now.st_ino) != f.ident:  # rotated: the old file is read to its end, move on
            if os.fstat(f.fd).st_size > f.offset:  # written just before the rename
                return True
            return self._rotated(f)
        if now.st_size < f.offset:  # truncated in place (changed first bytes: the next step's look)
            return self._truncated(f)
        return False

    def _rotated(self, f: _File) -> bool:
        """Queue the files written after f, oldest first, PATH last (rotated more than once since
        the last look: the files between come first). They are opened by name, so they count only
        if f has not moved on meanwhile: another rotation would have put a newer file under a name,
        or left PATH missing for a moment, and the file between would be skipped; look again."""
        names = self._names()
        where = next((i for i, name in enumerate(names[1:], 1) if _ident(name) == f.ident), None)
        newer = [_File(*opened) for name in reversed(names[1:where or 1]) if (opened := self._open(name, quiet=True))]
        current = self._open(self.path, quiet=True)
        if current is None or (where is not None and _ident(names[where]) != f.ident):
            for opened in newer:
                opened.close()
            if current is not None:
                os.close(current[0])
            return current is not None  # moved on: at once; PATH missing: at the next poll
        self.events["rotated"] += 1
        self._queue += [*newer, _File(*current)]
        return self._next()

    def _truncated(self, f: _File) -> bool:
        """Start over at the beginning of the same file, never reading on from the old offset."""
        self.events["truncated"] += 1
        self._drop_partial()
        self._file = _File(f.fd, os.fstat(f.fd))
        return True

    def _next(self) -> bool:
        """Close the current file; go on with the next rotated one, else the path."""
        self._drop_partial()
        if self._file:
            self._file.close()
            self._file = None
        if self._queue:
            self._file = self._queue.pop(0)
            return True
        opened = self._open(self.path)
        if opened is None:
            return False
        self._file = _File(*opened)
        return True

    def _open(self, name: str, quiet: bool = False):
        """(fd, stat) of a regular file at `name`; None (counted unless quiet) otherwise. A FIFO is
        never opened (that would block); O_NONBLOCK covers one swapped in after the look."""
        try:
            before = os.stat(name)
            if not st_mode.S_ISREG(before.st_mode):
                raise IsADirectoryError("not a regular file")
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if not quiet:
                self._unusable("missing")
            return None
        except OSError as e:
            if not quiet:
                self._unusable("not_a_file" if isinstance(e, IsADirectoryError) else "missing", e)
            return None
        st = os.fstat(fd)
        if not st_mode.S_ISREG(st.st_mode):
            os.close(fd)
            if not quiet:
                self._unusable("not_a_file")
            return None
        self._absent = None
        return fd, st

    def _unusable(self, why: str, exc: OSError | None = None) -> None:
        """Count a missing or unreadable path when found, then once a minute while it lasts."""
        now = time.monotonic()
        if self._absent and self._absent[0] == why and now - self._absent[1] < SAY_EVERY_S:
            return
        self._absent = (why, now)
        self.events[why] += 1
        self.errors.report("log", f"{self.path}: {why.replace('_', ' ')}", exc)

    # -- lines -------------------------------------------------------------------------------

    def _drop_partial(self) -> None:
        if self._partial:  # a line cut in half by rotation or truncation
            self.errors.inc("log")
        self._partial, self._skipping = b"", False

    def _dropped(self) -> None:
        self.events["line_dropped"] += 1
        self.errors.inc("log")

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
            self._dropped()
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
                    if len(line) > MAX_LINE:
                        self._dropped()
                    else:
                        self._apply(line)
                return
        for raw in block.split(b"\n"):
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        if len(raw) > MAX_LINE:
            self._dropped()
            return
        if b"\x00" in raw:
            self.errors.inc("log")
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.errors.inc("log")
            return
        self._apply(text.rstrip("\r"))

    def _apply(self, line: str) -> None:
        try:
            self.state.feed(line)
        except (ValueError, OverflowError):  # a bad date or number in a line shaped like SGLang's: that line only
            self.errors.inc("log")


class LogCollector:
    """What only the log tells: the KV pool per scheduler rank, SGLang's KV-capacity reduction
    warning, and the counts of its alarm lines. (The mamba figures the log gives are exported
    by the server_info collector, which prefers the /server_info fields when present.)"""

    def __init__(self, state: LogState, families: Families, follower: LogFollower | None = None):
        self.state, self.f, self.follower = state, families, follower

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
        out = [tokens.family, size.family, reduced.family, events.family]
        if self.follower is not None:
            followed = f.counter("dsa_log_follower_events_total", "What the log follower met: rotated, truncated, "
                                 "resumed, reread, missing, not_a_file, line_dropped", ("event",))
            for event, n in self.follower.events.items():
                followed.add(n, event)
            out.append(followed.family)
        return out
