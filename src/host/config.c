/* Configuration checks: every rejection names the argument and the limit. */
#include <math.h>

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
