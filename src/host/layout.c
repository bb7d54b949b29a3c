/* Buffer layout: named regions with offsets, sizes and alignment, computed
 * with checked 64-bit arithmetic. */
#include "layout.h"

#include <math.h>
#include <string.h>

#include "contract.h"
#include "errors.h"

_Static_assert(MM_MAX_RANKS == MEGAMOE_MAX_RANKS, "contract.h and megamoe.h disagree on the rank limit");

typedef struct size_calc {
  int overflow;
} size_calc;

static uint64_t mul(size_calc* s, uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (mm_mul_u64(a, b, &r)) s->overflow = 1;
  return r;
}

static uint64_t add(size_calc* s, uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (mm_add_u64(a, b, &r)) s->overflow = 1;
  return r;
}

static uint64_t round_up(size_calc* s, uint64_t v, uint64_t a) {
  return mul(s, add(s, v, a - 1) / a, a);
}

megamoe_status mm_pool_rows(const megamoe_config* c, int num_ranks, int64_t* rows) {
  MM_TRY(megamoe_check_config(c, num_ranks));
  MM_CHECK_NULL(rows, "rows");
  size_calc s = {0};
  uint64_t local_experts = (uint64_t)(c->num_experts / num_ranks);
  uint64_t slots = mul(&s, (uint64_t)c->max_tokens_per_rank, (uint64_t)c->top_k); /* T_max * K */
  uint64_t worst = mul(&s, (uint64_t)num_ranks, slots);
  uint64_t padding = mul(&s, local_experts, MM_POOL_ROW_ALIGN);
  /* The device sums routed rows (up to the worst case, padded) in int32,
   * whatever the pool's size: the worst case must fit. */
  uint64_t p_worst = add(&s, round_up(&s, worst, MM_POOL_ROW_ALIGN), padding);
  if (s.overflow || p_worst > (uint64_t)INT32_MAX)
    return mm_fail(MEGAMOE_ERR_SIZE_OVERFLOW,
                   "max_tokens_per_rank = %lld: the expert pool (ranks * max_tokens * top_k rows) "
                   "does not fit in 31 bits",
                   (long long)c->max_tokens_per_rank);
  uint64_t cap = worst;
  if (c->pool_imbalance != 0.0) {
    /* T_max * K < 2^31 and the factor <= 8: exact enough in double. */
    const double want = ceil(c->pool_imbalance * (double)slots);
    if (want < (double)worst) cap = (uint64_t)want;
  }
  *rows = (int64_t)add(&s, round_up(&s, cap, MM_POOL_ROW_ALIGN), padding);
  return MEGAMOE_OK;
}

static const char* const region_names[MM_REGION_COUNT] = {
    [MM_SYM_FLAGS] = "flags",
    [MM_SYM_INPUT_X] = "input_x",
    [MM_SYM_INPUT_X_SF] = "input_x_sf",
    [MM_SYM_ROUTE_COUNTS] = "route_counts",
    [MM_SYM_ROUTE_ENTRIES] = "route_entries",
    [MM_SYM_COMBINE] = "combine",
    [MM_SYM_CALL_TOKENS] = "call_tokens",
    [MM_SYM_COMBINE_ARRIVED] = "combine_arrived",
    [MM_SYM_COMBINE_ORDER] = "combine_order",
    [MM_WS_STATUS] = "status",
    [MM_WS_EPOCH] = "epoch",
    [MM_WS_PEERS] = "peer_table",
    [MM_WS_EXPERT_TOKENS] = "expert_tokens",
    [MM_WS_POOL_OFFSET] = "pool_offset",
    [MM_WS_POOL_COUNT] = "pool_count",
    [MM_WS_ROUTE_BASE] = "route_base",
    [MM_WS_POOL_SRC_START] = "pool_src_start",
    [MM_WS_POOL_ROWS] = "pool_rows",
    [MM_WS_POOL_WEIGHT] = "pool_weight",
    [MM_WS_POOL_X] = "pool_x",
    [MM_WS_POOL_X_SF] = "pool_x_sf",
    [MM_WS_L1_ACC] = "l1_acc",
    [MM_WS_L1_OUT] = "l1_out",
    [MM_WS_L1_OUT_SF] = "l1_out_sf",
    [MM_WS_L2_OUT] = "l2_out",
    [MM_WS_GRID_BARRIER] = "grid_barrier",
    [MM_WS_READY] = "rows_ready",
    [MM_WS_BLOCK_COUNTERS] = "block_counters",
    [MM_WS_TILE_COUNTERS] = "tile_counters",
    [MM_WS_TASK_LIST] = "task_list",
};

megamoe_status mm_layout_compute(const megamoe_config* c, int num_ranks, mm_layout* out) {
  MM_TRY(megamoe_check_config(c, num_ranks));
  MM_CHECK_NULL(out, "layout");
  int64_t pool_rows = 0;
  MM_TRY(mm_pool_rows(c, num_ranks, &pool_rows));
  /* The fused arm keeps no pool: its pool regions are the ring (docs/FUSED.md
   * section 3), whatever pool_imbalance says. */
  const int fused = c->arm == MEGAMOE_ARM_FUSED;
  mm_fused_ring ring;
  memset(&ring, 0, sizeof ring);
  if (fused) {
    MM_TRY(mm_fused_ring_make(c, num_ranks, &ring));
    pool_rows = (int64_t)ring.blocks * MM_FUSED_BLOCK_ROWS;
  }

  size_calc s = {0};
  const uint64_t R = (uint64_t)num_ranks;
  const uint64_t H = (uint64_t)c->hidden;
  const uint64_t I = (uint64_t)c->intermediate;
  const uint64_t E = (uint64_t)c->num_experts;
  const uint64_t El = E / R;
  const uint64_t K = (uint64_t)c->top_k;
  const uint64_t T = (uint64_t)c->max_tokens_per_rank;
  const uint64_t G = (uint64_t)c->quant_group;
  const uint64_t P = (uint64_t)pool_rows;
  const int staged = c->arm == MEGAMOE_ARM_STAGED;

  uint64_t bytes[MM_REGION_COUNT];
  memset(bytes, 0, sizeof bytes);
  bytes[MM_SYM_FLAGS] = MM_FLAG_BANKS * MEGAMOE_MAX_RANKS * sizeof(uint64_t);
  bytes[MM_SYM_INPUT_X] = mul(&s, T, H);
  bytes[MM_SYM_INPUT_X_SF] = mul(&s, mul(&s, T, H / MM_SCALE_BLOCK), 4);
  bytes[MM_SYM_ROUTE_COUNTS] = mul(&s, mul(&s, R, El), 4);
  bytes[MM_SYM_ROUTE_ENTRIES] = mul(&s, mul(&s, mul(&s, R, T), K), sizeof(mm_route_entry));
  bytes[MM_SYM_COMBINE] = mul(&s, mul(&s, mul(&s, K, T), H), 2);
  bytes[MM_SYM_CALL_TOKENS] = fused ? mul(&s, R, sizeof(mm_call_tokens)) : 0;
  bytes[MM_SYM_COMBINE_ARRIVED] =
      staged ? 0 : mul(&s, mul(&s, T, (uint64_t)mm_combine_units((int32_t)H)), 4);
  bytes[MM_SYM_COMBINE_ORDER] = staged ? 0 : mul(&s, R, 4);
  bytes[MM_WS_STATUS] = sizeof(mm_device_status);
  bytes[MM_WS_EPOCH] = sizeof(uint64_t);
  bytes[MM_WS_PEERS] = MEGAMOE_MAX_RANKS * sizeof(uint64_t);
  bytes[MM_WS_EXPERT_TOKENS] = mul(&s, E, 4);
  bytes[MM_WS_POOL_OFFSET] = mul(&s, El + 1, 4);
  bytes[MM_WS_POOL_COUNT] = mul(&s, El, 4);
  bytes[MM_WS_ROUTE_BASE] = mul(&s, mul(&s, R, El), 4);
  bytes[MM_WS_POOL_SRC_START] = mul(&s, mul(&s, R, El), 4);
  bytes[MM_WS_POOL_ROWS] = mul(&s, P, sizeof(mm_pool_row));
  bytes[MM_WS_POOL_WEIGHT] = mul(&s, P, 4);
  bytes[MM_WS_POOL_X] = mul(&s, P, H);
  bytes[MM_WS_POOL_X_SF] = mul(&s, mul(&s, P, H / MM_SCALE_BLOCK), 4);
  bytes[MM_WS_L1_ACC] = staged ? mul(&s, mul(&s, P, 2 * I), 4) : 0;
  bytes[MM_WS_L1_OUT] = mul(&s, P, I);
  bytes[MM_WS_L1_OUT_SF] = mul(&s, mul(&s, P, I / G), 4);
  bytes[MM_WS_L2_OUT] = staged ? mul(&s, mul(&s, P, H), 2) : 0;
  bytes[MM_WS_GRID_BARRIER] = sizeof(mm_grid_barrier_state);
  bytes[MM_WS_READY] = c->arm == MEGAMOE_ARM_SPLIT ? mul(&s, P / MM_READY_BLOCK_ROWS, 4) : 0;
  bytes[MM_WS_BLOCK_COUNTERS] = mul(&s, mul(&s, MM_FLAG_BANKS * MM_FUSED_COUNTERS, (uint64_t)ring.virtual_blocks), 4);
  bytes[MM_WS_TILE_COUNTERS] = c->arm != MEGAMOE_ARM_STAGED ? MM_TILE_COUNTERS * 4 : 0;
  bytes[MM_WS_TASK_LIST] =
      fused ? mul(&s, (uint64_t)mm_fused_task_list_entries(ring.virtual_blocks, c->hidden, c->intermediate), 8) : 0;

  memset(out, 0, sizeof *out);
  out->num_ranks = num_ranks;
  out->local_experts = (int64_t)El;
  out->pool_rows = pool_rows;
  out->ring = ring;
  uint64_t cursor[2] = {0, 0};
  for (int id = 0; id < MM_REGION_COUNT; ++id) {
    mm_region* r = &out->regions[id];
    r->name = region_names[id];
    r->space = id < MM_FIRST_WORKSPACE_REGION ? MM_SPACE_SYMMETRIC : MM_SPACE_WORKSPACE;
    r->align = MM_REGION_ALIGN;
    r->bytes = bytes[id];
    r->offset = round_up(&s, cursor[r->space], r->align);
    cursor[r->space] = add(&s, r->offset, r->bytes);
  }
  out->symmetric_bytes = round_up(&s, cursor[MM_SPACE_SYMMETRIC], MM_REGION_ALIGN);
  out->workspace_bytes = round_up(&s, cursor[MM_SPACE_WORKSPACE], MM_REGION_ALIGN);
  /* Prepared weights: W1 [E_l, 2I, H] + W2 [E_l, H, I] fp8 and their 128x128 block scales. */
  uint64_t w1 = mul(&s, mul(&s, El, 2 * I), H);
  uint64_t w2 = mul(&s, mul(&s, El, H), I);
  uint64_t w1_sf = mul(&s, mul(&s, mul(&s, El, 2 * I / MM_W1_INTERLEAVE), H / 128), 4);
  uint64_t w2_sf = mul(&s, mul(&s, mul(&s, El, H / 128), I / 128), 4);
  out->prepared_weight_bytes = add(&s, add(&s, round_up(&s, w1, MM_REGION_ALIGN),
                                           round_up(&s, w2, MM_REGION_ALIGN)),
                                   add(&s, round_up(&s, w1_sf, MM_REGION_ALIGN),
                                       round_up(&s, w2_sf, MM_REGION_ALIGN)));
  /* In place: the layer keeps only the per-chunk W1 scales; the permutation
   * borrows one expert's W1 as scratch while it runs. */
  out->in_place_resident_bytes = round_up(&s, w1_sf, MM_REGION_ALIGN);
  out->in_place_peak_bytes = add(&s, out->in_place_resident_bytes, mul(&s, 2 * I, H));
  if (s.overflow)
    return mm_fail(MEGAMOE_ERR_SIZE_OVERFLOW,
                   "the buffer sizes of this config (hidden %lld, experts %d, top_k %d, "
                   "max_tokens_per_rank %lld, %d ranks) overflow 64 bits",
                   (long long)c->hidden, (int)c->num_experts, (int)c->top_k,
                   (long long)c->max_tokens_per_rank, num_ranks);
  return MEGAMOE_OK;
}

megamoe_status megamoe_buffer_sizes(const megamoe_config* c, int num_ranks,
                                    size_t* symmetric_bytes, size_t* workspace_bytes) {
  mm_layout l;
  MM_TRY(mm_layout_compute(c, num_ranks, &l));
  if (symmetric_bytes) *symmetric_bytes = (size_t)l.symmetric_bytes;
  if (workspace_bytes) *workspace_bytes = (size_t)l.workspace_bytes;
  return MEGAMOE_OK;
}

megamoe_status megamoe_weight_memory(const megamoe_config* c, int num_ranks, megamoe_weights_mode mode,
                                     size_t* resident_bytes, size_t* peak_bytes) {
  if (mode != MEGAMOE_WEIGHTS_COPY && mode != MEGAMOE_WEIGHTS_IN_PLACE)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "mode = %d: not a megamoe_weights_mode", (int)mode);
  mm_layout l;
  MM_TRY(mm_layout_compute(c, num_ranks, &l));
  const int copy = mode == MEGAMOE_WEIGHTS_COPY;
  if (resident_bytes) *resident_bytes = (size_t)(copy ? l.prepared_weight_bytes : l.in_place_resident_bytes);
  if (peak_bytes) *peak_bytes = (size_t)(copy ? l.prepared_weight_bytes : l.in_place_peak_bytes);
  return MEGAMOE_OK;
}

megamoe_status megamoe_prepared_weight_bytes(const megamoe_config* c, int num_ranks,
                                             size_t* bytes) {
  MM_CHECK_NULL(bytes, "bytes");
  mm_layout l;
  MM_TRY(mm_layout_compute(c, num_ranks, &l));
  *bytes = (size_t)l.prepared_weight_bytes;
  return MEGAMOE_OK;
}
