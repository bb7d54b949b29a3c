/* Config checks (megamoe_check_config, megamoe_buffer_sizes) and the buffer
 * layout (mm_layout_compute). */
#include <math.h>
#include <string.h>

#include "contract.h"
#include "host/layout.h"
#include "megamoe.h"
#include "unit.h"

static megamoe_config flash_config(void) { return megamoe_config_make(4096, 2048, 256, 6, 8192); }
static megamoe_config pro_config(void) { return megamoe_config_make(7168, 3072, 384, 6, 8192); }
static megamoe_config small_config(void) { return megamoe_config_make(256, 512, 16, 4, 64); }

/* One rejection: the status and the argument the message must name. */
typedef struct rejection {
  const char* what;
  megamoe_config cfg;
  int num_ranks;
  megamoe_status status;
  const char* names;
} rejection;

static mm_test_result test_config_rejections(void) {
  rejection cases[48];
  int n = 0;
#define REJECT(desc, ranks, want, name, ...)            \
  do {                                                  \
    megamoe_config c_ = small_config();                 \
    __VA_ARGS__;                                        \
    cases[n++] = (rejection){desc, c_, ranks, want, name}; \
  } while (0)
  REJECT("ranks 0", 0, MEGAMOE_ERR_BAD_RANKS, "num_ranks", (void)0);
  REJECT("ranks 9", 9, MEGAMOE_ERR_BAD_RANKS, "num_ranks", (void)0);
  REJECT("hidden 0", 2, MEGAMOE_ERR_BAD_SHAPE, "hidden", c_.hidden = 0);
  REJECT("hidden 200", 2, MEGAMOE_ERR_BAD_SHAPE, "hidden", c_.hidden = 200);
  REJECT("hidden -128", 2, MEGAMOE_ERR_BAD_SHAPE, "hidden", c_.hidden = -128);
  REJECT("hidden above max", 2, MEGAMOE_ERR_BAD_SHAPE, "hidden", c_.hidden = MEGAMOE_MAX_HIDDEN + 128);
  REJECT("intermediate 0", 2, MEGAMOE_ERR_BAD_SHAPE, "intermediate", c_.intermediate = 0);
  REJECT("intermediate 320", 2, MEGAMOE_ERR_BAD_SHAPE, "intermediate", c_.intermediate = 320);
  REJECT("intermediate above max", 2, MEGAMOE_ERR_BAD_SHAPE, "intermediate",
         c_.intermediate = MEGAMOE_MAX_INTERMEDIATE + 128);
  REJECT("experts 0", 2, MEGAMOE_ERR_BAD_EXPERTS, "num_experts", c_.num_experts = 0);
  REJECT("experts 12 on 8 ranks", 8, MEGAMOE_ERR_BAD_EXPERTS, "num_experts", c_.num_experts = 12);
  REJECT("experts 15 on 2 ranks", 2, MEGAMOE_ERR_BAD_EXPERTS, "num_experts", c_.num_experts = 15);
  REJECT("local experts above max", 1, MEGAMOE_ERR_BAD_EXPERTS, "num_experts",
         c_.num_experts = MEGAMOE_MAX_LOCAL_EXPERTS + 1);
  REJECT("top_k 0", 2, MEGAMOE_ERR_BAD_TOP_K, "top_k", c_.top_k = 0);
  REJECT("top_k -1", 2, MEGAMOE_ERR_BAD_TOP_K, "top_k", c_.top_k = -1);
  REJECT("top_k above E", 2, MEGAMOE_ERR_BAD_TOP_K, "top_k", c_.num_experts = 4; c_.top_k = 5);
  REJECT("top_k above max", 2, MEGAMOE_ERR_BAD_TOP_K, "top_k", c_.num_experts = 64;
         c_.top_k = MEGAMOE_MAX_TOP_K + 1);
  REJECT("max tokens 0", 2, MEGAMOE_ERR_BAD_MAX_TOKENS, "max_tokens_per_rank", c_.max_tokens_per_rank = 0);
  REJECT("max tokens -5", 2, MEGAMOE_ERR_BAD_MAX_TOKENS, "max_tokens_per_rank", c_.max_tokens_per_rank = -5);
  REJECT("max tokens x top_k above int32", 2, MEGAMOE_ERR_SIZE_OVERFLOW, "max_tokens_per_rank",
         c_.max_tokens_per_rank = INT32_MAX / 4 + 1);
  REJECT("group 96", 2, MEGAMOE_ERR_BAD_QUANT_GROUP, "quant_group", c_.quant_group = 96);
  REJECT("group 0", 2, MEGAMOE_ERR_BAD_QUANT_GROUP, "quant_group", c_.quant_group = 0);
  REJECT("group 256", 2, MEGAMOE_ERR_BAD_QUANT_GROUP, "quant_group", c_.quant_group = 256);
  REJECT("has_clamp 2", 2, MEGAMOE_ERR_BAD_ARGUMENT, "has_swiglu_clamp", c_.has_swiglu_clamp = 2);
  REJECT("clamp 0", 2, MEGAMOE_ERR_BAD_CLAMP, "swiglu_clamp", c_.has_swiglu_clamp = 1; c_.swiglu_clamp = 0.0f);
  REJECT("clamp -1", 2, MEGAMOE_ERR_BAD_CLAMP, "swiglu_clamp", c_.has_swiglu_clamp = 1; c_.swiglu_clamp = -1.0f);
  REJECT("clamp NaN", 2, MEGAMOE_ERR_BAD_CLAMP, "swiglu_clamp", c_.has_swiglu_clamp = 1; c_.swiglu_clamp = NAN);
  REJECT("clamp inf", 2, MEGAMOE_ERR_BAD_CLAMP, "swiglu_clamp", c_.has_swiglu_clamp = 1;
         c_.swiglu_clamp = INFINITY);
  REJECT("arm -1", 2, MEGAMOE_ERR_BAD_ARM, "arm", c_.arm = (megamoe_arm)-1);
  REJECT("arm count", 2, MEGAMOE_ERR_BAD_ARM, "arm", c_.arm = MEGAMOE_ARM_COUNT);
  REJECT("timeout NaN", 2, MEGAMOE_ERR_BAD_ARGUMENT, "timeout_s", c_.timeout_s = NAN);
  REJECT("timeout above a year", 2, MEGAMOE_ERR_BAD_ARGUMENT, "timeout_s", c_.timeout_s = 1e12);
  REJECT("pool_imbalance 0.5", 2, MEGAMOE_ERR_BAD_ARGUMENT, "pool_imbalance", c_.pool_imbalance = 0.5);
  REJECT("pool_imbalance above ranks", 2, MEGAMOE_ERR_BAD_ARGUMENT, "pool_imbalance", c_.pool_imbalance = 2.5);
  REJECT("pool_imbalance -1", 4, MEGAMOE_ERR_BAD_ARGUMENT, "pool_imbalance", c_.pool_imbalance = -1.0);
  REJECT("pool_imbalance NaN", 2, MEGAMOE_ERR_BAD_ARGUMENT, "pool_imbalance", c_.pool_imbalance = NAN);
  REJECT("pool_imbalance inf", 8, MEGAMOE_ERR_BAD_ARGUMENT, "pool_imbalance", c_.num_experts = 16;
         c_.pool_imbalance = INFINITY);
#undef REJECT
  for (int i = 0; i < n; ++i) {
    const megamoe_status got = megamoe_check_config(&cases[i].cfg, cases[i].num_ranks);
    CHECK_MSG(got == cases[i].status, "%s: %s (want %s)", cases[i].what, megamoe_status_string(got),
              megamoe_status_string(cases[i].status));
    CHECK_MSG(strstr(megamoe_last_error(), cases[i].names) != NULL, "%s: message \"%s\" lacks \"%s\"",
              cases[i].what, megamoe_last_error(), cases[i].names);
    /* The size query rejects the same way. */
    size_t sym = 0, ws = 0;
    CHECK_MSG(megamoe_buffer_sizes(&cases[i].cfg, cases[i].num_ranks, &sym, &ws) == cases[i].status,
              "%s: megamoe_buffer_sizes", cases[i].what);
  }
  CHECK_STATUS(megamoe_check_config(NULL, 2), MEGAMOE_ERR_NULL_POINTER);
  CHECK_MESSAGE_HAS("config");
  CHECK_STATUS(megamoe_buffer_sizes(NULL, 2, NULL, NULL), MEGAMOE_ERR_NULL_POINTER);
  return MM_TEST_PASS;
}

static mm_test_result test_config_valid(void) {
  const megamoe_config shapes[] = {flash_config(), pro_config(), small_config()};
  for (size_t s = 0; s < 3; ++s)
    for (int arm = 0; arm < MEGAMOE_ARM_COUNT; ++arm)
      for (int group = 64; group <= 128; group += 64) {
        megamoe_config c = shapes[s];
        c.arm = (megamoe_arm)arm;
        c.quant_group = group;
        const int ranks = s == 2 ? 2 : 8;
        CHECK_OK(megamoe_check_config(&c, ranks));
        CHECK(megamoe_last_error()[0] == '\0');
        size_t sym = 0, ws = 0, weights = 0;
        CHECK_OK(megamoe_buffer_sizes(&c, ranks, &sym, &ws));
        CHECK(sym > 0 && ws > 0);
        CHECK_OK(megamoe_buffer_sizes(&c, ranks, NULL, NULL));
        CHECK_OK(megamoe_prepared_weight_bytes(&c, ranks, &weights));
        /* The prepared weights of E_l experts hold at least their fp8 bytes. */
        const uint64_t local = (uint64_t)(c.num_experts / ranks);
        CHECK(weights >= local * 3 * (uint64_t)c.hidden * (uint64_t)c.intermediate);
      }
  /* Edges that are allowed. */
  megamoe_config c = small_config();
  c.has_swiglu_clamp = 0;
  c.swiglu_clamp = NAN; /* ignored without the clamp */
  CHECK_OK(megamoe_check_config(&c, 1));
  c = small_config();
  c.has_swiglu_clamp = 1;
  c.swiglu_clamp = 7.0f;
  c.timeout_s = 0.0; /* the default */
  CHECK_OK(megamoe_check_config(&c, 8));
  c = small_config();
  c.num_experts = 4;
  c.top_k = 4; /* K = E */
  CHECK_OK(megamoe_check_config(&c, 4));
  c.hidden = MEGAMOE_MAX_HIDDEN;
  c.intermediate = MEGAMOE_MAX_INTERMEDIATE;
  CHECK_OK(megamoe_check_config(&c, 4));
  CHECK_STATUS(megamoe_prepared_weight_bytes(&c, 4, NULL), MEGAMOE_ERR_NULL_POINTER);
  return MM_TEST_PASS;
}

static mm_test_result test_config_size_overflow(void) {
  /* Passes the config check (T_max * K fits in int32) but the pool of
   * R * T_max * K rows does not fit in 31 bits. */
  megamoe_config c = megamoe_config_make(7168, 3072, 384, 1, INT32_MAX);
  CHECK_OK(megamoe_check_config(&c, 8));
  size_t sym = 0, ws = 0;
  CHECK_STATUS(megamoe_buffer_sizes(&c, 8, &sym, &ws), MEGAMOE_ERR_SIZE_OVERFLOW);
  CHECK_MESSAGE_HAS("max_tokens_per_rank");
  mm_layout layout;
  CHECK_STATUS(mm_layout_compute(&c, 8, &layout), MEGAMOE_ERR_SIZE_OVERFLOW);
  c.top_k = 6;
  c.max_tokens_per_rank = INT32_MAX / 6 + 1;
  CHECK_STATUS(megamoe_check_config(&c, 8), MEGAMOE_ERR_SIZE_OVERFLOW);
  CHECK_MESSAGE_HAS("max_tokens_per_rank");
  return MM_TEST_PASS;
}

const mm_test unit_suite_config[] = {
    {"config.rejections", test_config_rejections},
    {"config.valid", test_config_valid},
    {"config.size_overflow", test_config_size_overflow},
    {NULL, NULL},
};

/* ---- layout --------------------------------------------------------------- */

/* Regions the arm does not use (0 bytes); every other region must be sized. */
static int region_unused(mm_region_id id, megamoe_arm arm) {
  if (id == MM_WS_L1_ACC || id == MM_WS_L2_OUT) return arm != MEGAMOE_ARM_STAGED; /* staged only */
  if (id == MM_WS_READY) return arm != MEGAMOE_ARM_SPLIT;                  /* split only */
  if (id == MM_WS_TILE_COUNTERS || id == MM_SYM_COMBINE_ARRIVED || id == MM_SYM_COMBINE_ORDER)
    return arm == MEGAMOE_ARM_STAGED; /* the persistent arms */
  if (id == MM_SYM_CALL_TOKENS || id == MM_WS_BLOCK_COUNTERS || id == MM_WS_TASK_LIST)
    return arm != MEGAMOE_ARM_FUSED; /* fused only */
  return 0;
}

static mm_test_result check_layout(const megamoe_config* c, int ranks) {
  mm_layout l;
  CHECK_OK(mm_layout_compute(c, ranks, &l));
  const uint64_t R = (uint64_t)ranks, H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate;
  const uint64_t K = (uint64_t)c->top_k, T = (uint64_t)c->max_tokens_per_rank;
  const uint64_t El = (uint64_t)(c->num_experts / ranks), G = (uint64_t)c->quant_group;
  CHECK_EQ_INT(l.num_ranks, ranks);
  CHECK_EQ_INT(l.local_experts, El);
  /* Every routed slot of every rank may land here, and each local expert
   * may need up to MM_POOL_ROW_ALIGN - 1 rows of padding. The fused arm
   * keeps a ring instead: 8 (lag + group) + 4 blocks, or the worst case when
   * that is smaller (docs/FUSED.md section 3). */
  const uint64_t P = (uint64_t)l.pool_rows;
  CHECK(P <= INT32_MAX);
  if (c->arm == MEGAMOE_ARM_FUSED) {
    const mm_fused_ring* g = &l.ring;
    const int64_t worst = mm_fused_worst_blocks(c, ranks, c->max_tokens_per_rank);
    CHECK_EQ_INT(P, (uint64_t)g->blocks * MM_FUSED_BLOCK_ROWS);
    CHECK_EQ_INT(g->virtual_blocks, worst);
    CHECK(g->lag >= MM_FUSED_LAG_MIN && g->lag <= MM_FUSED_LAG_MAX && g->group == MM_FUSED_GROUP);
    CHECK_EQ_INT(g->blocks, g->clamped ? worst : MM_FUSED_UNIT_BLOCKS * (g->lag + g->group) + MM_FUSED_RING_MARGIN);
    CHECK(g->blocks <= worst);
    CHECK(worst * MM_FUSED_BLOCK_ROWS >= (int64_t)(R * T * K)); /* the counters cover every routed row */
  } else {
    CHECK(P >= R * T * K);
    CHECK(P >= R * T * K + El * (MM_POOL_ROW_ALIGN - 1));
    int64_t pool = 0;
    CHECK_OK(mm_pool_rows(c, ranks, &pool));
    CHECK_EQ_INT(pool, l.pool_rows);
    CHECK_EQ_INT(l.ring.blocks, 0);
  }

  /* One early-combine arrival counter per (token, 512-column unit). */
  if (c->arm != MEGAMOE_ARM_STAGED)
    CHECK_EQ_INT(l.regions[MM_SYM_COMBINE_ARRIVED].bytes,
                 T * ((H + MM_COMBINE_UNIT_COLS - 1) / MM_COMBINE_UNIT_COLS) * 4);
  const uint64_t totals[2] = {l.symmetric_bytes, l.workspace_bytes};
  for (int id = 0; id < MM_REGION_COUNT; ++id) {
    const mm_region* r = &l.regions[id];
    CHECK_MSG(r->name != NULL && r->name[0] != '\0', "region %d has no name", id);
    for (int other = 0; other < id; ++other) CHECK(strcmp(r->name, l.regions[other].name) != 0);
    CHECK_EQ_INT(r->space, id < MM_FIRST_WORKSPACE_REGION ? MM_SPACE_SYMMETRIC : MM_SPACE_WORKSPACE);
    CHECK_MSG(r->align >= MM_REGION_ALIGN && (r->align & (r->align - 1)) == 0, "%s align %llu", r->name,
              (unsigned long long)r->align);
    CHECK_MSG(r->offset % r->align == 0, "%s offset %llu", r->name, (unsigned long long)r->offset);
    CHECK_MSG(r->offset + r->bytes <= totals[r->space], "%s ends past its space", r->name);
    CHECK_MSG((r->bytes == 0) == region_unused((mm_region_id)id, c->arm), "%s has %llu bytes (arm %s)", r->name,
              (unsigned long long)r->bytes, megamoe_arm_name(c->arm));
    for (int other = 0; other < id; ++other) {
      const mm_region* o = &l.regions[other];
      if (o->space != r->space || o->bytes == 0 || r->bytes == 0) continue;
      const int apart = r->offset >= o->offset + o->bytes || o->offset >= r->offset + r->bytes;
      CHECK_MSG(apart, "%s [%llu, +%llu) overlaps %s [%llu, +%llu)", r->name, (unsigned long long)r->offset,
                (unsigned long long)r->bytes, o->name, (unsigned long long)o->offset,
                (unsigned long long)o->bytes);
    }
  }
  CHECK(l.symmetric_bytes % MM_REGION_ALIGN == 0 && l.workspace_bytes % MM_REGION_ALIGN == 0);

  /* The sizes the kernels index with (DESIGN.md section 4, layout.h). */
  CHECK_EQ_INT(l.regions[MM_SYM_FLAGS].bytes, MM_FLAG_BANKS * MEGAMOE_MAX_RANKS * 8);
  CHECK_EQ_INT(l.regions[MM_SYM_INPUT_X].bytes, T * H);
  CHECK_EQ_INT(l.regions[MM_SYM_INPUT_X_SF].bytes, T * (H / 128) * 4);
  CHECK_EQ_INT(l.regions[MM_SYM_ROUTE_COUNTS].bytes, R * El * 4);
  CHECK_EQ_INT(l.regions[MM_SYM_ROUTE_ENTRIES].bytes, R * T * K * sizeof(mm_route_entry));
  CHECK_EQ_INT(l.regions[MM_SYM_COMBINE].bytes, K * T * H * 2);
  CHECK_EQ_INT(l.regions[MM_WS_STATUS].bytes, sizeof(mm_device_status));
  CHECK_EQ_INT(l.regions[MM_WS_POOL_OFFSET].bytes, (El + 1) * 4);
  CHECK_EQ_INT(l.regions[MM_WS_POOL_ROWS].bytes, P * sizeof(mm_pool_row));
  CHECK_EQ_INT(l.regions[MM_WS_POOL_X].bytes, P * H);
  CHECK_EQ_INT(l.regions[MM_WS_POOL_X_SF].bytes, P * (H / 128) * 4);
  CHECK_EQ_INT(l.regions[MM_WS_L1_OUT].bytes, P * I);
  CHECK_EQ_INT(l.regions[MM_WS_L1_OUT_SF].bytes, P * (I / G) * 4);
  if (c->arm == MEGAMOE_ARM_STAGED) {
    CHECK_EQ_INT(l.regions[MM_WS_L1_ACC].bytes, P * 2 * I * 4);
    CHECK_EQ_INT(l.regions[MM_WS_L2_OUT].bytes, P * H * 2);
  }
  if (c->arm == MEGAMOE_ARM_FUSED) {
    CHECK_EQ_INT(l.regions[MM_SYM_CALL_TOKENS].bytes, R * sizeof(mm_call_tokens));
    CHECK_EQ_INT(l.regions[MM_WS_BLOCK_COUNTERS].bytes,
                 (uint64_t)MM_FLAG_BANKS * MM_FUSED_COUNTERS * 4 * (uint64_t)l.ring.virtual_blocks);
  }
  /* What megamoe_layout (the bindings' view) says about the ring. */
  megamoe_layout_info info;
  CHECK_OK(megamoe_layout(c, ranks, &info, NULL, 0));
  CHECK(info.ring_blocks == l.ring.blocks && info.ring_lag == l.ring.lag && info.ring_group == l.ring.group &&
        info.ring_virtual_blocks == l.ring.virtual_blocks && info.pool_rows == l.pool_rows);

  size_t sym = 0, ws = 0;
  CHECK_OK(megamoe_buffer_sizes(c, ranks, &sym, &ws));
  CHECK_EQ_INT(sym, l.symmetric_bytes);
  CHECK_EQ_INT(ws, l.workspace_bytes);
  size_t weights = 0;
  CHECK_OK(megamoe_prepared_weight_bytes(c, ranks, &weights));
  CHECK_EQ_INT(weights, l.prepared_weight_bytes);
  return MM_TEST_PASS;
}

static mm_test_result test_layout_configs(void) {
  const struct {
    megamoe_config cfg;
    int ranks;
  } shapes[] = {
      {megamoe_config_make(4096, 2048, 256, 6, 8192), 8},
      {megamoe_config_make(7168, 3072, 384, 6, 8192), 8},
      {megamoe_config_make(4096, 2048, 64, 6, 4096), 2},
      {megamoe_config_make(128, 128, 1, 1, 1), 1},
      {megamoe_config_make(512, 512, 16, 4, 256), 4},
      {megamoe_config_make(16384, 4096, 1024, 16, 333), 1},
      {megamoe_config_make(384, 640, 24, 3, 77), 3},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
    for (int arm = 0; arm < MEGAMOE_ARM_COUNT; ++arm)
      for (int group = 64; group <= 128; group += 64) {
        megamoe_config c = shapes[s].cfg;
        c.arm = (megamoe_arm)arm;
        c.quant_group = group;
        if (check_layout(&c, shapes[s].ranks) != MM_TEST_PASS) {
          fprintf(stderr, "    shape %zu, arm %s, group %d\n", s, megamoe_arm_name(c.arm), group);
          return MM_TEST_FAIL;
        }
      }
  return MM_TEST_PASS;
}

static mm_test_result test_layout_rejects(void) {
  megamoe_config c = small_config();
  mm_layout l;
  CHECK_STATUS(mm_layout_compute(&c, 2, NULL), MEGAMOE_ERR_NULL_POINTER);
  c.quant_group = 96;
  CHECK_STATUS(mm_layout_compute(&c, 2, &l), MEGAMOE_ERR_BAD_QUANT_GROUP);
  CHECK_MESSAGE_HAS("quant_group");
  int64_t rows = 0;
  CHECK_STATUS(mm_pool_rows(&c, 2, &rows), MEGAMOE_ERR_BAD_QUANT_GROUP);
  c = small_config();
  CHECK_STATUS(mm_pool_rows(&c, 2, NULL), MEGAMOE_ERR_NULL_POINTER);
  return MM_TEST_PASS;
}

const mm_test unit_suite_layout[] = {
    {"layout.configs", test_layout_configs},
    {"layout.rejects", test_layout_rejects},
    {NULL, NULL},
};
