"""The split merge: a call of several splits over top-k writes per-split outputs and log-sum-exps
(decode_parts.decode_kernel), and this kernel merges them in fp32, in the same stream."""

import tilelang.language as T
from dsaops.kernels.decode_parts import LOG2E, overlap_launches

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
