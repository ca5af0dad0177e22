"""Accuracy of raw vs per-row-scaled fp8 KV for sparse-MLA decode (kernels/README.md, "The row-scaled layout").

    PYTHONPATH=. python3 benchmarks/fp8_row_scale_accuracy.py [--seeds N] [--kernels] [--out FILE]

Truth is the fp32 decode over bf16 KV; each fp8 variant decodes the same bf16 q over its KV. KV
rows are N(0, sigma) with a few outlier channels scaled up, as MLA latents have. By default (CPU)
both variants are dsaops.kernels.reference, so only the KV format differs: raw fp8 is the cast
clamped to +-448 (no NaN), row-scaled is reference.quantize_rows_scaled. With --kernels (a GPU)
they are the real kernels: write_kv_fp8 into a raw and a row-scaled pool, sparse_mla_decode_fp8
over each (which also rounds q to fp8, so both errors include that). Prints a markdown table
(relative error, norm-wise, the mean over --seeds draws of KV, q and indices) and writes it to
benchmarks/fp8-row-scale-cpu.json (--kernels: fp8-row-scale-gpu.json) for benchmarks/report.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.run_info import cuda_torch, gpu_machine, run_info
from dsaops.cli_args import writable, write
from dsaops.errors import UserError

D, TOPK, SLOTS, S, H = 512, 2048, 8192, 8, 16
OUTLIER_CHANNELS = 8
CASES = [(1.0, 1.0), (1.0, 30.0), (0.05, 1.0), (0.05, 30.0), (0.01, 1.0), (0.01, 30.0)]  # (sigma, outlier x)


def errors(sigma: float, outlier: float, seed: int = 0, kernels: bool = False) -> tuple[float, float]:
    """(raw fp8 error, row-scaled fp8 error) of the decode output against bf16 KV."""
    import torch
    from dsaops.kernels import reference

    g = torch.Generator().manual_seed(seed)
    kv = torch.randn((SLOTS, D), generator=g) * sigma
    kv[:, :OUTLIER_CHANNELS] *= outlier
    kv = kv.to(torch.bfloat16)
    q = torch.randn((S, H, D), generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(SLOTS, generator=g)[:TOPK] for _ in range(S)])[:, None].int()
    scale = D**-0.5
    truth = reference.sparse_mla_decode(q, kv[:, None].float(), idx, scale)
    fp8 = torch.float8_e4m3fn
    if kernels:
        from dsaops.kernels import sparse_mla_decode_fp8, write_kv_fp8

        kv, q, idx = kv.cuda(), q.cuda(), idx.cuda()
        loc = torch.arange(SLOTS, device="cuda")
        raw = write_kv_fp8(torch.empty((SLOTS, 1, D), dtype=fp8, device="cuda"), loc, kv)
        scales = torch.empty(SLOTS, device="cuda")
        rows = write_kv_fp8(torch.empty((SLOTS, 1, D), dtype=fp8, device="cuda"), loc, kv, kv_scale=scales)
        out_raw = sparse_mla_decode_fp8(q, raw, idx, scale).float().cpu()
        out_scaled = sparse_mla_decode_fp8(q, rows, idx, scale, kv_scale=scales).float().cpu()
    else:
        raw = kv.float().clamp(-torch.finfo(fp8).max, torch.finfo(fp8).max).to(fp8)[:, None]
        rows, scales = reference.quantize_rows_scaled(kv, fp8)
        out_raw = reference.sparse_mla_decode(q, raw, idx, scale)
        out_scaled = reference.sparse_mla_decode_row_scaled(q, rows[:, None], scales, idx, scale)

    def rel(x):
        return ((x - truth).norm() / truth.norm()).item()

    return rel(out_raw), rel(out_scaled)


def preflight(args) -> None:
    """Checked before the first draw, so that a run is not lost to a typo or a missing piece at its end."""
    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: give a whole number from 1")
    writable("--out", args.out)
    if args.kernels:
        cuda_torch("leave --kernels out for the fp32 references")
    else:
        try:
            import torch  # noqa: F401 - the fp32 references run on it
        except ImportError:
            raise UserError("torch is not importable: run this with a Python that has torch "
                            "(CONTRIBUTING.md)") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="draws of KV, q and indices a case averages (default 3)")
    p.add_argument("--kernels", action="store_true", help="the GPU kernels instead of the references")
    p.add_argument("--out", help="result JSON (default benchmarks/fp8-row-scale-cpu.json, --kernels: -gpu.json)")
    args = p.parse_args(argv)
    args.out = args.out or str(Path(__file__).with_name(f"fp8-row-scale-{'gpu' if args.kernels else 'cpu'}.json"))
    try:
        preflight(args)
    except UserError as e:
        print(f"fp8_row_scale_accuracy: {e}", file=sys.stderr)
        return 2

    command = f"PYTHONPATH=. python3 benchmarks/fp8_row_scale_accuracy.py --seeds {args.seeds}"
    if args.kernels:
        result = {**run_info(command + " --kernels", gpu_machine()), "decode": "kernels"}
    else:
        result = {**run_info(command), "decode": "fp32 reference"}
    result |= {"seeds": args.seeds, "slots": SLOTS, "topk": TOPK, "S": S, "H": H, "d": D,
               "outlier_channels": OUTLIER_CHANNELS, "cases": []}
    print("| KV sigma | outlier channels x | raw fp8 error | row-scaled fp8 error |")
    print("| --- | --- | --- | --- |")
    for sigma, outlier in CASES:
        runs = [errors(sigma, outlier, seed, args.kernels) for seed in range(args.seeds)]
        raw, scaled = (sum(r[i] for r in runs) / len(runs) for i in (0, 1))
        result["cases"].append({"sigma": sigma, "outlier": outlier, "raw_err": round(raw, 5),
                                "row_scaled_err": round(scaled, 5)})
        print(f"| {sigma} | {outlier:g} | {100 * raw:.2f}% | {100 * scaled:.2f}% |", flush=True)
    try:
        write("--out", args.out, (json.dumps(result, indent=1) + "\n").encode())
    except UserError as e:
        print(f"fp8_row_scale_accuracy: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
