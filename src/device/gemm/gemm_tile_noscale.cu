/* Instantiations of the diagnostic tiles without promotion (gemm/gemm.h). */
#include "gemm/gemm_kernel.cuh"

mm_gemm_kernel_ref mm_gemm_lookup_256x128_noscale(int a_sf_block, int out_kind, int num_experts, int max_stages) {
  return mm_gemm_tile_lookup<256, 128, false, false, (1u << MM_GEMM_OUT_BF16), true>(a_sf_block, out_kind,
                                                                                     num_experts, max_stages);
}

mm_gemm_kernel_ref mm_gemm_lookup_128x128_noscale(int a_sf_block, int out_kind, int num_experts, int max_stages) {
  return mm_gemm_tile_lookup<128, 128, false, false, (1u << MM_GEMM_OUT_BF16), true>(a_sf_block, out_kind,
                                                                                     num_experts, max_stages);
}

mm_gemm_kernel_ref mm_gemm_lookup_64x256_noscale(int a_sf_block, int out_kind, int num_experts, int max_stages) {
  return mm_gemm_tile_lookup<64, 256, true, true, (1u << MM_GEMM_OUT_BF16), true>(a_sf_block, out_kind, num_experts,
                                                                                  max_stages);
}
