/* Kernel 2 of the split arm (split.h): its instantiations and launch. The L2
 * GEMM's tiles: 128x256 (large, H a multiple of 256), 256x128 (large
 * otherwise), 64x256 and 128x128 (decode); A scales per 128 (G = 128) or 64
 * (G = 64). */
#include "split/split_kernels.cuh"
#include "split/split_launch.cuh"

template <int BM, int BN, bool kSplitN, bool kTwoParts>
static const void* mm_split_l2_pick(int a_sf_block) {
  if (a_sf_block == 64)
    return reinterpret_cast<const void*>(&mm_split_l2_kernel<mm_gemm_cfg<BM, BN, kSplitN, kTwoParts, 2, true>>);
  return reinterpret_cast<const void*>(&mm_split_l2_kernel<mm_gemm_cfg<BM, BN, kSplitN, kTwoParts, 1, true>>);
}

static const void* mm_split_l2_kernel_for(mm_gemm_tile tile, int a_sf_block) {
  if (a_sf_block != 64 && a_sf_block != 128) return nullptr;
  switch (tile) {
    case MM_GEMM_TILE_256x128: return mm_split_l2_pick<256, 128, false, false>(a_sf_block);
    case MM_GEMM_TILE_128x256: return mm_split_l2_pick<128, 256, false, false>(a_sf_block);
    case MM_GEMM_TILE_64x256: return mm_split_l2_pick<64, 256, true, true>(a_sf_block);
    case MM_GEMM_TILE_128x128: return mm_split_l2_pick<128, 128, false, true>(a_sf_block);
    default: return nullptr;
  }
}

extern "C" megamoe_status mm_split_l2_launch(const mm_layer_view* L, const mm_forward_view* F, const mm_gemm_plan* l2,
                                             cudaStream_t stream) {
  return mm_split_launch(mm_split_l2_kernel_for(l2->tile, l2->problem.a_sf_block), "L2", l2, L, F, stream);
}

extern "C" megamoe_status mm_split_l1_prepare(const mm_gemm_plan* l1);

extern "C" megamoe_status mm_split_prepare(const mm_gemm_plan* l1, const mm_gemm_plan* l2) {
  MM_TRY(mm_split_l1_prepare(l1));
  return mm_split_kernel_prepare(mm_split_l2_kernel_for(l2->tile, l2->problem.a_sf_block), "L2", l2);
}
