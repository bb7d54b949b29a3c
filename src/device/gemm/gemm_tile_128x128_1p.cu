/* Instantiations of the 128x128 (one partial accumulator) tile (gemm/gemm.h, gemm_kernel.cuh). */
#include "gemm/gemm_kernel.cuh"

mm_gemm_kernel_ref mm_gemm_lookup_128x128_1p(int a_sf_block, int out_kind, int num_experts, int max_stages) {
  return mm_gemm_tile_lookup<128, 128, false, false, (1u<<MM_GEMM_OUT_BF16)>(a_sf_block, out_kind, num_experts, max_stages);
}
