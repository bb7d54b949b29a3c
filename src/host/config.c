/* Configuration checks: every rejection names the argument and the limit. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "errors.h"
#include "megamoe.h"

const char* megamoe_arm_name(megamoe_arm arm) {
  switch (arm) {
    case MEGAMOE_ARM_STAGED: return "staged";
    case MEGAMOE_ARM_SPLIT: return "split";
    case MEGAMOE_ARM_FUSED: return "fused";
    case MEGAMOE_ARM_COUNT: break;
  }
  return "unknown";
}

megamoe_config megamoe_config_make(int64_t hidden, int64_t intermediate, int32_t num_experts,
                                   int32_t top_k, int64_t max_tokens_per_rank) {
  megamoe_config c;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.max_tokens_per_rank = max_tokens_per_rank;
  c.quant_group = 128;
  c.has_swiglu_clamp = 0;
  c.swiglu_clamp = 0.0f;
  c.arm = MEGAMOE_ARM_STAGED;
  c.timeout_s = MEGAMOE_DEFAULT_TIMEOUT_S;
  c.pool_imbalance = 0.0;
  return c;
}

megamoe_status megamoe_check_config(const megamoe_config* c, int num_ranks) {
  mm_clear_error();
  MM_CHECK_NULL(c, "config");
  if (num_ranks < 1 || num_ranks > MEGAMOE_MAX_RANKS)
    return mm_fail(MEGAMOE_ERR_BAD_RANKS, "num_ranks = %d: must be in [1, %d]", num_ranks,
                   MEGAMOE_MAX_RANKS);
  if (c->hidden <= 0 || c->hidden % 128 != 0)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "hidden = %lld: must be a positive multiple of 128",
                   (long long)c->hidden);
  if (c->hidden > MEGAMOE_MAX_HIDDEN)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "hidden = %lld: above the kernels' limit %d",
                   (long long)c->hidden, MEGAMOE_MAX_HIDDEN);
  if (c->intermediate <= 0 || c->intermediate % 128 != 0)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE,
                   "intermediate = %lld: must be a positive multiple of 128",
                   (long long)c->intermediate);
  if (c->intermediate > MEGAMOE_MAX_INTERMEDIATE)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE,
                   "intermediate = %lld: above the kernels' limit %d (the L1 epilogue keeps "
                   "one row's quantization groups on chip)",
                   (long long)c->intermediate, MEGAMOE_MAX_INTERMEDIATE);
  if (c->num_experts < 1)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS, "num_experts = %d: must be at least 1",
                   (int)c->num_experts);
  if (c->num_experts % num_ranks != 0)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS,
                   "num_experts = %d: not divisible by the rank count %d", (int)c->num_experts,
                   num_ranks);
  if (c->num_experts / num_ranks > MEGAMOE_MAX_LOCAL_EXPERTS)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS,
                   "num_experts = %d: %d local experts per rank, above the limit %d",
                   (int)c->num_experts, (int)(c->num_experts / num_ranks),
                   MEGAMOE_MAX_LOCAL_EXPERTS);
  if (c->top_k < 1 || c->top_k > c->num_experts)
    return mm_fail(MEGAMOE_ERR_BAD_TOP_K, "top_k = %d: must be in [1, num_experts = %d]",
                   (int)c->top_k, (int)c->num_experts);
  if (c->top_k > MEGAMOE_MAX_TOP_K)
    return mm_fail(MEGAMOE_ERR_BAD_TOP_K, "top_k = %d: above the kernels' limit %d",
                   (int)c->top_k, MEGAMOE_MAX_TOP_K);
  if (c->max_tokens_per_rank < 1)
    return mm_fail(MEGAMOE_ERR_BAD_MAX_TOKENS, "max_tokens_per_rank = %lld: must be at least 1",
                   (long long)c->max_tokens_per_rank);
  /* token_slot = t * K + k is an int32 on the device. */
  if (c->max_tokens_per_rank > INT32_MAX / c->top_k)
    return mm_fail(MEGAMOE_ERR_SIZE_OVERFLOW,
                   "max_tokens_per_rank = %lld: max_tokens_per_rank * top_k overflows 32 bits",
                   (long long)c->max_tokens_per_rank);
  if (c->quant_group != 64 && c->quant_group != 128)
    return mm_fail(MEGAMOE_ERR_BAD_QUANT_GROUP, "quant_group = %d: must be 64 or 128",
                   (int)c->quant_group);
  if (c->has_swiglu_clamp != 0 && c->has_swiglu_clamp != 1)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "has_swiglu_clamp = %d: must be 0 or 1",
                   (int)c->has_swiglu_clamp);
  if (c->has_swiglu_clamp && !(c->swiglu_clamp > 0.0f && isfinite(c->swiglu_clamp)))
    return mm_fail(MEGAMOE_ERR_BAD_CLAMP, "swiglu_clamp = %g: must be positive and finite",
                   (double)c->swiglu_clamp);
  if ((int)c->arm < 0 || c->arm >= MEGAMOE_ARM_COUNT)
    return mm_fail(MEGAMOE_ERR_BAD_ARM, "arm = %d: not a megamoe_arm", (int)c->arm);
  if (isnan(c->timeout_s) || c->timeout_s > 86400.0 * 365)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "timeout_s = %g: must be at most a year",
                   c->timeout_s);
  if (!(c->pool_imbalance == 0.0 || (c->pool_imbalance >= 1.0 && c->pool_imbalance <= (double)num_ranks)))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                   "pool_imbalance = %g: must be 0 (the worst case) or in [1, num_ranks = %d]",
                   c->pool_imbalance, num_ranks);
  return MEGAMOE_OK;
}

megamoe_status mm_check_token_bound(const megamoe_config* c, int64_t num_tokens, int64_t bound) {
  if (bound != 0 && (bound < num_tokens || bound > c->max_tokens_per_rank))
    return mm_fail(MEGAMOE_ERR_TOO_MANY_TOKENS,
                   "args->num_tokens_bound = %lld: must be 0 or in [num_tokens = %lld, max_tokens_per_rank = %lld]",
                   (long long)bound, (long long)num_tokens, (long long)c->max_tokens_per_rank);
  return MEGAMOE_OK;
}

megamoe_status mm_check_forward_args(const megamoe_config* c, const megamoe_forward_args* a) {
  MM_CHECK_NULL(a, "args");
  const int64_t T = a->num_tokens;
  if (T < 0) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->num_tokens = %lld: negative", (long long)T);
  if (T > c->max_tokens_per_rank)
    return mm_fail(MEGAMOE_ERR_TOO_MANY_TOKENS, "args->num_tokens = %lld: above max_tokens_per_rank = %lld",
                   (long long)T, (long long)c->max_tokens_per_rank);
  MM_TRY(mm_check_token_bound(c, T, a->num_tokens_bound));
  if (a->topk_idx_type != MEGAMOE_INDEX_INT32 && a->topk_idx_type != MEGAMOE_INDEX_INT64)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->topk_idx_type = %d: not a megamoe_index_type",
                   (int)a->topk_idx_type);
  if (T > 0) {
    MM_CHECK_NULL(a->x, "args->x");
    MM_CHECK_NULL(a->x_sf, "args->x_sf");
    MM_CHECK_NULL(a->topk_idx, "args->topk_idx");
    MM_CHECK_NULL(a->topk_w, "args->topk_w");
    MM_CHECK_NULL(a->y, "args->y");
    if ((uintptr_t)a->y % 16)
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->y must be 16-byte aligned");
    const unsigned idx_align = a->topk_idx_type == MEGAMOE_INDEX_INT64 ? 8 : 4;
    if ((uintptr_t)a->topk_idx % idx_align)
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->topk_idx must be %u-byte aligned (%s indices)", idx_align,
                     idx_align == 8 ? "int64" : "int32");
    if ((uintptr_t)a->topk_w % 4) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->topk_w must be 4-byte aligned");
    if ((uintptr_t)a->x_sf % 4) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->x_sf must be 4-byte aligned");
    /* x has no alignment requirement: it is staged with a byte copy. */
  }
  return MEGAMOE_OK;
}

/* ---- Same config on every rank ---------------------------------------------- */
static int64_t double_bits(double v) {
  int64_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

static double bits_double(int64_t b) {
  double v;
  memcpy(&v, &b, sizeof v);
  return v;
}

void mm_config_print_make(const megamoe_config* c, megamoe_status status, mm_config_print* p) {
  memset(p, 0, sizeof *p);
  p->field[MM_PRINT_STATUS] = status;
  p->field[MM_PRINT_VERSION] = MEGAMOE_VERSION;
  if (status != MEGAMOE_OK || !c) return;
  p->field[MM_PRINT_HIDDEN] = c->hidden;
  p->field[MM_PRINT_INTERMEDIATE] = c->intermediate;
  p->field[MM_PRINT_EXPERTS] = c->num_experts;
  p->field[MM_PRINT_TOP_K] = c->top_k;
  p->field[MM_PRINT_MAX_TOKENS] = c->max_tokens_per_rank;
  p->field[MM_PRINT_QUANT_GROUP] = c->quant_group;
  p->field[MM_PRINT_HAS_CLAMP] = c->has_swiglu_clamp;
  p->field[MM_PRINT_CLAMP] = c->has_swiglu_clamp ? double_bits((double)c->swiglu_clamp) : 0; /* exact */
  p->field[MM_PRINT_ARM] = (int64_t)c->arm;
  /* Compared as the deadline in effect (0 and -1 both mean the default); a
   * NaN keeps its bits, so megamoe_check_config rejects it on every rank. */
  p->field[MM_PRINT_TIMEOUT] = double_bits(c->timeout_s <= 0 ? MEGAMOE_DEFAULT_TIMEOUT_S : c->timeout_s);
  p->field[MM_PRINT_IMBALANCE] = double_bits(c->pool_imbalance);
}

const char* mm_config_print_name(int field) {
  static const char* const names[MM_PRINT_FIELDS] = {
      "status", "library version", "hidden", "intermediate", "num_experts", "top_k", "max_tokens_per_rank",
      "quant_group", "has_swiglu_clamp", "swiglu_clamp", "arm", "timeout_s", "pool_imbalance"};
  return field >= 0 && field < MM_PRINT_FIELDS ? names[field] : "unknown";
}

/* One field's value as text, the way the config holds it. */
static void print_value(int field, int64_t v, char* out, size_t n) {
  switch (field) {
    case MM_PRINT_CLAMP:
    case MM_PRINT_TIMEOUT:
    case MM_PRINT_IMBALANCE: snprintf(out, n, "%g", bits_double(v)); break;
    case MM_PRINT_ARM: snprintf(out, n, "%lld (%s)", (long long)v, megamoe_arm_name((megamoe_arm)v)); break;
    case MM_PRINT_VERSION: snprintf(out, n, "%lld.%lld", (long long)(v / 1000), (long long)(v % 1000)); break;
    default: snprintf(out, n, "%lld", (long long)v); break;
  }
}

/* Floating-point fields compare as values (0.0 and -0.0 act the same); two
 * NaNs compare equal, so megamoe_check_config rejects them alike everywhere. */
static int print_field_equal(int field, int64_t a, int64_t b) {
  switch (field) {
    case MM_PRINT_CLAMP:
    case MM_PRINT_TIMEOUT:
    case MM_PRINT_IMBALANCE: {
      const double x = bits_double(a), y = bits_double(b);
      return x == y || (isnan(x) && isnan(y));
    }
    default: return a == b;
  }
}

megamoe_status mm_config_prints_compare(const mm_config_print* prints, int num_ranks, int rank) {
  for (int r = 0; r < num_ranks; ++r) {
    const int64_t st = prints[r].field[MM_PRINT_STATUS];
    if (r != rank && st != MEGAMOE_OK)
      return mm_fail(MEGAMOE_ERR_PEER_FAILED, "megamoe_create on rank %d rejected its arguments (%s); no layer was made",
                     r, megamoe_status_string(st > 0 && st < MEGAMOE_STATUS_COUNT ? (megamoe_status)st
                                                                                  : MEGAMOE_ERR_INTERNAL));
  }
  for (int f = MM_PRINT_VERSION; f < MM_PRINT_FIELDS; ++f)
    for (int r = 1; r < num_ranks; ++r) {
      if (print_field_equal(f, prints[r].field[f], prints[0].field[f])) continue;
      char first[48], other[48];
      print_value(f, prints[0].field[f], first, sizeof first);
      print_value(f, prints[r].field[f], other, sizeof other);
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                     "config differs across ranks: %s = %s on rank 0, %s on rank %d (every rank must pass the same "
                     "config to megamoe_create; no layer was made)",
                     mm_config_print_name(f), first, other, r);
    }
  return MEGAMOE_OK;
}
