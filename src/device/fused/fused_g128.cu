/* The fused kernel at G = 128, decode pairs (fused_instances.cuh): L1 64x256
 * with L2 64x256 (H a multiple of 256) or 128x128, A scales of L2 per 128
 * columns; the large pairs in fused_g128_large.cu. */
#include "fused/fused_instances.cuh"

mm_fused_kernel_ref mm_fused_lookup_g128(mm_gemm_tile l1, mm_gemm_tile l2, int experts) {
  if (l1 == MM_GEMM_TILE_128x256) return mm_fused_lookup_g128_large(l2, experts);
  if (l1 == MM_GEMM_TILE_64x256) return mm_fused_lookup_decode<1>(l2, experts);
  return mm_fused_kernel_ref{nullptr, {}, 0, 0};
}
