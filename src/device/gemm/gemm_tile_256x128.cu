/* Instantiations of the 256x128 tile (gemm/gemm.h, gemm_kernel.cuh). */
#include "gemm/gemm_kernel.cuh"

mm_gemm_kernel_ref mm_gemm_lookup_256x128(int a_sf_block, int out_kind, int num_experts, int max_stages) {
  return mm_gemm_tile_lookup<256, 128, false, false, MM_GEMM_OUTS_ALL>(a_sf_block, out_kind, num_experts, max_stages);
}
