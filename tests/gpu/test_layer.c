/* Layer tests on 1..8 GPUs: every rank runs the same test, builds the same
 * global problem from the seed, runs the layer and compares its own tokens'
 * output with the CPU reference (computed for its own tokens only).
 *
 * Collective calls (create, forward, destroy) are made by every rank whatever
 * happened locally, so a local failure never leaves a peer waiting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "rank_ctx.h"
#include "ref.h"

#define DIFF_LIMIT 0.01

/* ---- One problem: global weights, every rank's tokens, this rank's reference */
typedef struct lt_case {
  megamoe_config cfg;
  int64_t tokens[MEGAMOE_MAX_RANKS]; /* T of each rank */
  double mask_ratio;                 /* fraction of slots set to -1 */
  int one_expert;                    /* >= 0: every token's slot 0 goes there, other slots masked */
  int idx64;                         /* int64 top-k indices */
  uint64_t seed;                     /* tokens and routing */
  uint64_t weight_seed;              /* weights (0: same as seed) */
} lt_case;

typedef struct lt_data {
  int R, El;
  uint8_t *w1, *w2;    /* global [E][2I][H], [E][H][I] */
  float *w1_sf, *w2_sf;
  uint8_t* x[MEGAMOE_MAX_RANKS];
  float* x_sf[MEGAMOE_MAX_RANKS];
  int32_t* idx[MEGAMOE_MAX_RANKS];
  float* w[MEGAMOE_MAX_RANKS];
  uint16_t* y_ref; /* this rank's tokens */
} lt_data;

static void lt_free(lt_data* d) {
  free(d->w1);
  free(d->w2);
  free(d->w1_sf);
  free(d->w2_sf);
  for (int r = 0; r < MEGAMOE_MAX_RANKS; ++r) {
    free(d->x[r]);
    free(d->x_sf[r]);
    free(d->idx[r]);
    free(d->w[r]);
  }
  free(d->y_ref);
  memset(d, 0, sizeof *d);
}

/* Weights use the fp8 range (values ~ N(0, 64^2)) with block scales that make
 * the effective weight ~ N(0, 1/K_dim), so activations stay O(1). */
static void fill_weights(mm_rng* g, uint8_t* w, float* sf, int64_t experts, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < experts * rows * cols; ++i) w[i] = ref_e4m3_encode((float)(mm_rng_normal(g) * 64.0));
  const int64_t n_sf = experts * (rows / 128) * (cols / 128);
  for (int64_t i = 0; i < n_sf; ++i)
    sf[i] = (float)((0.5 + mm_rng_uniform(g)) / 64.0 / sqrt((double)cols));
}

/* Tokens the way a producer quantizes them: per 128 channels, sf = amax / 448. */
static void fill_tokens(mm_rng* g, uint8_t* x, float* x_sf, int64_t T, int64_t H) {
  float row[128];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < H / 128; ++b) {
      for (int i = 0; i < 128; ++i) row[i] = (float)mm_rng_normal(g);
      ref_quantize_group(row, 128, x + t * H + b * 128, &x_sf[t * (H / 128) + b]);
    }
}

static void fill_routing(mm_rng* g, const lt_case* c, int32_t* idx, float* w, int64_t T) {
  const int K = c->cfg.top_k, E = c->cfg.num_experts;
  for (int64_t t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) { /* distinct experts per token */
      int e;
      int fresh;
      do {
        e = (int)mm_rng_below(g, (uint64_t)E);
        fresh = 1;
        for (int j = 0; j < k; ++j) fresh &= idx[t * K + j] != e;
      } while (!fresh);
      idx[t * K + k] = e;
      w[t * K + k] = (float)(0.05 + mm_rng_uniform(g));
      if (mm_rng_uniform(g) < c->mask_ratio) idx[t * K + k] = -1;
    }
    if (c->one_expert >= 0)
      for (int k = 0; k < K; ++k) idx[t * K + k] = k == 0 ? c->one_expert : -1;
  }
}

/* The reference for this rank's tokens only (a token depends on nothing
 * else), into d->y_ref, from d's weights and every rank's routing. */
static int lt_reference(const lt_case* c, lt_data* d, int rank) {
  const int64_t H = c->cfg.hidden, I = c->cfg.intermediate;
  ref_rank_data rd[MEGAMOE_MAX_RANKS];
  memset(rd, 0, sizeof rd);
  for (int r = 0; r < d->R; ++r) {
    rd[r].num_tokens = r == rank ? c->tokens[r] : 0;
    rd[r].x = d->x[r];
    rd[r].x_sf = d->x_sf[r];
    rd[r].topk_idx = d->idx[r];
    rd[r].topk_w = d->w[r];
    rd[r].y = r == rank ? d->y_ref : NULL;
    rd[r].w1 = d->w1 + (int64_t)r * d->El * 2 * I * H;
    rd[r].w1_sf = d->w1_sf + (int64_t)r * d->El * (2 * I / 128) * (H / 128);
    rd[r].w2 = d->w2 + (int64_t)r * d->El * H * I;
    rd[r].w2_sf = d->w2_sf + (int64_t)r * d->El * (H / 128) * (I / 128);
  }
  if (ref_layer_forward(&c->cfg, d->R, rd) != MEGAMOE_OK) {
    fprintf(stderr, "    reference failed: %s\n", megamoe_last_error());
    return -1;
  }
  return 0;
}

/* Builds the whole problem (identical on every rank) and this rank's reference. */
static int lt_build(const lt_case* c, int R, int rank, lt_data* d) {
  memset(d, 0, sizeof *d);
  const megamoe_config* cfg = &c->cfg;
  const int64_t H = cfg->hidden, I = cfg->intermediate, E = cfg->num_experts, K = cfg->top_k;
  d->R = R;
  d->El = (int)(E / R);
  mm_rng wg = {c->weight_seed ? c->weight_seed : c->seed};
  mm_rng g = {c->seed ^ 0x70cc3115ull};
  d->w1 = malloc((size_t)(E * 2 * I * H));
  d->w2 = malloc((size_t)(E * H * I));
  d->w1_sf = malloc(sizeof(float) * (size_t)(E * (2 * I / 128) * (H / 128)));
  d->w2_sf = malloc(sizeof(float) * (size_t)(E * (H / 128) * (I / 128)));
  if (!d->w1 || !d->w2 || !d->w1_sf || !d->w2_sf) return -1;
  fill_weights(&wg, d->w1, d->w1_sf, E, 2 * I, H);
  fill_weights(&wg, d->w2, d->w2_sf, E, H, I);
  for (int r = 0; r < R; ++r) {
    const int64_t T = c->tokens[r];
    d->x[r] = malloc((size_t)(T * H) + 1);
    d->x_sf[r] = malloc(sizeof(float) * (size_t)(T * (H / 128)) + 1);
    d->idx[r] = malloc(sizeof(int32_t) * (size_t)(T * K) + 1);
    d->w[r] = malloc(sizeof(float) * (size_t)(T * K) + 1);
    if (!d->x[r] || !d->x_sf[r] || !d->idx[r] || !d->w[r]) return -1;
    fill_tokens(&g, d->x[r], d->x_sf[r], T, H);
    fill_routing(&g, c, d->idx[r], d->w[r], T);
  }
  d->y_ref = malloc(sizeof(uint16_t) * (size_t)(c->tokens[rank] * H) + 1);
  if (!d->y_ref) return -1;
  return lt_reference(c, d, rank);
}

/* ---- Device side ------------------------------------------------------- */
typedef struct lt_device {
  void *w1, *w2, *w1_sf, *w2_sf;
  void *x, *x_sf, *idx, *w, *y;
} lt_device;

static void lt_device_free(lt_device* g) {
  void* ptrs[] = {g->w1, g->w2, g->w1_sf, g->w2_sf, g->x, g->x_sf, g->idx, g->w, g->y};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; ++i) cudaFree(ptrs[i]);
  memset(g, 0, sizeof *g);
}

static int upload(void** dst, const void* src, size_t bytes) {
  if (cudaMalloc(dst, bytes ? bytes : 16) != cudaSuccess) return -1;
  if (bytes && cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return -1;
  return 0;
}

/* This rank's weights and inputs on the device; top-k as int32 or int64. */
static int lt_upload(const lt_case* c, const lt_data* d, int rank, lt_device* g) {
  memset(g, 0, sizeof *g);
  const megamoe_config* cfg = &c->cfg;
  const int64_t H = cfg->hidden, I = cfg->intermediate, K = cfg->top_k, El = d->El;
  const int64_t T = c->tokens[rank];
  int bad = 0;
  bad |= upload(&g->w1, d->w1 + rank * El * 2 * I * H, (size_t)(El * 2 * I * H));
  bad |= upload(&g->w1_sf, d->w1_sf + rank * El * (2 * I / 128) * (H / 128), sizeof(float) * (size_t)(El * (2 * I / 128) * (H / 128)));
  bad |= upload(&g->w2, d->w2 + rank * El * H * I, (size_t)(El * H * I));
  bad |= upload(&g->w2_sf, d->w2_sf + rank * El * (H / 128) * (I / 128), sizeof(float) * (size_t)(El * (H / 128) * (I / 128)));
  bad |= upload(&g->x, d->x[rank], (size_t)(T * H));
  bad |= upload(&g->x_sf, d->x_sf[rank], sizeof(float) * (size_t)(T * (H / 128)));
  bad |= upload(&g->w, d->w[rank], sizeof(float) * (size_t)(T * K));
  if (c->idx64) {
    int64_t* wide = malloc(sizeof(int64_t) * (size_t)(T * K) + 1);
    for (int64_t i = 0; i < T * K; ++i) wide[i] = d->idx[rank][i];
    bad |= upload(&g->idx, wide, sizeof(int64_t) * (size_t)(T * K));
    free(wide);
  } else {
    bad |= upload(&g->idx, d->idx[rank], sizeof(int32_t) * (size_t)(T * K));
  }
  bad |= cudaMalloc(&g->y, sizeof(uint16_t) * (size_t)(T * H) + 16) != cudaSuccess;
  return bad ? -1 : 0;
}

static megamoe_forward_args lt_args(const lt_case* c, const lt_device* g, int rank) {
  megamoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.x = g->x;
  a.x_sf = g->x_sf;
  a.topk_idx = g->idx;
  a.topk_idx_type = c->idx64 ? MEGAMOE_INDEX_INT64 : MEGAMOE_INDEX_INT32;
  a.topk_w = g->w;
  a.num_tokens = c->tokens[rank];
  a.y = g->y;
  return a;
}

/* Poisons y (0xFFFF is a bf16 NaN), runs one forward, syncs. */
static megamoe_status lt_forward(megamoe_layer* layer, const mm_rank_ctx* ctx, const megamoe_forward_args* a,
                                 int64_t H) {
  if (a->num_tokens > 0 && cudaMemset(a->y, 0xFF, sizeof(uint16_t) * (size_t)(a->num_tokens * H)) != cudaSuccess)
    return MEGAMOE_ERR_CUDA;
  megamoe_status st = megamoe_forward(layer, a, ctx->stream);
  megamoe_status st2 = megamoe_sync(layer, ctx->stream);
  return st != MEGAMOE_OK ? st : st2;
}

/* Compares y with the reference: diff < DIFF_LIMIT, no NaN, exact zeros for
 * tokens whose slots are all masked. */
static int lt_compare(const lt_case* c, const lt_data* d, int rank, const uint16_t* y, const char* what) {
  const int64_t T = c->tokens[rank], H = c->cfg.hidden, K = c->cfg.top_k;
  if (T == 0) return 0;
  for (int64_t i = 0; i < T * H; ++i)
    if (isnan(ref_bf16_decode(y[i]))) {
      fprintf(stderr, "    %s rank %d: y[%lld] is NaN (unwritten or bad)\n", what, rank, (long long)i);
      return -1;
    }
  for (int64_t t = 0; t < T; ++t) {
    int live = 0;
    for (int k = 0; k < K; ++k) live |= d->idx[rank][t * K + k] >= 0;
    if (!live)
      for (int64_t h = 0; h < H; ++h)
        if (y[t * H + h] != 0) {
          fprintf(stderr, "    %s rank %d: token %lld has every slot masked but y != 0\n", what, rank, (long long)t);
          return -1;
        }
  }
  const double diff = ref_diff_bf16(y, d->y_ref, (size_t)(T * H));
  if (!(diff < DIFF_LIMIT)) {
    fprintf(stderr, "    %s rank %d: diff %.3g >= %.3g\n", what, rank, diff, DIFF_LIMIT);
    return -1;
  }
  return 0;
}

static int lt_download(const lt_device* g, int64_t n, uint16_t* host) {
  return n == 0 ? 0 : cudaMemcpy(host, g->y, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

/* Runs a case `calls` times on one layer; every call is checked, and with
 * calls > 1 every output must be bitwise the first. */
static mm_test_result lt_run(const mm_rank_ctx* ctx, const lt_case* c, int calls) {
  lt_data d;
  lt_device g;
  int local_bad = lt_build(c, ctx->num_ranks, ctx->rank, &d) != 0;
  memset(&g, 0, sizeof g);
  if (!local_bad) local_bad = lt_upload(c, &d, ctx->rank, &g) != 0;

  megamoe_layer* layer = NULL;
  megamoe_status st = megamoe_create(&c->cfg, ctx->comm, &layer); /* collective: agrees on failure */
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: megamoe_create: %s\n", ctx->rank, megamoe_last_error());
    lt_device_free(&g);
    lt_free(&d);
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
  for (int call = 0; call < calls; ++call) {
    megamoe_forward_args a = lt_args(c, &g, ctx->rank);
    if (local_bad) a.num_tokens = 0; /* still take part, so peers do not wait */
    st = lt_forward(layer, ctx, &a, H);
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d call %d: %s: %s\n", ctx->rank, call, megamoe_status_string(st), megamoe_last_error());
      local_bad = 1;
      continue;
    }
    if (local_bad) continue;
    if (lt_download(&g, T * H, y) != 0 || lt_compare(c, &d, ctx->rank, y, "forward") != 0) {
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
  lt_device_free(&g);
  lt_free(&d);
  return local_bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* A case with every rank holding T tokens. */
static lt_case lt_make(const mm_rank_ctx* ctx, int64_t H, int64_t I, int E, int K, int64_t T, uint64_t salt) {
  lt_case c;
  memset(&c, 0, sizeof c);
  c.cfg = megamoe_config_make(H, I, E, K, T > 0 ? T : 1);
  c.cfg.timeout_s = 30.0;
  for (int r = 0; r < ctx->num_ranks; ++r) c.tokens[r] = T;
  c.one_expert = -1;
  c.seed = ctx->seed * 1000003u + salt;
  return c;
}

/* Experts: E_l local experts per rank, so the test scales with the rank count. */
#define EXPERTS(ctx, per_rank) ((per_rank) * (ctx)->num_ranks)

/* ---- Tests ------------------------------------------------------------- */
static mm_test_result t_smoke(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 512, 8, 2, 64, 1);
  c.cfg.num_experts = 8 % ctx->num_ranks == 0 ? 8 : EXPERTS(ctx, 4);
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_shapes(const mm_rank_ctx* ctx) {
  const int64_t dims[2] = {512, 2048};
  const int ks[3] = {1, 2, 4};
  for (int hi = 0; hi < 2; ++hi)
    for (int ii = 0; ii < 2; ++ii)
      for (int ki = 0; ki < 3; ++ki) {
        lt_case c = lt_make(ctx, dims[hi], dims[ii], EXPERTS(ctx, 4), ks[ki], 128, 100 + hi * 10 + ii * 3 + ki);
        if (lt_run(ctx, &c, 1) != MM_TEST_PASS) {
          fprintf(stderr, "    shape H %lld I %lld K %d failed\n", (long long)dims[hi], (long long)dims[ii], ks[ki]);
          return MM_TEST_FAIL;
        }
      }
  return MM_TEST_PASS;
}

static mm_test_result t_zero_tokens_one_rank(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 256, EXPERTS(ctx, 4), 2, 48, 2);
  c.tokens[ctx->num_ranks - 1] = 0;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_zero_tokens_all(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 256, EXPERTS(ctx, 4), 2, 48, 3);
  for (int r = 0; r < ctx->num_ranks; ++r) c.tokens[r] = 0;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_all_masked(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 4), 3, 40, 4);
  c.mask_ratio = 1.0;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_masked_30(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 4, 96, 5);
  c.mask_ratio = 0.3;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_masked_70(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 4, 96, 6);
  c.mask_ratio = 0.7;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_one_expert(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 384, EXPERTS(ctx, 4), 2, 200, 7);
  c.one_expert = c.cfg.num_experts - 1; /* on the last rank */
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_full_capacity(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 2), 2, 300, 8);
  c.cfg.max_tokens_per_rank = 300; /* T = T_max on every rank */
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_clamp(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 2, 64, 9);
  c.cfg.has_swiglu_clamp = 1;
  c.cfg.swiglu_clamp = 1.0f;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_group64(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 512, 640, EXPERTS(ctx, 4), 2, 64, 10);
  c.cfg.quant_group = 64;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_group128_int64(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 384, 640, EXPERTS(ctx, 3), 3, 64, 11);
  c.cfg.quant_group = 128;
  c.idx64 = 1;
  return lt_run(ctx, &c, 1);
}

static mm_test_result t_random(const mm_rank_ctx* ctx) {
  mm_rng g = {ctx->seed ^ 0x5eedull};
  printf("    random configurations from seed %llu\n", (unsigned long long)(ctx->seed ^ 0x5eedull));
  for (int i = 0; i < 20; ++i) {
    const int64_t H = 128 * (int64_t)(1 + mm_rng_below(&g, 8));
    const int64_t I = 128 * (int64_t)(1 + mm_rng_below(&g, 8));
    const int E = EXPERTS(ctx, (int)(1 + mm_rng_below(&g, 6)));
    const int K = (int)(1 + mm_rng_below(&g, (uint64_t)(E < 6 ? E : 6)));
    const int64_t Tmax = (int64_t)(1 + mm_rng_below(&g, 160));
    lt_case c = lt_make(ctx, H, I, E, K, Tmax, 1000 + i);
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
      return MM_TEST_FAIL;
    }
  }
  return MM_TEST_PASS;
}

static mm_test_result t_run_to_run(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 1024, 512, EXPERTS(ctx, 4), 4, 160, 12);
  return lt_run(ctx, &c, 3);
}

/* Four forwards with different T and routing on one layer object. */
static mm_test_result t_reuse(const mm_rank_ctx* ctx) {
  lt_case base = lt_make(ctx, 512, 512, EXPERTS(ctx, 4), 2, 256, 13);
  base.weight_seed = base.seed; /* one set of weights for the four calls */
  lt_case cases[4];
  lt_data data[4];
  lt_device dev[4];
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 17u * (uint64_t)(i + 1);
    for (int r = 0; r < ctx->num_ranks; ++r) cases[i].tokens[r] = (int64_t)((37 * (i + 1) + 11 * r) % 257);
    cases[i].mask_ratio = 0.1 * i;
    bad |= lt_build(&cases[i], ctx->num_ranks, ctx->rank, &data[i]) != 0;
    bad |= lt_upload(&cases[i], &data[i], ctx->rank, &dev[i]) != 0;
  }
  megamoe_layer* layer = NULL;
  if (megamoe_create(&base.cfg, ctx->comm, &layer) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: create: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  } else {
    megamoe_weights w = {dev[0].w1, dev[0].w1_sf, dev[0].w2, dev[0].w2_sf};
    if (megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK) bad = 1;
    for (int i = 0; i < 4; ++i) {
      megamoe_forward_args a = lt_args(&cases[i], &dev[i], ctx->rank);
      if (bad) a.num_tokens = 0; /* still take part, so peers do not wait */
      megamoe_status st = lt_forward(layer, ctx, &a, base.cfg.hidden);
      if (st != MEGAMOE_OK) {
        fprintf(stderr, "    rank %d call %d: %s\n", ctx->rank, i, megamoe_last_error());
        bad = 1;
        continue;
      }
      if (bad) continue;
      const int64_t n = cases[i].tokens[ctx->rank] * base.cfg.hidden;
      uint16_t* y = malloc(sizeof(uint16_t) * (size_t)n + 1);
      if (lt_download(&dev[i], n, y) != 0 || lt_compare(&cases[i], &data[i], ctx->rank, y, "reuse") != 0) bad = 1;
      free(y);
    }
    if (megamoe_destroy(layer) != MEGAMOE_OK) bad = 1;
  }
  for (int i = 0; i < 4; ++i) {
    lt_device_free(&dev[i]);
    lt_free(&data[i]);
  }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* A forward captured once in a CUDA graph and replayed on three different
 * inputs (copied into the captured buffers): every replay is right. Serving
 * engines replay graphs; the sequence numbers live on the device for this. */
static mm_test_result t_graph_replay(const mm_rank_ctx* ctx) {
  lt_case base = lt_make(ctx, 512, 384, EXPERTS(ctx, 4), 3, 96, 16);
  base.weight_seed = base.seed;
  lt_case cases[3];
  lt_data data[3];
  lt_device dev[3];
  int bad = 0;
  for (int i = 0; i < 3; ++i) {
    cases[i] = base;
    cases[i].seed = base.seed + 101u * (uint64_t)(i + 1);
    cases[i].mask_ratio = 0.15 * i;
    bad |= lt_build(&cases[i], ctx->num_ranks, ctx->rank, &data[i]) != 0;
    bad |= lt_upload(&cases[i], &data[i], ctx->rank, &dev[i]) != 0;
  }
  megamoe_layer* layer = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  if (megamoe_create(&base.cfg, ctx->comm, &layer) != MEGAMOE_OK) return MM_TEST_FAIL;
  megamoe_weights w = {dev[0].w1, dev[0].w1_sf, dev[0].w2, dev[0].w2_sf};
  bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
  bad |= cudaStreamSynchronize(ctx->stream) != cudaSuccess;
  /* Capture one forward reading dev[0]'s buffers. */
  megamoe_forward_args a = lt_args(&cases[0], &dev[0], ctx->rank);
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
      cudaMemcpy(dev[0].x, data[i].x[ctx->rank], (size_t)(T * H), cudaMemcpyHostToDevice);
      cudaMemcpy(dev[0].x_sf, data[i].x_sf[ctx->rank], sizeof(float) * (size_t)(T * (H / 128)), cudaMemcpyHostToDevice);
      cudaMemcpy(dev[0].idx, data[i].idx[ctx->rank], sizeof(int32_t) * (size_t)(T * K), cudaMemcpyHostToDevice);
      cudaMemcpy(dev[0].w, data[i].w[ctx->rank], sizeof(float) * (size_t)(T * K), cudaMemcpyHostToDevice);
    }
    cudaMemset(dev[0].y, 0xFF, sizeof(uint16_t) * (size_t)(T * H));
    if (exec) bad |= cudaGraphLaunch(exec, ctx->stream) != cudaSuccess;
    st = megamoe_sync(layer, ctx->stream);
    if (st != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d replay %d: %s\n", ctx->rank, i, megamoe_last_error());
      bad = 1;
      continue;
    }
    if (!bad && (lt_download(&dev[0], T * H, y) != 0 || lt_compare(&cases[i], &data[i], ctx->rank, y, "graph replay") != 0))
      bad = 1;
  }
  free(y);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  bad |= megamoe_destroy(layer) != MEGAMOE_OK;
  for (int i = 0; i < 3; ++i) {
    lt_device_free(&dev[i]);
    lt_free(&data[i]);
  }
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* A bad top-k index on rank 0 (found on the device): rank 0's sync reports
 * MEGAMOE_ERR_BAD_TOPK_INDEX, the others MEGAMOE_ERR_PEER_FAILED; the layer
 * stays usable and the next forward is right. */
static mm_test_result t_bad_topk_index(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 2), 2, 32, 14);
  lt_data d;
  lt_device g;
  int bad = lt_build(&c, ctx->num_ranks, ctx->rank, &d) != 0;
  bad |= lt_upload(&c, &d, ctx->rank, &g) != 0;
  megamoe_layer* layer = NULL;
  if (megamoe_create(&c.cfg, ctx->comm, &layer) != MEGAMOE_OK) return MM_TEST_FAIL;
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
  if (ctx->rank == 0) {
    const int32_t wrong = c.cfg.num_experts; /* one past the last expert */
    bad |= cudaMemcpy((int32_t*)g.idx + 5, &wrong, sizeof wrong, cudaMemcpyHostToDevice) != cudaSuccess;
  }
  megamoe_forward_args a = lt_args(&c, &g, ctx->rank);
  megamoe_status st = lt_forward(layer, ctx, &a, c.cfg.hidden);
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
  st = lt_forward(layer, ctx, &a, c.cfg.hidden);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: forward after the error: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  } else {
    const int64_t n = c.tokens[ctx->rank] * c.cfg.hidden;
    uint16_t* y = malloc(sizeof(uint16_t) * (size_t)n + 1);
    bad |= lt_download(&g, n, y) != 0 || lt_compare(&c, &d, ctx->rank, y, "after error") != 0;
    free(y);
  }
  bad |= megamoe_destroy(layer) != MEGAMOE_OK;
  lt_device_free(&g);
  lt_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Host-side rejections of a forward (every rank passes the same bad value,
 * so nobody waits), and of create. */
static mm_test_result t_bad_arguments(const mm_rank_ctx* ctx) {
  megamoe_config cfg = megamoe_config_make(256, 256, EXPERTS(ctx, 2), 2, 16);
  megamoe_layer* layer = NULL;
  megamoe_config wrong = cfg;
  wrong.hidden = 200;
  CHECK_STATUS(megamoe_create(&wrong, ctx->comm, &layer), MEGAMOE_ERR_BAD_SHAPE);
  CHECK(strstr(megamoe_last_error(), "hidden") != NULL);
  CHECK_STATUS(megamoe_create(NULL, ctx->comm, &layer), MEGAMOE_ERR_NULL_POINTER);
  CHECK_OK(megamoe_create(&cfg, ctx->comm, &layer));
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
  cudaFree(dummy);
  return MM_TEST_PASS;
}

/* The last rank skips a forward: the others' sync ends in a timeout (2 s),
 * and their layer refuses later forwards. */
static mm_test_result t_peer_timeout(const mm_rank_ctx* ctx) {
  lt_case c = lt_make(ctx, 256, 256, EXPERTS(ctx, 2), 2, 16, 15);
  c.cfg.timeout_s = 2.0;
  lt_data d;
  lt_device g;
  int bad = lt_build(&c, ctx->num_ranks, ctx->rank, &d) != 0;
  bad |= lt_upload(&c, &d, ctx->rank, &g) != 0;
  megamoe_layer* layer = NULL;
  if (megamoe_create(&c.cfg, ctx->comm, &layer) != MEGAMOE_OK) return MM_TEST_FAIL;
  megamoe_weights w = {g.w1, g.w1_sf, g.w2, g.w2_sf};
  bad |= megamoe_prepare_weights(layer, &w, ctx->stream) != MEGAMOE_OK;
  megamoe_forward_args a = lt_args(&c, &g, ctx->rank);
  const int silent = ctx->num_ranks - 1;
  if (ctx->rank != silent) {
    megamoe_status st = lt_forward(layer, ctx, &a, c.cfg.hidden);
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
  lt_device_free(&g);
  lt_free(&d);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

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
    {"graph: one capture replayed on 3 inputs", t_graph_replay, 1},
    {"errors: bad top-k index on the device", t_bad_topk_index, 1},
    {"errors: host-side argument checks", t_bad_arguments, 1},
    {"errors: a silent peer times out", t_peer_timeout, 2},
    {NULL, NULL, 0},
};
