// P.V of decode_tl's Hopper tiles with V taken from registers (imported into the kernel's CUDA
// source by decode_tl.decode_program; TileLang runs everything else of the tile).
//
// fp16 wgmma takes its A operand from registers, so the product is computed transposed:
// O^T [d, h] += V^T [d, r] . P^T [r, h], A = V^T converted from the fp8 tile in shared memory
// straight into registers (no fp16 copy of V in shared memory: on the H200 that upcast, its stores
// and the product's reads of them, cost 181 -> 159 us at H=64 S=256 with 64-row tiles), B = P,
// [HEADS][rows] fp16 in shared memory (K-major). The heads are the products' N, so a block of 16
// or 32 heads runs 16- or 32-wide products instead of 64 with the heads padded. Each warpgroup owns
// 256 of the 512 output columns: 4 m64 x HEADS x k16 products a k-step.
//
// Which output column a register row stands for is ours to choose. Thread (warpgroup g, warp w,
// lane l) holds, for m-tile t (0..3) and accumulator register j*4 + i*2 + c of it (j < HEADS / 8):
//   head   h = 8j + 2(l % 4) + c
//   column d = 256g + 64w + 8(l / 4) + 2t + i
// so the 8 columns a thread holds of each head are consecutive: one 8-byte shared load a KV row
// feeds all four m-tiles, and a head's 8 outputs leave in one 16-byte store.
// TileLang puts this source before its own includes.
#include <cuda_fp8.h>
#include <tl_templates/cuda/instruction/wgmma.h>
#include <tl_templates/cuda/intrin.h>
#include <tl_templates/cuda/barrier.h>

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

__device__ __forceinline__ uint32_t f16x2(uint32_t two_e4m3) {  // low byte -> low half
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_e4m3), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The A fragments of k-step kk (rows 16kk..16kk+15 of the tile) for the four m-tiles: register
// 2p + i of m-tile t holds rows (r + 8p, r + 8p + 1), column 2t + i, r = 16kk + 2(l % 4).
template <int ROWS>
__device__ __forceinline__ void v_fragment(uint32_t (&a)[4][4], const uint8_t* tile, int kk) {
  const int r = kk * 16 + 2 * (threadIdx.x & 3), c = first_column();
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const uint2 lo = *reinterpret_cast<const uint2*>(tile + kv_offset<ROWS>(r + 8 * p, c));
    const uint2 hi = *reinterpret_cast<const uint2*>(tile + kv_offset<ROWS>(r + 8 * p + 1, c));
    // bytes (row r, row r+1) of two columns side by side: [r c, r+1 c, r c+1, r+1 c+1]
    const uint32_t x[4] = {__byte_perm(lo.x, hi.x, 0x5140), __byte_perm(lo.x, hi.x, 0x7362),
                           __byte_perm(lo.y, hi.y, 0x5140), __byte_perm(lo.y, hi.y, 0x7362)};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      a[t][2 * p] = f16x2(x[t] & 0xffff);
      a[t][2 * p + 1] = f16x2(x[t] >> 16);
    }
  }
}

// Waits for this thread's products in flight. tile() returns with its products still running, so
// that they overlap what the kernel does next (the next tile's gather and QK^T): P must not be
// overwritten, nor the accumulator read, before this.
__device__ __forceinline__ void settle() { tl::warpgroup_wait<0>(); }

// One tile: acc *= alpha (the online softmax's rescale, per head, from shared memory), then
// acc += V^T . P^T over the tile's ROWS rows, left in flight (settle). p: ROWS / 64 blocks of
// [HEADS heads][64 rows] fp16, 128-byte swizzled rows. The fp8 tile is read before this returns: its
// buffer may be refilled.
template <int ROWS, int HEADS>
__device__ __forceinline__ void tile(float* acc, const void* kv_tile, const void* p, const float* alpha) {
  static_assert(ROWS % 64 == 0, "P comes in blocks of 64 rows");
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
  uint32_t a[2][4][4];  // two k-steps' fragments: one converts while the other's products run
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
  tl::fence_proxy_async();  // P was written by ordinary stores; the product reads it asynchronously
#pragma unroll
  for (int k = 0; k < ROWS / 16; ++k) {
    if (k >= 2) tl::warpgroup_wait<1>();  // k-step k - 2 is done with a[k % 2]
    v_fragment<ROWS>(a[k % 2], static_cast<const uint8_t*>(kv_tile), k);
    tl::warpgroup_arrive();
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      tl::wgmma_rs<tl::DataType::kFloat16, tl::DataType::kFloat16, tl::DataType::kFloat32, 64, HEADS, 16, false, false>(
          a[k % 2][t], uint64_t(desc + (((k / 4) * HEADS * 128 + (k % 4) * 32) >> 4)),
          reinterpret_cast<uint32_t*>(acc + kPerTile * t), true);
    }
    tl::warpgroup_commit_batch();
  }
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
}

// out: the block's first head row of [heads, 512] bf16 rows; acc / row sum (inv_sum, shared) for
// the first `heads` heads, 16-byte stores.
template <int HEADS>
__device__ __forceinline__ void store(float* acc, void* out, const float* inv_sum, int heads) {
  constexpr int kPerTile = HEADS / 2;
  settle();
  tl::warpgroup_fence_operand(acc, kRegs<HEADS>);
  const int hq = 2 * (threadIdx.x & 3), c0 = first_column();
#pragma unroll
  for (int j = 0; j < HEADS / 8; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int h = 8 * j + hq + c;
      if (h < heads) {
        const float s = inv_sum[h];
        uint32_t w[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const __nv_bfloat162 v =
              __floats2bfloat162_rn(acc[t * kPerTile + j * 4 + c] * s, acc[t * kPerTile + j * 4 + 2 + c] * s);
          w[t] = *reinterpret_cast<const uint32_t*>(&v);
        }
        *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(out) + h * kDv + c0) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
}

}  // namespace dsaops_pv
