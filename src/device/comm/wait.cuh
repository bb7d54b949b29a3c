/* In-kernel waits with the layer's deadline, and the ordering primitives the
 * arms use to hand data from one role (or GPU) to another.
 *
 * Every spin in megamoe ends: a wait that does not see its value before the
 * deadline records MEGAMOE_ERR_TIMEOUT in the layer's status record (first
 * error wins) and returns false, and the caller leaves its loop (no trap, no
 * hang). Callers of a failed wait must not touch the data it guarded. Only
 * an error of the CURRENT forward (mm_failed, comm/forward.cuh) stops a wait
 * early; an earlier forward's error never does.
 *
 * Ordering recipes (PTX memory model):
 *  - data written by ordinary stores of THIS thread, read by another CTA or
 *    GPU after it acquires the counter: store data; mm_red_release_*(counter).
 *  - data written by OTHER threads of this CTA: they store, then a CTA barrier
 *    (bar.sync orders their stores before it at CTA scope), then one thread
 *    does a release at gpu/sys scope: the release is cumulative over what the
 *    barrier made visible to it (mm_cta_publish_add; the reading CTA's side
 *    is mm_cta_wait_counter_geq). A whole grid: comm/grid.cuh.
 *  - data that the async proxy reads next (TMA loads of rows that warps wrote
 *    with st.global): the writer runs mm_fence_proxy_async_global() after its
 *    stores and before the release; the reader, after its acquire and before
 *    issuing the TMA, runs it too (cheap, and it makes the handover correct
 *    whichever side the model requires it on). */
#ifndef MEGAMOE_COMM_WAIT_CUH
#define MEGAMOE_COMM_WAIT_CUH

#include "common.cuh"

/* ---- Scoped loads, stores and reductions -------------------------------- */
MM_DEVICE int32_t mm_ld_acquire_gpu_s32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE int32_t mm_ld_acquire_sys_s32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* Coherent (not the non-coherent __ldg path) read of a value another kernel
 * or another CTA of this kernel wrote: expert counts, offsets. */
MM_DEVICE int32_t mm_ld_relaxed_gpu_s32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE int32_t mm_ld_relaxed_sys_s32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE uint64_t mm_ld_relaxed_gpu_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE uint64_t mm_ld_acquire_gpu_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE uint64_t mm_atom_add_acq_rel_gpu_u64(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

MM_DEVICE uint32_t mm_atom_add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

MM_DEVICE float mm_ld_relaxed_gpu_f32(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

MM_DEVICE void mm_red_release_gpu_add_s32(int32_t* p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

MM_DEVICE void mm_red_release_sys_add_s32(int32_t* p, int32_t v) {
  asm volatile("red.release.sys.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* With mm_fence_acq_rel_sys before it: a release at system scope (the fence
 * is cumulative; one fence serves many adds). */
MM_DEVICE void mm_red_relaxed_sys_add_s32(int32_t* p, int32_t v) {
  asm volatile("red.relaxed.sys.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

MM_DEVICE void mm_fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

MM_DEVICE void mm_st_release_gpu_s32(int32_t* p, int32_t v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Generic-proxy global writes <-> async-proxy (TMA) global reads. */
MM_DEVICE void mm_fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

/* ---- Deadlines ------------------------------------------------------------ */
typedef struct mm_deadline {
  uint64_t start_ns;
  uint64_t timeout_ns;
} mm_deadline;

MM_DEVICE mm_deadline mm_deadline_start(uint64_t timeout_ns) {
  mm_deadline d;
  d.start_ns = mm_globaltimer_ns();
  d.timeout_ns = timeout_ns;
  return d;
}

MM_DEVICE bool mm_deadline_passed(const mm_deadline& d) {
  return mm_globaltimer_ns() - d.start_ns > d.timeout_ns;
}

/* Where a failed wait records itself (any pointer may be NULL). */
typedef struct mm_wait_ctx {
  mm_device_status* status; /* the layer's status record */
  uint64_t timeout_ns;
  int32_t site;             /* mm_wait_site */
  const volatile int32_t* abort_flag; /* another role gave up: stop waiting (shared or global) */
} mm_wait_ctx;

/* Spins until *counter >= target (acquire at gpu scope, or sys scope when
 * kSys). The spin polls with relaxed loads and acquires once, when the value
 * is there: on sm_90 every ld.acquire also invalidates the SM's L1 cache
 * (CCTL.IVALL), so an acquire per poll, in a wait of microseconds, kept
 * evicting the math warps' cached B scales (ncu on the fused kernel: 437k
 * invalidations in one forward, the mainloop's top stall on those loads).
 * Counters only grow, so the acquiring re-read sees >= target too. Returns true when reached. Returns false when the deadline passed
 * (MEGAMOE_ERR_TIMEOUT recorded with detail = the counter's index given by
 * the caller, seen / want the values, and how long it waited) or when
 * *abort_flag became non-zero or the status record holds an error of the
 * CURRENT forward (nothing recorded; an error of an earlier forward does not
 * stop a wait). */
template <bool kSys>
MM_DEVICE bool mm_wait_counter_geq(const int32_t* counter, int32_t target, const mm_wait_ctx& ctx,
                                   int detail) {
  int32_t seen = kSys ? mm_ld_acquire_sys_s32(counter) : mm_ld_acquire_gpu_s32(counter);
  if (seen >= target) return true;
  const mm_deadline d = mm_deadline_start(ctx.timeout_ns);
  for (uint32_t spin = 1;; ++spin) {
    seen = kSys ? mm_ld_relaxed_sys_s32(counter) : mm_ld_relaxed_gpu_s32(counter);
    if (seen >= target) {
      seen = kSys ? mm_ld_acquire_sys_s32(counter) : mm_ld_acquire_gpu_s32(counter);
      if (seen >= target) return true; /* always, by coherence: the counter only grows */
    }
    if ((spin & 31u) == 0) {
      if (ctx.abort_flag && *ctx.abort_flag) return false;
      if (ctx.status && mm_failed(ctx.status)) return false;
      if (mm_deadline_passed(d)) {
        if (ctx.status)
          mm_record_error_waited(ctx.status, MEGAMOE_ERR_TIMEOUT, ctx.site, -1, detail, (uint64_t)(int64_t)seen,
                                 (uint64_t)(int64_t)target, mm_globaltimer_ns() - d.start_ns);
        return false;
      }
    }
  }
}

/* ---- Handing data written by many threads of a CTA to another CTA/GPU ---- */

/* Publishes what EVERY thread of this CTA stored before the call: all
 * threads of the CTA call it (it has a CTA barrier). bar.sync orders the
 * other threads' stores before thread 0's later operations (CTA scope), and
 * thread 0's release at gpu (or sys) scope is cumulative over them, so a
 * reader that acquires the counter sees every thread's data. With
 * kAsyncReader each thread first runs the async-proxy fence, for a reader
 * that loads the data with TMA. */
template <bool kSys, bool kAsyncReader>
MM_DEVICE void mm_cta_publish_add(int32_t* counter, int32_t add) {
  if (kAsyncReader) mm_fence_proxy_async_global();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    if (kSys) mm_red_release_sys_add_s32(counter, add);
    else mm_red_release_gpu_add_s32(counter, add);
  }
}

/* The reader's side for a whole CTA: thread 0 waits (acquire), the CTA
 * barrier then orders its acquire before every thread's later loads (the
 * acquire also invalidates this SM's L1, so plain loads see the data; never
 * read such data through the non-coherent path, __ldg / ld.global.nc).
 * All threads call it and get the same answer. With kAsyncReader thread 0
 * runs the async-proxy fence after the acquire, before the caller issues TMA. */
template <bool kSys, bool kAsyncReader>
MM_DEVICE bool mm_cta_wait_counter_geq(const int32_t* counter, int32_t target, const mm_wait_ctx& ctx,
                                       int detail) {
  int reached = 1; /* thread 0's answer; the other threads vote 1 */
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    reached = mm_wait_counter_geq<kSys>(counter, target, ctx, detail) ? 1 : 0;
    if (kAsyncReader) mm_fence_proxy_async_global();
  }
  /* The CTA barrier (bar.red orders memory as bar.sync does) also hands
   * thread 0's answer to every thread. */
  return __syncthreads_and(reached) != 0;
}

#endif
