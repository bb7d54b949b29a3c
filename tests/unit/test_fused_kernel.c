/* The fused kernel's shared-memory plans (src/device/fused/fused_arm.cu):
 * host arithmetic of the kernel's own layout functions, so it needs the
 * library's CUDA-compiled objects (not part of the sanitized host-only
 * build, which runs test_fused.c). */
#include <stdio.h>

#include "fused/fused_arm.h"
#include "megamoe.h"
#include "unit.h"

/* The kernel's shared memory for every instantiated pair and every local
 * expert count: the task cache never costs a pipeline stage, and what the
 * launch requests plus the static reserve fits the opt-in limit. Host
 * arithmetic of the kernel's own layout functions (fused_arm.cu). */
static mm_test_result t_fused_smem_plans(void) {
  static const struct {
    mm_gemm_tile l1, l2;
    int32_t g;
  } pairs[] = {{MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128, 128}, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256, 128},
               {MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128, 128},  {MM_GEMM_TILE_128x128, MM_GEMM_TILE_256x128, 64},
               {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256, 64},    {MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128, 64}};
  int64_t fits = 0, full_cache = 0, smaller_cache = 0;
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; ++i)
    for (int32_t e = 1; e <= MEGAMOE_MAX_LOCAL_EXPERTS; ++e) {
      mm_fused_smem_plan pl;
      CHECK_OK(mm_fused_smem_plan_of(pairs[i].l1, pairs[i].l2, pairs[i].g, e, &pl));
      const uint32_t n = pl.cache_entries;
      CHECK_MSG(pl.stages == pl.stages_no_cache, "%s + %s, G %d, E_l %d: %u stages with the task cache, %u without",
                mm_gemm_tile_name(pairs[i].l1), mm_gemm_tile_name(pairs[i].l2), (int)pairs[i].g, (int)e, pl.stages,
                pl.stages_no_cache);
      CHECK_MSG(n <= 256 && (n & (n - 1)) == 0, "E_l %d: %u cache entries", (int)e, n);
      if (pl.stages == 0) continue;
      CHECK_MSG(pl.dynamic_bytes + pl.static_reserve <= pl.limit, "%s + %s, G %d, E_l %d: %u + %u B above %u",
                mm_gemm_tile_name(pairs[i].l1), mm_gemm_tile_name(pairs[i].l2), (int)pairs[i].g, (int)e,
                pl.dynamic_bytes, pl.static_reserve, pl.limit);
      ++fits;
      if (n == 256) ++full_cache;
      else ++smaller_cache;
    }
  mm_fused_smem_plan pl;
  CHECK(mm_fused_smem_plan_of(MM_GEMM_TILE_64x256, MM_GEMM_TILE_256x128, 128, 8, &pl) != MEGAMOE_OK); /* not instantiated */
  printf("    %lld (pair, E_l) layouts fit: %lld with the full task cache, %lld with a smaller one, none lost a stage\n",
         (long long)fits, (long long)full_cache, (long long)smaller_cache);
  return MM_TEST_PASS;
}

const mm_test unit_suite_fused_kernel[] = {
    {"fused.kernel_shared_memory_plans", t_fused_smem_plans},
    {NULL, NULL},
};
