/* Fuzz of the config checks and the buffer layout (issue 14, part 4; CPU, in
 * CI): random configurations with extreme and overflowing values through
 * megamoe_check_config, mm_layout_compute, megamoe_buffer_sizes,
 * megamoe_weight_memory and megamoe_layout; random forward arguments
 * (NULL and misaligned pointers, token counts and bounds at and past every
 * limit, bad index types) through the host checks of megamoe_forward
 * (mm_check_forward_args); random sets of per-rank configs through the
 * comparison megamoe_create makes across ranks (mm_config_prints_compare).
 *
 * Every call must return (a crash or an endless loop fails the run; the
 * sanitized build, `make fuzz-sanitized`, also catches undefined behaviour
 * and out-of-bounds reads). The rejection must be the one an independent
 * model of the rules expects (fuzz_expect below: the first broken rule, in
 * the checker's documented order) and its message must name that argument.
 * An accepted config's layout must hold its own invariants: regions
 * 256-byte aligned, inside their space, not overlapping, sized by the
 * formulas of DESIGN.md section 4 (the fused arm's ring, counters and call
 * table by those of docs/FUSED.md section 3), the totals equal to what the
 * public size queries return. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config.h"
#include "host/layout.h"
#include "megamoe.h"
#include "unit.h"

/* What the checker must say about a config: the status and the argument
 * its message names (NULL: accepted). Written from the documented rules, not
 * from the checker's code. */
typedef struct fuzz_expect {
  megamoe_status status;
  const char* names;
} fuzz_expect;

static fuzz_expect expect(megamoe_status s, const char* name) {
  fuzz_expect e = {s, name};
  return e;
}

static fuzz_expect fuzz_model(const megamoe_config* c, int R) {
  if (R < 1 || R > MEGAMOE_MAX_RANKS) return expect(MEGAMOE_ERR_BAD_RANKS, "num_ranks");
  if (c->hidden <= 0 || c->hidden % 128 || c->hidden > MEGAMOE_MAX_HIDDEN) return expect(MEGAMOE_ERR_BAD_SHAPE, "hidden");
  if (c->intermediate <= 0 || c->intermediate % 128 || c->intermediate > MEGAMOE_MAX_INTERMEDIATE)
    return expect(MEGAMOE_ERR_BAD_SHAPE, "intermediate");
  if (c->num_experts < 1 || c->num_experts % R || c->num_experts / R > MEGAMOE_MAX_LOCAL_EXPERTS)
    return expect(MEGAMOE_ERR_BAD_EXPERTS, "num_experts");
  if (c->top_k < 1 || c->top_k > c->num_experts || c->top_k > MEGAMOE_MAX_TOP_K)
    return expect(MEGAMOE_ERR_BAD_TOP_K, "top_k");
  if (c->max_tokens_per_rank < 1) return expect(MEGAMOE_ERR_BAD_MAX_TOKENS, "max_tokens_per_rank");
  /* token_slot = t * K + k is an int32 on the device. */
  if (c->max_tokens_per_rank > (int64_t)INT32_MAX / c->top_k) return expect(MEGAMOE_ERR_SIZE_OVERFLOW, "max_tokens_per_rank");
  if (c->quant_group != 64 && c->quant_group != 128) return expect(MEGAMOE_ERR_BAD_QUANT_GROUP, "quant_group");
  if (c->has_swiglu_clamp != 0 && c->has_swiglu_clamp != 1) return expect(MEGAMOE_ERR_BAD_ARGUMENT, "has_swiglu_clamp");
  if (c->has_swiglu_clamp && !(c->swiglu_clamp > 0.0f && c->swiglu_clamp <= FLT_MAX))
    return expect(MEGAMOE_ERR_BAD_CLAMP, "swiglu_clamp");
  if ((int)c->arm < 0 || (int)c->arm >= MEGAMOE_ARM_COUNT) return expect(MEGAMOE_ERR_BAD_ARM, "arm");
  if (c->timeout_s != c->timeout_s || c->timeout_s > 86400.0 * 365) return expect(MEGAMOE_ERR_BAD_ARGUMENT, "timeout_s");
  if (!(c->pool_imbalance == 0.0 || (c->pool_imbalance >= 1.0 && c->pool_imbalance <= (double)R)))
    return expect(MEGAMOE_ERR_BAD_ARGUMENT, "pool_imbalance");
  return expect(MEGAMOE_OK, NULL);
}

/* ---- Draws: mostly plausible values, often edges, sometimes anything ------ */
static int64_t draw_i64(mm_rng* g, int64_t typical_max, int64_t multiple) {
  static const int64_t edges[] = {0, -1, 1, -128, 127, 129, 255, 256, 4096, 16384, 16512, 65536, (int64_t)INT32_MAX,
                                  (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN, INT64_MAX, INT64_MIN, INT64_MAX - 127,
                                  (int64_t)1 << 40, (int64_t)1 << 62};
  const uint64_t kind = mm_rng_below(g, 20);
  if (kind < 16) return multiple * (int64_t)(1 + mm_rng_below(g, (uint64_t)(typical_max / multiple)));
  if (kind < 19) return edges[mm_rng_below(g, sizeof edges / sizeof edges[0])];
  return (int64_t)mm_rng_next(g);
}

static int32_t draw_i32(mm_rng* g, int32_t typical_max) {
  static const int32_t edges[] = {0, -1, 1, 2, 7, 8, 9, 16, 17, 1024, 1025, 8192, 8193, INT32_MAX, INT32_MIN};
  const uint64_t kind = mm_rng_below(g, 20);
  if (kind < 16) return (int32_t)(1 + mm_rng_below(g, (uint64_t)typical_max));
  if (kind < 19) return edges[mm_rng_below(g, sizeof edges / sizeof edges[0])];
  return (int32_t)mm_rng_next(g);
}

static double draw_f64(mm_rng* g, double typical_max) {
  const double edges[] = {0.0, -0.0, -1.0, 1.0, 0.5, 1e-300, 86400.0 * 365, 86400.0 * 366, DBL_MAX, -DBL_MAX, INFINITY,
                          -INFINITY, NAN};
  const uint64_t kind = mm_rng_below(g, 10);
  if (kind < 6) return typical_max * mm_rng_uniform(g);
  if (kind < 9) return edges[mm_rng_below(g, sizeof edges / sizeof edges[0])];
  uint64_t bits = mm_rng_next(g);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

static void draw_config(mm_rng* g, megamoe_config* c, int* R) {
  *R = mm_rng_below(g, 8) ? (int)(1 + mm_rng_below(g, 8)) : draw_i32(g, 9);
  /* A multiple of the rank count (wrapping to any int32 for extreme draws). */
  const int32_t experts = mm_rng_below(g, 4) ? (int32_t)(uint32_t)((uint64_t)(uint32_t)(*R > 0 ? *R : 1) *
                                                                    (uint64_t)(uint32_t)draw_i32(g, 64))
                                              : draw_i32(g, 1 << 13);
  *c = megamoe_config_make(draw_i64(g, 16384, 128), draw_i64(g, 4096, 128), experts, draw_i32(g, 16),
                           draw_i64(g, 1 << 16, 1));
  if (mm_rng_below(g, 4) == 0) c->quant_group = draw_i32(g, 128);
  else c->quant_group = mm_rng_below(g, 2) ? 64 : 128;
  if (mm_rng_below(g, 3) == 0) {
    c->has_swiglu_clamp = mm_rng_below(g, 8) ? 1 : draw_i32(g, 2);
    const float clamps[] = {0.0f, -1.0f, 1e-30f, 10.0f, FLT_MAX, INFINITY, -INFINITY, NAN};
    c->swiglu_clamp = mm_rng_below(g, 2) ? (float)(10.0 * mm_rng_uniform(g)) : clamps[mm_rng_below(g, 8)];
  }
  if (mm_rng_below(g, 4) == 0) c->arm = (megamoe_arm)draw_i32(g, 3);
  else c->arm = (megamoe_arm)mm_rng_below(g, MEGAMOE_ARM_COUNT);
  if (mm_rng_below(g, 3) == 0) c->timeout_s = draw_f64(g, 120.0);
  if (mm_rng_below(g, 3) == 0) c->pool_imbalance = mm_rng_below(g, 2) ? 1.0 + mm_rng_uniform(g) * (*R > 1 ? *R - 1 : 0) : draw_f64(g, 9.0);
}

/* ---- Invariants of an accepted layout -------------------------------------- */
static int layout_ok(const megamoe_config* c, int R, const mm_layout* l, char* why, size_t n) {
  const uint64_t H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate, K = (uint64_t)c->top_k;
  const uint64_t T = (uint64_t)c->max_tokens_per_rank, P = (uint64_t)l->pool_rows;
  const uint64_t El = (uint64_t)(c->num_experts / R);
  const int fused = c->arm == MEGAMOE_ARM_FUSED;
  if (l->num_ranks != R || (uint64_t)l->local_experts != El) return snprintf(why, n, "rank or expert count"), 0;
  if (P % MM_POOL_ROW_ALIGN || P > (uint64_t)INT32_MAX || (!fused && P < El * MM_POOL_ROW_ALIGN))
    return snprintf(why, n, "pool rows %llu", (unsigned long long)P), 0;
  /* The fused arm's pool regions are its ring (docs/FUSED.md section 3): the
   * lag ring 8 (lag + group) + 4, or the worst case at T_max when smaller;
   * the per-block counters cover the worst case, which covers every routed
   * row; lag and group as the rule gives them. */
  if (fused) {
    const mm_fused_ring* g = &l->ring;
    const uint64_t worst = (R * T * K + 127 * El) / 128 < R * T * K ? (R * T * K + 127 * El) / 128 : R * T * K;
    const uint64_t lagged = 8 * (uint64_t)(g->lag + g->group) + 4;
    if (g->lag < 8 || g->lag > 64 || g->group != 4 || (uint64_t)g->virtual_blocks != worst ||
        (uint64_t)g->blocks != (lagged < worst ? lagged : worst) || g->clamped != (worst <= lagged) ||
        P != (uint64_t)g->blocks * 128 || worst * 128 < R * T * K)
      return snprintf(why, n, "fused ring: %d blocks, lag %d, group %d, %d virtual blocks (worst case %llu)",
                      g->blocks, g->lag, g->group, g->virtual_blocks, (unsigned long long)worst), 0;
  } else if (l->ring.blocks || l->ring.virtual_blocks) {
    return snprintf(why, n, "a ring on arm %s", megamoe_arm_name(c->arm)), 0;
  }
  const uint64_t total[2] = {l->symmetric_bytes, l->workspace_bytes};
  if (total[0] % MM_REGION_ALIGN || total[1] % MM_REGION_ALIGN) return snprintf(why, n, "totals not aligned"), 0;
  for (int id = 0; id < MM_REGION_COUNT; ++id) {
    const mm_region* r = &l->regions[id];
    if (!r->name || r->align != MM_REGION_ALIGN || r->offset % r->align) return snprintf(why, n, "region %d alignment", id), 0;
    if (r->offset > total[r->space] || r->bytes > total[r->space] - r->offset)
      return snprintf(why, n, "%s past its space", r->name), 0;
    for (int o = 0; o < id; ++o) {
      const mm_region* q = &l->regions[o];
      if (q->space != r->space || !q->bytes || !r->bytes) continue;
      if (!(r->offset >= q->offset + q->bytes || q->offset >= r->offset + r->bytes))
        return snprintf(why, n, "%s overlaps %s", r->name, q->name), 0;
    }
  }
  /* Sizes of DESIGN.md section 4. */
  const struct {
    mm_region_id id;
    uint64_t bytes;
  } want[] = {{MM_SYM_INPUT_X, T * H},        {MM_SYM_INPUT_X_SF, T * (H / 128) * 4}, {MM_SYM_COMBINE, T * K * H * 2},
              {MM_WS_POOL_X, P * H},          {MM_WS_POOL_X_SF, P * (H / 128) * 4},   {MM_WS_L1_OUT, P * I},
              {MM_WS_L1_OUT_SF, P * (I / (uint64_t)c->quant_group) * 4}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i)
    if (l->regions[want[i].id].bytes != want[i].bytes)
      return snprintf(why, n, "%s has %llu bytes, want %llu", l->regions[want[i].id].name,
                      (unsigned long long)l->regions[want[i].id].bytes, (unsigned long long)want[i].bytes), 0;
  const int staged = c->arm == MEGAMOE_ARM_STAGED, split = c->arm == MEGAMOE_ARM_SPLIT;
  if ((l->regions[MM_WS_L1_ACC].bytes != 0) != staged || (l->regions[MM_WS_L2_OUT].bytes != 0) != staged ||
      (l->regions[MM_WS_READY].bytes != 0) != split || (l->regions[MM_WS_TILE_COUNTERS].bytes != 0) == staged ||
      (l->regions[MM_SYM_CALL_TOKENS].bytes != 0) != fused ||
      (l->regions[MM_WS_BLOCK_COUNTERS].bytes != 0) != fused)
    return snprintf(why, n, "arm-specific regions for arm %s", megamoe_arm_name(c->arm)), 0;
  if (fused && (l->regions[MM_SYM_CALL_TOKENS].bytes != R * sizeof(mm_call_tokens) ||
                l->regions[MM_WS_BLOCK_COUNTERS].bytes != 2 * 3 * 4 * (uint64_t)l->ring.virtual_blocks))
    return snprintf(why, n, "fused call table or counters mis-sized"), 0;
  return 1;
}

static mm_test_result fuzz_run(uint64_t salt, int iterations) {
  mm_rng g = unit_rng(salt);
  int accepted = 0, laid_out = 0, overflow = 0, fused_laid_out = 0, wrapping = 0;
  int by_status[MEGAMOE_STATUS_COUNT] = {0};
  for (int i = 0; i < iterations; ++i) {
    megamoe_config c;
    int R;
    draw_config(&g, &c, &R);
    const fuzz_expect want = fuzz_model(&c, R);
    const megamoe_status got = megamoe_check_config(&c, R);
    CHECK_MSG(got == want.status, "config %d: check gave %s, the model %s (hidden %lld intermediate %lld experts %d "
              "top_k %d max_tokens %lld G %d clamp %d/%g arm %d timeout %g imbalance %g ranks %d): %s",
              i, megamoe_status_string(got), megamoe_status_string(want.status), (long long)c.hidden,
              (long long)c.intermediate, c.num_experts, c.top_k, (long long)c.max_tokens_per_rank, c.quant_group,
              c.has_swiglu_clamp, (double)c.swiglu_clamp, (int)c.arm, c.timeout_s, c.pool_imbalance, R,
              megamoe_last_error());
    by_status[got]++;
    if (got != MEGAMOE_OK) {
      CHECK_MSG(strstr(megamoe_last_error(), want.names) != NULL, "config %d: %s names no \"%s\": %s", i,
                megamoe_status_string(got), want.names, megamoe_last_error());
      /* The layout and the size queries reject it the same way. */
      mm_layout l;
      CHECK(mm_layout_compute(&c, R, &l) == got);
      CHECK(megamoe_buffer_sizes(&c, R, NULL, NULL) == got);
      continue;
    }
    accepted++;
    mm_layout l;
    const megamoe_status ls = mm_layout_compute(&c, R, &l);
    if (ls == MEGAMOE_ERR_SIZE_OVERFLOW) {
      CHECK_MSG(strstr(megamoe_last_error(), "max_tokens_per_rank") != NULL, "overflow message: %s",
                megamoe_last_error());
      overflow++;
      continue;
    }
    CHECK_MSG(ls == MEGAMOE_OK, "config %d accepted, layout gave %s: %s", i, megamoe_status_string(ls),
              megamoe_last_error());
    char why[256] = "";
    CHECK_MSG(layout_ok(&c, R, &l, why, sizeof why), "config %d (hidden %lld experts %d top_k %d max_tokens %lld "
              "ranks %d arm %s imbalance %g): %s", i, (long long)c.hidden, c.num_experts, c.top_k,
              (long long)c.max_tokens_per_rank, R, megamoe_arm_name(c.arm), c.pool_imbalance, why);
    size_t sym = 0, ws = 0, res_copy = 0, peak_copy = 0, res_place = 0, peak_place = 0;
    CHECK_OK(megamoe_buffer_sizes(&c, R, &sym, &ws));
    CHECK(sym == l.symmetric_bytes && ws == l.workspace_bytes);
    CHECK_OK(megamoe_weight_memory(&c, R, MEGAMOE_WEIGHTS_COPY, &res_copy, &peak_copy));
    CHECK_OK(megamoe_weight_memory(&c, R, MEGAMOE_WEIGHTS_IN_PLACE, &res_place, &peak_place));
    CHECK(res_copy == peak_copy && res_place <= peak_place && peak_place < res_copy);
    laid_out++;
    fused_laid_out += c.arm == MEGAMOE_ARM_FUSED;
    wrapping += c.arm == MEGAMOE_ARM_FUSED && !l.ring.clamped;
  }
  printf("    %d configs: %d accepted (%d laid out, %d of them fused, %d with a wrapping ring; %d too large for "
         "64-bit sizes); rejections:", iterations, accepted, laid_out, fused_laid_out, wrapping, overflow);
  for (int s = 1; s < MEGAMOE_STATUS_COUNT; ++s)
    if (by_status[s]) printf(" %s %d", megamoe_status_string((megamoe_status)s), by_status[s]);
  printf("\n");
  /* The draws must reach both sides (a fuzz that only ever rejects tests little). */
  CHECK(laid_out > iterations / 50 && accepted < iterations);
  CHECK(fused_laid_out > laid_out / 5 && wrapping > 0 && wrapping < fused_laid_out); /* both ring kinds */
  return MM_TEST_PASS;
}

static mm_test_result t_fuzz_configs(void) { return fuzz_run(0xf022, 100000); }

/* The model itself can fail: a config the model rejects must not slip
 * through when its rule is planted away (here: a top_k above the kernels'
 * limit, which the model must call BAD_TOP_K). */
static mm_test_result t_fuzz_model_is_strict(void) {
  megamoe_config c = megamoe_config_make(512, 512, 64, MEGAMOE_MAX_TOP_K + 1, 128);
  CHECK(fuzz_model(&c, 2).status == MEGAMOE_ERR_BAD_TOP_K);
  CHECK(megamoe_check_config(&c, 2) == MEGAMOE_ERR_BAD_TOP_K);
  c = megamoe_config_make(512, 512, 64, 6, 128);
  c.pool_imbalance = 2.5;
  CHECK(fuzz_model(&c, 2).status == MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK(megamoe_check_config(&c, 2) == MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK_MESSAGE_HAS("pool_imbalance");
  return MM_TEST_PASS;
}

/* ---- Forward arguments --------------------------------------------------------
 * What megamoe_forward's host checks must say (megamoe.h: the documented
 * rules, in their order): the status and the argument the message names. */
static fuzz_expect forward_model(const megamoe_config* c, const megamoe_forward_args* a) {
  if (!a) return expect(MEGAMOE_ERR_NULL_POINTER, "args");
  const int64_t T = a->num_tokens, B = a->num_tokens_bound;
  if (T < 0) return expect(MEGAMOE_ERR_BAD_ARGUMENT, "args->num_tokens");
  if (T > c->max_tokens_per_rank) return expect(MEGAMOE_ERR_TOO_MANY_TOKENS, "args->num_tokens");
  if (B != 0 && (B < T || B > c->max_tokens_per_rank)) return expect(MEGAMOE_ERR_TOO_MANY_TOKENS, "args->num_tokens_bound");
  if (a->topk_idx_type != MEGAMOE_INDEX_INT32 && a->topk_idx_type != MEGAMOE_INDEX_INT64)
    return expect(MEGAMOE_ERR_BAD_ARGUMENT, "args->topk_idx_type");
  if (T == 0) return expect(MEGAMOE_OK, NULL); /* no token: no pointer is read */
  if (!a->x) return expect(MEGAMOE_ERR_NULL_POINTER, "args->x");
  if (!a->x_sf) return expect(MEGAMOE_ERR_NULL_POINTER, "args->x_sf");
  if (!a->topk_idx) return expect(MEGAMOE_ERR_NULL_POINTER, "args->topk_idx");
  if (!a->topk_w) return expect(MEGAMOE_ERR_NULL_POINTER, "args->topk_w");
  if (!a->y) return expect(MEGAMOE_ERR_NULL_POINTER, "args->y");
  if ((uintptr_t)a->y % 16) return expect(MEGAMOE_ERR_BAD_ARGUMENT, "args->y");
  if ((uintptr_t)a->topk_idx % (a->topk_idx_type == MEGAMOE_INDEX_INT64 ? 8 : 4))
    return expect(MEGAMOE_ERR_BAD_ARGUMENT, "args->topk_idx");
  if ((uintptr_t)a->topk_w % 4) return expect(MEGAMOE_ERR_BAD_ARGUMENT, "args->topk_w");
  if ((uintptr_t)a->x_sf % 4) return expect(MEGAMOE_ERR_BAD_ARGUMENT, "args->x_sf");
  return expect(MEGAMOE_OK, NULL); /* x: any alignment (staged with a byte copy) */
}

/* A pointer the checks only look at (never dereferenced): NULL sometimes,
 * else a 256-aligned address plus a small offset. */
static const void* draw_pointer(mm_rng* g) {
  static const uintptr_t offsets[] = {0, 0, 0, 0, 1, 2, 3, 4, 6, 8, 12, 16, 24};
  if (mm_rng_below(g, 24) == 0) return NULL;
  const uintptr_t base = (uintptr_t)0x7f0000000000ull + 256u * (uintptr_t)mm_rng_below(g, 1u << 20);
  return (const void*)(base + offsets[mm_rng_below(g, sizeof offsets / sizeof offsets[0])]);
}

static int64_t draw_tokens(mm_rng* g, int64_t tmax) {
  static const int64_t edges[] = {0, 1, -1, INT64_MIN, INT64_MAX, (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN};
  switch (mm_rng_below(g, 6)) {
    case 0: return edges[mm_rng_below(g, sizeof edges / sizeof edges[0])];
    case 1: return tmax + (int64_t)mm_rng_below(g, 3) - 1; /* at and around the limit */
    default: return (int64_t)mm_rng_below(g, (uint64_t)tmax + 1);
  }
}

static mm_test_result t_fuzz_forward_args(void) {
  mm_rng g = unit_rng(0xf0a5);
  const int iterations = 100000;
  int accepted = 0;
  int by_status[MEGAMOE_STATUS_COUNT] = {0};
  for (int i = 0; i < iterations; ++i) {
    megamoe_config c = megamoe_config_make(128 * (int64_t)(1 + mm_rng_below(&g, 8)), 256, 16, 4,
                                           1 + (int64_t)mm_rng_below(&g, mm_rng_below(&g, 4) ? 512 : (1u << 30)));
    megamoe_forward_args a;
    a.x = draw_pointer(&g);
    a.x_sf = (const float*)draw_pointer(&g);
    a.topk_idx = draw_pointer(&g);
    a.topk_idx_type = mm_rng_below(&g, 8) ? (megamoe_index_type)mm_rng_below(&g, 2) : (megamoe_index_type)draw_i32(&g, 3);
    a.topk_w = (const float*)draw_pointer(&g);
    a.y = (void*)draw_pointer(&g);
    a.num_tokens = draw_tokens(&g, c.max_tokens_per_rank);
    a.num_tokens_bound = mm_rng_below(&g, 2) ? 0 : draw_tokens(&g, c.max_tokens_per_rank);
    const int null_args = mm_rng_below(&g, 100) == 0;
    const megamoe_forward_args* pa = null_args ? NULL : &a;
    const fuzz_expect want = forward_model(&c, pa);
    const megamoe_status got = mm_check_forward_args(&c, pa);
    CHECK_MSG(got == want.status, "args %d: check gave %s, the model %s (T %lld bound %lld T_max %lld type %d x %p x_sf %p "
              "idx %p w %p y %p): %s", i, megamoe_status_string(got), megamoe_status_string(want.status),
              (long long)a.num_tokens, (long long)a.num_tokens_bound, (long long)c.max_tokens_per_rank,
              (int)a.topk_idx_type, a.x, (const void*)a.x_sf, a.topk_idx, (const void*)a.topk_w, a.y,
              megamoe_last_error());
    by_status[got]++;
    if (got == MEGAMOE_OK) {
      accepted++;
      continue;
    }
    CHECK_MSG(strstr(megamoe_last_error(), want.names) != NULL, "args %d: %s names no \"%s\": %s", i,
              megamoe_status_string(got), want.names, megamoe_last_error());
  }
  printf("    %d forward argument sets: %d accepted; rejections:", iterations, accepted);
  for (int st = 1; st < MEGAMOE_STATUS_COUNT; ++st)
    if (by_status[st]) printf(" %s %d", megamoe_status_string((megamoe_status)st), by_status[st]);
  printf("\n");
  CHECK(accepted > iterations / 50 && accepted < iterations);
  CHECK(by_status[MEGAMOE_ERR_NULL_POINTER] && by_status[MEGAMOE_ERR_BAD_ARGUMENT] &&
        by_status[MEGAMOE_ERR_TOO_MANY_TOKENS]);
  return MM_TEST_PASS;
}

/* ---- The same config on every rank -------------------------------------------
 * megamoe_create compares one print per rank (host/config.h). The model,
 * from the documented meaning of each field: configs that act the same
 * compare equal (a timeout <= 0 is the default; a clamp value is unused
 * while the clamp is off; floating-point fields compare as values, two NaNs
 * alike); otherwise the first field in megamoe_config's order that differs
 * is named, with the lowest rank that differs from rank 0; a peer that
 * rejected its own arguments is named before any field. */
static int same_value(double a, double b) { return a == b || (a != a && b != b); }

static int same_field(const megamoe_config* a, const megamoe_config* b, int f) {
  switch (f) {
    case MM_PRINT_HIDDEN: return a->hidden == b->hidden;
    case MM_PRINT_INTERMEDIATE: return a->intermediate == b->intermediate;
    case MM_PRINT_EXPERTS: return a->num_experts == b->num_experts;
    case MM_PRINT_TOP_K: return a->top_k == b->top_k;
    case MM_PRINT_MAX_TOKENS: return a->max_tokens_per_rank == b->max_tokens_per_rank;
    case MM_PRINT_QUANT_GROUP: return a->quant_group == b->quant_group;
    case MM_PRINT_HAS_CLAMP: return a->has_swiglu_clamp == b->has_swiglu_clamp;
    case MM_PRINT_CLAMP:
      return (!a->has_swiglu_clamp && !b->has_swiglu_clamp) || same_value(a->swiglu_clamp, b->swiglu_clamp);
    case MM_PRINT_ARM: return a->arm == b->arm;
    case MM_PRINT_TIMEOUT:
      return same_value(a->timeout_s <= 0 ? MEGAMOE_DEFAULT_TIMEOUT_S : a->timeout_s,
                        b->timeout_s <= 0 ? MEGAMOE_DEFAULT_TIMEOUT_S : b->timeout_s);
    case MM_PRINT_IMBALANCE: return same_value(a->pool_imbalance, b->pool_imbalance);
  }
  return 1;
}

static void perturb_field(mm_rng* g, megamoe_config* c, int field) {
  switch (field) {
    case MM_PRINT_HIDDEN: c->hidden = (int64_t)((uint64_t)c->hidden + 128u * (1 + mm_rng_below(g, 4))); break;
    case MM_PRINT_INTERMEDIATE: c->intermediate = c->intermediate == 0 ? 1 : (int64_t)(0u - (uint64_t)c->intermediate); break;
    case MM_PRINT_EXPERTS: c->num_experts = (int32_t)((uint32_t)c->num_experts + 1u + (uint32_t)mm_rng_below(g, 8)); break;
    case MM_PRINT_TOP_K: c->top_k = c->top_k == 1 ? 2 : 1; break;
    case MM_PRINT_MAX_TOKENS: c->max_tokens_per_rank ^= (int64_t)1 << mm_rng_below(g, 62); break;
    case MM_PRINT_QUANT_GROUP: c->quant_group = c->quant_group == 64 ? 128 : 64; break;
    case MM_PRINT_HAS_CLAMP: c->has_swiglu_clamp = !c->has_swiglu_clamp; break;
    case MM_PRINT_CLAMP:
      c->has_swiglu_clamp = 1; /* a clamp value only counts with the clamp on */
      c->swiglu_clamp = isfinite(c->swiglu_clamp) ? c->swiglu_clamp * 2.0f + 1.0f : 3.0f;
      break;
    case MM_PRINT_ARM: c->arm = c->arm == MEGAMOE_ARM_STAGED ? MEGAMOE_ARM_SPLIT : MEGAMOE_ARM_STAGED; break;
    case MM_PRINT_TIMEOUT: c->timeout_s = c->timeout_s > 0 && c->timeout_s < 1e6 ? c->timeout_s + 1.0 : 2.0; break;
    case MM_PRINT_IMBALANCE:
      c->pool_imbalance = isfinite(c->pool_imbalance) && fabs(c->pool_imbalance) < 1e6 ? c->pool_imbalance + 1.0 : 1.0;
      break;
  }
}

static mm_test_result t_fuzz_config_prints(void) {
  mm_rng g = unit_rng(0xc0f1);
  const int iterations = 100000;
  int equal = 0, mismatched = 0, rejected = 0;
  for (int i = 0; i < iterations; ++i) {
    const int R = 2 + (int)mm_rng_below(&g, MEGAMOE_MAX_RANKS - 1), me = (int)mm_rng_below(&g, (uint64_t)R);
    megamoe_config base;
    int ignored;
    draw_config(&g, &base, &ignored); /* any values, valid or not: the comparison must not care */
    megamoe_config cfg[MEGAMOE_MAX_RANKS];
    megamoe_status local[MEGAMOE_MAX_RANKS];
    int failed_rank = -1;
    for (int r = 0; r < R; ++r) {
      cfg[r] = base;
      local[r] = MEGAMOE_OK;
      /* Differences that must not count. */
      if (mm_rng_below(&g, 4) == 0 && base.timeout_s <= 0) cfg[r].timeout_s = mm_rng_below(&g, 2) ? 0.0 : -5.0;
      if (mm_rng_below(&g, 4) == 0 && base.has_swiglu_clamp == 0) cfg[r].swiglu_clamp = (float)mm_rng_uniform(&g);
      if (mm_rng_below(&g, 4) == 0 && base.pool_imbalance == 0.0) cfg[r].pool_imbalance = mm_rng_below(&g, 2) ? 0.0 : -0.0;
      if (r > 0 && mm_rng_below(&g, 3) == 0) /* a real difference */
        perturb_field(&g, &cfg[r], MM_PRINT_HIDDEN + (int)mm_rng_below(&g, MM_PRINT_FIELDS - MM_PRINT_HIDDEN));
      if (mm_rng_below(&g, 40) == 0) {
        local[r] = mm_rng_below(&g, 2) ? MEGAMOE_ERR_NULL_POINTER : MEGAMOE_ERR_BAD_ARGUMENT;
        if (r != me && failed_rank < 0) failed_rank = r;
      }
    }
    int first_field = -1, first_rank = -1;
    for (int f = MM_PRINT_HIDDEN; f < MM_PRINT_FIELDS && first_rank < 0; ++f)
      for (int r = 1; r < R && first_rank < 0; ++r)
        if (!same_field(&cfg[0], &cfg[r], f)) {
          first_field = f;
          first_rank = r;
        }
    mm_config_print prints[MEGAMOE_MAX_RANKS];
    for (int r = 0; r < R; ++r) mm_config_print_make(local[r] == MEGAMOE_OK ? &cfg[r] : NULL, local[r], &prints[r]);
    const megamoe_status got = mm_config_prints_compare(prints, R, me);
    if (failed_rank >= 0) {
      char text[32];
      snprintf(text, sizeof text, "rank %d", failed_rank);
      CHECK_MSG(got == MEGAMOE_ERR_PEER_FAILED && strstr(megamoe_last_error(), text), "case %d: %s: %s (want %s)", i,
                megamoe_status_string(got), megamoe_last_error(), text);
      rejected++;
    } else if (local[me] != MEGAMOE_OK) {
      continue; /* only this rank rejected: it reports its own status (not judged here) */
    } else if (first_rank < 0) {
      CHECK_MSG(got == MEGAMOE_OK, "case %d: configs that act the same gave %s: %s", i, megamoe_status_string(got),
                megamoe_last_error());
      equal++;
    } else {
      char want[64], on_rank[32];
      snprintf(want, sizeof want, ": %s = ", mm_config_print_name(first_field));
      snprintf(on_rank, sizeof on_rank, "on rank %d", first_rank);
      CHECK_MSG(got == MEGAMOE_ERR_BAD_ARGUMENT && strstr(megamoe_last_error(), want) &&
                    strstr(megamoe_last_error(), on_rank),
                "case %d: %s: %s (want \"%s\" and \"%s\")", i, megamoe_status_string(got), megamoe_last_error(), want,
                on_rank);
      mismatched++;
    }
  }
  printf("    %d rank sets: %d alike, %d with a differing field, %d with a peer that rejected its arguments\n",
         iterations, equal, mismatched, rejected);
  CHECK(equal > iterations / 10 && mismatched > iterations / 10 && rejected > iterations / 100);
  return MM_TEST_PASS;
}

/* The comparison names what differs between two otherwise equal configs,
 * field by field, and a NULL config on a peer as its rejection. */
static mm_test_result t_config_prints_name_each_field(void) {
  mm_rng g = unit_rng(0xc0f2);
  const megamoe_config base = megamoe_config_make(1024, 512, 16, 4, 256);
  for (int f = MM_PRINT_HIDDEN; f < MM_PRINT_FIELDS; ++f) {
    megamoe_config other = base;
    perturb_field(&g, &other, f);
    mm_config_print p[2];
    mm_config_print_make(&base, MEGAMOE_OK, &p[0]);
    mm_config_print_make(&other, MEGAMOE_OK, &p[1]);
    const int named = f == MM_PRINT_CLAMP ? MM_PRINT_HAS_CLAMP : f; /* the clamp switched on first */
    char want[64];
    snprintf(want, sizeof want, ": %s = ", mm_config_print_name(named));
    for (int me = 0; me < 2; ++me) {
      CHECK_STATUS(mm_config_prints_compare(p, 2, me), MEGAMOE_ERR_BAD_ARGUMENT);
      CHECK_MESSAGE_HAS(want);
    }
  }
  mm_config_print p[3];
  for (int r = 0; r < 3; ++r) mm_config_print_make(&base, MEGAMOE_OK, &p[r]);
  CHECK_OK(mm_config_prints_compare(p, 3, 1));
  mm_config_print_make(NULL, MEGAMOE_ERR_NULL_POINTER, &p[2]);
  CHECK_STATUS(mm_config_prints_compare(p, 3, 0), MEGAMOE_ERR_PEER_FAILED);
  CHECK_MESSAGE_HAS("rank 2");
  CHECK_MESSAGE_HAS("MEGAMOE_ERR_NULL_POINTER");
  return MM_TEST_PASS;
}

const mm_test unit_suite_fuzz[] = {
    {"fuzz.model_is_strict", t_fuzz_model_is_strict},
    {"fuzz.configs_checks_and_layout", t_fuzz_configs},
    {"fuzz.forward_arguments", t_fuzz_forward_args},
    {"fuzz.config_compared_across_ranks", t_fuzz_config_prints},
    {"fuzz.config_mismatch_names_each_field", t_config_prints_name_each_field},
    {NULL, NULL},
};
