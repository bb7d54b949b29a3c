/* The staged arm: separate kernels on the caller's stream (C interface; the
 * sequence is enqueued by host/staged_forward.c).
 *
 *   route_count    validate top-k, count slots per global expert
 *   route_publish  push counts + sorted (token, slot, weight) lists to the expert ranks
 *   barrier        all ranks: routing published
 *   pool_layout    expert-major pool offsets from every source's counts
 *   dispatch_pull  pull routed rows from the source ranks into the pool
 *   L1 GEMM        pool x W1p^T -> fp32 (engine)
 *   swiglu_quant   SwiGLU, routing weight, per-G fp8 quantization
 *   L2 GEMM        l1_out x W2^T -> bf16 (engine)
 *   combine_push   each pool row to its source rank's combine slot [k][t]
 *   barrier        all ranks: combine rows landed
 *   reduce         y[t] = sum over k in slot order
 *
 * The forward's number lives on the device (mm_device_status.forward, see
 * comm/forward.cuh: route_count starts the forward, the reduce kernel's last
 * CTA advances the number and writes the error word), so a forward captured
 * in a CUDA graph stays correct on every replay: barrier values keep growing.
 *
 * An empty forward (mm_forward_view.injected_error != 0) runs route_count,
 * route_publish, both barriers, pool_layout and reduce: the same barrier
 * sequence, no reads of inputs or weights.
 *
 * Ordering across ranks uses only the two barriers: a rank writes a peer's
 * route lists for forward n+1 only after that peer passed the combine
 * barrier of forward n, i.e. after its pull of forward n finished.
 *
 * Each launcher enqueues its kernel(s) and returns without checking; the
 * caller checks cudaGetLastError once after the sequence. */
#ifndef MEGAMOE_STAGED_H
#define MEGAMOE_STAGED_H

#include <cuda_runtime_api.h>

#include "contract.h"

#ifdef __cplusplus
extern "C" {
#endif

void mm_route_launch(const mm_layer_view* L, const mm_forward_view* F, cudaStream_t stream);
void mm_pool_layout_launch(const mm_layer_view* L, cudaStream_t stream);
/* Barrier `which` (0: dispatch, 1: combine) of the current forward. */
void mm_barrier_launch(const mm_layer_view* L, int which, int site, cudaStream_t stream);
void mm_dispatch_launch(const mm_layer_view* L, cudaStream_t stream);
void mm_swiglu_quant_launch(const mm_layer_view* L, cudaStream_t stream);
void mm_combine_push_launch(const mm_layer_view* L, cudaStream_t stream);
void mm_reduce_launch(const mm_layer_view* L, const mm_forward_view* F, cudaStream_t stream);
/* Records `code` as the forward's error from the stream (a host-side failure
 * in the middle of enqueueing: the rest of the forward carries it). */
void mm_record_error_launch(const mm_layer_view* L, int code, int site, int detail, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
