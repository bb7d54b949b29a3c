/* The engine's tile rule and the fused kernel's pairs and shared-memory
 * plans (gemm_wgmma.cu, src/device/fused/fused_arm.cu): host arithmetic of
 * the CUDA-compiled library, so not part of the sanitized host-only build,
 * which runs test_fused.c. */
#include <stdio.h>
#include <string.h>

#include "fused/fused_arm.h"
#include "gemm/gemm.h"
#include "host/plan.h"
#include "megamoe.h"
#include "unit.h"

/* The engine's tile by rows per expert (mm_gemm_pick_tile; docs/PERF.md,
 * "Large tiles"): the SwiGLU L1 GEMM takes 64x256 up to 64 rows per expert
 * and 128x256 above, at both G (G 64 took 128x128 above 128 rows until the
 * twenty-eighth session); the bf16 GEMMs 64x256 (128x128 where n is not a
 * multiple of 256) up to 128 rows, then 256x128. */
static mm_test_result t_pick_tile_rule(void) {
  mm_gemm_problem p;
  memset(&p, 0, sizeof p);
  p.out_kind = MM_GEMM_OUT_SWIGLU_FP8;
  p.n = 4096;
  p.swiglu.group = 128;
  const int64_t rows[] = {1, 64, 65, 128, 129, 4096};
  const mm_gemm_tile g128[] = {MM_GEMM_TILE_64x256,  MM_GEMM_TILE_64x256,  MM_GEMM_TILE_128x256,
                               MM_GEMM_TILE_128x256, MM_GEMM_TILE_128x256, MM_GEMM_TILE_128x256};
  const mm_gemm_tile bf16[] = {MM_GEMM_TILE_64x256,  MM_GEMM_TILE_64x256,  MM_GEMM_TILE_64x256,
                               MM_GEMM_TILE_64x256,  MM_GEMM_TILE_256x128, MM_GEMM_TILE_256x128};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
    p.out_kind = MM_GEMM_OUT_SWIGLU_FP8;
    p.swiglu.group = 128;
    CHECK_MSG(mm_gemm_pick_tile(&p, rows[i]) == g128[i], "G 128, %lld rows: %s", (long long)rows[i],
              mm_gemm_tile_name(mm_gemm_pick_tile(&p, rows[i])));
    p.swiglu.group = 64;
    CHECK_MSG(mm_gemm_pick_tile(&p, rows[i]) == g128[i], "G 64, %lld rows: %s", (long long)rows[i],
              mm_gemm_tile_name(mm_gemm_pick_tile(&p, rows[i])));
    p.out_kind = MM_GEMM_OUT_BF16;
    p.n = 4096;
    CHECK_MSG(mm_gemm_pick_tile(&p, rows[i]) == bf16[i], "bf16, %lld rows: %s", (long long)rows[i],
              mm_gemm_tile_name(mm_gemm_pick_tile(&p, rows[i])));
    p.n = 3968; /* not a multiple of 256 */
    CHECK_EQ_INT(mm_gemm_pick_tile(&p, rows[i]), rows[i] <= 128 ? MM_GEMM_TILE_128x128 : MM_GEMM_TILE_256x128);
    p.n = 4096;
  }
  return MM_TEST_PASS;
}

/* The fused arm's kernel per regime (mm_plan_fused_kernel, what megamoe info
 * prints): the pairs the tile rule gives, each an instantiation with at
 * least the minimum stages, over G, H not a multiple of 256 and expert
 * counts. */
static mm_test_result t_fused_pairs_per_regime(void) {
  static const struct {
    int64_t hidden, intermediate;
    int g;
    mm_gemm_tile want[MM_REGIME_COUNT][2];
  } cases[] = {
      /* the wide pair: the large L2 on 128x256 where H allows, as the split arm */
      {4096, 2048, 128,
       {{MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256}, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256},
        {MM_GEMM_TILE_128x256, MM_GEMM_TILE_128x256}}},
      {3968, 1408, 128,
       {{MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128}, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128},
        {MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128}}}, /* H not a multiple of 256 */
      {4096, 2048, 64,
       {{MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256}, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256},
        {MM_GEMM_TILE_128x256, MM_GEMM_TILE_128x256}}}, /* G 64: G 128's pairs */
      {3968, 1408, 64,
       {{MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128}, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128},
        {MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128}}}, /* G 64, H not a multiple of 256 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
    for (int ranks = 1; ranks <= 8; ranks *= 8) {
      megamoe_config c = megamoe_config_make(cases[i].hidden, cases[i].intermediate, 256, 6, 8192);
      c.arm = MEGAMOE_ARM_FUSED;
      c.quant_group = cases[i].g;
      for (int r = 0; r < MM_REGIME_COUNT; ++r) {
        mm_gemm_tile l1 = MM_GEMM_TILE_AUTO, l2 = MM_GEMM_TILE_AUTO;
        mm_fused_smem_plan pl;
        CHECK_OK(mm_plan_fused_kernel(&c, ranks, r, &l1, &l2, &pl));
        CHECK_MSG(l1 == cases[i].want[r][0] && l2 == cases[i].want[r][1], "H %lld G %d regime %d: %s + %s",
                  (long long)cases[i].hidden, cases[i].g, r, mm_gemm_tile_name(l1), mm_gemm_tile_name(l2));
        CHECK_MSG(pl.stages >= 3, "H %lld G %d regime %d: %u stages", (long long)cases[i].hidden, cases[i].g, r,
                  pl.stages);
      }
    }
  return MM_TEST_PASS;
}

/* The split arm's tiles per regime (mm_plan_tiles): above 128 rows per
 * expert its L2 GEMM takes 128x256 where H is a multiple of 256 (the
 * engine's 256x128 leaves an expert's last block up to half empty; docs/
 * PERF.md, twenty-third session), 256x128 where it is not; the staged arm
 * keeps the engine's pick. */
static mm_test_result t_split_tiles_per_regime(void) {
  static const struct {
    int64_t hidden;
    int arm;
    mm_gemm_tile want_l2[MM_REGIME_COUNT];
  } cases[] = {
      {4096, MEGAMOE_ARM_SPLIT, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x256}},
      {3968, MEGAMOE_ARM_SPLIT, {MM_GEMM_TILE_128x128, MM_GEMM_TILE_128x128, MM_GEMM_TILE_256x128}},
      {4096, MEGAMOE_ARM_STAGED, {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256, MM_GEMM_TILE_256x128}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
    for (int g = 64; g <= 128; g += 64) {
      megamoe_config c = megamoe_config_make(cases[i].hidden, 2048, 256, 6, 8192);
      c.arm = cases[i].arm;
      c.quant_group = g;
      for (int r = 0; r < MM_REGIME_COUNT; ++r) {
        mm_gemm_tile l1 = MM_GEMM_TILE_AUTO, l2 = MM_GEMM_TILE_AUTO;
        CHECK_OK(mm_plan_tiles(&c, 2, r, &l1, &l2));
        CHECK_MSG(l2 == cases[i].want_l2[r], "%s H %lld G %d regime %d: L2 %s", megamoe_arm_name(c.arm),
                  (long long)cases[i].hidden, g, r, mm_gemm_tile_name(l2));
        /* L1 (N = 2I = 4096 here) keeps the engine's pick: fp32 out (staged),
         * SwiGLU out at G (split). */
        const mm_gemm_tile want_l1 =
            c.arm == MEGAMOE_ARM_STAGED ? (r == MM_REGIME_LARGE ? MM_GEMM_TILE_256x128 : MM_GEMM_TILE_64x256)
                                        : (r == MM_REGIME_DECODE ? MM_GEMM_TILE_64x256 : MM_GEMM_TILE_128x256);
        CHECK_MSG(l1 == want_l1, "%s H %lld G %d regime %d: L1 %s", megamoe_arm_name(c.arm), (long long)cases[i].hidden,
                  g, r, mm_gemm_tile_name(l1));
      }
    }
  megamoe_config c = megamoe_config_make(4096, 2048, 256, 6, 8192);
  mm_gemm_tile l1, l2;
  CHECK(mm_plan_tiles(&c, 2, MM_REGIME_COUNT, &l1, &l2) == MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK(mm_plan_tiles(&c, 0, 0, &l1, &l2) == MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK(mm_plan_tiles(&c, 512, 0, &l1, &l2) == MEGAMOE_ERR_BAD_ARGUMENT); /* more ranks than experts */
  return MM_TEST_PASS;
}

/* The kernel's shared memory for every instantiated pair and every local
 * expert count: the task cache never costs a pipeline stage, the pairs keep
 * the stages they were measured with up to 256 local experts, and what the
 * launch requests plus the static reserve fits the opt-in limit. Host
 * arithmetic of the kernel's own layout functions (fused_arm.cu). Pairs no
 * regime picks are not instantiated. */
static mm_test_result t_fused_smem_plans(void) {
  static const struct {
    mm_gemm_tile l1, l2;
    int32_t g;
  } pairs[] = {{MM_GEMM_TILE_128x256, MM_GEMM_TILE_128x256, 128}, {MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128, 128},
               {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256, 128},   {MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128, 128},
               {MM_GEMM_TILE_128x256, MM_GEMM_TILE_128x256, 64},  {MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128, 64},
               {MM_GEMM_TILE_64x256, MM_GEMM_TILE_64x256, 64},    {MM_GEMM_TILE_64x256, MM_GEMM_TILE_128x128, 64}};
  const size_t n_pairs = sizeof pairs / sizeof pairs[0];
  int64_t fits = 0, full_cache = 0, smaller_cache = 0;
  mm_fused_smem_plan pl;
  for (size_t i = 0; i < n_pairs; ++i)
    for (int32_t e = 1; e <= MEGAMOE_MAX_LOCAL_EXPERTS; ++e) {
      CHECK_OK(mm_fused_smem_plan_of(pairs[i].l1, pairs[i].l2, pairs[i].g, e, &pl));
      const uint32_t n = pl.cache_entries;
      CHECK_MSG(pl.stages == pl.stages_no_cache, "%s + %s, G %d, E_l %d: %u stages with the task cache, %u without",
                mm_gemm_tile_name(pairs[i].l1), mm_gemm_tile_name(pairs[i].l2), (int)pairs[i].g, (int)e, pl.stages,
                pl.stages_no_cache);
      CHECK_MSG(n <= 256 && (n & (n - 1)) == 0, "E_l %d: %u cache entries", (int)e, n);
      /* The pipeline depth every measured configuration ran with (docs/PERF.md):
       * up to 256 local experts, 3 stages for the large pairs (L1 128x256), 4
       * for the decode pairs. Static shared memory is the usual way to lose
       * one (MM_FUSED_STATIC_SMEM: each byte counts against the stages). */
      if (e <= 256) {
        const uint32_t want = pairs[i].l1 == MM_GEMM_TILE_128x256 ? 3u : 4u;
        CHECK_MSG(pl.stages >= want, "%s + %s, G %d, E_l %d: %u pipeline stages, below the %u measured",
                  mm_gemm_tile_name(pairs[i].l1), mm_gemm_tile_name(pairs[i].l2), (int)pairs[i].g, (int)e, pl.stages,
                  want);
      }
      if (pl.stages == 0) continue;
      CHECK_MSG(pl.dynamic_bytes + pl.static_reserve <= pl.limit, "%s + %s, G %d, E_l %d: %u + %u B above %u",
                mm_gemm_tile_name(pairs[i].l1), mm_gemm_tile_name(pairs[i].l2), (int)pairs[i].g, (int)e,
                pl.dynamic_bytes, pl.static_reserve, pl.limit);
      ++fits;
      if (n == 256) ++full_cache;
      else ++smaller_cache;
    }
  CHECK(mm_fused_smem_plan_of(MM_GEMM_TILE_64x256, MM_GEMM_TILE_256x128, 128, 8, &pl) != MEGAMOE_OK); /* not instantiated */
  /* G 64's old pairs (L1 128x128), no longer picked */
  CHECK(mm_fused_smem_plan_of(MM_GEMM_TILE_128x128, MM_GEMM_TILE_128x256, 64, 8, &pl) != MEGAMOE_OK);
  CHECK(mm_fused_smem_plan_of(MM_GEMM_TILE_128x128, MM_GEMM_TILE_256x128, 64, 8, &pl) != MEGAMOE_OK);
  printf("    %lld (pair, E_l) layouts fit: %lld with the full task cache, %lld with a smaller one, none lost a stage\n",
         (long long)fits, (long long)full_cache, (long long)smaller_cache);
  return MM_TEST_PASS;
}

/* The fused kernel's L2 tile reads one B scale per 128 columns
 * (kBScale128, fused_kernel.cuh): a plan whose L2 B scales are per 64 is
 * refused before any launch, by name, the plans untouched. */
static mm_test_result t_fused_l2_b_scale_block(void) {
  mm_gemm_plan l1, l2;
  memset(&l1, 0, sizeof l1);
  memset(&l2, 0, sizeof l2);
  l1.tile = MM_GEMM_TILE_128x256;
  l2.tile = MM_GEMM_TILE_128x256;
  l2.problem.a_sf_block = 128;
  l2.problem.b_sf_block_n = 64;
  mm_gemm_plan l1_before = l1, l2_before = l2;
  CHECK(mm_fused_prepare(&l1, &l2) == MEGAMOE_ERR_INTERNAL);
  CHECK_MESSAGE_HAS("L2 B scales per 64 columns");
  CHECK(memcmp(&l1, &l1_before, sizeof l1) == 0 && memcmp(&l2, &l2_before, sizeof l2) == 0);
  return MM_TEST_PASS;
}

const mm_test unit_suite_fused_kernel[] = {
    {"fused.kernel_shared_memory_plans", t_fused_smem_plans},
    {"fused.l2_b_scales_per_128_columns", t_fused_l2_b_scale_block},
    {"tiles.engine_pick_by_rows_per_expert", t_pick_tile_rule},
    {"tiles.fused_pairs_per_regime", t_fused_pairs_per_regime},
    {"tiles.split_per_regime", t_split_tiles_per_regime},
    {NULL, NULL},
};
