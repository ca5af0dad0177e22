"""What every TileLang decode program shares (decode_regs.py and decode_smem.py are the two
families; decode.py the host side).

One block owns one query and up to 64 of its heads, so each gathered KV tile is read from HBM
once for all of them (SGLang 0.5.23 uses 16-head blocks and reads every tile four times at
H=64). Per tile of `block_rows` top-k rows:
  gather fp8 rows -> shared (pipelined, `stages` deep; masked rows zero-filled, never read)
  S = (Q_hi + Q_lo) . K_fp8^T  two fp8 tensor-core products into one accumulator, both operands
                               K-major (wgmma on sm_90); q_hi + q_lo is the bf16 q exactly (split_q)
  online softmax in fp32       masked rows forced to -inf after the product
  O += P . V                   the family's product (V from registers, or upcast in shared memory)
A split over top-k (grid z) writes per-split outputs (bf16) and log-sum-exps, split k's heads at
rows k*H.. of one [S, n_split*H] tensor; decode_merge merges them in fp32. Split k owns the
query's tiles k, k + n_split, ... and stops after the last with a valid row (flag_tiles): a
context shorter than top-k, whose -1 entries sit at the tail, costs the tiles it reads. With one split the
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
    each for head block, query and split (so no address needs a run-time division). `block`, a
    T.macro, is one block's work: block(q, kv, kv_scale, indices, sm_scale, split_rows, n_split, out,
    lse, H, s_i, hb, sp). S, H, top-k, pool slots and the split count are symbolic; the rows each
    split owns come as the scalar `split_rows` (a multiple of the tile's rows, at least top-k /
    n_split: positions past top-k read as -1). out and lse hold split sp's heads at rows sp*H.., so
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
        # the head block is the fastest axis: a query's head blocks run together and the later ones
        # find its rows in L2 (H200, H = 128: 3% faster at S = 256). cluster_dims (1, 1, 1) is a
        # plain launch
        with T.ClusterKernel(T.ceildiv(H, heads_per_block), S, 2 if pairs else split_heads // H,
                             cluster_dims=(1, 1, 2 if pairs else 1), threads=threads) as (hb, s_i, sp):
            if pdl:
                overlap_launches()
            # once: inlined, the division ran at every row id's address (a 64-bit division call)
            n_split = T.alloc_var(T.int32, init=2 if pairs else split_heads // H)
            block(q, kv, kv_scale, indices, sm_scale, split_rows, n_split, out, lse, H, s_i, hb, sp)

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


def pow2_scale(amax):
    """The power of two that puts amax (a head's largest |q|, float32) in [128, 256): 2^(7 - e) for
    amax = m * 2^e, from the exponent bits alone (exact, no rounding); 1 where amax is below 2^-119
    (zero, or too small for the inverse to stay a normal float)."""
    e = T.shift_right(T.reinterpret(amax, "int32"), 23)  # the biased exponent (amax >= 0)
    return T.if_then_else(e >= 8, T.reinterpret(T.shift_left(261 - e, 23), "float32"), T.float32(1))


def pow2_inverse(s):
    """1 / s for a power of two s from pow2_scale, exactly (its exponent negated)."""
    return T.reinterpret(T.shift_left(254 - T.shift_right(T.reinterpret(s, "int32"), 23), 23), "float32")


@T.macro
def split_q(q, q_hi, q_lo, qt_hi, qt_lo, q_amax, q_scale, H, s_i, h0, first_rows=None):
    """q's heads h0.. of query s_i (bf16) times a power of two a head (q_scale, shared; pow2_scale of
    the head's largest |q|), as two e4m3 halves: hi = e4m3(x), lo = e4m3(x - hi). For a bf16 x the
    sum hi + lo is x exactly wherever |x| >= 2^-2 (x - hi has at most 4 significant bits, on e4m3's
    grid down to its subnormals' 2^-9), and within 2^-10 below that: q at bf16's precision in fp8
    products, for any magnitude of q. The scores then carry the head's scale, which the softmax
    takes out (score_scales). Padded heads (past H) are zeros. d_tail's columns (qt_hi, qt_lo; None
    without a tail) share their head's scale. q_lo None: q_hi holds both, lo at rows heads.. (the
    stacked operands of alloc_operands; qt_lo likewise).
    q_amax: shared [heads] float32 scratch for TileLang's reduction of the largest |q| (None with
    first_rows). first_rows (the V-in-registers tiles, whose q operands carry the full-bank swizzle):
    (kv, the split's row ids, the tile's rows); pv_registers.cuh's split_q then computes the scales
    and the first d_v columns' halves from one load of q, a warp a head, and asks L2 for the first
    tile's rows."""
    heads, D = q_scale.shape[0], q_hi.shape[1]
    Dt = 0 if qt_hi is None else qt_hi.shape[1]
    if Dt:
        qt_f = T.alloc_fragment([heads, Dt], T.bfloat16)
        load_heads(q, qt_f, D, H, s_i, h0)
    if first_rows is not None:
        assert q_amax is None and D == 512, "pv_registers.cuh's split_q writes d_v 512 and its own scales"
        # by index: a buffer bound to a name here would take that name in the generated source
        t = T.get_thread_binding()
        lo = (q_hi, heads) if q_lo is None else (q_lo, 0)  # the low half's buffer and first row
        T.call_extern("handle", f"dsaops_pv::split_q<{heads}, {D + Dt}, {q_hi.shape[0]}>",
                      T.access_ptr(q[s_i, h0, 0], "r"), T.min(heads, H - h0), T.access_ptr(q_scale, "w"),
                      T.access_ptr(q_hi, "w"), T.access_ptr(lo[0], "w"), lo[1],
                      T.access_ptr(first_rows[0][0, 0, 0], "r"),
                      T.if_then_else(t < first_rows[2], first_rows[1][t], -1), first_rows[0].shape[0])
    else:
        q_f = T.alloc_fragment([heads, D], T.bfloat16)
        load_heads(q, q_f, 0, H, s_i, h0)
        amax = T.alloc_fragment([heads], T.bfloat16)
        T.reduce_absmax(q_f, amax, dim=1)
        for h in T.Parallel(heads):
            q_amax[h] = amax[h]
        if Dt:
            amax_t = T.alloc_fragment([heads], T.bfloat16)
            T.reduce_absmax(qt_f, amax_t, dim=1)
            for h in T.Parallel(heads):
                q_amax[h] = T.max(q_amax[h], amax_t[h])
        for h in T.Parallel(heads):
            q_scale[h] = pow2_scale(q_amax[h])
        store_halves(q_f, q_scale, q_hi, q_lo)
    if Dt:
        store_halves(qt_f, q_scale, qt_hi, qt_lo)


@T.macro
def load_heads(q, x_f, first, H, s_i, h0):
    """Columns first.. of q's heads h0.. (query s_i) into the [heads, width] fragment x_f, heads past
    H as zeros."""
    for h, d in T.Parallel(*x_f.shape):
        x_f[h, d] = T.if_then_else(h0 + h < H, q[s_i, h0 + h, first + d], 0)


@T.macro
def store_halves(x_f, q_scale, hi, lo):
    """hi = e4m3(x), lo = e4m3(x - hi) for x = x_f times its head's scale (split_q); lo None: lo at
    hi's rows heads.. (the stacked operands)."""
    heads, width = x_f.shape
    for h, d in T.Parallel(heads, width):
        x = x_f[h, d].astype(T.float32) * q_scale[h]
        hi[h, d] = x.astype(hi.dtype)
        if lo is None:
            hi[heads + h, d] = (x - x.astype(hi.dtype).astype(T.float32)).astype(hi.dtype)
        else:
            lo[h, d] = (x - x.astype(hi.dtype).astype(T.float32)).astype(lo.dtype)


@T.macro
def score_scales(m, scale2, q_scale, sm_scale):
    """The running max's start (NEG_BIG) and scale2[h] = sm_scale * log2(e) / q_scale[h]: what turns
    head h's scores (which carry its q scale, split_q) into log2 units, in the max's layout."""
    for h in T.Parallel(m.shape[0]):
        m[h] = NEG_BIG
        scale2[h] = sm_scale * LOG2E * pow2_inverse(q_scale[h])


@T.macro
def alloc_operands(heads, rows, d_v, d_tail, fp8_dtype, cuda_split=False, stacked=False):
    """Shared memory of QK^T's operands: q's two e4m3 halves [heads, d_v] (split_q) and a tile's
    gathered rows [rows, d_v], each with its d_tail part (None without a tail), and q's scale a head
    with, unless cuda_split (q split by pv_registers.cuh's split_q, which needs no scratch), its
    largest |q|. stacked: the halves as one operand [2 heads, d_v], hi above lo, in q_hi (and
    qt_hi), q_lo and qt_lo None (scores' one product for both).
    (q_hi, q_lo, k_s, qt_hi, qt_lo, kt_s, q_amax, q_scale)"""
    q_hi = T.alloc_shared([2 * heads if stacked else heads, d_v], fp8_dtype)
    q_lo = None if stacked else T.alloc_shared([heads, d_v], fp8_dtype)
    k_s = T.alloc_shared([rows, d_v], fp8_dtype)
    qt_hi = T.alloc_shared([2 * heads if stacked else heads, d_tail], fp8_dtype) if d_tail else None
    qt_lo = T.alloc_shared([heads, d_tail], fp8_dtype) if d_tail and not stacked else None
    kt_s = T.alloc_shared([rows, d_tail], fp8_dtype) if d_tail else None
    q_amax = None if cuda_split else T.alloc_shared([heads], T.float32)
    q_scale = T.alloc_shared([heads], T.float32)
    return q_hi, q_lo, k_s, qt_hi, qt_lo, kt_s, q_amax, q_scale


@T.macro
def alloc_row_ids(index_rows, rows):
    """Shared memory of a split's row ids and its tiles' flags (load_row_ids): (ids, masked, live)."""
    ids = T.alloc_shared([index_rows], T.int32, scope="shared")
    masked = T.alloc_shared([index_rows // rows], T.int32, scope="shared")
    live = T.alloc_shared([index_rows // rows], T.int32, scope="shared")
    return ids, masked, live


@T.macro
def prologue(q, indices, operands, row_ids, acc_o, sum_part, m, scale2, sm_scale, split_rows, n_split, H, s_i, sp, h0,
             kv=None):
    """Before the first tile: the split's row ids (load_row_ids), q's halves and scales (split_q),
    the tiles' flags (flag_tiles), the accumulators and the running max cleared, each head's score
    scale. The row ids' and q's global loads come before the first barrier, so their latencies
    overlap. kv (the V-in-registers tiles: pv_registers.cuh's split_q): the first tile's rows are asked
    into L2 while q is split. Returns where the split's loop ends: 1 + its last tile with a valid row."""
    # by index: names bound here (even `_`) would rename those buffers in the generated source
    load_row_ids(indices, *row_ids, split_rows, n_split, s_i, sp)
    split_q(q, operands[0], operands[1], operands[3], operands[4], operands[6], operands[7], H, s_i, h0,
            None if kv is None else (kv, row_ids[0], operands[2].shape[0]))
    flag_tiles(*row_ids)
    T.fill(acc_o, 0)
    T.fill(sum_part, 0)
    score_scales(m, scale2, operands[7], sm_scale)
    end = T.alloc_var(T.int32, init=0)
    for j in T.serial(row_ids[2].shape[0]):  # each thread its own: 1 + the split's last tile with a valid row
        if row_ids[2][j] != 0:
            end = j + 1
    return end


@T.macro
def load_row_ids(indices, ids, masked, live, split_rows, n_split, s_i, sp):
    """The split's row ids into shared memory, once: each tile's gather addresses and masks then come
    from shared memory instead of a dependent global load (an HBM latency) per tile. Split sp owns
    the query's tiles sp, sp + n_split, sp + 2 n_split, ... (its tile j is rows (sp + n_split j) *
    rows..), so the valid rows of a context shorter than top-k, which SGLang puts first and pads
    with -1, spread evenly over the splits; positions past top-k read as -1. The tiles' flags
    (flag_tiles) are cleared here, before the barrier that publishes the row ids."""
    tiles, rows = masked.shape[0], ids.shape[0] // masked.shape[0]
    topk = indices.shape[2]
    for j, r in T.Parallel(tiles, rows):
        # clamped, so every load is issued unconditionally, all before the first is waited for
        pos = (sp + n_split * j) * rows + r
        row = indices[s_i, 0, T.min(pos, topk - 1)]
        ids[j * rows + r] = T.if_then_else(j * rows + r < split_rows and pos < topk, row, -1)
    for j in T.Parallel(tiles):
        masked[j] = 0
        live[j] = 0


@T.macro
def flag_tiles(ids, masked, live):
    """masked[j] is 1 for a tile of the split with a masked (-1) row: only those tiles' scores are
    masked (the mask reads each score's row id, and DSA's top-k is full once a context has 2,048
    tokens); live[j] is 1 for a tile with a valid row (the caller's loop stops after the last:
    nothing past it is gathered or computed, and a split with no valid row runs no tile: zeros,
    lse -inf)."""
    rows = ids.shape[0] // masked.shape[0]
    for r in T.Parallel(ids.shape[0]):  # every writer writes 1
        if ids[r] < 0:
            masked[r // rows] = 1
        else:
            live[r // rows] = 1


@T.macro
def gather(kv, ids, base, k_s, kt_s, ids_in_registers=False):
    """Tile rows ids[base..] of kv into k_s (the first d_v columns) and kt_s (the tail, or None).
    Row ids index kv unclamped: TileLang's bounds guard then predicates each cp.async on
    0 <= id < slots and zero-fills masked (-1) rows, so they are never read, V needs no mask, and a
    NaN in slot 0 cannot leak (tests/kernels/test_decode_gpu.py puts one there).

    ids_in_registers: warp w copies rows w * rows / 8.. (a lane 16 bytes of each 512-byte row: the
    loop's partition over 256 threads), their ids first loaded into registers, four to a 16-byte
    load. Read inside the copy, each row's id would wait for its shared load one row at a time: ptxas
    keeps a shared load after the previous row's cp.async, which writes shared memory. The caller's
    pipeline must give the ids' load the copy's stage (decode_regs.loop_schedule)."""
    rows, cols = k_s.shape
    if ids_in_registers:
        per_warp = rows // 8
        rid = T.alloc_local([per_warp], T.int32)
        warp = T.get_thread_binding() // 32
        for i in T.unroll(per_warp):
            rid[i] = ids[base + warp * per_warp + i]
        for i, w, d in T.Parallel(per_warp, 8, cols):
            k_s[w * per_warp + i, d] = kv[rid[i], 0, d]
    else:
        for r, d in T.Parallel(rows, cols):
            k_s[r, d] = kv[ids[base + r], 0, d]
    if kt_s is not None:
        for r, d in T.Parallel(rows, kt_s.shape[1]):
            kt_s[r, d] = kv[ids[base + r], 0, cols + d]


@T.macro
def product(a, b, acc_s, clear, policy, wgmma):
    """acc_s (+)= a . b^T; with wgmma issued without a wait (the next product's wait covers it)."""
    if wgmma:
        T.wgmma_gemm(a, b, acc_s, transpose_B=True, clear_accum=clear, policy=policy)
    else:
        T.gemm(a, b, acc_s, transpose_B=True, clear_accum=clear, policy=policy)


@T.macro
def scores(q_hi, q_lo, qt_hi, qt_lo, k_s, kt_s, acc_s, transposed, wgmma, acc_both=None):
    """acc_s = (Q_hi + Q_lo) . K^T over the tile, the tail's products added (qt_hi None: no tail),
    or transposed, S^T = K . Q^T with each warpgroup's product 64 rows (M) by the heads (N). With
    wgmma, each hi product is issued without a wait, so it runs back to back with its lo product,
    whose wait covers both (a chain of three unwaited products made ptxas serialize the kernel's
    wgmma). acc_both (transposed only): q_hi holds both halves (alloc_operands' stacked), one
    product 2 heads wide into acc_both [rows, 2 heads] whose two halves add into acc_s: each
    product reads its K rows from shared memory once for both halves of q, and a thread holds
    column h and h + heads of the accumulator alike (wgmma's columns 8c + 2(lane % 4) + {0, 1})."""
    if acc_both is not None:
        product(k_s, q_hi, acc_both, True, T.GemmWarpPolicy.FullRow, wgmma and qt_hi is not None)
        if qt_hi is not None:
            product(kt_s, qt_hi, acc_both, False, T.GemmWarpPolicy.FullRow, False)
        # one index pattern a fragment a loop (TileLang's layout inference)
        for r, h in T.Parallel(*acc_s.shape):
            acc_s[r, h] = acc_both[r, h]
        for r, h in T.Parallel(*acc_s.shape):
            acc_s[r, h] += acc_both[r, acc_s.shape[1] + h]
    elif transposed:
        product(k_s, q_hi, acc_s, True, T.GemmWarpPolicy.FullRow, wgmma)
        product(k_s, q_lo, acc_s, False, T.GemmWarpPolicy.FullRow, False)
        if qt_hi is not None:
            product(kt_s, qt_hi, acc_s, False, T.GemmWarpPolicy.FullRow, wgmma)
            product(kt_s, qt_lo, acc_s, False, T.GemmWarpPolicy.FullRow, False)
    else:
        product(q_hi, k_s, acc_s, True, T.GemmWarpPolicy.FullCol, wgmma)
        product(q_lo, k_s, acc_s, False, T.GemmWarpPolicy.FullCol, False)
        if qt_hi is not None:
            product(qt_hi, kt_s, acc_s, False, T.GemmWarpPolicy.FullCol, wgmma)
            product(qt_lo, kt_s, acc_s, False, T.GemmWarpPolicy.FullCol, False)


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
    """A head's natural-log lse from its row sum and running max (scale2: the head's factor to log2
    units, score_scales; shift: the log2 factor the row sum carries, decode_regs.P_SHIFT where P
    was scaled): -inf where every row was masked."""
    return T.if_then_else(row_sum == 0, -T.infinity(T.float32), (T.log2(row_sum) - shift + m * scale2) * LN2)


@T.macro
def write_lse(row_sum, m, lse, H, s_i, sp, h0, scale2, shift=0.0):
    """A split's lse a head."""
    for h in T.Parallel(row_sum.shape[0]):
        if h0 + h < H:
            lse[s_i, sp * H + h0 + h] = head_lse(row_sum[h], m[h], scale2[h], shift)


@T.macro
def online_softmax(acc_s, acc_o, m, m_tile, alpha, sum_part, scale2, transposed=False, shift=0.0, exp2=T.exp2):
    """One tile of online softmax: scores -> probabilities (in acc_s, at most 2^shift), added into
    sum_part (None: the caller adds them), and acc_o rescaled (acc_o None: the caller rescales it,
    from alpha). scale2: each head's factor from scores to log2 units (score_scales).
    m_tile holds the max the running max is measured against (the caller's reduction of the tile's
    row max).

    The running max follows every tile and the accumulator is rescaled every tile: a lazy max (moved
    only past a threshold) with the rescale skipped behind a shared flag measured 0.4-3% slower on
    the H200, its selects and flag costing more than the multiplies they save. sum_part has acc_s's
    shape: each thread sums its own columns, and the caller reduces it across threads once, after
    the last tile (a reduction a tile would cost two cross-warpgroup exchanges through shared
    memory).
    transposed: acc_s and sum_part are [rows, heads] (decode_regs' narrow tiles)."""
    heads = m.shape[0]
    for h in T.Parallel(heads):
        alpha[h] = T.exp2((m[h] - T.max(m[h], m_tile[h])) * scale2[h])
        m[h] = T.max(m[h], m_tile[h])
    if acc_o is not None:
        for h, d in T.Parallel(heads, acc_o.shape[1]):
            acc_o[h, d] *= alpha[h]
    # in the fragment's own axis order: TileLang gave a [rows, heads] fragment iterated as
    # [heads, rows] another register layout, and the tile one barrier more
    for i, j in T.Parallel(*acc_s.shape):
        acc_s[i, j] = exp2(acc_s[i, j] * scale2[j if transposed else i]
                           - (m[j if transposed else i] * scale2[j if transposed else i] - shift))
        if sum_part is not None:
            sum_part[i, j] = sum_part[i, j] * alpha[j if transposed else i] + acc_s[i, j]
