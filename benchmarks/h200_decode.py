"""Decode benchmark on one H200: dsaops' raw-fp8 kernel against SGLang 0.5.23's TileLang kernels.

    PYTHONPATH=. python3 benchmarks/h200_decode.py --sglang-root DIR [--out benchmarks/h200-decode.json]

DIR holds `sglang/kernels/ops/attention/dsa/tilelang_kernel.py` from the pinned wheel (loaded as
a baseline with small stand-ins for its two SGLang imports, never copied). Geometry: GLM-5.3-Flash
NoPE MLA (d_v=512, d_tail=0), top-k 2048, a 1,048,576-row pool, random distinct indices per query.
GPU time = median of CUDA-graph replays (20 calls a graph); eager host cost = wall time per call of
back-to-back eager calls (the GPU never stalls the host there), the least (and the median) of 15
runs, the garbage collector off as in `timeit`. The roofline is the larger of the fp8 rows read
once over the measured copy bandwidth and the FLOPs over the measured fp8 matmul rate. Kernels
compile first in parallel processes (cached in TILELANG_CACHE_DIR).
Prints a table last; writes the JSON schema of issue 7.
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import os
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor

HEADS = (16, 32, 64)
BATCHES = (1, 16, 64, 256)
TOPK = 2048
D_V = 512
SLOTS = 1 << 20
SGLANG_KERNEL = ("sglang", "kernels", "ops", "attention", "dsa", "tilelang_kernel.py")


def load_sglang(root):
    """SGLang's tilelang_kernel.py with stand-ins for the SGLang helpers it imports (CUDA answers)."""
    stand_ins = {
        "sglang": {}, "sglang.kernels": {}, "sglang.kernels.ops": {}, "sglang.kernels.ops.quantization": {},
        "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
        "sglang.srt": {}, "sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
    }
    saved = {name: sys.modules.get(name) for name in stand_ins}
    try:
        for name, attrs in stand_ins.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
        spec = importlib.util.spec_from_file_location("sglang_baseline_tilelang", os.path.join(root, *SGLANG_KERNEL))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def graph_us(fn, calls=20):
    """Median GPU time of one call of fn, from CUDA-graph replays (host overhead excluded)."""
    import torch
    import triton

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=200, return_mode="median")
    return ms * 1000 / calls


def host_us(fn, calls=200, repeats=15):
    """Host wall time per eager call: (least, median) of `repeats` runs of `calls` back-to-back
    calls, with the garbage collector off as `timeit` does. The device machine's host is shared:
    the same code read 18-36 us in one run and 27-53 us in the next, so the least of many runs is
    the code's cost and the median shows the neighbours. Each call enqueues far less GPU work than
    the launch queue holds, so the host never waits for the GPU."""
    import statistics

    import torch

    fn()
    torch.cuda.synchronize()
    runs = []
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            runs.append((time.perf_counter() - t0) * 1e6 / calls)
            torch.cuda.synchronize()
    finally:
        gc.enable()
    return min(runs), statistics.median(runs)


def ceilings():
    """(copy TB/s counting read + write, fp8 torch._scaled_mm TFLOP/s at 8192^3), measured here."""
    import torch
    import triton

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(functools.partial(dst.copy_, src), warmup=25, rep=200, return_mode="median")
    copy_tb_s = 2 * n / (ms * 1e-3) / 1e12
    src = dst = None  # free 2 GiB before the matmul
    m = 8192
    a = torch.randn((m, m), device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn((m, m), device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device="cuda")
    ms = triton.testing.do_bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                                 warmup=25, rep=200, return_mode="median")
    return copy_tb_s, 2 * m**3 / (ms * 1e-3) / 1e12


def _case_inputs(S, H, kv, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((S, H, D_V), generator=g, device="cuda", dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(kv.shape[0], generator=g, device="cuda")[:TOPK] for _ in range(S)])
    return q, idx[:, None, :].to(torch.int32).contiguous()


def _warm_sglang(job):
    """Compile SGLang's kernels for one case in a worker (lands in TILELANG_CACHE_DIR)."""
    import torch

    root, H, S, fp8 = job
    sgl = load_sglang(root)
    kv = torch.randn((4096, 1, D_V), device="cuda").to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
    q, idx = _case_inputs(S, H, kv, 0)
    sgl.tilelang_sparse_fwd(q, kv, idx, D_V**-0.5, d_v=D_V)
    torch.cuda.synchronize()
    return job


def _warm_dsaops(job):
    """Compile one (tile or merge, d_tail) of dsaops' sm_90 kernels in a worker (kernels/build.py)."""
    from dsaops.kernels.build import build

    return build("sm_90", jobs=[job], workers=1)


def parse_tile(spec):
    """A `--tiles` entry, heads:rows:stages:threads[:ws|:vr], as a Tile (ws: warp-specialised; vr: V in
    registers)."""
    from dsaops.kernels.tiles import Tile

    hb, rows, stages, threads, *kind = spec.split(":")
    return Tile(int(hb), int(rows), int(stages), int(threads), warp_specialized=kind == ["ws"],
                v_in_registers=kind == ["vr"])


def precompile(sglang_root, workers, extra_tiles=()):
    """Compile dsaops' sm_90 kernels (the dispatch's and `extra_tiles`) and SGLang's per-case kernels
    in parallel processes."""
    import multiprocessing

    from dsaops.kernels import tiles

    from dsaops import targets

    target = targets.get("sm_90")
    chosen = [t for _, dt, t in tiles.configurations(target) if dt == 0 and not t.warp_specialized]
    ours = sorted({(t, 0) for t in chosen + list(extra_tiles)}, key=str)
    ours += [(c, None) for c in tiles.COMBINES]
    jobs = [(_warm_dsaops, job) for job in ours]
    if sglang_root:
        jobs += [(_warm_sglang, (sglang_root, H, 1, False)) for H in HEADS]  # bf16 kernel: no split, S-free
        jobs += [(_warm_sglang, (sglang_root, H, S, True)) for H in HEADS for S in BATCHES]
    t0 = time.time()
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        for f in [pool.submit(fn, arg) for fn, arg in jobs]:
            f.result()
    print(f"precompiled {len(jobs)} kernel sets in {time.time() - t0:.0f} s", flush=True)


def kv_copy_rows(copy_tb_s):
    """kernels-copy's write/gather rows at 65,536 rows (benchmarks/bench_kv_copy.py), if present."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_kv_copy.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("bench_kv_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run(copy_tb_s=copy_tb_s)


def markdown(result) -> str:
    """The BENCHMARKS.md table of a result JSON (`--markdown FILE` prints it)."""
    lines = [(f"GPU: {result['gpu']}; copy {result['copy_tb_s']} TB/s (read + write), fp8 `torch._scaled_mm` "
             f"{result['fp8_mm_tflops']} TFLOP/s; top-k {TOPK}, d_v {D_V}, d_tail 0, {SLOTS:,}-row pool."), "",
             ("| H | S | dsaops fp8 µs | SGLang fp8 µs | SGLang bf16 µs | roofline µs | % of roofline "
             "| vs SGLang fp8 | vs SGLang bf16 | eager host µs (least / median of 15 runs) |"),
             "| " + " | ".join(["---"] * 10) + " |"]
    for c in result["cases"]:
        ours = c["dsaops_fp8_us"]
        ratio = [f"{c[k] / ours:.2f}x" if c.get(k) else "-" for k in ("sglang_fp8_us", "sglang_bf16_us")]
        lines.append(f"| {c['H']} | {c['S']} | {ours} | {c['sglang_fp8_us']} | {c['sglang_bf16_us']} | "
                     f"{c['roofline_us']} | {100 * c['roofline_us'] / ours:.0f}% | {ratio[0]} | {ratio[1]} | "
                     f"{c['eager_host_us']} / {c.get('eager_host_us_median', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", metavar="JSON", help="print the BENCHMARKS.md table of a result file and exit")
    p.add_argument("--sglang-root", help="folder holding sglang/kernels/ops/attention/dsa/tilelang_kernel.py")
    p.add_argument("--out", default="benchmarks/h200-decode.json")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel compile processes")
    p.add_argument("--heads", type=int, nargs="+", default=list(HEADS))
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--tiles", nargs="*", default=[],
                   help="extra tiles to time as heads:rows:stages:threads[:ws|:vr] (printed, not in the JSON)")
    args = p.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return 0

    import torch
    from dsaops.kernels import reference, sparse_mla_decode_fp8
    from dsaops.kernels.decode import decode_with_tile
    from dsaops.kernels.tiles import heads_per_block

    if args.sglang_root and not os.path.exists(os.path.join(args.sglang_root, *SGLANG_KERNEL)):
        print(f"no {os.path.join(*SGLANG_KERNEL)} under {args.sglang_root}", file=sys.stderr)
        return 2
    extra_tiles = [parse_tile(spec) for spec in args.tiles]
    precompile(args.sglang_root, args.workers, extra_tiles)
    sgl = load_sglang(args.sglang_root) if args.sglang_root else None
    gpu = torch.cuda.get_device_name()
    copy_tb_s, fp8_tflops = ceilings()
    print(f"{gpu}: copy {copy_tb_s:.2f} TB/s, fp8 matmul {fp8_tflops:.0f} TFLOP/s", flush=True)

    kv = torch.randn((SLOTS, 1, D_V), device="cuda", dtype=torch.bfloat16)
    kv_fp8 = kv.to(torch.float8_e4m3fn)
    kv_bf16 = kv_fp8.to(torch.bfloat16) if sgl else None  # same values, bf16 pool
    del kv
    scale = D_V**-0.5
    cases, extra = [], []
    for H in args.heads:
        for S in args.batches:
            q, idx = _case_inputs(S, H, kv_fp8, seed=H * 1000 + S)
            ours = functools.partial(sparse_mla_decode_fp8, q, kv_fp8, idx, scale)
            err = None
            if S <= 16:
                qq = q.to(torch.float8_e4m3fn).to(torch.bfloat16)
                ref = reference.sparse_mla_decode(qq, kv_fp8, idx, scale)
                out = sparse_mla_decode_fp8(qq, kv_fp8, idx, scale).float()
                err = ((out - ref).norm() / ref.norm()).item()
            flops = 2 * S * H * TOPK * (D_V + D_V)
            host_least, host_median = host_us(ours)
            row = {
                "H": H, "S": S, "topk": TOPK,
                "dsaops_fp8_us": round(graph_us(ours), 2),
                "sglang_fp8_us": round(graph_us(functools.partial(
                    sgl.tilelang_sparse_fwd, q, kv_fp8, idx, scale, d_v=D_V)), 2) if sgl else None,
                "sglang_bf16_us": round(graph_us(functools.partial(
                    sgl.tilelang_sparse_fwd, q, kv_bf16, idx, scale, d_v=D_V)), 2) if sgl else None,
                "roofline_us": round(max(S * TOPK * D_V / (copy_tb_s * 1e12), flops / (fp8_tflops * 1e12)) * 1e6, 2),
                "eager_host_us": round(host_least, 2),
                "eager_host_us_median": round(host_median, 2),
                "rel_err": None if err is None else round(err, 5),
            }
            cases.append(row)
            print(json.dumps(row), flush=True)
            for t in extra_tiles:
                if t.heads_per_block >= heads_per_block(H):  # a block of more heads than H pads the rest
                    try:
                        us = round(graph_us(functools.partial(
                            decode_with_tile, q, kv_fp8, idx, scale, D_V, False, tile=t)), 2)
                    except Exception as e:  # noqa: BLE001 - a development tile that fails is reported, not fatal
                        us = f"{type(e).__name__}: {str(e)[-200:]}"
                    extra.append({"H": H, "S": S, "tile": f"{t.name}_t{t.threads}", "us": us})
                    print("tile", json.dumps(extra[-1]), flush=True)
    kv_bf16 = None
    result = {"gpu": gpu, "copy_tb_s": round(copy_tb_s, 3), "fp8_mm_tflops": round(fp8_tflops, 1), "cases": cases}
    copy_rows = kv_copy_rows(copy_tb_s)
    if copy_rows is not None:
        result["kv_copy"] = copy_rows
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{gpu}  copy {copy_tb_s:.2f} TB/s  fp8 mm {fp8_tflops:.0f} TFLOP/s  (us; x = SGLang fp8 / dsaops)")
    print(f"{'H':>3} {'S':>4} {'dsaops':>8} {'sgl fp8':>8} {'sgl bf16':>8} {'roof':>6} {'%roof':>6} {'x':>5} {'host':>6} err")
    for r in result.get("kv_copy", []):
        if r.get("default", True):
            print(f"kv {r['kernel']} rows {r['rows']} width {r['width']}: "
                  + (f"{r['us']} us, {r['pct_of_copy']}% of copy" if "us" in r else r.get("error", "")))
    for c in cases:
        x = c["sglang_fp8_us"] / c["dsaops_fp8_us"] if c["sglang_fp8_us"] else float("nan")
        print(f"{c['H']:>3} {c['S']:>4} {c['dsaops_fp8_us']:>8.1f} {c['sglang_fp8_us'] or 0:>8.1f} "
              f"{c['sglang_bf16_us'] or 0:>8.1f} {c['roofline_us']:>6.1f} "
              f"{100 * c['roofline_us'] / c['dsaops_fp8_us']:>5.0f}% {x:>5.1f} {c['eager_host_us']:>6.1f} "
              f"{c['rel_err'] if c['rel_err'] is not None else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
