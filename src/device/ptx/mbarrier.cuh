/* mbarrier wrappers (PTX ISA "mbarrier"), shared::cta only.
 *
 * Every function takes the barrier as a 32-bit shared-window address
 * (mm_smem_addr). Arrivals have the default .release.cta semantics and the
 * waits .acquire.cta, so ordinary shared-memory writes made before an arrive
 * are visible to a thread whose wait saw that phase complete. Phases: a fresh
 * barrier is in phase 0; waiting for parity 1 on it returns at once (the
 * "previous" phase counts as complete), which is how a producer's first pass
 * over an empty ring goes through. */
#ifndef MEGAMOE_PTX_MBARRIER_CUH
#define MEGAMOE_PTX_MBARRIER_CUH

#include <stdint.h>

#ifndef MM_PTX_DEVICE
#define MM_PTX_DEVICE __device__ __forceinline__
#endif

/* A wait that has not seen its phase after this many nanoseconds traps (the
 * kernel fails with "unspecified launch failure") instead of hanging: every
 * wait in the GEMM engine is on data the same CTA produces microseconds
 * later, so this only fires on a protocol bug. 0 disables the check. */
#ifndef MM_MBAR_TIMEOUT_NS
#define MM_MBAR_TIMEOUT_NS 20000000000ull
#endif

/* Shared-window (32-bit) address of a pointer into shared memory. */
MM_PTX_DEVICE uint32_t mm_smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

MM_PTX_DEVICE void mm_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* Makes mbarrier.init visible to the async proxy (TMA completes on these
 * barriers) and, after the CTA barrier that must follow, to all threads. */
MM_PTX_DEVICE void mm_fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* One arrival. */
MM_PTX_DEVICE void mm_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* One arrival that also raises the phase's expected transaction count by
 * bytes (the bytes the bulk copies issued for this phase will deliver). */
MM_PTX_DEVICE void mm_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

/* 1 when the phase of the given parity has completed. May suspend the thread
 * for a hardware-chosen time before answering 0. */
MM_PTX_DEVICE uint32_t mm_mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done;
}

/* 1 when the phase of the given parity has completed; never suspends (a
 * probe whose answer 0 leaves the waiting to a later try_wait). The same
 * acquire semantics as try_wait when it answers 1. */
MM_PTX_DEVICE uint32_t mm_mbar_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done;
}

/* Waits until the phase of the given parity has completed. */
MM_PTX_DEVICE void mm_mbar_wait(uint32_t bar, uint32_t parity) {
  if (mm_mbar_try_wait(bar, parity)) return;
#if MM_MBAR_TIMEOUT_NS
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (uint32_t spin = 1;; ++spin) {
    if (mm_mbar_try_wait(bar, parity)) return;
    if ((spin & 1023u) == 0) {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > (uint64_t)MM_MBAR_TIMEOUT_NS) __trap();
    }
  }
#else
  while (!mm_mbar_try_wait(bar, parity)) {
  }
#endif
}

#endif
