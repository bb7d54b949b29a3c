/* Kernel 1 of the split arm (split.h): its instantiations and launch. The L1
 * GEMM's tiles (the engine's pick, at both G): 64x256 (at most 64 rows per
 * expert), 128x256 (more rows). Both store full tiles' fp8 codes through the
 * SwiGLU staging area and one TMA store (the plan's fourth map). */
#include "split/split_kernels.cuh"
#include "split/split_launch.cuh"

static const void* mm_split_l1_kernel_for(mm_gemm_tile tile, int a_sf_block) {
  if (a_sf_block != MM_SCALE_BLOCK) return nullptr; /* the pool's scales are per 128 */
  switch (tile) {
    case MM_GEMM_TILE_64x256:
      return reinterpret_cast<const void*>(&mm_split_l1_kernel<mm_gemm_cfg<64, 256, true, true, 1, false, false, true>>);
    case MM_GEMM_TILE_128x256:
      return reinterpret_cast<const void*>(
          &mm_split_l1_kernel<mm_gemm_cfg<128, 256, false, false, 1, false, false, true>>);
    default: return nullptr;
  }
}

extern "C" megamoe_status mm_split_l1_launch(const mm_layer_view* L, const mm_forward_view* F, const mm_gemm_plan* l1,
                                             cudaStream_t stream) {
  return mm_split_launch(mm_split_l1_kernel_for(l1->tile, l1->problem.a_sf_block), "L1", l1, L, F, stream, true);
}

extern "C" megamoe_status mm_split_l1_prepare(const mm_gemm_plan* l1) {
  return mm_split_kernel_prepare(mm_split_l1_kernel_for(l1->tile, l1->problem.a_sf_block), "L1", l1);
}
