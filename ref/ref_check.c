/* The per-token layer-output checker (ref_check.h). */
#include "ref_check.h"

#include <math.h>
#include <string.h>

#include "ref.h"

ref_check_bounds ref_check_default_bounds(void) {
  ref_check_bounds b;
  b.row_rel_err = REF_CHECK_BOUND_ROW_REL_ERR;
  b.row_abs_over_scale = REF_CHECK_BOUND_ROW_ABS_OVER_SCALE;
  b.diff = REF_CHECK_BOUND_DIFF;
  b.scale_floor = REF_CHECK_SCALE_FLOOR;
  return b;
}

const char* ref_check_failure_name(ref_check_failure failure) {
  switch (failure) {
    case REF_CHECK_PASSED: return "passed";
    case REF_CHECK_BAD_INPUT: return "bad input";
    case REF_CHECK_BAD_REFERENCE: return "non-finite reference";
    case REF_CHECK_NONFINITE: return "NaN/Inf in y";
    case REF_CHECK_MASKED_NONZERO: return "all slots masked but y != 0";
    case REF_CHECK_ROW_REL_ERR: return "row rel err";
    case REF_CHECK_ROW_ABS_ERR: return "row max abs/scale";
    case REF_CHECK_DIFF: return "whole-rank diff";
  }
  return "unknown";
}

/* Records a token's failure; the lowest token (the scan goes up) and, inside
 * a token, the first reason found wins. */
static void note_failure(ref_check_stats* s, ref_check_failure why, int64_t token) {
  if (s->first_failure == REF_CHECK_PASSED) {
    s->first_failure = why;
    s->first_failure_token = token;
  }
}

/* A bound must be a positive number; NaN compares false and is refused too. */
static int bound_ok(double b) { return b > 0.0 && b < INFINITY; }

int ref_check_output(const uint16_t* y, const uint16_t* y_ref, int64_t num_tokens, int64_t hidden,
                     const int32_t* topk_idx, int64_t top_k, const ref_check_bounds* bounds,
                     ref_check_stats* stats) {
  if (!stats) return 0;
  memset(stats, 0, sizeof *stats);
  stats->bounds = bounds ? *bounds : ref_check_default_bounds();
  stats->max_rel_err_token = -1;
  stats->max_abs_over_scale_token = -1;
  stats->first_failure_token = -1;
  const ref_check_bounds* b = &stats->bounds;
  if (num_tokens < 0 || hidden <= 0 || top_k <= 0 || !bound_ok(b->row_rel_err) ||
      !bound_ok(b->row_abs_over_scale) || !bound_ok(b->diff) || !bound_ok(b->scale_floor) ||
      (num_tokens > 0 && (!y || !y_ref || !topk_idx))) {
    stats->first_failure = REF_CHECK_BAD_INPUT;
    return 0;
  }
  stats->tokens_checked = num_tokens;
  const double sqrt_h = sqrt((double)hidden);

  for (int64_t t = 0; t < num_tokens; ++t) {
    const uint16_t* row = y + t * hidden;
    const uint16_t* ref_row = y_ref + t * hidden;
    int live = 0;
    for (int64_t k = 0; k < top_k; ++k) live |= topk_idx[t * top_k + k] >= 0;

    /* One pass: finiteness, the error's norm and max, the reference's norm. */
    int row_nonfinite = 0, ref_nonfinite = 0, nonzero_bits = 0;
    double err_sq = 0.0, err_max = 0.0, ref_sq = 0.0;
    for (int64_t n = 0; n < hidden; ++n) {
      const double v = ref_bf16_decode(row[n]);
      const double r = ref_bf16_decode(ref_row[n]);
      nonzero_bits |= row[n] != 0;
      if (!isfinite(v)) {
        row_nonfinite = 1;
        stats->nonfinite++;
      }
      if (!isfinite(r)) ref_nonfinite = 1;
      if (!isfinite(v) || !isfinite(r)) continue;
      const double d = fabs(v - r);
      err_sq += d * d;
      if (d > err_max) err_max = d;
      ref_sq += r * r;
    }

    if (!live) stats->tokens_masked++;
    ref_check_failure why = REF_CHECK_PASSED;
    if (ref_nonfinite) why = REF_CHECK_BAD_REFERENCE;
    else if (row_nonfinite) why = REF_CHECK_NONFINITE;
    else if (!live && nonzero_bits) why = REF_CHECK_MASKED_NONZERO;
    if (why != REF_CHECK_PASSED || !live) {
      /* No error statistics for these rows: a masked row has no scale, a
       * non-finite one no meaningful error. */
      if (why != REF_CHECK_PASSED) {
        note_failure(stats, why, t);
        stats->tokens_failed++;
      }
      continue;
    }

    const double rms = sqrt(ref_sq) / sqrt_h;
    const double scale = rms > b->scale_floor ? rms : b->scale_floor;
    const double rel_err = sqrt(err_sq) / (scale * sqrt_h);
    const double abs_over_scale = err_max / scale;
    if (stats->max_rel_err_token < 0 || rel_err > stats->max_rel_err) {
      stats->max_rel_err = rel_err;
      stats->max_rel_err_token = t;
    }
    if (stats->max_abs_over_scale_token < 0 || abs_over_scale > stats->max_abs_over_scale) {
      stats->max_abs_over_scale = abs_over_scale;
      stats->max_abs_over_scale_token = t;
    }
    if (rel_err > b->row_rel_err) why = REF_CHECK_ROW_REL_ERR;
    else if (abs_over_scale > b->row_abs_over_scale) why = REF_CHECK_ROW_ABS_ERR;
    if (why != REF_CHECK_PASSED) {
      note_failure(stats, why, t);
      stats->tokens_failed++;
    }
  }

  stats->diff = num_tokens > 0 ? ref_diff_bf16(y, y_ref, (size_t)(num_tokens * hidden)) : 0.0;
  const int64_t live_tokens = num_tokens - stats->tokens_masked;
  stats->diff_judged = live_tokens >= REF_CHECK_DIFF_MIN_TOKENS || isnan(stats->diff);
  if (stats->diff_judged && !(stats->diff <= b->diff)) note_failure(stats, REF_CHECK_DIFF, -1);
  stats->pass = stats->first_failure == REF_CHECK_PASSED;
  return stats->pass;
}

int ref_check_format(const ref_check_stats* s, char* buffer, size_t size) {
  if (!s) return snprintf(buffer, size, "(no stats)");
  if (s->first_failure == REF_CHECK_BAD_INPUT) return snprintf(buffer, size, "FAIL bad input to ref_check_output");
  char failure[96] = "";
  if (!s->pass) {
    if (s->first_failure_token >= 0)
      snprintf(failure, sizeof failure, "; first failure: %s at token %lld (%lld token(s) failed)",
               ref_check_failure_name(s->first_failure), (long long)s->first_failure_token,
               (long long)s->tokens_failed);
    else
      snprintf(failure, sizeof failure, "; first failure: %s", ref_check_failure_name(s->first_failure));
  }
  char nonfinite[48] = "";
  if (s->nonfinite) snprintf(nonfinite, sizeof nonfinite, " non-finite %lld", (long long)s->nonfinite);
  char diff_bound[48];
  if (s->diff_judged) snprintf(diff_bound, sizeof diff_bound, "bound %.1e", s->bounds.diff);
  else snprintf(diff_bound, sizeof diff_bound, "not judged below %d live tokens", REF_CHECK_DIFF_MIN_TOKENS);
  return snprintf(buffer, size,
                  "%s T %lld (masked %lld)%s max rel err %.3e (token %lld, bound %.2g) "
                  "max abs/scale %.3e (token %lld, bound %.2g) diff %.3e (%s)%s",
                  s->pass ? "PASS" : "FAIL", (long long)s->tokens_checked, (long long)s->tokens_masked,
                  nonfinite, s->max_rel_err, (long long)s->max_rel_err_token, s->bounds.row_rel_err,
                  s->max_abs_over_scale, (long long)s->max_abs_over_scale_token, s->bounds.row_abs_over_scale,
                  s->diff, diff_bound, failure);
}

void ref_check_print(FILE* out, const char* label, const ref_check_stats* stats) {
  char line[512];
  ref_check_format(stats, line, sizeof line);
  fprintf(out, "%s: %s\n", label ? label : "check", line);
}
