/* The split arm's diagnostic in-kernel timeline (contract.h,
 * mm_timeline_event; host/timeline.h): one thread's %globaltimer stamp, or
 * the latest of several (pull warps). No-ops when the layer has none (every
 * layer but a split one created with MEGAMOE_TIMELINE=1). */
#ifndef MEGAMOE_DEVICE_TIMELINE_CUH
#define MEGAMOE_DEVICE_TIMELINE_CUH

#include "common.cuh"
#include "contract.h"

MM_DEVICE uint64_t* mm_tl_slot(const mm_layer_view& L, int event) {
  return L.timeline && blockIdx.x < MM_TL_MAX_CTAS ? L.timeline + (size_t)blockIdx.x * MM_TL_EVENTS + event : nullptr;
}
MM_DEVICE void mm_tl_stamp(const mm_layer_view& L, int event) {
  uint64_t* s = mm_tl_slot(L, event);
  if (s) *s = mm_globaltimer_ns();
}
MM_DEVICE void mm_tl_stamp_latest(const mm_layer_view& L, int event) {
  uint64_t* s = mm_tl_slot(L, event);
  if (s) atomicMax(reinterpret_cast<unsigned long long*>(s), (unsigned long long)mm_globaltimer_ns());
}

#endif
