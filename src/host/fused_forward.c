/* The fused arm's forward (fused_forward.h). */
#include "fused_forward.h"

#include <stdio.h>
#include <string.h>

#include "device/fused/fused_arm.h"
#include "errors.h"

megamoe_status mm_fused_forward(const mm_layer_view* L, const mm_forward_view* F, const mm_fused_ring* ring,
                                const megamoe_config* c, int64_t bound, const mm_arm_gemm* gemms,
                                cudaStream_t stream) {
  mm_fused_order order;
  memset(&order, 0, sizeof order); /* every field defined on the fallback path too */
  const megamoe_status st = mm_fused_call_order(ring, c, L->num_ranks, F->num_tokens, bound, &order);
  if (st == MEGAMOE_OK) {
    order.dynamic_claim = mm_fused_claim_for(ring, mm_gemm_tile_rows(gemms[0].plan.tile));
    return mm_fused_launch(L, F, &order, bound, &gemms[0].plan, &gemms[1].plan, stream);
  }
  /* Not reached for a bound megamoe_forward accepted (the same check) and
   * the layout's ring (mm_fused_call_order's live-set check holds by
   * construction). Still, the peers must not wait: this rank runs the empty
   * forward carrying the status, in the single-wave order (no task). */
  char message[512];
  snprintf(message, sizeof message, "%s", megamoe_last_error());
  mm_forward_view empty;
  memset(&empty, 0, sizeof empty);
  empty.injected_error = (int32_t)st;
  order.single_wave = 1;
  order.lag = 0;
  order.group = ring->group;
  order.ring_blocks = ring->blocks;
  const megamoe_status run = mm_fused_launch(L, &empty, &order, 0, &gemms[0].plan, &gemms[1].plan, stream);
  if (run != MEGAMOE_OK)
    return mm_fail(st, "%s (and the empty forward that keeps the peers in step failed to enqueue: %s)", message,
                   megamoe_last_error());
  return mm_fail(st, "%s", message);
}
