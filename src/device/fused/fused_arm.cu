/* The fused arm's create-time check, preparation and launch (fused_arm.h). */
#include <cuda_runtime.h>

#include "fused/fused_arm.h"
#include "fused/fused_instances.cuh"
#include "launch.cuh"

extern "C" {
#include "host/errors.h"
}

namespace {

/* The instantiation for a pair of tiles; the L2 tile's A-scale block is G. */
mm_fused_kernel_ref lookup(mm_gemm_tile l1, mm_gemm_tile l2, int a_sf_block2, int experts) {
  if (a_sf_block2 == 128) return mm_fused_lookup_g128(l1, l2, experts);
  if (a_sf_block2 == 64) return mm_fused_lookup_g64(l1, l2, experts);
  mm_fused_kernel_ref none = {nullptr, {}, 0, 0};
  return none;
}

megamoe_status no_kernel(mm_gemm_tile l1, mm_gemm_tile l2, int a_sf_block2) {
  return mm_fail(MEGAMOE_ERR_INTERNAL, "fused arm: no kernel for L1 tile %s with L2 tile %s at G = %d",
                 mm_gemm_tile_name(l1), mm_gemm_tile_name(l2), a_sf_block2);
}

}  // namespace

extern "C" megamoe_status mm_fused_check(mm_gemm_tile l1, mm_gemm_tile l2, int32_t a_sf_block2, int32_t experts,
                                         uint32_t* smem_bytes) {
  const mm_fused_kernel_ref k = lookup(l1, l2, a_sf_block2, experts);
  if (!k.fn) return no_kernel(l1, l2, a_sf_block2);
  if (k.layout.stages == 0)
    return mm_fail(MEGAMOE_ERR_UNSUPPORTED_DEVICE,
                   "fused arm: tiles %s (L1) and %s (L2) with %d local experts do not fit %d pipeline stages in %d B "
                   "of shared memory",
                   mm_gemm_tile_name(l1), mm_gemm_tile_name(l2), experts, MM_GEMM_MIN_STAGES, MM_GEMM_SMEM_LIMIT);
  int dev = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "fused arm: device query: %s", cudaGetErrorString(err));
  /* The static shared memory comes on top of the dynamic request. */
  if ((int64_t)k.layout.bytes + MM_FUSED_STATIC_SMEM > (int64_t)optin)
    return mm_fail(MEGAMOE_ERR_UNSUPPORTED_DEVICE,
                   "fused arm: tiles %s (L1) and %s (L2) need %u B of shared memory per block, the device allows %d",
                   mm_gemm_tile_name(l1), mm_gemm_tile_name(l2), k.layout.bytes, optin);
  if (smem_bytes) *smem_bytes = k.layout.bytes;
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_fused_smem_plan_of(mm_gemm_tile l1, mm_gemm_tile l2, int32_t a_sf_block2,
                                                int32_t experts, mm_fused_smem_plan* plan) {
  MM_CHECK_NULL(plan, "plan");
  const mm_fused_kernel_ref k = lookup(l1, l2, a_sf_block2, experts);
  if (!k.fn) return no_kernel(l1, l2, a_sf_block2);
  plan->stages = k.layout.stages;
  plan->stages_no_cache = k.stages_no_cache;
  plan->cache_entries = k.cache_entries;
  plan->dynamic_bytes = k.layout.bytes;
  plan->static_reserve = MM_FUSED_STATIC_SMEM;
  plan->limit = MM_GEMM_SMEM_LIMIT;
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_fused_prepare(mm_gemm_plan* l1, mm_gemm_plan* l2) {
  MM_CHECK_NULL(l1, "L1 plan");
  MM_CHECK_NULL(l2, "L2 plan");
  /* The kernel's L2 tile reads one B scale per 128 columns (kBScale128). */
  if (l2->problem.b_sf_block_n != 128)
    return mm_fail(MEGAMOE_ERR_INTERNAL, "fused arm: L2 B scales per %d columns (the kernel reads them per 128)",
                   l2->problem.b_sf_block_n);
  /* A 256-row L2 tile loads its two 128-row blocks apart (ring slots). */
  MM_TRY(mm_gemm_plan_a_boxes(l1, MM_FUSED_BLOCK_ROWS));
  MM_TRY(mm_gemm_plan_a_boxes(l2, MM_FUSED_BLOCK_ROWS));
  const mm_fused_kernel_ref k = lookup(l1->tile, l2->tile, l2->problem.a_sf_block, l1->problem.num_experts);
  if (!k.fn) return no_kernel(l1->tile, l2->tile, l2->problem.a_sf_block);
  const cudaError_t err = cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.layout.bytes);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "fused arm: kernel setup (%u B of shared memory): %s", k.layout.bytes,
                   cudaGetErrorString(err));
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_fused_launch(const mm_layer_view* L, const mm_forward_view* F,
                                          const mm_fused_order* order, int64_t bound, const mm_gemm_plan* l1,
                                          const mm_gemm_plan* l2, cudaStream_t stream) {
  const mm_fused_kernel_ref k = lookup(l1->tile, l2->tile, l2->problem.a_sf_block, l1->problem.num_experts);
  if (!k.fn) return no_kernel(l1->tile, l2->tile, l2->problem.a_sf_block);
  mm_gemm_problem p1 = l1->problem, p2 = l2->problem;
  mm_gemm_layout layout = k.layout;
  mm_layer_view view = *L;
  mm_forward_view fwd = *F;
  mm_fused_order ord = *order;
  int64_t b = bound;
  /* maps[3] of the L1 plan: its codes' map where the plan made one
   * (p1.swiglu.tma_out), else unused by the kernel. */
  void* args[14] = {(void*)l1->maps[0], (void*)l1->maps[1], (void*)l1->maps[2], (void*)l2->maps[0],
                    (void*)l2->maps[1], (void*)l2->maps[2], (void*)l1->maps[3], (void*)&p1,
                    (void*)&p2,         (void*)&layout,     (void*)&view,       (void*)&fwd,
                    (void*)&ord,        (void*)&b};
  const cudaError_t err = mm_launch_persistent(k.fn, args, L, layout.bytes, stream);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "fused arm: launch (tiles %s + %s, %d CTAs, %u B smem): %s",
                   mm_gemm_tile_name(l1->tile), mm_gemm_tile_name(l2->tile), L->num_sms, layout.bytes,
                   cudaGetErrorString(err));
  return MEGAMOE_OK;
}
