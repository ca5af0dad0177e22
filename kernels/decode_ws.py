"""Warp-specialised raw-fp8 sparse-MLA decode for Hopper (wgmma), 64 heads a block: a seesaw.

Same contract as decode_tl.decode_program (per-split bf16 outputs + natural-log lse). 384 threads:
  warpgroup 2: producer; gathers the top-k rows (cp.async; masked rows skipped and flagged) into an
               fp8 ring of `stages` tile buffers (tile t in buffer t % stages)
  warpgroup w: consumer of tiles 2i + w and owner of output columns [w*256, (w+1)*256). A pair i:
      S_w = Q.K_w^T            fp8 wgmma, all 64 heads, masked rows -> -inf
      row maxes exchanged      both warpgroups then keep the same running max (over both tiles)
      P_w = exp2(S_w - m)      fp16, into shared memory for the peer
      O_w += P_w . V_w[:, w]   V's half upcast fp8 -> fp16 (exact) into the warpgroup's own buffer
      O_w += P_peer . V_peer[:, w]
Both warpgroups run a QK^T product and a softmax, each on its own tile (the earlier split had one
warpgroup do all of that while the other waited), and meet twice a pair (row maxes, P). A ring
buffer is released once both have upcast their half of it, so the producer refills it while the PV
products run: with 3 buffers the next pair's first tile is in flight while a pair computes (with 2,
measured 1.5x slower, the gather latency was exposed every pair). Tiles come in pairs, so a split
must own an even number of them.
"""
import tilelang.language as T
from dsaops.kernels.decode_tl import LOG2E, NEG_BIG, decode_kernel, load_q, online_softmax, write_split

HEADS = 64
THREADS = 384


def decode_ws_program(d_v: int, d_tail: int, *, block_rows: int = 64, stages: int = 3,
                      fp8_dtype: str = "float8_e4m3fn", pdl: bool = False):
    HB, BI = HEADS, block_rows
    D, Dt = d_v, d_tail
    half = D // 2
    acc, f16 = T.float32, T.float16

    @T.macro
    def upcast(v, k_half, valid, b):
        """Ring buffer b's half (fp8) -> v (fp16, exact); masked rows were never loaded: zeros."""
        for r, d in T.Parallel(BI, half):
            v[r, d] = T.if_then_else(valid[b, r], k_half[b, r, d].astype(f16), 0)
        T.fence_proxy_async()  # read next by wgmma (the async proxy)

    @T.macro
    def exchange(w, heads, shared, own_stats, peer_stats, phase, take_max):
        """Combine a per-head vector with the peer warpgroup's (max or sum): both end with the same
        numbers (a max or a sum of the same two operands is the same either way round)."""
        for h in T.Parallel(HB):
            shared[w, h] = heads[h]
        T.barrier_arrive(own_stats[0])
        T.barrier_wait(peer_stats[0], phase)
        for h in T.Parallel(HB):
            heads[h] = T.max(heads[h], shared[1 - w, h]) if take_max else heads[h] + shared[1 - w, h]

    @T.macro
    def consume(w, i, q_l, q_r, q_t, k_l, k_r, k_t, valid, ready, free, v, own_p, peer_p, max_s,
                own_stats, peer_stats, own_p_ready, peer_p_ready, acc_s, acc_o, m, m_tile, alpha, sum_part,
                scale2):
        """Warpgroup w, pair i: its own tile's QK^T and softmax, then PV of both tiles on its half."""
        k_half = k_l if w == 0 else k_r
        own, peer = 2 * i + w, 2 * i + 1 - w  # tile numbers
        bo, bp = own % stages, peer % stages
        T.barrier_wait(ready[bo], (own // stages) & 1)
        T.wgmma_gemm(q_l, k_l[bo, :, :], acc_s, transpose_B=True, clear_accum=True)
        T.wgmma_gemm(q_r, k_r[bo, :, :], acc_s, transpose_B=True)
        if Dt:
            T.wgmma_gemm(q_t, k_t[bo, :, :], acc_s, transpose_B=True)
        upcast(v, k_half, valid, bo)  # while QK^T runs
        T.wait_wgmma(0)
        for h, r in T.Parallel(HB, BI):
            acc_s[h, r] = T.if_then_else(valid[bo, r], acc_s[h, r], -T.infinity(acc))
        T.barrier_arrive(free[bo])
        T.reduce_max(acc_s, m_tile, dim=1)
        # Arriving here also tells the peer this warpgroup's last PV product with the peer's P is
        # done (waited above), so the peer may overwrite its P buffer.
        exchange(w, m_tile, max_s, own_stats, peer_stats, i & 1, True)
        online_softmax(acc_s, acc_o, m, m_tile, alpha, sum_part, scale2)
        T.copy(acc_s, own_p)
        T.fence_proxy_async()
        T.barrier_arrive(own_p_ready[0])
        T.wgmma_gemm(own_p, v, acc_o)
        T.barrier_wait(peer_p_ready[0], i & 1)
        T.wait_wgmma(0)
        upcast(v, k_half, valid, bp)
        T.barrier_arrive(free[bp])
        # Synchronous: a product still in flight across the loop's back edge made ptxas serialize
        # every wgmma of the kernel (C7514, "non wgmma instructions reading accumulator registers").
        T.gemm(peer_p, v, acc_o)

    @T.macro
    def consumer(w, q, q_l, q_r, q_t, q_ready, k_l, k_r, k_t, valid, ready, free, v, own_p, peer_p, max_s, sum_s,
                 own_stats, peer_stats, own_p_ready, peer_p_ready, out, lse, H, s_i, sp, h0, scale2, pairs):
        """Consumer warpgroup w (its own fragments: a fragment's layout belongs to one thread range)."""
        acc_s = T.alloc_fragment([HB, BI], acc)
        acc_o = T.alloc_fragment([HB, half], acc)
        m = T.alloc_fragment([HB], acc)
        m_tile = T.alloc_fragment([HB], acc)
        alpha = T.alloc_fragment([HB], acc)
        sum_part = T.alloc_fragment([HB, BI], acc)
        row_sum = T.alloc_fragment([HB], acc)

        T.set_max_nreg(224, 1)  # 224 + 224 + 56 = 504 = 3 x 168, what a 384-thread block owns
        # Q in fp8, half by each consumer (16-byte loads; the producer's first gathers run meanwhile)
        load_q(q, q_l if w == 0 else q_r, H, s_i, h0, w * half)
        if Dt and w == 1:
            load_q(q, q_t, H, s_i, h0, D)
        T.fence_proxy_async()  # read by both consumers' wgmma
        T.barrier_arrive(q_ready[0])
        T.barrier_wait(q_ready[0], 0)
        T.fill(acc_o, 0)
        T.fill(sum_part, 0)
        T.fill(m, NEG_BIG)
        for i in T.serial(pairs):
            consume(w, i, q_l, q_r, q_t, k_l, k_r, k_t, valid, ready, free, v, own_p, peer_p, max_s,
                    own_stats, peer_stats, own_p_ready, peer_p_ready, acc_s, acc_o, m, m_tile, alpha, sum_part,
                    scale2)
        # softmax sums: each warpgroup summed its own tiles; both add the same two numbers
        T.reduce_sum(sum_part, row_sum, dim=1)
        exchange(w, row_sum, sum_s, own_stats, peer_stats, pairs & 1, False)
        # each its half of the output; warpgroup 0 the lse (alpha, done with, holds the reciprocals)
        # written straight from the accumulators: TileLang does not place a staging buffer over dead
        # ones across the consumers' branches, and two more do not fit next to the ring
        write_split(acc_o, row_sum, m, alpha, None, out, lse, H, s_i, sp, h0, w * half, scale2, w == 0)

    @T.macro
    def produce(t, k_l, k_r, k_t, valid, ready, free, kv, indices, idx, s_i, base, row_in_pass, chunk):
        """Warpgroup 2, tile t: gather its rows into ring buffer t % stages (16 threads a row)."""
        b = t % stages
        T.barrier_wait(free[b], ((t // stages) & 1) ^ 1)
        for p in T.unroll(BI // 8):  # all of this thread's row ids first: one memory latency, not eight
            idx[p] = indices[s_i, 0, base + p * 8 + row_in_pass]
        for p in T.unroll(BI // 8):
            r = p * 8 + row_in_pass
            valid[b, r] = idx[p] >= 0
            if idx[p] >= 0:  # masked rows are not read: the consumers zero their scores and V
                # explicit cp.async (16 B); an `async_scope` copy loop stays synchronous in TileLang 0.1.12
                T.ptx_cp_async(T.access_ptr(k_l[b, r, chunk * 16], "w", 16),
                               T.access_ptr(kv[idx[p], 0, chunk * 16], "r", 16), 16)
                T.ptx_cp_async(T.access_ptr(k_r[b, r, chunk * 16], "w", 16),
                               T.access_ptr(kv[idx[p], 0, half + chunk * 16], "r", 16), 16)
                if Dt:  # noqa: SIM102 - a trace-time test around a device-side one
                    if chunk < Dt // 16:
                        T.ptx_cp_async(T.access_ptr(k_t[b, r, chunk * 16], "w", 16),
                                       T.access_ptr(kv[idx[p], 0, D + chunk * 16], "r", 16), 16)
        T.cp_async_barrier_noinc(ready[b])

    @T.macro
    def block(q, kv, kv_scale, indices, sm_scale, split_rows, out, lse, H, s_i, hb, sp):  # raw layout only
        q_l = T.alloc_shared([HB, half], fp8_dtype)
        q_r = T.alloc_shared([HB, half], fp8_dtype)
        q_t = T.alloc_shared([HB, Dt], fp8_dtype) if Dt else None
        k_l = T.alloc_shared([stages, BI, half], fp8_dtype)  # the ring: left and right halves, tail
        k_r = T.alloc_shared([stages, BI, half], fp8_dtype)
        k_t = T.alloc_shared([stages, BI, Dt], fp8_dtype) if Dt else None
        valid = T.alloc_shared([stages, BI], T.bool)
        v0 = T.alloc_shared([BI, half], f16)  # each consumer's upcast V half (of its tile, then the peer's)
        v1 = T.alloc_shared([BI, half], f16)
        p0 = T.alloc_shared([HB, BI], f16)
        p1 = T.alloc_shared([HB, BI], f16)
        max_s = T.alloc_shared([2, HB], acc)
        sum_s = T.alloc_shared([2, HB], acc)
        idx = T.alloc_local([BI // 8], T.int32)

        ready = T.alloc_barrier([128] * stages)
        free = T.alloc_barrier([256] * stages)  # both consumers upcast their half of each tile
        stats0 = T.alloc_barrier(128)
        stats1 = T.alloc_barrier(128)
        p0_ready = T.alloc_barrier(128)
        p1_ready = T.alloc_barrier(128)
        q_ready = T.alloc_barrier(256)

        tx = T.get_thread_binding()
        h0 = hb * HB
        scale2 = sm_scale * LOG2E
        pairs = split_rows // (2 * BI)

        if tx < 128:
            consumer(0, q, q_l, q_r, q_t, q_ready, k_l, k_r, k_t, valid, ready, free, v0, p0, p1, max_s, sum_s,
                     stats0, stats1, p0_ready, p1_ready, out, lse, H, s_i, sp, h0, scale2, pairs)
        elif tx < 256:
            consumer(1, q, q_l, q_r, q_t, q_ready, k_l, k_r, k_t, valid, ready, free, v1, p1, p0, max_s, sum_s,
                     stats1, stats0, p1_ready, p0_ready, out, lse, H, s_i, sp, h0, scale2, pairs)
        else:
            T.set_max_nreg(56, 0)
            lane = tx - 256
            row_in_pass = lane // 16  # 16 threads a row, 8 rows a pass
            chunk = lane % 16         # 16-byte chunk of each half row
            for t in T.serial(pairs * 2):
                produce(t, k_l, k_r, k_t, valid, ready, free, kv, indices, idx, s_i,
                        sp * split_rows + t * BI, row_in_pass, chunk)

    return decode_kernel(HB, D, Dt, fp8_dtype, THREADS, block, pdl)
