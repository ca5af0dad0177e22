"""fp32 torch references for the raw-fp8 kernels: the specification the fast kernels are tested against.

Same signatures as the kernels in `dsaops.kernels`. They favour clarity over speed, check their
inputs (including index values, which the GPU kernels cannot check without a host sync) and raise
ValueError saying what to change.

Conventions shared with the kernels:
- the raw fp8 pool is [slots, 1, d] in float8_e4m3fn (float8_e4m3fnuz on gfx942), one row a token;
- decode indices are [S, 1, topk] integers, -1 = masked; a repeated index counts as often as it appears;
- lse is the natural logarithm of the sum of exp(sm_scale * q.k) over the unmasked indices,
  -inf for a row with every index masked (whose output is zeros, never NaN).
"""
from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _check_pool(pool: torch.Tensor) -> None:
    if pool.dim() != 3 or pool.shape[1] != 1:
        raise ValueError(f"pool must be [slots, 1, d], got shape {tuple(pool.shape)}")
    if pool.dtype not in FP8_DTYPES:
        raise ValueError(f"pool must be float8_e4m3fn or float8_e4m3fnuz (the raw fp8 layout), got {pool.dtype}")


def _check_ids(name: str, ids: torch.Tensor, slots: int, allow_masked: bool) -> None:
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise ValueError(f"{name} must be an integer tensor (int32 or int64), got {ids.dtype}")
    if ids.numel() == 0:
        return
    low = -1 if allow_masked else 0
    lo, hi = int(ids.min()), int(ids.max())
    if lo < low or hi >= slots:
        raise ValueError(f"{name} values must lie in [{low}, {slots - 1}] (pool has {slots} slots), got [{lo}, {hi}]")


def _rows(name: str, x: torch.Tensor, n: int) -> torch.Tensor:
    """Accept [n, d] or [n, 1, d] (SGLang's k_nope/k_rope shapes); return [n, d]."""
    if x.dim() == 3 and x.shape[1] == 1:
        x = x[:, 0]
    if x.dim() != 2 or x.shape[0] != n:
        raise ValueError(f"{name} must be [{n}, d] or [{n}, 1, d] (one row per loc), got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


def sparse_mla_decode(q, kv, indices, sm_scale, d_v=512, return_lse=False):
    """out[s, h] = softmax_i(sm_scale * q[s, h] . kv[indices[s, 0, i]]) @ kv[indices[s, 0, i], :d_v].

    q [S, H, d_v + d_tail] (any float dtype, fp8 included), kv [slots, 1, d_v + d_tail], indices [S, 1, topk].
    Returns out [S, H, d_v] float32 (and lse [S, H] float32 when return_lse).
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [S, H, d], got shape {tuple(q.shape)}")
    if kv.dim() != 3 or kv.shape[1] != 1 or kv.shape[2] != q.shape[2]:
        raise ValueError(f"kv must be [slots, 1, {q.shape[2]}] (row width equal to q's), got shape {tuple(kv.shape)}")
    if not 0 < d_v <= q.shape[2]:
        raise ValueError(f"d_v must be in [1, {q.shape[2]}] (q's width), got {d_v}")
    S = q.shape[0]
    if indices.dim() != 3 or indices.shape[0] != S or indices.shape[1] != 1:
        raise ValueError(f"indices must be [{S}, 1, topk], got shape {tuple(indices.shape)}")
    _check_ids("indices", indices, kv.shape[0], allow_masked=True)

    idx = indices[:, 0].long()                                  # [S, topk]
    valid = idx >= 0
    rows = kv[:, 0].float()[idx.clamp(min=0)]                   # [S, topk, d]
    scores = torch.einsum("shd,skd->shk", q.float(), rows) * float(sm_scale)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                       # -inf where every index is masked
    # exp(-inf - -inf) would be NaN: shift an all-masked row by 0 so its probabilities are exp(-inf) = 0.
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("shk,skd->shd", probs, rows[..., :d_v])
    return (out, lse) if return_lse else out


# Rows whose largest magnitude is at most this are left unscaled (scale 1): fp8 max / amax would
# overflow float32, and such rows are zeros in fp8 whatever the scale.
TINY_AMAX = 2.0**-100


def row_scales(x, dtype=torch.float8_e4m3fn):
    """Per-row (scale, inverse) of the row-scaled fp8 layout for x [N, d]:
    scale = amax(row) / fp8 max and inverse = fp8 max / amax(row), each one IEEE float32 division,
    so each row's largest value lands on the format's largest; (1, 1) for a row whose amax is not
    finite or at most TINY_AMAX. Dividing by the exact scale rather than a power of two matters:
    with 30x outlier channels the decode error is ~3.5% against raw fp8's ~6.3%, while power-of-two
    scales reproduce raw fp8's rounding and its 6.3% (the largest value of a row, which drives its
    scores, is exact only on the format's max)."""
    amax = x.float().abs().amax(dim=1)
    fmax = torch.tensor(torch.finfo(dtype).max, dtype=torch.float32)
    ok = torch.isfinite(amax) & (amax > TINY_AMAX)
    one = torch.ones_like(amax)
    return torch.where(ok, amax / fmax, one), torch.where(ok, fmax / torch.where(ok, amax, one), one)


def quantize_rows_scaled(x, dtype=torch.float8_e4m3fn):
    """The row-scaled fp8 layout of x [N, d]: (rows [N, d] in dtype, scales [N] float32) with
    rows = (x * inverse).to(dtype) (row_scales). Dequantize: rows.float() * scales[:, None]."""
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a 2-D float tensor [N, d], got {x.dtype} {tuple(x.shape)}")
    scales, inverse = row_scales(x, dtype)
    return (x.float() * inverse[:, None]).to(dtype), scales


def sparse_mla_decode_row_scaled(q, kv, kv_scale, indices, sm_scale, d_v=512, return_lse=False):
    """sparse_mla_decode over a per-row-scaled fp8 pool: kv [slots, 1, d] fp8 with kv_scale [slots]
    (quantize_rows_scaled's output); each row is dequantized before the same fp32 math."""
    _check_pool(kv)
    check_kv_scale(kv_scale, kv)
    rows = kv.float() * kv_scale[:, None, None]
    return sparse_mla_decode(q, rows, indices, sm_scale, d_v=d_v, return_lse=return_lse)


def check_kv_scale(kv_scale, pool) -> None:
    """The row-scaled layout's scales: float32 [slots], one a pool row, on the pool's device, contiguous
    (the kernels address scale i at kv_scale's pointer + i)."""
    if (kv_scale.dtype != torch.float32 or kv_scale.shape != (pool.shape[0],) or kv_scale.device != pool.device
            or not kv_scale.is_contiguous()):
        raise ValueError(f"kv_scale must be float32 [{pool.shape[0]}] (one scale a pool row), contiguous, on "
                         f"{pool.device}, got {kv_scale.dtype} {tuple(kv_scale.shape)} strides {kv_scale.stride()} "
                         f"on {kv_scale.device}")


def write_kv_fp8(pool, loc, k_nope, k_rope=None, skip_index=None, kv_scale=None):
    """pool[loc[i], 0] = cat(k_nope[i], k_rope[i]).to(pool.dtype), in place, for every i with loc[i] != skip_index.

    k_nope [N, d_nope] or [N, 1, d_nope]; k_rope likewise or None (NoPE); d_nope + d_rope == pool width.
    Rows not named by loc (and rows at skip_index) are left untouched. Written rows must be distinct.
    kv_scale [slots] float32: write the row-scaled layout instead (quantize_rows_scaled of each
    row, its scale into kv_scale[loc[i]]). Returns pool.
    """
    _check_pool(pool)
    if kv_scale is not None:
        check_kv_scale(kv_scale, pool)
    if loc.dim() != 1:
        raise ValueError(f"loc must be 1-D [N] slot ids, got shape {tuple(loc.shape)}")
    n = loc.shape[0]
    keep = torch.ones(n, dtype=torch.bool) if skip_index is None else (loc != skip_index).cpu()
    targets = loc.cpu()[keep]
    _check_ids("loc", targets, pool.shape[0], allow_masked=False)
    parts = [_rows("k_nope", k_nope, n)] + ([] if k_rope is None else [_rows("k_rope", k_rope, n)])
    width = sum(p.shape[1] for p in parts)
    if width != pool.shape[2]:
        raise ValueError(f"k_nope + k_rope widths ({width}) must equal the pool row width ({pool.shape[2]})")
    if targets.unique().numel() != targets.numel():
        raise ValueError("loc names a slot twice: which row lands there would be undefined; deduplicate loc")
    rows = torch.cat([p.float().cpu() for p in parts], dim=1)[keep]
    slots = targets.to(pool.device)
    if kv_scale is None:
        cast = rows.to(pool.dtype)
    else:
        cast, scales = quantize_rows_scaled(rows, pool.dtype)
        kv_scale[slots] = scales.to(pool.device)
    # Indexed through uint8 views: advanced indexing of float8 tensors is not implemented on every device.
    pool.view(torch.uint8)[slots, 0] = cast.view(torch.uint8).to(pool.device)
    return pool


def gather_kv_rows(pool, slot_ids, pad_multiple=128):
    """Gather pool rows by slot id into a contiguous buffer padded to a multiple of pad_multiple.

    slot_ids [N] (-1 = masked). Returns (rows [P, 1, d] in pool.dtype, ids [P] int32) with
    P = ceil(N / pad_multiple) * pad_multiple: rows[i] = pool[slot_ids[i]] for i < N (all N kept, the
    tail included), zero rows for masked ids and for i >= N, and ids = slot_ids padded with -1.
    """
    _check_pool(pool)
    if not isinstance(pad_multiple, int) or pad_multiple < 1:
        raise ValueError(f"pad_multiple must be a positive int, got {pad_multiple!r}")
    if slot_ids.dim() != 1:
        raise ValueError(f"slot_ids must be 1-D [N], got shape {tuple(slot_ids.shape)}")
    _check_ids("slot_ids", slot_ids, pool.shape[0], allow_masked=True)
    n = slot_ids.shape[0]
    padded = -(-n // pad_multiple) * pad_multiple
    ids = torch.full((padded,), -1, dtype=torch.int32, device=pool.device)
    ids[:n] = slot_ids.to(torch.int32)
    rows = torch.zeros((padded, 1, pool.shape[2]), dtype=pool.dtype, device=pool.device)
    valid = ids >= 0
    rows.view(torch.uint8)[valid] = pool.view(torch.uint8)[ids[valid].long()]
    return rows, ids
