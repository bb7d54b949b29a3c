/* The fused arm's ring and per-call order (fused_plan.h, docs/FUSED.md). */
#include "fused_plan.h"

#include "config.h"
#include "errors.h"

int64_t mm_fused_units_estimate(const megamoe_config* c, int num_ranks, int64_t tokens) {
  const int64_t El = c->num_experts / num_ranks;
  /* tokens * K < 2^31 (T_max * K is checked to fit int32). */
  const int64_t rows = mm_fused_ceil_div(tokens * c->top_k, El);
  return El * mm_fused_ceil_div(rows, MM_FUSED_UNIT_ROWS);
}

int32_t mm_fused_lag_rule(int64_t percent, int64_t units) {
  const int64_t lag = (percent * units + 50) / 100;
  return (int32_t)mm_fused_clamp64(lag, MM_FUSED_LAG_MIN, MM_FUSED_LAG_MAX);
}

int64_t mm_fused_worst_blocks(const megamoe_config* c, int num_ranks, int64_t tokens) {
  const int64_t El = c->num_experts / num_ranks;
  const int64_t rows = (int64_t)num_ranks * tokens * c->top_k;
  const int64_t blocks = (rows + (MM_FUSED_BLOCK_ROWS - 1) * El) / MM_FUSED_BLOCK_ROWS;
  return blocks < rows ? blocks : rows;
}

megamoe_status mm_fused_ring_make(const megamoe_config* c, int num_ranks, mm_fused_ring* ring) {
  MM_TRY(megamoe_check_config(c, num_ranks));
  MM_CHECK_NULL(ring, "ring");
  const int64_t worst = mm_fused_worst_blocks(c, num_ranks, c->max_tokens_per_rank);
  /* The counters and the device's row sums are int32 (the pool's worst case
   * is checked to fit 31 bits where the layout is made). */
  if (worst > INT32_MAX / MM_FUSED_BLOCK_ROWS)
    return mm_fail(MEGAMOE_ERR_SIZE_OVERFLOW,
                   "max_tokens_per_rank = %lld: the fused arm's virtual pool does not fit in 31 bits",
                   (long long)c->max_tokens_per_rank);
  /* The rule's percentage: MM_FUSED_LAG_PERCENT, or MEGAMOE_FUSED_LAG_PERCENT
   * (1..400: the bench's lag ladder, a diagnostic), read once here: the ring
   * is sized for it and every call's order uses the same. */
  const int32_t percent = mm_env_int("MEGAMOE_FUSED_LAG_PERCENT", 1, 400, MM_FUSED_LAG_PERCENT);
  const int32_t lag = mm_fused_lag_rule(percent, mm_fused_units_estimate(c, num_ranks, c->max_tokens_per_rank));
  const int64_t lagged = (int64_t)MM_FUSED_UNIT_BLOCKS * (lag + MM_FUSED_GROUP) + MM_FUSED_RING_MARGIN;
  ring->lag = lag;
  ring->lag_percent = percent;
  ring->group = MM_FUSED_GROUP;
  ring->clamped = worst <= lagged;
  ring->blocks = (int32_t)(ring->clamped ? worst : lagged);
  ring->virtual_blocks = (int32_t)worst;
  /* MEGAMOE_FUSED_RING_PERCENT (100..10000, a diagnostic): the ring grown to
   * that percentage of its size, at most the worst case, while every call
   * keeps the order of the ring above; it separates what the slots' waits
   * cost the lag order from what its order costs (docs/PERF.md). */
  const int32_t ring_percent = mm_env_int("MEGAMOE_FUSED_RING_PERCENT", 100, 10000, 100);
  const int64_t grown = (int64_t)ring->blocks * ring_percent / 100;
  ring->extra_blocks = (int32_t)((grown < worst ? grown : worst) - ring->blocks);
  ring->blocks += ring->extra_blocks;
  /* MEGAMOE_FUSED_RING_ORDER=1 (a diagnostic beside it): the calls take the
   * grown ring's orders, so a ring of the whole forward gives the single
   * wave (every L1 task before any L2 task, the split arm's order in one
   * kernel) at any bound: the fused order against its interleaving. */
  ring->grown_order = ring->extra_blocks > 0 && mm_env_int("MEGAMOE_FUSED_RING_ORDER", 0, 1, 0);
  if (ring->grown_order) ring->extra_blocks = 0;
  /* Whether tasks are claimed from a grid counter (fused_plan.h): the
   * default MM_FUSED_CLAIM_AUTO, or MEGAMOE_FUSED_DYNAMIC=0 / 1 (never /
   * always, diagnostics). Read once, not per forward. */
  ring->dynamic_claim = mm_env_int("MEGAMOE_FUSED_DYNAMIC", 0, 1, MM_FUSED_CLAIM_AUTO);
  return MEGAMOE_OK;
}

megamoe_status mm_fused_call_order(const mm_fused_ring* ring, const megamoe_config* c, int num_ranks,
                                   int64_t num_tokens, int64_t num_tokens_bound, mm_fused_order* order) {
  MM_CHECK_NULL(ring, "ring");
  MM_CHECK_NULL(c, "config");
  MM_CHECK_NULL(order, "order");
  MM_TRY(mm_check_token_bound(c, num_tokens, num_tokens_bound));
  const int64_t tokens = num_tokens_bound > 0 ? num_tokens_bound : c->max_tokens_per_rank;
  order->ring_blocks = ring->blocks;
  order->group = ring->group;
  order->dynamic_claim = 0; /* the caller's, by the call's L1 tile (mm_fused_claim_for) */
  order->single_wave = mm_fused_worst_blocks(c, num_ranks, tokens) <= mm_fused_order_blocks(ring);
  /* A smaller bound never asks for a longer lag (the units estimate grows
   * with the tokens); the min keeps the ring's proof if the rule changes. */
  const int32_t lag = mm_fused_lag_rule(ring->lag_percent, mm_fused_units_estimate(c, num_ranks, tokens));
  order->lag = order->single_wave ? 0 : (lag < ring->lag ? lag : ring->lag);
  /* The live set of the lag order (docs/FUSED.md section 4) must fit the
   * ring; true by construction for a ring from mm_fused_ring_make. */
  if (!order->single_wave && (int64_t)ring->blocks < (int64_t)MM_FUSED_UNIT_BLOCKS * (order->lag + order->group))
    return mm_fail(MEGAMOE_ERR_INTERNAL,
                   "fused ring of %d blocks below the live set of the lag order, 8 x (lag %d + group %d) blocks",
                   ring->blocks, order->lag, order->group);
  return MEGAMOE_OK;
}

int64_t mm_fused_single_wave_limit(const mm_fused_ring* ring, const megamoe_config* c, int num_ranks) {
  int64_t lo = 0, hi = c->max_tokens_per_rank; /* worst(0) = 0 fits; worst grows with the tokens */
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (mm_fused_worst_blocks(c, num_ranks, mid) <= mm_fused_order_blocks(ring)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
