/* One layer problem for the multi-rank GPU tests (layer_case.h). */
#include "layer_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "ref.h"
#include "ref_check.h"

lc_case lc_make(const mm_rank_ctx* ctx, int64_t H, int64_t I, int E, int K, int64_t T, uint64_t salt) {
  lc_case c;
  memset(&c, 0, sizeof c);
  c.cfg = megamoe_config_make(H, I, E, K, T > 0 ? T : 1);
  c.cfg.timeout_s = 20.0;
  c.cfg.arm = mm_test_arm();
  for (int r = 0; r < ctx->num_ranks; ++r) c.tokens[r] = T;
  c.one_expert = -1;
  c.one_rank = -1;
  c.seed = ctx->seed * 1000003u + salt;
  return c;
}

void lc_free(lc_data* d) {
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
  for (int64_t i = 0; i < n_sf; ++i) sf[i] = (float)((0.5 + mm_rng_uniform(g)) / 64.0 / sqrt((double)cols));
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

/* Top-k of T tokens: K distinct experts per token (from all E, or from the
 * E_l experts of rank one_rank), weights in [0.05, 1.05); then, with
 * repeat_expert, slots that share an expert (token t % 3 == 0: slot 1 takes
 * slot 0's expert; 1: slot K-1 does; 2: every slot does; the contract treats
 * each slot on its own); then each slot masked with probability mask_ratio;
 * with one_expert, slot 0 goes there and the rest are masked. A masked slot
 * is -1 with a NaN weight: nothing may read it. */
static int fill_routing(mm_rng* g, const lc_case* c, int El, int32_t* idx, float* w, int64_t T) {
  const int K = c->cfg.top_k;
  const int first = c->one_rank >= 0 ? c->one_rank * El : 0;
  const int choices = c->one_rank >= 0 ? El : c->cfg.num_experts;
  if (K > choices) {
    fprintf(stderr, "    fill_routing: K %d distinct experts out of %d\n", K, choices);
    return -1;
  }
  if (c->skew_experts > 0 && (c->one_rank >= 0 || c->skew_experts > c->cfg.num_experts ||
                              (c->skew_experts < K && !(c->skew_ratio < 1.0)))) {
    fprintf(stderr, "    fill_routing: skew over %d experts (ratio %g) with K %d\n", c->skew_experts, c->skew_ratio, K);
    return -1;
  }
  for (int64_t t = 0; t < T; ++t) {
    int32_t* ti = idx + t * K;
    float* tw = w + t * K;
    for (int k = 0; k < K; ++k) { /* distinct experts per token */
      int e;
      int fresh;
      do {
        if (c->skew_experts > 0 && mm_rng_uniform(g) < c->skew_ratio)
          e = (int)mm_rng_below(g, (uint64_t)c->skew_experts);
        else
          e = first + (int)mm_rng_below(g, (uint64_t)choices);
        fresh = 1;
        for (int j = 0; j < k; ++j) fresh &= ti[j] != e;
      } while (!fresh);
      ti[k] = e;
      tw[k] = (float)(0.05 + mm_rng_uniform(g));
    }
    if (c->repeat_expert && K >= 2) {
      if (t % 3 == 0) ti[1] = ti[0];
      else if (t % 3 == 1) ti[K - 1] = ti[0];
      else
        for (int k = 1; k < K; ++k) ti[k] = ti[0];
    }
    for (int k = 0; k < K; ++k)
      if (mm_rng_uniform(g) < c->mask_ratio) ti[k] = -1;
    if (c->one_expert >= 0)
      for (int k = 0; k < K; ++k) ti[k] = k == 0 ? c->one_expert : -1;
    for (int k = 0; k < K; ++k)
      if (ti[k] < 0) tw[k] = NAN;
  }
  return 0;
}

/* The reference for this rank's tokens only (a token depends on nothing
 * else), into d->y_ref, from d's weights and every rank's routing. */
static int lc_reference(const lc_case* c, lc_data* d, int rank) {
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

int lc_build(const lc_case* c, int R, int rank, lc_data* d) {
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
    if (fill_routing(&g, c, d->El, d->idx[r], d->w[r], T) != 0) return -1;
  }
  if (c->no_reference) return 0;
  d->y_ref = malloc(sizeof(uint16_t) * (size_t)(c->tokens[rank] * H) + 1);
  if (!d->y_ref) return -1;
  return lc_reference(c, d, rank);
}

void lc_device_free(lc_device* g) {
  void* ptrs[] = {g->w1, g->w2, g->w1_sf, g->w2_sf, g->x, g->x_sf, g->idx, g->w, g->y};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; ++i) cudaFree(ptrs[i]);
  memset(g, 0, sizeof *g);
}

static int upload(void** dst, const void* src, size_t bytes) {
  if (cudaMalloc(dst, bytes ? bytes : 16) != cudaSuccess) return -1;
  if (bytes && cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return -1;
  return 0;
}

int lc_upload(const lc_case* c, const lc_data* d, int rank, lc_device* g) {
  memset(g, 0, sizeof *g);
  const int64_t H = c->cfg.hidden, I = c->cfg.intermediate, K = c->cfg.top_k, El = d->El;
  const int64_t T = c->tokens[rank];
  int bad = 0;
  bad |= upload(&g->w1, d->w1 + rank * El * 2 * I * H, (size_t)(El * 2 * I * H));
  bad |= upload(&g->w1_sf, d->w1_sf + rank * El * (2 * I / 128) * (H / 128),
                sizeof(float) * (size_t)(El * (2 * I / 128) * (H / 128)));
  bad |= upload(&g->w2, d->w2 + rank * El * H * I, (size_t)(El * H * I));
  bad |= upload(&g->w2_sf, d->w2_sf + rank * El * (H / 128) * (I / 128),
                sizeof(float) * (size_t)(El * (H / 128) * (I / 128)));
  bad |= upload(&g->x, d->x[rank], (size_t)(T * H));
  bad |= upload(&g->x_sf, d->x_sf[rank], sizeof(float) * (size_t)(T * (H / 128)));
  bad |= upload(&g->w, d->w[rank], sizeof(float) * (size_t)(T * K));
  if (c->idx64) {
    int64_t* wide = malloc(sizeof(int64_t) * (size_t)(T * K) + 1);
    if (wide) {
      for (int64_t i = 0; i < T * K; ++i) wide[i] = d->idx[rank][i];
      bad |= upload(&g->idx, wide, sizeof(int64_t) * (size_t)(T * K));
    }
    bad |= !wide;
    free(wide);
  } else {
    bad |= upload(&g->idx, d->idx[rank], sizeof(int32_t) * (size_t)(T * K));
  }
  bad |= cudaMalloc(&g->y, sizeof(uint16_t) * (size_t)(T * H) + 16) != cudaSuccess;
  return bad ? -1 : 0;
}

megamoe_forward_args lc_args(const lc_case* c, const lc_device* g, int rank) {
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

/* Poisons y (0xFFFF is a bf16 NaN), runs one forward, syncs. When the poison
 * fails the forward still runs, empty (peers must not wait), and the call
 * reports the failure. */
megamoe_status lc_forward(megamoe_layer* layer, const mm_rank_ctx* ctx, const megamoe_forward_args* a, int64_t H) {
  megamoe_forward_args run = *a;
  int poison_failed = 0;
  if (a->num_tokens > 0 && cudaMemset(a->y, 0xFF, sizeof(uint16_t) * (size_t)(a->num_tokens * H)) != cudaSuccess) {
    poison_failed = 1;
    run.num_tokens = 0;
  }
  megamoe_status st = megamoe_forward(layer, &run, ctx->stream);
  megamoe_status st2 = megamoe_sync(layer, ctx->stream);
  if (poison_failed) return MEGAMOE_ERR_CUDA;
  return st != MEGAMOE_OK ? st : st2;
}

int64_t lc_count_differences(const uint16_t* want, const uint16_t* got, int64_t n, int64_t* first) {
  int64_t differ = 0;
  *first = -1;
  for (int64_t i = 0; i < n; ++i)
    if (want[i] != got[i]) {
      if (*first < 0) *first = i;
      differ++;
    }
  return differ;
}

int lc_poison(void* y, int64_t n) {
  return cudaMemset(y, 0xFF, sizeof(uint16_t) * (size_t)n + 16) == cudaSuccess ? 0 : -1;
}

int lc_still_poisoned(const void* y, int64_t n) {
  const size_t bytes = sizeof(uint16_t) * (size_t)n + 16;
  uint8_t* h = malloc(bytes);
  if (!h || cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    free(h);
    return 0;
  }
  int all = 1;
  for (size_t i = 0; i < bytes && all; ++i) all = h[i] == 0xFF;
  free(h);
  return all;
}

/* MEGAMOE_TEST_PLANT_BUG set (and not "0"): lc_compare plants a bug in
 * every output before it is checked (see the top of test_layer.c). */
static int lc_plant_bug(void) {
  const char* v = getenv("MEGAMOE_TEST_PLANT_BUG");
  return v && *v && strcmp(v, "0") != 0;
}

int lc_compare(const lc_case* c, const lc_data* d, int rank, uint16_t* y, const char* what) {
  const int64_t T = c->tokens[rank], H = c->cfg.hidden, K = c->cfg.top_k;
  if (lc_plant_bug() && T > 0) {
    /* The first token with a live slot loses its row; with none, a masked
     * token gets a nonzero element (either must fail). */
    int64_t victim = -1;
    for (int64_t t = 0; t < T && victim < 0; ++t)
      for (int k = 0; k < K; ++k)
        if (d->idx[rank][t * K + k] >= 0) victim = t;
    if (victim >= 0) memset(y + victim * H, 0, sizeof(uint16_t) * (size_t)H);
    else y[0] = 0x3F80; /* 1.0 */
  }
  ref_check_stats s;
  const int pass = ref_check_output(y, d->y_ref, T, H, d->idx[rank], K, NULL, &s);
  char label[192];
  snprintf(label, sizeof label, "    %s rank %d (%s H %lld I %lld K %d G %d)", what, rank,
           megamoe_arm_name(c->cfg.arm), (long long)H, (long long)c->cfg.intermediate, (int)K,
           (int)c->cfg.quant_group);
  ref_check_print(stdout, label, &s);
  fflush(stdout);
  if (!pass) {
    fprintf(stderr, "    %s rank %d: output check failed: %s", what, rank, ref_check_failure_name(s.first_failure));
    if (s.first_failure_token >= 0) fprintf(stderr, " at token %lld", (long long)s.first_failure_token);
    if (s.first_failure == REF_CHECK_NONFINITE)
      fprintf(stderr, " (%lld NaN/Inf elements: unwritten or bad)", (long long)s.nonfinite);
    fputc('\n', stderr);
  }
  return pass ? 0 : -1;
}

int lc_download(const void* y_dev, int64_t n, uint16_t* host) {
  return n == 0 ? 0 : cudaMemcpy(host, y_dev, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

int lc_check_output(const lc_case* c, const lc_data* d, int rank, const void* y_dev, const char* what) {
  const int64_t T = c->tokens[rank], H = c->cfg.hidden, K = c->cfg.top_k;
  if (T == 0) return 0;
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H));
  if (!y || lc_download(y_dev, T * H, y) != 0) {
    fprintf(stderr, "    %s rank %d: download of y failed\n", what, rank);
    free(y);
    return -1;
  }
  /* The per-token check of the layer tests (ref/ref_check.h, bounds set
   * from what the GPU measured), not a looser one of our own. */
  ref_check_stats stats;
  int rc = ref_check_output(y, d->y_ref, T, H, d->idx[rank], K, NULL, &stats) ? 0 : -1;
  if (rc != 0) {
    char line[512];
    ref_check_format(&stats, line, sizeof line);
    fprintf(stderr, "    %s rank %d: %s\n", what, rank, line);
  }
  free(y);
  return rc;
}
