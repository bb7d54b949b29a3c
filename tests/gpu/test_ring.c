/* The fused arm's ring on 1..8 GPUs (docs/FUSED.md sections 3-5 and 9,
 * issue 11); the runner runs this suite on the fused variant only.
 *
 *  - ring against a full pool: eight shapes whose calls lay out more blocks
 *    than the ring holds (the ring wraps), skewed routing (most slots on a
 *    few experts of rank 0), four forwards per layer with other routing and
 *    token counts each; the fused arm's outputs must be BITWISE the staged
 *    arm's (the control, whose pool holds the worst case). Then the same
 *    four forwards again on the same fused layer under each call's own
 *    num_tokens_bound (the largest T of the call: the single-wave order
 *    where its worst case fits the ring, else the lag order with the
 *    bound's lag), bitwise again. Eight forwards per layer run the counter
 *    banks of both parities four times each.
 *  - a bound above T_max on every rank: rejected on every rank's host, the
 *    layer usable after.
 *  - a bound below a peer's count (the bounds differ across ranks, each
 *    legal on its own host): the device's verdict, MEGAMOE_ERR_TOO_MANY_TOKENS
 *    on every rank naming the rank, nothing written; the layer usable after.
 *
 * Every rank makes every collective call (create, forward, destroy)
 * whatever it found locally. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "layer_case.h"
#include "rank_ctx.h"
#include "ref.h"

#define RING_CALLS 4

typedef struct ring_shape {
  int64_t H, I;
  int El, K;
  int64_t Tmax;
  int G;
  int skew_experts;
  double skew_ratio;
} ring_shape;

/* Each lays out more blocks at T_max than its ring holds (the ring is
 * 8 (lag + 4) + 4 blocks for the lag of T_max; test_ring prints both).
 * Their H covers both large L2 tiles of each G: 128x256 where H is a
 * multiple of 256, 256x128 (two A boxes) at H 384 (G 128) and H 640 (G 64).
 * H 1280 is the widest row here: 80 words of 16 B, 2-3 a lane in the
 * pull's warp copy (mm_warp_copy16). */
static const ring_shape kShapes[] = {
    {512, 256, 8, 4, 4096, 128, 2, 0.7},  {256, 384, 8, 4, 4096, 64, 3, 0.8},  {384, 256, 16, 6, 4096, 128, 4, 0.6},
    {256, 256, 4, 2, 8192, 128, 1, 0.9},  {640, 512, 8, 2, 8192, 64, 2, 0.75}, {256, 640, 12, 3, 6144, 128, 3, 0.7},
    {768, 256, 8, 8, 2048, 128, 4, 0.5},  {1280, 256, 32, 6, 4096, 64, 6, 0.8},
};
#define RING_SHAPES ((int)(sizeof kShapes / sizeof kShapes[0]))

/* Blocks this rank lays out for a case: ceil(rows / 128) over its local
 * experts, rows from every rank's routing. */
static int64_t ring_blocks_of(const lc_case* c, const lc_data* d, int R, int rank) {
  const int K = c->cfg.top_k;
  int64_t* rows = calloc((size_t)d->El, sizeof(int64_t));
  if (!rows) return -1;
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < c->tokens[r] * K; ++i) {
      const int e = d->idx[r][i];
      if (e >= 0 && e / d->El == rank) rows[e % d->El]++;
    }
  int64_t blocks = 0;
  for (int e = 0; e < d->El; ++e) blocks += (rows[e] + 127) / 128;
  free(rows);
  return blocks;
}

/* Poisons y, runs one forward with the bound, syncs (lc_forward). */
static megamoe_status ring_forward(megamoe_layer* layer, const mm_rank_ctx* ctx, megamoe_forward_args a, int64_t bound,
                                   int64_t H) {
  a.num_tokens_bound = bound;
  return lc_forward(layer, ctx, &a, H);
}

/* One shape: the staged arm's four outputs, then the fused arm's, twice. */
static int ring_shape_run(const mm_rank_ctx* ctx, const ring_shape* sh, int index) {
  const int R = ctx->num_ranks;
  lc_case cases[RING_CALLS];
  lc_data data[RING_CALLS];
  lc_device dev[RING_CALLS];
  memset(data, 0, sizeof data);
  memset(dev, 0, sizeof dev);
  lc_case base = lc_make(ctx, sh->H, sh->I, sh->El * R, sh->K, sh->Tmax, 700 + (uint64_t)index);
  base.cfg.quant_group = sh->G;
  base.cfg.timeout_s = 30.0;
  base.weight_seed = base.seed;
  base.no_reference = 1;
  int bad = 0;
  for (int i = 0; i < RING_CALLS; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 31u * (uint64_t)(i + 1);
    cases[i].skew_experts = sh->skew_experts;
    cases[i].skew_ratio = sh->skew_ratio * (1.0 - 0.1 * i);
    cases[i].mask_ratio = 0.05 * i;
    for (int r = 0; r < R; ++r) {
      const int64_t t[RING_CALLS] = {sh->Tmax, sh->Tmax * 3 / 4 - 7 * r, sh->Tmax - 1 - r, sh->Tmax / 2 + 1 + 3 * r};
      cases[i].tokens[r] = t[i] < 0 ? 0 : t[i];
    }
    if (!bad) bad |= lc_build(&cases[i], R, ctx->rank, &data[i]) != 0;
    if (!bad) bad |= lc_upload(&cases[i], &data[i], ctx->rank, &dev[i]) != 0;
  }
  megamoe_layout_info info;
  megamoe_config fused_cfg = base.cfg;
  fused_cfg.arm = MEGAMOE_ARM_FUSED;
  if (megamoe_layout(&fused_cfg, R, &info, NULL, 0) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: megamoe_layout: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
    memset(&info, 0, sizeof info);
  }
  /* This rank's blocks per call: the wrap must happen on rank 0 (the skew's
   * rank) in the calls at T_max. */
  int64_t blocks[RING_CALLS];
  int wraps = 0;
  for (int i = 0; i < RING_CALLS; ++i) {
    blocks[i] = bad ? 0 : ring_blocks_of(&cases[i], &data[i], R, ctx->rank);
    wraps += blocks[i] > info.ring_blocks;
  }
  printf("    shape %d rank %d: H %lld I %lld E_l %d K %d T_max %lld G %d: ring %d blocks (lag %d), counters %d; "
         "blocks per call %lld %lld %lld %lld\n",
         index, ctx->rank, (long long)sh->H, (long long)sh->I, sh->El, sh->K, (long long)sh->Tmax, sh->G,
         info.ring_blocks, info.ring_lag, info.ring_virtual_blocks, (long long)blocks[0], (long long)blocks[1],
         (long long)blocks[2], (long long)blocks[3]);
  if (ctx->rank == 0 && !bad && wraps == 0) {
    fprintf(stderr, "    shape %d: no call wraps the ring on rank 0: the test does not exercise it\n", index);
    bad = 1;
  }

  const int64_t H = sh->H;
  uint16_t* want[RING_CALLS] = {NULL};
  uint16_t* got = malloc(sizeof(uint16_t) * (size_t)(sh->Tmax * H) + 1);
  if (!got) bad = 1;
  for (int pass = 0; pass < 2; ++pass) {
    megamoe_config cfg = base.cfg;
    cfg.arm = pass == 0 ? MEGAMOE_ARM_STAGED : MEGAMOE_ARM_FUSED;
    megamoe_layer* layer = NULL;
    if (mm_test_create(ctx, &cfg, &layer) != MEGAMOE_OK) { /* collective: agrees on failure */
      fprintf(stderr, "    rank %d: create (%s): %s\n", ctx->rank, megamoe_arm_name(cfg.arm), megamoe_last_error());
      bad = 1;
      continue;
    }
    megamoe_weights w = {dev[0].w1, dev[0].w1_sf, dev[0].w2, dev[0].w2_sf};
    if (!bad && megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
      bad = 1;
    }
    /* The staged arm once; the fused arm with bound 0, then each call's own bound. */
    for (int round = 0; round < (pass == 0 ? 1 : 2); ++round)
      for (int i = 0; i < RING_CALLS; ++i) {
        megamoe_forward_args a = lc_args(&cases[i], &dev[i], ctx->rank);
        int64_t bound = 0;
        if (round == 1)
          for (int r = 0; r < R; ++r) bound = cases[i].tokens[r] > bound ? cases[i].tokens[r] : bound;
        if (bad) {
          a.num_tokens = 0; /* still take part, so peers do not wait */
          bound = 0;
        }
        const megamoe_status st = ring_forward(layer, ctx, a, bound, H);
        if (st != MEGAMOE_OK) {
          fprintf(stderr, "    rank %d shape %d %s call %d (bound %lld): %s: %s\n", ctx->rank, index,
                  megamoe_arm_name(cfg.arm), i, (long long)bound, megamoe_status_string(st), megamoe_last_error());
          bad = 1;
          continue;
        }
        if (bad) continue;
        const int64_t n = cases[i].tokens[ctx->rank] * H;
        if (pass == 0) {
          want[i] = malloc(sizeof(uint16_t) * (size_t)n + 1);
          if (!want[i] || lc_download(dev[i].y, n, want[i]) != 0) bad = 1;
          continue;
        }
        if (lc_download(dev[i].y, n, got) != 0) {
          bad = 1;
          continue;
        }
        int64_t first;
        const int64_t differ = lc_count_differences(want[i], got, n, &first);
        if (differ) {
          fprintf(stderr,
                  "    rank %d shape %d call %d (bound %lld, %lld blocks, ring %d): the fused arm differs bitwise from "
                  "the staged arm in %lld of %lld elements; first: token %lld column %lld\n",
                  ctx->rank, index, i, (long long)bound, (long long)blocks[i], info.ring_blocks, (long long)differ,
                  (long long)n, (long long)(first / H), (long long)(first % H));
          bad = 1;
        }
      }
    if (megamoe_destroy(layer) != MEGAMOE_OK) bad = 1;
  }
  free(got);
  for (int i = 0; i < RING_CALLS; ++i) {
    free(want[i]);
    lc_device_free(&dev[i]);
    lc_free(&data[i]);
  }
  return bad;
}

static mm_test_result t_ring_vs_pool(const mm_rank_ctx* ctx) {
  int bad = 0;
  for (int i = 0; i < RING_SHAPES; ++i)
    if (ring_shape_run(ctx, &kShapes[i], i)) {
      fprintf(stderr, "    ring shape %d failed\n", i);
      bad = 1;
    }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* ---- num_tokens_bound ---------------------------------------------------------- */

#define EXPECT LC_EXPECT

/* A small fused layer with a reference for its case. */
typedef struct bound_env {
  lc_case c;
  lc_data d;
  lc_device g;
  megamoe_layer* layer;
} bound_env;

static int bound_setup(const mm_rank_ctx* ctx, bound_env* env, uint64_t salt, int64_t tmax) {
  memset(env, 0, sizeof *env);
  env->c = lc_make(ctx, 256, 256, 4 * ctx->num_ranks, 2, tmax, salt);
  env->c.cfg.max_tokens_per_rank = tmax;
  env->c.cfg.arm = MEGAMOE_ARM_FUSED;
  for (int r = 0; r < ctx->num_ranks; ++r) env->c.tokens[r] = 20 + 10 * r;
  int bad = lc_build(&env->c, ctx->num_ranks, ctx->rank, &env->d) != 0;
  if (!bad) bad = lc_upload(&env->c, &env->d, ctx->rank, &env->g) != 0;
  if (mm_test_create(ctx, &env->c.cfg, &env->layer) != MEGAMOE_OK) { /* collective */
    fprintf(stderr, "    rank %d: create: %s\n", ctx->rank, megamoe_last_error());
    lc_device_free(&env->g);
    lc_free(&env->d);
    return -1;
  }
  megamoe_weights w = {env->g.w1, env->g.w1_sf, env->g.w2, env->g.w2_sf};
  if (!bad && megamoe_prepare_weights(env->layer, &w, ctx->stream) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  }
  return bad;
}

static int bound_teardown(bound_env* env) {
  const int bad = megamoe_destroy(env->layer) != MEGAMOE_OK;
  lc_device_free(&env->g);
  lc_free(&env->d);
  return bad;
}

/* A right forward (bound as given) on every rank. */
static int bound_good_forward(const mm_rank_ctx* ctx, bound_env* env, int64_t bound, const char* what) {
  int bad = 0;
  megamoe_forward_args a = lc_args(&env->c, &env->g, ctx->rank);
  const megamoe_status st = ring_forward(env->layer, ctx, a, bound, env->c.cfg.hidden);
  EXPECT(st == MEGAMOE_OK, "%s: %s: %s", what, megamoe_status_string(st), megamoe_last_error());
  if (st == MEGAMOE_OK) EXPECT(lc_check_output(&env->c, &env->d, ctx->rank, env->g.y, what) == 0, "%s: output", what);
  return bad;
}

/* Every rank passes a bound above T_max (T_max + 1, then one 128-row
 * alignment above): every rank's host rejects it naming num_tokens_bound,
 * the empty forwards keep the ranks in step, nothing is written, and the
 * layer is usable after. */
static mm_test_result t_bound_above_capacity(const mm_rank_ctx* ctx) {
  bound_env env;
  const int64_t tmax = 128;
  const int setup = bound_setup(ctx, &env, 960, tmax);
  if (setup < 0) return MM_TEST_FAIL;
  int bad = setup;
  const int64_t T = env.c.tokens[ctx->rank], H = env.c.cfg.hidden;
  const int64_t bounds[2] = {tmax + 1, tmax + 128};
  for (int i = 0; i < 2; ++i) {
    EXPECT(lc_poison(env.g.y, T * H) == 0, "poison");
    megamoe_forward_args a = lc_args(&env.c, &env.g, ctx->rank);
    a.num_tokens_bound = bounds[i];
    const megamoe_status st = megamoe_forward(env.layer, &a, ctx->stream);
    EXPECT(st == MEGAMOE_ERR_TOO_MANY_TOKENS && strstr(megamoe_last_error(), "num_tokens_bound"),
           "bound %lld: forward gave %s: %s", (long long)bounds[i], megamoe_status_string(st), megamoe_last_error());
    const megamoe_status st2 = megamoe_sync(env.layer, ctx->stream);
    EXPECT(st2 == MEGAMOE_ERR_TOO_MANY_TOKENS && strstr(megamoe_last_error(), "num_tokens_bound"),
           "bound %lld: sync gave %s: %s", (long long)bounds[i], megamoe_status_string(st2), megamoe_last_error());
    EXPECT(lc_still_poisoned(env.g.y, T * H), "bound %lld: y was written", (long long)bounds[i]);
  }
  bad |= bound_good_forward(ctx, &env, 0, "forward after the rejections");
  bad |= bound_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Rank r holds 20 + 10 r tokens; rank 0 passes its own count as the bound,
 * every other rank its own (each legal on its host): rank 0's bound is
 * below rank 1's count and the bounds differ. Every rank's device finds it
 * in the call table: MEGAMOE_ERR_TOO_MANY_TOKENS on every rank (the same
 * words, naming rank 1), nothing written, error word set; then forwards
 * with bound 0 and with the largest count are right everywhere. */
static mm_test_result t_bound_below_peer(const mm_rank_ctx* ctx) {
  bound_env env;
  const int setup = bound_setup(ctx, &env, 970, 128);
  if (setup < 0) return MM_TEST_FAIL;
  int bad = setup;
  const int R = ctx->num_ranks;
  const int64_t T = env.c.tokens[ctx->rank], H = env.c.cfg.hidden;
  for (int round = 0; round < 2; ++round) { /* twice: both counter banks and both barrier banks */
    EXPECT(lc_poison(env.g.y, T * H) == 0, "poison");
    megamoe_forward_args a = lc_args(&env.c, &env.g, ctx->rank);
    a.num_tokens_bound = T;
    const megamoe_status st = megamoe_forward(env.layer, &a, ctx->stream);
    EXPECT(st == MEGAMOE_OK, "round %d: forward: %s", round, megamoe_last_error());
    const megamoe_status st2 = megamoe_sync(env.layer, ctx->stream);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", megamoe_last_error());
    EXPECT(st2 == MEGAMOE_ERR_TOO_MANY_TOKENS, "round %d: sync gave %s, want TOO_MANY_TOKENS on every rank: %s", round,
           megamoe_status_string(st2), msg);
    EXPECT(strstr(msg, "num_tokens_bound") && strstr(msg, "rank 1") && strstr(msg, "Every rank found it"),
           "round %d: message: %s", round, msg);
    EXPECT(lc_still_poisoned(env.g.y, T * H), "round %d: y was written by the rejected forward", round);
    const int32_t* word = NULL;
    int32_t w = -1;
    EXPECT(megamoe_error_word(env.layer, &word) == MEGAMOE_OK &&
               cudaMemcpy(&w, word, sizeof w, cudaMemcpyDeviceToHost) == cudaSuccess &&
               w == MEGAMOE_ERR_TOO_MANY_TOKENS,
           "round %d: error word %d", round, w);
    bad |= bound_good_forward(ctx, &env, 0, "forward with bound 0 after the verdict");
  }
  int64_t most = 0;
  for (int r = 0; r < R; ++r) most = env.c.tokens[r] > most ? env.c.tokens[r] : most;
  bad |= bound_good_forward(ctx, &env, most, "forward with the largest count as the bound");
  bad |= bound_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

const mm_rank_test mm_ring_tests[] = {
    {"fused ring: a bound above T_max rejected on every rank's host, layer usable", t_bound_above_capacity, 1},
    {"fused ring: a bound below a peer's count, the verdict on every rank, layer usable", t_bound_below_peer, 2},
    {"fused ring: bitwise equal to the staged arm's full pool, 8 skewed shapes that wrap, both banks, own bounds",
     t_ring_vs_pool, 1},
    {NULL, NULL, 0},
};
