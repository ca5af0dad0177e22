"""The exporter's memory across its restarts: a small JSON file on the node.

It holds the death counts and up states, the ranks the exporter saw (pid, start time,
launcher, cgroup, container), the processes already judged, the cgroups' oom_kill counts,
the containers' restart counts with the Id last seen, and what the log taught with the
follower's position in it. A restarted exporter takes it back
before its loops start (`restore`), so a death is neither forgotten nor counted twice, and
one that happened while it was down is judged from the log lines written meanwhile and the
container's state.

Written every `interval` seconds when it changed, and at once after a death: to a temporary
file in the same folder, flushed to disk, then renamed over the old one, so a crash leaves
the old file or the new one, never half of one. A file that cannot be read back (foreign,
cut, another version) is counted as a `state` error, kept aside as `<file>.bad`, and the
exporter starts afresh; a section it lacks (the log's, from a run without --log-file) is a
part that starts empty. A write that fails is counted and tried again at the next turn.
"""
from __future__ import annotations

import json
import os
import stat
import threading

from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts

from dsaops.plan_input import open_no_wait

VERSION = 1
MAX_BYTES = 16 << 20


class StateKeeper(BackgroundLoop):
    def __init__(self, path: str, errors: ErrorCounts, parts: dict, interval: float = 2.0):
        """`parts`: name -> an object with to_json(), check(saved) (raises on a bad one) and restore(saved)."""
        super().__init__("state", errors, interval)
        self.path, self.parts = path, parts
        self._written: str | None = None
        self._save_lock = threading.Lock()

    def restore(self) -> bool:
        """Take the file back into the parts; False (and nothing changed) when there is none or
        it is unusable."""
        try:
            with open_no_wait(self.path) as f:   # a FIFO there would hold the exporter's start
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise OSError("not a regular file")
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return False
        except OSError as e:
            self.errors.report("state", f"cannot read {self.path}", e)
            return False
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError(f"over {MAX_BYTES} bytes")
            saved = json.loads(raw)
            if not isinstance(saved, dict) or saved.get("version") != VERSION:
                raise ValueError(f"not a version-{VERSION} dsaops exporter state")
            for name, part in self.parts.items():
                if name in saved:  # no section: written without that part (no --log-file then), which starts empty
                    part.check(saved[name])
        except Exception as e:  # noqa: BLE001 (foreign or cut file: start afresh, keep it for a look)
            self.errors.report("state", f"{self.path} is unusable; kept as {self.path}.bad, starting afresh", e)
            try:
                os.replace(self.path, self.path + ".bad")
            except OSError:
                pass
            return False
        for name, part in self.parts.items():
            if name in saved:
                part.restore(saved[name])
        self._written = None
        return True

    def step(self) -> bool:
        self.save()
        return False

    def save(self) -> None:
        with self._save_lock:
            text = json.dumps({"version": VERSION, **{n: p.to_json() for n, p in self.parts.items()}},
                              sort_keys=True, separators=(",", ":"))
            if text == self._written:
                return
            folder = os.path.dirname(os.path.abspath(self.path))
            tmp = f"{self.path}.{os.getpid()}.tmp"
            try:
                os.makedirs(folder, exist_ok=True)
                # a buffered write goes on after a short write (a full disk) until it has all, or raises
                with open(tmp, "wb", opener=lambda path, flags: os.open(path, flags, 0o644)) as f:
                    f.write(text.encode())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError as e:
                self.errors.report("state", f"cannot write {self.path}", e)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                return
            self._written = text
