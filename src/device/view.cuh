/* Accessors of the layer and forward views (contract.h) on the device. */
#ifndef MEGAMOE_DEVICE_VIEW_CUH
#define MEGAMOE_DEVICE_VIEW_CUH

#include "common.cuh"
#include "contract.h"

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

#endif
