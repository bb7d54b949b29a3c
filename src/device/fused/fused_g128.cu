/* The fused kernel at G = 128 (fused_instances.cuh): L1 64x256 with the
 * L2 tiles of both regimes, A scales of L2 per 128 columns. */
#include "fused/fused_instances.cuh"

mm_fused_kernel_ref mm_fused_lookup_g128(mm_gemm_tile l1, mm_gemm_tile l2, int experts) {
  mm_fused_kernel_ref none = {nullptr, {}, 0, 0};
  if (l1 != MM_GEMM_TILE_64x256) return none;
  switch (l2) {
    case MM_GEMM_TILE_256x128: return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_256x128<1>>(experts);
    case MM_GEMM_TILE_64x256: return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_64x256<1>>(experts);
    case MM_GEMM_TILE_128x128: return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_128x128<1>>(experts);
    default: return none;
  }
}
