"""Decode benchmark on one H200: dsaops' raw-fp8 kernel against FlashMLA and SGLang 0.5.23's kernels.

    PYTHONPATH=. python3 benchmarks/h200_decode.py --sglang-root DIR [--sections S...] [--skip S...]
    python3 benchmarks/h200_decode.py --dry-run [--out FILE]   # no GPU: fake timings, never the results file
    python3 benchmarks/report.py --decode FILE --out PAGE      # a dry run's page, marked fake

DIR holds `sglang/kernels/ops/attention/dsa/tilelang_kernel.py` from the pinned wheel (loaded as a
baseline, kernels/peers.py); FlashMLA's `flash_mla` package (the sgl-flash-mla wheel, unzipped) must
be importable. Geometry: GLM-5.3-Flash NoPE MLA (d_v 512, d_tail 0), top-k 2048, a 1,048,576-row
pool of outlier-channel data (kernels/accuracy.py: KV N(0, 0.5^2), channels 0-7 x8), random
distinct rows per query. sm_scale 512^-0.5.

Timing (kernels/timing.py): GPU time = median of CUDA-graph replays. The headline (`dsaops_fp8_us`
and every peer's column) is ROTATED: the graph cycles through input sets of q and indices such that
at least 256 MiB of other rows and indices are read between two calls of one set, so no call finds
its rows in L2, as in a server. `same_input_us` replays one input set (its rows stay in L2). Eager
host cost = wall time per call of back-to-back eager calls, least and median of 15 runs a case, the
cases' runs taken in turns after the grid's GPU timings. Roofline = max(fp8 rows read once / copy
bandwidth, FLOPs / fp8 matmul rate), both measured in the run.
FlashMLA runs as SGLang's DSA backend calls it for an fp8 cache (V32_NO_ROPE, heads padded to 64 or
128; the padding is done once per input set, not timed). Errors (kernels/accuracy.py) are against
fp32 attention over the bf16 KV with bf16 q; `rel_err` is the kernel-only error, against fp32
attention over the same raw fp8 KV and bf16 q.

Sections, in this order (all by default; --sections picks, --skip drops; the JSON so far is written
to FILE.partial after each, FILE replaced when the run ends):
  compile   every kernel this run and `make test-gpu` need, in parallel processes, into the TileLang
            cache (dsaops sm_90 raw and row-scaled tiles with the merges, the sm_121 proxy, SGLang's
            kernels of the cases grid)
  cases     H x S grid: dsaops rotated and same-input, SGLang fp8 and bf16, FlashMLA, errors, host
  accuracy  the three data kinds: dsaops, dsaops fed an e4m3-rounded q, FlashMLA, fp32 references
  short     short contexts at H=64: 300 / 1024 / 2048 valid top-k rows, -1 tails (and topk_length);
            --short-batches and --short-valid take others, e.g. the time against valid rows a split
  sweep     dsaops over S (H=64; fewer points at 16 and 32): us and % of roofline, and the PNG
  proxy     sm_121's tiles built for sm_90a without wgmma, against SGLang's fp8 kernel (a proxy on
            the H200, not a GB10 figure), and the GB10 memory floor (273 GB/s)
  kvcopy    write_kv_fp8 / gather_kv_rows bandwidth (benchmarks/bench_kv_copy.py)

Time budget on an H200 host with 16 cores, estimated from the previous run's numbers (each
graph timing ~0.4 s: capture, 200 ms of replays; SGLang's fp8 kernel up to 2.3 ms a call at H=128):
  setup (imports, 1M-row pool in three formats, ceilings)    ~10 s
  compile   ~55 kernels on 16 processes (one took 30-36 s on a busy 2-core machine): 90-180 s cold,
            ~15 s warm (cache loads)
  cases     16 cases x 5 timings + host + errors              ~40 s
  accuracy  9 rows                                            ~5 s
  short     2 S x 3 valid x 2 timings                         ~6 s
  sweep     41 points + the plot                              ~17 s
  proxy     16 timings                                        ~8 s
  kvcopy    16 timings                                        ~5 s
so `make bench` takes ~4 min cold and ~2 min warm. Tests and benchmark in one call of ~7 min, the
kernels compiled once for both:
    make bench BENCH_ARGS="--sections compile" && make test-gpu; make bench BENCH_ARGS="--skip compile"
The JSON (benchmarks/h200-decode.json; a dry run's: a temp file) and the sweep PNG beside it
(report.sweep_plot) are replaced only by a run that ends; the JSON holds the raw numbers and the
run's date, commit, machine and command. The targets are benchmarks/report.py's, judged from those
numbers: each section prints its elapsed time, and the cases table and each target's verdict print
last, as BENCHMARKS.md gives them.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: `benchmarks`
from dsaops.kernels.route import HEADS_MOST
from dsaops.kernels.selftest import BATCH_MOST

from benchmarks.report import D_V, DECODE_TARGETS, roofline_terms, sweep_plot
from benchmarks.run_info import cuda_torch, gpu_machine, run_info
from dsaops.cli_args import digits, writable
from dsaops.errors import UserError

HEADS = (16, 32, 64, 128)
BATCHES = (1, 16, 64, 256)
TOPK = 2048
SLOTS = 1 << 20
SM_SCALE = D_V**-0.5
ACCURACY_HEADS = (16, 64, 128)
ACCURACY_BATCH = 16
ACCURACY_SLOTS = 1 << 16
SHORT_HEADS = 64
SHORT_BATCHES = (16, 64)
SHORT_VALID = (300, 1024, TOPK)
SWEEP = {64: (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 100, 128, 160, 192, 256, 320, 384, 448, 512),
         16: (1, 4, 8, 16, 32, 64, 100, 128, 192, 256, 512),
         32: (1, 4, 8, 16, 32, 64, 100, 128, 192, 256, 512)}
GB10_BYTES_S = 273e9  # GB10's LPDDR5X
SECTIONS = ("compile", "cases", "accuracy", "short", "sweep", "proxy", "kvcopy")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h200-decode.json")
PROXY_TARGET = "sm_121@sm_90a"  # decode.kernel_target: GB10's tiles on a Hopper
PROXY_LABEL = "sm_121 tiles built for sm_90a without wgmma, timed on the H200: a proxy, not a GB10 figure"
METHOD = {
    "timing": "GPU us a call, median of CUDA-graph replays; *_us of every kernel rotated: input sets cycled so that "
              ">= 256 MiB of other q, row ids and rows are read between two calls of one set (cold L2); same_input_us: one "
              "set replayed (warm L2)",
    "data": "pool of 1,048,576 rows, KV N(0, 0.5^2) with channels 0-7 x8 (outlier channels), q N(0, 1); top-k 2048 "
            "distinct random rows a query; d 512, sm_scale 512^-0.5",
    "errors": "relative, norm-wise: err_vs_bf16 against fp32 attention over the bf16 KV with bf16 q; raw_kv_floor: "
              "fp32 attention over the raw fp8 KV with bf16 q, against the same; rel_err: the kernel against that "
              "floor's output (kernel-only error)",
    "flashmla": "sgl-flash-mla 1.0.0, V32_NO_ROPE, use_legacy, heads padded to 64 or 128 once per input set (SGLang "
                "pads on every call; not timed here)",
    "roofline": "max(fp8 rows read once / measured copy bandwidth, FLOPs / measured fp8 matmul rate)",
    "host": "eager_host_us (_median): least (median) of 15 runs of 200 back-to-back eager calls a case, gc off; the "
            "cases' runs in turns, after the grid's GPU timings",
}
# The grid of a --dry-run (CPU references stand in for the kernels; keep it small)
DRY = {"heads": (16, 64), "batches": (1, 2), "slots": 4096, "rotate_bytes": 1 << 20, "accuracy_heads": (16,),
       "accuracy_batch": 2, "short_batches": (2,), "sweep": {64: (1, 2, 4), 16: (1, 2)}}


def sm121_proxy():
    """The sm_121 proxy build: sm_121's decode tiles compiled for sm_90a without wgmma, run on the
    H200. Returns (jobs, decode): `jobs` are (function, argument) pairs the compile section runs in
    worker processes to put the proxy's kernels into the TileLang cache (d_tail 0, the benchmark's
    geometry, and the merges), and decode(q, kv, indices, sm_scale) returns the proxy's output
    [S, H, 512] bf16."""
    from dsaops.kernels import decode
    from dsaops.kernels.build import kernel_jobs

    jobs = [(decode.compile_job, (PROXY_TARGET, tile, dt, False))
            for tile, dt in kernel_jobs(decode.kernel_target(PROXY_TARGET)) if dt in (0, None)]

    def run(q, kv, indices, sm_scale):
        return decode.decode_with_tile(q, kv, indices, sm_scale, D_V, False, target=PROXY_TARGET)

    return jobs, run


# ---- compile: worker jobs (module level, so spawned processes can run them)

def _warm_sglang(job):
    """Compile SGLang's kernels for one case in a worker (lands in TileLang's cache)."""
    import torch
    from dsaops.kernels import accuracy, peers

    root, H, S, fp8 = job
    sgl = peers.load_sglang(root)
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn((4096, 1, D_V), device="cuda").to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
    idx = accuracy.random_indices(S, 4096, TOPK, g, "cuda")
    sgl.tilelang_sparse_fwd(torch.randn((S, H, D_V), device="cuda", dtype=torch.bfloat16), kv, idx, SM_SCALE,
                            d_v=D_V)
    torch.cuda.synchronize()
    return job


def _warm_dsaops(job):
    """Compile one (tile or merge, d_tail) of dsaops' sm_90 kernels in a worker, raw or row-scaled."""
    from dsaops.kernels.build import build

    tile, d_tail, row_scaled = job
    return build("sm_90", jobs=[(tile, d_tail)], workers=1, row_scaled=row_scaled)


def compile_jobs(sglang_root, heads, batches, extra_tiles=(), proxy_jobs=()):
    """(function, argument) pairs: every dsaops sm_90 kernel the dispatch can choose (both d_tails,
    raw and row-scaled: what `make test-gpu` runs), `extra_tiles`, the proxy's, SGLang's per case."""
    from dsaops.kernels.build import kernel_jobs

    from dsaops import targets

    target = targets.get("sm_90")
    raw = dict.fromkeys(kernel_jobs(target) + [(t, 0) for t in extra_tiles])  # an extra tile may be a chosen one
    jobs = [(_warm_dsaops, (t, dt, False)) for t, dt in raw]
    jobs += [(_warm_dsaops, (t, dt, True)) for t, dt in kernel_jobs(target, row_scaled=True, merges=False)]
    jobs += list(proxy_jobs)
    if sglang_root:
        jobs += [(_warm_sglang, (sglang_root, H, 1, False)) for H in heads]  # bf16 kernel: no split, S-free
        jobs += [(_warm_sglang, (sglang_root, H, S, True)) for H in heads for S in batches]
    return jobs


def run_jobs(jobs, workers):
    """Run compile jobs in `workers` spawned processes. A dsaops or proxy kernel that fails to build
    stops the run; a peer's is reported (its timing then records the error)."""
    import multiprocessing

    failed = []
    with ProcessPoolExecutor(max(1, min(workers, len(jobs))), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [(fn, arg, pool.submit(fn, arg)) for fn, arg in jobs]
        for fn, arg, future in futures:
            try:
                future.result()
            except Exception as e:  # noqa: BLE001 - reported below with the job that raised it
                if fn is not _warm_sglang:
                    raise RuntimeError(f"{fn.__name__}{arg}: {type(e).__name__}: {e}") from None
                failed.append(f"SGLang {arg[1:]}: {type(e).__name__}: {str(e)[-200:]}")
    for line in failed:
        print("compile failed:", line, flush=True)
    return failed


def parse_tile(spec):
    """A `--tiles` entry, heads:rows:stages:threads[:vr], as a Tile (vr: V in registers)."""
    from dsaops.kernels.tiles import Tile

    fields = spec.split(":")
    numbers = [digits(f) for f in fields[:4]]
    if len(fields) not in (4, 5) or None in numbers or 0 in numbers or fields[4:] not in ([], ["vr"]):
        raise UserError(f"--tiles {spec!r}: give heads:rows:stages:threads[:vr] in whole numbers, e.g. 64:128:2:256:vr")
    return Tile(*numbers, v_in_registers=fields[4:] == ["vr"])


# ---- what a section runs on: the GPU, or CPU stand-ins with fake timings (--dry-run)

class GpuTimer:
    def __init__(self):
        from dsaops.kernels import timing

        self.timing = timing

    def same(self, fn):
        return round(self.timing.graph_us(fn), 2)

    def rotated(self, fns):
        return round(self.timing.rotated_us(fns), 2)

    def host(self, fns):
        return [tuple(round(x, 2) for x in pair) for pair in self.timing.host_us(fns)]

    def ceilings(self):
        return self.timing.ceilings()


class FakeTimer:
    """A dry run's timer: makes each call once (the plumbing runs) and returns a FAKE time."""

    def __init__(self):
        self.calls = 0

    def _fake(self, fn):
        fn()
        self.calls += 1
        return round(10.0 + self.calls % 50, 2)

    def same(self, fn):
        return self._fake(fn)

    def rotated(self, fns):
        if len(fns) < 2:
            raise ValueError("a rotation needs at least two input sets")
        return self._fake(fns[-1])

    def host(self, fns):
        return [(us, us) for us in map(self._fake, fns)]

    def ceilings(self):
        return 4.0, 1200.0


def _dsaops_gpu(q, kv, indices, topk_length=None):
    from dsaops.kernels import sparse_mla_decode_fp8

    return sparse_mla_decode_fp8(q, kv, indices, SM_SCALE, topk_length=topk_length)


def _dsaops_standin(q, kv, indices, topk_length=None):
    """A dry run's dsaops: the fp32 reference with q as two e4m3 halves (the accurate-q kernel)."""
    import torch
    from dsaops.kernels import accuracy, reference

    if topk_length is not None:
        beyond = torch.arange(indices.shape[2], device=indices.device) >= topk_length[:, None, None]
        indices = torch.where(beyond, -1, indices)
    rows, local = accuracy.gathered(kv, indices)
    return reference.sparse_mla_decode(accuracy.q_halves(q), rows, local, SM_SCALE).to(torch.bfloat16)


class _FlashMLAStandIn:
    """A dry run's FlashMLA: the fp32 reference over the dequantized V32_NO_ROPE pages."""

    def __init__(self, S, H, topk, device):
        self.S, self.H = S, H

    def pad(self, q):
        return q[:, None]

    def __call__(self, q_padded, k_pages, indices, sm_scale):
        import torch
        from dsaops.kernels import accuracy, reference

        rows, local = accuracy.gathered(k_pages.reshape(-1, accuracy.V32_ROW_BYTES), indices)
        pool = accuracy.dequantize_v32_no_rope(rows)
        return reference.sparse_mla_decode(q_padded[:, 0], pool, local, sm_scale).to(torch.bfloat16)


def _proxy_standin(q, kv, indices, sm_scale):
    """A dry run's sm_121 proxy: the dsaops stand-in."""
    return _dsaops_standin(q, kv, indices)


class _SglangStandIn:
    """A dry run's SGLang module: tilelang_sparse_fwd as the fp32 reference (q rounded for fp8 KV)."""

    @staticmethod
    def tilelang_sparse_fwd(q, kv, indices, sm_scale, d_v=512):
        import torch
        from dsaops.kernels import accuracy, reference

        fp8 = kv.dtype == torch.float8_e4m3fn
        rows, local = accuracy.gathered(kv, indices)
        return reference.sparse_mla_decode(accuracy.round_q(q) if fp8 else q, rows, local, sm_scale, d_v)


class Run:
    """One benchmark run: its grid, device, kernels, timer, pool and input banks."""

    def __init__(self, args):
        import torch
        from dsaops.kernels import timing

        self.args, self.dry = args, args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.timer = FakeTimer() if self.dry else GpuTimer()
        self.dsaops = _dsaops_standin if self.dry else _dsaops_gpu
        self.sgl = None
        self.flashmla_cls = None
        self.proxy = None
        self._flashmla = {}
        self._q, self._idx = {}, None
        self.slots = DRY["slots"] if self.dry else SLOTS
        self.rotate_bytes = DRY["rotate_bytes"] if self.dry else timing.ROTATE_BYTES
        self.g = torch.Generator(device=self.device).manual_seed(0)
        self.pool = None

    def load_pool(self):
        """The outlier-channel pool in bf16 (SGLang's bf16 kernel, the truth), raw fp8 (dsaops,
        SGLang's fp8 kernel) and FlashMLA's pages."""
        from dsaops.kernels import accuracy

        kv = accuracy.make_kv("outliers", self.slots, self.g, self.device)
        pages = accuracy.flashmla_pages(accuracy.quantize_v32_no_rope(kv)) if self.flashmla_cls else None
        self.pool = {"bf16": kv, "fp8": kv.to(accuracy.FP8), "pages": pages}

    def flashmla(self, S, H):
        if (S, H) not in self._flashmla:
            self._flashmla[S, H] = self.flashmla_cls(S, H, TOPK, self.device)
        return self._flashmla[S, H]

    def sets(self, H, S, valid=TOPK):
        """[(q [S, H, 512] bf16, indices [S, 1, 2048] int32)] for one call each, enough for a
        rotation; indices past `valid` are -1 (a context shorter than top-k, as SGLang pads it)."""
        import torch
        from dsaops.kernels import accuracy, timing

        n = timing.rotation_count(call_bytes(S, H, valid), self.rotate_bytes) * S
        have = 0 if self._idx is None else self._idx.shape[0]
        if have < n:
            more = accuracy.random_indices(n - have, self.slots, TOPK, self.g, self.device)
            self._idx = more if self._idx is None else torch.cat([self._idx, more])
        q = self._q.get(H)
        if q is None or q.shape[0] < n:
            have = 0 if q is None else q.shape[0]
            more = torch.randn((n - have, H, D_V), generator=self.g, device=self.device).to(torch.bfloat16)
            self._q[H] = q = more if q is None else torch.cat([q, more])
        out = []
        for i in range(0, n, S):
            idx = self._idx[i:i + S]
            if valid < TOPK:
                idx = idx.clone()
                idx[:, :, valid:] = -1
            out.append((q[i:i + S], idx))
        return out


def _attempt(row, key, fn, *args):
    """fn(*args); if it raises, None, with row[key] None and row[key + "_error"] saying why (a
    peer or a development tile that fails is a result, not the end of the run)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported in the row
        row[key] = None
        row[key + "_error"] = f"{type(e).__name__}: {str(e)[-300:]}"
        print(f"{key} failed: {row[key + '_error']}", flush=True)
        return None


def _sglang_calls(run, pool, sets):
    return [functools.partial(run.sgl.tilelang_sparse_fwd, q, pool, idx, SM_SCALE, d_v=D_V) for q, idx in sets]


def _flashmla_case(run, S, H, sets):
    """(rotated µs, the output of the first set) of FlashMLA on the run's pool."""
    fm, pages = run.flashmla(S, H), run.pool["pages"]
    padded = [fm.pad(q) for q, _ in sets]
    us = run.timer.rotated([functools.partial(fm, p, pages, idx, SM_SCALE) for p, (_, idx) in zip(padded, sets)])
    return us, fm(padded[0], pages, sets[0][1], SM_SCALE)


def call_bytes(S, H, valid=TOPK):
    """The bytes one call reads from HBM: q, every top-k row id (-1 or not) and the valid rows. Counted
    by the rows alone, a rotation of 1 valid row a query at S = 16 took 32,769 input sets (38 GB)."""
    return S * (H * D_V * 2 + TOPK * 4 + valid * D_V)


def roofline_us(S, H, copy_tb_s, fp8_tflops, valid=TOPK):
    return max(roofline_terms(S, H, valid, copy_tb_s, fp8_tflops))


def _ratio(peer, ours):
    return round(peer / ours, 2) if peer and ours else None


# ---- sections

def run_cases(run, result):
    from dsaops.kernels import accuracy

    copy_tb_s, fp8_tflops = result["copy_tb_s"], result["fp8_mm_tflops"]
    pool = run.pool
    cases = result["cases"] = []
    host_calls = []  # a call of each case, timed on the host after the grid (timing.host_us)
    for H in run.args.heads:
        for S in run.args.batches:
            sets = run.sets(H, S)
            q0, idx0 = sets[0]
            ours = [functools.partial(run.dsaops, q, pool["fp8"], idx) for q, idx in sets]
            row = {"H": H, "S": S, "topk": TOPK, "dsaops_fp8_us": run.timer.rotated(ours),
                   "same_input_us": run.timer.same(ours[0]), "rotation_sets": len(sets)}
            for key, kv in (("sglang_fp8_us", pool["fp8"]), ("sglang_bf16_us", pool["bf16"])):
                row[key] = _attempt(row, key, run.timer.rotated, _sglang_calls(run, kv, sets))
            row["flashmla_us"], flashmla_out = None, None
            if run.flashmla_cls:
                row["flashmla_us"], flashmla_out = _attempt(row, "flashmla_us", _flashmla_case, run, S, H, sets) or (
                    None, None)
            roof = roofline_us(S, H, copy_tb_s, fp8_tflops)
            row["roofline_us"] = round(roof, 2)
            row["roofline_pct"] = round(100 * roof / row["dsaops_fp8_us"], 1)
            for peer in ("flashmla", "sglang_fp8", "sglang_bf16"):
                row[f"speedup_vs_{peer}"] = _ratio(row.get(f"{peer}_us"), row["dsaops_fp8_us"])
            host_calls.append(ours[0])
            row |= accuracy.decode_errors(q0, pool["bf16"], idx0, SM_SCALE, run.dsaops(q0, pool["fp8"], idx0),
                                          others={"flashmla_err_vs_bf16": flashmla_out}, digits=5)
            cases.append(row)
            print(json.dumps(row), flush=True)
            for t in run.args.tiles:
                print("tile", json.dumps(time_tile(run, t, H, S, sets)), flush=True)
    for row, (least, median) in zip(cases, run.timer.host(host_calls)):
        row["eager_host_us"], row["eager_host_us_median"] = least, median
        print(json.dumps({k: row[k] for k in ("H", "S", "eager_host_us", "eager_host_us_median")}), flush=True)


def time_tile(run, tile, H, S, sets):
    """A development tile forced on one case (--tiles): printed, not in the JSON."""
    from dsaops.kernels.decode import decode_with_tile
    from dsaops.kernels.tiles import heads_per_block

    row = {"H": H, "S": S, "tile": f"{tile.name}_t{tile.threads}"}
    if tile.heads_per_block >= heads_per_block(H):  # a block of more heads than H pads the rest
        row["us"] = _attempt(row, "us", run.timer.rotated, [functools.partial(
            decode_with_tile, q, run.pool["fp8"], idx, SM_SCALE, D_V, False, tile=tile) for q, idx in sets])
    return row


def run_accuracy(run, result):
    from dsaops.kernels import accuracy

    rows = result["accuracy"] = []
    S = run.args.accuracy_batch
    slots = run.slots if run.dry else ACCURACY_SLOTS
    for seed, kind in enumerate(accuracy.DATA_KINDS):
        for H in run.args.accuracy_heads:
            q, kv, idx = accuracy.make_case(kind, S, H, slots, TOPK, seed=seed, device=run.device)
            fp8 = kv.to(accuracy.FP8)
            row = {"data": kind, "H": H, "S": S}
            fm_out = None
            if run.flashmla_cls:
                fm = run.flashmla_cls(S, H, TOPK, run.device)
                pages = accuracy.flashmla_pages(accuracy.quantize_v32_no_rope(kv))
                fm_out = _attempt(row, "flashmla_err_vs_bf16", fm, fm.pad(q), pages, idx, SM_SCALE)
            row |= accuracy.decode_errors(q, kv, idx, SM_SCALE, run.dsaops(q, fp8, idx), references=accuracy.REFERENCES,
                                          others={"kernel_q_rounded_err": run.dsaops(accuracy.round_q(q), fp8, idx),
                                                  "flashmla_err_vs_bf16": fm_out}, digits=5)
            rows.append(row)
            print(json.dumps(row), flush=True)


def run_short(run, result):
    import torch
    from dsaops.kernels import accuracy

    rows = result["short_context"] = []
    H = SHORT_HEADS
    for S in run.args.short_batches:
        full = None
        for valid in sorted(set(run.args.short_valid) | {TOPK}, reverse=True):  # the full top-k first
            sets = run.sets(H, S, valid)
            pool = run.pool["fp8"]
            us = run.timer.rotated([functools.partial(run.dsaops, q, pool, idx) for q, idx in sets])
            full = us if valid == TOPK else full
            q0, idx0 = sets[0]
            floor = accuracy.reference_outputs(q0, run.pool["bf16"], idx0, SM_SCALE, ("raw_kv_floor",))["raw_kv_floor"]
            row = {"H": H, "S": S, "valid": valid, "dsaops_us": us, "full_us": full,
                   "pct_of_full": round(100 * us / full, 1),
                   "rel_err": round(accuracy.rel_err(run.dsaops(q0, pool, idx0), floor), 5)}
            length = torch.full((S,), valid, dtype=torch.int32, device=run.device)
            row["topk_length_us"] = run.timer.rotated(
                [functools.partial(run.dsaops, q, pool, idx, length) for q, idx in sets])
            row["topk_length_rel_err"] = round(accuracy.rel_err(run.dsaops(q0, pool, idx0, length), floor), 5)
            rows.append(row)
            print(json.dumps(row), flush=True)


def run_sweep(run, result):
    rows = result["sweep"] = []
    for H, batches in run.args.sweep.items():
        for S in batches:
            sets = run.sets(H, S)
            us = run.timer.rotated([functools.partial(run.dsaops, q, run.pool["fp8"], idx) for q, idx in sets])
            roof = roofline_us(S, H, result["copy_tb_s"], result["fp8_mm_tflops"])
            rows.append({"H": H, "S": S, "dsaops_us": us, "roofline_us": round(roof, 2),
                         "roofline_pct": round(100 * roof / us, 1)})
            print(json.dumps(rows[-1]), flush=True)


def plot_sweep(rows, path, dry=False):
    """µs and % of roofline against S, a line per head count, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for H in sorted({r["H"] for r in rows}):
        mine = sorted((r for r in rows if r["H"] == H), key=lambda r: r["S"])
        left.plot([r["S"] for r in mine], [r["dsaops_us"] for r in mine], marker="o", label=f"H={H}")
        right.plot([r["S"] for r in mine], [r["roofline_pct"] for r in mine], marker="o", label=f"H={H}")
    right.axhline(40, color="grey", linestyle="--", linewidth=1, label="target (S >= 64)")
    left.set(ylabel="GPU µs a call (rotated inputs)", ylim=(0, None))
    right.set(ylabel="% of roofline", ylim=(0, 100))
    top = max(r["S"] for r in rows)
    ticks = [1 << k for k in range(top.bit_length()) if 1 << k <= top]  # markers show the other points
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(S) for S in ticks])
        ax.minorticks_off()
        ax.set_xlabel("decode queries S")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("DRY RUN: FAKE TIMINGS" if dry else "dsaops decode on the H200: top-k 2048, d 512, rotated inputs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_proxy(run, result):
    from dsaops.kernels import accuracy

    rows = result["proxy"] = []
    measured = {(c["H"], c["S"]): c.get("sglang_fp8_us") for c in result.get("cases", [])}
    for H in run.args.heads:
        for S in run.args.batches:
            sets = run.sets(H, S)
            q0, idx0 = sets[0]
            pool = run.pool["fp8"]
            row = {"H": H, "S": S, "label": PROXY_LABEL,
                   "proxy_us": run.timer.rotated([functools.partial(run.proxy, q, pool, idx, SM_SCALE)
                                                  for q, idx in sets])}
            row["sglang_fp8_us"] = measured.get((H, S))
            if row["sglang_fp8_us"] is None:
                row["sglang_fp8_us"] = _attempt(row, "sglang_fp8_us", run.timer.rotated, _sglang_calls(run, pool, sets))
            row["speedup_vs_sglang_fp8"] = _ratio(row["sglang_fp8_us"], row["proxy_us"])
            row["gb10_floor_us"] = round(S * TOPK * D_V / GB10_BYTES_S * 1e6, 2)
            errs = accuracy.decode_errors(q0, run.pool["bf16"], idx0, SM_SCALE, run.proxy(q0, pool, idx0, SM_SCALE),
                                          digits=5)
            row |= {"rel_err": errs["rel_err"], "err_vs_bf16": errs["err_vs_bf16"]}
            rows.append(row)
            print(json.dumps(row), flush=True)


def run_kvcopy(run, result):
    if run.dry:
        result["kv_copy"] = []
        print("kvcopy: not run in a dry run (tests/benchmarks/test_bench_kv_copy.py covers its machinery)")
        return
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_kv_copy.py")
    spec = importlib.util.spec_from_file_location("bench_kv_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result["kv_copy"] = module.run(copy_tb_s=result["copy_tb_s"])


# ---- the summary printed last

def _cell(x):
    return "-" if x is None else f"{x:g}"


def _pct(x):
    return "-" if x is None else f"{100 * x:.2f}%"


def summary(result) -> str:
    """The short table printed last: the cases, then each target of benchmarks/report.py (the
    verdicts BENCHMARKS.md gives)."""
    fake = "  DRY RUN: FAKE TIMINGS" if result.get("dry_run") else ""
    lines = [(f"{result['gpu']}  copy {result['copy_tb_s']:.2f} TB/s  fp8 mm {result['fp8_mm_tflops']:.0f} TFLOP/s"
              f"  (us; rotated inputs; errors vs bf16 KV, outlier data){fake}"),
             (f"{'H':>3} {'S':>4} {'dsaops':>7} {'same':>7} {'FlashMLA':>8} {'sgl fp8':>8} {'sgl bf16':>8} "
              f"{'%roof':>5} {'xFM':>5} {'xbf16':>5} {'err':>6} {'floor':>6} {'FM err':>6}")]
    for c in result.get("cases", []):
        lines.append(f"{c['H']:>3} {c['S']:>4} {c['dsaops_fp8_us']:>7.1f} {c['same_input_us']:>7.1f} "
                     f"{_cell(c.get('flashmla_us')):>8} {_cell(c.get('sglang_fp8_us')):>8} "
                     f"{_cell(c.get('sglang_bf16_us')):>8} {c['roofline_pct']:>5.0f} "
                     f"{_cell(c.get('speedup_vs_flashmla')):>5} {_cell(c.get('speedup_vs_sglang_bf16')):>5} "
                     f"{_pct(c['err_vs_bf16']):>6} {_pct(c['raw_kv_floor']):>6} {_pct(c.get('flashmla_err_vs_bf16')):>6}")
    for t in DECODE_TARGETS:
        met, measured = t.verdict(result)
        verdict = {True: "met", False: "MISSED", None: "not measured"}[met]
        lines.append(f"  {verdict:<12} {t.name}: {measured} (limit {t.limit_text()})")
    return "\n".join(lines)


# ---- driver

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sglang-root", help="folder holding sglang/kernels/ops/attention/dsa/tilelang_kernel.py")
    p.add_argument("--out", help=f"results JSON (default {os.path.relpath(RESULTS)}; a dry run's: a temp file)")
    p.add_argument("--sections", nargs="+", metavar="S", default=list(SECTIONS), help=" ".join(SECTIONS))
    p.add_argument("--skip", nargs="+", metavar="S", default=[], help="sections not to run")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: CPU references stand in for the kernels, timings are FAKE, small grid")
    p.add_argument("--no-flashmla", action="store_true", help="leave FlashMLA out (its columns stay empty)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel compile processes")
    p.add_argument("--heads", type=int, nargs="+")
    p.add_argument("--batches", type=int, nargs="+")
    p.add_argument("--short-batches", type=int, nargs="+", metavar="S", help=f"short section's S (default {SHORT_BATCHES})")
    p.add_argument("--short-valid", type=int, nargs="+", metavar="N",
                   help=f"short section's valid rows of {TOPK} (default {SHORT_VALID[:-1]}; all {TOPK} always run)")
    p.add_argument("--tiles", nargs="*", default=[],
                   help="extra tiles to time as heads:rows:stages:threads[:vr] (printed, not in the JSON)")
    args = p.parse_args(argv)
    args.command = shlex.join(["python3", "benchmarks/h200_decode.py", *(sys.argv[1:] if argv is None else argv)])
    unknown = sorted(set(args.sections + args.skip) - set(SECTIONS))
    if unknown:
        raise UserError(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")
    args.sections = [s for s in SECTIONS if s in args.sections and s not in args.skip]
    for flag, values, most in (("--heads", args.heads, HEADS_MOST), ("--batches", args.batches, BATCH_MOST),
                               ("--short-batches", args.short_batches, BATCH_MOST), ("--short-valid", args.short_valid, TOPK)):
        bad = [v for v in values or () if not 1 <= v <= most]
        if bad:
            raise UserError(f"{flag} {bad[0]}: give whole numbers from 1 to {most}")
    args.tiles = [parse_tile(t) for t in args.tiles]
    grid = DRY if args.dry_run else {"heads": HEADS, "batches": BATCHES, "accuracy_heads": ACCURACY_HEADS,
                                     "accuracy_batch": ACCURACY_BATCH, "short_batches": SHORT_BATCHES, "sweep": SWEEP}
    args.heads = args.heads or list(grid["heads"])
    args.batches = args.batches or list(grid["batches"])
    args.accuracy_heads, args.accuracy_batch = grid["accuracy_heads"], grid["accuracy_batch"]
    args.short_batches = args.short_batches or list(grid["short_batches"])
    args.short_valid = args.short_valid or list(SHORT_VALID)
    args.sweep = grid["sweep"]
    if args.dry_run:
        args.out = args.out or os.path.join(tempfile.gettempdir(), "h200-decode.dry-run.json")
        if os.path.realpath(args.out) == os.path.realpath(RESULTS):
            raise UserError(f"a dry run's fake timings never go to {os.path.relpath(RESULTS)}: pass another --out")
        if "compile" in args.sections:
            args.sections.remove("compile")  # nothing to compile: no kernel runs
    args.out = args.out or RESULTS
    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    return args


def preflight(args):
    """Check what the chosen sections need before any long step, so a missing piece fails at once."""
    need = set(args.sections)
    writable("--out", args.out)
    if "sweep" in need and importlib.util.find_spec("matplotlib") is None:
        raise UserError("the sweep section plots with matplotlib, which is not importable: install it or --skip sweep")
    if args.dry_run:
        return
    torch = cuda_torch("pass --dry-run")
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        raise UserError(f"this benchmark times dsaops' sm_90 kernels; this GPU is sm_{major}{minor}")
    if importlib.util.find_spec("tilelang") is None:
        raise UserError("TileLang is not importable: make bench unpacks .devbundle/site.tar.xz onto PYTHONPATH")
    if need & {"compile", "cases", "proxy"}:
        from dsaops.kernels import peers

        if not args.sglang_root:
            raise UserError("--sglang-root DIR is needed for SGLang's kernels (make bench passes .devbundle/sgl)")
        if not os.path.exists(os.path.join(args.sglang_root, *peers.SGLANG_KERNEL)):
            raise UserError(f"no {os.path.join(*peers.SGLANG_KERNEL)} under {args.sglang_root}")
    if need & {"cases", "accuracy"} and not args.no_flashmla:
        try:
            import flash_mla  # noqa: F401 - loads its CUDA libraries: a wheel that cannot load fails here
        except (ImportError, OSError) as e:
            raise UserError(f"FlashMLA does not load ({type(e).__name__}: {e}): the offline bundle (make gpu-bundle) "
                            "carries sgl-flash-mla; or pass --no-flashmla") from None


def partial(args) -> str:
    """Where the sections a run has finished so far are written."""
    return args.out + ".partial"


def write(result, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def measure(args) -> dict:
    run = Run(args)
    result = {**run_info(args.command, machine=None if run.dry else gpu_machine()),  # a dry run's: this CPU
              "gpu": "dry run (CPU stand-ins)" if run.dry else None, "sections": args.sections, "method": METHOD}
    if run.dry:
        result |= {"dry_run": True, "fake_timings": True}
    elapsed = result["elapsed_s"] = {}
    t0 = time.time()
    if os.path.exists(partial(args)):
        os.remove(partial(args))  # an earlier failed run's: not this run's sections
    proxy_jobs = ()
    if not run.dry:
        import torch
        from dsaops.kernels import peers

        from dsaops.cache import cache_dir

        os.environ.setdefault("TILELANG_CACHE_DIR", str(cache_dir("tilelang")))  # workers share it
        result["gpu"] = torch.cuda.get_device_name()
        if args.sglang_root:
            run.sgl = peers.load_sglang(args.sglang_root)
        if not args.no_flashmla:
            run.flashmla_cls = peers.FlashMLADecode
        proxy_jobs, run.proxy = sm121_proxy()
    else:
        run.sgl, run.proxy = _SglangStandIn, _proxy_standin
        run.flashmla_cls = None if args.no_flashmla else _FlashMLAStandIn
    for name in args.sections:
        start = time.time()
        if name == "compile":
            jobs = compile_jobs(args.sglang_root, args.heads, args.batches, args.tiles,
                                proxy_jobs)
            result["compile_failures"] = run_jobs(jobs, args.workers)
            print(f"compiled {len(jobs)} kernel sets", flush=True)
        else:
            if run.pool is None:
                copy_tb_s, fp8_tflops = run.timer.ceilings()
                result |= {"copy_tb_s": round(copy_tb_s, 3), "fp8_mm_tflops": round(fp8_tflops, 1)}
                print(f"{result['gpu']}: copy {copy_tb_s:.2f} TB/s, fp8 matmul {fp8_tflops:.0f} TFLOP/s"
                      + (" (FAKE)" if run.dry else ""), flush=True)
                run.load_pool()
                elapsed["setup"] = round(time.time() - start, 1)
                start = time.time()
            {"cases": run_cases, "accuracy": run_accuracy, "short": run_short, "sweep": run_sweep,
             "proxy": run_proxy, "kvcopy": run_kvcopy}[name](run, result)
        elapsed[name] = round(time.time() - start, 1)
        print(f"== {name}: {elapsed[name]:.0f} s (run {time.time() - t0:.0f} s)", flush=True)
        if name != "compile":
            write(result, partial(args))
    if [s for s in args.sections if s != "compile"]:  # a failed run leaves the results and plot it would replace
        if "sweep" in result:
            plot_sweep(result["sweep"], sweep_plot(args.out), dry=run.dry)
            print(f"sweep plot: {sweep_plot(args.out)}", flush=True)
        write(result, args.out)
        os.remove(partial(args))
    return result


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        preflight(args)
    except (UserError, OSError, ValueError) as e:
        print(f"h200_decode: {e}", file=sys.stderr)
        return 2
    try:
        result = measure(args)
    except BaseException:
        if os.path.exists(partial(args)):
            print(f"h200_decode: the run failed; {args.out} is unchanged, the sections it finished are in "
                  f"{partial(args)}", file=sys.stderr)
        raise
    print("elapsed (s): " + ", ".join(f"{k} {v:.0f}" for k, v in result["elapsed_s"].items()))
    if [s for s in args.sections if s != "compile"]:
        print(f"results: {args.out}" + ("  (DRY RUN: FAKE TIMINGS)" if args.dry_run else ""))
        print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
