/* Layer tests on 1..8 GPUs: every rank runs the same test, builds the same
 * global problem from the seed, runs the layer and compares its own tokens'
 * output with the CPU reference (computed for its own tokens only).
 *
 * Every output is judged token by token with ref_check_output (ref/ref_check.h:
 * per-token relative L2 error and max abs error over the row's rms, the
 * whole-rank diff, NaN/Inf, exact zeros for fully masked tokens), and every
 * checked forward prints one line of its statistics to stdout, so the bounds
 * can be calibrated from a GPU run. That the checker rejects a zeroed row, a
 * neighbour's row, dropped slots, a scaled routing weight, zeroed columns and
 * the wrong quantization group (each of which the old diff < 0.01 passed) is
 * proven on planted bugs in tests/unit/test_ref_check.c. Here,
 * MEGAMOE_TEST_PLANT_BUG=1 zeroes one row of every downloaded output before
 * it is checked (lc_compare, layer_case.c): every layer test that checks an
 * output with tokens must then FAIL, which proves the wiring from the device
 * output to the verdict on the GPU machine. (The planted zero row is also
 * what the CPU-side sanity run of the routing, reference and checker, made
 * without a GPU while writing it, saw fail on every rank.)
 *
 * Masked slots carry NaN routing weights (nothing may read them).
 *
 * Collective calls (create, forward, destroy) are made by every rank whatever
 * happened locally, so a local failure never leaves a peer waiting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "host/timeline.h"
#include "layer_case.h"
#include "rank_ctx.h"
#include "ref.h"
#include "stderr_capture.h"

int mm_early_combine_built(void); /* src/host/plan.h */

/* Runs a case `calls` times on one layer; every call is checked, and with
 * calls > 1 every output must be bitwise the first. */
static mm_test_result lt_run(const mm_rank_ctx* ctx, const lc_case* c, int calls) {
  lc_data d;
  lc_device g;
  int local_bad = lc_build(c, ctx->num_ranks, ctx->rank, &d) != 0;
  memset(&g, 0, sizeof g);
  if (!local_bad) local_bad = lc_upload(c, &d, ctx->rank, &g) != 0;

  megamoe_layer* layer = NULL;
  megamoe_status st = mm_test_create(ctx, &c->cfg, &layer); /* collective: agrees on failure */
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: megamoe_create: %s\n", ctx->rank, megamoe_last_error());
    lc_device_free(&g);
    lc_free(&d);
    return MM_TEST_FAIL;
  }
  const int64_t H = c->cfg.hidden, T = c->tokens[ctx->rank];
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  if (!local_bad && megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
    local_bad = 1;
  }
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  uint16_t* first = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  if (!y || !first) local_bad = 1;
  for (int call = 0; call < calls; ++call) {
    megamoe_forward_args a = lc_args(c, &g, ctx->rank);
    if (local_bad) a.num_tokens = 0; /* still take part, so peers do not wait */
    st = lc_forward(layer, ctx, &a, H);
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d call %d: %s: %s\n", ctx->rank, call, megamoe_status_string(st), megamoe_last_error());
      local_bad = 1;
      continue;
    }
    if (local_bad) continue;
    if (lc_download(g.y, T * H, y) != 0 || lc_compare(c, &d, ctx->rank, y, "forward") != 0) {
      local_bad = 1;
      continue;
    }
    if (call == 0) memcpy(first, y, sizeof(uint16_t) * (size_t)(T * H));
    else if (memcmp(first, y, sizeof(uint16_t) * (size_t)(T * H)) != 0) {
      fprintf(stderr, "    rank %d: call %d differs bitwise from call 0\n", ctx->rank, call);
      local_bad = 1;
    }
  }
  if (megamoe_destroy(layer) != MEGAMOE_OK) local_bad = 1;
  free(y);
  free(first);
  lc_device_free(&g);
  lc_free(&d);
  return local_bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* A case with every rank holding T tokens (lc_make), timeout 30 s. */
static lc_case lt_make(const mm_rank_ctx* ctx, int64_t H, int64_t I, int E, int K, int64_t T, uint64_t salt) {
  lc_case c = lc_make(ctx, H, I, E, K, T, salt);
  c.cfg.timeout_s = 30.0;
  return c;
}

/* Experts: E_l local experts per rank, so the test scales with the rank count. */
#define EXPERTS(ctx, per_rank) ((per_rank) * (ctx)->num_ranks)

/* Runs n cases as n forwards on one layer: the cases share the config and
 * the weights (equal cfg and weight_seed; tokens, routing and T differ).
 * Every forward is checked. With second_bound > 0 each case runs twice: with
 * num_tokens_bound = its largest T (the call's own bound: the tiles of its
 * size), then with second_bound (the tiles of that size), and the two
 * outputs must be bitwise equal (every tile gives the same bits: DESIGN.md
 * section 1). */
#define LT_MAX_SERIES 8
static mm_test_result lt_run_series_bounds(const mm_rank_ctx* ctx, const lc_case* cases, int n, const char* what,
                                           int64_t second_bound) {
  if (n < 1 || n > LT_MAX_SERIES) return MM_TEST_FAIL; /* the same on every rank: nobody waits */
  lc_data data[LT_MAX_SERIES];
  lc_device dev[LT_MAX_SERIES];
  memset(data, 0, sizeof data);
  memset(dev, 0, sizeof dev);
  int bad = 0;
  for (int i = 0; i < n && !bad; ++i) {
    bad |= lc_build(&cases[i], ctx->num_ranks, ctx->rank, &data[i]) != 0;
    if (!bad) bad |= lc_upload(&cases[i], &data[i], ctx->rank, &dev[i]) != 0;
  }
  megamoe_layer* layer = NULL;
  if (mm_test_create(ctx, &cases[0].cfg, &layer) != MEGAMOE_OK) { /* collective: agrees on failure */
    fprintf(stderr, "    rank %d: create: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  } else {
    megamoe_weights w = {dev[0].w1, dev[0].w1_sf, dev[0].w2, dev[0].w2_sf};
    if (!bad && megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
      bad = 1;
    }
    for (int i = 0; i < n; ++i) {
      int64_t own_bound = 0; /* the case's largest T, the same on every rank */
      for (int r = 0; r < ctx->num_ranks; ++r)
        if (cases[i].tokens[r] > own_bound) own_bound = cases[i].tokens[r];
      const int64_t elems = cases[i].tokens[ctx->rank] * cases[0].cfg.hidden;
      uint16_t* y = malloc(sizeof(uint16_t) * (size_t)elems + 1);
      uint16_t* y_own = malloc(sizeof(uint16_t) * (size_t)elems + 1);
      if (!y || !y_own) bad = 1;
      for (int pass = 0; pass < (second_bound > 0 ? 2 : 1); ++pass) {
        megamoe_forward_args a = lc_args(&cases[i], &dev[i], ctx->rank);
        if (second_bound > 0) a.num_tokens_bound = pass == 0 ? own_bound : second_bound;
        if (bad) a.num_tokens = 0; /* still take part, so peers do not wait */
        megamoe_status st = lc_forward(layer, ctx, &a, cases[0].cfg.hidden);
        if (st != MEGAMOE_OK) {
          fprintf(stderr, "    rank %d %s call %d (T %lld, bound %lld): %s: %s\n", ctx->rank, what, i,
                  (long long)cases[i].tokens[ctx->rank], (long long)a.num_tokens_bound, megamoe_status_string(st),
                  megamoe_last_error());
          bad = 1;
          continue;
        }
        if (bad) continue;
        if (lc_download(dev[i].y, elems, y) != 0 || lc_compare(&cases[i], &data[i], ctx->rank, y, what) != 0) {
          bad = 1;
        } else if (pass == 0) {
          memcpy(y_own, y, sizeof(uint16_t) * (size_t)elems);
        } else if (memcmp(y_own, y, sizeof(uint16_t) * (size_t)elems) != 0) {
          int64_t first;
          const int64_t differ = lc_count_differences(y_own, y, elems, &first);
          fprintf(stderr,
                  "    rank %d %s call %d (T %lld): bound %lld differs bitwise from bound %lld in %lld of %lld "
                  "elements; first: token %lld column %lld\n",
                  ctx->rank, what, i, (long long)cases[i].tokens[ctx->rank], (long long)second_bound,
                  (long long)own_bound, (long long)differ, (long long)elems,
                  (long long)(first / cases[0].cfg.hidden), (long long)(first % cases[0].cfg.hidden));
          bad = 1;
        }
      }
      free(y);
      free(y_own);
    }
    if (megamoe_destroy(layer) != MEGAMOE_OK) bad = 1;
  }
  for (int i = 0; i < n; ++i) {
    lc_device_free(&dev[i]);
    lc_free(&data[i]);
  }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

static mm_test_result lt_run_series(const mm_rank_ctx* ctx, const lc_case* cases, int n, const char* what) {
  return lt_run_series_bounds(ctx, cases, n, what, 0);
}

/* Reports how two arms' outputs differ: 0 when bitwise equal. */
static int lt_bitwise_equal(const uint16_t* want, const uint16_t* got, int64_t n, int64_t H, const char* arm,
                            int rank) {
  int64_t first;
  const int64_t differ = lc_count_differences(want, got, n, &first);
  if (differ == 0) return 1;
  fprintf(stderr,
          "    rank %d: arm %s differs bitwise from staged in %lld of %lld elements; first: token %lld column "
          "%lld, 0x%04X (%g) vs staged 0x%04X (%g)\n",
          rank, arm, (long long)differ, (long long)n, (long long)(first / H), (long long)(first % H), got[first],
          ref_bf16_decode(got[first]), want[first], ref_bf16_decode(want[first]));
  return 0;
}

/* Runs one case on every arm (megamoe_config.arm; the case's own arm is
 * ignored). Each arm's output is checked against the reference, and every
 * arm's output must be BITWISE the staged arm's: the arms share the
 * numerics contract and the quantization group, so the design promises equal
 * bits (DESIGN.md section 1). An arm whose create returns
 * MEGAMOE_ERR_NOT_IMPLEMENTED is skipped and said so (the same on every rank:
 * create checks the arm before any collective step). Every rank makes every
 * create, forward and destroy, whatever happened locally. */
static mm_test_result lt_run_arms_only(const mm_rank_ctx* ctx, const lc_case* base, int only_arm);
static mm_test_result lt_run_arms(const mm_rank_ctx* ctx, const lc_case* base) { return lt_run_arms_only(ctx, base, -1); }

/* only_arm >= 0: the staged arm (the oracle) and that arm only. */
static mm_test_result lt_run_arms_only(const mm_rank_ctx* ctx, const lc_case* base, int only_arm) {
  lc_data d;
  lc_device g;
  memset(&g, 0, sizeof g);
  int bad = lc_build(base, ctx->num_ranks, ctx->rank, &d) != 0;
  if (!bad) bad = lc_upload(base, &d, ctx->rank, &g) != 0;
  const int64_t H = base->cfg.hidden, T = base->tokens[ctx->rank];
  uint16_t* staged = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  if (!staged || !y) bad = 1;
  int have_staged = 0, arms_run = 0;
  for (int arm = 0; arm < MEGAMOE_ARM_COUNT; ++arm) {
    if (only_arm >= 0 && arm != MEGAMOE_ARM_STAGED && arm != only_arm) continue;
    lc_case c = *base;
    c.cfg.arm = (megamoe_arm)arm;
    const char* name = megamoe_arm_name(c.cfg.arm);
    megamoe_layer* layer = NULL;
    megamoe_status st = mm_test_create(ctx, &c.cfg, &layer);
    if (st == MEGAMOE_ERR_NOT_IMPLEMENTED) {
      if (ctx->rank == 0) printf("    arm %s: not implemented yet, skipped\n", name);
      continue;
    }
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: arm %s: create: %s\n", ctx->rank, name, megamoe_last_error());
      bad = 1;
      continue;
    }
    arms_run++;
    megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
    if (!bad && megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: arm %s: prepare: %s\n", ctx->rank, name, megamoe_last_error());
      bad = 1;
    }
    megamoe_forward_args a = lc_args(&c, &g, ctx->rank);
    if (bad) a.num_tokens = 0; /* still take part, so peers do not wait */
    st = lc_forward(layer, ctx, &a, H);
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: arm %s: forward: %s: %s\n", ctx->rank, name, megamoe_status_string(st),
              megamoe_last_error());
      bad = 1;
    } else if (!bad) {
      if (lc_download(g.y, T * H, y) != 0 || lc_compare(&c, &d, ctx->rank, y, "arms") != 0) {
        bad = 1;
      } else if (c.cfg.arm == MEGAMOE_ARM_STAGED) {
        memcpy(staged, y, sizeof(uint16_t) * (size_t)(T * H));
        have_staged = 1;
      } else if (!have_staged) {
        fprintf(stderr, "    rank %d: arm %s: no staged output to compare with\n", ctx->rank, name);
        bad = 1;
      } else if (!lt_bitwise_equal(staged, y, T * H, H, name, ctx->rank)) {
        bad = 1;
      } else if (ctx->rank == 0) {
        printf("    arm %s: bitwise equal to staged\n", name);
      }
    }
    if (megamoe_destroy(layer) != MEGAMOE_OK) bad = 1;
  }
  if (arms_run == 0) bad = 1; /* the staged arm at least must run */
  free(staged);
  free(y);
  lc_device_free(&g);
  lc_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* ---- Tests ------------------------------------------------------------- */
static mm_test_result t_smoke(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 512, 8, 2, 64, 1);
  c.cfg.num_experts = 8 % ctx->num_ranks == 0 ? 8 : EXPERTS(ctx, 4);
  return lt_run(ctx, &c, 1);
}

/* Tests that run several cases run every case on every rank even after one
 * failed (a verdict is per rank, and a rank that left early would leave its
 * peers waiting in the next collective create). */
static mm_test_result t_shapes(const mm_rank_ctx* ctx) {
  const int64_t dims[2] = {512, 2048};
  const int ks[3] = {1, 2, 4};
  int bad = 0;
  for (int hi = 0; hi < 2; ++hi)
    for (int ii = 0; ii < 2; ++ii)
      for (int ki = 0; ki < 3; ++ki) {
        lc_case c = lt_make(ctx, dims[hi], dims[ii], EXPERTS(ctx, 4), ks[ki], 128, 100 + hi * 10 + ii * 3 + ki);
        if (lt_run(ctx, &c, 1) != MM_TEST_PASS) {
          fprintf(stderr, "    shape H %lld I %lld K %d failed\n", (long long)dims[hi], (long long)dims[ii], ks[ki]);
          bad = 1;
        }
      }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

static mm_test_result t_zero_tokens_one_rank(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 256, EXPERTS(ctx, 4), 2, 48, 2);
  c.tokens[ctx->num_ranks - 1] = 0;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_zero_tokens_all(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 256, EXPERTS(ctx, 4), 2, 48, 3);
  for (int r = 0; r < ctx->num_ranks; ++r) c.tokens[r] = 0;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_all_masked(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 4), 3, 40, 4);
  c.mask_ratio = 1.0;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_masked_30(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 4, 96, 5);
  c.mask_ratio = 0.3;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_masked_70(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 4, 96, 6);
  c.mask_ratio = 0.7;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_one_expert(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 384, EXPERTS(ctx, 4), 2, 200, 7);
  c.one_expert = c.cfg.num_experts - 1; /* on the last rank */
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_full_capacity(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 2), 2, 300, 8);
  c.cfg.max_tokens_per_rank = 300; /* T = T_max on every rank */
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_clamp(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 2, 64, 9);
  c.cfg.has_swiglu_clamp = 1;
  c.cfg.swiglu_clamp = 1.0f;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_group64(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 640, EXPERTS(ctx, 4), 2, 64, 10);
  c.cfg.quant_group = 64;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_group128_int64(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 384, 640, EXPERTS(ctx, 3), 3, 64, 11);
  c.cfg.quant_group = 128;
  c.idx64 = 1;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_random(const mm_rank_ctx* ctx) {
  mm_rng g = {ctx->seed ^ 0x5eedull};
  printf("    random configurations from seed %llu\n", (unsigned long long)(ctx->seed ^ 0x5eedull));
  int bad = 0;
  for (int i = 0; i < 20; ++i) {
    const int64_t H = 128 * (int64_t)(1 + mm_rng_below(&g, 8));
    const int64_t I = 128 * (int64_t)(1 + mm_rng_below(&g, 8));
    const int E = EXPERTS(ctx, (int)(1 + mm_rng_below(&g, 6)));
    const int K = (int)(1 + mm_rng_below(&g, (uint64_t)(E < 6 ? E : 6)));
    const int64_t Tmax = (int64_t)(1 + mm_rng_below(&g, 160));
    lc_case c = lt_make(ctx, H, I, E, K, Tmax, 1000 + i);
    for (int r = 0; r < ctx->num_ranks; ++r) c.tokens[r] = (int64_t)mm_rng_below(&g, (uint64_t)Tmax + 1);
    c.cfg.quant_group = mm_rng_below(&g, 2) ? 64 : 128;
    if (mm_rng_below(&g, 3) == 0) {
      c.cfg.has_swiglu_clamp = 1;
      c.cfg.swiglu_clamp = (float)(0.25 + 4 * mm_rng_uniform(&g));
    }
    c.mask_ratio = mm_rng_below(&g, 2) ? 0.0 : mm_rng_uniform(&g) * 0.5;
    c.idx64 = (int)mm_rng_below(&g, 2);
    if (lt_run(ctx, &c, 1) != MM_TEST_PASS) {
      fprintf(stderr, "    random case %d: H %lld I %lld E %d K %d Tmax %lld G %d clamp %d\n", i, (long long)H,
              (long long)I, E, K, (long long)Tmax, c.cfg.quant_group, c.cfg.has_swiglu_clamp);
      bad = 1;
    }
  }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

static mm_test_result t_run_to_run(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 1024, 512, EXPERTS(ctx, 4), 4, 160, 12);
  return lt_run(ctx, &c, 3);
}

/* Four forwards with different T and routing on one layer object. */
static mm_test_result t_reuse(const mm_rank_ctx* ctx) {
  lc_case base = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 2, 256, 13);
  base.weight_seed = base.seed; /* one set of weights for the four calls */
  lc_case cases[4];
  for (int i = 0; i < 4; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 17u * (uint64_t)(i + 1);
    for (int r = 0; r < ctx->num_ranks; ++r) cases[i].tokens[r] = (int64_t)((37 * (i + 1) + 11 * r) % 257);
    cases[i].mask_ratio = 0.1 * i;
  }
  return lt_run_series(ctx, cases, 4, "reuse");
}

/* The pool filled to capacity: T = T_max on every rank and every slot of
 * every rank routed to the experts of one rank (the last), K = E_l so each
 * token uses every one of them (distinct experts per token): that rank's
 * experts receive R * T_max rows each, the worst case the pool is sized for.
 * T_max is not a multiple of any tile. */
static mm_test_result t_pool_capacity(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 4), 4, 300, 17);
  c.one_rank = ctx->num_ranks - 1;
  return lt_run(ctx, &c, 1);
}

/* An expert repeated inside one token's top-k (two or all slots of a token
 * on one expert; fill_routing's patterns), with some slots masked: the
 * contract computes each slot on its own and sums them in slot order. */
static mm_test_result t_repeated_expert(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 256, 384, EXPERTS(ctx, 3), 3, 96, 18);
  c.repeat_expert = 1;
  c.mask_ratio = 0.15;
  int bad = lt_run(ctx, &c, 1) != MM_TEST_PASS;
  lc_case k2 = lt_make(ctx, 384, 256, EXPERTS(ctx, 2), 2, 64, 19); /* K = 2: slot 1 = slot 0 on every token */
  k2.repeat_expert = 1;
  k2.idx64 = 1;
  bad |= lt_run(ctx, &k2, 1) != MM_TEST_PASS;
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Token counts that are a multiple of nothing (1, 127, 4097) next to a rank
 * with T = 0, on one layer (T_max 4097): forward p gives rank r the count
 * counts[(p + r) % 4], so at EP1 each count is its own forward, at EP2 the
 * pairs are (1, 127), (127, 4097), (4097, 0), (0, 1), and at EP4/EP8 the same
 * cycle runs over all ranks (every rank sees every count, always next to a
 * rank with another). */
static mm_test_result t_odd_token_counts(const mm_rank_ctx* ctx) {
  static const int64_t counts[4] = {1, 127, 4097, 0};
  lc_case base = lt_make(ctx, 256, 256, EXPERTS(ctx, 4), 2, 4097, 20);
  base.weight_seed = base.seed;
  base.mask_ratio = 0.1;
  lc_case cases[4];
  for (int p = 0; p < 4; ++p) {
    cases[p] = base;
    cases[p].seed = base.seed + 29u * (uint64_t)(p + 1);
    for (int r = 0; r < ctx->num_ranks; ++r) cases[p].tokens[r] = counts[(p + r) % 4];
  }
  return lt_run_series(ctx, cases, 4, "odd T");
}

/* The persistent arms' routing with its count pass and more experts than
 * the grid has CTAs: 4096 tokens at top-4 are 16384 slots per rank, above
 * what one batch per warp reads (the one-scan path: 12288 slots with 12
 * warps), and 160 local experts put two on some CTAs, so phase B's
 * publications of a CTA's second expert read back the second set of phase
 * A's kept counts (route_phases.cuh). */
static mm_test_result t_many_experts_count_pass(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 160), 4, 4096, 47);
  c.mask_ratio = 0.05;
  return lt_run(ctx, &c, 1);
}

/* Decode sizes (issue 12's shapes: T = 1, 8, 64, 127, 256 per rank; one rank
 * with T = 0; every token on one expert) on a layer sized for T_max 1024:
 * each forward once with its own bound (rows per expert <= 64: the decode
 * tiles; 256 tokens: the mid regime) and once with bound T_max (the large
 * tiles), checked against the reference both times and bitwise equal to
 * each other. E 8 per rank, K 4: T_max gives 512 rows per expert. */
static mm_test_result t_decode_tiles(const mm_rank_ctx* ctx) {
  enum { kCases = 7 };
  static const int64_t counts[5] = {1, 8, 64, 127, 256};
  const int64_t t_max = 1024;
  lc_case base = lt_make(ctx, 512, 256, EXPERTS(ctx, 8), 4, t_max, 40);
  base.weight_seed = base.seed;
  base.mask_ratio = 0.05;
  lc_case cases[kCases];
  for (int i = 0; i < kCases; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 31u * (uint64_t)(i + 1);
    const int64_t T = i < 5 ? counts[i] : i == 5 ? 64 : 127;
    for (int r = 0; r < ctx->num_ranks; ++r) cases[i].tokens[r] = T;
  }
  if (ctx->num_ranks > 1) cases[5].tokens[ctx->num_ranks - 1] = 0; /* one rank with T = 0 */
  cases[6].one_expert = 3;                                          /* every token on expert 3 */
  cases[6].mask_ratio = 0.0;
  return lt_run_series_bounds(ctx, cases, kCases, "decode tiles", t_max);
}

/* The tokens written where megamoe_input_staging says (no staging copy).
 * On one layer: a forward from the caller's buffers (checked against the
 * reference) is the baseline; then, with the caller's x and x_sf poisoned
 * (0xFF: the e4m3 NaN code, a NaN scale: a read of them would make rows
 * NaN), x and x_sf both in the staging region, then x there with x_sf from
 * the caller (the staging x_sf poisoned first: it must be copied), then x
 * from the caller with x_sf there (the staging x and the caller's x_sf
 * poisoned first). Each
 * forward is checked against the reference and must be bitwise the
 * baseline. Then four forwards whose x or x_sf meets the region without
 * being its own part's start are rejected on every rank, naming the
 * argument, and the layer still gives the baseline's bits after them. */
static mm_test_result t_input_staging(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 512, 256, EXPERTS(ctx, 4), 4, 96, 71);
  c.mask_ratio = 0.1;
  c.cfg.max_tokens_per_rank = 160; /* the region is larger than the tokens */
  if (ctx->num_ranks > 1) c.tokens[ctx->num_ranks - 1] = 33; /* unequal counts, none 0 (step 4) */
  lc_data d;
  lc_device g;
  memset(&g, 0, sizeof g);
  int bad = lc_build(&c, ctx->num_ranks, ctx->rank, &d) != 0;
  if (!bad) bad = lc_upload(&c, &d, ctx->rank, &g) != 0;
  const int64_t H = c.cfg.hidden, T = c.tokens[ctx->rank];
  const size_t x_bytes = (size_t)(T * H), sf_bytes = sizeof(float) * (size_t)(T * (H / 128));
  uint16_t* base = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  if (!base || !y) bad = 1;
  megamoe_layer* layer = NULL;
  if (mm_test_create(ctx, &c.cfg, &layer) != MEGAMOE_OK) { /* collective: agrees on failure */
    fprintf(stderr, "    rank %d: megamoe_create: %s\n", ctx->rank, megamoe_last_error());
    free(base);
    free(y);
    lc_device_free(&g);
    lc_free(&d);
    return MM_TEST_FAIL;
  }
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  if (!bad && megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  }
  void* stage_x = NULL;
  float* stage_sf = NULL;
  LC_EXPECT(megamoe_input_staging(layer, &stage_x, &stage_sf) == MEGAMOE_OK, "%s", megamoe_last_error());
  if (!stage_x || !stage_sf) bad = 1;
  /* Steps: 0 baseline, 1 both staged, 2 x staged, 3 x_sf staged, 4 rejected, 5 after the rejection. */
  static const char* const what[6] = {"caller's buffers", "x and x_sf staged", "x staged", "x_sf staged",
                                      "x overlapping the region", "after the rejection"};
  for (int step = 0; step < 6; ++step) {
    megamoe_forward_args a = lc_args(&c, &g, ctx->rank);
    if (!bad && T > 0) {
      /* Set the buffers up for this step (the previous forward has synced). */
      int e = 0;
      if (step == 1) {
        /* The baseline's copy left these bytes there: poisoned first, so
         * the bytes read are the ones written here. */
        e |= cudaMemset(stage_x, 0xFF, x_bytes) != cudaSuccess;
        e |= cudaMemset(stage_sf, 0xFF, sf_bytes) != cudaSuccess;
        e |= cudaMemcpy(stage_x, g.x, x_bytes, cudaMemcpyDeviceToDevice) != cudaSuccess;
        e |= cudaMemcpy(stage_sf, g.x_sf, sf_bytes, cudaMemcpyDeviceToDevice) != cudaSuccess;
        e |= cudaMemset(g.x, 0xFF, x_bytes) != cudaSuccess;
        e |= cudaMemset(g.x_sf, 0xFF, sf_bytes) != cudaSuccess;
      } else if (step == 2) {
        e |= cudaMemcpy(g.x_sf, d.x_sf[ctx->rank], sf_bytes, cudaMemcpyHostToDevice) != cudaSuccess;
        e |= cudaMemset(stage_sf, 0xFF, sf_bytes) != cudaSuccess;
      } else if (step == 3) {
        e |= cudaMemcpy(g.x, d.x[ctx->rank], x_bytes, cudaMemcpyHostToDevice) != cudaSuccess;
        e |= cudaMemcpy(stage_sf, d.x_sf[ctx->rank], sf_bytes, cudaMemcpyHostToDevice) != cudaSuccess;
        e |= cudaMemset(g.x_sf, 0xFF, sf_bytes) != cudaSuccess;
        e |= cudaMemset(stage_x, 0xFF, x_bytes) != cudaSuccess;
      } else if (step == 5) {
        e |= cudaMemcpy(g.x, d.x[ctx->rank], x_bytes, cudaMemcpyHostToDevice) != cudaSuccess;
        e |= cudaMemcpy(g.x_sf, d.x_sf[ctx->rank], sf_bytes, cudaMemcpyHostToDevice) != cudaSuccess;
      }
      LC_EXPECT(e == 0, "step %d: setting the buffers up failed", step);
    }
    if (step == 1 || step == 2) a.x = stage_x;
    if (step == 1 || step == 3) a.x_sf = stage_sf;
    if (bad) a.num_tokens = 0; /* still take part, so peers do not wait */
    if (step == 4) {
      /* Every rank rejects the same forwards (every rank has tokens): x 16
       * bytes into the region, x starting 16 bytes before it, x_sf 4 bytes
       * into its part, x_sf at the start of x's part. Each rejection
       * enqueues an empty forward that keeps the peers in step; the sync
       * reports an error. */
      for (int v = 0; v < 4; ++v) {
        megamoe_forward_args r = a;
        if (v == 0) r.x = (uint8_t*)stage_x + 16;
        if (v == 1) r.x = (uint8_t*)stage_x - 16;
        if (v == 2) r.x_sf = stage_sf + 1;
        if (v == 3) r.x_sf = (float*)stage_x;
        const char* name = v < 2 ? "args->x overlaps" : "args->x_sf overlaps";
        const megamoe_status st = megamoe_forward(layer, &r, ctx->stream);
        if (r.num_tokens > 0) {
          LC_EXPECT(st == MEGAMOE_ERR_BAD_ARGUMENT, "step 4.%d: %s", v, megamoe_status_string(st));
          LC_EXPECT(strstr(megamoe_last_error(), name) != NULL, "step 4.%d: message \"%s\"", v, megamoe_last_error());
        }
        LC_EXPECT(megamoe_sync(layer, ctx->stream) != MEGAMOE_OK, "step 4.%d: the sync after a rejection reported OK",
                  v);
      }
      continue;
    }
    const megamoe_status st = lc_forward(layer, ctx, &a, H);
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: %s: %s: %s\n", ctx->rank, what[step], megamoe_status_string(st),
              megamoe_last_error());
      bad = 1;
      continue;
    }
    if (bad || T == 0) continue;
    if (lc_download(g.y, T * H, y) != 0 || lc_compare(&c, &d, ctx->rank, y, what[step]) != 0) {
      bad = 1;
    } else if (step == 0) {
      memcpy(base, y, sizeof(uint16_t) * (size_t)(T * H));
    } else if (!lt_bitwise_equal(base, y, T * H, H, what[step], ctx->rank)) {
      bad = 1;
    }
  }
  if (megamoe_destroy(layer) != MEGAMOE_OK) bad = 1;
  free(base);
  free(y);
  lc_device_free(&g);
  lc_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Every arm on a few shapes must give the staged arm's bits (lt_run_arms).
 * Only the staged arm exists today; the split and fused arms are judged here
 * when they land. */
static mm_test_result t_arms_bitwise(const mm_rank_ctx* ctx) {
  /* Bitwise equality holds on one GEMM engine: under MEGAMOE_GEMM=simple the
   * staged arm runs the CUDA-core oracle (another accumulation order) while
   * the split arm is built on the wgmma engine. */
  const char* engine = getenv("MEGAMOE_GEMM");
  if (engine && strcmp(engine, "simple") == 0) {
    if (ctx->rank == 0) printf("    the staged arm is on the simple engine here: arms compared on wgmma only\n");
    return MM_TEST_SKIP;
  }
  lc_case cases[3];
  cases[0] = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 2, 64, 21);
  cases[1] = lt_make(ctx, 384, 640, EXPERTS(ctx, 3), 3, 100, 22);
  cases[1].cfg.quant_group = 64;
  cases[1].cfg.has_swiglu_clamp = 1;
  cases[1].cfg.swiglu_clamp = 1.5f;
  cases[1].mask_ratio = 0.2;
  cases[1].idx64 = 1;
  cases[2] = lt_make(ctx, 256, 256, EXPERTS(ctx, 4), 4, 127, 23);
  cases[2].repeat_expert = 1;
  cases[2].tokens[ctx->num_ranks - 1] = ctx->num_ranks > 1 ? 0 : 127;
  int bad = 0;
  for (int i = 0; i < 3; ++i)
    if (lt_run_arms(ctx, &cases[i]) != MM_TEST_PASS) {
      fprintf(stderr, "    arms case %d failed\n", i);
      bad = 1;
    }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* The persistent arms' two combine orders (route_phases.cuh): the early
 * combine (each (token, 512-column) unit reduced as soon as its rows'
 * arrival counter is full, into the combine buffer, copied to y after
 * barrier 1) and the late one (reduced into y after barrier 1). Forced with
 * MEGAMOE_EARLY_COMBINE = 0 / 2 (read at create), each order must give the
 * staged arm's bits on shapes with a partial unit (H 640: units of 512 and
 * 128 columns; H 384: one of 384), masked slots, a repeated expert, a rank
 * with T = 0, group 64 and int64 top-k; and the early order must stay right
 * over a series of different calls on one layer (the counters are zeroed
 * per call: stale ones would let a unit read the last call's rows), as must
 * the auto rule over calls on both sides of its threshold. The deadline is
 * 10 s, so a missing arrival count fails in seconds (the counter waits give
 * up at twice it). The error tests (test_errors.c) run in the early order
 * too in a build with it: their T is below the auto threshold. */
static mm_test_result t_combine_orders(const mm_rank_ctx* ctx) {
  const megamoe_arm arm = mm_test_arm();
  if (arm == MEGAMOE_ARM_STAGED) {
    if (ctx->rank == 0) printf("    the staged arm has one combine order: skipped\n");
    return MM_TEST_SKIP;
  }
  const char* engine = getenv("MEGAMOE_GEMM");
  if (engine && strcmp(engine, "simple") == 0) return MM_TEST_SKIP; /* t_arms_bitwise says why */
  if (!mm_early_combine_built()) {
    if (ctx->rank == 0) printf("    the kernels were built without the early combine (-DMM_EARLY_COMBINE=1): skipped\n");
    return MM_TEST_SKIP;
  }
  lc_case cases[3];
  cases[0] = lt_make(ctx, 640, 256, EXPERTS(ctx, 4), 4, 200, 61);
  cases[0].mask_ratio = 0.2;
  cases[1] = lt_make(ctx, 384, 512, EXPERTS(ctx, 8), 6, 96, 62);
  cases[1].repeat_expert = 1;
  cases[1].tokens[ctx->num_ranks - 1] = ctx->num_ranks > 1 ? 0 : 33;
  cases[2] = lt_make(ctx, 1024, 256, EXPERTS(ctx, 4), 3, 333, 63);
  cases[2].cfg.quant_group = 64;
  cases[2].idx64 = 1;
  cases[2].mask_ratio = 0.05;
  int bad = 0;
  static const char* const modes[2] = {"0", "2"};
  for (int m = 0; m < 2; ++m) {
    setenv("MEGAMOE_EARLY_COMBINE", modes[m], 1);
    for (int i = 0; i < 3; ++i) {
      lc_case c = cases[i];
      c.cfg.timeout_s = 10.0;
      if (lt_run_arms_only(ctx, &c, (int)arm) != MM_TEST_PASS) {
        fprintf(stderr, "    case %d with MEGAMOE_EARLY_COMBINE=%s failed\n", i, modes[m]);
        bad = 1;
      }
    }
  }
  /* Three different calls on one layer, the early order forced. */
  lc_case series[3];
  const lc_case series_base = lt_make(ctx, 640, 256, EXPERTS(ctx, 4), 4, 150, 64);
  for (int i = 0; i < 3; ++i) {
    series[i] = series_base;
    series[i].weight_seed = series_base.seed;
    series[i].seed = series_base.seed + 17u * (uint64_t)(i + 1);
    series[i].cfg.timeout_s = 10.0;
    series[i].mask_ratio = 0.1 * i;
  }
  setenv("MEGAMOE_EARLY_COMBINE", "2", 1);
  if (lt_run_series(ctx, series, 3, "early combine series") != MM_TEST_PASS) bad = 1;
  unsetenv("MEGAMOE_EARLY_COMBINE");
  /* The auto rule on one layer: calls on either side of its threshold
   * (T x 2 units against 12 warps x SMs: 40 and 64 tokens early, 1500 and
   * 1800 late on any GPU below 250 SMs), so an early call follows late ones
   * (counters left unzeroed), and with several ranks the ranks take
   * different orders in one forward (each decides alone and publishes it;
   * the copy warps count only the early source's rows). */
  lc_case mixed[4];
  const lc_case mixed_base = lt_make(ctx, 640, 256, EXPERTS(ctx, 4), 4, 1800, 65);
  static const int64_t mixed_tokens[4][2] = {{1800, 40}, {40, 1800}, {1500, 1500}, {64, 64}};
  for (int i = 0; i < 4; ++i) {
    mixed[i] = mixed_base;
    mixed[i].weight_seed = mixed_base.seed;
    mixed[i].seed = mixed_base.seed + 29u * (uint64_t)(i + 1);
    mixed[i].cfg.timeout_s = 10.0;
    mixed[i].mask_ratio = 0.05;
    for (int r = 0; r < ctx->num_ranks; ++r) mixed[i].tokens[r] = mixed_tokens[i][r % 2];
  }
  if (lt_run_series(ctx, mixed, 4, "auto combine order series") != MM_TEST_PASS) bad = 1;
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Small problems for compute-sanitizer (scripts/sanitize.sh filters on
 * "sanitize small"): H 256, I 256, 8 experts, top-2, T 64, two forwards on one
 * layer (the second reuses the barrier banks and sequence numbers; its output
 * must be bitwise the first's). The tools slow the ranks unevenly, so the
 * deadline is 120 s. Cheap enough to run in every gpu-test too. */
static lc_case lt_sanitize_case(const mm_rank_ctx* ctx, uint64_t salt) {
  lc_case c = lt_make(ctx, 256, 256, 8, 2, 64, salt);
  c.cfg.timeout_s = 120.0;
  return c;
}

static mm_test_result t_sanitize_uniform(const mm_rank_ctx* ctx) {
  lc_case c = lt_sanitize_case(ctx, 30);
  return lt_run(ctx, &c, 2);
}

/* Masked slots, a rank with T = 0 (at EP1 the only rank keeps its tokens),
 * int64 top-k, group 64. */
static mm_test_result t_sanitize_masked(const mm_rank_ctx* ctx) {
  lc_case c = lt_sanitize_case(ctx, 31);
  c.mask_ratio = 0.25;
  c.idx64 = 1;
  c.cfg.quant_group = 64;
  if (ctx->num_ranks > 1) c.tokens[ctx->num_ranks - 1] = 0;
  return lt_run(ctx, &c, 2);
}

/* Every token's slot 0 on the last expert (its rank takes every row), the
 * others masked, with the SwiGLU clamp. */
static mm_test_result t_sanitize_one_expert(const mm_rank_ctx* ctx) {
  lc_case c = lt_sanitize_case(ctx, 32);
  c.one_expert = c.cfg.num_experts - 1;
  c.cfg.has_swiglu_clamp = 1;
  c.cfg.swiglu_clamp = 1.0f;
  return lt_run(ctx, &c, 2);
}

/* A forward captured once in a CUDA graph and replayed on three different
 * inputs (copied into the captured buffers): every replay is right. Serving
 * engines replay graphs; the sequence numbers live on the device for this. */
static mm_test_result t_graph_replay(const mm_rank_ctx* ctx) {
  lc_case base = lt_make(ctx, 512, 384, EXPERTS(ctx, 4), 3, 96, 16);
  base.weight_seed = base.seed;
  lc_case cases[3];
  lc_data data[3];
  lc_device dev[3];
  memset(data, 0, sizeof data);
  memset(dev, 0, sizeof dev);
  int bad = 0;
  for (int i = 0; i < 3; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 101u * (uint64_t)(i + 1);
    cases[i].mask_ratio = 0.15 * i;
    if (!bad) bad |= lc_build(&cases[i], ctx->num_ranks, ctx->rank, &data[i]) != 0;
    if (!bad) bad |= lc_upload(&cases[i], &data[i], ctx->rank, &dev[i]) != 0;
  }
  megamoe_layer* layer = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  if (mm_test_create(ctx, &base.cfg, &layer) != MEGAMOE_OK) { /* collective: agrees on failure */
    fprintf(stderr, "    rank %d: create: %s\n", ctx->rank, megamoe_last_error());
    for (int i = 0; i < 3; ++i) {
      lc_device_free(&dev[i]);
      lc_free(&data[i]);
    }
    return MM_TEST_FAIL;
  }
  megamoe_weights w = {dev[0].w1, dev[0].w1_sf, dev[0].w2, dev[0].w2_sf};
  bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
  bad |= cudaStreamSynchronize(ctx->stream) != cudaSuccess;
  /* Capture one forward reading dev[0]'s buffers. */
  megamoe_forward_args a = lc_args(&cases[0], &dev[0], ctx->rank);
  bad |= cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
  megamoe_status st = megamoe_forward(layer, &a, ctx->stream);
  if (st != MEGAMOE_OK) fprintf(stderr, "    rank %d: forward under capture: %s\n", ctx->rank, megamoe_last_error());
  bad |= cudaStreamEndCapture(ctx->stream, &graph) != cudaSuccess || st != MEGAMOE_OK;
  bad |= cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess;
  const int64_t T = base.tokens[ctx->rank], H = base.cfg.hidden, K = base.cfg.top_k;
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  for (int i = 0; i < 3; ++i) {
    /* New inputs into the captured buffers, then poison y and replay. Every
     * rank replays, whatever went wrong locally, so no peer waits. */
    if (i > 0) {
      bad |= cudaMemcpy(dev[0].x, data[i].x[ctx->rank], (size_t)(T * H), cudaMemcpyHostToDevice) != cudaSuccess;
      bad |= cudaMemcpy(dev[0].x_sf, data[i].x_sf[ctx->rank], sizeof(float) * (size_t)(T * (H / 128)),
                        cudaMemcpyHostToDevice) != cudaSuccess;
      bad |= cudaMemcpy(dev[0].idx, data[i].idx[ctx->rank], sizeof(int32_t) * (size_t)(T * K),
                        cudaMemcpyHostToDevice) != cudaSuccess;
      bad |= cudaMemcpy(dev[0].w, data[i].w[ctx->rank], sizeof(float) * (size_t)(T * K), cudaMemcpyHostToDevice) !=
             cudaSuccess;
    }
    bad |= cudaMemset(dev[0].y, 0xFF, sizeof(uint16_t) * (size_t)(T * H)) != cudaSuccess;
    if (exec) bad |= cudaGraphLaunch(exec, ctx->stream) != cudaSuccess;
    st = megamoe_sync(layer, ctx->stream);
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d replay %d: %s\n", ctx->rank, i, megamoe_last_error());
      bad = 1;
      continue;
    }
    if (!bad && (lc_download(dev[0].y, T * H, y) != 0 || lc_compare(&cases[i], &data[i], ctx->rank, y, "graph replay") != 0))
      bad = 1;
  }
  free(y);
  if (exec) bad |= cudaGraphExecDestroy(exec) != cudaSuccess;
  if (graph) bad |= cudaGraphDestroy(graph) != cudaSuccess;
  bad |= megamoe_destroy(layer) != MEGAMOE_OK;
  for (int i = 0; i < 3; ++i) {
    lc_device_free(&dev[i]);
    lc_free(&data[i]);
  }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Edges of a captured graph whose type is programmatic (the kernels of a
 * forward launched with programmatic stream serialization keep that
 * dependency in the graph); -1 when the runtime cannot say. */
static int64_t lt_programmatic_edges(cudaGraph_t graph) {
#if CUDART_VERSION >= 12030
#if CUDART_VERSION >= 13000
#define LT_GRAPH_GET_EDGES cudaGraphGetEdges /* CUDA 13: the edge data is part of the call */
#else
#define LT_GRAPH_GET_EDGES cudaGraphGetEdges_v2
#endif
  size_t n = 0;
  if (LT_GRAPH_GET_EDGES(graph, NULL, NULL, NULL, &n) != cudaSuccess) return -1;
  cudaGraphNode_t* from = calloc(n + 1, sizeof *from);
  cudaGraphNode_t* to = calloc(n + 1, sizeof *to);
  cudaGraphEdgeData* data = calloc(n + 1, sizeof *data);
  int64_t programmatic = -1;
  if (from && to && data) {
    const cudaError_t e = LT_GRAPH_GET_EDGES(graph, from, to, data, &n);
    if (e == cudaSuccess) {
      programmatic = 0;
      for (size_t i = 0; i < n; ++i) programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic;
    }
  }
  free(from);
  free(to);
  free(data);
  return programmatic;
#undef LT_GRAPH_GET_EDGES
#else
  (void)graph;
  return -1;
#endif
}

/* Programmatic dependent launch (megamoe_set_programmatic_launch), on three
 * inputs with their own buffers (one config and weights): with it off, each
 * forward synced and judged against the reference; then with it on, the three
 * enqueued back to back with one sync at the end, so each forward's kernels
 * may be scheduled while the previous forward's still run (its first reads
 * must wait for them: griddepcontrol.wait), and each y must be bitwise its
 * off result; inputs 0 and 2 are written into x by a caller's kernel that
 * lets the forward launch while it spins (lc_late_copy), so a forward that
 * read before its wait would see zeroed x. (Planted on one H200: a build
 * without griddepcontrol.wait still passed. It cannot fail there: a layer
 * CTA takes 3 warps x 168 x 32 registers of each SM sub-partition's 16384,
 * leaving 256, and the smallest warp takes 512, so the layer's grid starts
 * only once the spinning CTA has left. Detecting the missing wait would need
 * the layer on one SM fewer. The wait stays for kernels that leave room.
 * docs/PERF.md, ninth session); then the three captured in one graph with it on (the graph
 * keeps the programmatic edges: at least one must be there on the split and
 * fused arms) and replayed twice, bitwise again. enable 2
 * is rejected naming it. The staged arm ignores the setting: the same
 * checks hold there. */
static mm_test_result t_programmatic_launch(const mm_rank_ctx* ctx) {
  enum { N = 3 };
  lc_case base = lt_make(ctx, 512, 384, EXPERTS(ctx, 4), 3, 96, 23);
  base.weight_seed = base.seed;
  lc_case cases[N];
  lc_data data[N];
  lc_device dev[N];
  uint16_t* off[N] = {NULL, NULL, NULL};
  memset(data, 0, sizeof data);
  memset(dev, 0, sizeof dev);
  int bad = 0;
  const int64_t H = base.cfg.hidden, T = base.tokens[ctx->rank];
  const size_t y_elems = (size_t)(T * H);
  for (int i = 0; i < N; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 211u * (uint64_t)(i + 1);
    cases[i].mask_ratio = 0.2 * i;
    if (!bad) bad |= lc_build(&cases[i], ctx->num_ranks, ctx->rank, &data[i]) != 0;
    if (!bad) bad |= lc_upload(&cases[i], &data[i], ctx->rank, &dev[i]) != 0;
    off[i] = malloc(sizeof(uint16_t) * y_elems + 1);
    bad |= off[i] == NULL;
  }
  uint16_t* y = malloc(sizeof(uint16_t) * y_elems + 1);
  bad |= y == NULL;
  /* Inputs 0 and 2 reach x late, from a caller's kernel (lc_late_copy) that
   * lets the forward launch while it spins: x_real holds their codes, x is
   * zeroed before each pass. Forward 1 follows forward 0 directly. */
  const size_t x_bytes = (size_t)(T * H);
  void* x_real[N] = {NULL, NULL, NULL};
  for (int i = 0; i < N && x_bytes && !bad && dev[i].x; i += 2) {
    if (cudaMalloc(&x_real[i], x_bytes) != cudaSuccess) {
      x_real[i] = NULL;
      bad = 1;
    } else if (cudaMemcpy(x_real[i], dev[i].x, x_bytes, cudaMemcpyDeviceToDevice) != cudaSuccess) {
      cudaFree(x_real[i]); /* never used on a broken x: the late copy would write through it */
      x_real[i] = NULL;
      bad = 1;
    }
  }
  megamoe_layer* layer = NULL;
  if (mm_test_create(ctx, &base.cfg, &layer) != MEGAMOE_OK) { /* collective: agrees on failure */
    fprintf(stderr, "    rank %d: create: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  } else {
    megamoe_weights w = {dev[0].w1, dev[0].w1_sf, dev[0].w2, dev[0].w2_sf};
    bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
    /* Off: each forward alone, judged against the reference. Every rank
     * runs every forward, whatever failed locally (empty when bad). */
    for (int i = 0; i < N; ++i) {
      megamoe_forward_args a = lc_args(&cases[i], &dev[i], ctx->rank);
      if (bad) a.num_tokens = 0;
      if (lc_forward(layer, ctx, &a, H) != MEGAMOE_OK) {
        fprintf(stderr, "    rank %d: forward %d (off): %s\n", ctx->rank, i, megamoe_last_error());
        bad = 1;
      }
      if (!bad && (lc_download(dev[i].y, T * H, off[i]) != 0 ||
                   lc_compare(&cases[i], &data[i], ctx->rank, off[i], "programmatic launch off") != 0))
        bad = 1;
    }
    const megamoe_status rejected = megamoe_set_programmatic_launch(layer, 2);
    if (rejected != MEGAMOE_ERR_BAD_ARGUMENT || !strstr(megamoe_last_error(), "enable")) {
      fprintf(stderr, "    rank %d: enable = 2 gave %s (%s), not BAD_ARGUMENT naming it\n", ctx->rank,
              megamoe_status_string(rejected), megamoe_last_error());
      bad = 1;
    }
    bad |= megamoe_set_programmatic_launch(layer, 1) != MEGAMOE_OK;
    /* On, back to back (then in a graph, replayed twice): one sync per pass. */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    for (int pass = 0; pass < 3; ++pass) {
      for (int i = 0; i < N; ++i) bad |= lc_poison(dev[i].y, T * H) != 0;
      for (int i = 0; i < N; ++i)
        if (x_real[i]) bad |= cudaMemset(dev[i].x, 0, x_bytes) != cudaSuccess;
      if (pass == 0) {
        for (int i = 0; i < N; ++i) {
          megamoe_forward_args a = lc_args(&cases[i], &dev[i], ctx->rank);
          if (bad) a.num_tokens = 0;
          if (x_real[i]) bad |= lc_late_copy(dev[i].x, x_real[i], x_bytes, 200, ctx->stream) != 0;
          bad |= megamoe_forward(layer, &a, ctx->stream) != MEGAMOE_OK;
        }
      } else {
        if (pass == 1) {
          megamoe_status st = MEGAMOE_OK;
          bad |= cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
          /* All N forwards are captured whatever fails, so every rank's graph
           * holds the same collective sequence. */
          for (int i = 0; i < N; ++i) {
            megamoe_forward_args a = lc_args(&cases[i], &dev[i], ctx->rank);
            if (bad) a.num_tokens = 0;
            if (x_real[i] && lc_late_copy(dev[i].x, x_real[i], x_bytes, 200, ctx->stream) != 0) bad = 1;
            const megamoe_status sti = megamoe_forward(layer, &a, ctx->stream);
            if (st == MEGAMOE_OK) st = sti;
          }
          if (st != MEGAMOE_OK) fprintf(stderr, "    rank %d: forward under capture: %s\n", ctx->rank, megamoe_last_error());
          bad |= cudaStreamEndCapture(ctx->stream, &graph) != cudaSuccess || st != MEGAMOE_OK;
          /* The persistent arms' kernels must reach the graph as programmatic
           * dependencies (else the replay would test plain serialization). */
          if (graph && base.cfg.arm != MEGAMOE_ARM_STAGED) {
            const int64_t edges = lt_programmatic_edges(graph);
            if (ctx->rank == 0) printf("    graph: %lld programmatic edges\n", (long long)edges);
            if (edges == 0 || (edges < 0 && CUDART_VERSION >= 12030)) {
              fprintf(stderr, "    rank %d: the captured graph has no programmatic edge%s\n", ctx->rank,
                      edges < 0 ? " (the edge query failed)" : "");
              bad = 1;
            }
          }
          bad |= cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess;
        }
        /* Every rank launches (peers wait in the graph's barriers otherwise). */
        if (exec) bad |= cudaGraphLaunch(exec, ctx->stream) != cudaSuccess;
      }
      const megamoe_status st = megamoe_sync(layer, ctx->stream);
      if (st != MEGAMOE_OK) {
        fprintf(stderr, "    rank %d: pass %d (on): %s\n", ctx->rank, pass, megamoe_last_error());
        bad = 1;
      }
      for (int i = 0; i < N && !bad; ++i) {
        if (lc_download(dev[i].y, T * H, y) != 0) {
          bad = 1;
          break;
        }
        int64_t first = -1;
        const int64_t differ = lc_count_differences(off[i], y, T * H, &first);
        if (differ) {
          fprintf(stderr, "    rank %d: %s, forward %d: %lld elements differ from off (first at %lld)\n", ctx->rank,
                  pass == 0 ? "on, back to back" : "on, graph replay", i, (long long)differ, (long long)first);
          bad = 1;
        }
      }
    }
    if (exec) bad |= cudaGraphExecDestroy(exec) != cudaSuccess;
    if (graph) bad |= cudaGraphDestroy(graph) != cudaSuccess;
    bad |= megamoe_destroy(layer) != MEGAMOE_OK;
  }
  free(y);
  for (int i = 0; i < N; ++i) {
    free(off[i]);
    if (x_real[i]) cudaFree(x_real[i]);
    lc_device_free(&dev[i]);
    lc_free(&data[i]);
  }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* A bad top-k index on rank 0 (found on the device): rank 0's sync reports
 * MEGAMOE_ERR_BAD_TOPK_INDEX, the others MEGAMOE_ERR_PEER_FAILED; the layer
 * stays usable and the next forward is right. */
static mm_test_result t_bad_topk_index(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 2), 2, 32, 14);
  lc_data d;
  lc_device g;
  int bad = lc_build(&c, ctx->num_ranks, ctx->rank, &d) != 0;
  bad |= lc_upload(&c, &d, ctx->rank, &g) != 0;
  megamoe_layer* layer = NULL;
  if (mm_test_create(ctx, &c.cfg, &layer) != MEGAMOE_OK) return MM_TEST_FAIL;
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
  if (ctx->rank == 0) {
    const int32_t wrong = c.cfg.num_experts; /* one past the last expert */
    bad |= cudaMemcpy((int32_t*)g.idx + 5, &wrong, sizeof wrong, cudaMemcpyHostToDevice) != cudaSuccess;
  }
  megamoe_forward_args a = lc_args(&c, &g, ctx->rank);
  megamoe_status st = lc_forward(layer, ctx, &a, c.cfg.hidden);
  const megamoe_status want = ctx->rank == 0 ? MEGAMOE_ERR_BAD_TOPK_INDEX
                                             : (ctx->num_ranks > 1 ? MEGAMOE_ERR_PEER_FAILED : MEGAMOE_OK);
  if (st != want) {
    fprintf(stderr, "    rank %d: got %s, want %s (%s)\n", ctx->rank, megamoe_status_string(st),
            megamoe_status_string(want), megamoe_last_error());
    bad = 1;
  }
  if (ctx->rank == 0) {
    const int32_t fixed = d.idx[0][5];
    bad |= cudaMemcpy((int32_t*)g.idx + 5, &fixed, sizeof fixed, cudaMemcpyHostToDevice) != cudaSuccess;
  }
  st = lc_forward(layer, ctx, &a, c.cfg.hidden);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: forward after the error: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  } else {
    const int64_t n = c.tokens[ctx->rank] * c.cfg.hidden;
    uint16_t* y = malloc(sizeof(uint16_t) * (size_t)n + 1);
    bad |= lc_download(g.y, n, y) != 0 || lc_compare(&c, &d, ctx->rank, y, "after error") != 0;
    free(y);
  }
  bad |= megamoe_destroy(layer) != MEGAMOE_OK;
  lc_device_free(&g);
  lc_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Host-side rejections of a forward (every rank passes the same bad value,
 * so nobody waits), and of create. */
static mm_test_result t_bad_arguments(const mm_rank_ctx* ctx) {
  megamoe_config cfg = megamoe_config_make(256, 256, EXPERTS(ctx, 2), 2, 16);
  cfg.arm = mm_test_arm();
  megamoe_layer* layer = NULL;
  megamoe_config wrong = cfg;
  wrong.hidden = 200;
  CHECK_STATUS(mm_test_create(ctx, &wrong, &layer), MEGAMOE_ERR_BAD_SHAPE);
  CHECK(strstr(megamoe_last_error(), "hidden") != NULL);
  CHECK_STATUS(mm_test_create(ctx, NULL, &layer), MEGAMOE_ERR_NULL_POINTER);
  CHECK_OK(mm_test_create(ctx, &cfg, &layer));
  megamoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.num_tokens = 4;
  CHECK_STATUS(megamoe_forward(layer, &a, ctx->stream), MEGAMOE_ERR_WEIGHTS_NOT_READY);
  void* dummy = NULL;
  CHECK(cudaMalloc(&dummy, 1 << 20) == cudaSuccess);
  megamoe_weights w = {dummy, (float*)dummy, dummy, (float*)dummy};
  CHECK_OK(megamoe_prepare_weights(layer, &w, ctx->stream));
  a.num_tokens = 17;
  CHECK_STATUS(megamoe_forward(layer, &a, ctx->stream), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK(strstr(megamoe_last_error(), "num_tokens") != NULL);
  a.num_tokens = 4;
  CHECK_STATUS(megamoe_forward(layer, &a, ctx->stream), MEGAMOE_ERR_NULL_POINTER);
  CHECK(strstr(megamoe_last_error(), "args->x") != NULL);
  a.x = dummy;
  a.x_sf = (float*)dummy;
  a.topk_idx = dummy;
  a.topk_w = (float*)dummy;
  a.y = (char*)dummy + 2;
  CHECK_STATUS(megamoe_forward(layer, &a, ctx->stream), MEGAMOE_ERR_BAD_ARGUMENT);
  a.y = dummy;
  a.num_tokens_bound = 3;
  CHECK_STATUS(megamoe_forward(layer, &a, ctx->stream), MEGAMOE_ERR_TOO_MANY_TOKENS);
  a.num_tokens_bound = 0;
  a.topk_idx_type = (megamoe_index_type)7;
  CHECK_STATUS(megamoe_forward(layer, &a, ctx->stream), MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK_OK(megamoe_destroy(layer));
  CHECK(cudaFree(dummy) == cudaSuccess);
  return MM_TEST_PASS;
}

/* The last rank skips a forward: the others' sync ends in a timeout (2 s),
 * and their layer refuses later forwards. */
static mm_test_result t_peer_timeout(const mm_rank_ctx* ctx) {
  lc_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 2), 2, 16, 15);
  c.cfg.timeout_s = 2.0;
  lc_data d;
  lc_device g;
  int bad = lc_build(&c, ctx->num_ranks, ctx->rank, &d) != 0;
  bad |= lc_upload(&c, &d, ctx->rank, &g) != 0;
  megamoe_layer* layer = NULL;
  if (mm_test_create(ctx, &c.cfg, &layer) != MEGAMOE_OK) return MM_TEST_FAIL;
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
  megamoe_forward_args a = lc_args(&c, &g, ctx->rank);
  const int silent = ctx->num_ranks - 1;
  if (ctx->rank != silent) {
    megamoe_status st = lc_forward(layer, ctx, &a, c.cfg.hidden);
    if (st != MEGAMOE_ERR_TIMEOUT) {
      fprintf(stderr, "    rank %d: got %s, want MEGAMOE_ERR_TIMEOUT\n", ctx->rank, megamoe_status_string(st));
      bad = 1;
    } else if (!strstr(megamoe_last_error(), "did not arrive")) {
      fprintf(stderr, "    rank %d: message: %s\n", ctx->rank, megamoe_last_error());
      bad = 1;
    }
    if (megamoe_forward(layer, &a, ctx->stream) != MEGAMOE_ERR_LAYER_FAILED) bad = 1;
  }
  bad |= megamoe_destroy(layer) != MEGAMOE_OK;
  lc_device_free(&g);
  lc_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Sets name to value (NULL: unsets it) and returns its old value to restore
 * (strdup'ed, or NULL when it was unset). */
static char* swap_env(const char* name, const char* value) {
  const char* before = getenv(name);
  char* saved = before ? strdup(before) : NULL;
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  return saved;
}
static void restore_env(const char* name, char* saved) {
  if (saved) setenv(name, saved, 1);
  else unsetenv(name);
  free(saved);
}

/* The watch's last line says every one of `ctas` CTAs is at 'reduced' (one
 * group, so no ';'). 0 when it does. */
static int watch_saw_all_reduced(const char* text, int rank, int ctas) {
  char head[96], want[64];
  snprintf(head, sizeof head, "megamoe: timeline watch (rank %d, ", rank); /* then "T s[, unchanged]): " */
  snprintf(want, sizeof want, "%d CTAs at 'reduced' (", ctas);
  const char* last = NULL;
  for (const char* p = text; (p = strstr(p, head)) != NULL; p += strlen(head)) last = p;
  if (!last || !(last = strstr(last, "): "))) return 1;
  last += 3;
  const char* end = strchr(last, '\n');
  const size_t len = end ? (size_t)(end - last) : strlen(last);
  const char* semi = memchr(last, ';', len);
  return strncmp(last, want, strlen(want)) != 0 || semi != NULL;
}

/* The persistent arms' in-kernel timeline (a diagnostic, src/host/timeline.h)
 * after one checked forward: every CTA stamped kernel 1's start and its
 * reductions, in that order and within the deadline; the SM clock
 * (MM_TL_SM_KHZ) was measured by exactly the CTAs that mark it (split: every
 * CTA, at its L1 math end; fused: the CTAs with an L2 tile), each in 200-3000
 * MHz, a range any GPU's SM runs in. A wrong scale falls outside it
 * (scripts/plants/clock_khz.sed); a missing reading leaves a CTA unmeasured.
 * mode: MEGAMOE_TIMELINE's value, "1" (device memory) or "mapped" (mapped
 * host memory, with the watch thread every 50 ms: after the forward it must
 * print, from the mapped memory itself, every CTA at 'reduced', and destroy
 * must stop it). */
static mm_test_result timeline_forward(const mm_rank_ctx* ctx, const char* mode) {
  if (mm_test_arm() == MEGAMOE_ARM_STAGED) return MM_TEST_SKIP; /* no timeline: the same on every rank */
  lc_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 8), 2, 256, 40);
  lc_data d;
  lc_device g;
  memset(&g, 0, sizeof g);
  int bad = lc_build(&c, ctx->num_ranks, ctx->rank, &d) != 0;
  if (!bad) bad = lc_upload(&c, &d, ctx->rank, &g) != 0;
  const int mapped = strcmp(mode, "mapped") == 0;
  mm_stderr_capture cap = {.fd = -1, .saved = -1};
  if (mapped && mm_stderr_capture_begin(&cap) != 0) {
    fprintf(stderr, "    rank %d: could not capture stderr\n", ctx->rank);
    bad = 1;
  }
  /* The layer reads these at create only; this process's later tests must not see them. */
  char* saved = swap_env("MEGAMOE_TIMELINE", mode);
  char* saved_watch = swap_env("MEGAMOE_TIMELINE_WATCH", mapped ? "0.05" : NULL);
  megamoe_layer* layer = NULL;
  const megamoe_status created = mm_test_create(ctx, &c.cfg, &layer); /* collective */
  restore_env("MEGAMOE_TIMELINE", saved);
  restore_env("MEGAMOE_TIMELINE_WATCH", saved_watch);
  if (created != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: create: %s\n", ctx->rank, megamoe_last_error());
    free(mm_stderr_capture_end(&cap, 1));
    lc_device_free(&g);
    lc_free(&d);
    return MM_TEST_FAIL;
  }
  const int64_t H = c.cfg.hidden, T = c.tokens[ctx->rank];
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  if (!bad && megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) bad = 1;
  megamoe_forward_args a = lc_args(&c, &g, ctx->rank);
  if (bad) a.num_tokens = 0; /* still take part, so peers do not wait */
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H) + 1);
  uint64_t* tl = malloc(sizeof(uint64_t) * MM_TL_MAX_CTAS * MM_TL_EVENTS);
  if (lc_forward(layer, ctx, &a, H) != MEGAMOE_OK || !y || !tl) bad = 1;
  if (!bad && (lc_download(g.y, T * H, y) != 0 || lc_compare(&c, &d, ctx->rank, y, "forward") != 0)) bad = 1;
  int ctas = 0;
  if (!bad && mm_layer_timeline(layer, tl, MM_TL_MAX_CTAS, &ctas) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: timeline: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  }
  const int split = mm_test_arm() == MEGAMOE_ARM_SPLIT;
  const int colocated = !ctx->comm && ctx->num_ranks > 1;
  int clocked = 0, first_mains = 0;
  for (int cta = 0; cta < ctas && !bad; ++cta) {
    const uint64_t* e = tl + (size_t)cta * MM_TL_EVENTS;
    const uint64_t start = e[MM_TL_K1_START], reduced = e[MM_TL_REDUCED], khz = e[MM_TL_SM_KHZ];
    if (start == 0 || reduced < start || reduced - start > (uint64_t)(c.cfg.timeout_s * 1e9)) {
      fprintf(stderr, "    rank %d CTA %d: k1 start %llu ns, reduced %llu ns\n", ctx->rank, cta,
              (unsigned long long)start, (unsigned long long)reduced);
      bad = 1;
    }
    /* Split kernel 2's register hand-off stamps: every CTA passes both
     * sides; a CTA with an L2 tile stamps its first mainloop's end between
     * its own hand-off and its math end (thread 0 stamps all three). */
    const uint64_t k2_math = e[MM_TL_K2_MATH_REGS], first = e[MM_TL_K2_FIRST_MAIN];
    first_mains += first != 0;
    if (split && (e[MM_TL_K2_PRODUCER_REGS] < e[MM_TL_K2_START] || k2_math < e[MM_TL_K2_START] ||
                  (first != 0 && (first < k2_math || first > e[MM_TL_L2_MATH_END])))) {
      fprintf(stderr, "    rank %d CTA %d: kernel 2 start %llu, producer regs %llu, math regs %llu, first main %llu, "
              "L2 math end %llu ns\n", ctx->rank, cta, (unsigned long long)e[MM_TL_K2_START],
              (unsigned long long)e[MM_TL_K2_PRODUCER_REGS], (unsigned long long)k2_math, (unsigned long long)first,
              (unsigned long long)e[MM_TL_L2_MATH_END]);
      bad = 1;
    }
    /* Co-located ranks time-slice the GPU: a CTA preempted at a cross-rank
     * wait may come back on another SM, so its clock span is not measured
     * (timeline.cuh); the clock checks are for real multi-GPU runs. */
    if (colocated) continue;
    const int marks = split || e[MM_TL_L2_MATH_END] != 0; /* the CTAs that read the end clock */
    if ((khz != 0) != marks) {
      fprintf(stderr, "    rank %d CTA %d: SM clock %s, but the CTA %s its math end\n", ctx->rank, cta,
              khz ? "measured" : "not measured", marks ? "stamped" : "did not stamp");
      bad = 1;
    }
    if (khz == 0) continue;
    ++clocked;
    if (khz < 200000 || khz > 3000000) {
      fprintf(stderr, "    rank %d CTA %d: SM clock %.1f MHz, outside 200-3000\n", ctx->rank, cta, khz * 1e-3);
      bad = 1;
    }
  }
  if (!bad && split && first_mains == 0) { /* a forward with tokens gives some CTA an L2 tile */
    fprintf(stderr, "    rank %d: no CTA of %d stamped kernel 2's first L2 mainloop\n", ctx->rank, ctas);
    bad = 1;
  }
  if (!bad && !colocated && clocked == 0) { /* the fused arm's CTAs with an L2 tile: at least one here */
    fprintf(stderr, "    rank %d: no CTA of %d measured the SM clock\n", ctx->rank, ctas);
    bad = 1;
  }
  if (mapped && !bad) {
    const struct timespec nap = {0, 300 * 1000 * 1000}; /* six periods of the watch */
    nanosleep(&nap, NULL);
  }
  if (megamoe_destroy(layer) != MEGAMOE_OK) bad = 1; /* stops the watch: nothing prints after */
  if (mapped) {
    char* text = mm_stderr_capture_end(&cap, 1);
    if (!bad && (!text || watch_saw_all_reduced(text, ctx->rank, ctas) != 0)) {
      fprintf(stderr, "    rank %d: the watch's last line does not have all %d CTAs at 'reduced'\n", ctx->rank, ctas);
      bad = 1;
    }
    free(text);
  }
  free(y);
  free(tl);
  lc_device_free(&g);
  lc_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}
static mm_test_result t_timeline(const mm_rank_ctx* ctx) { return timeline_forward(ctx, "1"); }
static mm_test_result t_timeline_mapped(const mm_rank_ctx* ctx) { return timeline_forward(ctx, "mapped"); }

const mm_rank_test mm_layer_tests[] = {
    {"smoke", t_smoke, 1},
    {"shapes", t_shapes, 1},
    {"edge: T = 0 on one rank", t_zero_tokens_one_rank, 1},
    {"edge: T = 0 on all ranks", t_zero_tokens_all, 1},
    {"edge: every slot masked", t_all_masked, 1},
    {"edge: 30% of slots masked", t_masked_30, 1},
    {"edge: 70% of slots masked", t_masked_70, 1},
    {"edge: all tokens on one expert", t_one_expert, 1},
    {"edge: T = T_max", t_full_capacity, 1},
    {"edge: clamp 1", t_clamp, 1},
    {"edge: group 64", t_group64, 1},
    {"edge: group 128, int64 top-k", t_group128_int64, 1},
    {"random: 20 configurations", t_random, 1},
    {"run-to-run: bitwise identical", t_run_to_run, 1},
    {"reuse: 4 calls on one layer", t_reuse, 1},
    {"edge: pool filled to capacity (every slot to one rank, T = T_max)", t_pool_capacity, 1},
    {"edge: an expert repeated inside a token's top-k", t_repeated_expert, 1},
    {"edge: T = 1, 127, 4097 next to T = 0", t_odd_token_counts, 1},
    {"routing: 16384 slots over 160 experts per rank (the count pass, two experts on a CTA)",
     t_many_experts_count_pass, 1},
    {"decode: T = 1..256 with its own bound and with T_max, bitwise equal", t_decode_tiles, 1},
    {"input staging: x and x_sf written where megamoe_input_staging says, bitwise the copy path", t_input_staging, 1},
    {"arms: bitwise equal to staged", t_arms_bitwise, 1},
    {"combine: early and late orders bitwise equal to staged", t_combine_orders, 1},
    {"graph: one capture replayed on 3 inputs", t_graph_replay, 1},
    {"programmatic launch: on = off bitwise, back to back and in a graph", t_programmatic_launch, 1},
    {"timeline: every CTA stamped, the SM clock in 200-3000 MHz", t_timeline, 1},
    {"timeline: mapped host memory and the watch thread, the same checks", t_timeline_mapped, 1},
    {"sanitize small: uniform routing, 2 forwards", t_sanitize_uniform, 1},
    {"sanitize small: 25% masked, T = 0 on the last rank, int64 top-k, group 64", t_sanitize_masked, 1},
    {"sanitize small: every token on one expert, clamp", t_sanitize_one_expert, 1},
    {"errors: bad top-k index on the device", t_bad_topk_index, 1},
    {"errors: host-side argument checks", t_bad_arguments, 1},
    {"errors: a silent peer times out", t_peer_timeout, 2},
    {NULL, NULL, 0},
};
