"""Warp-specialised raw-fp8 sparse-MLA decode for Hopper (wgmma), 64 heads a block.

Same contract as decode_tl.decode_program (per-split bf16 outputs + natural-log lse), built the
way TileLang's DeepSeek-V3.2 sparse-MLA examples are, with fp8 changes. 384 threads:
  warpgroup 0: S = Q.K^T (fp8 wgmma, all 64 heads), online softmax, hands P (fp16) and the
               rescale factor to warpgroup 1 through shared memory, O[:, :256] += P.V_left
  warpgroup 1: O[:, 256:] += P.V_right
  warpgroup 2: producer; gathers the top-k rows (cp.async, masked rows skipped) into a
               two-buffer fp8 ring and flags which rows are valid
Each consumer upcasts its own half of the V tile (fp8 -> fp16, exact) from the ring into its own
shared buffer, so no V buffer is shared between warpgroups and HBM traffic stays fp8; warpgroup 1
does its upcast while warpgroup 0 runs the QK^T product and softmax. Tiles are handled in pairs
(buffer 0, buffer 1), so a split must own an even number of tiles.
"""
import tilelang.language as T
from dsaops.kernels.decode_tl import LN2, LOG2E, NEG_BIG, decode_kernel, online_softmax

HEADS = 64
THREADS = 384


def decode_ws_program(d_v: int, d_tail: int, *, block_rows: int = 64, fp8_dtype: str = "float8_e4m3fn"):
    HB, BI = HEADS, block_rows
    D, Dt = d_v, d_tail
    half = D // 2
    acc, f16 = T.float32, T.float16

    @T.macro
    def consume_left(i, b, kl, kr, kt, valid, ready, free, q_l, q_r, q_t, v_l, p_s, alpha_s, p_ready, p_free,
                     acc_s, acc_o_l, m, m_tile, grew, alpha, sum_part, scale2):
        """Warpgroup 0, one tile: QK^T, softmax, hand-off of P, left half of PV."""
        T.barrier_wait(ready[0], i & 1)
        T.wgmma_gemm(q_l, kl, acc_s, transpose_B=True, clear_accum=True)
        T.wgmma_gemm(q_r, kr, acc_s, transpose_B=True)
        if Dt:
            T.wgmma_gemm(q_t, kt, acc_s, transpose_B=True)
        for r, d in T.Parallel(BI, half):  # upcast while the products run
            v_l[r, d] = T.if_then_else(valid[r], kl[r, d].astype(f16), 0)
        T.wait_wgmma(0)
        for h, r in T.Parallel(HB, BI):
            acc_s[h, r] = T.if_then_else(valid[r], acc_s[h, r], -T.infinity(acc))
        T.barrier_arrive(free[0])

        online_softmax(acc_s, acc_o_l, m, m_tile, alpha, sum_part, grew, i * 2 + b + 1, scale2)
        # warpgroup 1 is done with the previous tile's P and alpha (a fresh barrier passes parity 1)
        T.barrier_wait(p_free[0], b ^ 1)
        T.copy(alpha, alpha_s)
        T.copy(acc_s, p_s)
        T.fence_proxy_async()  # P is read next by the other warpgroup's wgmma
        T.barrier_arrive(p_ready[0])
        T.gemm(p_s, v_l, acc_o_l)

    @T.macro
    def consume_right(i, b, kr, valid, ready, free, v_r, p_s, alpha_s, p_ready, p_free, acc_o_r):
        """Warpgroup 1, one tile: upcast the right V half (during warpgroup 0's QK^T), right half of PV."""
        T.barrier_wait(ready[0], i & 1)
        for r, d in T.Parallel(BI, half):
            v_r[r, d] = T.if_then_else(valid[r], kr[r, d].astype(f16), 0)
        T.barrier_arrive(free[0])
        T.barrier_wait(p_ready[0], b)
        for h, d in T.Parallel(HB, half):
            acc_o_r[h, d] *= alpha_s[h]
        T.gemm(p_s, v_r, acc_o_r)
        T.barrier_arrive(p_free[0])

    @T.macro
    def produce(i, b, kl, kr, kt, valid, ready, free, kv, indices, idx, s_i, base, row_in_pass, chunk):
        """Warpgroup 2, one tile: gather the rows into one ring buffer (16 threads a row)."""
        T.barrier_wait(free[0], (i & 1) ^ 1)
        for p in T.unroll(BI // 8):  # all of this thread's row ids first: one memory latency, not eight
            idx[p] = indices[s_i, 0, base + p * 8 + row_in_pass]
        for p in T.unroll(BI // 8):
            r = p * 8 + row_in_pass
            valid[r] = idx[p] >= 0
            if idx[p] >= 0:  # masked rows are not read: their scores and V are zeroed by the consumers
                # explicit cp.async (16 B); an `async_scope` copy loop stays synchronous in TileLang 0.1.12
                T.ptx_cp_async(T.access_ptr(kl[r, chunk * 16], "w", 16),
                               T.access_ptr(kv[idx[p], 0, chunk * 16], "r", 16), 16)
                T.ptx_cp_async(T.access_ptr(kr[r, chunk * 16], "w", 16),
                               T.access_ptr(kv[idx[p], 0, half + chunk * 16], "r", 16), 16)
                if Dt:  # noqa: SIM102 - a trace-time test around a device-side one
                    if chunk < Dt // 16:
                        T.ptx_cp_async(T.access_ptr(kt[r, chunk * 16], "w", 16),
                                       T.access_ptr(kv[idx[p], 0, D + chunk * 16], "r", 16), 16)
        T.cp_async_barrier_noinc(ready[0])

    @T.macro
    def block(q, kv, indices, sm_scale, split_rows, out, lse, H, s_i, hb, by):
        q_l = T.alloc_shared([HB, half], fp8_dtype)
        q_r = T.alloc_shared([HB, half], fp8_dtype)
        k0_l = T.alloc_shared([BI, half], fp8_dtype)
        k0_r = T.alloc_shared([BI, half], fp8_dtype)
        k1_l = T.alloc_shared([BI, half], fp8_dtype)
        k1_r = T.alloc_shared([BI, half], fp8_dtype)
        q_t = T.alloc_shared([HB, Dt], fp8_dtype) if Dt else None
        k0_t = T.alloc_shared([BI, Dt], fp8_dtype) if Dt else None
        k1_t = T.alloc_shared([BI, Dt], fp8_dtype) if Dt else None
        valid0 = T.alloc_shared([BI], T.bool)
        valid1 = T.alloc_shared([BI], T.bool)
        v_l = T.alloc_shared([BI, half], f16)
        v_r = T.alloc_shared([BI, half], f16)
        p_s = T.alloc_shared([HB, BI], f16)
        alpha_s = T.alloc_shared([HB], acc)
        sum_s = T.alloc_shared([HB], acc)

        acc_s = T.alloc_fragment([HB, BI], acc)
        acc_o_l = T.alloc_fragment([HB, half], acc)
        acc_o_r = T.alloc_fragment([HB, half], acc)
        m = T.alloc_fragment([HB], acc)
        m_tile = T.alloc_fragment([HB], acc)
        grew = T.alloc_shared([1], T.int32)  # only warpgroup 0 touches it
        alpha = T.alloc_fragment([HB], acc)
        sum_part = T.alloc_fragment([HB, BI], acc)
        row_sum = T.alloc_fragment([HB], acc)
        idx = T.alloc_local([BI // 8], T.int32)

        k0_ready = T.alloc_barrier(128)
        k1_ready = T.alloc_barrier(128)
        k0_free = T.alloc_barrier(256)
        k1_free = T.alloc_barrier(256)
        p_ready = T.alloc_barrier(128)
        p_free = T.alloc_barrier(128)
        sums_ready = T.alloc_barrier(128)

        tx = T.get_thread_binding()
        h0 = hb * HB
        scale2 = sm_scale * LOG2E
        pairs = split_rows // (2 * BI)

        for h, d in T.Parallel(HB, half):
            q_l[h, d] = T.if_then_else(h0 + h < H, q[s_i, h0 + h, d], 0).astype(fp8_dtype)
            q_r[h, d] = T.if_then_else(h0 + h < H, q[s_i, h0 + h, half + d], 0).astype(fp8_dtype)
        if Dt:
            for h, d in T.Parallel(HB, Dt):
                q_t[h, d] = T.if_then_else(h0 + h < H, q[s_i, h0 + h, D + d], 0).astype(fp8_dtype)
        T.sync_threads()

        if tx < 128:
            T.set_max_nreg(240, 1)
            T.fill(acc_o_l, 0)
            T.fill(sum_part, 0)
            T.fill(m, NEG_BIG)
            for i in T.serial(pairs):
                consume_left(i, 0, k0_l, k0_r, k0_t, valid0, k0_ready, k0_free, q_l, q_r, q_t, v_l, p_s, alpha_s,
                             p_ready, p_free, acc_s, acc_o_l, m, m_tile, grew, alpha, sum_part, scale2)
                consume_left(i, 1, k1_l, k1_r, k1_t, valid1, k1_ready, k1_free, q_l, q_r, q_t, v_l, p_s, alpha_s,
                             p_ready, p_free, acc_s, acc_o_l, m, m_tile, grew, alpha, sum_part, scale2)
            T.reduce_sum(sum_part, row_sum, dim=1)
            for h in T.Parallel(HB):
                sum_s[h] = row_sum[h]
            T.barrier_arrive(sums_ready[0])
            for h, d in T.Parallel(HB, half):
                if h0 + h < H:
                    out[s_i, by, h0 + h, d] = (
                        acc_o_l[h, d] / T.if_then_else(row_sum[h] == 0, 1.0, row_sum[h])).astype(T.bfloat16)
            for h in T.Parallel(HB):
                if h0 + h < H:
                    lse[s_i, by, h0 + h] = T.if_then_else(
                        row_sum[h] == 0, -T.infinity(acc), (T.log2(row_sum[h]) + m[h] * scale2) * LN2)
        elif tx < 256:
            T.set_max_nreg(208, 1)  # 240 + 208 + 56 = 504 = 3 x 168, what a 384-thread block owns
            T.fill(acc_o_r, 0)
            for i in T.serial(pairs):
                consume_right(i, 0, k0_r, valid0, k0_ready, k0_free, v_r, p_s, alpha_s, p_ready, p_free, acc_o_r)
                consume_right(i, 1, k1_r, valid1, k1_ready, k1_free, v_r, p_s, alpha_s, p_ready, p_free, acc_o_r)
            T.barrier_wait(sums_ready[0], 0)
            for h, d in T.Parallel(HB, half):
                if h0 + h < H:
                    out[s_i, by, h0 + h, half + d] = (
                        acc_o_r[h, d] / T.if_then_else(sum_s[h] == 0, 1.0, sum_s[h])).astype(T.bfloat16)
        else:
            T.set_max_nreg(56, 0)
            lane = tx - 256
            row_in_pass = lane // 16  # 16 threads a row, 8 rows a pass
            chunk = lane % 16         # 16-byte chunk of each half row
            for i in T.serial(pairs):
                produce(i, 0, k0_l, k0_r, k0_t, valid0, k0_ready, k0_free, kv, indices, idx, s_i,
                        by * split_rows + i * 2 * BI, row_in_pass, chunk)
                produce(i, 1, k1_l, k1_r, k1_t, valid1, k1_ready, k1_free, kv, indices, idx, s_i,
                        by * split_rows + (i * 2 + 1) * BI, row_in_pass, chunk)

    return decode_kernel(HB, D, Dt, fp8_dtype, THREADS, block)
