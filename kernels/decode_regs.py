"""Hopper's decode tiles for the raw layout with V taken from registers (tiles.REGISTER_V_TILE and
its few-queries and narrow variants): P.V is computed transposed in fp8 by pv_registers.cuh
(hand-written CUDA imported into the kernel's source; P times 2^P_SHIFT as two e4m3 halves), so no
copy of V sits in shared memory, which frees it for 128-row tiles. The narrow tiles
(tiles.NARROW_TILES, 16 or 32 heads) compute the scores transposed too, S^T = K . Q^T, so that both
products take the heads as N instead of padding them to wgmma's M of 64. A call of two splits runs
the 128-row tiles as 2-CTA clusters that merge the pair themselves (tiles.PAIRED, cluster_pair).
"""

from pathlib import Path

import tilelang.language as T
from dsaops.kernels.decode_parts import (
    alloc_operands,
    alloc_row_ids,
    decode_kernel,
    gather,
    head_lse,
    mask_scores,
    online_softmax,
    prologue,
    reciprocals,
    scores,
    write_lse,
)
from tilelang.layout import make_full_bank_swizzled_layout

PV_REGISTERS = Path(__file__).parent / "pv_registers.cuh"  # P.V of these tiles
SHAPES = {(64, 64), (64, 128), (16, 128), (32, 128)}  # (heads, rows) of a tile pv_registers.cuh is written for
# P times 2^P_SHIFT (the shift rides in the exponent, no multiply) is split into two e4m3 halves
# (pv_registers.cuh): P <= 2^8 stays under e4m3's 448 and P down to 2^-14 stays a normal e4m3 (2^-8
# relative, not the subnormals' 2^-10 absolute). The row sums add the scaled P, so the output's
# reciprocal sum takes it back out; the lse subtracts the shift
P_SHIFT = 8.0


def fp8_halves(p, dtype):
    """P (already times 2^P_SHIFT) as two e4m3 values (hi, lo) whose sum carries it to 2^-8
    relative, for the narrow tiles (the 64-head tiles' P: pv_registers.cuh's store_p, the same
    split). P - hi is taken in fp16 (hi is exact there, P rounds by 2^-11): packed conversions and
    one subtraction a pair instead of fp32's unpack, widen and two subtractions."""
    hi = p.astype(dtype)
    return hi, (p.astype(T.float16) - hi.astype(T.float16)).astype(dtype)


def scores_layout(heads, rows):
    """The 64-head tiles' [heads, rows] scores as wgmma's accumulator holds them, pinned so that
    pv_registers.cuh's store_p can take them by address: warpgroup g the rows (rows / 2)g.., warp w
    heads 16w.., and register 4c + 2i + j of lane l head 16w + 8i + l / 4, row 8c + 2(l % 4) + j of
    its warpgroup's."""
    half = rows // 2
    return T.Fragment([heads, rows],
                      forward_thread_fn=lambda h, r: r // half * 128 + h // 16 * 32 + h % 8 * 4 + r % 8 // 2,
                      forward_index_fn=lambda h, r: r % half // 8 * 4 + h % 16 // 8 * 2 + r % 2)


def k_position(row):
    """Where P of tile row `row` sits along P.V's k: row bits (r4, r3, r2, r1, r0) at position bits
    (r4, r2, r1, r3, r0), the order pv_registers.cuh's v_fragment reads V in (k_row), which keeps its
    loads free of bank conflicts. Bits above r4 stay (each 32-row k-step is its own)."""
    return row // 16 * 16 + row // 2 % 4 * 4 + row // 8 % 2 * 2 + row % 2


def stacked_halves(tile) -> bool:
    """Whether the tile keeps q's two halves as one operand, lo below hi (alloc_operands' stacked),
    for one product twice as wide (scores' acc_both): against two products, on the H200 1.5-3%
    faster on the 16-head tile at S >= 64, 3% slower on the 32-head one at S = 16 and 64."""
    return tile.transposed_scores and tile.heads_per_block == 16


def loop_schedule(narrow: bool, stacked: bool, tail: bool) -> tuple[list[int], list[int]]:
    """T.Pipelined's (order, stage) for decode_program's tile loop, an entry a statement of its body:
    the gather's (row ids into registers, the rows, the tail's rows) in stage 0, a tile ahead of the
    rest. TileLang 0.1.12's own plan gives the row ids' load (shared memory to registers) the stage
    of the statements after the copy, which then cannot feed it; it checks the count when it compiles."""
    copies = 3 if tail else 2
    scores = (4 if tail else 3) if stacked else (4 if tail else 2)
    # the mask, the row max, the softmax's two loops, add_row_sums' four (64 heads), alpha's store,
    # settle, P's store and P.V
    rest = 4 + (0 if narrow else 4) + 4
    n = copies + scores + rest
    return list(range(n)), [0] * copies + [1] * (n - copies)


def exp2_approx(x):
    """2^x by the hardware approximation (ex2.approx.ftz, pv_registers.cuh): exp2f adds a range
    check and two multiplies a value for results below 2^-126, which P.V cannot see anyway."""
    return T.call_extern("float32", "dsaops_pv::exp2_approx", x)


@T.macro
def add_row_sums(acc_s, sum_part, alpha):
    """sum_part = sum_part * alpha + P for a 64-head tile's [heads, rows] scores, four of a thread's
    probabilities into each of its partial sums (sum_part [heads, rows / 4]; the caller reduces it
    after the last tile). wgmma's accumulator gives a thread columns 8c + 2(lane % 4) + {0, 1} of
    its warpgroup's rows / 2, so j, j + 1, j + rows / 4 and j + rows / 4 + 1 share a thread: a
    per-column sum_part would hold 32 more registers a thread, which the tile does not have."""
    rows = acc_s.shape[1]
    half, quarter, eighth = rows // 2, rows // 4, rows // 8
    for i, k in T.Parallel(*sum_part.shape):
        sum_part[i, k] = sum_part[i, k] * alpha[i] + acc_s[i, (k // eighth) * half + (k % eighth) * 2]
    for i, k in T.Parallel(*sum_part.shape):
        sum_part[i, k] = sum_part[i, k] + acc_s[i, (k // eighth) * half + (k % eighth) * 2 + 1]
    for i, k in T.Parallel(*sum_part.shape):
        sum_part[i, k] = sum_part[i, k] + acc_s[i, (k // eighth) * half + (k % eighth) * 2 + quarter]
    for i, k in T.Parallel(*sum_part.shape):
        sum_part[i, k] = sum_part[i, k] + acc_s[i, (k // eighth) * half + (k % eighth) * 2 + quarter + 1]


@T.macro
def cluster_pair(acc_o, row_sum, m, inv_sum, q_s, out, lse, H, s_i, h0, scale2, shift):
    """The two splits of a query (a 2-CTA cluster, tiles.PAIRED) merge through distributed shared
    memory (pv_registers.cuh's cluster_pair): each block keeps the output columns of one of its
    warpgroups and receives the other block's share of them, bf16, where Q's high half was (q_s:
    heads x 512 B, as many bytes as that share), with that block's lse a head. No partial leaves the SMs and no
    merge kernel runs."""
    HB = inv_sum.shape[0]
    lse_pair = T.alloc_shared([2, HB], T.float32)  # natural log a head: this block's, the other's
    for h in T.Parallel(HB):
        lse_pair[0, h] = head_lse(row_sum[h], m[h], scale2[h], shift)
    T.call_extern("handle", f"dsaops_pv::cluster_pair<{HB}>", T.address_of(acc_o[0]), T.access_ptr(out[s_i, h0, 0], "w"),
                  T.access_ptr(inv_sum, "r"), T.access_ptr(lse_pair, "rw"), T.access_ptr(q_s, "rw"),
                  T.access_ptr(lse[s_i, h0], "w"), H - h0)


def decode_program(tile, d_v: int, d_tail: int, fp8_dtype: str = "float8_e4m3fn", pdl: bool = False):
    """The decode prim_func for one V-in-registers tile (kernels/tiles.py), raw layout, Hopper: the
    contract of decode_parts.decode_kernel. Any top-k: positions past it read as -1
    (decode_parts.load_row_ids); a split may own at most tile.index_rows of it (the host splits further).
    pdl: the kernel overlaps its launch with the kernel before it (decode_parts.overlap_launches)."""
    HB, BI = tile.heads_per_block, tile.block_rows
    D, Dt = d_v, d_tail
    acc = T.float32
    narrow = tile.transposed_scores  # 16 or 32 heads: S^T = K . Q^T, the heads as both products' N
    stacked = stacked_halves(tile)
    if (HB, BI) not in SHAPES or tile.threads != 256 or tile.stages != 2 or D != 512 or not tile.v_in_registers:
        raise ValueError(f"V from registers (pv_registers.cuh) is written for the raw layout's tiles of 64 heads "
                         f"and 64 or 128 rows, or 16 or 32 heads and 128 rows (two warpgroups' 64-row products), "
                         f"256 threads, 2 stages and d_v 512, not {tile} with d_v {D}")
    score_shape = [BI, HB] if narrow else [HB, BI]
    pv_source = PV_REGISTERS.read_text()
    # V fragments in flight (pv_registers.cuh's tile): the 64-head tiles with a d_tail hold the tail's
    # gather and product too, and ptxas spilled ~550 B a thread with two
    pv_fragments = 1 if HB == 64 and Dt else 2
    order, stage = loop_schedule(narrow, stacked, bool(Dt))

    @T.macro
    def block(q, kv, kv_scale, indices, sm_scale, split_rows, n_split, out, lse, H, s_i, hb, sp):
        T.import_source(pv_source)
        operands = alloc_operands(HB, BI, D, Dt, fp8_dtype, cuda_split=True, stacked=stacked)
        q_hi, q_lo, k_s, qt_hi, qt_lo, kt_s = operands[:6]
        # P by hand: its two e4m3 halves, each one 128-byte swizzle atom wide, the product's B operand,
        # read by hand in the layout its descriptor names
        p_s = T.alloc_shared([2, HB, 128], fp8_dtype)
        # q's halves are written by hand too (pv_registers.cuh's split_q, in kv_offset's layout)
        swizzled = [b for b in (p_s, q_hi, q_lo) if b is not None]
        T.annotate_layout({b: make_full_bank_swizzled_layout(b) for b in swizzled})
        row_ids = alloc_row_ids(tile.index_rows, BI)
        ids, masked = row_ids[:2]

        acc_s = T.alloc_fragment(score_shape, acc)
        if not narrow:  # store_p reads it by address
            T.annotate_layout({acc_s: scores_layout(HB, BI)})
        acc_both = T.alloc_fragment([BI, 2 * HB], acc) if stacked else None  # both halves' scores (scores)
        acc_o = T.alloc_local([HB * D // tile.threads], acc)  # O^T in the layout pv_registers.cuh gives it
        m = T.alloc_fragment([HB], acc)
        m_tile = T.alloc_fragment([HB], acc)
        alpha = T.alloc_fragment([HB], acc)
        inv_sum = T.alloc_shared([HB], acc)  # the registers' layout reads the rescale and 1 / sum by head
        alpha_s = T.alloc_shared([HB], acc)
        # per column of the scores (narrow tiles), or a quarter of that (add_row_sums)
        sum_part = T.alloc_fragment(score_shape if narrow else [HB, BI // 4], acc)
        row_sum = T.alloc_fragment([HB], acc)
        scale2 = T.alloc_shared([HB], acc)

        h0 = hb * HB

        # Q and the query's row ids (every split reads some of them) into L2 at once: the row ids'
        # load no longer waits out Q's HBM latency
        T.call_extern("handle", "dsaops_pv::prefetch_l2", T.access_ptr(q[s_i, h0, 0], "r"),
                      T.min(HB, H - h0) * (D + Dt) * 2)
        T.call_extern("handle", "dsaops_pv::prefetch_l2", T.access_ptr(indices[s_i, 0, 0], "r"),
                      T.shift_left(T.shift_right(indices.shape[2], 2), 4))
        live_tiles = prologue(q, indices, operands, row_ids, acc_o, sum_part, m, scale2, sm_scale, split_rows, n_split,
                              H, s_i, sp, h0, kv)

        for t in T.Pipelined(live_tiles, order=order, stage=stage):  # loop_schedule counts its statements
            base = t * BI
            gather(kv, ids, base, k_s, kt_s, True)
            scores(q_hi, q_lo, qt_hi, qt_lo, k_s, kt_s, acc_s, narrow, True, acc_both)
            if masked[t] != 0:
                mask_scores(acc_s, ids, base, narrow)
            if narrow:
                # a head's rows span all 8 warps: one exchange for all of a thread's heads, not one a
                # head (each 6 barriers)
                T.reduce_max(acc_s, m_tile, dim=0, batch=HB // 4)
            else:
                T.reduce_max(acc_s, m_tile, dim=1)

            # P times 2^P_SHIFT, for its e4m3 halves; the rescale is the product's (tile)
            online_softmax(acc_s, None, m, m_tile, alpha, sum_part if narrow else None, scale2, transposed=narrow,
                           shift=P_SHIFT, exp2=exp2_approx)
            if not narrow:
                add_row_sums(acc_s, sum_part, alpha)
            for h in T.Parallel(HB):
                alpha_s[h] = alpha[h]
            T.call_extern("handle", "dsaops_pv::settle")  # the last tile's product has read P
            # P^T's rows are the heads: [h, r] of a score fragment [r, h] (narrow) or [h, r], each
            # row at its k_position
            if narrow:
                for i, j in T.Parallel(*score_shape):
                    hi, lo = fp8_halves(acc_s[i, j], fp8_dtype)
                    p_s[0, j, k_position(i)] = hi
                    p_s[1, j, k_position(i)] = lo
            else:
                T.call_extern("handle", f"dsaops_pv::store_p<{BI}, {HB}>", T.address_of(acc_s[0, 0]),
                              T.access_ptr(p_s, "w"))
            # rescale by alpha, then O^T += V^T . P^T with V moved from k_s into registers
            T.call_extern("handle", f"dsaops_pv::tile<{BI}, {HB}, {pv_fragments}>", T.address_of(acc_o[0]),
                          T.access_ptr(k_s, "r"), T.access_ptr(p_s, "r"), T.access_ptr(alpha_s, "r"))

        T.reduce_sum(sum_part, row_sum, dim=0 if narrow else 1)
        reciprocals(row_sum, inv_sum)
        if tile.pairs:
            cluster_pair(acc_o, row_sum, m, inv_sum, q_hi, out, lse, H, s_i, h0, scale2, P_SHIFT)
        else:
            T.call_extern("handle", f"dsaops_pv::store<{HB}>", T.address_of(acc_o[0]),
                          T.access_ptr(out[s_i, sp * H + h0, 0], "w"), T.access_ptr(inv_sum, "r"), H - h0)
            write_lse(row_sum, m, lse, H, s_i, sp, h0, scale2, P_SHIFT)

    return decode_kernel(HB, D, Dt, fp8_dtype, tile.threads, block, pdl, pairs=tile.pairs)
