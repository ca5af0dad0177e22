"""GPU time of a kernel call as a server sees it, by CUDA-graph replay (host overhead excluded).

- graph_us: the same inputs every call (the call's rows stay in L2 from one call to the next).
- rotated_us: a graph cycles through several input sets, enough that at least ROTATE_BYTES of
  other rows and indices are read between two calls of one set, so no call finds its rows in
  L2 (50 MB on an H200), as in a server's decode where every step reads new top-k rows.
- host_us: host wall time of an eager call, several calls' runs taken in turns.
- ceilings: the copy bandwidth (copy_tb_s) and fp8 matmul rate a roofline divides by.

torch and triton are imported on use (benchmarks and `dsaops kernels selftest` share this).
"""
from __future__ import annotations

import functools
import gc
import math
import statistics
import time

ROTATE_BYTES = 256 << 20
CALLS_PER_GRAPH = 20
REP_MS = 200


def rotation_count(bytes_per_call: int, rotate_bytes: int = ROTATE_BYTES) -> int:
    """Input sets to cycle so that the other sets read at least rotate_bytes between two calls of one."""
    if bytes_per_call <= 0:
        raise ValueError(f"bytes_per_call must be positive, got {bytes_per_call}")
    return 1 + math.ceil(rotate_bytes / bytes_per_call)


def replay_us(calls, rep_ms: int = REP_MS) -> float:
    """Median GPU time of one call, from replays of a CUDA graph that makes `calls` in order."""
    import torch
    import triton

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream: first calls may allocate or compile
        for fn in dict.fromkeys(calls):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median")
    del graph
    return ms * 1000 / len(calls)


def graph_us(fn, calls: int = CALLS_PER_GRAPH, rep_ms: int = REP_MS) -> float:
    """Median GPU time of fn on the same inputs, `calls` back to back a graph."""
    return replay_us([fn] * calls, rep_ms)


def rotated_us(fns, rep_ms: int = REP_MS) -> float:
    """Median GPU time of a call when each call reads another input set: fns are one call per set
    (len(fns) from rotation_count), cycled in a graph of at least CALLS_PER_GRAPH calls."""
    if len(fns) < 2:
        raise ValueError("a rotation needs at least two input sets")
    return replay_us(list(fns) * math.ceil(CALLS_PER_GRAPH / len(fns)), rep_ms)


def host_us(fns, calls: int = 200, repeats: int = 15, sync=None) -> list[tuple[float, float]]:
    """Host wall time per eager call of each of fns: (least, median) of `repeats` runs of `calls`
    back-to-back calls, with the garbage collector off as `timeit` does. The runs go in turns, run r
    of every fn before run r + 1 of any, so a slow phase of a shared host lands on one run of many
    fns rather than on every run of one; the least is the code's cost, the median moves with the
    host's neighbours. Each call enqueues far less GPU work than the launch queue holds, so the host
    never waits for the GPU. sync: waits for the GPU between runs (torch.cuda.synchronize)."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    for fn in fns:
        fn()
    sync()
    runs = [[] for _ in fns]
    gc.disable()
    try:
        for _ in range(repeats):
            for fn, times in zip(fns, runs):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times.append((time.perf_counter() - t0) * 1e6 / calls)
                sync()
    finally:
        gc.enable()
    return [(min(times), statistics.median(times)) for times in runs]


def copy_tb_s() -> float:
    """Device-to-device copy bandwidth of 1 GiB, TB/s counting read + write, measured here."""
    import torch
    import triton

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(functools.partial(dst.copy_, src), warmup=25, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3) / 1e12  # src and dst go with this frame: 2 GiB free again for the caller


def ceilings() -> tuple[float, float]:
    """(copy TB/s counting read + write, fp8 torch._scaled_mm TFLOP/s at 8192^3), measured here."""
    import torch
    import triton

    copy = copy_tb_s()
    m = 8192
    a = torch.randn((m, m), device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn((m, m), device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device="cuda")
    ms = triton.testing.do_bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                                 warmup=25, rep=200, return_mode="median")
    return copy, 2 * m**3 / (ms * 1e-3) / 1e12
