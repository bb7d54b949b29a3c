/* The fused arm's ring and per-call order on the host (docs/FUSED.md
 * sections 3-5): how many ring slots the layout holds (from T_max, at
 * create) and which order a call takes (from its num_tokens_bound). Pure
 * host C: no CUDA call, so the CPU tests check every number. */
#ifndef MEGAMOE_FUSED_PLAN_H
#define MEGAMOE_FUSED_PLAN_H

#include <stdint.h>

#include "fused.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ring a layer holds (fixed at create). */
typedef struct mm_fused_ring {
  int32_t blocks;         /* slots of MM_FUSED_BLOCK_ROWS rows */
  int32_t lag, group;     /* the lag order it is sized for: blocks = 8 (lag + group) + 4 (+ extra_blocks) unless clamped
                             (or grown with grown_order: then more, extra_blocks 0) */
  int32_t clamped;        /* 1: the ring holds the worst case at T_max, never wraps, every call is single-wave
                             (extra_blocks 0) */
  int32_t virtual_blocks; /* blocks of the worst case at T_max: the per-block counters of one bank */
  int32_t dynamic_claim;  /* 0 / 1: no call's / every call's order claims tasks (MEGAMOE_FUSED_DYNAMIC at
                             create, diagnostics); MM_FUSED_CLAIM_AUTO (the default): mm_fused_claim_for */
  int32_t lag_percent;    /* the lag rule's percentage (MM_FUSED_LAG_PERCENT; MEGAMOE_FUSED_LAG_PERCENT at create) */
  int32_t extra_blocks;   /* slots beyond the ones the order is chosen from (0; MEGAMOE_FUSED_RING_PERCENT at
                             create, a diagnostic): the lag order's pull runs further ahead, its slots wrap
                             later or never, and the calls keep the order the smaller ring gives them */
  int32_t grown_order;    /* 1: the ring was grown and its calls take the grown ring's orders instead
                             (extra_blocks then 0; MEGAMOE_FUSED_RING_ORDER=1 at create, a diagnostic:
                             with the whole forward's ring, single wave at every bound) */
} mm_fused_ring;

/* The slots a call's order is chosen from: the ring less the slots a
 * diagnostic grew it by (MEGAMOE_FUSED_RING_PERCENT). */
static inline int32_t mm_fused_order_blocks(const mm_fused_ring* ring) { return ring->blocks - ring->extra_blocks; }

/* The dynamic claim where it was measured to win: calls whose L1 tile has
 * 128 rows (the large pair; one H200, EP1: fused -2 to -6 % at 2048 tokens,
 * within the noise at 8192), not the decode pair's short tiles (+6 % at 512
 * tokens; docs/PERF.md, thirteenth session). */
#define MM_FUSED_CLAIM_AUTO 2
static inline int32_t mm_fused_claim_for(const mm_fused_ring* ring, int l1_tile_rows) {
  return ring->dynamic_claim == MM_FUSED_CLAIM_AUTO ? l1_tile_rows >= 128 : ring->dynamic_claim;
}

/* Units of a call of `tokens` tokens per rank under uniform routing: each
 * local expert receives tokens * K / E_l rows (R * tokens * K slots over E
 * experts, E_l of them here), cut in units of MM_FUSED_UNIT_ROWS. */
int64_t mm_fused_units_estimate(const megamoe_config* config, int num_ranks, int64_t tokens);

/* The lag rule: clamp(round(percent / 100 x units), 8, 64) in integers
 * (halves round up); the layer's percent is MM_FUSED_LAG_PERCENT (45). */
int32_t mm_fused_lag_rule(int64_t percent, int64_t units);

/* An upper bound of the blocks a forward lays out when every rank holds at
 * most `tokens` tokens, whatever the routing: N = R * tokens * K rows over E_l
 * experts take sum ceil(n_e / 128) <= (N + 127 E_l) / 128 blocks, and never
 * more than N. */
int64_t mm_fused_worst_blocks(const megamoe_config* config, int num_ranks, int64_t tokens);

/* The ring of a fused layer: sized for the lag of T_max, clamped to the worst
 * case at T_max. Checks the config first. */
megamoe_status mm_fused_ring_make(const megamoe_config* config, int num_ranks, mm_fused_ring* ring);

/* The order of one call: num_tokens_bound (0: T_max) must be 0 or in
 * [num_tokens, T_max] (MEGAMOE_ERR_TOO_MANY_TOKENS naming num_tokens_bound,
 * as megamoe_forward says). Single wave when the worst case at the bound fits
 * the ring less its extra_blocks, else the lag order with the bound's lag
 * (never above the ring's). */
megamoe_status mm_fused_call_order(const mm_fused_ring* ring, const megamoe_config* config, int num_ranks,
                                   int64_t num_tokens, int64_t num_tokens_bound, mm_fused_order* order);

/* The largest bound in [0, T_max] whose calls take the single-wave order (what
 * `megamoe info` prints). */
int64_t mm_fused_single_wave_limit(const mm_fused_ring* ring, const megamoe_config* config, int num_ranks);

#ifdef __cplusplus
}
#endif

#endif
