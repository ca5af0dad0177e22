"""Host side of the raw-fp8 sparse-MLA decode: checks, tile and split choice, compiled-kernel cache.

The eager path must cost little host time (SGLang 0.5.23's `@tilelang.jit` look-ups dominate its
eager call): kernels are compiled once per (target, tile, d_tail) into an in-process cache, the
tile, split and kernels are chosen once per call shape (`_plan`), and a call does a few shape
checks, one to six `torch.empty`, and one to four launches (a call of two splits runs them as
clusters that merge in the kernel: tiles.PAIRED; a batch past whole waves of blocks may run those
first and the rest after them: splits.launches).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

from dsaops.kernels import route, splits, tiles

from dsaops.cache import cache_dir

PROXY_SEPARATOR = "@"


def kernel_target(name: str):
    """A target of the targets table by name, or TARGET@ARCH: TARGET's tiles, shared-memory budget
    and features compiled for ARCH (the gpu_arch of another NVIDIA target) with wgmma off.
    sm_121@sm_90a runs GB10's kernels (mma.sync, its tiles and shared-memory layout) on a Hopper;
    what differs from the sm_121a binary is the instruction set ptxas targets, nothing TileLang
    writes (tests/kernels/test_proxy_compile.py compares the two)."""
    from dsaops import targets

    base, _, arch = name.partition(PROXY_SEPARATOR)
    target = targets.get(base)
    if not arch:
        return target
    archs = {t.gpu_arch for t in targets.table().values() if t.vendor == "nvidia"}
    if target.vendor != "nvidia" or arch not in archs:
        raise targets.UnknownTarget(f"{name!r}: a proxy is an NVIDIA target compiled for another's arch, "
                                    f"TARGET@ARCH with ARCH one of {', '.join(sorted(archs))}")
    return dataclasses.replace(target, name=name, gpu_arch=arch)


def program(target, tile, d_tail: int | None, d_v: int = tiles.D_V, row_scaled: bool = False):
    """The TileLang program of one decode tile on `target` (V in registers: decode_regs; V in shared
    memory: decode_smem; for the row-scaled layout with row_scaled), or the split merge when tile is
    a tiles.Combine."""
    pdl = target.has("pdl")
    if isinstance(tile, tiles.Combine):
        from dsaops.kernels import decode_merge

        return decode_merge.combine_program(d_v, tile.splits, pdl=pdl, warp=target.warp_lanes)
    if tile.v_in_registers:
        if row_scaled:
            raise ValueError(f"V from registers (pv_registers.cuh) reads the raw layout only, not the row-scaled: {tile}")
        from dsaops.kernels import decode_regs

        return decode_regs.decode_program(tile, d_v, d_tail, fp8_dtype=target.fp8_dtype, pdl=pdl)
    from dsaops.kernels import decode_smem

    return decode_smem.decode_program(tile, d_v, d_tail, fp8_dtype=target.fp8_dtype,
                                      row_stats_in_shared=not target.has("wgmma"), row_scaled=row_scaled, pdl=pdl,
                                      wgmma=target.has("wgmma") and tile.heads_per_block >= 64)


def compile_kernel(target, tile, d_tail: int | None, d_v: int = tiles.D_V, row_scaled: bool = False):
    """Compile (or load from TILELANG_CACHE_DIR) `program`'s kernel. Returns a tilelang JITKernel.
    A target without wgmma in its table row is compiled with TileLang's wgmma lowering off: on its
    own arch that changes nothing, on a Hopper (a proxy, kernel_target) it keeps mma.sync."""
    os.environ.setdefault("TILELANG_CACHE_DIR", str(cache_dir("tilelang")))
    import tilelang

    configs = {} if target.has("wgmma") else {tilelang.PassConfigKey.TL_DISABLE_WGMMA: True}
    return tilelang.compile(program(target, tile, d_tail, d_v, row_scaled), target=target.tilelang_target,
                            pass_configs=configs)


def compile_job(job) -> None:
    """compile_kernel for a (kernel_target name, tile, d_tail, row_scaled) job: picklable, for
    worker processes that fill TileLang's cache (warm_cache, the benchmark's compile section)."""
    target_name, tile, d_tail, row_scaled = job
    compile_kernel(kernel_target(target_name), tile, d_tail, row_scaled=row_scaled)


def warm_cache(jobs, workers: int | None = None) -> None:
    """Compile (target name, tile, d_tail, row_scaled) jobs into TILELANG_CACHE_DIR in parallel
    processes, so that a process using them loads each instead of compiling it (the GPU tests)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    os.environ.setdefault("TILELANG_CACHE_DIR", str(cache_dir("tilelang")))
    with ProcessPoolExecutor(workers or os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(compile_job, jobs))


_kernel = functools.cache(compile_kernel)  # (target, tile, d_tail) -> kernel, once per process


def entry(kernel):
    """The compiled host function under a TileLang 0.1.12 kernel (tvm-ffi backend), called with the
    prim_func's arguments in order. TileLang's Python wrapper around it loops over the parameters,
    asks torch for the current device and looks the module up again on every call; the entry itself
    takes torch's current stream from the tensors (tvm-ffi's DLPack exchange), as the wrapper's call
    does. A backend without a tvm-ffi module (the wrapper is then all there is) keeps the kernel."""
    adapter = kernel.adapter
    if not hasattr(adapter, "_make_executable"):
        return kernel
    # loaded from TILELANG_CACHE_DIR: a module; compiled in this process: an executable to link once
    module = adapter.executable or adapter._make_executable()
    return (module.jit() if hasattr(module, "jit") else module).main


@functools.cache
def _device_facts(index: int):
    """(target, SM count) of a CUDA/HIP device, read once."""
    import torch

    from dsaops import targets

    props = torch.cuda.get_device_properties(index)
    target = targets.for_gpu(props, bool(torch.version.hip))
    if target is None:
        arch = props.gcnArchName if torch.version.hip else f"compute capability {props.major}.{props.minor}"
        raise ValueError(f"no dsaops target for {arch}; see `dsaops targets`")
    return target, props.multi_processor_count


def decode_supported(num_heads: int, d_qk: int, d_v: int, topk: int, kv_dtype) -> bool:
    """Whether sparse_mla_decode_fp8 handles this geometry (the routing patch asks before routing)."""
    return route.geometry_supported(num_heads, d_qk, d_v, topk, kv_dtype)


# Every batch the benchmark runs (BENCHMARKS.md), the smallest S = 1 at H = 16, is at least as fast
# here as on SGLang 0.5.23's fp8 decode; smaller ones (H = 8 at S = 1) stay on SGLang's kernel.
PREFERRED_MIN_QUERY_HEADS = 16


def decode_preferred(num_queries: int, num_heads: int) -> bool:
    """Whether to run sparse_mla_decode_fp8 rather than SGLang's kernel for S queries of H heads
    (the routing patch asks per call; CUDA graphs are captured per batch size, so each keeps one)."""
    return num_queries * num_heads >= PREFERRED_MIN_QUERY_HEADS


@functools.cache
def _check_geometry(q_shape, kv_shape, idx_shape, q_dtype, kv_dtype, idx_dtype, d_v) -> None:
    """The shape and dtype checks, once per distinct call shape (a ValueError is not cached)."""
    import torch

    if len(q_shape) != 3 or len(kv_shape) != 3 or len(idx_shape) != 3:
        raise ValueError(f"want q [S, H, d], kv [slots, 1, d], indices [S, 1, topk]; got "
                         f"{tuple(q_shape)}, {tuple(kv_shape)}, {tuple(idx_shape)}")
    S, H, width = q_shape
    if not q_dtype.is_floating_point:  # decode_with_tile casts q to bf16: an integer q would become nonsense
        raise ValueError(f"q must be bfloat16 (fp8, float16 or float32: cast to bfloat16), got {q_dtype}")
    if unsupported := route.geometry_unsupported(H, width, d_v, idx_shape[2], kv_dtype):
        raise ValueError(f"unsupported geometry: {'; '.join(unsupported)}")
    if kv_shape[1] != 1 or kv_shape[2] != width:
        raise ValueError(f"kv must be [slots, 1, {width}] (rows as wide as q), got {tuple(kv_shape)}")
    if idx_shape[0] != S or idx_shape[1] != 1 or idx_dtype != torch.int32:
        raise ValueError(f"indices must be int32 [{S}, 1, topk], got {idx_dtype} {tuple(idx_shape)}")


def _check(q, kv, indices, d_v):
    _check_geometry(q.shape, kv.shape, indices.shape, q.dtype, kv.dtype, indices.dtype, d_v)
    dev = q.device
    if not (q.is_cuda and kv.device == dev and indices.device == dev):
        raise ValueError("q, kv and indices must be on the same GPU")
    if not (q.is_contiguous() and kv.is_contiguous() and indices.is_contiguous()):
        raise ValueError("q, kv and indices must be contiguous")


def _check_topk_length(topk_length, q) -> None:
    import torch

    if topk_length.dtype != torch.int32 or topk_length.shape != (q.shape[0],) or topk_length.device != q.device:
        raise ValueError(f"topk_length must be int32 [{q.shape[0]}] (one count a query) on {q.device}, got "
                         f"{topk_length.dtype} {tuple(topk_length.shape)} on {topk_length.device}")


def sparse_mla_decode_fp8(q, kv, indices, sm_scale, d_v=512, return_lse=False, kv_scale=None, topk_length=None):
    """Sparse-MLA decode over a raw fp8 KV pool.

    q [S, H, d_v + d_tail] bf16 (fp8 accepted; fp16, fp32 rounded to bf16), kv [slots, 1, d_v + d_tail]
    raw fp8 (one row a token), indices [S, 1, topk] int32 (-1 = masked; values must be < slots). Returns out
    [S, H, d_v] bf16, and lse [S, H] fp32 (natural log; -inf for an all-masked row, whose output
    is zeros) when return_lse; S = 0 returns them empty, with no launch. q enters the QK^T product
    at bf16's precision: the kernel scales each head's q by a power of two and splits it into two
    e4m3 halves whose sum is q exactly (kernels/q_halves.py), two fp8 products into one accumulator.
    kv_scale [slots] float32: kv is the row-scaled layout (write_kv_fp8 with kv_scale): row i
    stands for kv[i] * kv_scale[i].
    topk_length [S] int32 (FlashMLA's argument; SGLang's dsa_cache_seqlens_int32): the count of
    leading indices a query may have valid. Accepted from callers that pass it and checked; the
    kernel needs none of it: it finds the -1 tail itself, in the row ids it loads anyway, and
    stops there (a context shorter than top-k costs the tiles it reads), so a length never
    changes the result.
    """
    _check(q, kv, indices, d_v)
    if topk_length is not None:
        _check_topk_length(topk_length, q)
    if kv_scale is not None:
        from dsaops.kernels import reference

        reference.check_kv_scale(kv_scale, kv)
    if q.shape[0] == 0:  # an idle data-parallel rank decodes no tokens; a launch of no blocks is a CUDA error
        import torch

        out = torch.empty((0, q.shape[1], d_v), dtype=torch.bfloat16, device=q.device)
        return (out, torch.empty((0, q.shape[1]), dtype=torch.float32, device=q.device)) if return_lse else out
    return decode_with_tile(q, kv, indices, sm_scale, d_v, return_lse, tile=None, kv_scale=kv_scale)


class Phase(NamedTuple):
    """One launch of a call (and its merge): `count` queries from `first`, `splits` splits of `tile`."""
    first: int
    count: int
    tile: object
    splits: int


def choose_plan(target, S: int, H: int, topk: int, d_tail: int, sm_count: int, row_scaled: bool = False,
                tile=None) -> tuple[Phase, ...]:
    """The launches of a call shape on `target` with sm_count SMs: one, or whole waves of blocks and
    then the rest (splits.launches), both of one tile. The batch size picks between Hopper's tiles
    (tiles.too_few_queries), the wave model the splits; two splits of a tile in tiles.PAIRED run its
    cluster, which merges them itself. tile: forced (benchmarks, tests).
    No GPU needed: _plan's choice, which the dispatch tests check."""
    few = tiles.too_few_queries(S, H, topk, sm_count)
    tile = tile or tiles.choose(target, H, d_tail=d_tail, row_scaled=row_scaled, few_queries=few)
    steps = -(-topk // tile.block_rows)
    return tuple(Phase(first, count, tiles.PAIRED[tile] if n_split == 2 and tile in tiles.PAIRED else tile, n_split)
                 for first, count, n_split in splits.launches(S, H, steps, tile, sm_count))


@functools.cache
def _plan(device_index: int, S: int, H: int, topk: int, width: int, d_v: int, tile, row_scaled: bool,
          target_name: str | None = None):
    """(launches, kv_scale stand-in, lse scratch) for one call shape, once per shape: a call then
    costs one look-up keyed by ints instead of the tile and split choice and hashed kernel look-ups.
    A launch is (its queries as a slice, decode entry, combine entry or None, split count, rows a
    split owns). The stand-in fills the raw layout's kv_scale argument, which its kernel never reads
    (one signature for both layouts). The scratch takes the lse of a call that does not return it:
    the kernels write it and nothing reads it, so every such call may share it, on any stream (an
    allocation costs about what a launch does).
    target_name: kernels of another target than the device's (kernel_target: a proxy)."""
    import torch

    target, sm_count = _device_facts(device_index)
    if target_name is not None:
        target = kernel_target(target_name)
    launches = []
    for first, count, tile_, n_split in choose_plan(target, S, H, topk, width - d_v, sm_count, row_scaled, tile):
        # every split owns as many tiles; the kernel reads positions past top-k as -1 and stops after a
        # split's last tile with a valid row, so top-k is never padded here
        split_rows = -(-topk // (tile_.block_rows * n_split)) * tile_.block_rows
        if split_rows > tile_.index_rows:  # a forced two-split tile only
            raise ValueError(f"top-k {topk} needs more than {tile_.name}'s {n_split} splits of {tile_.index_rows} rows")
        launches.append((slice(first, first + count),
                         entry(_kernel(target, tile_, width - d_v, row_scaled=row_scaled)),
                         entry(_kernel(target, tiles.combine_for(n_split), None)) if n_split > 1 and not tile_.pairs else None,
                         n_split,
                         split_rows))
    return (tuple(launches),
            torch.empty(1, device=f"cuda:{device_index}"),
            torch.empty((S, H), dtype=torch.float32, device=f"cuda:{device_index}"))


def decode_with_tile(q, kv, indices, sm_scale, d_v, return_lse, tile=None, kv_scale=None, target=None):
    """sparse_mla_decode_fp8 without the input checks, with an optional forced tile (benchmarks), or
    another target's kernels (`target`, a kernel_target name: "sm_121@sm_90a" runs GB10's on a
    Hopper)."""
    import torch

    S, H, width = q.shape
    topk = indices.shape[2]
    dev = q.device
    device_index = dev.index if dev.index is not None else torch.cuda.current_device()
    launches, unread, lse_scratch = _plan(device_index, S, H, topk, width, d_v, tile, kv_scale is not None, target)
    if q.dtype != torch.bfloat16:
        q = q.to(torch.bfloat16)  # fp8 -> bf16 is exact (fp16, fp32: rounded); the kernel reads bf16
    scale = unread if kv_scale is None else kv_scale
    out = torch.empty((S, H, d_v), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((S, H), dtype=torch.float32, device=dev) if return_lse else lse_scratch
    for queries, decode, combine, n_split, split_rows in launches:
        if len(launches) > 1:  # each its queries, a contiguous slice (one launch skips the slicing's host cost)
            q_, indices_, out_, lse_ = q[queries], indices[queries], out[queries], lse[queries]
        else:
            q_, indices_, out_, lse_ = q, indices, out, lse
        if combine is None:  # one split, or two merged by their cluster: the kernel writes the answer
            decode(q_, kv, scale, indices_, float(sm_scale), split_rows, out_, lse_)
        else:  # split k's heads at rows k*H.. (decode_parts.decode_kernel)
            count = q_.shape[0]
            part_o = torch.empty((count, n_split * H, d_v), dtype=torch.bfloat16, device=dev)
            part_lse = torch.empty((count, n_split * H), dtype=torch.float32, device=dev)
            decode(q_, kv, scale, indices_, float(sm_scale), split_rows, part_o, part_lse)
            combine(part_o, part_lse, n_split, out_, lse_)
    return (out, lse) if return_lse else out
