/* The pure-host part of the GPU argument fuzz (tests/gpu/fuzz_check.h) on
 * the CPU: each check shown to fail on the bug it is for (a byte written
 * before y, after the rows a call owns, an element left unwritten, a changed
 * neighbouring row, a NaN row with one finite element, a weight-scale block
 * that stayed finite or leaked into another block, a reference row's NaN
 * missing), and whole random plans run on the reference with megamoe_forward's
 * host checks, so what the GPU fuzz expects is the library's and the
 * contract's behaviour before it ever runs on a GPU. */
#include <math.h>

#include "gpu/fuzz_check.h"
#include "host/config.h"
#include "ref.h"
#include "unit.h"

enum { FC_T = 6, FC_H = 256, FC_K = 2 };

static void fill_rows(mm_rng* g, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ref_bf16_encode((float)mm_rng_normal(g));
}

static mm_test_result t_guards(void) {
  const size_t y_off = FZ_GUARD_BYTES, y_bytes = 2 * FC_T * FC_H, total = y_off + y_bytes + FZ_GUARD_BYTES;
  uint8_t* before = malloc(total);
  uint8_t* after = malloc(total);
  CHECK(before && after);
  fz_fill_image(before, total, y_off, y_bytes);
  CHECK(before[0] == FZ_GUARD_FILL && before[total - 1] == FZ_GUARD_FILL);
  uint16_t first;
  memcpy(&first, before + y_off, sizeof first);
  CHECK(first == FZ_Y_POISON && fz_bf16_nan(first));
  memcpy(after, before, total);
  /* A call that owns 4 rows writes them: allowed. */
  const size_t owned = 2 * 4 * FC_H;
  memset(after + y_off, 0x11, owned);
  CHECK(fz_changed_outside(before, after, total, y_off, y_off + owned) == -1);
  /* Planted: the byte before y, the first byte past the owned rows, the last guard byte. */
  const size_t planted[3] = {y_off - 1, y_off + owned, total - 1};
  for (int i = 0; i < 3; ++i) {
    after[planted[i]] ^= 0x40;
    CHECK_EQ_INT(fz_changed_outside(before, after, total, y_off, y_off + owned), (int64_t)planted[i]);
    after[planted[i]] ^= 0x40;
  }
  /* A failed call owns nothing: any write to y shows. */
  CHECK_EQ_INT(fz_changed_outside(before, after, total, 0, 0), (int64_t)y_off);
  free(before);
  free(after);
  return MM_TEST_PASS;
}

static mm_test_result t_rows(void) {
  mm_rng g = unit_rng(0xfc01);
  uint16_t clean[FC_T * FC_H], y[FC_T * FC_H];
  int32_t idx[FC_T * FC_K];
  for (int i = 0; i < FC_T * FC_K; ++i) idx[i] = i % 3;
  fill_rows(&g, clean, FC_T * FC_H);
  fz_row_expect ex[FC_T];
  memset(ex, 0, sizeof ex);
  ex[1].kind = FZ_ROW_NAN;
  ex[3].kind = FZ_ROW_NAN_BLOCK;
  ex[3].block = 1;
  ex[4].kind = FZ_ROW_REF;
  memcpy(y, clean, sizeof y);
  for (int c = 0; c < FC_H; ++c) y[1 * FC_H + c] = 0x7FFF;
  for (int c = 128; c < 256; ++c) y[3 * FC_H + c] = c % 2 ? 0x7F80 : 0xFF80; /* +-Inf */
  uint16_t ref[FC_T * FC_H];
  memcpy(ref, clean, sizeof ref);
  ref[4 * FC_H + 7] = 0x7FFF; /* the reference has a NaN at (4, 7) */
  y[4 * FC_H + 7] = 0x7FFF;
  char why[512] = "";
  CHECK_MSG(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == -1, "%s", why);

  /* Each planted bug is found at its token. */
  struct {
    int token, column;
    uint16_t value;
  } plants[] = {
      {0, 5, 0},            /* a clean row changed */
      {2, 200, FZ_Y_POISON}, /* an element left unwritten */
      {1, 9, 0x3F80},       /* a NaN row with a finite 1.0 */
      {3, 130, 0x3F80},     /* the non-finite block has a finite element */
      {3, 3, 0x0001},       /* a column outside the block changed */
      {4, 7, 0x3F80},       /* the reference's NaN missing */
      {4, 100, 0x7F80},     /* an Inf where the reference is finite */
      {5, 255, 0x7FFF},     /* a NaN leaked into another token's row */
  };
  for (size_t i = 0; i < sizeof plants / sizeof plants[0]; ++i) {
    uint16_t* at = &y[plants[i].token * FC_H + plants[i].column];
    const uint16_t keep = *at;
    *at = plants[i].value == 0 ? (uint16_t)(keep ^ 1u) : plants[i].value;
    const int64_t bad = fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why);
    CHECK_MSG(bad == plants[i].token, "plant %zu (token %d column %d): judged %lld (%s)", i, plants[i].token,
              plants[i].column, (long long)bad, why);
    *at = keep;
  }
  /* A finite reference row judged by the per-token checker: a 2x error fails it. */
  ex[4].kind = FZ_ROW_REF;
  ref[4 * FC_H + 7] = clean[4 * FC_H + 7];
  y[4 * FC_H + 7] = clean[4 * FC_H + 7];
  CHECK_MSG(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == -1, "%s", why);
  for (int c = 0; c < FC_H; ++c) y[4 * FC_H + c] = ref_bf16_encode(2.0f * ref_bf16_decode(ref[4 * FC_H + c]));
  CHECK(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == 4);
  CHECK(strstr(why, "reference") != NULL);
  /* Behind an Inf scale under the clamp (may_flip), a whole-row flip (0 *
   * Inf in one and not the other) passes either way; a partial one fails,
   * and so does a whole-row flip of a row without may_flip (the duplicated
   * expert's). */
  ex[4].may_flip = 1;
  uint16_t keep_y[FC_H], keep_ref[FC_H];
  memcpy(keep_y, y + 4 * FC_H, sizeof keep_y);
  memcpy(keep_ref, ref + 4 * FC_H, sizeof keep_ref);
  memcpy(y + 4 * FC_H, clean + 4 * FC_H, sizeof keep_y);
  for (int c = 0; c < FC_H; ++c) ref[4 * FC_H + c] = 0x7FFF;
  CHECK_MSG(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == -1, "GPU finite: %s", why);
  for (int c = 0; c < FC_H; ++c) {
    y[4 * FC_H + c] = 0x7FFF;
    ref[4 * FC_H + c] = clean[4 * FC_H + c];
  }
  CHECK_MSG(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == -1, "GPU NaN: %s", why);
  ex[4].may_flip = 0;
  CHECK(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == 4);
  ex[4].may_flip = 1;
  y[4 * FC_H + 9] = clean[4 * FC_H + 9]; /* one finite element in the NaN row */
  CHECK(fz_judge_rows(y, clean, ref, idx, FC_K, FC_T, FC_H, ex, why, sizeof why) == 4);
  ex[4].may_flip = 0;
  memcpy(y + 4 * FC_H, keep_y, sizeof keep_y);
  memcpy(ref + 4 * FC_H, keep_ref, sizeof keep_ref);
  return MM_TEST_PASS;
}

/* ---- whole plans on the reference ----------------------------------------------- */
enum { PL_R = 2, PL_H = 128, PL_I = 128, PL_E = 8, PL_K = 4, PL_T = 12 };

typedef struct plan_problem {
  megamoe_config cfg;
  uint8_t w1[PL_E * 2 * PL_I * PL_H], w2[PL_E * PL_H * PL_I];
  float w1_sf[PL_E * (2 * PL_I / 128) * (PL_H / 128)], w2_sf[PL_E * (PL_H / 128) * (PL_I / 128)];
  uint8_t x[PL_R][PL_T * PL_H];
  float x_sf[PL_R][PL_T * PL_H / 128];
  int32_t idx[PL_R][PL_T * PL_K];
  float w[PL_R][PL_T * PL_K];
  uint16_t clean[PL_R][PL_T * PL_H];
} plan_problem;

static void plan_problem_fill(mm_rng* g, plan_problem* p) {
  for (size_t i = 0; i < sizeof p->w1; ++i) p->w1[i] = ref_e4m3_encode((float)(mm_rng_normal(g) * 64.0));
  for (size_t i = 0; i < sizeof p->w2; ++i) p->w2[i] = ref_e4m3_encode((float)(mm_rng_normal(g) * 64.0));
  for (size_t i = 0; i < sizeof p->w1_sf / 4; ++i) p->w1_sf[i] = (float)((0.5 + mm_rng_uniform(g)) / 64.0 / sqrt(PL_H));
  for (size_t i = 0; i < sizeof p->w2_sf / 4; ++i) p->w2_sf[i] = (float)((0.5 + mm_rng_uniform(g)) / 64.0 / sqrt(PL_I));
  float row[128];
  for (int r = 0; r < PL_R; ++r)
    for (int t = 0; t < PL_T; ++t) {
      for (int b = 0; b < PL_H / 128; ++b) {
        for (int i = 0; i < 128; ++i) row[i] = (float)mm_rng_normal(g);
        ref_quantize_group(row, 128, p->x[r] + t * PL_H + b * 128, &p->x_sf[r][t * (PL_H / 128) + b]);
      }
      for (int k = 0; k < PL_K; ++k) {
        int e, fresh;
        do {
          e = (int)mm_rng_below(g, PL_E);
          fresh = 1;
          for (int j = 0; j < k; ++j) fresh &= p->idx[r][t * PL_K + j] != e;
        } while (!fresh);
        const int masked = mm_rng_below(g, 5) == 0;
        p->idx[r][t * PL_K + k] = masked ? -1 : e;
        p->w[r][t * PL_K + k] = masked ? NAN : (float)(0.05 + mm_rng_uniform(g));
      }
    }
}

/* The reference of every rank with the given inputs (T tokens each). */
static megamoe_status plan_reference(const plan_problem* p, const int64_t* T, uint8_t* const* x, float* const* x_sf,
                                     int32_t* const* idx, float* const* w, uint16_t* const* y) {
  ref_rank_data rd[PL_R];
  const int El = PL_E / PL_R;
  for (int r = 0; r < PL_R; ++r) {
    rd[r].num_tokens = T[r];
    rd[r].x = x[r];
    rd[r].x_sf = x_sf[r];
    rd[r].topk_idx = idx[r];
    rd[r].topk_w = w[r];
    rd[r].y = y[r];
    rd[r].w1 = p->w1 + r * El * 2 * PL_I * PL_H;
    rd[r].w1_sf = p->w1_sf + r * El * (2 * PL_I / 128) * (PL_H / 128);
    rd[r].w2 = p->w2 + r * El * PL_H * PL_I;
    rd[r].w2_sf = p->w2_sf + r * El * (PL_H / 128) * (PL_I / 128);
  }
  return ref_layer_forward(&p->cfg, PL_R, rd);
}

static mm_test_result run_plans(int G, int clamp, int idx64, uint64_t salt, int calls) {
  mm_rng g = unit_rng(salt);
  plan_problem* p = calloc(1, sizeof *p);
  CHECK(p != NULL);
  p->cfg = megamoe_config_make(PL_H, PL_I, PL_E, PL_K, PL_T);
  p->cfg.quant_group = G;
  p->cfg.has_swiglu_clamp = clamp;
  p->cfg.swiglu_clamp = 1.0f;
  plan_problem_fill(&g, p);
  {
    const int64_t T[PL_R] = {PL_T, PL_T};
    uint8_t* x[PL_R] = {p->x[0], p->x[1]};
    float* x_sf[PL_R] = {p->x_sf[0], p->x_sf[1]};
    int32_t* idx[PL_R] = {p->idx[0], p->idx[1]};
    float* w[PL_R] = {p->w[0], p->w[1]};
    uint16_t* y[PL_R] = {p->clean[0], p->clean[1]};
    CHECK_OK(plan_reference(p, T, x, x_sf, idx, w, y));
  }
  static uint8_t x_in[PL_R][PL_T * PL_H], wire[PL_R][8 * PL_T * PL_K];
  static float x_sf_in[PL_R][PL_T * PL_H / 128], w_in[PL_R][PL_T * PL_K];
  static int32_t idx_in[PL_R][PL_T * PL_K];
  static fz_row_expect ex[PL_R][PL_T];
  static uint16_t y[PL_R][PL_T * PL_H];
  fz_inputs in[PL_R];
  for (int r = 0; r < PL_R; ++r) {
    fz_inputs i0 = {x_in[r], x_sf_in[r], idx_in[r], w_in[r], wire[r], ex[r], 0, 0, {0}};
    in[r] = i0;
  }
  int host_errors = 0, index_errors = 0, judged = 0;
  for (int call = 0; call < calls; ++call) {
    fz_plan plan;
    fz_draw(&g, PL_R, PL_T, PL_K, PL_E, idx64, &plan);
    int64_t T[PL_R];
    for (int r = 0; r < PL_R; ++r) {
      const fz_rank_plan* q = &plan.rank[r];
      fz_make_inputs(q, p->x[r], p->x_sf[r], p->idx[r], p->w[r], PL_T, PL_H, PL_K, clamp, idx64, &in[r]);
      T[r] = q->T;
      /* megamoe_forward's host checks on the arguments the GPU fuzz passes
       * (device addresses stand in: only their values are looked at). */
      uint8_t* base = (uint8_t*)(uintptr_t)0x7f0000000000ull;
      const megamoe_forward_args a = fz_make_args(q, base, base + 0x100000, base + 0x200000, base + 0x300000,
                                                  base + 0x400000 + FZ_GUARD_BYTES, idx64);
      const megamoe_status st = mm_check_forward_args(&p->cfg, q->error == FZ_NULL_ARGS ? NULL : &a);
      if (q->error >= 0 && fz_errors[q->error].host) {
        CHECK_MSG(st == fz_errors[q->error].status && strstr(megamoe_last_error(), fz_errors[q->error].text),
                  "call %d rank %d, %s: the host check gave %s: %s", call, r, fz_errors[q->error].name,
                  megamoe_status_string(st), megamoe_last_error());
        host_errors++;
      } else {
        CHECK_MSG(st == MEGAMOE_OK, "call %d rank %d (error %d): the host check gave %s: %s", call, r, q->error,
                  megamoe_status_string(st), megamoe_last_error());
      }
      if (q->error >= 0 && !fz_errors[q->error].host) {
        /* The planted element is outside [-1, E), as passed. */
        const int64_t at = q->err_t * PL_K + q->err_k;
        int64_t v;
        if (idx64) memcpy(&v, wire[r] + 8 * at, 8);
        else {
          int32_t v32;
          memcpy(&v32, wire[r] + 4 * at, 4);
          v = v32;
        }
        CHECK_MSG(v < -1 || v >= PL_E, "call %d: planted index %lld", call, (long long)v);
        CHECK_MSG(at < q->T * PL_K, "call %d: planted index past T", call);
        index_errors++;
      }
    }
    if (plan.bad_rank >= 0) continue;
    uint8_t* x[PL_R] = {x_in[0], x_in[1]};
    float* x_sf[PL_R] = {x_sf_in[0], x_sf_in[1]};
    int32_t* idx[PL_R] = {idx_in[0], idx_in[1]};
    float* w[PL_R] = {w_in[0], w_in[1]};
    uint16_t* yy[PL_R] = {y[0], y[1]};
    CHECK_OK(plan_reference(p, T, x, x_sf, idx, w, yy));
    for (int r = 0; r < PL_R; ++r) {
      char why[512] = "";
      const int64_t bad = fz_judge_rows(y[r], p->clean[r], y[r], idx_in[r], PL_K, T[r], PL_H, ex[r], why, sizeof why);
      CHECK_MSG(bad < 0, "call %d rank %d token %lld (kind %d): %s", call, r, (long long)bad,
                bad < 0 ? 0 : (int)ex[r][bad].kind, why);
      judged++;
    }
  }
  printf("    G %d%s, %s top-k: %d plans, %d host rejections as the library makes them, %d bad indices, %d ranks' "
         "outputs judged (%d NaN rows, %d duplicated experts)\n",
         G, clamp ? ", clamp" : "", idx64 ? "int64" : "int32", calls, host_errors, index_errors, judged,
         in[0].nan_rows + in[1].nan_rows, in[0].dups + in[1].dups);
  CHECK(host_errors > 0 && index_errors > 0 && in[0].nan_rows + in[1].nan_rows > 0 && in[0].dups + in[1].dups > 0);
  free(p);
  return MM_TEST_PASS;
}

static mm_test_result t_plans_g128(void) { return run_plans(128, 0, 0, 0xfc10, 200); }
static mm_test_result t_plans_g64_clamp(void) { return run_plans(64, 1, 1, 0xfc11, 200); }

const mm_test unit_suite_fuzz_checks[] = {
    {"fuzz_checks.guards_find_writes_outside_y", t_guards},
    {"fuzz_checks.rows_find_each_planted_bug", t_rows},
    {"fuzz_checks.plans_on_the_reference (G 128, int32)", t_plans_g128},
    {"fuzz_checks.plans_on_the_reference (G 64, clamp, int64)", t_plans_g64_clamp},
    {NULL, NULL},
};
