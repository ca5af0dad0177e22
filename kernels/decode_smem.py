"""Decode tiles with V upcast in shared memory: sm_121's (mma.sync, no wgmma), gfx942's, and every
target's tiles for the row-scaled layout. Per tile, after QK^T:
  V_f16 = upcast(K_fp8[:, :d_v]) in shared memory: e4m3 values are exact in fp16, HBM traffic stays fp8
  O += P_f16 . V_f16           fp16 product (P in [0, 1] keeps 11 bits, vs bf16's 8)
The row-scaled layout (kv rows times kv_scale[row]; reference.row_scales) multiplies a tile's
scores and P by its rows' scales, and runs P.V in bf16.
"""

import tilelang.language as T
from dsaops.kernels.decode_parts import (
    alloc_operands,
    alloc_row_ids,
    decode_kernel,
    gather,
    mask_scores,
    online_softmax,
    prologue,
    reciprocals,
    scores,
    write_lse,
)

STAGE_PAD = 8  # bf16 columns past each staged output row (write_split): 16 bytes, 4 banks


@T.macro
def write_split(acc_o, row_sum, m, inv_sum, staged, out, lse, H, s_i, sp, h0, col0, scale2, with_lse):
    """A split's result: out columns [col0, col0 + width of acc_o) = acc_o / row_sum with one
    reciprocal a head, and with_lse its natural-log lse. The bf16 rows go through `staged` where
    given (shared, acc_o's shape with STAGE_PAD more columns: 8 rows of 1,024 B would share their
    banks) and leave in 16-byte stores (from the accumulator's layout it takes 4-byte stores, each
    with its own 64-bit address)."""
    heads, cols = acc_o.shape
    reciprocals(row_sum, inv_sum)
    if staged is None:
        for h, d in T.Parallel(heads, cols):
            if h0 + h < H:
                out[s_i, sp * H + h0 + h, col0 + d] = (acc_o[h, d] * inv_sum[h]).astype(T.bfloat16)
    else:
        for h, d in T.Parallel(heads, cols):
            staged[h, d] = (acc_o[h, d] * inv_sum[h]).astype(T.bfloat16)
        for h, d in T.Parallel(heads, cols):
            if h0 + h < H:
                out[s_i, sp * H + h0 + h, col0 + d] = staged[h, d]
    if with_lse:
        write_lse(row_sum, m, lse, H, s_i, sp, h0, scale2)


def decode_program(tile, d_v: int, d_tail: int, fp8_dtype: str = "float8_e4m3fn", row_stats_in_shared: bool = False,
                   row_scaled: bool = False, pdl: bool = False, wgmma: bool = False):
    """The decode prim_func for one tile (kernels/tiles.py) with V in shared memory: the contract of
    decode_parts.decode_kernel. Any top-k: positions past it read as -1 (decode_parts.load_row_ids);
    a split may own at most tile.index_rows of it (the host splits further).
    row_stats_in_shared: pass the per-head rescale and reciprocal sum to the PV accumulator's
    layout through shared memory. Needed where mma.sync (no wgmma) gives the score and output
    fragments different row owners, which TileLang rejects as a layout conflict (sm_121's 64-head
    tile).
    pdl: the kernel overlaps its launch with the kernel before it (decode_parts.overlap_launches;
    targets with "pdl" in the targets table).
    row_scaled: the row-scaled layout. A tile's scales multiply its scores, and P before the PV
    product; P and V are then bf16 (V's fp8 values exactly, P scaled by any power: fp16's range
    would lose tiny scales), 2^-9 instead of 2^-11.
    wgmma: QK^T's products are Hopper's wgmma (64-head tiles on sm_90): issued back to back."""
    HB, BI = tile.heads_per_block, tile.block_rows
    D, Dt = d_v, d_tail
    acc = T.float32
    pv = T.bfloat16 if row_scaled else T.float16
    if tile.pairs or tile.v_in_registers:
        raise ValueError(f"V from registers and the two-split cluster that merges its accumulators are "
                         f"decode_regs' (pv_registers.cuh), not this kernel's: {tile}")

    @T.macro
    def block(q, kv, kv_scale, indices, sm_scale, split_rows, n_split, out, lse, H, s_i, hb, sp):
        operands = alloc_operands(HB, BI, D, Dt, fp8_dtype)
        q_hi, q_lo, k_s, qt_hi, qt_lo, kt_s = operands[:6]
        if row_scaled:
            sc_s = T.alloc_shared([BI], acc)
        v_s = T.alloc_shared([BI, D], pv)
        p_s = T.alloc_shared([HB, BI], pv)
        row_ids = alloc_row_ids(tile.index_rows, BI)
        ids, masked = row_ids[:2]

        acc_s = T.alloc_fragment([HB, BI], acc)
        acc_o = T.alloc_fragment([HB, D], acc)
        m = T.alloc_fragment([HB], acc)
        m_tile = T.alloc_fragment([HB], acc)
        alpha = T.alloc_shared([HB], acc) if row_stats_in_shared else T.alloc_fragment([HB], acc)
        inv_sum = T.alloc_shared([HB], acc) if row_stats_in_shared else T.alloc_fragment([HB], acc)
        sum_part = T.alloc_fragment([HB, BI], acc)
        row_sum = T.alloc_fragment([HB], acc)
        scale2 = T.alloc_fragment([HB], acc)

        h0 = hb * HB

        live_tiles = prologue(q, indices, operands, row_ids, acc_o, sum_part, m, scale2, sm_scale, split_rows, n_split,
                              H, s_i, sp, h0)

        for t in T.Pipelined(live_tiles, num_stages=tile.stages):
            base = t * BI
            gather(kv, ids, base, k_s, kt_s)
            if row_scaled:
                for r in T.Parallel(BI):
                    sc_s[r] = kv_scale[ids[base + r]]

            scores(q_hi, q_lo, qt_hi, qt_lo, k_s, kt_s, acc_s, False, wgmma)
            for r, d in T.Parallel(BI, D):
                v_s[r, d] = k_s[r, d].astype(pv)
            if row_scaled:
                for h, r in T.Parallel(HB, BI):
                    acc_s[h, r] = T.if_then_else(ids[base + r] >= 0, acc_s[h, r] * sc_s[r], -T.infinity(acc))
            elif masked[t] != 0:
                mask_scores(acc_s, ids, base, False)
            T.reduce_max(acc_s, m_tile, dim=1)

            online_softmax(acc_s, acc_o, m, m_tile, alpha, sum_part, scale2)
            if row_scaled:
                for h, r in T.Parallel(HB, BI):
                    p_s[h, r] = (acc_s[h, r] * sc_s[r]).astype(pv)
            else:
                T.copy(acc_s, p_s)
            T.gemm(p_s, v_s, acc_o, policy=T.GemmWarpPolicy.FullCol)

        T.reduce_sum(sum_part, row_sum, dim=1)
        staged = T.alloc_shared([HB, D + STAGE_PAD], T.bfloat16)  # TileLang places it over the dead V buffer
        write_split(acc_o, row_sum, m, inv_sum, staged, out, lse, H, s_i, sp, h0, 0, scale2, True)

    return decode_kernel(HB, D, Dt, fp8_dtype, tile.threads, block, pdl)
