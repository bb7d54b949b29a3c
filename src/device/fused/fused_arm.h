/* The fused arm: one persistent kernel per forward (C interface; the host
 * side is src/host/fused_forward.c, the design docs/FUSED.md, the kernel
 * fused_kernel.cuh).
 *
 * One cooperative grid of one CTA per SM runs routing, the dispatch pull,
 * both GEMMs and the combine push: the L2 tiles of a unit of rows trail its
 * L1 tiles by the call's lag in one task stream (src/fused.h), and the
 * expert pool is a ring of 128-row slots (the layout's pool regions hold
 * ring_blocks slots). The L1 tile (SwiGLU epilogue) and the L2 tile
 * (staged for the copy warp) are the split arm's picks (host/plan.c); one
 * kernel instantiation per pair that a regime can pick. */
#ifndef MEGAMOE_FUSED_ARM_H
#define MEGAMOE_FUSED_ARM_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "fused.h"
#include "gemm/gemm.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At create: a kernel exists for the L1 tile l1 with the L2 tile l2 (whose A
 * scales are per a_sf_block2 = G columns) and its shared memory for
 * `experts` local experts fits at least two pipeline stages on this device
 * (bytes in *smem_bytes when not NULL). */
megamoe_status mm_fused_check(mm_gemm_tile l1, mm_gemm_tile l2, int32_t a_sf_block2, int32_t experts,
                              uint32_t* smem_bytes);

/* The kernel's shared memory for a pair and `experts` local experts (host
 * arithmetic, no device needed): what mm_fused_check and the launch use. */
typedef struct mm_fused_smem_plan {
  uint32_t stages;          /* pipeline stages (0: not even the minimum fits) */
  uint32_t stages_no_cache; /* the same without the task cache: never more than stages */
  uint32_t cache_entries;   /* tasks a CTA decodes ahead: 0 or a power of two up to 256 */
  uint32_t dynamic_bytes;   /* requested at launch */
  uint32_t static_reserve;  /* counted in the stages, left for the kernel's static shared memory */
  uint32_t limit;           /* the per-block opt-in maximum the stages are counted against */
} mm_fused_smem_plan;
megamoe_status mm_fused_smem_plan_of(mm_gemm_tile l1, mm_gemm_tile l2, int32_t a_sf_block2, int32_t experts,
                                     mm_fused_smem_plan* plan);

/* Once per pair of plans (when the weights are set): re-encodes their A maps
 * for per-block loads (mm_gemm_plan_a_boxes) and lets the kernel use its
 * shared memory, so a forward only launches. */
megamoe_status mm_fused_prepare(mm_gemm_plan* l1, mm_gemm_plan* l2);

/* Enqueues the forward: a cooperative grid of L->num_sms CTAs, the plans'
 * tensor maps and problems, the call's order (host/fused_plan.c) and its
 * num_tokens_bound as passed (0: T_max), which the kernel publishes to every
 * rank for the device's verdict. */
megamoe_status mm_fused_launch(const mm_layer_view* L, const mm_forward_view* F, const mm_fused_order* order,
                               int64_t bound, const mm_gemm_plan* l1, const mm_gemm_plan* l2, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
