/* The persistent arms' diagnostic in-kernel timeline (contract.h,
 * mm_timeline_event; host/timeline.h): one thread's %globaltimer stamp, or
 * the latest of several (pull warps), or a duration summed over the forward.
 * No-ops when the layer has none (every layer but a split or fused one
 * created with MEGAMOE_TIMELINE=1 or mapped: host/timeline.h). */
#ifndef MEGAMOE_DEVICE_TIMELINE_CUH
#define MEGAMOE_DEVICE_TIMELINE_CUH

#include "common.cuh"
#include "contract.h"

/* Diagnostic builds (-DMM_FUSED_MATH_TIMELINE=1): the math warps' thread 0
 * sums the time of its parts: the fused kernel's mainloops, epilogues and
 * waits (MM_TL_MATH_*), the split kernels' epilogues (MM_TL_MATH_L1_EPI,
 * MM_TL_MATH_L2_EPI; their mainloops are the rest of the math span). */
#ifndef MM_FUSED_MATH_TIMELINE
#define MM_FUSED_MATH_TIMELINE 0
#endif

/* Stamps are stored (mm_tl_store, common.cuh) and summed with system scope:
 * a timeline in mapped host memory (MEGAMOE_TIMELINE=mapped) is read by the
 * host while the kernel runs. */
MM_DEVICE uint64_t* mm_tl_slot(const mm_layer_view& L, int event) {
  return L.timeline && blockIdx.x < MM_TL_MAX_CTAS ? L.timeline + (size_t)blockIdx.x * MM_TL_EVENTS + event : nullptr;
}
MM_DEVICE void mm_tl_stamp(const mm_layer_view& L, int event) {
  uint64_t* s = mm_tl_slot(L, event);
  if (s) mm_tl_store(s, mm_globaltimer_ns());
}
MM_DEVICE void mm_tl_stamp_latest(const mm_layer_view& L, int event) {
  uint64_t* s = mm_tl_slot(L, event);
  if (s) atomicMax_system(reinterpret_cast<unsigned long long*>(s), (unsigned long long)mm_globaltimer_ns());
}

/* Adds ns to a duration entry (MM_TL_FIRST_DURATION on). */
MM_DEVICE void mm_tl_add(const mm_layer_view& L, int event, uint64_t ns) {
  uint64_t* s = mm_tl_slot(L, event);
  if (s && ns) atomicAdd_system(reinterpret_cast<unsigned long long*>(s), (unsigned long long)ns);
}
/* The CTA's duration and SM-clock entries back to 0 (one thread, before any
 * role adds, and before mm_tl_clock_start, whose entry this clears too). */
MM_DEVICE void mm_tl_zero_durations(const mm_layer_view& L) {
  for (int e = MM_TL_FIRST_DURATION; e < MM_TL_EVENTS; ++e) {
    uint64_t* s = mm_tl_slot(L, e);
    if (s) mm_tl_store(s, 0);
  }
}
/* The SM clock over kernel 1 (raw readings; the host turns them into
 * MM_TL_SM_KHZ): thread 0 of the CTA, start right after the MM_TL_K1_START
 * stamp, end at its last math stamp there (it may run several times: the last
 * one counts). Stores only, so a mark costs what a stamp does. %clock64
 * counts the SM's own cycles: a CTA preempted onto another SM (a debugger,
 * time slicing) can give an end below the start, which the host drops. */
MM_DEVICE void mm_tl_clock_start(const mm_layer_view& L) {
  uint64_t* s = mm_tl_slot(L, MM_TL_CLK_START);
  if (s) mm_tl_store(s, (uint64_t)clock64());
}
MM_DEVICE void mm_tl_clock_end(const mm_layer_view& L) {
  uint64_t* s = mm_tl_slot(L, MM_TL_CLK_END);
  if (!s) return;
  mm_tl_store(s, (uint64_t)clock64());
  mm_tl_store(s + (MM_TL_CLK_END_NS - MM_TL_CLK_END), mm_globaltimer_ns());
}

/* The clock for a duration: 0 (and no read) when the layer has no timeline. */
MM_DEVICE uint64_t mm_tl_now(const mm_layer_view& L) { return L.timeline ? mm_globaltimer_ns() : 0; }

#endif
