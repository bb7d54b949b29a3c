/* The fused kernel at G = 64 (fused_instances.cuh): L1 128x128 with L2
 * 128x256 (large, H a multiple of 256: the split arm's large L2 tile; 1-3 %
 * faster than 256x128 at 1024-8192 tokens on an H100, docs/PERF.md,
 * twenty-sixth session) or 256x128 (large, other H); L1 64x256 with the
 * decode L2 tiles. A scales of L2 per 64 columns. With
 * -DMM_GEMM_SWIGLU_WIDE_G64=1 also L1 128x256 with the same two large L2
 * tiles (G = 128's L1 tile: gemm_cfg.cuh; built and CPU-tested, not yet run
 * on a GPU). */
#include "fused/fused_instances.cuh"

mm_fused_kernel_ref mm_fused_lookup_g64(mm_gemm_tile l1, mm_gemm_tile l2, int experts) {
  mm_fused_kernel_ref none = {nullptr, {}, 0, 0, 0};
  if (l1 == MM_GEMM_TILE_128x128 && l2 == MM_GEMM_TILE_256x128)
    return mm_fused_kernel_get<mm_fused_l1_128x128, mm_fused_l2_256x128<2>>(experts);
  if (l1 == MM_GEMM_TILE_128x128 && l2 == MM_GEMM_TILE_128x256)
    return mm_fused_kernel_get<mm_fused_l1_128x128, mm_fused_l2_128x256<2>>(experts);
#if MM_GEMM_SWIGLU_WIDE_G64
  if (l1 == MM_GEMM_TILE_128x256 && l2 == MM_GEMM_TILE_128x256)
    return mm_fused_kernel_get<mm_fused_l1_128x256, mm_fused_l2_128x256<2>>(experts);
  if (l1 == MM_GEMM_TILE_128x256 && l2 == MM_GEMM_TILE_256x128)
    return mm_fused_kernel_get<mm_fused_l1_128x256, mm_fused_l2_256x128<2>>(experts);
#endif
  if (l1 == MM_GEMM_TILE_64x256 && l2 == MM_GEMM_TILE_64x256)
    return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_64x256<2>>(experts);
  if (l1 == MM_GEMM_TILE_64x256 && l2 == MM_GEMM_TILE_128x128)
    return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_128x128<2>>(experts);
  return none;
}
