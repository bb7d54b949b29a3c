/* Helpers shared by the staged kernels. */
#ifndef MEGAMOE_STAGED_COMMON_CUH
#define MEGAMOE_STAGED_COMMON_CUH

#include "common.cuh"
#include "staged/staged.h"

template <typename T>
MM_DEVICE T* mm_ws(const mm_layer_view& L, mm_region_id id) {
  return reinterpret_cast<T*>(L.ws + L.offset[id]);
}

/* Region `id` of rank `owner`'s symmetric buffer (own rank: local memory). */
template <typename T>
MM_DEVICE T* mm_sym(const mm_layer_view& L, int owner, mm_region_id id) {
  return reinterpret_cast<T*>(L.peer_sym[owner] + L.offset[id]);
}

MM_DEVICE mm_device_status* mm_status(const mm_layer_view& L) {
  return mm_ws<mm_device_status>(L, MM_WS_STATUS);
}

/* Global expert id of slot i of the top-k array, or a value outside [-1, E)
 * (int64 ids that do not fit in 32 bits map to INT32_MIN). */
MM_DEVICE int32_t mm_topk_at(const mm_forward_view& F, int64_t i) {
  if (F.topk_idx_int64) {
    const int64_t v = static_cast<const int64_t*>(F.topk_idx)[i];
    return (v < INT32_MIN || v > INT32_MAX) ? INT32_MIN : (int32_t)v;
  }
  return static_cast<const int32_t*>(F.topk_idx)[i];
}

/* Exclusive prefix sum of one value per thread over a block of up to 1024
 * threads (blockDim.x a multiple of 32). Returns the exclusive prefix and
 * writes the block total. `scratch` holds 32 ints. Ends with a barrier. */
MM_DEVICE int mm_block_exclusive_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int inc = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    int n = __shfl_up_sync(0xffffffffu, inc, d);
    if (lane >= d) inc += n;
  }
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? scratch[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      int n = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += n;
    }
    scratch[lane] = w; /* inclusive prefix of warp totals */
  }
  __syncthreads();
  const int warp_base = warp > 0 ? scratch[warp - 1] : 0;
  *total = scratch[warps - 1];
  __syncthreads();
  return warp_base + inc - v;
}

/* Copies n bytes (multiple of 16, both 16-byte aligned) with one warp,
 * keeping several 16-byte loads in flight before the stores. */
MM_DEVICE void mm_warp_copy16(uint8_t* dst, const uint8_t* src, int64_t n) {
  const int lane = threadIdx.x & 31;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const int64_t words = n / 16;
  int64_t i = lane;
  for (; i + 3 * 32 < words; i += 4 * 32) {
    uint4 a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
    d[i] = a;
    d[i + 32] = b;
    d[i + 64] = c;
    d[i + 96] = e;
  }
  for (; i < words; i += 32) d[i] = s[i];
}

#endif
