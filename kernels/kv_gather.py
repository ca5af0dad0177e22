"""gather_kv_rows: gather raw fp8 KV rows by slot id into a contiguous, padded buffer (Triton).

What q8 prefill consumes: the prefix KV rows in request order, contiguous, with the row count
rounded UP to a multiple of `pad_multiple` (so every valid tail token is kept) and the padding
filled with zero rows and id -1. One launch writes every output row, padding included, so no
separate memset runs. Rows are copied as bytes: no conversion, the same kernel for e4m3fn and
e4m3fnuz pools.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_write import check_ids, check_pool

BLOCK_M = 32


@triton.jit
def _gather_kernel(pool_ptr, pool_stride, n_slots, ids_ptr, n_ids, out_ptr, out_stride, out_ids_ptr, n_out, width,
                   WIDTH_P2: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(ids_ptr + rows, mask=rows < n_ids, other=-1).to(tl.int64)
    # An id outside [0, n_slots) reads as a zero row: the kernel never touches memory outside the pool.
    valid = (ids >= 0) & (ids < n_slots)
    cols = tl.arange(0, WIDTH_P2)[None, :]
    in_row = cols < width
    src = tl.load(pool_ptr + ids[:, None] * pool_stride + cols, mask=valid[:, None] & in_row, other=0)
    in_out = rows < n_out
    tl.store(out_ptr + rows[:, None] * out_stride + cols, src, mask=in_out[:, None] & in_row)
    tl.store(out_ids_ptr + rows, ids.to(tl.int32), mask=in_out)


def gather_kv_rows(pool, slot_ids, pad_multiple=128):
    """Return (rows, ids): rows [P, 1, d] in pool.dtype, ids [P] int32, P = ceil(N / pad_multiple) * pad_multiple.

    rows[i] = pool[slot_ids[i]] for i < N; ids = slot_ids followed by -1 up to P. A masked id (-1) gives a
    zero row and keeps its -1; the padding rows are zero. slot_ids: 1-D, contiguous, int32 or int64. Ids must
    be -1 or in [0, slots) (not checked here: that would cost a host sync; any other id reads as a zero row,
    never out of bounds; `dsaops.kernels.reference.gather_kv_rows` checks them). N = 0 gives empty outputs.
    """
    check_pool(pool)
    check_ids("slot_ids", slot_ids, pool)
    if isinstance(pad_multiple, bool) or not isinstance(pad_multiple, int) or pad_multiple < 1:
        raise ValueError(f"pad_multiple must be a positive int, got {pad_multiple!r}")
    n = slot_ids.shape[0]
    padded = triton.cdiv(n, pad_multiple) * pad_multiple
    width = pool.shape[2]
    rows = torch.empty((padded, 1, width), dtype=pool.dtype, device=pool.device)
    ids = torch.empty((padded,), dtype=torch.int32, device=pool.device)
    if padded:
        raw = pool.view(torch.uint8)
        _gather_kernel[(triton.cdiv(padded, BLOCK_M),)](
            raw, raw.stride(0), pool.shape[0], slot_ids, n, rows.view(torch.uint8), width, ids, padded, width,
            WIDTH_P2=triton.next_power_of_2(width), BLOCK_M=BLOCK_M,
        )
    return rows, ids
