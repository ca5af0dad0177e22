"""What every TileLang decode program shares (decode_regs.py and decode_smem.py are the two
families; decode.py the host side).

One block owns one query and up to 64 of its heads, so each gathered KV tile is read from HBM
once for all of them (SGLang 0.5.23 uses 16-head blocks and reads every tile four times at
H=64). Per tile of `block_rows` top-k rows:
  gather fp8 rows -> shared (pipelined, `stages` deep; masked rows zero-filled, never read)
  S = Q_fp8 . K_fp8^T          fp8 tensor-core product, both operands K-major (wgmma on sm_90)
  online softmax in fp32       masked rows forced to -inf after the product
  O += P . V                   the family's product (V from registers, or upcast in shared memory)
A split over top-k (grid z) writes per-split outputs (bf16) and log-sum-exps, split k's heads at
rows k*H.. of one [S, n_split*H] tensor; decode_merge merges them in fp32. With one split the
decode kernel's output is the answer as it is (no view a call). Every shape that varies per call
(S, H, top-k, pool slots, split count) is symbolic: one compiled kernel per (tile, d_tail).
"""

import tilelang.language as T

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_BIG = -(2.0**30)  # a finite "minus infinity" for the running max: avoids inf - inf = NaN


def decode_kernel(heads_per_block: int, d_v: int, d_tail: int, fp8_dtype: str, threads: int, block, pdl: bool,
                  pairs: bool = False):
    """The prim_func every decode kernel shares: the signature the host calls and the grid, one axis
    each for query, head block and split (so no address needs a run-time division). `block`, a
    T.macro, is one block's work: block(q, kv, kv_scale, indices, sm_scale, split_rows, out, lse, H,
    s_i, hb, sp). S, H, top-k, pool slots and the split count are symbolic; the rows each split owns
    come as the scalar `split_rows` (a multiple of the tile's rows): derived from top-k and the split
    count it cost a 32-bit division per use. out and lse hold split sp's heads at rows sp*H.., so
    that with one split they are [S, H, d_v] and [S, H], the answer without a view. kv_scale is the
    row-scaled layout's [slots] scales; a raw-layout kernel never reads it (the host passes any
    float32 vector: one signature for both). pdl: overlap_launches first. pairs: exactly two splits,
    each pair a cluster of two blocks whose `block` writes the merged answer (decode_regs.cluster_pair):
    out and lse are then [S, H, d_v] and [S, H] as with one split."""
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
def load_row_ids(indices, ids, masked, split_rows, s_i, sp, block_rows):
    """The split's row ids into shared memory, once: each tile's gather addresses and masks then come
    from shared memory instead of a dependent global load (an HBM latency) per tile. masked[t] is 1
    for a tile with a masked (-1) row: only those tiles' scores are masked (the mask reads each
    score's row id, and DSA's top-k is full once a context has 2,048 tokens)."""
    for r in T.Parallel(ids.shape[0]):
        ids[r] = T.if_then_else(r < split_rows, indices[s_i, 0, sp * split_rows + r], -1)
    for i in T.Parallel(masked.shape[0]):
        masked[i] = 0
    for r in T.Parallel(ids.shape[0]):
        if ids[r] < 0:
            masked[r // block_rows] = 1  # every writer writes 1


@T.macro
def gather(kv, ids, base, k_s, kt_s):
    """Tile rows ids[base..] of kv into k_s (the first d_v columns) and kt_s (the tail, or None).
    Row ids index kv unclamped: TileLang's bounds guard then predicates each cp.async on
    0 <= id < slots and zero-fills masked (-1) rows, so they are never read, V needs no mask, and a
    NaN in slot 0 cannot leak (tests/kernels/test_decode_gpu.py puts one there)."""
    rows, cols = k_s.shape
    for r, d in T.Parallel(rows, cols):
        k_s[r, d] = kv[ids[base + r], 0, d]
    if kt_s is not None:
        for r, d in T.Parallel(rows, kt_s.shape[1]):
            kt_s[r, d] = kv[ids[base + r], 0, cols + d]


@T.macro
def scores(q_s, qt_s, k_s, kt_s, acc_s, transposed):
    """acc_s = Q . K^T over the tile (the tail's product added), or transposed, S^T = K . Q^T with
    each warpgroup's product 64 rows (M) by the heads (N)."""
    if transposed:
        T.gemm(k_s, q_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
        if qt_s is not None:
            T.gemm(kt_s, qt_s, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
    else:
        T.gemm(q_s, k_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
        if qt_s is not None:
            T.gemm(qt_s, kt_s, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)


@T.macro
def mask_scores(acc_s, ids, base, transposed):
    """Scores of masked (-1) rows to -inf (acc_s [heads, rows], or [rows, heads] transposed)."""
    if transposed:
        for r, h in T.Parallel(*acc_s.shape):
            acc_s[r, h] = T.if_then_else(ids[base + r] >= 0, acc_s[r, h], -T.infinity(acc_s.dtype))
    else:
        for h, r in T.Parallel(*acc_s.shape):
            acc_s[h, r] = T.if_then_else(ids[base + r] >= 0, acc_s[h, r], -T.infinity(acc_s.dtype))


@T.macro
def reciprocals(row_sum, inv_sum):
    """One reciprocal a head of the row sum; 0 for a split with every row masked (row_sum 0):
    zeros, never NaN."""
    for h in T.Parallel(row_sum.shape[0]):
        inv_sum[h] = T.if_then_else(row_sum[h] == 0, 0.0, 1.0 / row_sum[h])


def head_lse(row_sum, m, scale2, shift=0.0):
    """A head's natural-log lse from its row sum and running max (log2 units of scale2; shift: the
    log2 factor the row sum carries, decode_regs.P_SHIFT where P was scaled): -inf where every row
    was masked."""
    return T.if_then_else(row_sum == 0, -T.infinity(T.float32), (T.log2(row_sum) - shift + m * scale2) * LN2)


@T.macro
def write_lse(row_sum, m, lse, H, s_i, sp, h0, scale2, shift=0.0):
    """A split's lse a head."""
    for h in T.Parallel(row_sum.shape[0]):
        if h0 + h < H:
            lse[s_i, sp * H + h0 + h] = head_lse(row_sum[h], m[h], scale2, shift)


@T.macro
def online_softmax(acc_s, acc_o, m, m_tile, alpha, sum_part, scale2, transposed=False, shift=0.0, exp2=T.exp2):
    """One tile of online softmax: scores -> probabilities (in acc_s, at most 2^shift), added into
    sum_part, and acc_o rescaled (acc_o None: the caller rescales it, from alpha).
    m_tile holds the max the running max is measured against (the caller's reduction of the tile's
    row max).

    The running max follows every tile and the accumulator is rescaled every tile: a lazy rescale's
    block-uniform branch needs a shared flag and two more barriers a tile, which cost more than the
    multiplies they save. sum_part has acc_s's shape: each thread sums its own columns, and the
    caller reduces it across threads once, after the last tile (a reduction a tile would cost two
    cross-warpgroup exchanges through shared memory).
    transposed: acc_s and sum_part are [rows, heads] (decode_regs' narrow tiles)."""
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
