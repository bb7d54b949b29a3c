/* Small device helpers shared by the kernels: fp8/bf16 conversion, the
 * device error record, cross-GPU flag loads/stores with system scope. */
#ifndef MEGAMOE_DEVICE_COMMON_CUH
#define MEGAMOE_DEVICE_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "contract.h"
#include "megamoe.h"

#define MM_DEVICE __device__ __forceinline__

MM_DEVICE float mm_e4m3_to_float(uint8_t v) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
  return __half2float(__half(h));
}

/* Round to nearest even, saturate to +-448, NaN stays NaN (the contract). */
MM_DEVICE uint8_t mm_float_to_e4m3(float x) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

MM_DEVICE float mm_bf16_to_float(uint16_t v) {
  return __uint_as_float(((uint32_t)v) << 16);
}

MM_DEVICE uint16_t mm_float_to_bf16(float x) {
  __nv_bfloat16 b = __float2bfloat16_rn(x);
  return *reinterpret_cast<uint16_t*>(&b);
}

/* silu(g) * u with the contract's clamp. */
MM_DEVICE float mm_swiglu(float g, float u, int has_clamp, float clamp) {
  if (has_clamp) {
    g = fminf(g, clamp);
    u = fminf(fmaxf(u, -clamp), clamp);
  }
  return g / (1.0f + expf(-g)) * u;
}

/* Scale of one quantization group: the raw scale, not a power of two. */
MM_DEVICE float mm_group_scale(float amax) { return fmaxf(amax, 1e-10f) / 448.0f; }

/* ---- The device error record --------------------------------------------
 * First error wins. Readers poll `code` with a volatile load at kernel start
 * to skip work after a failure. */
MM_DEVICE int mm_failed(const mm_device_status* st) {
  return *(volatile const int32_t*)&st->code != 0;
}

MM_DEVICE void mm_record_error(mm_device_status* st, int code, int where, int peer, int detail,
                               uint64_t seen, uint64_t want) {
  if (atomicCAS(&st->code, 0, code) == 0) {
    st->where = where;
    st->peer = peer;
    st->detail = detail;
    st->seen = seen;
    st->want = want;
    __threadfence();
  }
}

/* ---- System-scope flags (cross-GPU over NVLink) --------------------------- */
MM_DEVICE void mm_st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MM_DEVICE uint64_t mm_ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE uint64_t mm_globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* ---- Block and warp helpers --------------------------------------------- */
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

template <typename T>
MM_DEVICE T* mm_offset(void* base, uint64_t offset) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(base) + offset);
}

#endif
