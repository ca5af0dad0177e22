"""write_kv_fp8: fused cast and paged write of KV rows into the raw fp8 pool (Triton).

One launch reads the bf16/fp16/fp32 rows, casts them to the pool's fp8 dtype and stores them at
their slots, where SGLang 0.5.23 on CUDA casts and then scatters in two kernels. A NoPE model
(GLM-5.3-Flash, qk_rope_head_dim = 0) passes no RoPE tensor. Each program handles BLOCK_M rows, so
a 65,536-row write is a few thousand programs rather than one per row.
"""
from __future__ import annotations

import functools
import struct

import torch
import triton
import triton.language as tl
from dsaops.kernels import reference

from dsaops import targets

BLOCK_M = 16


@functools.cache
def fp8_dtype_for(device: torch.device) -> torch.dtype | None:
    """The raw-fp8 dtype the targets table gives the GPU at `device`; None where the table has no entry."""
    if device.type != "cuda":
        return None
    target = targets.for_gpu(torch.cuda.get_device_properties(device), bool(torch.version.hip))
    return getattr(torch, target.fp8_dtype) if target else None


def check_pool(pool: torch.Tensor) -> None:
    """A raw fp8 pool: [slots, 1, d], rows contiguous, in the fp8 dtype of the device's target."""
    if pool.dim() != 3 or pool.shape[1] != 1 or pool.stride(2) != 1:
        raise ValueError(f"pool must be [slots, 1, d] with contiguous rows, got shape {tuple(pool.shape)} "
                         f"strides {pool.stride()}")
    want = fp8_dtype_for(pool.device)
    if pool.dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) or (want and pool.dtype != want):
        expected = want or "float8_e4m3fn or float8_e4m3fnuz"
        raise ValueError(f"pool dtype is {pool.dtype}; this device stores raw fp8 KV as {expected} "
                         "(dsaops/targets.toml fp8_dtype)")


def check_ids(name: str, ids: torch.Tensor, pool: torch.Tensor) -> None:
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a 1-D int32 or int64 tensor of slot ids, got {ids.dtype} {tuple(ids.shape)}")
    if ids.device != pool.device:
        raise ValueError(f"{name} is on {ids.device} but the pool is on {pool.device}; move it to the pool's device")
    if not ids.is_contiguous():  # the kernels read ids[i] at ids_ptr + i: a strided view would name other slots
        raise ValueError(f"{name} must be contiguous, got strides {ids.stride()}; pass {name}.contiguous()")


def _rows(name: str, x: torch.Tensor, loc: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """[N, d] or [N, 1, d] (SGLang's shapes) as a [N, d] view with unit column stride."""
    if x.dim() == 3 and x.shape[1] == 1:
        x = x[:, 0]
    if x.dim() != 2 or x.shape[0] != loc.shape[0]:
        raise ValueError(f"{name} must be [{loc.shape[0]}, d] or [{loc.shape[0]}, 1, d] (one row per loc), "
                         f"got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{name} must be bfloat16, float16 or float32, got {x.dtype}")
    if x.device != pool.device:
        raise ValueError(f"{name} is on {x.device} but the pool is on {pool.device}")
    return x if x.stride(1) == 1 else x.contiguous()


@functools.cache
def special_bytes(dtype: torch.dtype) -> tuple[int, int, int, bool]:
    """How the installed torch casts what `dtype` cannot hold, read off torch's own cast: (float32 magnitude
    bits from which the special byte is written, byte for overflow and infinity, byte for NaN, whether the
    sign bit is kept). torch's cast is the definition the written bytes must equal, and it changed between
    releases (e4m3fn overflow is NaN in torch 2.11, saturates to 448 in 2.13); hardware conversions differ
    again (satfinite on NVIDIA, canonical NaN on ROCm), so the kernel writes these bytes itself."""
    def byte(bits: int) -> int:
        value = torch.tensor(struct.unpack("<f", struct.pack("<I", bits)), dtype=torch.float32)
        return int(value.to(dtype).view(torch.uint8)[0])

    huge, inf, nan = 0x7F7FFFFF, 0x7F800000, 0x7FC00000
    over = byte(huge)
    if byte(inf) != over:
        raise NotImplementedError(f"torch {torch.__version__} casts inf and finite overflow to different "
                                  f"{dtype} bytes; write_kv_fp8 does not model that")
    lo, hi = 0x3F800000, huge  # 1.0 casts to a finite byte; the smallest magnitude that casts to `over` lies above
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if byte(mid) == over else (mid, hi)
    signed = byte(huge | 0x80000000) == over | 0x80
    return hi, over, byte(nan), signed


@triton.jit
def _load_rows(src_ptr, src_stride, rows, keep, width, WIDTH_P2: tl.constexpr):
    """BLOCK_M rows of `width` columns as float32 (rows not kept and columns past width read as 0)."""
    cols = tl.arange(0, WIDTH_P2)
    x = tl.load(src_ptr + rows[:, None] * src_stride + cols[None, :], mask=keep[:, None] & (cols[None, :] < width),
                other=0.0)
    return x.to(tl.float32)


@triton.jit
def _amax_bits(x):
    """Each row's largest magnitude as float32 bits (an integer max: NaN and inf order above every
    finite value, as the layout wants)."""
    return tl.max(x.to(tl.uint32, bitcast=True) & 0x7FFFFFFF, axis=1)


@triton.jit
def _scale_to_e4m3(x, inv_scale):
    """x times its row's inverse scale (positive), rounded to the nearest e4m3 value (ties to even),
    still in float32, with exact integer and power-of-two steps. Scaled rows are arbitrary float32
    values, for which a GPU's hardware conversion can give other bytes than torch's cast (rounding
    through float16 first, as it may, differs on a few values of the test data). A value on the e4m3 grid converts exactly by any route. Raw rows need none of this:
    bfloat16 values survive a float16 step unrounded."""
    y = x * inv_scale[:, None]
    magnitude = y.to(tl.uint32, bitcast=True) & 0x7FFFFFFF
    # normal e4m3 (>= 2^-6): keep 3 of float32's 23 mantissa bits, ties to even (a carry may bump the exponent)
    normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) << 20
    # subnormal e4m3: multiples of 2^-9, rounded by adding and taking away 2^23 at 2^9 times the value
    small = ((tl.abs(y) * 512.0 + 8388608.0) - 8388608.0) * 0.001953125
    rounded = tl.where(magnitude >= 0x3C800000, normal.to(tl.float32, bitcast=True), small)
    rounded = tl.where(magnitude >= 0x7F800000, tl.abs(y), rounded)  # inf and NaN as they are
    # The sign bit comes from x's bits: a GPU's product with a NaN is its canonical, positive NaN,
    # while torch's cast keeps a NaN's sign (0x7F from the GPU where torch has 0xFF); Triton negates
    # as 0 - x, which loses -0.0; and no literal past int32 (Triton would widen the operation).
    sign = (x.to(tl.uint32, bitcast=True) >> 31) << 31
    return (rounded.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _store_fp8(x, dst_ptr, slot, keep, width, WIDTH_P2: tl.constexpr,
               OVER_BITS: tl.constexpr, OVER_BYTE: tl.constexpr, NAN_BYTE: tl.constexpr, SIGNED: tl.constexpr):
    """x (float32 rows) cast to the pool's fp8 as torch casts, stored at the rows' slots."""
    cols = tl.arange(0, WIDTH_P2)
    y = x.to(dst_ptr.dtype.element_ty).to(tl.uint8, bitcast=True)
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    special = tl.where(magnitude > 0x7F800000, NAN_BYTE, OVER_BYTE).to(tl.uint8)
    if SIGNED:
        special = special | ((bits >> 24) & 0x80).to(tl.uint8)
    y = tl.where(magnitude >= OVER_BITS, special, y)
    tl.store(dst_ptr + slot[:, None] + cols[None, :], y.to(dst_ptr.dtype.element_ty, bitcast=True),
             mask=keep[:, None] & (cols[None, :] < width))


@triton.jit
def _write_kv_fp8_kernel(pool_ptr, pool_stride, n_slots, loc_ptr, n_rows, skip_index,
                         nope_ptr, nope_stride, d_nope, rope_ptr, rope_stride, d_rope, scale_ptr,
                         HAS_SKIP: tl.constexpr, HAS_ROPE: tl.constexpr, NOPE_P2: tl.constexpr, ROPE_P2: tl.constexpr,
                         OVER_BITS: tl.constexpr, OVER_BYTE: tl.constexpr, NAN_BYTE: tl.constexpr,
                         SIGNED: tl.constexpr, BLOCK_M: tl.constexpr,
                         ROW_SCALED: tl.constexpr, FMAX: tl.constexpr, TINY_AMAX: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    keep = rows < n_rows
    loc = tl.load(loc_ptr + rows, mask=keep, other=0).to(tl.int64)
    # A loc outside [0, n_slots) is dropped: the kernel never writes outside the pool.
    keep = keep & (loc >= 0) & (loc < n_slots)
    if HAS_SKIP:
        keep = keep & (loc != skip_index)
    slot = loc * pool_stride
    nope = _load_rows(nope_ptr, nope_stride, rows, keep, d_nope, NOPE_P2)
    if HAS_ROPE:
        rope = _load_rows(rope_ptr, rope_stride, rows, keep, d_rope, ROPE_P2)
    if ROW_SCALED:  # reference.row_scales, with the same IEEE divisions, over the rows loaded once
        amax_bits = _amax_bits(nope)
        if HAS_ROPE:
            amax_bits = tl.maximum(amax_bits, _amax_bits(rope))
        amax = amax_bits.to(tl.float32, bitcast=True)
        ok = (amax_bits < 0x7F800000) & (amax > TINY_AMAX)
        safe = tl.where(ok, amax, 1.0)
        fmax = tl.full([BLOCK_M], FMAX, tl.float32)
        inv_scale = tl.where(ok, tl.math.div_rn(fmax, safe), 1.0)
        tl.store(scale_ptr + loc, tl.where(ok, tl.math.div_rn(safe, fmax), 1.0), mask=keep)
        nope = _scale_to_e4m3(nope, inv_scale)
        if HAS_ROPE:
            rope = _scale_to_e4m3(rope, inv_scale)
    _store_fp8(nope, pool_ptr, slot, keep, d_nope, NOPE_P2, OVER_BITS, OVER_BYTE, NAN_BYTE, SIGNED)
    if HAS_ROPE:
        _store_fp8(rope, pool_ptr + d_nope, slot, keep, d_rope, ROPE_P2, OVER_BITS, OVER_BYTE, NAN_BYTE, SIGNED)

def write_kv_fp8(pool, loc, k_nope, k_rope=None, skip_index=None, kv_scale=None):
    """pool[loc[i], 0] = cat(k_nope[i], k_rope[i]).to(pool.dtype) for every i with loc[i] != skip_index; returns pool.

    pool [slots, 1, d] fp8 (float8_e4m3fn; float8_e4m3fnuz on gfx942), written in place.
    loc [N] int32/int64 slot ids, contiguous, distinct among the written rows and in [0, slots). They are not checked
    here (that would cost a host sync): a loc outside the pool is dropped, never written out of bounds;
    `dsaops.kernels.reference.write_kv_fp8` checks them.
    k_nope [N, d_nope] or [N, 1, d_nope] in bf16/fp16/fp32; k_rope likewise, or None for NoPE; d_nope + d_rope == d.
    Rows not named by loc, and rows at skip_index (SGLang's reserved padding slot 0), are not touched.
    kv_scale [slots] float32, contiguous: write the row-scaled layout instead: each row
    multiplied by fp8 max / amax(row) before the cast, amax / fp8 max into kv_scale[loc[i]]
    (`reference.row_scales`).
    """
    check_pool(pool)
    check_ids("loc", loc, pool)
    if kv_scale is not None:
        reference.check_kv_scale(kv_scale, pool)
    nope = _rows("k_nope", k_nope, loc, pool)
    rope = None if k_rope is None else _rows("k_rope", k_rope, loc, pool)
    d_rope = 0 if rope is None else rope.shape[1]
    if nope.shape[1] + d_rope != pool.shape[2]:
        raise ValueError(f"k_nope ({nope.shape[1]}) + k_rope ({d_rope}) columns must equal the pool row width "
                         f"({pool.shape[2]})")
    n = loc.shape[0]
    if n == 0:
        return pool
    over_bits, over_byte, nan_byte, signed = special_bytes(pool.dtype)
    _write_kv_fp8_kernel[(triton.cdiv(n, BLOCK_M),)](
        pool, pool.stride(0), pool.shape[0], loc, n, 0 if skip_index is None else int(skip_index),
        nope, nope.stride(0), nope.shape[1], nope if rope is None else rope, 0 if rope is None else rope.stride(0),
        d_rope, pool if kv_scale is None else kv_scale,
        HAS_SKIP=skip_index is not None, HAS_ROPE=rope is not None,
        NOPE_P2=triton.next_power_of_2(nope.shape[1]), ROPE_P2=triton.next_power_of_2(max(d_rope, 1)),
        OVER_BITS=over_bits, OVER_BYTE=over_byte, NAN_BYTE=nan_byte, SIGNED=signed, BLOCK_M=BLOCK_M,
        ROW_SCALED=kv_scale is not None, FMAX=torch.finfo(pool.dtype).max, TINY_AMAX=reference.TINY_AMAX,
    )
    return pool
