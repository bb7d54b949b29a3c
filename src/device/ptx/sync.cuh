/* Fences, named barriers and register reconfiguration (PTX ISA "fence",
 * "bar", "setmaxnreg"). */
#ifndef MEGAMOE_PTX_SYNC_CUH
#define MEGAMOE_PTX_SYNC_CUH

#include <stdint.h>

#ifndef MM_PTX_DEVICE
#define MM_PTX_DEVICE __device__ __forceinline__
#endif

/* Orders this thread's generic-proxy shared-memory accesses before later
 * async-proxy accesses (TMA, wgmma operands) to the same memory: every
 * thread that wrote shared memory with ordinary stores that the tensor cores
 * or the copy engine read next runs this before the barrier that hands the
 * data over. */
MM_PTX_DEVICE void mm_fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Programmatic dependent launch (PTX "griddepcontrol", sm_90). When a
 * kernel is launched with programmatic stream serialization it may start
 * before the previous kernel on its stream has finished:
 *   mm_grid_dependency_wait      blocks until every prerequisite grid has
 *                                completed and its memory is visible; a
 *                                no-op for a kernel launched without it.
 *                                Nothing written by an earlier kernel (the
 *                                caller's inputs, the layer's own buffers)
 *                                may be touched before it.
 *   mm_grid_launch_dependents    lets the next kernel on the stream, if it
 *                                was launched the same way, be scheduled
 *                                (its CTAs still need free SMs, and it
 *                                still waits for this grid's completion
 *                                before touching our results). */
MM_PTX_DEVICE void mm_grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
MM_PTX_DEVICE void mm_grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* The first thing each persistent kernel does (every thread, before any
 * global memory access): wait for the kernel before it, then let the next
 * one be scheduled. When that is one of the layer's persistent kernels it
 * cannot take an SM before this kernel's CTA there has exited (one CTA fills
 * an SM's shared memory); a small caller kernel may start beside ours and run
 * its own work up to its wait. Either way it waits for this grid's
 * completion before it reads our results, so triggering at the start only
 * moves its launch off the critical path. */
MM_PTX_DEVICE void mm_programmatic_launch_prologue() {
  mm_grid_dependency_wait();
  mm_grid_launch_dependents();
}

/* Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads, a
 * multiple of 32; every participating warp executes it. */
MM_PTX_DEVICE void mm_named_barrier_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* Arrival on named barrier `id` without waiting: the barrier completes when
 * `count` threads (arrivals plus bar.sync waiters) have reached it. A warp
 * that arrives must not arrive again on the same barrier before the phase it
 * arrived on has completed (the callers' protocols guarantee this). */
MM_PTX_DEVICE void mm_named_barrier_arrive(uint32_t id, uint32_t count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* The same with a compile-time barrier id and count (immediate operands). */
template <uint32_t kId, uint32_t kCount>
MM_PTX_DEVICE void mm_named_barrier_sync_c() {
  static_assert(kId >= 1 && kId <= 15 && kCount % 32 == 0, "named barrier");
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kCount) : "memory");
}

template <uint32_t kId, uint32_t kCount>
MM_PTX_DEVICE void mm_named_barrier_arrive_c() {
  static_assert(kId >= 1 && kId <= 15 && kCount % 32 == 0, "named barrier");
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kCount) : "memory");
}

/* Named barrier `id` over `count` threads that also ORs a predicate over
 * them: every participating thread gets the same result. */
MM_PTX_DEVICE bool mm_named_barrier_or(uint32_t id, uint32_t count, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\t"
      "setp.ne.u32 q, %1, 0;\n\t"
      "bar.red.or.pred p, %2, %3, q;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(r)
      : "r"((uint32_t)pred), "r"(id), "r"(count)
      : "memory");
  return r != 0;
}

/* v, taken from lane 0, for a value the caller knows is the same in every
 * lane of the warp. ptxas moves a value into the uniform datapath only
 * where it can prove it warp-uniform, and the result of a shuffle from a
 * constant lane is such a value: a wgmma chain's descriptors computed from
 * it take one R2UR per base and uniform additions for the other slices,
 * instead of a regular computation and two R2URs per descriptor (the
 * mainloop's 32 R2URs per K block became 8). Every lane of the warp must
 * call it, converged (full mask). */
MM_PTX_DEVICE uint32_t mm_warp_uniform(uint32_t v) { return __shfl_sync(0xffffffffu, v, 0); }

/* Register reconfiguration of the executing warpgroup. All four warps of
 * the warpgroup execute the same one; the kernel needs a register cap at
 * entry (__launch_bounds__(threads, 1)). */
template <uint32_t kRegs>
MM_PTX_DEVICE void mm_setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg count");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <uint32_t kRegs>
MM_PTX_DEVICE void mm_setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg count");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

#endif
