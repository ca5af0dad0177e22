"""Bandwidth of write_kv_fp8 and gather_kv_rows against the GPU's measured copy bandwidth (target: >= 70%).

Times are the median of CUDA-graph replays (triton.testing.do_bench_cudagraph). Each graph cycles
through ROTATE independent input sets bigger than L2 together, so a replay reads from HBM rather
than from the previous replay's cache lines. Bytes counted are what the kernel must move: the write
reads bf16 rows and int64 slot ids and writes fp8 rows; the gather reads fp8 rows and int32 ids and
writes fp8 rows and int32 ids. The copy bandwidth (read + write) is the caller's measurement when it
passes one (the decode bench driver does), else kernels/timing.py's, measured here.

    python benchmarks/bench_kv_copy.py [--rows 65536] [--no-sweep]     # prints JSON rows
`run()` is what the kernels bench driver calls.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

ROTATE = 8
POOL_ROWS = 1 << 20  # the KV pool the rows are written into and gathered from


def _bench_us(fn) -> float:
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def _rotating(calls):
    """A function that makes the next call each time it runs (so a captured graph holds them all)."""
    state = {"i": 0}

    def step():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return step


@contextlib.contextmanager
def _block_m(module, value):
    saved = module.BLOCK_M
    module.BLOCK_M = value or saved
    try:
        yield module.BLOCK_M
    finally:
        module.BLOCK_M = saved


def _cases(rows, pool_rows, width, d_nope, dev):
    import torch
    from dsaops.kernels import kv_gather, kv_write

    fp8 = kv_write.fp8_dtype_for(torch.device(dev)) or torch.float8_e4m3fn
    pool = torch.zeros(pool_rows, 1, width, dtype=fp8, device=dev)
    sets = []
    for _ in range(ROTATE):
        x = torch.randn(rows, width, dtype=torch.bfloat16, device=dev)
        slots = torch.randperm(pool_rows, device=dev)[:rows]
        sets.append((x, slots, slots.to(torch.int32)))
    rope = width > d_nope
    write_calls = [lambda x=x, loc=loc: kv_write.write_kv_fp8(pool, loc, x[:, :d_nope], x[:, d_nope:] if rope else None)
                   for x, loc, _ in sets]
    gather_calls = [lambda ids=ids: kv_gather.gather_kv_rows(pool, ids) for _, _, ids in sets]
    return [
        ("write_kv_fp8", kv_write, write_calls, rows * (width * 2 + 8 + width)),
        ("gather_kv_rows", kv_gather, gather_calls, rows * (width + 4 + width + 4)),
    ]


def run(rows=65536, pool_rows=POOL_ROWS, widths=(512, 576), sweep=True, copy_tb_s=None, device="cuda") -> list[dict]:
    """One dict per kernel and row width (d=512: NoPE GLM-5.3-Flash; 576: 512 + 64 RoPE) at the default tile and,
    with sweep, at the other BLOCK_M values (default=False), so one GPU run shows whether another tile is better.
    copy_tb_s: the copy bandwidth measured by the caller (TB/s, read + write); measured here when None.
    A case that fails becomes a row with "error" (the decode driver writes its results after this returns)."""
    if not copy_tb_s:
        from dsaops.kernels import timing

        copy_tb_s = timing.copy_tb_s()  # the decode benchmark's own ceiling, so the shares agree with its run
    copy_gbps = copy_tb_s * 1e3
    results = []
    for width in widths:
        try:
            cases = _cases(rows, pool_rows, width, 512, device)
        except Exception as e:  # noqa: BLE001 - reported in the results, not fatal to the caller's run
            results.append({"kernel": "setup", "rows": rows, "width": width, "error": f"{type(e).__name__}: {e}"})
            continue
        for name, module, calls, nbytes in cases:
            default = module.BLOCK_M
            for block in [default] + ([b for b in (8, 16, 32, 64) if b != default] if sweep else []):
                row = {"kernel": name, "rows": rows, "width": width, "block_m": block, "default": block == default}
                try:
                    with _block_m(module, block):
                        us = _bench_us(_rotating(calls))
                except Exception as e:  # noqa: BLE001 - as above
                    row["error"] = f"{type(e).__name__}: {str(e)[-300:]}"
                else:
                    gbps = nbytes / us / 1e3
                    row |= {"us": round(us, 2), "bytes": nbytes, "gb_s": round(gbps, 1),
                            "copy_gb_s": round(copy_gbps, 1), "pct_of_copy": round(100 * gbps / copy_gbps, 1)}
                results.append(row)
                print("kv_copy", json.dumps(row), flush=True)
    return results


def markdown(results: list[dict]) -> str:
    lines = ["| kernel | rows | row bytes | BLOCK_M | µs | GB/s | % of copy |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        timing = f"{r['us']} | {r['gb_s']} | {r['pct_of_copy']}" if "us" in r else f"{r['error']} | |"
        tile = f"{r.get('block_m', '')}{' (sweep)' if r.get('default') is False else ''}"
        lines.append(f"| {r['kernel']} | {r['rows']} | {r['width']} | {tile} | {timing} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65536, help=f"rows a call writes or gathers, 1 to {POOL_ROWS}")
    parser.add_argument("--no-sweep", action="store_true", help="time the default BLOCK_M only")
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= POOL_ROWS:
        print(f"bench_kv_copy: --rows {args.rows}: give a whole number from 1 to {POOL_ROWS} (the pool's rows)",
              file=sys.stderr)
        return 2
    from benchmarks.run_info import cuda_torch  # run as a file, the repository joins sys.path only in __main__
    from dsaops.errors import UserError

    try:
        torch = cuda_torch()
    except UserError as e:
        print(f"bench_kv_copy: {e}", file=sys.stderr)
        return 2
    results = run(rows=args.rows, sweep=not args.no_sweep)
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "results": results}, indent=1))
    print(markdown(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for `import dsaops`
    raise SystemExit(main())
