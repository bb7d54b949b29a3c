/* The fused kernel at G = 64 (fused_instances.cuh): G = 128's pairs, the L1
 * epilogue quantizing per 64 columns and L2's A scales per 64 (kPromo 2):
 * L1 128x256 with L2 128x256 (large, H a multiple of 256: the split arm's
 * large L2 tile; 1-3 % faster than 256x128 at 1024-8192 tokens on an H100
 * with the old 128x128 L1, docs/PERF.md, twenty-sixth session; not A/B'd
 * again with 128x256) or 256x128 (large, other H); L1 64x256
 * with the decode L2 tiles. (The large L1 was 128x128 until 128x256
 * measured 11-15 % faster at 2048-8192 tokens, twenty-eighth session.) */
#include "fused/fused_instances.cuh"

mm_fused_kernel_ref mm_fused_lookup_g64(mm_gemm_tile l1, mm_gemm_tile l2, int experts) {
  if (l1 == MM_GEMM_TILE_128x256) return mm_fused_lookup_large<2>(l2, experts);
  if (l1 == MM_GEMM_TILE_64x256) return mm_fused_lookup_decode<2>(l2, experts);
  return mm_fused_kernel_ref{nullptr, {}, 0, 0};
}
