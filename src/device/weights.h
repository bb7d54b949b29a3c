/* Weight preparation (C interface): checkpoint layout -> kernel layout. */
#ifndef MEGAMOE_WEIGHTS_H
#define MEGAMOE_WEIGHTS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* W1 [E_l, 2I, H] + its 128x128 scales -> W1p (contract.h, MM_W1_INTERLEAVE)
 * + per-64-row-chunk scales, one rank's E_l experts, enqueued on stream. */
megamoe_status mm_prepare_w1(const uint8_t* w1, const float* w1_sf, uint8_t* w1p, float* w1p_sf,
                             int32_t local_experts, int32_t hidden, int32_t intermediate,
                             cudaStream_t stream);

/* The same in place: w1 [E_l, 2I, H] is rewritten into W1p expert by
 * expert through scratch (one expert, 2I * H bytes); w1_sf is read, the
 * per-chunk scales go to w1p_sf. Enqueued on stream; scratch must stay
 * allocated until the stream has run it. */
megamoe_status mm_prepare_w1_in_place(uint8_t* w1, const float* w1_sf, float* w1p_sf, uint8_t* scratch,
                                      int32_t local_experts, int32_t hidden, int32_t intermediate,
                                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
