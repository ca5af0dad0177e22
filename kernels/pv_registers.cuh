// P.V of Hopper's decode tiles with V taken from registers, and the parts of those tiles written by
// hand around it: q's split (split_q), P's two halves (store_p), the store and the cluster pairs'
// merge (imported into the kernel's CUDA source by decode_regs.decode_program; TileLang runs the
// rest of the tile).
//
// wgmma takes its A operand from registers, so the product is computed transposed:
// O^T [d, h] += V^T [d, r] . P^T [r, h], A = V^T, the fp8 tile's bytes moved straight into registers
// (no copy of V in shared memory: an fp16 upcast there, its stores and the product's reads of them,
// sit between the tile's two products), B = P, [HEADS][rows] in shared memory (K-major). The product is fp8 x fp8: V needs no conversion, only a 4 x 4 byte transpose
// (fp16 products took a cvt a value pair, 128 a thread for a 128-row tile). P, times 2^8 into
// [0, 2^8] (decode_regs.P_SHIFT), comes as two e4m3 halves, hi = e4m3(P) and lo = e4m3(P - hi), whose
// sum carries P to 2^-8 relative; two fp8 products take the tensor cores as long as one fp16 product
// did. The heads are the products' N, so a block of 16 or 32 heads runs 16- or 32-wide products
// instead of 64 with the heads padded. Each warpgroup owns 256 of the 512 output columns: 4 m64 x
// HEADS x k32 products a k-step for each half of P.
//
// Which output column a register row stands for is ours to choose. Thread (warpgroup g, warp w,
// lane l) holds, for m-tile t (0..3) and accumulator register j*4 + i*2 + c of it (j < HEADS / 8):
//   head   h = 8j + 2(l % 4) + c
//   column d = 256g + 64w + 8(l / 4) + 2t + i
// so the 8 columns a thread holds of each head are consecutive: one 8-byte shared load a KV row
// feeds all four m-tiles, and a head's 8 outputs leave in one 16-byte store.
// The accumulator leaves through store (the block's result) or cluster_pair (two splits of a query
// in a 2-CTA cluster, merged through distributed shared memory: tiles.PAIRED).
// TileLang puts this source before its own includes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <tl_templates/cuda/instruction/wgmma.h>
#include <tl_templates/cuda/intrin.h>
#include <tl_templates/cuda/barrier.h>
#include <tl_templates/cuda/cluster.h>

namespace dsaops_pv {

constexpr int kDv = 512;

// Accumulator floats a thread: 4 m-tiles of HEADS / 2 (64 x HEADS over a warpgroup's 128 threads).
template <int HEADS>
constexpr int kRegs = 2 * HEADS;

// Byte offset of (row r, column c) in TileLang's layout of a [rows, 512] fp8 K-major wgmma operand
// (the QK^T product's B, which this reads as V): 128-byte swizzle, column blocks of 128 B x rows,
// 16-byte chunks XOR (row % 8).
template <int ROWS>
__device__ __forceinline__ int kv_offset(int r, int c) {
  return (c >> 7) * (ROWS * 128) + r * 128 + ((((c >> 4) & 7) ^ (r & 7)) << 4) + (c & 15);
}

__device__ __forceinline__ int first_column() {
  const int t = threadIdx.x;
  return ((t >> 7) << 8) + (((t >> 5) & 3) << 6) + ((t & 31) >> 2) * 8;
}

// Rows in, columns out: row[j] holds bytes (row j, columns 0..3), col[c] then holds (rows 0..3, column c),
// the lowest row in the low byte (the k order of an 8-bit wgmma operand register).
__device__ __forceinline__ void transpose4x4(const uint32_t (&row)[4], uint32_t (&col)[4]) {
  const uint32_t c01_r01 = __byte_perm(row[0], row[1], 0x5140), c23_r01 = __byte_perm(row[0], row[1], 0x7362);
  const uint32_t c01_r23 = __byte_perm(row[2], row[3], 0x5140), c23_r23 = __byte_perm(row[2], row[3], 0x7362);
  col[0] = __byte_perm(c01_r01, c01_r23, 0x5410);
  col[1] = __byte_perm(c01_r01, c01_r23, 0x7632);
  col[2] = __byte_perm(c23_r01, c23_r23, 0x5410);
  col[3] = __byte_perm(c23_r01, c23_r23, 0x7632);
}

// Which tile row k-position k of a k-step (bits k4..k0) stands for is ours to choose too, as long as
// P is stored in the same order (decode_regs.k_position): row bits (k4, k1, k3, k2, k0). Lane l
// holds positions 16p + 4(l % 4) + j; so one load (fixed p, j) reads rows 2(l % 4) apart, whose
// swizzles (row % 8) put each half-warp's four rows in four different 32-byte bank groups. With
// rows 4 apart (positions in row order), rows 8 apart shared their banks: two wavefronts a
// half-warp instead of one, a quarter of the kernel's shared-load wavefronts.
__device__ __forceinline__ int k_row(int p, int j) { return 16 * p + 8 * (j >> 1) + 2 * (threadIdx.x & 3) + (j & 1); }

// The A fragments of k-step kk (rows 32kk..32kk+31 of the tile) for the four m-tiles: register
// 2p + i of m-tile t holds rows 32kk + k_row(p, 0..3), column 2t + i.
template <int ROWS>
__device__ __forceinline__ void v_fragment(uint32_t (&a)[4][4], const uint8_t* tile, int kk) {
  const int c = first_column();
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    uint32_t left[4], right[4], cols[8];  // columns c..c+3 and c+4..c+7 of four rows; then by column
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 v = *reinterpret_cast<const uint2*>(tile + kv_offset<ROWS>(32 * kk + k_row(p, j), c));
      left[j] = v.x;
      right[j] = v.y;
    }
    transpose4x4(left, reinterpret_cast<uint32_t(&)[4]>(cols[0]));
    transpose4x4(right, reinterpret_cast<uint32_t(&)[4]>(cols[4]));
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      a[t][2 * p] = cols[2 * t];
      a[t][2 * p + 1] = cols[2 * t + 1];
    }
  }
}

// Asks L2 for `bytes` (a multiple of 16) from `p` (16-byte aligned), one request a block. ptxas
// issues a block's Q loads in two batches and the row ids' loads with the second, each batch
// waiting on HBM; prefetched, the second finds L2.
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Asks L2 for row `row` of the fp8 pool (WIDTH bytes a row) when 0 <= row < slots, a 128-byte line
// an instruction (a bulk prefetch takes a warp-uniform address: ptxas loops over the warp's rows).
// split_q passes q's bf16 columns a head as WIDTH: the raw layout's row holds as many fp8 bytes.
template <int WIDTH>
__device__ __forceinline__ void prefetch_row(const void* kv, int row, int slots) {
  if (row >= 0 && row < slots) {
    const char* p = static_cast<const char*>(kv) + int64_t(row) * WIDTH;
#pragma unroll
    for (int b = 0; b < WIDTH; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + b));
    if (WIDTH % 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + WIDTH - 1));  // a row's last line
  }
}

// Eight bf16 values x (one 16-byte chunk of q) times s as two e4m3 halves, hi = e4m3(x s) and
// lo = e4m3(x s - hi), 8 bytes each (zeros where !valid). x s - hi is taken in fp16: x s is exact
// there wherever either half can be nonzero (|x s| >= 2^-10; bf16's 8 bits fit fp16's 11), and so is
// the difference, in packed conversions and one subtraction a pair.
__device__ __forceinline__ void split8(uint4 x, float s, bool valid, uint2& hi, uint2& lo) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&x);
  uint32_t h[4], l[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(pairs[j]);
    const __half2_raw xs = __floats2half2_rn(f.x * s, f.y * s);
    const __nv_fp8x2_storage_t h2 = __nv_cvt_halfraw2_to_fp8x2(xs, __NV_SATFINITE, __NV_E4M3);
    const __half2 d = __hsub2(__half2(xs), __half2(__nv_cvt_fp8x2_to_halfraw2(h2, __NV_E4M3)));
    h[j] = h2;
    l[j] = __nv_cvt_halfraw2_to_fp8x2(__half2_raw(d), __NV_SATFINITE, __NV_E4M3);
  }
  hi = valid ? make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16) : make_uint2(0, 0);
  lo = valid ? make_uint2(l[0] | l[1] << 16, l[2] | l[3] << 16) : make_uint2(0, 0);
}

// q's split for the V-in-registers tiles (decode_parts.split_q is the specification): each head's q
// times the power of two that puts its largest |q| in [128, 256) (decode_parts.pow2_scale: 1 under
// 2^-119, and for a padded head h >= heads_valid, whose halves are zeros), as two e4m3 halves into
// [ROWS, 512] fp8 operands in TileLang's full-bank swizzle (kv_offset; decode_regs annotates that
// layout on them): hi at rows 0.. of `hi`, lo at rows lo_row.. of `lo`; the scales into
// scale[HEADS]. The caller's barrier publishes all three. q: the block's first head, WIDTH bf16
// columns a head (d_tail's columns past 512 count in the scale; the caller splits them). A warp a
// head, 256 threads: 16-byte loads, each element loaded once (the scale and the halves come from
// the same registers), shuffles and no barrier, where TileLang's reduction over a head's columns,
// which span two warps, ran a barrier pair a head, and its split loaded q a second time.
// Once its loads are issued, each thread asks L2 for row `row` of the pool kv (-1: none; the caller
// gives the first tile's rows, so that its gather, issued after the split, finds them there): its
// id arrived with q's loads, and waiting for it any earlier would hold those loads back.
template <int HEADS, int WIDTH, int ROWS>
__device__ __forceinline__ void split_q(const void* q, int heads_valid, float* scale, void* hi, void* lo,
                                        int lo_row, const void* kv, int row, int slots) {
  constexpr int kWarps = 8, kHeads = HEADS / kWarps, kChunks = WIDTH / 8;  // heads a warp; 16-byte chunks a head
  constexpr int kPerLane = (kChunks + 31) / 32, kMainChunks = kDv / 8;
  static_assert(HEADS % (2 * kWarps) == 0 && WIDTH % 8 == 0 && WIDTH >= kDv, "head pairs a warp, 16-byte chunks");
  const uint4* rows = reinterpret_cast<const uint4*>(q);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // loads first, all of them unconditional (clamped to a real head and chunk), so none waits for another
  uint4 v[kHeads][kPerLane];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      v[i][k] = rows[min(warp + kWarps * i, heads_valid - 1) * kChunks + min(32 * k + lane, kChunks - 1)];
  }
  prefetch_row<WIDTH>(kv, row, slots);
  // each head's largest |q|, two heads a shuffle as a bf16 pair (|x| and the max are exact in bf16)
  __nv_bfloat162 amax[kHeads / 2];
#pragma unroll
  for (int i = 0; i < kHeads; i += 2) {
    __nv_bfloat162 m[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m[e] = __float2bfloat162_rn(0.f);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&v[i + e][k]);
#pragma unroll
        for (int j = 0; j < 4; ++j) m[e] = __hmax2(m[e], __habs2(pairs[j]));
      }
    }
    amax[i / 2] = __halves2bfloat162(__hmax(m[0].x, m[0].y), __hmax(m[1].x, m[1].y));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < kHeads / 2; ++i) {
      const uint32_t other = __shfl_xor_sync(0xffffffffu, reinterpret_cast<const uint32_t&>(amax[i]), o);
      amax[i] = __hmax2(amax[i], reinterpret_cast<const __nv_bfloat162&>(other));
    }
  }
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    const int h = warp + kWarps * i;
    const bool valid = h < heads_valid;
    const float a = valid ? __bfloat162float(i % 2 ? amax[i / 2].y : amax[i / 2].x) : 0.f;
    const int e = __float_as_int(a) >> 23;  // the biased exponent (a >= 0)
    const float s = e >= 8 ? __int_as_float((261 - e) << 23) : 1.f;
    if (lane == 0) scale[h] = s;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int chunk = 32 * k + lane;
      if (chunk < kMainChunks) {
        uint2 h8, l8;
        split8(v[i][k], s, valid, h8, l8);
        *reinterpret_cast<uint2*>(static_cast<uint8_t*>(hi) + kv_offset<ROWS>(h, 8 * chunk)) = h8;
        *reinterpret_cast<uint2*>(static_cast<uint8_t*>(lo) + kv_offset<ROWS>(lo_row + h, 8 * chunk)) = l8;
      }
    }
  }
}

// 2^x, the hardware approximation alone (decode_regs.exp2_approx); 0 for x = -inf (masked rows).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of P's value for head h and tile row r in one e4m3 half of P ([HEADS][128], the
// 128-byte swizzle P.V's descriptor names): row r at k-position decode_regs.k_position(r), row bits
// (r4, r2, r1, r3, r0) within its 32-row k-step, and 16-byte chunks XOR (h % 8).
__device__ __forceinline__ int p_offset(int h, int r) { return h * 128 + (((((r >> 5) << 1) | ((r >> 4) & 1)) ^ (h & 7)) << 4) + (((r >> 2) & 1) << 3) + (((r >> 1) & 1) << 2) + (((r >> 3) & 1) << 1) + (r & 1); }

// P's e4m3 halves of a pair of values (already times 2^P_SHIFT): hi = e4m3(x), returned, and
// lo = e4m3(x - hi), the subtraction in fp16, where hi is exact (decode_regs.fp8_halves).
__device__ __forceinline__ uint32_t p_halves(float x0, float x1, uint32_t& lo) {
  const float2 x = make_float2(x0, x1);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
  const __half2_raw hi_h = __nv_cvt_fp8x2_to_halfraw2(hi, __NV_E4M3);
  const __half2 d = __hsub2(__float22half2_rn(x), *reinterpret_cast<const __half2*>(&hi_h));
  lo = __nv_cvt_halfraw2_to_fp8x2(*reinterpret_cast<const __half2_raw*>(&d), __NV_SATFINITE, __NV_E4M3);
  return hi;
}

// P's two halves from a 64-head tile's probabilities s, as wgmma's accumulator holds them
// (decode_regs.scores_layout): register 4c + 2i + j of thread (warpgroup g, warp w, lane l) is head
// 16w + 8i + l / 4, row (ROWS / 2)g + 8c + 2(l % 4) + j. Rows 8 apart sit 2 bytes apart in P
// (p_offset), so columns c and c + 1 (c even) leave in one 4-byte store a half: half the stores of
// TileLang's loop over the fragment, 2 bytes each (docs/perf-log/2026-12-06.md).
template <int ROWS, int HEADS>
__device__ __forceinline__ void store_p(const float* s, void* p) {
  uint8_t* const half0 = static_cast<uint8_t*>(p);
  const int t = threadIdx.x, l = t & 31;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int h = ((t >> 5) & 3) * 16 + i * 8 + (l >> 2);
#pragma unroll
    for (int c = 0; c < ROWS / 16; c += 2) {
      const int at = p_offset(h, (t >> 7) * (ROWS / 2) + 8 * c + 2 * (l & 3));
      uint32_t lo0, lo1;
      const uint32_t hi0 = p_halves(s[4 * c + 2 * i], s[4 * c + 2 * i + 1], lo0);
      const uint32_t hi1 = p_halves(s[4 * c + 4 + 2 * i], s[4 * c + 4 + 2 * i + 1], lo1);
      *reinterpret_cast<uint32_t*>(half0 + at) = hi0 | (hi1 << 16);
      *reinterpret_cast<uint32_t*>(half0 + HEADS * 128 + at) = lo0 | (lo1 << 16);
    }
  }
}

// Waits for this thread's products in flight. tile() returns with its products still running, so
// that they overlap what the kernel does next (the next tile's gather and QK^T): P must not be
// overwritten, nor the accumulator read, before this.
__device__ __forceinline__ void settle() { tl::warpgroup_wait<0>(); }

// One tile: acc *= alpha (the online softmax's rescale, per head, from shared memory), then
// acc += V^T . (P_hi + P_lo)^T over the tile's ROWS rows, left in flight (settle). p: P's two e4m3
// halves, [2][HEADS heads][128 rows], 128-byte swizzled rows (a tile of 64 rows uses half of each).
// FRAGMENTS: k-steps' V fragments held at once, 2 (one is moved while the other's products run)
// or 1 where the kernel has no 16 registers to spare. The fp8 tile is read before this returns: its
// buffer may be refilled.
template <int ROWS, int HEADS, int FRAGMENTS>
__device__ __forceinline__ void tile(float* acc, const void* kv_tile, const void* p, const float* alpha) {
  static_assert(ROWS % 32 == 0 && ROWS <= 128, "P's rows are one 128-byte swizzle atom of k32 steps");
  static_assert(HEADS % 16 == 0 && HEADS <= 64, "heads come in 8-row groups of the 128-byte swizzle");
  constexpr int kPerTile = HEADS / 2;
  const int hq = 2 * (threadIdx.x & 3);
  settle();
#pragma unroll
  for (int j = 0; j < HEADS / 8; ++j) {
    const float2 s = *reinterpret_cast<const float2*>(alpha + 8 * j + hq);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        acc[t * kPerTile + j * 4 + i * 2] *= s.x;
        acc[t * kPerTile + j * 4 + i * 2 + 1] *= s.y;
      }
    }
  }
  tl::GmmaDescriptor desc;
  tl::initialize_wgmma_descriptor<1, 1, 64>(desc, p);  // 128-byte swizzle, 8-row groups 1,024 B apart
  uint32_t a[FRAGMENTS][4][4];
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
  tl::fence_proxy_async();  // P was written by ordinary stores; the product reads it asynchronously
#pragma unroll
  for (int k = 0; k < ROWS / 32; ++k) {
    if (k >= FRAGMENTS) tl::warpgroup_wait<FRAGMENTS - 1>();  // k-step k - FRAGMENTS is done with its fragment
    v_fragment<ROWS>(a[k % FRAGMENTS], static_cast<const uint8_t*>(kv_tile), k);
    tl::warpgroup_arrive();
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // P_hi, then P_lo (HEADS x 128 bytes further)
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        tl::wgmma_rs<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, 64, HEADS, 32,
                     false, false>(a[k % FRAGMENTS][t], uint64_t(desc + ((half * HEADS * 128 + k * 32) >> 4)),
                                   reinterpret_cast<uint32_t*>(acc + kPerTile * t), true);
      }
    }
    tl::warpgroup_commit_batch();
  }
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
}

// The 8 consecutive output columns (first_column()) this thread holds of head 8j + hq + c, times s.
template <int HEADS>
__device__ __forceinline__ void head_columns(const float* acc, int j, int c, float s, float (&v)[8]) {
  constexpr int kPerTile = HEADS / 2;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    v[2 * t] = acc[t * kPerTile + j * 4 + c] * s;
    v[2 * t + 1] = acc[t * kPerTile + j * 4 + 2 + c] * s;
  }
}

__device__ __forceinline__ uint4 bf16x8(const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * t], v[2 * t + 1]);
    w[t] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// out: the block's first head row of [heads, 512] bf16 rows; acc / row sum (inv_sum, shared) for
// the first `heads` heads, 16-byte stores.
template <int HEADS>
__device__ __forceinline__ void store(float* acc, void* out, const float* inv_sum, int heads) {
  settle();
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
  const int hq = 2 * (threadIdx.x & 3), c0 = first_column();
#pragma unroll
  for (int j = 0; j < HEADS / 8; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int h = 8 * j + hq + c;
      if (h < heads) {
        float v[8];
        head_columns<HEADS>(acc, j, c, inv_sum[h], v);
        *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(out) + h * kDv + c0) = bf16x8(v);
      }
    }
  }
}

// The shared-memory address of `local`'s counterpart in block `rank` of the cluster (`mapa`).
__device__ __forceinline__ uint32_t peer_address(const void* local, int rank) {
  return tl::set_block_rank(static_cast<uint32_t>(__cvta_generic_to_shared(local)), rank);
}

__device__ __forceinline__ void store_peer(uint32_t address, uint4 v) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void store_peer(uint32_t address, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(address), "f"(v) : "memory");
}

// Two splits' weights (w_mine + w_theirs = 1) and merged lse from their lse (natural log, -inf for
// a split that saw no row); both empty: weights 0 and -inf, never exp(-inf + inf) = NaN.
__device__ __forceinline__ float pair_weights(float mine, float theirs, float& w_mine, float& w_theirs) {
  const float top = fmaxf(mine, theirs);
  const float wm = top == -INFINITY ? 0.f : __expf(mine - top), wt = top == -INFINITY ? 0.f : __expf(theirs - top);
  const float total = wm + wt, inv_total = total == 0.f ? 0.f : 1.f / total;
  w_mine = wm * inv_total;
  w_theirs = wt * inv_total;
  return total == 0.f ? -INFINITY : top + __logf(total);
}

// The two splits of a query, a 2-CTA cluster (decode_regs.cluster_pair), merge through distributed
// shared memory. Block `rank` keeps the columns of its warpgroup `rank` (256 rank..+255): its other
// warpgroup sends its normalised rows (acc / row sum, bf16, as a split's partial always was) for
// the peer's kept columns into the peer's `exchange` (Q's buffer, HEADS x 512 B, free after the last
// tile's QK^T), laid out [head i of a thread][thread] x 16 bytes so that neither side's accesses
// conflict, and its lse into the peer's lse_pair[HEADS..]; lse_pair[0..HEADS) is this block's lse.
// Every thread of both blocks calls it. Rank 0 writes the merged lse.
template <int HEADS>
__device__ __forceinline__ void cluster_pair(float* acc, void* out, const float* inv_sum, float* lse_pair,
                                             void* exchange, float* lse_out, int heads) {
  settle();
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
  heads = min(heads, HEADS);  // the block's heads (the caller passes the heads left from its first)
  const int rank = tl::block_rank_in_cluster(), group = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int hq = 2 * (threadIdx.x & 3), c0 = first_column();
  uint4* slots = static_cast<uint4*>(exchange);
  tl::cluster_sync();  // both blocks are past their last tile (Q read), their lse in lse_pair
  if (group != rank) {
    const uint32_t remote = peer_address(slots, rank ^ 1);
#pragma unroll
    for (int i = 0; i < HEADS / 4; ++i) {  // the heads this thread holds
      const int h = 8 * (i / 2) + hq + i % 2;
      if (h < heads) {
        float v[8];
        head_columns<HEADS>(acc, i / 2, i % 2, inv_sum[h], v);
        store_peer(remote + (i * 128 + t) * 16, bf16x8(v));
      }
    }
    if (t < heads) store_peer(peer_address(lse_pair + HEADS + t, rank ^ 1), lse_pair[t]);
  }
  tl::cluster_sync();  // the peer's share is here
  if (group == rank) {
#pragma unroll
    for (int i = 0; i < HEADS / 4; ++i) {
      const int h = 8 * (i / 2) + hq + i % 2;
      if (h < heads) {
        float w_mine, w_theirs, v[8];
        pair_weights(lse_pair[h], lse_pair[HEADS + h], w_mine, w_theirs);
        head_columns<HEADS>(acc, i / 2, i % 2, inv_sum[h] * w_mine, v);
        const uint4 raw = slots[i * 128 + t];
        const __nv_bfloat162* theirs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(theirs[k]);
          v[2 * k] += f.x * w_theirs;
          v[2 * k + 1] += f.y * w_theirs;
        }
        *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(out) + h * kDv + c0) = bf16x8(v);
      }
    }
    if (rank == 0 && t < heads) {
      float w_mine, w_theirs;
      lse_out[t] = pair_weights(lse_pair[t], lse_pair[HEADS + t], w_mine, w_theirs);
    }
  }
}

}  // namespace dsaops_pv
