/* Host side of the split arm: enqueues its two kernels. Both carry the
 * forward's two all-rank barriers (an empty forward runs them too), so a
 * launch refused by CUDA is the only way a forward ends half-enqueued: create
 * checked the tiles and the cooperative grid, so that means a CUDA error. */
#ifndef MEGAMOE_SPLIT_FORWARD_H
#define MEGAMOE_SPLIT_FORWARD_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "megamoe.h"
#include "plan.h"

megamoe_status mm_split_forward(const mm_layer_view* layer, const mm_forward_view* fwd, const mm_arm_gemm* gemms,
                                cudaStream_t stream);

#endif
