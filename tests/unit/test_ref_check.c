/* The layer-output checker (ref/ref_check.h): it passes the reference's own
 * output and rounding-level perturbations of it, and it rejects every bug
 * issue 9 names (a zeroed row, a neighbour's row, dropped slots, a scaled
 * routing weight, zeroed columns, the wrong quantization group, a NaN), each
 * of which the old whole-rank check (diff < 0.01) lets through. That last
 * assertion is kept on purpose: it shows why the per-token checker exists.
 *
 * The rounding-level perturbations come from an emulator of the GPU's
 * arithmetic (fp32 block sums in another order, a narrow in-block
 * accumulator like the Hopper FP8 MMA's, fp32 promotion with an fp32 scale
 * product, fp32 SwiGLU) and from hand-made flips (e4m3 codes of the L1 output
 * moved to their other rounding neighbour, bf16 outputs moved by one ulp).
 * Their statistics are printed on every run; they are where the bounds in
 * ref_check.h come from. MEGAMOE_CHECK_SWEEP=1 measures them over more shapes
 * (about 80 s). MEGAMOE_CHECK_FIXED_SEED=<n> replaces the pinned draw of the
 * planted-bug test (to survey how often the old check misses each bug). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "ref_check.h"
#include "unit.h"

/* The old layer-test criterion (tests/gpu/test_layer.c before issue 9). */
#define OLD_DIFF_LIMIT 0.01

/* ---- one rank's problem, built like the GPU layer tests build theirs ---- */

typedef struct check_problem {
  megamoe_config cfg;
  int64_t T;
  uint8_t* w1;  /* [E, 2I, H] */
  float* w1_sf; /* [E, 2I/128, H/128] */
  uint8_t* w2;  /* [E, H, I] */
  float* w2_sf; /* [E, H/128, I/128] */
  uint8_t* x;   /* [T, H] */
  float* x_sf;  /* [T, H/128] */
  int32_t* idx; /* [T, K], -1 masked */
  float* w;     /* [T, K], NaN where masked */
  uint16_t* y_ref;
} check_problem;

static int64_t cp_w1_elems(const megamoe_config* c) { return 2 * c->intermediate * c->hidden; }
static int64_t cp_w1_sf_elems(const megamoe_config* c) { return (2 * c->intermediate / 128) * (c->hidden / 128); }
static int64_t cp_w2_elems(const megamoe_config* c) { return c->hidden * c->intermediate; }
static int64_t cp_w2_sf_elems(const megamoe_config* c) { return (c->hidden / 128) * (c->intermediate / 128); }

static void cp_free(check_problem* p) {
  free(p->w1);
  free(p->w1_sf);
  free(p->w2);
  free(p->w2_sf);
  free(p->x);
  free(p->x_sf);
  free(p->idx);
  free(p->w);
  free(p->y_ref);
  memset(p, 0, sizeof *p);
}

/* y of (cfg, idx, w) on p's weights and tokens, one simulated rank. */
static int cp_forward(const check_problem* p, const megamoe_config* cfg, const int32_t* idx, const float* w,
                      uint16_t* y) {
  ref_rank_data rd;
  memset(&rd, 0, sizeof rd);
  rd.num_tokens = p->T;
  rd.x = p->x;
  rd.x_sf = p->x_sf;
  rd.topk_idx = idx;
  rd.topk_w = w;
  rd.w1 = p->w1;
  rd.w1_sf = p->w1_sf;
  rd.w2 = p->w2;
  rd.w2_sf = p->w2_sf;
  rd.y = y;
  if (ref_layer_forward(cfg, 1, &rd) != MEGAMOE_OK) {
    fprintf(stderr, "    reference: %s\n", megamoe_last_error());
    return 0;
  }
  return 1;
}

/* Weights in the fp8 range with block scales that make the effective weight
 * ~N(0, 1/depth); tokens quantized per 128 channels from N(0, 1); K distinct
 * experts per token, weights in [0.05, 1.05), masked slots -1 with a NaN
 * weight (nothing may read it). Then the reference. */
static int cp_make(check_problem* p, megamoe_config cfg, int64_t T, double mask_ratio, mm_rng* g) {
  memset(p, 0, sizeof *p);
  p->cfg = cfg;
  p->T = T;
  const int64_t E = cfg.num_experts, H = cfg.hidden, I = cfg.intermediate, K = cfg.top_k;
  p->w1 = malloc((size_t)(E * cp_w1_elems(&cfg)));
  p->w1_sf = malloc(sizeof(float) * (size_t)(E * cp_w1_sf_elems(&cfg)));
  p->w2 = malloc((size_t)(E * cp_w2_elems(&cfg)));
  p->w2_sf = malloc(sizeof(float) * (size_t)(E * cp_w2_sf_elems(&cfg)));
  p->x = malloc((size_t)(T * H));
  p->x_sf = malloc(sizeof(float) * (size_t)(T * (H / 128)));
  p->idx = malloc(sizeof(int32_t) * (size_t)(T * K));
  p->w = malloc(sizeof(float) * (size_t)(T * K));
  p->y_ref = malloc(sizeof(uint16_t) * (size_t)(T * H));
  if (!p->w1 || !p->w1_sf || !p->w2 || !p->w2_sf || !p->x || !p->x_sf || !p->idx || !p->w || !p->y_ref) return 0;
  for (int64_t i = 0; i < E * cp_w1_elems(&cfg); ++i) p->w1[i] = ref_e4m3_encode((float)(mm_rng_normal(g) * 64.0));
  for (int64_t i = 0; i < E * cp_w2_elems(&cfg); ++i) p->w2[i] = ref_e4m3_encode((float)(mm_rng_normal(g) * 64.0));
  for (int64_t i = 0; i < E * cp_w1_sf_elems(&cfg); ++i)
    p->w1_sf[i] = (float)((0.5 + mm_rng_uniform(g)) / 64.0 / sqrt((double)H));
  for (int64_t i = 0; i < E * cp_w2_sf_elems(&cfg); ++i)
    p->w2_sf[i] = (float)((0.5 + mm_rng_uniform(g)) / 64.0 / sqrt((double)I));
  float row[128];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < H / 128; ++b) {
      for (int i = 0; i < 128; ++i) row[i] = (float)mm_rng_normal(g);
      ref_quantize_group(row, 128, p->x + t * H + b * 128, &p->x_sf[t * (H / 128) + b]);
    }
    for (int64_t k = 0; k < K; ++k) {
      int32_t e;
      int fresh;
      do {
        e = (int32_t)mm_rng_below(g, (uint64_t)E);
        fresh = 1;
        for (int64_t j = 0; j < k; ++j) fresh &= p->idx[t * K + j] != e;
      } while (!fresh);
      p->idx[t * K + k] = e;
      p->w[t * K + k] = (float)(0.05 + mm_rng_uniform(g));
      if (mm_rng_uniform(g) < mask_ratio) {
        p->idx[t * K + k] = -1;
        p->w[t * K + k] = NAN;
      }
    }
  }
  return cp_forward(p, &p->cfg, p->idx, p->w, p->y_ref);
}

/* ---- an emulator of the GPU's arithmetic, for rounding-level outputs ----- */

typedef enum emu_sum {
  EMU_SUM_EXACT,         /* in double, exact (the reference's) */
  EMU_SUM_FP32,          /* in fp32, products in ascending order */
  EMU_SUM_FP32_REVERSED, /* in fp32, descending */
  EMU_SUM_NARROW         /* groups of 4 products added into a narrow accumulator (below) */
} emu_sum;

typedef struct emu_model {
  const char* name;
  emu_sum sum;          /* a block's sum of products (L1: 128 wide, L2: G wide) */
  int narrow_bits;      /* EMU_SUM_NARROW: significant bits kept */
  int fp32_promotion;   /* block scale product in fp32 and fmaf into an fp32 accumulator (the GPU's);
                           else the reference's double */
  int fp32_swiglu;      /* g / (1 + expf(-g)) * u * w in fp32 (the GPU's); else in double */
  int code_flips;       /* per slot: the codes nearest a rounding boundary moved to their other neighbour */
  int random_flips;     /* per slot: codes at random columns moved to their other neighbour */
  int estimate;         /* 1: the bounds' estimate of the GPU (ref_check.h); 0: for scale only */
} emu_model;

/* The reference's own arithmetic: the emulator must reproduce it bitwise,
 * which shows the emulator computes the contract and only the models'
 * rounding differs. */
static const emu_model model_exact = {"exact (the reference's arithmetic)", EMU_SUM_EXACT, 0, 0, 0, 0, 0, 0};

/* The Hopper FP8 MMA keeps about 14 significant bits in its accumulator
 * (public reports; the reason the kernels promote every 128-wide K block).
 * The model here: the accumulator and each group of 4 products are aligned
 * to the largest of them and truncated to narrow_bits below it. That is
 * cruder (more error) than the hardware, on purpose: the bounds come out
 * above the real thing, not below. */
static double truncate_to_bits(double v, double magnitude, int bits) {
  if (magnitude == 0.0) return v;
  int exponent;
  frexp(magnitude, &exponent);
  const double ulp = ldexp(1.0, exponent - bits);
  return trunc(v / ulp) * ulp;
}

static double emu_block_sum(const emu_model* m, const double* a, const double* b, int64_t n) {
  switch (m->sum) {
    case EMU_SUM_EXACT: {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
      return s;
    }
    case EMU_SUM_FP32: {
      float s = 0.0f;
      for (int64_t i = 0; i < n; ++i) s += (float)(a[i] * b[i]);
      return s;
    }
    case EMU_SUM_FP32_REVERSED: {
      float s = 0.0f;
      for (int64_t i = n - 1; i >= 0; --i) s += (float)(a[i] * b[i]);
      return s;
    }
    case EMU_SUM_NARROW: {
      double acc = 0.0;
      for (int64_t i = 0; i < n; i += 4) {
        double group = 0.0, magnitude = fabs(acc);
        for (int64_t j = i; j < i + 4 && j < n; ++j) {
          const double p = a[j] * b[j];
          group += p;
          if (fabs(p) > magnitude) magnitude = fabs(p);
        }
        acc = truncate_to_bits(acc + group, magnitude, m->narrow_bits);
      }
      return (float)acc;
    }
  }
  return NAN;
}

/* The other rounding neighbour of code c for the value v it encodes
 * (v = a / sf): one step in magnitude toward v, or away from zero when v is
 * the code's exact value. What a value near a rounding midpoint does when
 * the GPU's a differs from the reference's in the last bits. */
static uint8_t other_neighbour(uint8_t c, float v) {
  const uint8_t sign = c & 0x80;
  int mag = c & 0x7F;
  const double decoded = fabs((double)ref_e4m3_decode(c));
  if (fabs((double)v) < decoded && mag > 0) mag -= 1;
  else if (mag < 0x7E) mag += 1;
  else mag -= 1;
  return (uint8_t)(sign | mag);
}

typedef struct emu_scratch {
  double table[256];
  double *x, *w1, *w2, *q;
  float *h, *act, *q_sf, *sum;
  uint8_t* codes;
  /* What the model did to the L1 output, measured against the reference's
   * arithmetic on the same row: the diff of h (the GEMM tests measured ~1e-8
   * for the wgmma engine on the H200) and the e4m3 codes that differ. */
  float *h_exact, *act_exact, *q_sf_exact;
  uint8_t* codes_exact;
  double h_sum_ab, h_sum_sq;
  int64_t codes_flipped, slot_rows;
} emu_scratch;

/* act = silu(g) * u * weight of one L1 output row, in fp32 (the GPU's) or
 * in double rounded once (the reference's). */
static void emu_swiglu(const megamoe_config* c, const emu_model* m, const float* h, float weight, float* act) {
  const int64_t I = c->intermediate;
  for (int64_t j = 0; j < I; ++j) {
    float gate = h[j], up = h[I + j];
    if (c->has_swiglu_clamp) {
      gate = gate > c->swiglu_clamp ? c->swiglu_clamp : gate;
      up = up > c->swiglu_clamp ? c->swiglu_clamp : (up < -c->swiglu_clamp ? -c->swiglu_clamp : up);
    }
    if (m->fp32_swiglu) act[j] = gate / (1.0f + expf(-gate)) * up * weight;
    else act[j] = (float)(((double)gate / (1.0 + exp(-(double)gate))) * (double)up * (double)weight);
  }
}

/* One token's y row under model m. */
static void emu_token(const check_problem* p, const emu_model* m, int64_t t, mm_rng* g, emu_scratch* s,
                      uint16_t* y) {
  const megamoe_config* c = &p->cfg;
  const int64_t H = c->hidden, I = c->intermediate, G = c->quant_group, K = c->top_k;
  for (int64_t i = 0; i < H; ++i) s->x[i] = s->table[p->x[t * H + i]];
  for (int64_t n = 0; n < H; ++n) s->sum[n] = 0.0f;
  const float* x_sf = p->x_sf + t * (H / 128);
  for (int64_t k = 0; k < K; ++k) {
    const int32_t e = p->idx[t * K + k];
    if (e < 0) continue;
    const float weight = p->w[t * K + k];
    const uint8_t* w1 = p->w1 + e * cp_w1_elems(c);
    const float* w1_sf = p->w1_sf + e * cp_w1_sf_elems(c);
    const uint8_t* w2 = p->w2 + e * cp_w2_elems(c);
    const float* w2_sf = p->w2_sf + e * cp_w2_sf_elems(c);
    for (int64_t n = 0; n < 2 * I; ++n) {
      for (int64_t i = 0; i < H; ++i) s->w1[i] = s->table[w1[n * H + i]];
      float acc32 = 0.0f;
      double acc = 0.0, acc_exact = 0.0;
      for (int64_t kb = 0; kb < H / 128; ++kb) {
        const double part = emu_block_sum(m, s->x + kb * 128, s->w1 + kb * 128, 128);
        const float scale_a = x_sf[kb], scale_b = w1_sf[(n / 128) * (H / 128) + kb];
        if (m->fp32_promotion) acc32 = fmaf((float)part, scale_a * scale_b, acc32);
        else acc += ((double)scale_a * (double)scale_b) * part;
        acc_exact += ((double)scale_a * (double)scale_b) * emu_block_sum(&model_exact, s->x + kb * 128, s->w1 + kb * 128, 128);
      }
      s->h[n] = m->fp32_promotion ? acc32 : (float)acc;
      s->h_exact[n] = (float)acc_exact;
      s->h_sum_ab += (double)s->h[n] * s->h_exact[n];
      s->h_sum_sq += (double)s->h[n] * s->h[n] + (double)s->h_exact[n] * s->h_exact[n];
    }
    emu_swiglu(c, m, s->h, weight, s->act);
    emu_swiglu(c, &model_exact, s->h_exact, weight, s->act_exact);
    for (int64_t b = 0; b < I / G; ++b) {
      ref_quantize_group(s->act + b * G, (int)G, s->codes + b * G, &s->q_sf[b]);
      ref_quantize_group(s->act_exact + b * G, (int)G, s->codes_exact + b * G, &s->q_sf_exact[b]);
    }
    /* Hand-made flips: the code_flips codes whose value lies nearest a
     * rounding boundary, measured in units of a (a GEMM error is absolute,
     * so these are the codes it flips first), go to their other neighbour. */
    for (int f = 0; f < m->code_flips; ++f) {
      int64_t nearest = -1;
      double nearest_distance = INFINITY;
      for (int64_t j = 0; j < I; ++j) {
        if (s->codes[j] != s->codes_exact[j]) continue; /* flipped already */
        const float sf = s->q_sf[j / G], v = s->act[j] / sf;
        const double boundary =
            0.5 * ((double)ref_e4m3_decode(s->codes[j]) + (double)ref_e4m3_decode(other_neighbour(s->codes[j], v)));
        const double distance = fabs((double)v - boundary) * sf;
        if (distance < nearest_distance) {
          nearest_distance = distance;
          nearest = j;
        }
      }
      if (nearest >= 0)
        s->codes[nearest] = other_neighbour(s->codes[nearest], s->act[nearest] / s->q_sf[nearest / G]);
    }
    /* Flips at random columns cost more than the natural ones (a flip of a
     * large element moves the output most): a pessimistic hand model. */
    for (int f = 0; f < m->random_flips; ++f) {
      const int64_t j = (int64_t)mm_rng_below(g, (uint64_t)I);
      s->codes[j] = other_neighbour(s->codes[j], s->act[j] / s->q_sf[j / G]);
    }
    for (int64_t j = 0; j < I; ++j) {
      s->q[j] = s->table[s->codes[j]];
      s->codes_flipped += s->codes[j] != s->codes_exact[j];
    }
    s->slot_rows++;
    for (int64_t n = 0; n < H; ++n) {
      for (int64_t j = 0; j < I; ++j) s->w2[j] = s->table[w2[n * I + j]];
      float acc32 = 0.0f;
      double acc = 0.0;
      for (int64_t kb = 0; kb < I / G; ++kb) {
        const double part = emu_block_sum(m, s->q + kb * G, s->w2 + kb * G, G);
        const float scale_a = s->q_sf[kb], scale_b = w2_sf[(n / 128) * (I / 128) + (kb * G) / 128];
        if (m->fp32_promotion) acc32 = fmaf((float)part, scale_a * scale_b, acc32);
        else acc += ((double)scale_a * (double)scale_b) * part;
      }
      s->sum[n] += ref_bf16_round(m->fp32_promotion ? acc32 : (float)acc);
    }
  }
  for (int64_t n = 0; n < H; ++n) y[n] = ref_bf16_encode(s->sum[n]);
}

/* y [T, H] of p under model m. 0 when an allocation failed. */
typedef struct emu_report {
  double h_diff;          /* diff of the L1 output against the reference's arithmetic */
  double flips_per_slot;  /* L1-output codes that differ from the reference's, per routed slot */
} emu_report;

static int emu_forward(const check_problem* p, const emu_model* m, mm_rng* g, uint16_t* y, emu_report* report) {
  const int64_t H = p->cfg.hidden, I = p->cfg.intermediate;
  emu_scratch s;
  for (int v = 0; v < 256; ++v) s.table[v] = ref_e4m3_decode((uint8_t)v);
  s.x = malloc(sizeof(double) * (size_t)H);
  s.w1 = malloc(sizeof(double) * (size_t)H);
  s.w2 = malloc(sizeof(double) * (size_t)I);
  s.q = malloc(sizeof(double) * (size_t)I);
  s.h = malloc(sizeof(float) * (size_t)(2 * I));
  s.act = malloc(sizeof(float) * (size_t)I);
  s.q_sf = malloc(sizeof(float) * (size_t)I);
  s.sum = malloc(sizeof(float) * (size_t)H);
  s.codes = malloc((size_t)I);
  s.h_exact = malloc(sizeof(float) * (size_t)(2 * I));
  s.act_exact = malloc(sizeof(float) * (size_t)I);
  s.q_sf_exact = malloc(sizeof(float) * (size_t)I);
  s.codes_exact = malloc((size_t)I);
  s.h_sum_ab = s.h_sum_sq = 0.0;
  s.codes_flipped = s.slot_rows = 0;
  const int ok = s.x && s.w1 && s.w2 && s.q && s.h && s.act && s.q_sf && s.sum && s.codes && s.h_exact &&
                 s.act_exact && s.q_sf_exact && s.codes_exact;
  if (ok)
    for (int64_t t = 0; t < p->T; ++t) emu_token(p, m, t, g, &s, y + t * H);
  if (report) {
    report->h_diff = s.h_sum_sq > 0 ? 1.0 - 2.0 * s.h_sum_ab / s.h_sum_sq : 0.0;
    report->flips_per_slot = s.slot_rows ? (double)s.codes_flipped / (double)s.slot_rows : 0.0;
  }
  free(s.h_exact);
  free(s.act_exact);
  free(s.q_sf_exact);
  free(s.codes_exact);
  free(s.x);
  free(s.w1);
  free(s.w2);
  free(s.q);
  free(s.h);
  free(s.act);
  free(s.q_sf);
  free(s.sum);
  free(s.codes);
  return ok;
}


/* The models a GPU arm may legitimately follow. */
static const emu_model rounding_models[] = {
    {"fp32 sums, fp32 promotion, fp32 SwiGLU", EMU_SUM_FP32, 0, 1, 1, 0, 0, 1},
    {"fp32 sums reversed, fp32 promotion, fp32 SwiGLU", EMU_SUM_FP32_REVERSED, 0, 1, 1, 0, 0, 1},
    {"15-bit MMA accumulator (~ the H200's measured)", EMU_SUM_NARROW, 15, 1, 1, 0, 0, 1},
    {"14-bit MMA accumulator (pessimistic)", EMU_SUM_NARROW, 14, 1, 1, 0, 0, 0},
    {"exact + 4 codes nearest a boundary flipped per slot", EMU_SUM_EXACT, 0, 0, 0, 4, 0, 0},
    {"exact + 2 random codes flipped per slot", EMU_SUM_EXACT, 0, 0, 0, 0, 2, 0},
};
#define NUM_ROUNDING_MODELS ((int)(sizeof rounding_models / sizeof rounding_models[0]))

/* Moves every 32nd element (random ones) of y by one bf16 ulp up or down
 * (a bf16 rounding flip in the L2 epilogue or the combine). Zeros stay. */
static void bf16_ulp_moves(uint16_t* y, int64_t n, mm_rng* g) {
  for (int64_t i = 0; i < n; ++i) {
    if (mm_rng_below(g, 32) != 0 || (y[i] & 0x7FFF) == 0) continue;
    const int up = (int)mm_rng_below(g, 2);
    y[i] = (uint16_t)(up ? y[i] + 1 : y[i] - 1); /* magnitude +-1 ulp: stays finite for these values */
  }
}

/* Runs the checker with the defaults and prints "    <label> <stats line>". */
static int check_and_print(const char* label, const check_problem* p, const uint16_t* y, ref_check_stats* s) {
  const int pass = ref_check_output(y, p->y_ref, p->T, p->cfg.hidden, p->idx, p->cfg.top_k, NULL, s);
  char line[512];
  ref_check_format(s, line, sizeof line);
  printf("    %-52s %s\n", label, line);
  return pass;
}

/* ---- tests --------------------------------------------------------------- */

/* The reference against itself: zero error, every token counted, and the
 * emulator in the reference's arithmetic reproduces it bitwise. */
static mm_test_result test_check_reference_passes(void) {
  mm_rng g = unit_rng(901);
  megamoe_config cfg = megamoe_config_make(256, 256, 8, 3, 40);
  check_problem p;
  CHECK(cp_make(&p, cfg, 40, 0.2, &g));
  ref_check_stats s;
  CHECK(ref_check_output(p.y_ref, p.y_ref, p.T, 256, p.idx, 3, NULL, &s));
  CHECK(s.pass && s.first_failure == REF_CHECK_PASSED && s.first_failure_token == -1);
  CHECK_EQ_INT(s.tokens_checked, 40);
  CHECK_EQ_INT(s.tokens_failed, 0);
  CHECK(s.max_rel_err == 0.0 && s.max_abs_over_scale == 0.0 && s.diff == 0.0);
  int64_t masked = 0;
  for (int64_t t = 0; t < p.T; ++t) masked += p.idx[t * 3] < 0 && p.idx[t * 3 + 1] < 0 && p.idx[t * 3 + 2] < 0;
  CHECK_EQ_INT(s.tokens_masked, masked);
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(p.T * 256));
  CHECK(y && emu_forward(&p, &model_exact, &g, y, NULL));
  CHECK_MSG(memcmp(y, p.y_ref, sizeof(uint16_t) * (size_t)(p.T * 256)) == 0,
            "the emulator in the reference's arithmetic differs from ref_layer_forward");
  free(y);
  cp_free(&p);
  return MM_TEST_PASS;
}

/* The largest statistics of a set of perturbed outputs. */
typedef struct rounding_estimate {
  double rel_err, abs_over_scale, diff;
} rounding_estimate;

static void estimate_note(rounding_estimate* e, const ref_check_stats* s) {
  if (s->max_rel_err > e->rel_err) e->rel_err = s->max_rel_err;
  if (s->max_abs_over_scale > e->abs_over_scale) e->abs_over_scale = s->max_abs_over_scale;
  if (s->diff > e->diff) e->diff = s->diff;
}

static void estimate_print(const char* what, const rounding_estimate* e) {
  printf("    largest, %s: rel err %.3e, abs/scale %.3e, diff %.3e\n", what, e->rel_err, e->abs_over_scale, e->diff);
}

/* Every rounding model on one problem must pass the checker. The statistics
 * of the models the bounds were set from go into estimate, all into any. */
static mm_test_result rounding_on(megamoe_config cfg, int64_t T, double mask_ratio, uint64_t salt,
                                  rounding_estimate* estimate, rounding_estimate* any) {
  mm_rng g = unit_rng(salt);
  check_problem p;
  CHECK(cp_make(&p, cfg, T, mask_ratio, &g));
  printf("    H %lld I %lld E %d K %d G %d T %lld, masked %.0f%%:\n", (long long)cfg.hidden,
         (long long)cfg.intermediate, cfg.num_experts, cfg.top_k, cfg.quant_group, (long long)T, 100 * mask_ratio);
  const int64_t n = T * cfg.hidden;
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)n);
  CHECK(y != NULL);
  ref_check_stats s;
  for (int i = 0; i < NUM_ROUNDING_MODELS; ++i) {
    emu_report report;
    CHECK(emu_forward(&p, &rounding_models[i], &g, y, &report));
    const int pass = check_and_print(rounding_models[i].name, &p, y, &s);
    printf("    %-52s (L1 output diff %.2e, %.2f codes flipped per slot)\n", "", report.h_diff, report.flips_per_slot);
    CHECK_MSG(pass, "rounding model \"%s\" fails the check", rounding_models[i].name);
    if (rounding_models[i].estimate) estimate_note(estimate, &s);
    estimate_note(any, &s);
  }
  memcpy(y, p.y_ref, sizeof(uint16_t) * (size_t)n);
  bf16_ulp_moves(y, n, &g);
  CHECK(check_and_print("reference + 1 bf16 ulp on 1/32 of the outputs", &p, y, &s));
  CHECK(s.max_rel_err > 0.0); /* the moves happened */
  estimate_note(estimate, &s);
  estimate_note(any, &s);
  free(y);
  cp_free(&p);
  return MM_TEST_PASS;
}

/* Rounding-level outputs pass. Every model must pass, and the models the
 * bounds were set from must stay 3x under each bound: looser than the
 * 5-10x the bounds were set with, so a rare draw does not fail the suite,
 * and a bound cut to the rounding level fails here first. */
static mm_test_result test_check_rounding_passes(void) {
  rounding_estimate estimate = {0, 0, 0}, any = {0, 0, 0};
  megamoe_config cfg = megamoe_config_make(256, 256, 8, 2, 64);
  if (rounding_on(cfg, 64, 0.0, 902, &estimate, &any) != MM_TEST_PASS) return MM_TEST_FAIL;
  const char* sweep = getenv("MEGAMOE_CHECK_SWEEP");
  if (sweep && *sweep && *sweep != '0') {
    const int64_t dims[2] = {256, 512};
    const int ks[4] = {1, 2, 4, 6};
    for (int hi = 0; hi < 2; ++hi)
      for (int ii = 0; ii < 2; ++ii)
        for (int ki = 0; ki < 4; ++ki)
          for (int group = 64; group <= 128; group += 64) {
            megamoe_config c = megamoe_config_make(dims[hi], dims[ii], 8, ks[ki], 64);
            c.quant_group = group;
            if (rounding_on(c, 64, 0.1, 903 + (uint64_t)(hi * 100 + ii * 10 + ki + group), &estimate, &any) !=
                MM_TEST_PASS)
              return MM_TEST_FAIL;
          }
  }
  estimate_print("the GPU estimate (fp32, 15-bit MMA, bf16 ulps)", &estimate);
  estimate_print("every model", &any);
  CHECK_MSG(estimate.rel_err * 3 < REF_CHECK_BOUND_ROW_REL_ERR, "rel err %g", estimate.rel_err);
  CHECK_MSG(estimate.abs_over_scale * 3 < REF_CHECK_BOUND_ROW_ABS_OVER_SCALE, "abs/scale %g", estimate.abs_over_scale);
  CHECK_MSG(estimate.diff * 3 < REF_CHECK_BOUND_DIFF, "diff %g", estimate.diff);
  return MM_TEST_PASS;
}

/* Sum of squares of token t's row. */
static double row_energy(const uint16_t* y, int64_t t, int64_t H) {
  double s = 0.0;
  for (int64_t n = 0; n < H; ++n) {
    const double v = ref_bf16_decode(y[t * H + n]);
    s += v * v;
  }
  return s;
}

/* Index of the median of n values (n <= 4096). */
static int64_t median_index(const double* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t below = 0, equal_before = 0;
    for (int64_t j = 0; j < n; ++j) {
      below += v[j] < v[i];
      equal_before += v[j] == v[i] && j < i;
    }
    if (below + equal_before == n / 2) return i;
  }
  return 0;
}

enum { BUG_ZERO_ROW, BUG_NEIGHBOUR_ROW, BUG_DROP_SLOT, BUG_SCALED_WEIGHT, BUG_ZERO_COLUMNS, BUG_GROUP_64, BUG_NAN,
       BUG_INF, BUG_COUNT };
static const char* const bug_names[BUG_COUNT] = {
    "(a) one token's row zeroed",
    "(b) one token holds its neighbour's row",
    "(c) slot K-1 of every 10th token dropped",
    "(d) routing weight of slot 0 x 1.1",
    "(e) last 8 columns of every row zeroed",
    "(f) G = 64 where 128 was configured",
    "(g) one element NaN",
    "(h) one element Inf"};

/* Plants each bug into a copy of p's reference output (recomputing the
 * reference where the bug is in the inputs or the config) and asserts the
 * checker rejects it. old_diff[bug] receives the old criterion's diff. Where
 * a bug hits one token it is a token of typical energy (the median), so the
 * old check's verdict is the typical one, not a lucky one. */
static mm_test_result plant_bugs(const check_problem* p, mm_rng* g, double old_diff[BUG_COUNT]) {
  const int64_t H = p->cfg.hidden, K = p->cfg.top_k, T = p->T, n = T * H;
  CHECK(T >= 16 && T <= 4096);
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)n);
  int32_t* idx = malloc(sizeof(int32_t) * (size_t)(T * K));
  float* w = malloc(sizeof(float) * (size_t)(T * K));
  double* energy = malloc(sizeof(double) * (size_t)T);
  double* pair_energy = malloc(sizeof(double) * (size_t)T);
  CHECK(y && idx && w && energy && pair_energy);
  for (int64_t t = 0; t < T; ++t) energy[t] = row_energy(p->y_ref, t, H);
  for (int64_t t = 0; t + 1 < T; ++t) pair_energy[t] = energy[t] + energy[t + 1];
  const int64_t median_token = median_index(energy, T);
  const int64_t median_pair = median_index(pair_energy, T - 1);

  for (int bug = 0; bug < BUG_COUNT; ++bug) {
    memcpy(y, p->y_ref, sizeof(uint16_t) * (size_t)n);
    memcpy(idx, p->idx, sizeof(int32_t) * (size_t)(T * K));
    memcpy(w, p->w, sizeof(float) * (size_t)(T * K));
    switch (bug) {
      case BUG_ZERO_ROW:
        memset(y + median_token * H, 0, sizeof(uint16_t) * (size_t)H);
        break;
      case BUG_NEIGHBOUR_ROW:
        memcpy(y + median_pair * H, p->y_ref + (median_pair + 1) * H, sizeof(uint16_t) * (size_t)H);
        break;
      case BUG_DROP_SLOT:
        for (int64_t t = 0; t < T; t += 10) {
          idx[t * K + K - 1] = -1;
          w[t * K + K - 1] = NAN;
        }
        CHECK(cp_forward(p, &p->cfg, idx, w, y));
        break;
      case BUG_SCALED_WEIGHT:
        for (int64_t t = 0; t < T; ++t) w[t * K] *= 1.1f;
        CHECK(cp_forward(p, &p->cfg, idx, w, y));
        break;
      case BUG_ZERO_COLUMNS:
        for (int64_t t = 0; t < T; ++t) memset(y + t * H + H - 8, 0, sizeof(uint16_t) * 8);
        break;
      case BUG_GROUP_64: {
        megamoe_config wrong = p->cfg;
        wrong.quant_group = 64;
        CHECK(cp_forward(p, &wrong, idx, w, y));
        break;
      }
      case BUG_NAN:
        y[mm_rng_below(g, (uint64_t)n)] = 0x7FC0;
        break;
      case BUG_INF:
        y[mm_rng_below(g, (uint64_t)n)] = 0xFF80;
        break;
    }
    ref_check_stats s;
    const int pass = check_and_print(bug_names[bug], p, y, &s);
    old_diff[bug] = ref_diff_bf16(y, p->y_ref, (size_t)n);
    if (bug != BUG_NAN && bug != BUG_INF) printf("    %-52s old check: diff %.4f\n", "", old_diff[bug]);
    CHECK_MSG(!pass, "%s passes the checker", bug_names[bug]);
    CHECK(s.first_failure != REF_CHECK_PASSED && s.first_failure != REF_CHECK_BAD_INPUT);
    if (bug == BUG_NAN || bug == BUG_INF) CHECK(s.first_failure == REF_CHECK_NONFINITE && s.nonfinite == 1);
  }
  free(y);
  free(idx);
  free(w);
  free(energy);
  free(pair_energy);
  return MM_TEST_PASS;
}

/* The planted bugs of issue 9. First on a fixed draw of the smoke test's
 * layer (H = I = 512, E = 8) with the models' top-k (K = 6) and 128 tokens
 * (one simulated rank: the reference is the same for any rank split), where
 * each of the six passes the old whole-rank check (diff < 0.01), as the
 * issue reports: the reason this checker exists. That part is pinned to one
 * draw because the old diff of a bug is a random quantity near the old limit
 * (a zeroed row costs ~1/(2T) of the energy, (e) ~8/(2H)), so on a fresh
 * draw the old check sometimes catches one by luck. (With K = 2 the old
 * check does catch (c), diff 0.014-0.05 over 12 draws, and at T = 64 also
 * (b), 0.013-0.017; the 0.0073 and 0.0044 are not what this shape
 * gives.) Then on a fresh draw of the smoke shape itself (K = 2, T = 64): the
 * checker must reject every bug there too. */
static mm_test_result test_check_rejects_planted_bugs(void) {
  double old_diff[BUG_COUNT];
  check_problem p;
  mm_rng fixed = {0x9c0ffee5eedull};
  const char* seed_text = getenv("MEGAMOE_CHECK_FIXED_SEED"); /* to survey other draws */
  if (seed_text && *seed_text) fixed.state = strtoull(seed_text, NULL, 0);
  printf("    fixed draw (seed %llu), H 512 I 512 E 8 K 6 T 128:\n", (unsigned long long)fixed.state);
  CHECK(cp_make(&p, megamoe_config_make(512, 512, 8, 6, 128), 128, 0.0, &fixed));
  const mm_test_result fixed_result = plant_bugs(&p, &fixed, old_diff);
  cp_free(&p);
  if (fixed_result != MM_TEST_PASS) return MM_TEST_FAIL;
  for (int bug = 0; bug < BUG_COUNT; ++bug)
    if (bug != BUG_NAN && bug != BUG_INF)
      CHECK_MSG(old_diff[bug] < OLD_DIFF_LIMIT, "%s: old diff %g: the old check catches it on this draw",
                bug_names[bug], old_diff[bug]);
  mm_rng g = unit_rng(904);
  printf("    fresh draw, the smoke shape H 512 I 512 E 8 K 2 T 64:\n");
  CHECK(cp_make(&p, megamoe_config_make(512, 512, 8, 2, 64), 64, 0.0, &g));
  const mm_test_result fresh_result = plant_bugs(&p, &g, old_diff);
  cp_free(&p);
  return fresh_result;
}

/* A token with every slot masked must be exactly +0.0 (a -0.0 or a tiny
 * value fails); a token whose reference row is all zero but whose slots are
 * live is judged against the absolute floor (no division by zero). */
static mm_test_result test_check_masked_and_zero_rows(void) {
  const int64_t T = 3, H = 128, K = 2;
  int32_t idx[6] = {-1, -1, /* token 1: live */ 0, -1, /* token 2: live */ 1, 0};
  uint16_t y_ref[3 * 128], y[3 * 128];
  memset(y_ref, 0, sizeof y_ref);
  for (int64_t n = 0; n < H; ++n) y_ref[2 * H + n] = ref_bf16_encode(n % 2 ? 2.0f : -2.0f); /* rms exactly 2 */
  ref_check_stats s;
  /* Token 1's reference is zero with a live slot: a zero row passes. */
  memcpy(y, y_ref, sizeof y);
  CHECK(ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  CHECK_EQ_INT(s.tokens_masked, 1);
  CHECK(isfinite(s.max_rel_err) && isfinite(s.max_abs_over_scale));
  /* Masked token 0 holds -0.0 in one column: not the contract's +0.0. */
  y[5] = 0x8000;
  CHECK(!ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  CHECK(s.first_failure == REF_CHECK_MASKED_NONZERO && s.first_failure_token == 0);
  /* ... or a tiny value. */
  y[5] = ref_bf16_encode(1e-30f);
  CHECK(!ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  CHECK(s.first_failure == REF_CHECK_MASKED_NONZERO);
  y[5] = 0;
  /* Token 1 (zero reference, live slot): an error far below the floor times
   * the bound passes, one above it fails; the statistics stay finite. */
  const double tiny = REF_CHECK_SCALE_FLOOR * REF_CHECK_BOUND_ROW_REL_ERR * 0.1;
  y[H + 3] = ref_bf16_encode((float)tiny);
  CHECK(ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  y[H + 3] = ref_bf16_encode((float)(REF_CHECK_SCALE_FLOOR * REF_CHECK_BOUND_ROW_ABS_OVER_SCALE * 4));
  CHECK(!ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  CHECK(s.first_failure_token == 1);
  CHECK(isfinite(s.max_rel_err) && isfinite(s.max_abs_over_scale));
  y[H + 3] = 0;
  /* Token 2 (values +-2, rms exactly 2) is judged on its own scale: one
   * element 2 * 2 * abs bound off gives abs/scale 2x the bound while its rel
   * err (3 / (2 sqrt(128)) = 0.13 at the default bound) stays under the rel
   * bound, so the abs bound is what catches a single wrong element. */
  CHECK(ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  const float single_error = (float)(4.0 * REF_CHECK_BOUND_ROW_ABS_OVER_SCALE);
  y[2 * H + 10] = ref_bf16_encode(ref_bf16_decode(y_ref[2 * H + 10]) + single_error);
  CHECK(!ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  CHECK(s.first_failure == REF_CHECK_ROW_ABS_ERR && s.first_failure_token == 2);
  CHECK(s.max_rel_err < REF_CHECK_BOUND_ROW_REL_ERR && fabs(s.max_abs_over_scale - 2 * REF_CHECK_BOUND_ROW_ABS_OVER_SCALE) < 1e-6);
  /* A NaN in the reference never passes. */
  memcpy(y, y_ref, sizeof y);
  y_ref[2 * H] = 0x7FC0;
  y[2 * H] = 0x7FC0;
  CHECK(!ref_check_output(y, y_ref, T, H, idx, K, NULL, &s));
  CHECK(s.first_failure == REF_CHECK_BAD_REFERENCE);
  return MM_TEST_PASS;
}

/* Bad inputs never pass; T = 0 passes with NULL rows; caller bounds apply;
 * the line names the failure. */
static mm_test_result test_check_arguments_and_format(void) {
  uint16_t y[128] = {0};
  int32_t idx[1] = {0};
  ref_check_stats s;
  CHECK(!ref_check_output(NULL, y, 1, 128, idx, 1, NULL, &s));
  CHECK(s.first_failure == REF_CHECK_BAD_INPUT);
  CHECK(!ref_check_output(y, NULL, 1, 128, idx, 1, NULL, &s));
  CHECK(!ref_check_output(y, y, 1, 128, NULL, 1, NULL, &s));
  CHECK(!ref_check_output(y, y, -1, 128, idx, 1, NULL, &s));
  CHECK(!ref_check_output(y, y, 1, 0, idx, 1, NULL, &s));
  CHECK(!ref_check_output(y, y, 1, 128, idx, 1, NULL, NULL));
  ref_check_bounds b = ref_check_default_bounds();
  b.diff = NAN;
  CHECK(!ref_check_output(y, y, 1, 128, idx, 1, &b, &s));
  CHECK(s.first_failure == REF_CHECK_BAD_INPUT);
  CHECK(ref_check_output(NULL, NULL, 0, 128, NULL, 1, NULL, &s));
  CHECK(s.diff == 0.0 && s.tokens_checked == 0);

  /* A row 25% off everywhere: fails the defaults, passes a caller's looser
   * bounds (the lead calibrates with these). */
  uint16_t ref[128], off[128];
  for (int n = 0; n < 128; ++n) {
    ref[n] = ref_bf16_encode((float)(1 + n % 5));
    off[n] = ref_bf16_encode(ref_bf16_decode(ref[n]) * 1.25f);
  }
  CHECK(!ref_check_output(off, ref, 1, 128, idx, 1, NULL, &s));
  CHECK(s.first_failure == REF_CHECK_ROW_REL_ERR && s.first_failure_token == 0);
  char line[512];
  ref_check_format(&s, line, sizeof line);
  CHECK_MSG(strstr(line, "FAIL") && strstr(line, "row rel err at token 0"), "line: %s", line);
  b = ref_check_default_bounds();
  b.row_rel_err = 0.3;
  b.row_abs_over_scale = 0.5;
  b.diff = 0.05;
  CHECK(ref_check_output(off, ref, 1, 128, idx, 1, &b, &s));
  ref_check_format(&s, line, sizeof line);
  CHECK_MSG(strncmp(line, "PASS T 1", 8) == 0, "line: %s", line);
  return MM_TEST_PASS;
}

const mm_test unit_suite_ref_check[] = {
    {"ref_check.reference_passes", test_check_reference_passes},
    {"ref_check.rounding_passes", test_check_rounding_passes},
    {"ref_check.rejects_planted_bugs", test_check_rejects_planted_bugs},
    {"ref_check.masked_and_zero_rows", test_check_masked_and_zero_rows},
    {"ref_check.arguments_and_format", test_check_arguments_and_format},
    {NULL, NULL},
};
