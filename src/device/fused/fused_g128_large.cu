/* The fused kernel at G = 128, large pairs (fused_instances.cuh): L1 128x256
 * (two waves per warpgroup; a warpgroup holds all 256 columns of its 64
 * rows, so the per-128 amax needs no exchange) with L2 128x256 where H is a
 * multiple of 256, else 256x128. Its own file so it compiles beside
 * fused_g128.cu. */
#include "fused/fused_instances.cuh"

mm_fused_kernel_ref mm_fused_lookup_g128_large(mm_gemm_tile l2, int experts) {
  return mm_fused_lookup_large<1>(l2, experts);
}
