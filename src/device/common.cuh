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

template <typename T>
MM_DEVICE T* mm_offset(void* base, uint64_t offset) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(base) + offset);
}

#endif
