/* The fused kernel's instantiations (fused_arm.h): one per (L1 tile, L2
 * tile) pair a regime can pick (host/plan.c, mm_gemm_pick_tile):
 *   G = 128  L1 128x256 with L2 128x256 (large, H a multiple of 256: the
 *            split arm's large L2 tile too; 2-8 % faster than 256x128 at
 *            1024-8192 tokens on an H100, docs/PERF.md, twenty-fifth session)
 *            or 256x128 (large, other H); L1 64x256 with L2 64x256 or 128x128
 *            (decode, and the fused arm's mid regime)
 *   G = 64   the same pairs, the L1 epilogue quantizing per 64 columns (L1
 *            128x256: 11-15 % faster than 128x128 at 2048-8192 tokens on an
 *            H100, twenty-eighth session)
 * The L2 tile's A scales are per G columns (kPromo 1 or 2). Each G's
 * lookup lives in its own file, G = 128's large pair in a third, so they
 * compile in parallel. */
#ifndef MEGAMOE_FUSED_INSTANCES_CUH
#define MEGAMOE_FUSED_INSTANCES_CUH

#include "fused/fused_kernel.cuh"
#include "gemm/gemm.h"

/* What the launcher needs of one instantiation. */
struct mm_fused_kernel_ref {
  const void* fn;
  mm_gemm_layout layout;
  uint32_t stages_no_cache; /* the layout's stages without the task cache */
  uint32_t cache_entries;   /* mm_fused_task_cache_entries */
};

/* The engine's configs of the split arm's kernels (split_l1.cu, split_l2.cu):
 * the 256-wide L1 tiles with the SwiGLU staging (their codes through the L2
 * tile's staging area and a TMA store; fused_kernel.cuh, mm_fused_math). */
using mm_fused_l1_64x256 = mm_gemm_cfg<64, 256, true, true, 1, false, false, true>;
using mm_fused_l1_128x256 = mm_gemm_cfg<128, 256, false, false, 1, false, false, true>;
template <int kPromo>
using mm_fused_l2_256x128 = mm_gemm_cfg<256, 128, false, false, kPromo, true>;
template <int kPromo>
using mm_fused_l2_128x256 = mm_gemm_cfg<128, 256, false, false, kPromo, true>;
template <int kPromo>
using mm_fused_l2_64x256 = mm_gemm_cfg<64, 256, true, true, kPromo, true>;
template <int kPromo>
using mm_fused_l2_128x128 = mm_gemm_cfg<128, 128, false, true, kPromo, true>;

template <class C1, class C2>
mm_fused_kernel_ref mm_fused_kernel_get(int experts) {
  mm_fused_kernel_ref r;
  r.fn = reinterpret_cast<const void*>(&mm_fused_kernel<C1, C2>);
  /* Host arithmetic on every launch (the lookup): the cache size once. */
  r.cache_entries = mm_fused_task_cache_entries<C1, C2>(experts);
  r.layout = mm_fused_layout_with<C1, C2>(experts, r.cache_entries);
  r.stages_no_cache = mm_fused_layout_with<C1, C2>(experts, 0).stages;
  return r;
}

/* The pairs at one G (kPromo = 128 / G, the L2 tile's A scales per G
 * columns), both G having the same ones: the large pairs (L1 128x256) and
 * the decode pairs (L1 64x256), by L2 tile (fn NULL: no kernel for it).
 * Templates: each file instantiates the ones it calls. */
template <int kPromo>
mm_fused_kernel_ref mm_fused_lookup_large(mm_gemm_tile l2, int experts) {
  if (l2 == MM_GEMM_TILE_256x128) return mm_fused_kernel_get<mm_fused_l1_128x256, mm_fused_l2_256x128<kPromo>>(experts);
  if (l2 == MM_GEMM_TILE_128x256) return mm_fused_kernel_get<mm_fused_l1_128x256, mm_fused_l2_128x256<kPromo>>(experts);
  return mm_fused_kernel_ref{nullptr, {}, 0, 0};
}
template <int kPromo>
mm_fused_kernel_ref mm_fused_lookup_decode(mm_gemm_tile l2, int experts) {
  if (l2 == MM_GEMM_TILE_64x256) return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_64x256<kPromo>>(experts);
  if (l2 == MM_GEMM_TILE_128x128) return mm_fused_kernel_get<mm_fused_l1_64x256, mm_fused_l2_128x128<kPromo>>(experts);
  return mm_fused_kernel_ref{nullptr, {}, 0, 0};
}

/* Lookups of the three files (fn NULL: no kernel for the pair). */
mm_fused_kernel_ref mm_fused_lookup_g128(mm_gemm_tile l1, mm_gemm_tile l2, int experts);
mm_fused_kernel_ref mm_fused_lookup_g64(mm_gemm_tile l1, mm_gemm_tile l2, int experts);
mm_fused_kernel_ref mm_fused_lookup_g128_large(mm_gemm_tile l2, int experts);

#endif
