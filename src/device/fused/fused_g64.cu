/* The fused kernel at G = 64 (fused_instances.cuh): L1 128x128 with L2
 * 256x128 (large), L1 64x256 with the decode L2 tiles; A scales of L2 per
 * 64 columns. With -DMM_FUSED_L2_WIDE_G64=1 also L1 128x128 with L2 128x256
 * (large, H a multiple of 256: the split arm's large L2 tile at G = 64, and
 * the fused arm's at G = 128 since the twenty-fifth session; built and
 * CPU-tested, not yet run on a GPU, so off by default: docs/PERF.md). */
#include "fused/fused_instances.cuh"

#ifndef MM_FUSED_L2_WIDE_G64
#define MM_FUSED_L2_WIDE_G64 0
#endif

mm_fused_kernel_ref mm_fused_lookup_g64(mm_gemm_tile l1, mm_gemm_tile l2, int experts) {
  mm_fused_kernel_ref none = {nullptr, {}, 0, 0};
  if (l1 == MM_GEMM_TILE_128x128 && l2 == MM_GEMM_TILE_256x128)
    return mm_fused_kernel_get<mm_fused_l1_128x128, mm_fused_l2_256x128<2>>(experts);
#if MM_FUSED_L2_WIDE_G64
  if (l1 == MM_GEMM_TILE_128x128 && l2 == MM_GEMM_TILE_128x256)
    return mm_fused_kernel_get<mm_fused_l1_128x128, mm_fused_l2_128x256<2>>(experts);
#endif
  if (l1 == MM_GEMM_TILE_64x256 && l2 == MM_GEMM_TILE_64x256)
    return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_64x256<2>>(experts);
  if (l1 == MM_GEMM_TILE_64x256 && l2 == MM_GEMM_TILE_128x128)
    return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_128x128<2>>(experts);
  return none;
}
