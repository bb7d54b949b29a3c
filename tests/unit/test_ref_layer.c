/* The reference layer: hand-derived cases for the contract, a naive
 * per-slot re-implementation for the optimized code paths, an unquantized
 * float64 model for accuracy, and the argument checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/fuzz_check.h"
#include "ref.h"
#include "ref_internal.h"
#include "unit.h"

/* ---- problems ------------------------------------------------------------ */

/* A layer problem: weights of all E experts in one [E, ...] array (rank r's
 * experts are the slice r * E_l ...), tokens per rank. */
typedef struct problem {
  megamoe_config cfg;
  int num_ranks;
  int64_t tokens[MEGAMOE_MAX_RANKS];
  uint8_t* w1;  /* [E, 2I, H] */
  float* w1_sf; /* [E, 2I/128, H/128] */
  uint8_t* w2;  /* [E, H, I] */
  float* w2_sf; /* [E, H/128, I/128] */
  uint8_t* x[MEGAMOE_MAX_RANKS];
  float* x_sf[MEGAMOE_MAX_RANKS];
  int32_t* topk_idx[MEGAMOE_MAX_RANKS];
  float* topk_w[MEGAMOE_MAX_RANKS];
  uint16_t* y[MEGAMOE_MAX_RANKS];
} problem;

static int64_t w1_elems(const megamoe_config* c) { return 2 * c->intermediate * c->hidden; }
static int64_t w1_sf_elems(const megamoe_config* c) { return (2 * c->intermediate / 128) * (c->hidden / 128); }
static int64_t w2_elems(const megamoe_config* c) { return c->hidden * c->intermediate; }
static int64_t w2_sf_elems(const megamoe_config* c) { return (c->hidden / 128) * (c->intermediate / 128); }

static void problem_free(problem* p) {
  free(p->w1);
  free(p->w1_sf);
  free(p->w2);
  free(p->w2_sf);
  for (int r = 0; r < MEGAMOE_MAX_RANKS; ++r) {
    free(p->x[r]);
    free(p->x_sf[r]);
    free(p->topk_idx[r]);
    free(p->topk_w[r]);
    free(p->y[r]);
  }
  memset(p, 0, sizeof *p);
}

/* Allocates a zeroed problem; ranks with no tokens keep NULL token arrays.
 * y is poisoned with a NaN pattern so unwritten elements show. */
static int problem_alloc(problem* p, megamoe_config cfg, int num_ranks, const int64_t* tokens) {
  memset(p, 0, sizeof *p);
  p->cfg = cfg;
  p->num_ranks = num_ranks;
  const int64_t E = cfg.num_experts, H = cfg.hidden, K = cfg.top_k;
  p->w1 = calloc((size_t)(E * w1_elems(&cfg)), 1);
  p->w1_sf = calloc((size_t)(E * w1_sf_elems(&cfg)), sizeof(float));
  p->w2 = calloc((size_t)(E * w2_elems(&cfg)), 1);
  p->w2_sf = calloc((size_t)(E * w2_sf_elems(&cfg)), sizeof(float));
  if (!p->w1 || !p->w1_sf || !p->w2 || !p->w2_sf) return 0;
  for (int r = 0; r < num_ranks; ++r) {
    const int64_t T = tokens[r];
    p->tokens[r] = T;
    if (T == 0) continue;
    p->x[r] = calloc((size_t)(T * H), 1);
    p->x_sf[r] = calloc((size_t)(T * H / 128), sizeof(float));
    p->topk_idx[r] = calloc((size_t)(T * K), sizeof(int32_t));
    p->topk_w[r] = calloc((size_t)(T * K), sizeof(float));
    p->y[r] = malloc(sizeof(uint16_t) * (size_t)(T * H));
    if (!p->x[r] || !p->x_sf[r] || !p->topk_idx[r] || !p->topk_w[r] || !p->y[r]) return 0;
    for (int64_t i = 0; i < T * H; ++i) p->y[r][i] = 0x7FA5;
  }
  return 1;
}

static void problem_ranks(const problem* p, ref_rank_data* ranks) {
  const megamoe_config* c = &p->cfg;
  const int64_t local = c->num_experts / p->num_ranks;
  for (int r = 0; r < p->num_ranks; ++r) {
    ref_rank_data* d = &ranks[r];
    d->num_tokens = p->tokens[r];
    d->x = p->x[r];
    d->x_sf = p->x_sf[r];
    d->topk_idx = p->topk_idx[r];
    d->topk_w = p->topk_w[r];
    d->w1 = p->w1 + r * local * w1_elems(c);
    d->w1_sf = p->w1_sf + r * local * w1_sf_elems(c);
    d->w2 = p->w2 + r * local * w2_elems(c);
    d->w2_sf = p->w2_sf + r * local * w2_sf_elems(c);
    d->y = p->y[r];
  }
}

static megamoe_status problem_forward(const problem* p) {
  ref_rank_data ranks[MEGAMOE_MAX_RANKS];
  problem_ranks(p, ranks);
  return ref_layer_forward(&p->cfg, p->num_ranks, ranks);
}

/* Weight codes spread over the e4m3 range (some subnormal, some zero) with
 * per-block scales that differ, so a wrong scale index shows. */
static void problem_random_weights(problem* p, mm_rng* rng) {
  const megamoe_config* c = &p->cfg;
  const int64_t E = c->num_experts;
  for (int64_t i = 0; i < E * w1_elems(c); ++i) p->w1[i] = ref_e4m3_encode((float)(mm_rng_normal(rng) * 64.0));
  for (int64_t i = 0; i < E * w2_elems(c); ++i) p->w2[i] = ref_e4m3_encode((float)(mm_rng_normal(rng) * 64.0));
  const double w1_unit = 1.0 / (64.0 * sqrt((double)c->hidden));
  const double w2_unit = 1.0 / (64.0 * sqrt((double)c->intermediate));
  for (int64_t i = 0; i < E * w1_sf_elems(c); ++i) p->w1_sf[i] = (float)(w1_unit * (0.5 + mm_rng_uniform(rng)));
  for (int64_t i = 0; i < E * w2_sf_elems(c); ++i) p->w2_sf[i] = (float)(w2_unit * (0.5 + mm_rng_uniform(rng)));
}

/* Activations quantized per 128 channels from normal values; each token
 * routed to K distinct experts, each slot masked with mask_probability
 * (masked slots carry a NaN weight that must never be read). */
static void problem_random_tokens(problem* p, mm_rng* rng, double mask_probability) {
  const megamoe_config* c = &p->cfg;
  const int64_t H = c->hidden, K = c->top_k, E = c->num_experts;
  float values[128];
  for (int r = 0; r < p->num_ranks; ++r)
    for (int64_t t = 0; t < p->tokens[r]; ++t) {
      for (int64_t b = 0; b < H / 128; ++b) {
        for (int i = 0; i < 128; ++i) values[i] = (float)mm_rng_normal(rng);
        ref_quantize_group(values, 128, p->x[r] + t * H + b * 128, &p->x_sf[r][t * (H / 128) + b]);
      }
      for (int64_t k = 0; k < K; ++k) {
        int32_t e;
        int fresh;
        do {
          e = (int32_t)mm_rng_below(rng, (uint64_t)E);
          fresh = 1;
          for (int64_t j = 0; j < k; ++j) fresh &= p->topk_idx[r][t * K + j] != e;
        } while (!fresh);
        p->topk_idx[r][t * K + k] = e;
        p->topk_w[r][t * K + k] = (float)(0.05 + 0.95 * mm_rng_uniform(rng));
      }
      for (int64_t k = 0; k < K; ++k)
        if (mm_rng_uniform(rng) < mask_probability) {
          p->topk_idx[r][t * K + k] = -1;
          p->topk_w[r][t * K + k] = NAN;
        }
    }
}

static int problem_random(problem* p, megamoe_config cfg, int num_ranks, const int64_t* tokens,
                          mm_rng* rng, double mask_probability) {
  if (!problem_alloc(p, cfg, num_ranks, tokens)) return 0;
  problem_random_weights(p, rng);
  problem_random_tokens(p, rng, mask_probability);
  return 1;
}

/* ---- naive model: one (token, slot) at a time, straight from DESIGN.md --- */

/* e4m3 code -> value, from ref_e4m3_decode (tested on its own). */
static double decoded(uint8_t code) {
  static double table[256];
  static int ready = 0;
  if (!ready) {
    for (int v = 0; v < 256; ++v) table[v] = ref_e4m3_decode((uint8_t)v);
    ready = 1;
  }
  return table[code];
}

static void naive_token(const problem* p, int r, int64_t t, uint16_t* y) {
  const megamoe_config* c = &p->cfg;
  const int64_t H = c->hidden, I = c->intermediate, G = c->quant_group, K = c->top_k;
  float* h = malloc(sizeof(float) * (size_t)(2 * I));
  float* act = malloc(sizeof(float) * (size_t)I);
  uint8_t* q = malloc((size_t)I);
  float* q_sf = malloc(sizeof(float) * (size_t)(I / G));
  float* sum = calloc((size_t)H, sizeof(float));
  const uint8_t* x = p->x[r] + t * H;
  const float* x_sf = p->x_sf[r] + t * (H / 128);
  for (int64_t k = 0; k < K; ++k) {
    const int32_t e = p->topk_idx[r][t * K + k];
    if (e < 0) continue;
    const uint8_t* w1 = p->w1 + e * w1_elems(c);
    const float* w1_sf = p->w1_sf + e * w1_sf_elems(c);
    const uint8_t* w2 = p->w2 + e * w2_elems(c);
    const float* w2_sf = p->w2_sf + e * w2_sf_elems(c);
    for (int64_t n = 0; n < 2 * I; ++n) {
      double acc = 0.0;
      for (int64_t kb = 0; kb < H / 128; ++kb) {
        double s = 0.0;
        for (int64_t i = kb * 128; i < kb * 128 + 128; ++i)
          s += decoded(x[i]) * decoded(w1[n * H + i]);
        acc += ((double)x_sf[kb] * (double)w1_sf[(n / 128) * (H / 128) + kb]) * s;
      }
      h[n] = (float)acc;
    }
    for (int64_t j = 0; j < I; ++j) {
      float g = h[j], u = h[I + j];
      if (c->has_swiglu_clamp) {
        g = fminf(g, c->swiglu_clamp);
        u = fmaxf(fminf(u, c->swiglu_clamp), -c->swiglu_clamp);
      }
      const double silu = (double)g / (1.0 + exp(-(double)g));
      act[j] = (float)(silu * (double)u * (double)p->topk_w[r][t * K + k]);
    }
    for (int64_t b = 0; b < I / G; ++b) ref_quantize_group(act + b * G, (int)G, q + b * G, &q_sf[b]);
    for (int64_t n = 0; n < H; ++n) {
      double acc = 0.0;
      for (int64_t kb = 0; kb < I / G; ++kb) {
        double s = 0.0;
        for (int64_t i = kb * G; i < kb * G + G; ++i)
          s += decoded(q[i]) * decoded(w2[n * I + i]);
        acc += ((double)q_sf[kb] * (double)w2_sf[(n / 128) * (I / 128) + (kb * G) / 128]) * s;
      }
      sum[n] += ref_bf16_decode(ref_bf16_encode((float)acc));
    }
  }
  for (int64_t n = 0; n < H; ++n) y[n] = ref_bf16_encode(sum[n]);
  free(h);
  free(act);
  free(q);
  free(q_sf);
  free(sum);
}

/* ref_layer_forward's y (already in p) against the naive model, bitwise. */
static mm_test_result check_against_naive(const problem* p) {
  const int64_t H = p->cfg.hidden;
  uint16_t* want = malloc(sizeof(uint16_t) * (size_t)H);
  CHECK(want != NULL);
  for (int r = 0; r < p->num_ranks; ++r)
    for (int64_t t = 0; t < p->tokens[r]; ++t) {
      naive_token(p, r, t, want);
      for (int64_t n = 0; n < H; ++n) {
        const uint16_t got = p->y[r][t * H + n];
        if (got != want[n]) {
          fprintf(stderr, "    rank %d token %lld column %lld: y 0x%04X (%g), naive 0x%04X (%g)\n", r,
                  (long long)t, (long long)n, got, ref_bf16_decode(got), want[n], ref_bf16_decode(want[n]));
          free(want);
          return MM_TEST_FAIL;
        }
      }
    }
  free(want);
  return MM_TEST_PASS;
}

/* ---- hand-derived cases -------------------------------------------------- */

static void set_w1(problem* p, int e, int64_t row, int64_t col, float v) {
  p->w1[e * w1_elems(&p->cfg) + row * p->cfg.hidden + col] = ref_e4m3_encode(v);
}

static void set_w2(problem* p, int e, int64_t row, int64_t col, float v) {
  p->w2[e * w2_elems(&p->cfg) + row * p->cfg.intermediate + col] = ref_e4m3_encode(v);
}

static void set_token(problem* p, int r, int64_t t, float x0, float x1, float x_sf) {
  const int64_t H = p->cfg.hidden;
  p->x[r][t * H + 0] = ref_e4m3_encode(x0);
  p->x[r][t * H + 1] = ref_e4m3_encode(x1);
  p->x_sf[r][t * (H / 128)] = x_sf;
}

static void set_slots(problem* p, int r, int64_t t, int32_t e0, float w0, int32_t e1, float w1) {
  const int64_t K = p->cfg.top_k;
  p->topk_idx[r][t * K] = e0;
  p->topk_w[r][t * K] = w0;
  p->topk_idx[r][t * K + 1] = e1;
  p->topk_w[r][t * K + 1] = w1;
}

/* The column pattern of W2 (and so of every output row). */
static const float column_factor[4] = {1.0f, 2.0f, 0.5f, -1.0f};

/* H = I = 128, E = 2, K = 2, two ranks (one expert each), G = 128.
 * Only channels 0 and 1 of x are nonzero, so in L1 (all scales below are
 * exact and every block sum holds one or two products):
 *   expert 0 (w1_sf 1):   gate rows n < 128: W1[n, 0] = 8,  W1[n, 1] = 0
 *                         up rows n >= 128:  W1[n, 0] = 0,  W1[n, 1] = -1
 *   expert 1 (w1_sf 0.5): gate W1[n, 0] = 16; up W1[n, 1] = -2
 * A token with (x0, x1) = (8, 7), x_sf 1 gives g = 64, u = -7 on expert 0
 * and g = 0.5 * 8 * 16 = 64, u = 0.5 * 7 * -2 = -7 on expert 1.
 * silu(64) = 64 / (1 + e^-64) = 64 exactly in double (e^-64 < 2^-53), so
 * a = 64 * -7 * w = -448 w in every column j. The group's amax is 448 w,
 * sf = 448 w / 448 = w (exact for the w below), q = -448 = 0xFE everywhere.
 * (Gate and up swapped would give silu(-7) * 64 * w, about -0.4 w.)
 * L2: W2[e, n, 0] = c[n % 4], other columns 0; w2_sf = 1 (expert 0), 2
 * (expert 1): o[n] = sf * w2_sf * (-448 * c) = -448 w w2_sf c.
 * Tokens (y in units of c[n % 4]):
 *   rank 0 t0: (8, 7) x_sf 1, slots (e0, 1/64), (e1, 1/64):   -7 + -14 = -21
 *   rank 0 t1: (8, 7) x_sf 1, slots (-1), (e0, 1/32):          -14
 *   rank 0 t2: all slots masked:                                0
 *   rank 1 t0: (16, 14) x_sf 0.5 (same g, u), slots (e1, 1/64), (e0, 1/16):
 *              -14 + -28 = -42
 * Every expected value (21, 14, 42 times 1, 2, 0.5, -1) is exact in bf16. */
static mm_test_result test_layer_hand_case(void) {
  megamoe_config cfg = megamoe_config_make(128, 128, 2, 2, 4);
  const int64_t tokens[2] = {3, 1};
  problem p;
  CHECK(problem_alloc(&p, cfg, 2, tokens));
  for (int64_t n = 0; n < 128; ++n) {
    set_w1(&p, 0, n, 0, 8.0f);
    set_w1(&p, 0, 128 + n, 1, -1.0f);
    set_w1(&p, 1, n, 0, 16.0f);
    set_w1(&p, 1, 128 + n, 1, -2.0f);
    set_w2(&p, 0, n, 0, column_factor[n % 4]);
    set_w2(&p, 1, n, 0, column_factor[n % 4]);
  }
  p.w1_sf[0] = p.w1_sf[1] = 1.0f;   /* expert 0: gate block, up block */
  p.w1_sf[2] = p.w1_sf[3] = 0.5f;   /* expert 1 */
  p.w2_sf[0] = 1.0f;
  p.w2_sf[1] = 2.0f;
  set_token(&p, 0, 0, 8.0f, 7.0f, 1.0f);
  set_slots(&p, 0, 0, 0, 1.0f / 64, 1, 1.0f / 64);
  set_token(&p, 0, 1, 8.0f, 7.0f, 1.0f);
  set_slots(&p, 0, 1, -1, NAN, 0, 1.0f / 32);
  set_token(&p, 0, 2, 8.0f, 7.0f, 1.0f);
  set_slots(&p, 0, 2, -1, NAN, -1, NAN);
  set_token(&p, 1, 0, 16.0f, 14.0f, 0.5f);
  set_slots(&p, 1, 0, 1, 1.0f / 64, 0, 1.0f / 16);

  CHECK_OK(problem_forward(&p));
  const struct {
    int rank;
    int64_t token;
    float units;
  } want[] = {{0, 0, -21.0f}, {0, 1, -14.0f}, {0, 2, 0.0f}, {1, 0, -42.0f}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i)
    for (int64_t n = 0; n < 128; ++n) {
      const uint16_t got = p.y[want[i].rank][want[i].token * 128 + n];
      const float expect = want[i].units * column_factor[n % 4] + 0.0f; /* +0 for the masked token */
      CHECK_MSG(got == ref_bf16_encode(expect), "rank %d token %lld column %lld: %g, want %g",
                want[i].rank, (long long)want[i].token, (long long)n, ref_bf16_decode(got), expect);
    }
  problem_free(&p);
  return MM_TEST_PASS;
}

/* The clamp, same shapes, one rank, K = 2 (slot 1 masked), clamp c = 56:
 * expert 0 gate W1[n, 0] = 8, up W1[n, 1] = 8; token (x0, x1) = (8, -8):
 * g = 64 -> min(64, 56) = 56, u = -64 -> clamp to -56. silu(56) = 56 exactly
 * (e^-56 < 2^-53). w = 1/32: a = 56 * -56 / 32 = -98, sf = 98 / 448 = 7/32
 * (exact), q = -448. W2[n, 0] = c[n % 4], w2_sf 1: o = -98 * c.
 * Without the clamp: a = -128, sf = 2/7 (inexact): a different answer. */
static mm_test_result test_layer_hand_clamp(void) {
  megamoe_config cfg = megamoe_config_make(128, 128, 2, 2, 2);
  cfg.has_swiglu_clamp = 1;
  cfg.swiglu_clamp = 56.0f;
  const int64_t tokens[1] = {1};
  problem p;
  CHECK(problem_alloc(&p, cfg, 1, tokens));
  for (int64_t n = 0; n < 128; ++n) {
    set_w1(&p, 0, n, 0, 8.0f);
    set_w1(&p, 0, 128 + n, 1, 8.0f);
    set_w2(&p, 0, n, 0, column_factor[n % 4]);
  }
  p.w1_sf[0] = p.w1_sf[1] = 1.0f;
  p.w2_sf[0] = 1.0f;
  set_token(&p, 0, 0, 8.0f, -8.0f, 1.0f);
  set_slots(&p, 0, 0, 0, 1.0f / 32, -1, NAN);
  CHECK_OK(problem_forward(&p));
  for (int64_t n = 0; n < 128; ++n)
    CHECK_MSG(p.y[0][n] == ref_bf16_encode(-98.0f * column_factor[n % 4]), "column %lld: %g", (long long)n,
              ref_bf16_decode(p.y[0][n]));
  /* The same token without the clamp differs. */
  p.cfg.has_swiglu_clamp = 0;
  CHECK_OK(problem_forward(&p));
  CHECK(p.y[0][0] != ref_bf16_encode(-98.0f));
  problem_free(&p);
  return MM_TEST_PASS;
}

/* Slot order of the combine. H = I = 128, E = 3, K = 3, one rank; every
 * expert has gate W1[n, 0] = 8, up W1[n, 1] = -1, so token (8, 7) with
 * w = 1/64 gives a = -7, sf = 2^-6, q = -448 (as in hand_case) and
 * o = -7 * w2_sf * W2[n, 0]. With W2[n, 0] = -1, -1, 1 and w2_sf = 2^24/7,
 * 1/7, 2^24/7 (rounded to float; the bf16 rounding of o absorbs that):
 *   o(e0) = 2^24, o(e1) = 1, o(e2) = -2^24.
 * In float, 2^24 + 1 is a tie that rounds to 2^24, so the sum depends on
 * the order: slots (e0, e1, e2): (2^24 + 1) - 2^24 = 0;
 *            slots (e0, e2, e1): (2^24 - 2^24) + 1 = 1;
 *            slots (e2, e1, e0): (-2^24 + 1) + 2^24 = 1 (exact). */
static mm_test_result test_layer_combine_slot_order(void) {
  megamoe_config cfg = megamoe_config_make(128, 128, 3, 3, 3);
  const int64_t tokens[1] = {3};
  problem p;
  CHECK(problem_alloc(&p, cfg, 1, tokens));
  const float w2_value[3] = {-1.0f, -1.0f, 1.0f};
  const float w2_scale[3] = {16777216.0f / 7.0f, 1.0f / 7.0f, 16777216.0f / 7.0f};
  for (int e = 0; e < 3; ++e) {
    for (int64_t n = 0; n < 128; ++n) {
      set_w1(&p, e, n, 0, 8.0f);
      set_w1(&p, e, 128 + n, 1, -1.0f);
      set_w2(&p, e, n, 0, w2_value[e]);
    }
    p.w1_sf[2 * e] = p.w1_sf[2 * e + 1] = 1.0f;
    p.w2_sf[e] = w2_scale[e];
  }
  const int32_t order[3][3] = {{0, 1, 2}, {0, 2, 1}, {2, 1, 0}};
  const float want[3] = {0.0f, 1.0f, 1.0f};
  for (int t = 0; t < 3; ++t) {
    set_token(&p, 0, t, 8.0f, 7.0f, 1.0f);
    for (int k = 0; k < 3; ++k) {
      p.topk_idx[0][t * 3 + k] = order[t][k];
      p.topk_w[0][t * 3 + k] = 1.0f / 64;
    }
  }
  CHECK_OK(problem_forward(&p));
  for (int t = 0; t < 3; ++t)
    for (int64_t n = 0; n < 128; ++n)
      CHECK_MSG(p.y[0][t * 128 + n] == ref_bf16_encode(want[t]), "token %d column %lld: %g, want %g", t,
                (long long)n, ref_bf16_decode(p.y[0][t * 128 + n]), want[t]);
  problem_free(&p);
  return MM_TEST_PASS;
}

/* L1 accumulates the K blocks in double. H = 384 (three K blocks), I = 128,
 * E = K = 1. x = 256 at channels 0 and 256, 1 at channel 128, x_sf =
 * (256, 1, 256), w1_sf 1. Gate rows: W1[n, 0] = 256, W1[n, 128] = 1,
 * W1[n, 256] = -256, so the block terms are 2^24, 1, -2^24: in double
 * g = 1 (in float 2^24 + 1 would round to 2^24 and g = 0). Up rows:
 * W1[n, 128] = 7, u = 7. With w = 1, a = silu(1) * 7 in every column, one
 * group: sf = fl(a / 448), q = 448, and with W2[n, 0] = c[n % 4], w2_sf 1:
 * o = bf16(fl(sf * 448 * c)). */
static mm_test_result test_layer_l1_blocks_in_double(void) {
  megamoe_config cfg = megamoe_config_make(384, 128, 1, 1, 1);
  const int64_t tokens[1] = {1};
  problem p;
  CHECK(problem_alloc(&p, cfg, 1, tokens));
  p.x[0][0] = ref_e4m3_encode(256.0f);
  p.x[0][128] = ref_e4m3_encode(1.0f);
  p.x[0][256] = ref_e4m3_encode(256.0f);
  p.x_sf[0][0] = 256.0f;
  p.x_sf[0][1] = 1.0f;
  p.x_sf[0][2] = 256.0f;
  for (int64_t n = 0; n < 128; ++n) {
    set_w1(&p, 0, n, 0, 256.0f);
    set_w1(&p, 0, n, 128, 1.0f);
    set_w1(&p, 0, n, 256, -256.0f);
    set_w1(&p, 0, 128 + n, 128, 7.0f);
    set_w2(&p, 0, n, 0, column_factor[n % 4]);
  }
  for (int i = 0; i < 6; ++i) p.w1_sf[i] = 1.0f;
  p.w2_sf[0] = p.w2_sf[1] = p.w2_sf[2] = 1.0f;
  p.topk_idx[0][0] = 0;
  p.topk_w[0][0] = 1.0f;
  CHECK_OK(problem_forward(&p));
  const float a = (float)(1.0 / (1.0 + exp(-1.0)) * 7.0);
  const float sf = a / 448.0f;
  CHECK_EQ_INT(ref_e4m3_encode(a / sf), 0x7E);
  for (int64_t n = 0; n < 128; ++n) {
    const float o = (float)((double)sf * (448.0 * column_factor[n % 4]));
    CHECK_MSG(p.y[0][n] == ref_bf16_encode(o), "column %lld: %g, want %g", (long long)n,
              ref_bf16_decode(p.y[0][n]), o);
  }
  problem_free(&p);
  return MM_TEST_PASS;
}

/* ---- random cases against the naive model --------------------------------- */

static mm_test_result test_layer_matches_naive(void) {
  mm_rng rng = unit_rng(20);
  struct {
    int64_t hidden, intermediate;
    int32_t experts, top_k, group, ranks;
    float clamp;
    int64_t tokens[MEGAMOE_MAX_RANKS];
  } cases[] = {
      {256, 256, 8, 2, 128, 2, 0.0f, {13, 7}},
      {128, 384, 6, 3, 64, 3, 3.0f, {5, 0, 9}},
      {384, 128, 4, 4, 64, 1, 0.0f, {21}},
      {256, 256, 16, 6, 128, 8, 5.0f, {3, 1, 4, 1, 5, 9, 2, 6}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    int64_t t_max = 1;
    for (int r = 0; r < cases[i].ranks; ++r) t_max = cases[i].tokens[r] > t_max ? cases[i].tokens[r] : t_max;
    megamoe_config cfg = megamoe_config_make(cases[i].hidden, cases[i].intermediate, cases[i].experts,
                                             cases[i].top_k, t_max);
    cfg.quant_group = cases[i].group;
    cfg.has_swiglu_clamp = cases[i].clamp > 0.0f;
    cfg.swiglu_clamp = cases[i].clamp;
    problem p;
    CHECK(problem_random(&p, cfg, cases[i].ranks, cases[i].tokens, &rng, 0.2));
    CHECK_OK(problem_forward(&p));
    if (check_against_naive(&p) != MM_TEST_PASS) {
      fprintf(stderr, "    case %zu\n", i);
      return MM_TEST_FAIL;
    }
    problem_free(&p);
  }
  return MM_TEST_PASS;
}

/* Unquantized float64 model of the same layer (no e4m3 on the L1 output, no
 * bf16 roundings): the reference must agree to diff < 0.01 (the GPU's
 * acceptance threshold), and far better in practice. */
static mm_test_result test_layer_accuracy_vs_float64(void) {
  mm_rng rng = unit_rng(21);
  megamoe_config cfg = megamoe_config_make(256, 256, 4, 2, 24);
  cfg.quant_group = 64;
  const int64_t tokens[2] = {24, 17};
  problem p;
  CHECK(problem_random(&p, cfg, 2, tokens, &rng, 0.1));
  CHECK_OK(problem_forward(&p));
  const int64_t H = 256, I = 256, K = 2;
  double* h = malloc(sizeof(double) * 2 * I);
  double* act = malloc(sizeof(double) * I);
  float* got = malloc(sizeof(float) * (size_t)(41 * H));
  float* want = malloc(sizeof(float) * (size_t)(41 * H));
  CHECK(h && act && got && want);
  int64_t row = 0;
  for (int r = 0; r < 2; ++r)
    for (int64_t t = 0; t < tokens[r]; ++t, ++row) {
      double y[256] = {0};
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = p.topk_idx[r][t * K + k];
        if (e < 0) continue;
        for (int64_t n = 0; n < 2 * I; ++n) {
          h[n] = 0.0;
          for (int64_t i = 0; i < H; ++i)
            h[n] += decoded(p.x[r][t * H + i]) * p.x_sf[r][t * (H / 128) + i / 128] *
                    decoded(p.w1[e * w1_elems(&cfg) + n * H + i]) *
                    p.w1_sf[e * w1_sf_elems(&cfg) + (n / 128) * (H / 128) + i / 128];
        }
        for (int64_t j = 0; j < I; ++j)
          act[j] = h[j] / (1.0 + exp(-h[j])) * h[I + j] * p.topk_w[r][t * K + k];
        for (int64_t n = 0; n < H; ++n)
          for (int64_t j = 0; j < I; ++j)
            y[n] += act[j] * decoded(p.w2[e * w2_elems(&cfg) + n * I + j]) *
                    p.w2_sf[e * w2_sf_elems(&cfg) + (n / 128) * (I / 128) + j / 128];
      }
      for (int64_t n = 0; n < H; ++n) {
        want[row * H + n] = (float)y[n];
        got[row * H + n] = ref_bf16_decode(p.y[r][t * H + n]);
      }
    }
  const double d = ref_diff(got, want, (size_t)(row * H));
  printf("    diff vs unquantized float64: %.3g\n", d);
  CHECK_MSG(d < 0.01, "diff %g", d);
  /* A nonzero result: the comparison saw real values. */
  double energy = 0.0;
  for (int64_t i = 0; i < row * H; ++i) energy += (double)want[i] * want[i];
  CHECK(energy > 0.0);
  free(h);
  free(act);
  free(got);
  free(want);
  problem_free(&p);
  return MM_TEST_PASS;
}

/* K = 4 with exactly two slots of each token masked (random positions, NaN
 * weights) equals the K = 2 problem holding just the live slots, bitwise. */
static mm_test_result test_layer_masked_slots(void) {
  mm_rng rng = unit_rng(22);
  megamoe_config cfg4 = megamoe_config_make(256, 128, 8, 4, 16);
  megamoe_config cfg2 = cfg4;
  cfg2.top_k = 2;
  const int64_t tokens[2] = {16, 11};
  problem p4, p2;
  CHECK(problem_random(&p4, cfg4, 2, tokens, &rng, 0.0));
  CHECK(problem_alloc(&p2, cfg2, 2, tokens));
  memcpy(p2.w1, p4.w1, (size_t)(8 * w1_elems(&cfg4)));
  memcpy(p2.w1_sf, p4.w1_sf, sizeof(float) * (size_t)(8 * w1_sf_elems(&cfg4)));
  memcpy(p2.w2, p4.w2, (size_t)(8 * w2_elems(&cfg4)));
  memcpy(p2.w2_sf, p4.w2_sf, sizeof(float) * (size_t)(8 * w2_sf_elems(&cfg4)));
  for (int r = 0; r < 2; ++r) {
    memcpy(p2.x[r], p4.x[r], (size_t)(tokens[r] * 256));
    memcpy(p2.x_sf[r], p4.x_sf[r], sizeof(float) * (size_t)(tokens[r] * 2));
    for (int64_t t = 0; t < tokens[r]; ++t) {
      /* Mask two distinct random slots; the live ones keep their order. */
      const int a = (int)mm_rng_below(&rng, 4);
      const int b = (a + 1 + (int)mm_rng_below(&rng, 3)) % 4;
      int live = 0;
      for (int k = 0; k < 4; ++k) {
        if (k == a || k == b) {
          p4.topk_idx[r][t * 4 + k] = -1;
          p4.topk_w[r][t * 4 + k] = NAN;
        } else {
          p2.topk_idx[r][t * 2 + live] = p4.topk_idx[r][t * 4 + k];
          p2.topk_w[r][t * 2 + live] = p4.topk_w[r][t * 4 + k];
          ++live;
        }
      }
    }
  }
  CHECK_OK(problem_forward(&p4));
  CHECK_OK(problem_forward(&p2));
  for (int r = 0; r < 2; ++r)
    CHECK_MSG(memcmp(p4.y[r], p2.y[r], sizeof(uint16_t) * (size_t)(tokens[r] * 256)) == 0, "rank %d", r);
  /* And the K = 4 result is the naive model's. */
  if (check_against_naive(&p4) != MM_TEST_PASS) return MM_TEST_FAIL;
  problem_free(&p4);
  problem_free(&p2);
  return MM_TEST_PASS;
}

static mm_test_result test_layer_all_masked_token(void) {
  mm_rng rng = unit_rng(23);
  megamoe_config cfg = megamoe_config_make(128, 256, 4, 3, 9);
  const int64_t tokens[2] = {9, 5};
  problem p;
  CHECK(problem_random(&p, cfg, 2, tokens, &rng, 0.1));
  const int64_t dead[][2] = {{0, 0}, {0, 8}, {1, 3}};
  for (size_t i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k) {
      p.topk_idx[dead[i][0]][dead[i][1] * 3 + k] = -1;
      p.topk_w[dead[i][0]][dead[i][1] * 3 + k] = NAN;
    }
  CHECK_OK(problem_forward(&p));
  for (size_t i = 0; i < 3; ++i)
    for (int64_t n = 0; n < 128; ++n)
      CHECK_MSG(p.y[dead[i][0]][dead[i][1] * 128 + n] == 0x0000, "rank %lld token %lld column %lld: 0x%04X",
                (long long)dead[i][0], (long long)dead[i][1], (long long)n, p.y[dead[i][0]][dead[i][1] * 128 + n]);
  if (check_against_naive(&p) != MM_TEST_PASS) return MM_TEST_FAIL;
  problem_free(&p);
  return MM_TEST_PASS;
}

/* Every token of every rank on one expert (the last rank's last): one long
 * expert, many row blocks plus padding. */
static mm_test_result test_layer_one_expert(void) {
  mm_rng rng = unit_rng(24);
  megamoe_config cfg = megamoe_config_make(256, 128, 6, 1, 50);
  const int64_t tokens[3] = {47, 50, 2};
  problem p;
  CHECK(problem_random(&p, cfg, 3, tokens, &rng, 0.0));
  for (int r = 0; r < 3; ++r)
    for (int64_t t = 0; t < tokens[r]; ++t) p.topk_idx[r][t] = 5;
  CHECK_OK(problem_forward(&p));
  if (check_against_naive(&p) != MM_TEST_PASS) return MM_TEST_FAIL;
  problem_free(&p);
  return MM_TEST_PASS;
}

/* A rank with no tokens passes NULL token pointers; its experts still serve
 * the other ranks. All ranks empty works too. */
static mm_test_result test_layer_empty_rank(void) {
  mm_rng rng = unit_rng(25);
  megamoe_config cfg = megamoe_config_make(128, 128, 4, 2, 12);
  const int64_t tokens[2] = {0, 12};
  problem p;
  CHECK(problem_random(&p, cfg, 2, tokens, &rng, 0.1));
  CHECK(p.x[0] == NULL && p.y[0] == NULL && p.topk_idx[0] == NULL);
  for (int64_t t = 0; t < 12; ++t) p.topk_idx[1][t * 2] = (int32_t)(t % 2); /* rank 0's experts */
  CHECK_OK(problem_forward(&p));
  if (check_against_naive(&p) != MM_TEST_PASS) return MM_TEST_FAIL;
  problem_free(&p);

  const int64_t none[2] = {0, 0};
  CHECK(problem_random(&p, cfg, 2, none, &rng, 0.0));
  CHECK_OK(problem_forward(&p));
  problem_free(&p);
  return MM_TEST_PASS;
}

/* The same global weights and tokens split over 4 ranks or held by 1 give
 * the same y, bitwise. */
static mm_test_result test_layer_rank_split_invariance(void) {
  mm_rng rng = unit_rng(26);
  megamoe_config cfg4 = megamoe_config_make(256, 256, 8, 3, 20);
  cfg4.quant_group = 64;
  cfg4.has_swiglu_clamp = 1;
  cfg4.swiglu_clamp = 4.0f;
  const int64_t tokens4[4] = {20, 0, 7, 13};
  problem p4, p1;
  CHECK(problem_random(&p4, cfg4, 4, tokens4, &rng, 0.15));
  megamoe_config cfg1 = cfg4;
  cfg1.max_tokens_per_rank = 40;
  const int64_t tokens1[1] = {40};
  CHECK(problem_alloc(&p1, cfg1, 1, tokens1));
  memcpy(p1.w1, p4.w1, (size_t)(8 * w1_elems(&cfg4)));
  memcpy(p1.w1_sf, p4.w1_sf, sizeof(float) * (size_t)(8 * w1_sf_elems(&cfg4)));
  memcpy(p1.w2, p4.w2, (size_t)(8 * w2_elems(&cfg4)));
  memcpy(p1.w2_sf, p4.w2_sf, sizeof(float) * (size_t)(8 * w2_sf_elems(&cfg4)));
  int64_t base = 0;
  for (int r = 0; r < 4; ++r) {
    const int64_t T = tokens4[r];
    if (T == 0) continue;
    memcpy(p1.x[0] + base * 256, p4.x[r], (size_t)(T * 256));
    memcpy(p1.x_sf[0] + base * 2, p4.x_sf[r], sizeof(float) * (size_t)(T * 2));
    memcpy(p1.topk_idx[0] + base * 3, p4.topk_idx[r], sizeof(int32_t) * (size_t)(T * 3));
    memcpy(p1.topk_w[0] + base * 3, p4.topk_w[r], sizeof(float) * (size_t)(T * 3));
    base += T;
  }
  CHECK_OK(problem_forward(&p4));
  CHECK_OK(problem_forward(&p1));
  base = 0;
  for (int r = 0; r < 4; ++r) {
    const int64_t T = tokens4[r];
    for (int64_t i = 0; i < T * 256; ++i)
      CHECK_MSG(p4.y[r][i] == p1.y[0][base * 256 + i], "rank %d element %lld: 0x%04X vs 0x%04X", r,
                (long long)i, p4.y[r][i], p1.y[0][base * 256 + i]);
    base += T;
  }
  problem_free(&p4);
  problem_free(&p1);
  return MM_TEST_PASS;
}

/* The portable and the AVX2 build of the block sums give the same y. */
static mm_test_result test_layer_vector_paths_agree(void) {
  if (!ref_vector_path_available()) {
    printf("    no AVX2 path on this CPU or build\n");
    return MM_TEST_SKIP;
  }
  mm_rng rng = unit_rng(28);
  megamoe_config cfg = megamoe_config_make(384, 256, 8, 3, 30);
  cfg.quant_group = 64;
  const int64_t tokens[2] = {30, 19};
  problem p;
  CHECK(problem_random(&p, cfg, 2, tokens, &rng, 0.1));
  CHECK_OK(problem_forward(&p));
  uint16_t* vector_y[2];
  for (int r = 0; r < 2; ++r) {
    vector_y[r] = malloc(sizeof(uint16_t) * (size_t)(tokens[r] * 384));
    CHECK(vector_y[r] != NULL);
    memcpy(vector_y[r], p.y[r], sizeof(uint16_t) * (size_t)(tokens[r] * 384));
  }
  const int previous = ref_set_vector_path(0);
  const megamoe_status status = problem_forward(&p);
  ref_set_vector_path(previous);
  CHECK_OK(status);
  for (int r = 0; r < 2; ++r) {
    CHECK_MSG(memcmp(vector_y[r], p.y[r], sizeof(uint16_t) * (size_t)(tokens[r] * 384)) == 0, "rank %d", r);
    free(vector_y[r]);
  }
  problem_free(&p);
  return MM_TEST_PASS;
}

/* ---- non-finite inputs ------------------------------------------------------
 * The contract the header documents and the GPU fuzz holds the kernels to
 * (tests/gpu/fuzz_check.h): a NaN in a token's x, x_sf or a live slot's
 * weight makes its row NaN and changes no other row, bitwise; so does an Inf
 * routing weight, and an Inf scale without the clamp; a NaN weight scale
 * reaches exactly the tokens routed to that expert (W2's: one 128-column
 * block). Shown here on the reference, with and without the clamp, at both
 * quantization groups. */
static int judge_problem(const problem* p, uint16_t* const* clean, fz_row_expect* const* ex, const char* what) {
  for (int r = 0; r < p->num_ranks; ++r) {
    char why[512] = "";
    const int64_t bad = fz_judge_rows(p->y[r], clean[r], p->y[r], p->topk_idx[r], p->cfg.top_k, p->tokens[r],
                                      p->cfg.hidden, ex[r], why, sizeof why);
    if (bad >= 0) {
      fprintf(stderr, "    %s: rank %d token %lld: %s\n", what, r, (long long)bad, why);
      return 0;
    }
  }
  return 1;
}

static mm_test_result test_layer_nonfinite_rows(void) {
  mm_rng rng = unit_rng(31);
  for (int variant = 0; variant < 4; ++variant) {
    const int clamp = variant & 1;
    megamoe_config cfg = megamoe_config_make(256, 256, 4, 2, 12);
    cfg.quant_group = variant & 2 ? 64 : 128;
    cfg.has_swiglu_clamp = clamp;
    cfg.swiglu_clamp = 0.5f; /* small: it bites on most columns */
    const int64_t tokens[2] = {12, 12}, H = cfg.hidden, K = cfg.top_k;
    problem p;
    CHECK(problem_random(&p, cfg, 2, tokens, &rng, 0.3));
    /* Token 0 of each rank has every slot masked. */
    for (int r = 0; r < 2; ++r)
      for (int64_t k = 0; k < K; ++k) p.topk_idx[r][k] = -1;
    CHECK_OK(problem_forward(&p));
    uint16_t* clean[2];
    fz_row_expect* ex[2];
    for (int r = 0; r < 2; ++r) {
      clean[r] = malloc(sizeof(uint16_t) * (size_t)(tokens[r] * H));
      ex[r] = calloc((size_t)tokens[r], sizeof(fz_row_expect));
      CHECK(clean[r] && ex[r]);
      memcpy(clean[r], p.y[r], sizeof(uint16_t) * (size_t)(tokens[r] * H));
    }
    /* Every poison on a token with live slots, on the all-masked token, on a masked slot. */
    for (int poison = 0; poison < FZ_POISON_COUNT; ++poison)
      for (int64_t t = 0; t < 3; ++t) {
        const int r = (int)(t % 2);
        uint8_t* x = malloc((size_t)(tokens[r] * H));
        float* x_sf = malloc(sizeof(float) * (size_t)(tokens[r] * H / 128));
        float* w = malloc(sizeof(float) * (size_t)(tokens[r] * K));
        CHECK(x && x_sf && w);
        memcpy(x, p.x[r], (size_t)(tokens[r] * H));
        memcpy(x_sf, p.x_sf[r], sizeof(float) * (size_t)(tokens[r] * H / 128));
        memcpy(w, p.topk_w[r], sizeof(float) * (size_t)(tokens[r] * K));
        const uint64_t where = mm_rng_next(&rng);
        ex[r][t] = fz_poison_token((fz_poison)poison, t, where, (int)(where & 1), clamp, p.x[r], p.x_sf[r],
                                   p.topk_idx[r], p.topk_w[r], H, K);
        CHECK_OK(problem_forward(&p));
        char what[128];
        snprintf(what, sizeof what, "%s, token %lld, G %d, clamp %d", fz_poison_name[poison], (long long)t,
                 cfg.quant_group, clamp);
        CHECK(judge_problem(&p, clean, ex, what));
        if (ex[r][t].kind == FZ_ROW_NAN) { /* not the same as the clean row: the poison took */
          CHECK(fz_bf16_nan(p.y[r][t * H]) && !fz_bf16_nan(clean[r][t * H]));
        }
        memcpy(p.x[r], x, (size_t)(tokens[r] * H));
        memcpy(p.x_sf[r], x_sf, sizeof(float) * (size_t)(tokens[r] * H / 128));
        memcpy(p.topk_w[r], w, sizeof(float) * (size_t)(tokens[r] * K));
        ex[r][t].kind = FZ_ROW_SAME;
        free(x);
        free(x_sf);
        free(w);
      }
    /* A non-finite weight scale: W1's of expert 1 (a gate block, then an up
     * block), W2's of expert 2 at output block 1. */
    for (int pick = 0; pick < 3; ++pick)
      for (int is_inf = 0; is_inf < 2; ++is_inf) {
        const int is_w2 = pick == 2, expert = 1 + is_w2, block = 1;
        const int64_t up_block = cfg.intermediate / 128; /* the first up block of W1 */
        float* sf = is_w2 ? p.w2_sf + expert * w2_sf_elems(&cfg) + block * (cfg.intermediate / 128)
                          : p.w1_sf + expert * w1_sf_elems(&cfg) + (pick ? up_block * (H / 128) : 1);
        const float keep = *sf;
        *sf = is_inf ? INFINITY : NAN;
        int routed = 0;
        for (int r = 0; r < 2; ++r)
          for (int64_t t = 0; t < tokens[r]; ++t) {
            ex[r][t] = fz_weight_poison_expect(is_w2, block, is_inf, clamp, expert, p.topk_idx[r] + t * K, K);
            routed += ex[r][t].kind != FZ_ROW_SAME;
          }
        CHECK(routed > 0);
        CHECK_OK(problem_forward(&p));
        char what[128];
        snprintf(what, sizeof what, "%s in W%d's scale of expert %d, G %d, clamp %d", is_inf ? "Inf" : "NaN",
                 1 + is_w2, expert, cfg.quant_group, clamp);
        CHECK(judge_problem(&p, clean, ex, what));
        *sf = keep;
        for (int r = 0; r < 2; ++r) memset(ex[r], 0, sizeof(fz_row_expect) * (size_t)tokens[r]);
      }
    for (int r = 0; r < 2; ++r) {
      free(clean[r]);
      free(ex[r]);
    }
    problem_free(&p);
  }
  return MM_TEST_PASS;
}

/* ---- argument checks ------------------------------------------------------ */

/* Sets one pointer field of a rank to NULL: 0..4 token fields, 5..8 weights. */
static const char* const rank_fields[] = {"x", "x_sf", "topk_idx", "topk_w", "y", "w1", "w1_sf", "w2", "w2_sf"};

static void null_rank_field(ref_rank_data* d, int field) {
  switch (field) {
    case 0: d->x = NULL; break;
    case 1: d->x_sf = NULL; break;
    case 2: d->topk_idx = NULL; break;
    case 3: d->topk_w = NULL; break;
    case 4: d->y = NULL; break;
    case 5: d->w1 = NULL; break;
    case 6: d->w1_sf = NULL; break;
    case 7: d->w2 = NULL; break;
    default: d->w2_sf = NULL; break;
  }
}

static mm_test_result test_layer_errors(void) {
  mm_rng rng = unit_rng(27);
  megamoe_config cfg = megamoe_config_make(128, 128, 4, 2, 8);
  const int64_t tokens[2] = {8, 6};
  problem p;
  CHECK(problem_random(&p, cfg, 2, tokens, &rng, 0.0));
  for (int r = 0; r < 2; ++r)
    for (int64_t i = 0; i < tokens[r] * 128; ++i) p.y[r][i] = 0x1234;
  ref_rank_data ranks[2];

  problem_ranks(&p, ranks);
  ranks[1].num_tokens = 9;
  CHECK_STATUS(ref_layer_forward(&cfg, 2, ranks), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_MESSAGE_HAS("ranks[1].num_tokens");
  ranks[1].num_tokens = -1;
  CHECK_STATUS(ref_layer_forward(&cfg, 2, ranks), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_MESSAGE_HAS("ranks[1].num_tokens");

  problem_ranks(&p, ranks);
  const int32_t kept_a = p.topk_idx[0][5], kept_b = p.topk_idx[1][11];
  p.topk_idx[0][5] = 4; /* = E */
  CHECK_STATUS(ref_layer_forward(&cfg, 2, ranks), MEGAMOE_ERR_BAD_TOPK_INDEX);
  CHECK_MESSAGE_HAS("ranks[0].topk_idx[5] = 4");
  p.topk_idx[0][5] = kept_a;
  p.topk_idx[1][11] = -2;
  CHECK_STATUS(ref_layer_forward(&cfg, 2, ranks), MEGAMOE_ERR_BAD_TOPK_INDEX);
  CHECK_MESSAGE_HAS("ranks[1].topk_idx[11] = -2");
  p.topk_idx[1][11] = kept_b;

  CHECK_STATUS(ref_layer_forward(&cfg, 2, NULL), MEGAMOE_ERR_NULL_POINTER);
  CHECK_MESSAGE_HAS("ranks");
  megamoe_config bad = cfg;
  bad.top_k = 0;
  CHECK_STATUS(ref_layer_forward(&bad, 2, ranks), MEGAMOE_ERR_BAD_TOP_K);
  CHECK_MESSAGE_HAS("top_k");
  CHECK_STATUS(ref_layer_forward(&cfg, 3, ranks), MEGAMOE_ERR_BAD_EXPERTS);
  CHECK_STATUS(ref_layer_forward(&cfg, 0, ranks), MEGAMOE_ERR_BAD_RANKS);
  CHECK_STATUS(ref_layer_forward(NULL, 2, ranks), MEGAMOE_ERR_NULL_POINTER);
  CHECK_MESSAGE_HAS("config");

  for (int f = 0; f < 9; ++f) {
    problem_ranks(&p, ranks);
    null_rank_field(&ranks[1], f);
    CHECK_STATUS(ref_layer_forward(&cfg, 2, ranks), MEGAMOE_ERR_NULL_POINTER);
    char name[64];
    snprintf(name, sizeof name, "ranks[1].%s is NULL", rank_fields[f]);
    CHECK_MESSAGE_HAS(name);
  }

  /* The failed calls never touched y. */
  for (int r = 0; r < 2; ++r)
    for (int64_t i = 0; i < tokens[r] * 128; ++i) CHECK_EQ_INT(p.y[r][i], 0x1234);

  /* Token pointers may be NULL on a rank without tokens; weights may not. */
  for (int f = 0; f < 9; ++f) {
    problem_ranks(&p, ranks);
    null_rank_field(&ranks[1], f);
    ranks[1].num_tokens = 0;
    CHECK_STATUS(ref_layer_forward(&cfg, 2, ranks), f < 5 ? MEGAMOE_OK : MEGAMOE_ERR_NULL_POINTER);
  }

  /* A valid call after the failures works and clears the message. */
  problem_ranks(&p, ranks);
  CHECK_OK(ref_layer_forward(&cfg, 2, ranks));
  CHECK(megamoe_last_error()[0] == '\0');
  if (check_against_naive(&p) != MM_TEST_PASS) return MM_TEST_FAIL;
  problem_free(&p);
  return MM_TEST_PASS;
}

const mm_test unit_suite_ref_layer[] = {
    {"ref_layer.hand_case", test_layer_hand_case},
    {"ref_layer.hand_clamp", test_layer_hand_clamp},
    {"ref_layer.combine_slot_order", test_layer_combine_slot_order},
    {"ref_layer.l1_blocks_in_double", test_layer_l1_blocks_in_double},
    {"ref_layer.matches_naive", test_layer_matches_naive},
    {"ref_layer.accuracy_vs_float64", test_layer_accuracy_vs_float64},
    {"ref_layer.masked_slots", test_layer_masked_slots},
    {"ref_layer.all_masked_token", test_layer_all_masked_token},
    {"ref_layer.one_expert", test_layer_one_expert},
    {"ref_layer.empty_rank", test_layer_empty_rank},
    {"ref_layer.rank_split_invariance", test_layer_rank_split_invariance},
    {"ref_layer.vector_paths_agree", test_layer_vector_paths_agree},
    {"ref_layer.nonfinite_inputs_stay_in_their_row", test_layer_nonfinite_rows},
    {"ref_layer.errors", test_layer_errors},
    {NULL, NULL},
};
