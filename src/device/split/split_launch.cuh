/* Launch of a split-arm kernel: a cooperative grid of one CTA per SM (the
 * kernels have grid barriers), the plan's tensor maps and layout. */
#ifndef MEGAMOE_SPLIT_LAUNCH_CUH
#define MEGAMOE_SPLIT_LAUNCH_CUH

#include <cuda_runtime.h>

#include "gemm/gemm.h"
#include "launch.cuh"
#include "split/split.h"

extern "C" {
#include "host/errors.h"
}

/* Once per plan (mm_split_prepare): the kernel exists for the plan's tile
 * and may use the plan's shared memory. */
static inline megamoe_status mm_split_kernel_prepare(const void* fn, const char* what, const mm_gemm_plan* plan) {
  if (!fn)
    return mm_fail(MEGAMOE_ERR_INTERNAL, "split arm: no %s kernel for tile %s", what, mm_gemm_tile_name(plan->tile));
  const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan->layout.bytes);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "split arm: %s kernel setup: %s", what, cudaGetErrorString(err));
  return MEGAMOE_OK;
}

/* Per forward: the launch only (no device query, no attribute call). */
static inline megamoe_status mm_split_launch(const void* fn, const char* what, const mm_gemm_plan* plan,
                                             const mm_layer_view* L, const mm_forward_view* F, cudaStream_t stream,
                                             bool with_out_map = false) {
  if (!fn)
    return mm_fail(MEGAMOE_ERR_INTERNAL, "split arm: no %s kernel for tile %s", what, mm_gemm_tile_name(plan->tile));
  mm_gemm_problem problem = plan->problem;
  mm_gemm_layout layout = plan->layout;
  mm_layer_view view = *L;
  mm_forward_view fwd = *F;
  /* The first three maps; kernel 1 also takes the fourth (the L1 output). */
  void* args[8];
  int n = 0;
  for (int m = 0; m < (with_out_map ? 4 : 3); ++m) args[n++] = (void*)plan->maps[m];
  args[n++] = (void*)&problem;
  args[n++] = (void*)&layout;
  args[n++] = (void*)&view;
  args[n++] = (void*)&fwd;
  const cudaError_t err = mm_launch_persistent(fn, args, L, layout.bytes, stream);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "split arm: %s launch (tile %s, %d CTAs, %u B smem): %s", what,
                   mm_gemm_tile_name(plan->tile), L->num_sms, layout.bytes, cudaGetErrorString(err));
  return MEGAMOE_OK;
}

#endif
