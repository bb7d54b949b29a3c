/* Host side of the fused arm: the call's order (fused_plan.h) and the one
 * cooperative launch (device/fused/fused_arm.h). The kernel carries the
 * forward's two all-rank barriers (an empty forward runs them too), so a
 * launch refused by CUDA is the only way a forward ends unenqueued: create
 * checked the tiles' kernel and its shared memory. */
#ifndef MEGAMOE_FUSED_FORWARD_H
#define MEGAMOE_FUSED_FORWARD_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "fused_plan.h"
#include "megamoe.h"
#include "plan.h"

/* bound: the call's num_tokens_bound as passed (0: T_max), already checked
 * against this rank's count by megamoe_forward (0 for an empty forward). */
megamoe_status mm_fused_forward(const mm_layer_view* layer, const mm_forward_view* fwd, const mm_fused_ring* ring,
                                const megamoe_config* config, int64_t bound, const mm_arm_gemm* gemms,
                                cudaStream_t stream);

#endif
