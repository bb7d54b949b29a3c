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

/* The persistent arms' early combine (route_phases.cuh): built in with
 * -DMM_EARLY_COMBINE=1 (make NVCC="nvcc -DMM_EARLY_COMBINE=1"). Off by
 * default until it has run on a GPU: it was written in a session with no
 * device lent, and the default build's kernels keep their tested code
 * (docs/PERF.md, sixteenth session). */
#ifndef MM_EARLY_COMBINE
#define MM_EARLY_COMBINE 0
#endif

/* A compile-time bool passed to a generic lambda (its decltype's value):
 * one lambda body, two instantiations (the mainloop's last K block). */
template <bool V>
struct mm_bool_tag {
  static constexpr bool value = V;
};

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

/* min / max that return NaN when either operand is NaN (PTX min.NaN /
 * max.NaN, sm_80+): one instruction where a compare and a select take two.
 * For the clamp's operands (c > 0 or +inf, config.c) they equal the
 * comparisons below on every value: no signed-zero tie can arise. */
MM_DEVICE float mm_min_nan(float a, float b) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
MM_DEVICE float mm_max_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

/* silu(g) * u with the contract's clamp: g = min(g, c), u = clamp(u, -c, c),
 * as the reference writes it with comparisons (g > c ? c : g, ...). A NaN
 * stays NaN (fminf / fmaxf would return the other operand and turn a NaN
 * input into a finite clamp value, so a NaN token would end in a finite,
 * wrong row); for every other value the NaN-propagating min / max give the
 * comparisons' result.
 * No branch: without the clamp the bound is +inf, which leaves every value
 * as it is. A branch here was taken per element in the GEMM epilogue's
 * unrolled loop and serialized it (docs/PERF.md, eighth session); the bound
 * is loop-invariant, so the compiler selects it once. */
MM_DEVICE float mm_swiglu(float g, float u, int has_clamp, float clamp) {
  const float c = has_clamp ? clamp : __int_as_float(0x7f800000);
  g = mm_min_nan(g, c);
  u = mm_max_nan(mm_min_nan(u, c), -c);
  /* The hardware exp2 and reciprocal (ex2.approx, rcp.approx: a few ulp,
   * far below the e4m3 step the result is quantized to) instead of expf and
   * an IEEE division, ~20 instructions fewer per element in the L1
   * epilogue, which runs while the tensor cores wait (docs/PERF.md). Every
   * GPU arm calls this one function, so the arms stay bitwise equal; the CPU
   * reference keeps expf and the division (the tests' bounds absorb ulps).
   * The ftz form of ex2 (no subnormal scaling around it: three
   * instructions fewer) gives the same denominator: it differs only where
   * exp(-g) is subnormal, and 1 + a subnormal rounds to 1 either way.
   * g -> -inf: exp overflows to inf and g * 0 = -0 as g / inf; g = -inf
   * gives NaN as the division does. */
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.4426950408889634f));
  return __fdividef(g, 1.0f + e) * u;
}

/* Scale of one quantization group: the raw scale, not a power of two. */
MM_DEVICE float mm_group_scale(float amax) { return fmaxf(amax, 1e-10f) / 448.0f; }

/* a / sf, bitwise equal to the division wherever it can change an e4m3 code,
 * for |a| <= the group's amax (sf = mm_group_scale(amax), finite), given
 * rcp = __frcp_rn(sf) (one per row instead of one division per element).
 * Markstein's correction: q0 = a * rcp, e = a - sf * q0 (exact, by FMA),
 * q0 + e * rcp rounded once is the correctly rounded quotient; e == 0 keeps
 * q0 (a zero keeps its sign). The only quotients where it can differ are
 * those of a subnormal a, all below 2^-20, far under e4m3's smallest step.
 * Checked against the division on the CPU (150M draws) and on the GPU
 * (tests/gpu, quant_div).
 * An infinite sf (an infinite amax; rcp = 0) is folded in without a branch:
 * the caller passes sf_fma = 0 there (mm_quant_e4m3x2). Then e = a, and
 * q0 + e * rcp = a * 0 + a * 0: +-0 with a's sign for a finite a, NaN for an
 * infinite or NaN a, which is a / inf exactly. */
MM_DEVICE float mm_div_by_scale(float a, float sf_fma, float rcp) {
  const float q0 = __fmul_rn(a, rcp);
  const float e = __fmaf_rn(-sf_fma, q0, a);
  return e == 0.0f ? q0 : __fmaf_rn(e, rcp, q0);
}

/* Two e4m3 codes, x0 in the low byte (the lower address), as mm_float_to_e4m3. */
MM_DEVICE uint16_t mm_float2_to_e4m3x2(float x0, float x1) {
  return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
}

/* The codes of a0 / sf and a1 / sf (the contract's quantization), given
 * rcp = __frcp_rn(sf). No branch (a division fallback per pair was a call
 * and a branch in every step of the epilogue's unrolled loop): the infinite
 * sf is mm_div_by_scale's sf_fma = 0 case, selected once per row. */
MM_DEVICE uint16_t mm_quant_e4m3x2(float a0, float a1, float sf, float rcp) {
  const float sf_fma = isfinite(sf) ? sf : 0.0f;
  return mm_float2_to_e4m3x2(mm_div_by_scale(a0, sf_fma, rcp), mm_div_by_scale(a1, sf_fma, rcp));
}

/* ---- The device error record (contract.h mm_device_status) ---------------
 * Keyed by forward: an error counts only for the forward that recorded it.
 * Readers use volatile loads (the record is written by other CTAs of the
 * same kernel, never cached in L1 for them). */
MM_DEVICE uint64_t mm_forward_number(const mm_device_status* st) {
  return *(volatile const uint64_t*)&st->forward;
}

/* The error code of the forward in progress, or 0. */
MM_DEVICE int mm_error_code(const mm_device_status* st) {
  const uint64_t key = *(volatile const uint64_t*)&st->key;
  return (key >> MM_STATUS_KEY_SHIFT) == mm_forward_number(st) ? (int)(key & MM_STATUS_CODE_MASK) : 0;
}

/* Whether the forward in progress has an error (older forwards' errors do
 * not count). */
MM_DEVICE int mm_failed(const mm_device_status* st) { return mm_error_code(st) != 0; }

/* 1 once a timeout left the ranks out of step (for good). */
MM_DEVICE int mm_dead(const mm_device_status* st) { return *(volatile const int32_t*)&st->dead != 0; }

/* Records `code` as the error of the forward in progress unless it already
 * has one (first error wins). A timeout marks the layer dead even then: the
 * ranks or CTAs are out of step for good (a grid barrier's count, a
 * barrier's sequence), whatever the forward's first error was. The winner
 * fills the details, counts the failed forward and copies the error into
 * `first` when no unreported error is there. */
MM_DEVICE void mm_record_error_waited(mm_device_status* st, int code, int where, int peer, int detail,
                                      uint64_t seen, uint64_t want, uint64_t waited_ns) {
  const uint64_t fwd = mm_forward_number(st);
  const unsigned long long key =
      (unsigned long long)((fwd << MM_STATUS_KEY_SHIFT) | ((uint64_t)code & MM_STATUS_CODE_MASK));
  unsigned long long* key_word = reinterpret_cast<unsigned long long*>(&st->key);
  if (code == MEGAMOE_ERR_TIMEOUT) *(volatile int32_t*)&st->dead = 1;
  unsigned long long old = *(volatile unsigned long long*)key_word;
  for (;;) {
    if ((old >> MM_STATUS_KEY_SHIFT) >= fwd) return; /* this forward already has its error */
    const unsigned long long prev = atomicCAS(key_word, old, key);
    if (prev == old) break;
    old = prev;
  }
  st->code = code;
  st->where = where;
  st->peer = peer;
  st->detail = detail;
  st->seen = seen;
  st->want = want;
  st->epoch = fwd;
  st->waited_ns = waited_ns;
  atomicAdd(&st->failed_forwards, 1u);
  if (atomicCAS(reinterpret_cast<unsigned long long*>(&st->first.key), 0ull, key) == 0ull) {
    st->first.forward = fwd;
    st->first.seen = seen;
    st->first.want = want;
    st->first.waited_ns = waited_ns;
    st->first.code = code;
    st->first.where = where;
    st->first.peer = peer;
    st->first.detail = detail;
  }
  __threadfence();
}

MM_DEVICE void mm_record_error(mm_device_status* st, int code, int where, int peer, int detail,
                               uint64_t seen, uint64_t want) {
  mm_record_error_waited(st, code, where, peer, detail, seen, want, 0);
}

/* ---- System-scope flags (cross-GPU over NVLink) --------------------------- */
MM_DEVICE void mm_st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MM_DEVICE uint64_t mm_ld_relaxed_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MM_DEVICE uint64_t mm_ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/* A diagnostic timeline stamp (timeline.cuh; also the GEMM producers' first
 * tile stamp): a strong system-scope store, because a timeline in mapped host
 * memory (MEGAMOE_TIMELINE=mapped) is read by the host while the kernel runs,
 * and only such a write is sure to reach it before the kernel ends (a weak one
 * may sit in L2). In device memory it costs what a plain store does: both go
 * to L2. No "memory" clobber: a stamp orders nothing around it, as the plain
 * store it replaced did not (the asm is volatile, so it is not dropped). */
MM_DEVICE void mm_tl_store(uint64_t* s, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(s), "l"(v));
}

MM_DEVICE uint64_t mm_globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* ---- Block and warp helpers --------------------------------------------- */
/* Inclusive prefix sum of one value per lane over the calling warp (all 32
 * lanes). */
MM_DEVICE int mm_warp_inclusive_scan(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += n;
  }
  return v;
}

/* Exclusive prefix sum of one value per lane over the calling warp (all 32
 * lanes); *total gets the warp's sum unless total is NULL (then the shuffle
 * that would broadcast it is not issued). No CTA barrier. */
MM_DEVICE int mm_warp_exclusive_scan(int v, int* total) {
  const int inc = mm_warp_inclusive_scan(v);
  if (total) *total = __shfl_sync(0xffffffffu, inc, 31);
  return inc - v;
}

/* Exclusive prefix sum of one value per thread over a block of up to 1024
 * threads (blockDim.x a multiple of 32). Returns the exclusive prefix and
 * writes the block total. `scratch` holds 32 ints. Ends with a barrier. */
MM_DEVICE int mm_block_exclusive_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int inc = mm_warp_inclusive_scan(v);
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  /* Warp 0: the inclusive prefix of the warp totals. */
  if (warp == 0) scratch[lane] = mm_warp_inclusive_scan(lane < warps ? scratch[lane] : 0);
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
