"""Which decode kernel each rank runs, from the one line the routing patch logs at startup
(sglang_patches/0006, rendered by dsaops.kernels.route.Decision.line):

    DSA decode kernel: dsaops for batch sizes >= 2, sglang below; reason=measured: ...

exported as `dsa_decode_kernel_info{rank,kernel,reason} 1`. A rank that logged no such line (a
bf16 pool, prefill only, a pristine SGLang) has no series. tests/healthchecks/test_decode_kernel.py
pins the line to the patch and the route module.
"""
from __future__ import annotations

import re

KEYWORD = "DSA decode kernel: "
_LINE = re.compile(r"DSA decode kernel: (dsaops|sglang) for (?:every batch size|batch sizes >= (\d+), sglang below); "
                   r"reason=([a-z_]+)")


def parse(message: str) -> tuple[str, str, int] | None:
    """(kernel, reason, smallest batch on that kernel) of a decision line's message, else None."""
    m = _LINE.match(message)
    return (m[1], m[3], int(m[2] or 1)) if m else None


class DecodeKernelCollector:
    """At scrape time, from the LogState the log follower fills (stdlib here: logparse imports this)."""

    def __init__(self, state, families):
        self.state, self.f = state, families

    def collect(self):
        info = self.f.gauge("dsa_decode_kernel_info", "Raw fp8 decode kernel a rank runs and why (startup log line; "
                            "kernel=dsaops may start at a batch size, below it sglang)", ("rank", "kernel", "reason"))
        with self.state.lock:
            for rank, (kernel, reason, _) in sorted(self.state.decode_kernel.items()):
                info.add(1, rank, kernel, reason)
        return [info.family]
