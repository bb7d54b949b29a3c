/* Host side of the staged arm: enqueues its kernel sequence. */
#ifndef MEGAMOE_STAGED_FORWARD_H
#define MEGAMOE_STAGED_FORWARD_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "megamoe.h"
#include "plan.h"

/* The staged forward, all kernels enqueued on stream; gemms: the arm's two
 * GEMMs of the call's regime (L1 fp32, L2 bf16), planned. */
megamoe_status mm_staged_forward(const mm_layer_view* layer, const mm_forward_view* fwd, const mm_arm_gemm* gemms,
                                 cudaStream_t stream);

#endif
