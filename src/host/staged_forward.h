/* Host side of the staged arm: enqueues its kernel sequence. */
#ifndef MEGAMOE_STAGED_FORWARD_H
#define MEGAMOE_STAGED_FORWARD_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "megamoe.h"

/* The staged forward, all kernels enqueued on stream. engine: mm_gemm_engine. */
megamoe_status mm_staged_forward(const mm_layer_view* layer, const mm_forward_view* fwd,
                                 const uint8_t* w1p, const float* w1p_sf, const uint8_t* w2,
                                 const float* w2_sf, int engine, cudaStream_t stream);

#endif
