/* The staged arm: separate kernels on the caller's stream (C interface).
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
 * The forward's sequence number lives on the device (MM_WS_EPOCH: route_count
 * increments it, the barriers read it), so a forward captured in a CUDA graph
 * stays correct on every replay: barrier values keep growing.
 *
 * Ordering across ranks uses only the two barriers: a rank writes a peer's
 * route lists for forward n+1 only after that peer passed the combine
 * barrier of forward n, i.e. after its pull of forward n finished. */
#ifndef MEGAMOE_STAGED_H
#define MEGAMOE_STAGED_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "host/layout.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything a kernel of the layer needs, passed by value. */
typedef struct mm_layer_view {
  int32_t rank, num_ranks;
  int32_t hidden, intermediate, num_experts, local_experts, top_k, quant_group;
  int32_t max_tokens, pool_rows;
  int32_t has_clamp;
  float clamp;
  uint8_t* ws;                       /* local workspace base */
  uint8_t* peer_sym[MEGAMOE_MAX_RANKS]; /* symmetric buffer base of each rank (own included) */
  uint64_t offset[MM_REGION_COUNT];  /* region offsets in their space */
  uint64_t timeout_ns;
  int32_t fill_blocks;               /* grid of the grid-stride kernels: 4 per SM */
} mm_layer_view;

/* One forward's inputs. x and x_sf are not here: the kernels read every
 * rank's tokens from its symmetric staging region (MM_SYM_INPUT_X*). */
typedef struct mm_forward_view {
  const void* topk_idx;
  int32_t topk_idx_int64;
  const float* topk_w;
  int32_t num_tokens;
  uint16_t* y;
} mm_forward_view;

/* Weight preparation (checkpoint layout -> kernel layout), one rank's E_l experts. */
megamoe_status mm_prepare_w1(const uint8_t* w1, const float* w1_sf, uint8_t* w1p, float* w1p_sf,
                             int32_t local_experts, int32_t hidden, int32_t intermediate,
                             cudaStream_t stream);

/* The staged forward, all kernels enqueued on stream. engine: mm_gemm_engine. */
megamoe_status mm_staged_forward(const mm_layer_view* layer, const mm_forward_view* fwd,
                                 const uint8_t* w1p, const float* w1p_sf, const uint8_t* w2,
                                 const float* w2_sf, int engine, cudaStream_t stream);

/* Resolves the symmetric base of every rank from an NCCL window (collective
 * registration already done). peer_sym_out: host array of num_ranks pointers. */
megamoe_status mm_resolve_peers(ncclWindow_t window, int num_ranks, uint8_t** peer_sym_out);

/* Number of ranks of comm in this rank's NVLink load/store team. */
megamoe_status mm_lsa_team_size(ncclComm_t comm, int* size);

#ifdef __cplusplus
}
#endif

#endif
