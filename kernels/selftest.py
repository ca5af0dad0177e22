"""`dsaops kernels selftest`: dsaops' raw-fp8 decode checked and timed on the serving GPU against the
SGLang kernel it would replace; the verdict (decode-verdict.json in the dsaops cache) is what the
routing (kernels/route.py) reads, so dsaops decode runs on a GPU only with evidence from that GPU.

For each batch size SGLang captures as a CUDA graph (its default list, capture_batch_sizes) at the
deployment's head count:
- correct: dsaops' output against fp32 attention over the same raw fp8 KV with bf16 q (the
  kernel-only error, at most KERNEL_ERR_MAX, as the GPU tests allow), and against fp32 attention
  over the bf16 KV (at most FLOOR_FACTOR x the raw-KV floor, as the accuracy tests allow);
- time: both kernels by CUDA-graph replay over rotated input sets (kernels/timing.py), so no call
  finds its rows in L2, as in a server; speedup = SGLang's time / dsaops'.
The decision is route.verdict_decision's. DSAOPS_SELFTEST_WRONG_KERNEL=1 plants a wrong kernel
(dsaops' decode reading each query's rows one slot off) to show a failed check keeps SGLang's.

torch is imported on use: the CPU tests run the plumbing with stand-in kernels and a stand-in timer.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dsaops.kernels import route

from dsaops.cli_args import can_write_in, whole_numbers, whole_up_to
from dsaops.errors import UserError
from dsaops.plan_input import INT_MOST, shown

TOPK = 2048
D_V = 512
SLOTS = 1 << 20        # 512 MiB of fp8 rows: random top-k rows miss L2 as a server's do
ROW_BYTES = D_V + 4    # a top-k row read: its fp8 values and its int32 id
KERNEL_ERR_MAX = 0.01  # tests/kernels/test_decode_gpu.py
FLOOR_FACTOR = 1.1     # tests/kernels/test_decode_accuracy_gpu.py
WRONG_KERNEL = "DSAOPS_SELFTEST_WRONG_KERNEL"
BATCH_MOST = 8192      # 16 x SGLang's largest default max_bs (512); each size is allocated and timed


def capture_batch_sizes(max_bs: int) -> list[int]:
    """The decode batch sizes SGLang 0.5.23 captures as CUDA graphs up to max_bs, without speculative
    decoding or --disable-cuda-graph-padding (cuda_graph_hook.generate_decode_cuda_graph_batch_sizes)."""
    if max_bs < 1:
        raise ValueError(f"max_bs must be >= 1, got {max_bs}")
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    sizes = [b for b in sizes if b <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


# SGLang 0.5.23's default decode max_bs by GPU memory (memory_hook.py `_handle_gpu_memory_settings`):
# (memory below this many MiB, max_bs at TP < 4, max_bs at TP >= 4); above the last, 512.
_MAX_BS_BY_MEMORY = ((20 * 1024, 8, 8), (35 * 1024, 48, 160), (60 * 1024, 32, 160), (90 * 1024, 256, 512),
                     (160 * 1024, 256, 512))


def default_max_bs(gpu_memory_mib: float, tp_size: int = 1, max_running_requests: int | None = None) -> int:
    """The largest decode batch SGLang captures by default on a GPU of this memory at this TP size."""
    max_bs = next((small if tp_size < 4 else large for below, small, large in _MAX_BS_BY_MEMORY
                   if gpu_memory_mib < below), 512)
    return min(max_bs, max_running_requests) if max_running_requests else max_bs


@dataclass
class Row:
    batch: int
    dsaops_us: float
    sglang_us: float
    kernel_err: float   # against fp32 attention over the raw fp8 KV (bf16 q)
    err_vs_bf16: float  # against fp32 attention over the bf16 KV (bf16 q)
    raw_kv_floor: float  # that reference's own distance from the bf16 one

    @property
    def correct(self) -> bool:
        return self.kernel_err <= KERNEL_ERR_MAX and self.err_vs_bf16 <= FLOOR_FACTOR * self.raw_kv_floor

    @property
    def speedup(self) -> float:
        return round(self.sglang_us / self.dsaops_us, 3)


def input_sets(S: int, H: int, slots: int, width: int, rotate_bytes: int, generator, device):
    """[(q [S, H, width] bf16, indices [S, 1, TOPK] int32)]: enough sets that a rotation reads at least
    rotate_bytes of other rows between two calls of one (timing.rotation_count)."""
    import torch
    from dsaops.kernels import accuracy, timing

    n = max(2, timing.rotation_count(S * TOPK * ROW_BYTES, rotate_bytes))
    return [(torch.randn((S, H, width), generator=generator, device=device).to(torch.bfloat16),
             accuracy.random_indices(S, slots, TOPK, generator, device)) for _ in range(n)]


def wrong(decode, slots: int):
    """A planted wrong kernel: dsaops' decode reading each query's rows one slot off."""
    import torch

    def off_by_one(q, kv, indices, sm_scale):
        return decode(q, kv, torch.where(indices >= 0, (indices + 1) % slots, indices), sm_scale)
    return off_by_one


def measure(heads: int, batch_sizes, decode, sglang, time_us, *, d_tail: int = 0, slots: int = SLOTS,
            rotate_bytes: int | None = None, device="cuda", log=print) -> list[Row]:
    """One Row per batch size: decode(q, kv, indices, sm_scale) is dsaops', sglang(...) SGLang's
    tilelang_sparse_fwd (d_v 512), time_us(calls) the GPU time of one call of a rotation."""
    import torch
    from dsaops.kernels import accuracy, timing

    width = D_V + d_tail
    g = torch.Generator(device=device).manual_seed(0)
    kv = accuracy.make_kv("outliers", slots, g, device, width=width)
    fp8 = kv.to(accuracy.FP8)
    rows = []
    for S in batch_sizes:
        sets = input_sets(S, heads, slots, width, rotate_bytes or timing.ROTATE_BYTES, g, device)
        q0, idx0 = sets[0]
        errs = accuracy.decode_errors(q0, kv, idx0, accuracy.SM_SCALE, decode(q0, fp8, idx0, accuracy.SM_SCALE),
                                      digits=5)
        row = Row(S,
                  dsaops_us=round(time_us([functools.partial(decode, q, fp8, i, accuracy.SM_SCALE) for q, i in sets]), 2),
                  sglang_us=round(time_us([functools.partial(sglang, q, fp8, i, accuracy.SM_SCALE, d_v=D_V)
                                           for q, i in sets]), 2),
                  kernel_err=errs["rel_err"], err_vs_bf16=errs["err_vs_bf16"], raw_kv_floor=errs["raw_kv_floor"])
        log(format_row(row))
        rows.append(row)
    return rows


HEADER = f"{'batch':>5} {'dsaops us':>10} {'SGLang us':>10} {'speedup':>8} {'kernel err':>10} {'vs bf16':>8} " \
         f"{'floor':>8}  correct"


def format_row(row: Row) -> str:
    return (f"{row.batch:>5} {row.dsaops_us:>10.2f} {row.sglang_us:>10.2f} {row.speedup:>7.2f}x {row.kernel_err:>10.5f} "
            f"{row.err_vs_bf16:>8.5f} {row.raw_kv_floor:>8.5f}  {'yes' if row.correct else 'NO'}")


def make_verdict(gpu: dict, target: str, heads: int, rows: list[Row], *, kernels: str, d_tail: int = 0,
                 sglang: str = "", planted: bool = False) -> dict:
    """The verdict route.read_verdict accepts: what was measured, where, on which build, and the decision."""
    from dsaops import __version__

    correct = all(r.correct for r in rows)
    return {
        "gpu": gpu, "target": target, "kernels": kernels, "heads": heads, "d_tail": d_tail, "topk": TOPK,
        "batch_sizes": [r.batch for r in rows], "correct": correct,
        "speedup": {str(r.batch): r.speedup for r in rows},
        "decision": route.verdict_decision(correct, {r.batch: r.speedup for r in rows}),
        "rows": [vars(r) | {"correct": r.correct} for r in rows],
        "sglang_kernel": sglang, "planted_wrong_kernel": planted, "dsaops_version": __version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_verdict(verdict: dict, path: Path) -> None:
    """Written whole (a temporary file renamed), so a reader never sees half a verdict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(verdict, indent=1) + "\n")
    partial.replace(path)


def check_out(out: Path, given: bool) -> None:
    """Refuses a verdict path that cannot be written, before the GPU work whose result it would hold."""
    what = f"--out {out}" if given else f"the verdict file {out} (the default --out)"
    if out.is_dir():
        raise UserError(f"{what} is a folder; give the verdict file's path, e.g. {out / route.VERDICT_FILE}")
    if not can_write_in(out.parent):
        raise UserError(f"{what}: cannot write in {out.parent}; give a file in a folder you may write to or create")


def nvidia_smi_identity() -> dict | None:
    """{name, compute_capability} of GPU 0 from nvidia-smi (no CUDA context), or None without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = [p.strip() for p in out.stdout.strip().split(",")]
    return {"name": parts[0], "compute_capability": parts[1]} if out.returncode == 0 and len(parts) == 2 else None


def current_verdict(path: Path, heads: int, gpu: dict | None, kernels: str) -> dict | None:
    """The verdict at path when it measured this GPU, this kernel build and this head count."""
    verdict, _ = route.load_verdict_quietly(path)
    if verdict is None or gpu is None:
        return None
    from dsaops import targets

    target = targets.by_compute_capability(gpu["compute_capability"])
    if target is None or route.verdict_mismatch(verdict, target.name, heads, gpu, kernels):
        return None
    return verdict


def sglang_kernel(root: Path | None):
    """(tilelang_sparse_fwd, where it came from): the installed SGLang's, or the one under --sglang-root."""
    from dsaops.kernels import peers

    if root is not None:
        if not (root / Path(*peers.SGLANG_KERNEL)).is_file():
            raise UserError(f"--sglang-root {root}: no {'/'.join(peers.SGLANG_KERNEL)} there; give the folder that "
                            "holds sglang/ of the pinned wheel (e.g. .devbundle/sgl)")
        return peers.load_sglang(str(root)).tilelang_sparse_fwd, f"--sglang-root {root}"
    import importlib

    try:
        module = importlib.import_module(peers.SGLANG_KERNEL_MODULE)
    except ImportError as e:
        raise UserError(f"SGLang's decode kernel does not import here ({e}); outside the image, pass --sglang-root "
                        "DIR (the folder that holds sglang/ of the pinned wheel)") from None
    return module.tilelang_sparse_fwd, "the installed sglang"


def add_parser(ksub) -> None:
    s = ksub.add_parser("selftest", help="check and time dsaops' decode against SGLang's on this GPU; write the "
                                         "verdict the routing reads",
                        description="Check dsaops' raw-fp8 decode against the fp32 reference and time it against "
                                    "SGLang's kernel on this GPU, at the batch sizes SGLang captures; print a table "
                                    f"and write the verdict the routing reads ({route.VERDICT_FILE}).")
    s.add_argument("--heads", type=whole_up_to(route.HEADS_MOST), default=64,
                   help=f"q heads a rank runs, 1 to {route.HEADS_MOST} (GLM-5.3-Flash: 64 / attention-TP size)")
    s.add_argument("--batch-sizes", help=f"comma-separated batch sizes, each 1 to {BATCH_MOST} (default: those "
                                         "SGLang captures)")
    s.add_argument("--max-bs", type=whole_up_to(BATCH_MOST), help=f"largest captured batch, 1 to {BATCH_MOST} "
                                                                   "(default: SGLang's for this GPU's memory)")
    s.add_argument("--tp-size", type=whole_up_to(INT_MOST), default=1,
                   help="the deployment's --tp-size (SGLang's default max_bs depends on it)")
    s.add_argument("--d-tail", type=whole_up_to(64, least=0), choices=(0, 64), default=0,
                   help="rope width: 0 for GLM-5.3-Flash (NoPE)")
    s.add_argument("--out", type=Path, help=f"verdict file (default: {route.VERDICT_FILE} in the dsaops cache)")
    s.add_argument("--sglang-root", type=Path, help="folder holding sglang/ of the pinned wheel (default: the "
                                                    "installed sglang, as in the image)")
    s.add_argument("--if-stale", action="store_true", help="do nothing when the verdict file already holds a verdict "
                                                           "for this GPU, kernel build and head count")
    s.set_defaults(func=run)


def given_batch_sizes(args) -> list[int] | None:
    """--batch-sizes sorted, or None: checked before any GPU work."""
    if args.batch_sizes is None:  # an empty --batch-sizes is refused below, not read as the default list
        return None
    sizes = sorted(set(whole_numbers(args.batch_sizes, "--batch-sizes", "1,16,64")))
    if not sizes or sizes[0] < 1 or sizes[-1] > BATCH_MOST:
        raise UserError(f"--batch-sizes takes batch sizes from 1 to {BATCH_MOST}, e.g. 1,16,64; "
                        f"got {shown(args.batch_sizes)}")
    return sizes


def batch_sizes_of(args, gpu_memory_mib: float) -> list[int]:
    return given_batch_sizes(args) or capture_batch_sizes(args.max_bs or default_max_bs(gpu_memory_mib, args.tp_size))


def run(args) -> int:
    given_batch_sizes(args)  # a bad one is refused now, not after the GPU is found
    out = args.out or route.verdict_path()
    kernels = route.kernel_hash()
    if args.if_stale:
        verdict = current_verdict(out, args.heads, nvidia_smi_identity(), kernels)
        if verdict is not None:
            print(f"selftest: {out} is current for this GPU, kernel build and {args.heads} heads "
                  f"({verdict['decision']['kernel']}); nothing to do")
            return 0
    check_out(out, given=args.out is not None)
    try:
        import torch
    except ImportError:
        raise UserError("torch is not installed here: run the selftest in the image or on the GPU host") from None
    if not torch.cuda.is_available():
        raise UserError("no GPU visible: run on the serving GPU (docker run --gpus all IMAGE dsaops kernels selftest)")
    props, hip, gpu, target = route.current_gpu()
    if hip or target is None or target.dsaops_decode == "never":
        raise UserError(f"{gpu['name']} ({gpu['compute_capability']}): dsaops has no decode kernel for it; SGLang's "
                        "own decode serves, nothing to test")
    sizes = batch_sizes_of(args, props.total_memory / (1 << 20))
    sgl, where = sglang_kernel(args.sglang_root)
    from dsaops.kernels import sparse_mla_decode_fp8, timing

    decode = sparse_mla_decode_fp8
    planted = os.environ.get(WRONG_KERNEL) == "1"
    if planted:
        decode = wrong(decode, SLOTS)
        print(f"selftest: {WRONG_KERNEL}=1: a planted wrong kernel stands in for dsaops' decode", file=sys.stderr)
    print(f"selftest: {gpu['name']} ({gpu['compute_capability']}, {target.name}), {args.heads} heads, d_tail "
          f"{args.d_tail}, top-k {TOPK}, SGLang's kernel from {where}; {len(sizes)} batch sizes", flush=True)
    print(HEADER, flush=True)
    rows = measure(args.heads, sizes, decode, sgl, timing.rotated_us, d_tail=args.d_tail,
                   log=functools.partial(print, flush=True))
    verdict = make_verdict(gpu, target.name, args.heads, rows, kernels=kernels, d_tail=args.d_tail, sglang=where,
                           planted=planted)
    write_verdict(verdict, out)
    decision = route.decide(target, args.heads, verdict=verdict, gpu=gpu, kernels=kernels, env={})
    print(f"verdict: {decision.batches} ({decision.reason}); written to {out}")
    return 0
