/* The fused kernel at G = 128, large pairs (fused_instances.cuh): L1 128x256
 * (two waves per warpgroup; a warpgroup holds all 256 columns of its 64
 * rows, so the per-128 amax needs no exchange) with L2 128x256 where H is a
 * multiple of 256, else 256x128. Its own file so it compiles beside
 * fused_g128.cu. */
#include "fused/fused_instances.cuh"

mm_fused_kernel_ref mm_fused_lookup_g128_large(mm_gemm_tile l2, int experts) {
  mm_fused_kernel_ref none = {nullptr, {}, 0, 0};
  if (l2 == MM_GEMM_TILE_256x128) return mm_fused_kernel_get<mm_fused_l1_128x256, mm_fused_l2_256x128<1>>(experts);
  if (l2 == MM_GEMM_TILE_128x256) return mm_fused_kernel_get<mm_fused_l1_128x256, mm_fused_l2_128x256<1>>(experts);
  return none;
}
