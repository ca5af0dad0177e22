"""SGLang 0.5.23 server log lines -> what they teach about the server.

Every pattern below is built from a format string in the pinned wheel (the contract test
finds each `FORMAT_STRINGS` entry there): a bump that rewords one fails that test loudly.
The prefix is `configure_logger`'s `[%Y-%m-%d %H:%M:%S(.mmm) DP<d> TP<t> EP<e>] `; the rank
parts appear only as configured, and the launcher's own lines carry none. Each message pattern
must start the message, right after the prefix, as SGLang logs it: a logged prompt or request
that quotes one later in its line teaches nothing.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from dsaops.healthchecks import decode_kernel

GIB = 1 << 30  # SGLang's "GB" (memory_pool.py: GB = 1024 * 1024 * 1024)
MAX_COUNT = 1 << 40  # token counts, requests, slots, GiB, deaths: anything larger is garbage

# Literal pieces of the wheel's format strings, by the file that holds them.
FORMAT_STRINGS = {
    "srt/utils/common.py": ['format = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"', 'datefmt="%Y-%m-%d %H:%M:%S"'],
    "srt/mem_cache/memory_pool.py": ["is allocated'}. dtype: {self.dtype}, ", '#tokens: {num_tokens}, KV size: {kv_size_GB:.2f} GB"',
                                     'f"Mamba Cache is allocated. "', 'f"max_mamba_cache_size: {size}, "'],
    "srt/mem_cache/kv_cache_configurator.py": ['"max_running_requests is capped to %d by the mamba state "',
                                               '"cache (max_mamba_cache_size=%d, %d state slots per "',
                                               '"max_running_requests was reduced from the requested %d to %d "',
                                               '"(per dp worker) due to the available KV cache capacity."'],
    "srt/utils/watchdog.py": ['f"Subprocess {name} (pid={proc.pid}) crashed "', 'f"with exit code {proc.exitcode}. "'],
    "srt/entrypoints/engine.py": ['f"Scheduler or DataParallelController {proc.pid} "', 'f"terminated with {proc.exitcode}"',
                                 'f"SIGTERM received on node_rank {get_parallel().node_rank}; "'],
    "srt/managers/tokenizer_manager.py": ['f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down..."',
                                          'f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed."'],
    "srt/entrypoints/http_server.py": ['f"Health check failed. Server couldn\'t get a response from detokenizer for last "'],
    "srt/managers/scheduler.py": ['prefix += f" DP{shown_dp}"', 'prefix += f" TP{shown_tp}"',
                                  'setproctitle.setproctitle(f"sglang::scheduler{prefix.replace(\' \', \'_\')}")'],
}

# A line teaches something only if it holds one of these (str.find runs ~6x faster than one regex).
_KEYWORDS = ("is allocated", "max_running_requests", "crashed with", "terminated with", "SIGTERM received",
             "SIGQUIT received", "Health check failed", decode_kernel.KEYWORD)
_PREFIX = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{3})?((?: [A-Z_]+\d+)*)\] (.*)$")
_KV_ALLOC = re.compile(r"KV Cache is allocated\. dtype: ([\w.]+), #tokens: (\d+), "
                       r"(?:KV size: ([\d.]+)|K size: ([\d.]+) GB, V size: ([\d.]+)) GB")
_MAMBA_ALLOC = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+),")
_MAMBA_CAP = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache "
                        r"\(max_mamba_cache_size=(\d+), (\d+) state slots per request\)")
_REDUCED = re.compile(r"max_running_requests was reduced from the requested (\d+) to (\d+) \(per dp worker\)")
_CRASHED = re.compile(r"Subprocess (\S+) \(pid=(\d+)\) crashed with exit code (-?\d+)\.")
_TERMINATED = re.compile(r"Scheduler or DataParallelController (\d+) terminated with (-?\d+)")
_SIGTERM = re.compile(r"SIGTERM received")
_SIGQUIT = re.compile(r"SIGQUIT received\.")
_HEALTH_FAILED = re.compile(r"Health check failed\.")

# Exit codes as multiprocessing reports them (-N: killed by signal N) -> the `cause` label.
_SIGNAL_CAUSES = {9: "sigkill", 11: "sigsegv", 6: "sigabrt", 7: "sigbus"}
CAUSES = ("sigkill", "sigsegv", "sigabrt", "sigbus", "signal", "exit_code", "oom_kill", "unknown")


def cause_of_exit_code(code: int) -> str:
    """A bounded label for an exit code: the common fatal signals by name, else its kind."""
    if code < 0:
        return _SIGNAL_CAUSES.get(-code, "signal")
    return "exit_code"


def bounded(value, kind=int, high=MAX_COUNT):
    """`kind(value)`, ValueError outside 0..high (NaN and inf included): a larger number kept
    would fail every later scrape of the collector that exports it (float() overflows)."""
    v = kind(value)
    if not 0 <= v <= high:
        raise ValueError(f"{value!r} is out of range")
    return v


def rank_label(parts: list[str]) -> str:
    """`['DP3', 'TP3', 'EP3']` -> `DP3_TP3_EP3`; no parts (one rank, no DP) -> `TP0`,
    the same spelling the process title gives (`sglang::scheduler_DP3_TP3_EP3`)."""
    return "_".join(parts) if parts else "TP0"


@dataclass
class LogState:
    """What the log has taught so far; written by the follower thread, read at scrape time."""

    max_crash_records: int = 4096
    kv: dict = field(default_factory=dict)              # rank -> (dtype, tokens, bytes)
    mamba_slots: dict = field(default_factory=dict)     # rank -> max_mamba_cache_size
    mamba_cap: dict = field(default_factory=dict)       # rank -> (cap, max_mamba_cache_size, slots per request)
    reduced: dict = field(default_factory=dict)         # rank -> (requested per dp, effective)
    decode_kernel: dict = field(default_factory=dict)   # rank -> (kernel, reason, min batch): decode_kernel.py
    exits: OrderedDict = field(default_factory=OrderedDict)  # pid -> (exit code, line time, crashed?)
    shutdowns: list = field(default_factory=list)       # line times of clean-stop lines (last few)
    events: dict = field(default_factory=lambda: {"sigquit": 0, "health_check_failed": 0, "sigterm": 0})
    position: dict | None = None                        # where the follower stands (logfollow)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_json(self, keep_exits: int = 256) -> dict:
        """What the log taught, for the state file: a restarted exporter resumes reading after
        `position` and must not forget the startup lines it read before."""
        with self.lock:
            return {"kv": self.kv, "mamba_slots": self.mamba_slots, "mamba_cap": self.mamba_cap,
                    "reduced": self.reduced, "decode_kernel": self.decode_kernel, "exits": [[pid, *rec] for pid, rec in self.exits.items()][-keep_exits:],
                    "shutdowns": self.shutdowns, "events": self.events, "position": self.position}

    @staticmethod
    def _parse(saved: dict) -> dict:
        return {"kv": {str(r): (str(d), bounded(n), bounded(b, float, MAX_COUNT * GIB)) for r, (d, n, b) in saved["kv"].items()},
                "mamba_slots": {str(r): bounded(n) for r, n in saved["mamba_slots"].items()},
                "mamba_cap": {str(r): (bounded(c), bounded(s), bounded(k)) for r, (c, s, k) in saved["mamba_cap"].items()},
                "reduced": {str(r): (bounded(a), bounded(b)) for r, (a, b) in saved["reduced"].items()},
                # a state file written before the decode series existed has none
                "decode_kernel": {str(r): (str(k), str(why), int(b))
                                  for r, (k, why, b) in saved.get("decode_kernel", {}).items()},
                "exits": OrderedDict((int(pid), (int(code), float(when), bool(crashed)))
                                     for pid, code, when, crashed in saved["exits"]),
                "shutdowns": [float(t) for t in saved["shutdowns"]][-8:],
                "events": {k: bounded(v) for k, v in saved["events"].items()},
                "position": None if saved["position"] is None else {
                    k: (str if k == "head_sha256" else int)(saved["position"][k])
                    for k in ("dev", "ino", "offset", "head_len", "head_sha256")}}

    def check(self, saved: dict) -> None:
        """Raise when `saved` is not what to_json writes."""
        self._parse(saved)

    def restore(self, saved: dict) -> None:
        parsed = self._parse(saved)
        with self.lock:
            events = {**self.events, **{k: v for k, v in parsed.pop("events").items() if k in self.events}}
            for name, value in parsed.items():
                setattr(self, name, value)
            self.events = events

    @staticmethod
    def interesting(text: str):
        """The lines of `text` (many lines) that may teach something, each once, in order."""
        starts = set()
        for key in _KEYWORDS:
            at = text.find(key)
            while at >= 0:
                starts.add(text.rfind("\n", 0, at) + 1)
                at = text.find(key, at + len(key))
        for start in sorted(starts):
            end = text.find("\n", start)
            yield text[start:len(text) if end < 0 else end].rstrip("\r")

    def feed(self, line: str) -> None:
        """Apply one line. Most lines teach nothing: one keyword scan rejects them cheaply."""
        if not any(key in line for key in _KEYWORDS):
            return
        m = _PREFIX.match(line)
        if not m:  # a traceback, uvicorn's access log, …
            return
        stamp, parts, msg = m.groups()
        when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()  # local time, as SGLang writes it
        rank = rank_label(parts.split())
        with self.lock:
            self._apply(rank, when, msg)

    def _apply(self, rank: str, when: float, msg: str) -> None:
        if "is allocated" in msg:  # the unlabelled pool only: "SWA KV Cache …" and friends are side pools
            if m := _KV_ALLOC.match(msg):  # one KV size, or K and V sizes
                size = bounded(m[3], float) if m[3] is not None else bounded(m[4], float) + bounded(m[5], float)
                pool, last = (m[1], bounded(m[2]), size * GIB), self.kv.get(rank)
                # a speculative draft (MTP's layer) logs its pool next, sized by the target's
                # memory_pool_config (kv_cache_configurator.configure): same dtype and tokens, fewer bytes
                if last is None or pool[:2] != last[:2] or pool[2] >= last[2]:
                    self.kv[rank] = pool
            elif m := _MAMBA_ALLOC.match(msg):
                self.mamba_slots[rank] = bounded(m[1])
        elif m := _MAMBA_CAP.match(msg):
            self.mamba_cap[rank] = (bounded(m[1]), bounded(m[2]), bounded(m[3]))
        elif m := _REDUCED.match(msg):
            self.reduced[rank] = (bounded(m[1]), bounded(m[2]))
        elif m := _CRASHED.match(msg):
            self._exit(int(m[2]), int(m[3]), when, crashed=True)
        elif m := _TERMINATED.match(msg):
            self._exit(int(m[1]), int(m[2]), when, crashed=False)
        elif _SIGTERM.match(msg):
            self.events["sigterm"] += 1
            self.shutdowns = self.shutdowns[-7:] + [when]
        elif _SIGQUIT.match(msg):
            self.events["sigquit"] += 1
        elif _HEALTH_FAILED.match(msg):
            self.events["health_check_failed"] += 1
        elif decision := decode_kernel.parse(msg):
            self.decode_kernel[rank] = decision

    def _exit(self, pid: int, code: int, when: float, crashed: bool) -> None:
        if crashed or pid not in self.exits:  # the watchdog's "crashed" outranks a later join report
            self.exits[pid] = (code, when, crashed)
            self.exits.move_to_end(pid)
        while len(self.exits) > self.max_crash_records:
            self.exits.popitem(last=False)

    def exit_of(self, pid: int, since: float) -> tuple[int, bool] | None:
        """(exit code, crashed?) the log reported for `pid`, from a line no older than `since`
        (the process's start, so a reused pid does not inherit an old line)."""
        with self.lock:
            rec = self.exits.get(pid)
        if rec and rec[1] >= since:
            return rec[0], rec[2]
        return None

    def forget_exit(self, pid: int) -> None:
        """A line serves one process: pids repeat (a restarted container numbers its processes alike)."""
        with self.lock:
            self.exits.pop(pid, None)

    def clean_stop_since(self, since: float) -> bool:
        """A clean-stop line (`SIGTERM received…`) written after `since`."""
        with self.lock:
            return any(t >= since for t in self.shutdowns)
