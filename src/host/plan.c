/* The layer's plan (plan.h). */
#include "plan.h"

#include <stdio.h>
#include <string.h>

#include "device/fused/fused_arm.h"
#include "device/split/split.h"
#include "errors.h"

/* Rows per expert standing for each regime when the tile is picked. The
 * fused arm has kernels for the decode and large pairs only: its mid regime
 * takes the decode pair (one 64-row L1 m-block per 64 rows). */
static const int64_t kRegimeRows[MM_REGIME_COUNT] = {64, 128, 4096};
static int64_t regime_rows(const megamoe_config* c, int r) {
  return c->arm == MEGAMOE_ARM_FUSED && r == MM_REGIME_MID ? kRegimeRows[MM_REGIME_DECODE] : kRegimeRows[r];
}

/* The tile of GEMM problem p (L1 or L2) in regime r: the engine's pick for
 * the regime's rows per expert. (The fused arm's large regime took a 128x128 L2
 * tile while its L1 tile was 64x256, for a fourth pipeline stage; with the
 * 128x256 L1 tile both images are 48 KB and 256x128 is faster: 3341 against
 * 3643 us at 8192 tokens on one H200, docs/PERF.md.) */
static mm_gemm_tile pick_tile(const megamoe_config* c, const mm_gemm_problem* p, int r) {
  /* The split arm's L2 GEMM above 128 rows per expert: 128x256 where the
   * width allows it. The engine's 256x128 leaves an expert's last m-block up
   * to half empty (384 rows per expert at 2048 tokens: 256 + 128), and runs no
   * faster on full blocks. One H100, N 4096, K 2048, bench-gemm: 204 against
   * 254 us at 384 rows per expert, 262 against 263 at 512, 967 against 974 at
   * 2048; the split arm 1.5-3.9 % faster at 1536-8192 tokens (docs/PERF.md,
   * twenty-third session). The fused arm takes it too, at both G (its pairs
   * with it are instantiated: fused_instances.cuh): 2-8 % faster at
   * 1024-8192 tokens on an H100 at G = 128, 1-3 % at G = 64 (with the old
   * 128x128 L1), nothing at 64-512 (twenty-fifth and twenty-sixth
   * sessions). The staged arm's L2 is a plain bf16 GEMM and keeps the
   * engine's pick. */
  if (p->out_kind == MM_GEMM_OUT_BF16_SCATTER && r == MM_REGIME_LARGE && p->n % 256 == 0)
    return MM_GEMM_TILE_128x256;
  return mm_gemm_pick_tile(p, regime_rows(c, r));
}

/* The arm's GEMM problems without the weight pointers (mm_plan_make sets
 * them); with v == NULL, shapes and outputs only (what the tile check needs).
 *   staged: L1 pool x W1p^T -> fp32; L2 quantized L1 output x W2^T -> bf16.
 *   split:  L1 with the SwiGLU + quantization epilogue and the rows-ready
 *           wait (the pull runs beside it); L2 with the scatter epilogue into
 *           every rank's combine buffer.
 *   fused:  the split arm's epilogues on the ring (pool_rows = the ring's
 *           rows: A, scales, row weights, row table and L1 output all at ring
 *           rows); no rows-ready counters (the kernel waits on its per-block
 *           counters, indexed by virtual block). */
static int arm_problems(const megamoe_config* c, const mm_layer_view* v, int local_experts, int64_t pool_rows,
                        mm_gemm_problem* out) {
  uint8_t* ws = v ? v->ws : NULL;
  const uint64_t* off = v ? v->offset : NULL;
#define WS(id) (ws ? (void*)(ws + off[id]) : NULL)
  const int split = c->arm == MEGAMOE_ARM_SPLIT;
  const int hooks = split || c->arm == MEGAMOE_ARM_FUSED; /* the persistent arms' epilogues */
  mm_gemm_problem l1 = mm_gemm_problem_make((const uint8_t*)WS(MM_WS_POOL_X), (const float*)WS(MM_WS_POOL_X_SF),
                                            MM_SCALE_BLOCK, NULL, NULL, MM_W1_INTERLEAVE,
                                            (const int32_t*)WS(MM_WS_POOL_OFFSET),
                                            (const int32_t*)WS(MM_WS_POOL_COUNT), local_experts, (int32_t)pool_rows,
                                            (int32_t)(2 * c->intermediate), (int32_t)c->hidden);
  mm_gemm_problem l2 = mm_gemm_problem_make((const uint8_t*)WS(MM_WS_L1_OUT), (const float*)WS(MM_WS_L1_OUT_SF),
                                            c->quant_group, NULL, NULL, MM_SCALE_BLOCK, l1.expert_offset,
                                            l1.expert_count, local_experts, (int32_t)pool_rows, (int32_t)c->hidden,
                                            (int32_t)c->intermediate);
  if (hooks) {
    l1.out_kind = MM_GEMM_OUT_SWIGLU_FP8;
    l1.swiglu.row_weight = (const float*)WS(MM_WS_POOL_WEIGHT);
    l1.swiglu.group = c->quant_group;
    l1.swiglu.has_clamp = c->has_swiglu_clamp;
    l1.swiglu.clamp = c->swiglu_clamp;
    l1.swiglu.out = (uint8_t*)WS(MM_WS_L1_OUT);
    l1.swiglu.out_sf = (float*)WS(MM_WS_L1_OUT_SF);
    l1.ready.counters = split ? (const int32_t*)WS(MM_WS_READY) : NULL;
    l1.ready.base = 0;
    l1.ready.per_row = 1;
    l2.out_kind = MM_GEMM_OUT_BF16_SCATTER;
    l2.scatter.rows = (const mm_pool_row*)WS(MM_WS_POOL_ROWS);
    l2.scatter.top_k = c->top_k;
    if (v) {
      l2.scatter.source_early = (const int32_t*)(v->peer_sym[v->rank] + v->offset[MM_SYM_COMBINE_ORDER]);
      l2.scatter.num_ranks = v->num_ranks;
      for (int r = 0; r < v->num_ranks; ++r) {
        l2.scatter.dst_base[r] = v->peer_sym[r] + v->offset[MM_SYM_COMBINE];
        l2.scatter.arrived_base[r] = (int32_t*)(v->peer_sym[r] + v->offset[MM_SYM_COMBINE_ARRIVED]);
      }
    }
  } else {
    l1.out_kind = MM_GEMM_OUT_F32;
    l1.d = WS(MM_WS_L1_ACC);
    l2.out_kind = MM_GEMM_OUT_BF16;
    l2.d = WS(MM_WS_L2_OUT);
  }
#undef WS
  if (v) {
    l1.status = l2.status = (mm_device_status*)(v->ws + v->offset[MM_WS_STATUS]);
    l1.timeout_ns = l2.timeout_ns = v->timeout_ns;
  }
  out[0] = l1;
  out[1] = l2;
  return 2;
}

megamoe_status mm_plan_check(const megamoe_config* c, int num_ranks) {
  const int El = c->num_experts / num_ranks;
  mm_gemm_problem p[MM_ARM_MAX_GEMMS];
  const int n = arm_problems(c, NULL, El, MM_POOL_ROW_ALIGN * (int64_t)El, p);
  for (int r = 0; r < MM_REGIME_COUNT; ++r)
    for (int g = 0; g < n; ++g) {
      const mm_gemm_tile tile = pick_tile(c, &p[g], r);
      megamoe_status st = mm_gemm_tile_check(tile, p[g].out_kind, p[g].a_sf_block, p[g].swiglu.group, El, NULL);
      if (st != MEGAMOE_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", megamoe_last_error());
        return mm_fail(st, "config: GEMM %d of the %s arm cannot run here: %s", g + 1, megamoe_arm_name(c->arm), msg);
      }
    }
  /* The fused arm runs both GEMMs' tiles in one kernel, whose pipeline
   * stages hold either image: the pair of each regime. */
  if (c->arm == MEGAMOE_ARM_FUSED)
    for (int r = 0; r < MM_REGIME_COUNT; ++r) {
      const mm_gemm_tile t1 = pick_tile(c, &p[0], r), t2 = pick_tile(c, &p[1], r);
      megamoe_status st = mm_fused_check(t1, t2, p[1].a_sf_block, El, NULL);
      if (st != MEGAMOE_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", megamoe_last_error());
        return mm_fail(st, "config: the fused arm cannot run here: %s", msg);
      }
    }
  return MEGAMOE_OK;
}

megamoe_status mm_plan_tiles(const megamoe_config* c, int num_ranks, int r, mm_gemm_tile* l1, mm_gemm_tile* l2) {
  MM_CHECK_NULL(c, "config");
  MM_CHECK_NULL(l1, "l1");
  MM_CHECK_NULL(l2, "l2");
  if (r < 0 || r >= MM_REGIME_COUNT) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "regime = %d: not a regime", r);
  if (num_ranks < 1 || num_ranks > c->num_experts)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "num_ranks = %d: between 1 and the expert count %lld", num_ranks,
                   (long long)c->num_experts);
  const int El = c->num_experts / num_ranks;
  mm_gemm_problem p[MM_ARM_MAX_GEMMS];
  (void)arm_problems(c, NULL, El, MM_POOL_ROW_ALIGN * (int64_t)El, p);
  *l1 = pick_tile(c, &p[0], r);
  *l2 = pick_tile(c, &p[1], r);
  return MEGAMOE_OK;
}

megamoe_status mm_plan_fused_kernel(const megamoe_config* c, int num_ranks, int r, mm_gemm_tile* l1, mm_gemm_tile* l2,
                                    mm_fused_smem_plan* smem) {
  MM_TRY(mm_plan_tiles(c, num_ranks, r, l1, l2));
  return mm_fused_smem_plan_of(*l1, *l2, c->quant_group, c->num_experts / num_ranks, smem);
}

megamoe_status mm_plan_make(mm_plan* plan, const megamoe_config* c, const mm_layer_view* v, int engine,
                            const uint8_t* w1p, const float* w1p_sf, const uint8_t* w2, const float* w2_sf) {
  memset(plan, 0, sizeof *plan);
  mm_gemm_problem p[MM_ARM_MAX_GEMMS];
  const int n = arm_problems(c, v, v->local_experts, v->pool_rows, p);
  p[0].b = w1p;
  p[0].b_sf = w1p_sf;
  p[1].b = w2;
  p[1].b_sf = w2_sf;
  /* The split and fused arms' kernels are built on the wgmma engine (the
   * simple engine is the staged arm's oracle and has no hooks). */
  if (c->arm != MEGAMOE_ARM_STAGED) engine = MM_GEMM_ENGINE_WGMMA;
  for (int r = 0; r < MM_REGIME_COUNT; ++r)
    for (int g = 0; g < n; ++g) {
      mm_arm_gemm* a = &plan->gemm[r][g];
      a->problem = p[g];
      a->engine = engine;
      if (engine == MM_GEMM_ENGINE_WGMMA) {
        MM_TRY(mm_gemm_plan_make(&p[g], pick_tile(c, &p[g], r), &a->plan));
      } else {
        MM_TRY(mm_gemm_check(&p[g]));
      }
    }
  if (c->arm == MEGAMOE_ARM_SPLIT)
    for (int r = 0; r < MM_REGIME_COUNT; ++r) MM_TRY(mm_split_prepare(&plan->gemm[r][0].plan, &plan->gemm[r][1].plan));
  if (c->arm == MEGAMOE_ARM_FUSED)
    for (int r = 0; r < MM_REGIME_COUNT; ++r) MM_TRY(mm_fused_prepare(&plan->gemm[r][0].plan, &plan->gemm[r][1].plan));
  return MEGAMOE_OK;
}

mm_regime mm_plan_regime(const megamoe_config* c, int num_ranks, int64_t num_tokens, int64_t bound) {
  const int64_t t = bound > 0 ? bound : num_tokens;
  /* Uniform routing: R * t * K slots over E experts. */
  const int64_t rows = (num_ranks * t * (int64_t)c->top_k + c->num_experts - 1) / c->num_experts;
  if (rows <= MM_DECODE_ROWS_PER_EXPERT) return MM_REGIME_DECODE;
  return rows <= MM_MID_ROWS_PER_EXPERT ? MM_REGIME_MID : MM_REGIME_LARGE;
}

int mm_plan_early_combine(const megamoe_config* c, int mode, int64_t num_tokens, int sms) {
  if (c->arm == MEGAMOE_ARM_STAGED || mode == 0 || !mm_early_combine_built()) return 0;
  if (mode == 2) return 1;
  const int64_t units = num_tokens * mm_combine_units((int32_t)c->hidden);
  return units <= 12 * (int64_t)sms;
}

megamoe_status mm_arm_gemm_run(const mm_arm_gemm* g, cudaStream_t stream) {
  return g->engine == MM_GEMM_ENGINE_WGMMA ? mm_gemm_plan_launch(&g->plan, stream) : mm_gemm_simple(&g->problem, stream);
}
