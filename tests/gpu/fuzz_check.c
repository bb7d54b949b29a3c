/* The GPU argument fuzz's checks, pure host (fuzz_check.h). */
#include "fuzz_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "ref_check.h"

const char* const fz_poison_name[FZ_POISON_COUNT] = {"NaN in x_sf", "Inf in x_sf", "NaN in x", "NaN routing weight",
                                                     "Inf routing weight"};

static int has_live_slot(const int32_t* idx_row, int64_t K) {
  for (int64_t k = 0; k < K; ++k)
    if (idx_row[k] >= 0) return 1;
  return 0;
}

static fz_row_expect row_expect(fz_row_kind kind, int block) {
  fz_row_expect e = {kind, block, 0};
  return e;
}

/* A row judged against the reference that an Inf scale under the clamp
 * reaches: a whole-row NaN / finite flip is allowed (judge_ref_row). */
static fz_row_expect row_expect_ref_inf(void) {
  fz_row_expect e = {FZ_ROW_REF, 0, 1};
  return e;
}

fz_row_expect fz_poison_token(fz_poison p, int64_t t, uint64_t where, int negative, int has_clamp, uint8_t* x,
                              float* x_sf, const int32_t* idx, float* w, int64_t H, int64_t K) {
  const float inf = negative ? -INFINITY : INFINITY;
  const int live = has_live_slot(idx + t * K, K);
  switch (p) {
    case FZ_POISON_X_SF_NAN: x_sf[t * (H / 128) + (int64_t)(where % (uint64_t)(H / 128))] = NAN; break;
    case FZ_POISON_X_SF_INF:
      x_sf[t * (H / 128) + (int64_t)(where % (uint64_t)(H / 128))] = inf;
      if (has_clamp && live) return row_expect_ref_inf();
      break;
    case FZ_POISON_X_NAN: x[t * H + (int64_t)(where % (uint64_t)H)] = 0x7F; break;
    case FZ_POISON_W_NAN:
    case FZ_POISON_W_INF: {
      const int64_t k = (int64_t)(where % (uint64_t)K);
      w[t * K + k] = p == FZ_POISON_W_NAN ? NAN : inf;
      return row_expect(idx[t * K + k] >= 0 ? FZ_ROW_NAN : FZ_ROW_SAME, 0);
    }
    case FZ_POISON_COUNT: break;
  }
  return row_expect(live ? FZ_ROW_NAN : FZ_ROW_SAME, 0);
}

fz_row_expect fz_weight_poison_expect(int is_w2, int block, int is_inf, int has_clamp, int expert,
                                      const int32_t* idx_row, int64_t K) {
  int routed = 0;
  for (int64_t k = 0; k < K; ++k) routed |= idx_row[k] == expert;
  if (!routed) return row_expect(FZ_ROW_SAME, 0);
  if (is_w2) return row_expect(FZ_ROW_NAN_BLOCK, block);
  return is_inf && has_clamp ? row_expect_ref_inf() : row_expect(FZ_ROW_NAN, 0);
}

void fz_fill_image(uint8_t* image, size_t total, size_t y_offset, size_t y_bytes) {
  memset(image, FZ_GUARD_FILL, total);
  for (size_t i = 0; i + 1 < y_bytes; i += 2) {
    const uint16_t v = FZ_Y_POISON;
    memcpy(image + y_offset + i, &v, sizeof v);
  }
}

int64_t fz_changed_outside(const uint8_t* before, const uint8_t* after, size_t n, size_t lo, size_t hi) {
  for (size_t i = 0; i < n; ++i) {
    if (i >= lo && i < hi) continue;
    if (before[i] != after[i]) return (int64_t)i;
  }
  return -1;
}

/* 0 NaN, 1 +Inf, 2 -Inf, 3 finite. */
static int bf16_class(uint16_t v) {
  if (fz_bf16_nan(v)) return 0;
  if (fz_bf16_nonfinite(v)) return (v & 0x8000u) ? 2 : 1;
  return 3;
}

static const char* const class_name[4] = {"NaN", "+Inf", "-Inf", "finite"};

/* 1 when every element of the row is NaN (want_nan) or every one finite. */
static int row_all(const uint16_t* row, int64_t H, int want_nan) {
  for (int64_t c = 0; c < H; ++c)
    if (bf16_class(row[c]) != (want_nan ? 0 : 3)) return 0;
  return 1;
}

/* FZ_ROW_REF: the reference's non-finite elements exactly, the finite ones
 * through the per-token checker (non-finite columns set to +0 in both).
 * One exception where may_flip (an Inf W1 scale or x_sf under the clamp):
 * a whole-row flip, the row all NaN on one side and all finite on the other.
 * There an element is part * Inf: clamped to a finite value, unless the
 * block's partial sum part is exactly 0 (0 * Inf = NaN, which the L2 GEMM
 * spreads over the whole row). The tensor cores accumulate a block's
 * 128 fp8 products in fp32 with their own rounding, the reference in exact
 * doubles, so "exactly 0" can differ for a sum that is ~0 (seen on one H200:
 * seed 1796104536, G 64, clamp 1, call 6: the GPU row finite, the reference
 * NaN, every arm alike). A partial flip, or any other class mismatch, fails. */
static int judge_ref_row(const uint16_t* y, const uint16_t* ref, const int32_t* idx, int64_t K, int64_t H,
                         int may_flip, char* why, size_t n) {
  if (may_flip && ((row_all(ref, H, 1) && row_all(y, H, 0)) || (row_all(ref, H, 0) && row_all(y, H, 1)))) return 1;
  uint16_t* a = malloc(sizeof(uint16_t) * (size_t)H);
  uint16_t* b = malloc(sizeof(uint16_t) * (size_t)H);
  if (!a || !b) {
    free(a);
    free(b);
    snprintf(why, n, "out of host memory");
    return 0;
  }
  int ok = 1, finite = 0;
  for (int64_t c = 0; c < H && ok; ++c) {
    const int want = bf16_class(ref[c]), got = bf16_class(y[c]);
    if (want != got) {
      snprintf(why, n, "column %lld is %s (0x%04x), the reference %s (0x%04x)", (long long)c, class_name[got],
               (unsigned)y[c], class_name[want], (unsigned)ref[c]);
      ok = 0;
    }
    a[c] = want == 3 ? y[c] : 0;
    b[c] = want == 3 ? ref[c] : 0;
    finite += want == 3;
  }
  if (ok && finite > 0) {
    ref_check_stats s;
    if (!ref_check_output(a, b, 1, H, idx, K, NULL, &s)) {
      char line[512];
      ref_check_format(&s, line, sizeof line);
      snprintf(why, n, "finite columns against the reference: %s", line);
      ok = 0;
    }
  }
  free(a);
  free(b);
  return ok;
}

int64_t fz_judge_rows(const uint16_t* y, const uint16_t* clean, const uint16_t* ref, const int32_t* idx, int64_t K,
                      int64_t T, int64_t H, const fz_row_expect* expect, char* why, size_t n) {
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* row = y + t * H;
    const uint16_t* c0 = clean + t * H;
    for (int64_t c = 0; c < H; ++c)
      if (row[c] == FZ_Y_POISON) {
        snprintf(why, n, "column %lld was not written", (long long)c);
        return t;
      }
    const fz_row_expect* e = &expect[t];
    switch (e->kind) {
      case FZ_ROW_SAME:
        for (int64_t c = 0; c < H; ++c)
          if (row[c] != c0[c]) {
            snprintf(why, n, "column %lld is 0x%04x, the clean run's 0x%04x (nothing of this token changed)",
                     (long long)c, (unsigned)row[c], (unsigned)c0[c]);
            return t;
          }
        break;
      case FZ_ROW_NAN:
        for (int64_t c = 0; c < H; ++c)
          if (!fz_bf16_nan(row[c])) {
            snprintf(why, n, "column %lld is 0x%04x, not NaN (the token has a NaN input)", (long long)c,
                     (unsigned)row[c]);
            return t;
          }
        break;
      case FZ_ROW_NAN_BLOCK:
        for (int64_t c = 0; c < H; ++c) {
          const int in_block = c / 128 == e->block;
          if (in_block && !fz_bf16_nonfinite(row[c])) {
            snprintf(why, n, "column %lld (block %d, behind a non-finite weight scale) is finite: 0x%04x",
                     (long long)c, e->block, (unsigned)row[c]);
            return t;
          }
          if (!in_block && row[c] != c0[c]) {
            snprintf(why, n, "column %lld (outside block %d) is 0x%04x, the clean run's 0x%04x", (long long)c,
                     e->block, (unsigned)row[c], (unsigned)c0[c]);
            return t;
          }
        }
        break;
      case FZ_ROW_REF:
        if (!ref) {
          snprintf(why, n, "no reference row given");
          return t;
        }
        if (!judge_ref_row(row, ref + t * H, idx + t * K, K, H, e->may_flip, why, n)) return t;
        break;
    }
  }
  return -1;
}

/* ---- one call's plan ------------------------------------------------------------ */
const fz_error_info fz_errors[FZ_ERROR_COUNT] = {
    {"top-k index >= E", MEGAMOE_ERR_BAD_TOPK_INDEX, 0, ""},
    {"top-k index < -1", MEGAMOE_ERR_BAD_TOPK_INDEX, 0, ""},
    {"top-k index past 32 bits (int64) or INT32_MIN (int32)", MEGAMOE_ERR_BAD_TOPK_INDEX, 0, ""},
    {"num_tokens above T_max", MEGAMOE_ERR_TOO_MANY_TOKENS, 1, "args->num_tokens"},
    {"num_tokens negative", MEGAMOE_ERR_BAD_ARGUMENT, 1, "args->num_tokens"},
    {"token bound below num_tokens", MEGAMOE_ERR_TOO_MANY_TOKENS, 1, "args->num_tokens_bound"},
    {"token bound above T_max", MEGAMOE_ERR_TOO_MANY_TOKENS, 1, "args->num_tokens_bound"},
    {"NULL x", MEGAMOE_ERR_NULL_POINTER, 1, "args->x"},
    {"NULL x_sf", MEGAMOE_ERR_NULL_POINTER, 1, "args->x_sf"},
    {"NULL topk_idx", MEGAMOE_ERR_NULL_POINTER, 1, "args->topk_idx"},
    {"NULL topk_w", MEGAMOE_ERR_NULL_POINTER, 1, "args->topk_w"},
    {"NULL y", MEGAMOE_ERR_NULL_POINTER, 1, "args->y"},
    {"NULL args", MEGAMOE_ERR_NULL_POINTER, 1, "args"},
    {"y not 16-byte aligned", MEGAMOE_ERR_BAD_ARGUMENT, 1, "args->y"},
    {"topk_idx misaligned", MEGAMOE_ERR_BAD_ARGUMENT, 1, "args->topk_idx"},
    {"topk_w misaligned", MEGAMOE_ERR_BAD_ARGUMENT, 1, "args->topk_w"},
    {"x_sf misaligned", MEGAMOE_ERR_BAD_ARGUMENT, 1, "args->x_sf"},
    {"index type not a megamoe_index_type", MEGAMOE_ERR_BAD_ARGUMENT, 1, "args->topk_idx_type"},
};

static int is_index_error(int e) { return e == FZ_INDEX_HIGH || e == FZ_INDEX_LOW || e == FZ_INDEX_WIDE; }

void fz_draw(mm_rng* g, int R, int64_t Tmax, int K, int E, int idx64, fz_plan* p) {
  memset(p, 0, sizeof *p);
  p->bad_rank = mm_rng_below(g, 3) == 0 ? (int)mm_rng_below(g, (uint64_t)R) : -1;
  for (int r = 0; r < R; ++r) {
    fz_rank_plan* q = &p->rank[r];
    const uint64_t shape = mm_rng_below(g, 10);
    q->T = shape < 5 ? Tmax : shape < 8 ? (int64_t)mm_rng_below(g, (uint64_t)Tmax + 1) : (int64_t)mm_rng_below(g, 3);
    q->error = r == p->bad_rank ? (int)mm_rng_below(g, FZ_ERROR_COUNT) : -1;
    /* Every error but a bad count needs a token to be an error. */
    if (q->error >= 0 && q->error != FZ_T_ABOVE && q->error != FZ_T_NEGATIVE && q->T == 0) q->T = 1;
    q->x_offset = mm_rng_below(g, 8) == 0 ? 1 + (int)mm_rng_below(g, 15) : 0;
    q->null_unused = q->T == 0 && mm_rng_below(g, 2);
    q->dup_t = -1;
    const int npoison = q->T > 0 ? (int)mm_rng_below(g, FZ_MAX_POISONS + 1) : 0;
    for (int i = 0; i < npoison && i < q->T; ++i) { /* distinct tokens */
      int64_t t;
      int fresh;
      do {
        t = (int64_t)mm_rng_below(g, (uint64_t)q->T);
        fresh = 1;
        for (int j = 0; j < i; ++j) fresh &= q->poison[j].t != t;
      } while (!fresh);
      q->poison[i].t = t;
      q->poison[i].kind = (fz_poison)mm_rng_below(g, FZ_POISON_COUNT);
      q->poison[i].where = mm_rng_next(g);
      q->poison[i].negative = (int)mm_rng_below(g, 2);
      q->npoison = i + 1;
    }
    if (q->T > 0 && K >= 2 && mm_rng_below(g, 4) == 0) {
      q->dup_t = (int64_t)mm_rng_below(g, (uint64_t)q->T);
      for (int i = 0; i < q->npoison; ++i)
        if (q->poison[i].t == q->dup_t) q->dup_t = -1; /* one change per token */
    }
    switch (q->error) {
      case FZ_INDEX_HIGH: q->err_value = E + (int64_t)mm_rng_below(g, 1000); break;
      case FZ_INDEX_LOW: q->err_value = -2 - (int64_t)mm_rng_below(g, 1000); break;
      case FZ_INDEX_WIDE:
        /* int64: an expert id plus 2^32 (a truncation would take it for the
         * expert); int32: the most negative index. */
        q->err_value = idx64 ? ((int64_t)1 << 32) + (int64_t)mm_rng_below(g, (uint64_t)E) : (int64_t)INT32_MIN;
        break;
      case FZ_T_ABOVE: q->err_value = mm_rng_below(g, 4) ? Tmax + 1 + (int64_t)mm_rng_below(g, 100) : INT64_MAX; break;
      case FZ_T_NEGATIVE: q->err_value = mm_rng_below(g, 4) ? -1 - (int64_t)mm_rng_below(g, 100) : INT64_MIN; break;
      case FZ_BOUND_BELOW:
        /* In [1, T) or negative (0 means "no bound", which is allowed). */
        q->err_value = q->T > 1 && mm_rng_below(g, 2) ? 1 + (int64_t)mm_rng_below(g, (uint64_t)(q->T - 1)) : -1;
        break;
      case FZ_BOUND_ABOVE: q->err_value = Tmax + 1 + (int64_t)mm_rng_below(g, 100); break;
      case FZ_BAD_INDEX_TYPE: q->err_value = mm_rng_below(g, 2) ? 2 + (int64_t)mm_rng_below(g, 100) : -1; break;
      default: break;
    }
    if (is_index_error(q->error)) {
      q->err_t = (int64_t)mm_rng_below(g, (uint64_t)q->T);
      q->err_k = (int)mm_rng_below(g, (uint64_t)K);
    }
  }
  /* The token bound: 0, or one bound >= every rank's T, the same on every
   * rank (megamoe.h); a rank that carries a bound error passes its own. */
  int64_t most = 0;
  for (int r = 0; r < R; ++r) most = p->rank[r].T > most ? p->rank[r].T : most;
  const int64_t bound = mm_rng_below(g, 2) ? 0 : most + (int64_t)mm_rng_below(g, (uint64_t)(Tmax - most) + 1);
  for (int r = 0; r < R; ++r) p->rank[r].bound = bound;
}

void fz_clean_plan(int R, int64_t Tmax, fz_plan* p) {
  memset(p, 0, sizeof *p);
  p->bad_rank = -1;
  for (int r = 0; r < R; ++r) {
    p->rank[r].T = Tmax;
    p->rank[r].error = -1;
    p->rank[r].dup_t = -1;
  }
}

void fz_make_inputs(const fz_rank_plan* q, const uint8_t* x, const float* x_sf, const int32_t* idx, const float* w,
                    int64_t Tmax, int64_t H, int64_t K, int has_clamp, int idx64, fz_inputs* o) {
  memcpy(o->x, x, (size_t)(Tmax * H));
  memcpy(o->x_sf, x_sf, sizeof(float) * (size_t)(Tmax * H / 128));
  memcpy(o->idx, idx, sizeof(int32_t) * (size_t)(Tmax * K));
  memcpy(o->w, w, sizeof(float) * (size_t)(Tmax * K));
  memset(o->expect, 0, sizeof(fz_row_expect) * (size_t)Tmax);
  for (int i = 0; i < q->npoison; ++i) {
    const int64_t t = q->poison[i].t;
    o->expect[t] = fz_poison_token(q->poison[i].kind, t, q->poison[i].where, q->poison[i].negative, has_clamp, o->x,
                                   o->x_sf, o->idx, o->w, H, K);
    o->poisons[q->poison[i].kind]++;
    o->nan_rows += o->expect[t].kind == FZ_ROW_NAN;
  }
  if (q->dup_t >= 0) {
    /* Slot 1 routed to slot 0's expert, both live (a masked slot's NaN
     * weight replaced); judged against the reference. */
    int32_t* ti = o->idx + q->dup_t * K;
    float* tw = o->w + q->dup_t * K;
    if (ti[0] < 0) ti[0] = ti[1] >= 0 ? ti[1] : 0;
    ti[1] = ti[0];
    if (tw[0] != tw[0]) tw[0] = 0.5f;
    if (tw[1] != tw[1]) tw[1] = 0.25f;
    o->expect[q->dup_t].kind = FZ_ROW_REF;
    o->dups++;
  }
  const int64_t bad_slot = is_index_error(q->error) ? q->err_t * K + q->err_k : -1;
  if (bad_slot >= 0)
    o->idx[bad_slot] = q->err_value < INT32_MIN || q->err_value > INT32_MAX ? INT32_MIN : (int32_t)q->err_value;
  for (int64_t i = 0; i < Tmax * K; ++i) {
    if (idx64) {
      const int64_t v = i == bad_slot ? q->err_value : o->idx[i];
      memcpy(o->idx_wire + 8 * i, &v, 8);
    } else {
      memcpy(o->idx_wire + 4 * i, &o->idx[i], 4);
    }
  }
}

megamoe_forward_args fz_make_args(const fz_rank_plan* q, const uint8_t* x, const void* x_sf, const void* idx,
                                  const void* w, void* y, int idx64) {
  megamoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.x = x + q->x_offset;
  a.x_sf = (const float*)x_sf;
  a.topk_idx = idx;
  a.topk_idx_type = idx64 ? MEGAMOE_INDEX_INT64 : MEGAMOE_INDEX_INT32;
  a.topk_w = (const float*)w;
  a.num_tokens = q->T;
  a.num_tokens_bound = q->bound;
  a.y = y;
  if (q->null_unused) a.x = a.x_sf = a.topk_idx = a.topk_w = a.y = NULL;
  switch (q->error) {
    case FZ_T_ABOVE:
    case FZ_T_NEGATIVE:
      a.num_tokens = q->err_value;
      a.num_tokens_bound = 0;
      break;
    case FZ_BOUND_BELOW:
    case FZ_BOUND_ABOVE: a.num_tokens_bound = q->err_value; break;
    case FZ_NULL_X: a.x = NULL; break;
    case FZ_NULL_X_SF: a.x_sf = NULL; break;
    case FZ_NULL_IDX: a.topk_idx = NULL; break;
    case FZ_NULL_W: a.topk_w = NULL; break;
    case FZ_NULL_Y: a.y = NULL; break;
    case FZ_MISALIGNED_Y: a.y = (uint8_t*)y + 2 * (1 + q->x_offset % 7); break;
    case FZ_MISALIGNED_IDX: a.topk_idx = (const uint8_t*)idx + (idx64 ? 4 : 2); break;
    case FZ_MISALIGNED_W: a.topk_w = (const float*)((const uint8_t*)w + 2); break;
    case FZ_MISALIGNED_X_SF: a.x_sf = (const float*)((const uint8_t*)x_sf + 1 + q->x_offset % 3); break;
    case FZ_BAD_INDEX_TYPE: a.topk_idx_type = (megamoe_index_type)q->err_value; break;
    default: break;
  }
  return a;
}
