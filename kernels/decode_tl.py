"""TileLang programs for raw-fp8 sparse-MLA decode (the kernels; the host side is decode.py).

One block owns one query and up to 64 of its heads, so each gathered KV tile is read from HBM
once for all of them (SGLang 0.5.23 uses 16-head blocks and reads every tile four times at
H=64). Per tile of `block_rows` top-k rows:
  gather fp8 rows -> shared (pipelined, `stages` deep; masked rows zero-filled, never read)
  S = Q_fp8 . K_fp8^T          fp8 tensor-core product, both operands K-major (wgmma on sm_90)
  online softmax in fp32       masked rows forced to -inf after the product
  V_f16 = upcast(K_fp8[:, :d_v]) in shared memory: e4m3 values are exact in fp16, HBM traffic stays fp8
  O += P_f16 . V_f16           fp16 product (P in [0, 1] keeps 11 bits, vs bf16's 8)
A split over top-k (grid z) writes per-split outputs (bf16) and log-sum-exps, split k's heads at
rows k*H.. of one [S, n_split*H] tensor; `combine` merges them in fp32. With one split the decode
kernel's output is the answer as it is (no view a call). Every shape that varies per call
(S, H, top-k, pool slots, split count) is symbolic: one compiled kernel per (tile, d_tail).

Hopper's tiles for the raw layout (tiles.REGISTER_V_TILE) take V from registers instead: no fp16
copy of V in shared memory, P.V computed transposed in fp8 by pv_registers.cuh (hand-written CUDA
imported into the kernel's source; P times 2^P_SHIFT as two e4m3 halves), which frees the shared
memory for 128-row tiles. Its narrow tiles
(tiles.NARROW_TILES, 16 or 32 heads) compute the scores transposed too, S^T = K . Q^T, so that both
products take the heads as N instead of padding them to wgmma's M of 64. A call of two splits runs
these 128-row tiles as 2-CTA clusters that merge the pair themselves (tiles.PAIRED, cluster_pair).
"""

from pathlib import Path

import tilelang.language as T
from tilelang.layout import make_full_bank_swizzled_layout

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_BIG = -(2.0**30)  # a finite "minus infinity" for the running max: avoids inf - inf = NaN
PV_REGISTERS = Path(__file__).parent / "pv_registers.cuh"  # P.V of tiles with v_in_registers
REGISTER_V_SHAPES = {(64, 64), (64, 128), (16, 128), (32, 128)}  # (heads, rows) a tile it is written for
STAGE_PAD = 8  # bf16 columns past each staged output row (write_split): 16 bytes, 4 banks
# V-in-registers tiles compute P times 2^P_SHIFT (the shift rides in the exponent, no multiply) and
# split it into two e4m3 halves (pv_registers.cuh): P <= 2^8 stays under e4m3's 448 and P down to
# 2^-14 stays a normal e4m3 (2^-8 relative, not the subnormals' 2^-10 absolute). The row sums add
# the scaled P, so the output's reciprocal sum takes it back out; the lse subtracts the shift
P_SHIFT = 8.0


def decode_kernel(heads_per_block: int, d_v: int, d_tail: int, fp8_dtype: str, threads: int, block, pdl: bool,
                  pairs: bool = False):
    """The prim_func both decode kernels share: the signature the host calls and the grid, one axis
    each for query, head block and split (so no address needs a run-time division). `block`, a
    T.macro, is one block's work: block(q, kv, kv_scale, indices, sm_scale, split_rows, out, lse, H,
    s_i, hb, sp). S, H, top-k, pool slots and the split count are symbolic; the rows each split owns
    come as the scalar `split_rows` (a multiple of the tile's rows): derived from top-k and the split
    count it cost a 32-bit division per use. out and lse hold split sp's heads at rows sp*H.., so
    that with one split they are [S, H, d_v] and [S, H], the answer without a view. kv_scale is the
    row-scaled layout's [slots] scales; a raw-layout kernel never reads it (the host passes any
    float32 vector: one signature for both). pdl: overlap_launches first. pairs: exactly two splits,
    each pair a cluster of two blocks whose `block` writes the merged answer (cluster_pair): out and
    lse are then [S, H, d_v] and [S, H] as with one split."""
    S, H, topk, slots, split_heads, scales = (T.dynamic(n) for n in ("S", "H", "topk", "slots", "split_heads", "scales"))
    width = d_v + d_tail
    out_heads = H if pairs else split_heads

    @T.prim_func
    def decode(
        q: T.Tensor([S, H, width], T.bfloat16),
        kv: T.Tensor([slots, 1, width], fp8_dtype),
        kv_scale: T.Tensor([scales], T.float32),
        indices: T.Tensor([S, 1, topk], T.int32),
        sm_scale: T.float32,
        split_rows: T.int32,
        out: T.Tensor([S, out_heads, d_v], T.bfloat16),
        lse: T.Tensor([S, out_heads], T.float32),
    ):
        # cluster_dims (1, 1, 1) is a plain launch (TileLang sets no cluster attribute)
        with T.ClusterKernel(S, T.ceildiv(H, heads_per_block), 2 if pairs else split_heads // H,
                             cluster_dims=(1, 1, 2 if pairs else 1), threads=threads) as (s_i, hb, sp):
            if pdl:
                overlap_launches()
            block(q, kv, kv_scale, indices, sm_scale, split_rows, out, lse, H, s_i, hb, sp)

    return decode


@T.macro
def overlap_launches():
    """Programmatic dependent launch: this kernel may start while the one before it in the stream
    finishes, and waits for it (and its memory) here, before reading anything; the kernel after it
    may start at once and waits likewise. What overlaps is the launch latency: at S=1 a decode call
    is two short kernels back to back. The host launches a kernel that waits this way with the
    programmatic-serialization attribute (TileLang marks it)."""
    T.pdl_sync()
    T.pdl_trigger()


@T.macro
def load_q(q, dst, H, s_i, h0, col0):
    """Columns [col0, col0 + width of dst) of heads h0.. of query s_i, as fp8 into dst. Padded heads
    (past H) get zero rows: their scores are 0, harmless, never written out."""
    heads, cols = dst.shape
    for h, d in T.Parallel(heads, cols):
        dst[h, d] = T.if_then_else(h0 + h < H, q[s_i, h0 + h, col0 + d], 0).astype(dst.dtype)


@T.macro
def reciprocals(row_sum, inv_sum):
    """One reciprocal a head of the row sum; 0 for a split with every row masked (row_sum 0):
    zeros, never NaN."""
    for h in T.Parallel(row_sum.shape[0]):
        inv_sum[h] = T.if_then_else(row_sum[h] == 0, 0.0, 1.0 / row_sum[h])


def fp8_halves(p, dtype):
    """P (already times 2^P_SHIFT) as two e4m3 values (hi, lo) whose sum carries it to 2^-8
    relative. P - hi is taken in fp16 (hi is exact there, P rounds by 2^-11): packed conversions and
    one subtraction a pair instead of fp32's unpack, widen and two subtractions."""
    hi = p.astype(dtype)
    return hi, (p.astype(T.float16) - hi.astype(T.float16)).astype(dtype)


def exp2_approx(x):
    """2^x by the hardware approximation (ex2.approx.ftz, pv_registers.cuh): exp2f adds a range
    check and two multiplies a value for results below 2^-126, which P.V cannot see anyway."""
    return T.call_extern("float32", "dsaops_pv::exp2_approx", x)


def head_lse(row_sum, m, scale2, shift=0.0):
    """A head's natural-log lse from its row sum and running max (log2 units of scale2; shift: the
    log2 factor the row sum carries, P_SHIFT where P was scaled): -inf where every row was masked."""
    return T.if_then_else(row_sum == 0, -T.infinity(T.float32), (T.log2(row_sum) - shift + m * scale2) * LN2)


@T.macro
def write_lse(row_sum, m, lse, H, s_i, sp, h0, scale2, shift=0.0):
    """A split's lse a head."""
    for h in T.Parallel(row_sum.shape[0]):
        if h0 + h < H:
            lse[s_i, sp * H + h0 + h] = head_lse(row_sum[h], m[h], scale2, shift)


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


@T.macro
def cluster_pair(acc_o, row_sum, m, inv_sum, q_s, out, lse, H, s_i, h0, scale2, shift):
    """The two splits of a query (a 2-CTA cluster, tiles.PAIRED) merge through distributed shared
    memory (pv_registers.cuh's cluster_pair): each block keeps the output columns of one of its
    warpgroups and receives the other block's share of them, bf16, where Q was (q_s: heads x 512 B,
    as many bytes as that share), with that block's lse a head. No partial leaves the SMs and no
    merge kernel runs."""
    HB = inv_sum.shape[0]
    lse_pair = T.alloc_shared([2, HB], T.float32)  # natural log a head: this block's, the other's
    for h in T.Parallel(HB):
        lse_pair[0, h] = head_lse(row_sum[h], m[h], scale2, shift)
    T.call_extern("handle", f"dsaops_pv::cluster_pair<{HB}>", T.address_of(acc_o[0]), T.access_ptr(out[s_i, h0, 0], "w"),
                  T.access_ptr(inv_sum, "r"), T.access_ptr(lse_pair, "rw"), T.access_ptr(q_s, "rw"),
                  T.access_ptr(lse[s_i, h0], "w"), H - h0)


@T.macro
def online_softmax(acc_s, acc_o, m, m_tile, alpha, sum_part, scale2, transposed=False, shift=0.0, exp2=T.exp2):
    """One tile of online softmax: scores -> probabilities (in acc_s, at most 2^shift), added into
    sum_part, and acc_o rescaled (acc_o None: the caller rescales it, from alpha).
    m_tile holds the max the running max is measured against (the caller's reduction: the tile's own
    row max, or with decode_ws the max over both warpgroups' tiles, so that both keep the same m).

    The running max follows every tile and the accumulator is rescaled every tile: a lazy rescale's
    block-uniform branch needs a shared flag and two more barriers a tile, which cost more than the
    multiplies they save. sum_part has acc_s's shape: each thread sums its own columns, and the
    caller reduces it across threads once, after the last tile (a reduction a tile would cost two
    cross-warpgroup exchanges through shared memory).
    transposed: acc_s and sum_part are [rows, heads] (decode_program's narrow tiles)."""
    heads = m.shape[0]
    for h in T.Parallel(heads):
        alpha[h] = T.exp2((m[h] - T.max(m[h], m_tile[h])) * scale2)
        m[h] = T.max(m[h], m_tile[h])
    if acc_o is not None:
        for h, d in T.Parallel(heads, acc_o.shape[1]):
            acc_o[h, d] *= alpha[h]
    # in the fragment's own axis order: TileLang gave a [rows, heads] fragment iterated as
    # [heads, rows] another register layout, and the tile one barrier more
    for i, j in T.Parallel(*acc_s.shape):
        acc_s[i, j] = exp2(acc_s[i, j] * scale2 - (m[j if transposed else i] * scale2 - shift))
        sum_part[i, j] = sum_part[i, j] * alpha[j if transposed else i] + acc_s[i, j]


def decode_program(tile, d_v: int, d_tail: int, fp8_dtype: str = "float8_e4m3fn", row_stats_in_shared: bool = False,
                   row_scaled: bool = False, pdl: bool = False):
    """The decode prim_func for one tile (kernels/tiles.py). Writes out [S, n_split * H, d_v] bf16
    (each split's softmax-normalised output; n_split=1 is the final answer) and lse [S, n_split * H]
    fp32 (natural log, -inf where the split saw no unmasked row). H, S, top-k, slots, n_split are
    run-time shapes; top-k must be a multiple of block_rows * n_split (the host pads with -1) and a
    split may own at most tile.index_rows of it (the host splits further).
    row_stats_in_shared: pass the per-head rescale and reciprocal sum to the PV accumulator's
    layout through shared memory. Needed where mma.sync (no wgmma) gives the score and output
    fragments different row owners, which TileLang rejects as a layout conflict (sm_121's 64-head
    tile).
    pdl: the kernel overlaps its launch with the kernel before it (overlap_launches; targets with
    "pdl" in the targets table).
    row_scaled: the row-scaled layout (kv rows times kv_scale[row]; reference.row_scales). A tile's
    scales multiply its scores, and P before the PV product; P and V are then bf16 (V's fp8 values
    exactly, P scaled by any power: fp16's range would lose tiny scales), 2^-9 instead of 2^-11."""
    HB, BI = tile.heads_per_block, tile.block_rows
    D, Dt = d_v, d_tail
    acc = T.float32
    pv = T.bfloat16 if row_scaled else T.float16
    regs = tile.v_in_registers
    narrow = tile.transposed_scores  # 16 or 32 heads: S^T = K . Q^T, the heads as both products' N
    if tile.pairs and not regs:
        raise ValueError(f"a two-split cluster merges V-in-registers accumulators (pv_registers.cuh): not {tile}")
    if regs and ((HB, BI) not in REGISTER_V_SHAPES or tile.threads != 256 or D != 512 or row_scaled):
        raise ValueError(f"V from registers (pv_registers.cuh) is written for the raw layout's tiles of 64 heads "
                         f"and 64 or 128 rows, or 16 or 32 heads and 128 rows (two warpgroups' 64-row products), "
                         f"256 threads and d_v 512, not {tile} with d_v {D}" + (" row-scaled" if row_scaled else ""))
    score_shape = [BI, HB] if narrow else [HB, BI]
    pv_source = PV_REGISTERS.read_text() if regs else None  # read once a program, only where it is used
    # V fragments in flight (pv_registers.cuh's tile): the 64-head tiles with a d_tail hold the tail's
    # gather and product too, and ptxas spilled ~550 B a thread with two
    pv_fragments = 1 if HB == 64 and Dt else 2

    @T.macro
    def block(q, kv, kv_scale, indices, sm_scale, split_rows, out, lse, H, s_i, hb, sp):
        if regs:
            T.import_source(pv_source)
        q_s = T.alloc_shared([HB, D], fp8_dtype)
        k_s = T.alloc_shared([BI, D], fp8_dtype)
        if Dt:
            qt_s = T.alloc_shared([HB, Dt], fp8_dtype)
            kt_s = T.alloc_shared([BI, Dt], fp8_dtype)
        if row_scaled:
            sc_s = T.alloc_shared([BI], acc)
        if not regs:
            v_s = T.alloc_shared([BI, D], pv)
        # P by hand (V in registers): its two e4m3 halves, each one 128-byte swizzle atom wide
        p_s = T.alloc_shared([2, HB, 128], fp8_dtype) if regs else T.alloc_shared([HB, BI], pv)
        if regs:  # the product's B operand, read by hand: the layout its descriptor names
            T.annotate_layout({p_s: make_full_bank_swizzled_layout(p_s)})
        # The split's row ids, loaded once: each tile's gather addresses and masks then come from
        # shared memory instead of a dependent global load (an HBM latency) per tile.
        ids = T.alloc_shared([tile.index_rows], T.int32, scope="shared")
        # 1 for a tile of the split with a masked (-1) row: only those tiles' scores are masked (the
        # mask reads each score's row id, and DSA's top-k is full once a context has 2,048 tokens)
        masked = T.alloc_shared([tile.index_rows // BI], T.int32, scope="shared")

        acc_s = T.alloc_fragment(score_shape, acc)
        # O^T in the layout pv_registers.cuh gives it, or O as TileLang lays it out
        acc_o = T.alloc_local([HB * D // tile.threads], acc) if regs else T.alloc_fragment([HB, D], acc)
        m = T.alloc_fragment([HB], acc)
        m_tile = T.alloc_fragment([HB], acc)
        alpha = T.alloc_shared([HB], acc) if row_stats_in_shared else T.alloc_fragment([HB], acc)
        # the registers' layout reads the rescale and 1 / sum by head, from shared memory
        inv_sum = T.alloc_shared([HB], acc) if row_stats_in_shared or regs else T.alloc_fragment([HB], acc)
        if regs:
            alpha_s = T.alloc_shared([HB], acc)
        sum_part = T.alloc_fragment(score_shape, acc)
        row_sum = T.alloc_fragment([HB], acc)

        h0 = hb * HB
        scale2 = sm_scale * LOG2E

        if regs:  # Q and the row ids into L2 at once: the row ids' load no longer waits out Q's HBM latency
            T.call_extern("handle", "dsaops_pv::prefetch_l2", T.access_ptr(q[s_i, h0, 0], "r"),
                          T.min(HB, H - h0) * (D + Dt) * 2)
            T.call_extern("handle", "dsaops_pv::prefetch_l2", T.access_ptr(indices[s_i, 0, sp * split_rows], "r"),
                          split_rows * 4)
        load_q(q, q_s, H, s_i, h0, 0)
        if Dt:
            load_q(q, qt_s, H, s_i, h0, D)
        for r in T.Parallel(tile.index_rows):
            ids[r] = T.if_then_else(r < split_rows, indices[s_i, 0, sp * split_rows + r], -1)
        for i in T.Parallel(tile.index_rows // BI):
            masked[i] = 0
        for r in T.Parallel(tile.index_rows):
            if ids[r] < 0:
                masked[r // BI] = 1  # every writer writes 1
        T.fill(acc_o, 0)
        T.fill(sum_part, 0)
        T.fill(m, NEG_BIG)

        for t in T.Pipelined(split_rows // BI, num_stages=tile.stages):
            base = t * BI
            # Row ids index kv unclamped: TileLang's bounds guard then predicates each cp.async on
            # 0 <= id < slots and zero-fills masked (-1) rows, so they are never read, V needs no mask,
            # and a NaN in slot 0 cannot leak (tests/kernels/test_decode_gpu.py puts one there).
            for r, d in T.Parallel(BI, D):
                k_s[r, d] = kv[ids[base + r], 0, d]
            if Dt:
                for r, d in T.Parallel(BI, Dt):
                    kt_s[r, d] = kv[ids[base + r], 0, D + d]
            if row_scaled:
                for r in T.Parallel(BI):
                    sc_s[r] = kv_scale[ids[base + r]]

            if narrow:  # S^T = K . Q^T: each warpgroup's product is 64 rows (M) by the heads (N)
                T.gemm(k_s, q_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if Dt:
                    T.gemm(kt_s, qt_s, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                if masked[t] != 0:
                    for r, h in T.Parallel(BI, HB):
                        acc_s[r, h] = T.if_then_else(ids[base + r] >= 0, acc_s[r, h], -T.infinity(acc))
                # a head's rows span all 8 warps: one exchange for all of a thread's heads, not one a
                # head (each 6 barriers)
                T.reduce_max(acc_s, m_tile, dim=0, batch=HB // 4)
            else:
                T.gemm(q_s, k_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                if Dt:
                    T.gemm(qt_s, kt_s, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                if not regs:
                    for r, d in T.Parallel(BI, D):
                        v_s[r, d] = k_s[r, d].astype(pv)
                if row_scaled:
                    for h, r in T.Parallel(HB, BI):
                        acc_s[h, r] = T.if_then_else(ids[base + r] >= 0, acc_s[h, r] * sc_s[r], -T.infinity(acc))
                elif masked[t] != 0:
                    for h, r in T.Parallel(HB, BI):
                        acc_s[h, r] = T.if_then_else(ids[base + r] >= 0, acc_s[h, r], -T.infinity(acc))
                T.reduce_max(acc_s, m_tile, dim=1)

            if regs:  # P times 2^P_SHIFT, for its e4m3 halves; the rescale is the product's (tile)
                online_softmax(acc_s, None, m, m_tile, alpha, sum_part, scale2, transposed=narrow, shift=P_SHIFT,
                               exp2=exp2_approx)
                for h in T.Parallel(HB):
                    alpha_s[h] = alpha[h]
                T.call_extern("handle", "dsaops_pv::settle")  # the last tile's product has read P
            else:
                online_softmax(acc_s, acc_o, m, m_tile, alpha, sum_part, scale2)
            if row_scaled:
                for h, r in T.Parallel(HB, BI):
                    p_s[h, r] = (acc_s[h, r] * sc_s[r]).astype(pv)
            elif regs:  # P^T's rows are the heads: [h, r] of a score fragment [r, h] (narrow) or [h, r]
                for i, j in T.Parallel(*score_shape):
                    hi, lo = fp8_halves(acc_s[i, j], fp8_dtype)
                    p_s[0, j if narrow else i, i if narrow else j] = hi
                    p_s[1, j if narrow else i, i if narrow else j] = lo
            else:
                T.copy(acc_s, p_s)
            if regs:  # rescale by alpha, then O^T += V^T . P^T with V moved from k_s into registers
                T.call_extern("handle", f"dsaops_pv::tile<{BI}, {HB}, {pv_fragments}>", T.address_of(acc_o[0]),
                              T.access_ptr(k_s, "r"), T.access_ptr(p_s, "r"), T.access_ptr(alpha_s, "r"))
            else:
                T.gemm(p_s, v_s, acc_o, policy=T.GemmWarpPolicy.FullCol)

        T.reduce_sum(sum_part, row_sum, dim=0 if narrow else 1)
        if regs:
            reciprocals(row_sum, inv_sum)
        if tile.pairs:
            cluster_pair(acc_o, row_sum, m, inv_sum, q_s, out, lse, H, s_i, h0, scale2, P_SHIFT)
        elif regs:
            T.call_extern("handle", f"dsaops_pv::store<{HB}>", T.address_of(acc_o[0]),
                          T.access_ptr(out[s_i, sp * H + h0, 0], "w"), T.access_ptr(inv_sum, "r"), H - h0)
            write_lse(row_sum, m, lse, H, s_i, sp, h0, scale2, P_SHIFT)
        else:
            staged = T.alloc_shared([HB, D + STAGE_PAD], T.bfloat16)  # TileLang places it over the dead V buffer
            write_split(acc_o, row_sum, m, inv_sum, staged, out, lse, H, s_i, sp, h0, 0, scale2, True)

    return decode_kernel(HB, D, Dt, fp8_dtype, tile.threads, block, pdl, pairs=tile.pairs)


SPLITS_A_GROUP = 4  # splits whose rows one thread group of the merge reads (combine_program)


def combine_program(d_v: int, splits: int, *, threads: int = 64, pdl: bool = False, warp: int = 32):
    """Merge split partials in fp32: out = sum_k w_k o_k, w_k = exp(lse_k - max lse) / sum of them.
    One block a (query, head): splits / SPLITS_A_GROUP groups of `threads` threads, a thread reading
    16 bytes of the rows of its group's splits (all issued first); meanwhile the first warp takes one
    split a lane, so the max, the weights and their total are two warp reductions, and hands the
    weights over in shared memory. Groups add their sums in shared memory. Nothing a thread does grows
    with the split count beyond its group's rows (a merge whose every thread reads every split's lse
    and rows runs ~60 dependent instructions a split). `warp`: the target's lanes a warp
    (Target.warp_lanes), at least `splits`."""
    if splits > warp:
        raise ValueError(f"the merge takes one split a lane: at most {warp} splits, not {splits}")
    acc = T.float32
    S, H, split_heads = T.dynamic("S"), T.dynamic("H"), T.dynamic("split_heads")
    vec = d_v // threads
    groups = max(1, splits // SPLITS_A_GROUP)
    per = splits // groups

    @T.prim_func
    def combine(
        part_o: T.Tensor([S, split_heads, d_v], T.bfloat16),
        part_lse: T.Tensor([S, split_heads], acc),
        n_split: T.int32,
        out: T.Tensor([S, H, d_v], T.bfloat16),
        lse: T.Tensor([S, H], acc),
    ):
        with T.Kernel(S, H, threads=threads * groups) as (s_i, h):
            if pdl:
                overlap_launches()
            tid = T.get_thread_binding()
            g = tid // threads
            tx = tid % threads
            weight = T.alloc_shared([warp], acc)  # split k's share of the total (0 past n_split)
            stats = T.alloc_shared([2], acc)  # max lse, total
            parts = T.alloc_local([per, vec], T.bfloat16)
            o = T.alloc_local([vec], acc)
            x = T.alloc_local([1], acc)
            m = T.alloc_local([1], acc)
            e = T.alloc_local([1], acc)
            t = T.alloc_local([1], acc)
            for j in T.unroll(per):
                if g * per + j < n_split:
                    for v in T.vectorized(vec):
                        parts[j, v] = part_o[s_i, (g * per + j) * H + h, tx * vec + v]
            if tid < warp:
                x[0] = T.if_then_else(tid < n_split, part_lse[s_i, tid * H + h], -T.infinity(acc))
                m[0] = T.warp_reduce_max(x[0])
                # every split empty -> max = -inf: weights 0 instead of exp(-inf + inf) = NaN
                e[0] = T.if_then_else(m[0] > -T.infinity(acc), T.exp2((x[0] - m[0]) * LOG2E), 0)
                t[0] = T.warp_reduce_sum(e[0])
                weight[tid] = T.if_then_else(t[0] == 0, 0, e[0] / t[0])
                if tid == 0:
                    stats[0] = m[0]
                    stats[1] = t[0]
            T.sync_threads()
            for v in T.unroll(vec):
                o[v] = 0
            for j in T.unroll(per):
                if g * per + j < n_split:
                    for v in T.unroll(vec):
                        o[v] += weight[g * per + j] * parts[j, v]
            if groups > 1:
                sums = T.alloc_shared([groups, d_v], acc)
                for v in T.vectorized(vec):
                    sums[g, tx * vec + v] = o[v]
                T.sync_threads()
                for v in T.unroll(vec):
                    o[v] = 0
                    for gg in T.unroll(groups):
                        o[v] += sums[gg, tx * vec + v]
            if g == 0:
                for v in T.vectorized(vec):
                    out[s_i, h, tx * vec + v] = o[v].astype(T.bfloat16)
                if tx == 0:
                    lse[s_i, h] = T.if_then_else(stats[1] == 0, -T.infinity(acc), T.log(stats[1]) + stats[0])

    return combine
