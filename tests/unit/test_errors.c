/* The error protocol's host-visible parts (no GPU): barrier flag words and
 * banks, the pool size knob (pool_imbalance), the weight memory of each
 * mode, and megamoe_sync's messages in words. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "contract.h"
#include "host/device_status.h"
#include "host/layout.h"
#include "megamoe.h"
#include "unit.h"

/* ---- flags ----------------------------------------------------------------- */

static mm_test_result test_flags_compare_geq(void) {
  mm_rng g = unit_rng(901);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t forward = 1 + mm_rng_below(&g, 1ull << 40);
    const int index = (int)mm_rng_below(&g, MM_BARRIERS_PER_FORWARD);
    const uint64_t v = mm_barrier_value(forward, index);
    const int code = (int)mm_rng_below(&g, MEGAMOE_STATUS_COUNT);
    /* The peer at this barrier, or already at the next one: arrived, with
     * its error bits intact (a peer that moved on is never "absent"). */
    for (uint64_t ahead = 0; ahead < 3; ++ahead) {
      const uint64_t w = mm_flag_word(v + ahead, code);
      CHECK(mm_flag_arrived(w, v));
      CHECK_EQ_INT(mm_flag_error(w), code);
    }
    /* The peer one or two barriers behind: not arrived. */
    CHECK(!mm_flag_arrived(mm_flag_word(v - 1, code), v));
    CHECK(!mm_flag_arrived(mm_flag_word(v - 2, 0), v));
  }
  /* Zeroed flags (a fresh layer) never satisfy the first forward's barriers. */
  CHECK(!mm_flag_arrived(0, mm_barrier_value(1, 0)));
  return MM_TEST_PASS;
}

/* Consecutive barriers over the layer's life alternate banks, also across a
 * forward boundary: a peer one barrier ahead writes the other bank, so the
 * slot a waiter reads holds exactly its barrier's error bits. */
static mm_test_result test_flags_banks_alternate(void) {
  uint64_t prev = mm_barrier_value(1, 0);
  CHECK(prev > 0);
  for (uint64_t f = 1; f < 1000; ++f)
    for (int i = 0; i < MM_BARRIERS_PER_FORWARD; ++i) {
      const uint64_t v = mm_barrier_value(f, i);
      if (f == 1 && i == 0) continue;
      CHECK_EQ_INT(v, prev + 1);
      CHECK((v & 1) != (prev & 1));
      prev = v;
    }
  /* The record's key word must be 8-byte aligned for atomicCAS. */
  CHECK(offsetof(mm_device_status, key) % 8 == 0);
  CHECK(offsetof(mm_device_status, first) % 8 == 0);
  CHECK(offsetof(mm_error_report, key) % 8 == 0);
  return MM_TEST_PASS;
}

/* ---- pool size knob --------------------------------------------------------- */

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static mm_test_result test_pool_imbalance_sizes(void) {
  const struct {
    megamoe_config cfg;
    int ranks;
  } shapes[] = {
      {megamoe_config_make(4096, 2048, 256, 6, 8192), 8},
      {megamoe_config_make(7168, 3072, 384, 6, 8192), 2},
      {megamoe_config_make(512, 512, 16, 4, 77), 4},
      {megamoe_config_make(128, 128, 2, 1, 1), 2},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
    const megamoe_config base = shapes[s].cfg;
    const int R = shapes[s].ranks;
    const uint64_t El = (uint64_t)(base.num_experts / R), slots = (uint64_t)base.max_tokens_per_rank * base.top_k;
    int64_t worst = 0;
    CHECK_OK(mm_pool_rows(&base, R, &worst));
    CHECK_EQ_INT(worst, round_up(R * slots, MM_POOL_ROW_ALIGN) + El * MM_POOL_ROW_ALIGN);
    size_t ws_worst = 0;
    CHECK_OK(megamoe_buffer_sizes(&base, R, NULL, &ws_worst));
    int64_t prev = 0;
    for (double f = 1.0; f <= R; f += 0.25) {
      megamoe_config c = base;
      c.pool_imbalance = f;
      int64_t p = 0;
      CHECK_OK(mm_pool_rows(&c, R, &p));
      const uint64_t cap = (uint64_t)ceil(f * (double)slots);
      CHECK_EQ_INT(p, round_up(cap < R * slots ? cap : R * slots, MM_POOL_ROW_ALIGN) + El * MM_POOL_ROW_ALIGN);
      CHECK(p >= prev);
      CHECK(p <= worst);
      prev = p;
      /* The layout sizes its pool regions with it. */
      mm_layout l;
      CHECK_OK(mm_layout_compute(&c, R, &l));
      CHECK_EQ_INT(l.pool_rows, p);
      CHECK_EQ_INT(l.regions[MM_WS_POOL_X].bytes, (uint64_t)p * (uint64_t)c.hidden);
      size_t ws = 0;
      CHECK_OK(megamoe_buffer_sizes(&c, R, NULL, &ws));
      CHECK(ws <= ws_worst);
      if (f == (double)R) CHECK_EQ_INT(p, worst);
    }
    /* Any routing within the capacity fits, with the device's padding rule:
     * the padded total never exceeds the pool. */
    mm_rng g = unit_rng(902 + s);
    megamoe_config c = base;
    c.pool_imbalance = 1.0 + mm_rng_uniform(&g) * (R - 1);
    int64_t p = 0;
    CHECK_OK(mm_pool_rows(&c, R, &p));
    const uint64_t cap = (uint64_t)ceil(c.pool_imbalance * (double)slots);
    for (int trial = 0; trial < 200; ++trial) {
      uint64_t left = cap < R * slots ? cap : R * slots, padded = 0;
      for (uint64_t e = 0; e < El; ++e) {
        const uint64_t rows = e + 1 == El ? left : mm_rng_below(&g, left + 1);
        left -= rows;
        padded += round_up(rows, MM_POOL_ROW_ALIGN);
      }
      CHECK_MSG(padded <= (uint64_t)p, "padded %llu > pool %lld", (unsigned long long)padded, (long long)p);
    }
  }
  /* flash at EP8: the worst-case pool is the 11.7 GiB the issue names; an
   * imbalance of 2 cuts the workspace by about 4x. */
  megamoe_config flash = megamoe_config_make(4096, 2048, 256, 6, 8192);
  size_t ws0 = 0, ws2 = 0;
  CHECK_OK(megamoe_buffer_sizes(&flash, 8, NULL, &ws0));
  flash.pool_imbalance = 2.0;
  CHECK_OK(megamoe_buffer_sizes(&flash, 8, NULL, &ws2));
  printf("    flash EP8 workspace: %.2f GiB worst case, %.2f GiB at pool_imbalance 2\n", ws0 / 1073741824.0,
         ws2 / 1073741824.0);
  CHECK(ws0 > 11ull << 30);
  CHECK(ws2 < ws0 / 3);
  /* The worst case must still fit the device's int32 sums, whatever the pool. */
  megamoe_config big = megamoe_config_make(7168, 3072, 384, 1, INT32_MAX);
  big.pool_imbalance = 1.0;
  int64_t rows = 0;
  CHECK_STATUS(mm_pool_rows(&big, 8, &rows), MEGAMOE_ERR_SIZE_OVERFLOW);
  return MM_TEST_PASS;
}

/* ---- weight memory ---------------------------------------------------------- */

static mm_test_result test_weight_memory(void) {
  const megamoe_config shapes[] = {megamoe_config_make(4096, 2048, 256, 6, 8192),
                                   megamoe_config_make(7168, 3072, 384, 6, 8192),
                                   megamoe_config_make(384, 640, 24, 3, 77)};
  const int ranks[] = {8, 2, 3};
  for (int s = 0; s < 3; ++s) {
    const megamoe_config* c = &shapes[s];
    const uint64_t El = (uint64_t)(c->num_experts / ranks[s]), H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate;
    size_t copy_res = 0, copy_peak = 0, ip_res = 0, ip_peak = 0, prepared = 0;
    CHECK_OK(megamoe_weight_memory(c, ranks[s], MEGAMOE_WEIGHTS_COPY, &copy_res, &copy_peak));
    CHECK_OK(megamoe_weight_memory(c, ranks[s], MEGAMOE_WEIGHTS_IN_PLACE, &ip_res, &ip_peak));
    CHECK_OK(megamoe_prepared_weight_bytes(c, ranks[s], &prepared));
    CHECK_EQ_INT(copy_res, prepared);
    CHECK_EQ_INT(copy_peak, prepared);
    CHECK(copy_res >= El * 3 * H * I); /* the fp8 weights at least */
    const uint64_t chunk_sf = El * (2 * I / MM_W1_INTERLEAVE) * (H / 128) * 4;
    CHECK_EQ_INT(ip_res, round_up(chunk_sf, MM_REGION_ALIGN));
    CHECK_EQ_INT(ip_peak, ip_res + 2 * I * H);
    /* No second copy: in place keeps well under 1% of the copy. */
    CHECK(ip_res * 100 < copy_res);
    CHECK_OK(megamoe_weight_memory(c, ranks[s], MEGAMOE_WEIGHTS_IN_PLACE, NULL, NULL));
  }
  CHECK_STATUS(megamoe_weight_memory(&shapes[0], 8, (megamoe_weights_mode)5, NULL, NULL), MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK_MESSAGE_HAS("mode");
  CHECK_STATUS(megamoe_weight_memory(NULL, 8, MEGAMOE_WEIGHTS_COPY, NULL, NULL), MEGAMOE_ERR_NULL_POINTER);
  return MM_TEST_PASS;
}

/* ---- messages in words ------------------------------------------------------ */

static mm_status_context context(void) {
  mm_status_context c;
  memset(&c, 0, sizeof c);
  c.rank = 1;
  c.num_experts = 16;
  c.local_experts = 8;
  c.top_k = 4;
  c.timeout_s = 2.0;
  c.pool_imbalance = 1.5;
  c.pool_rows = 1280;
  c.failed_forwards = 1;
  return c;
}

static mm_error_report report(int code, int where, int peer, int detail, uint64_t seen, uint64_t want) {
  return unit_report(7, code, where, peer, detail, seen, want);
}


static mm_test_result test_messages(void) {
  char m[1024];
  mm_status_context ctx = context();

  /* A barrier timeout: peer, site, forward, how long, where the peer is. */
  mm_error_report r = report(MEGAMOE_ERR_TIMEOUT, MM_SITE_BARRIER_DISPATCH, 0, 0, mm_barrier_value(6, 1),
                             mm_barrier_value(7, 0));
  r.waited_ns = 2000400000ull;
  CHECK_EQ_INT(mm_describe_device_error(&r, &ctx, m, sizeof m), MEGAMOE_ERR_TIMEOUT);
  CHECK_HAS(m, "rank 1, forward 7");
  CHECK_HAS(m, "rank 0 did not arrive at the dispatch barrier");
  CHECK_HAS(m, "waited 2.0 s");
  CHECK_HAS(m, "the combine barrier of forward 6");
  CHECK_HAS(m, "destroy the layer");
  CHECK_LACKS(m, "0x");
  r.seen = 0;
  mm_describe_device_error(&r, &ctx, m, sizeof m);
  CHECK_HAS(m, "has not reached any barrier");

  /* A counter wait and a grid barrier. */
  r = report(MEGAMOE_ERR_TIMEOUT, MM_SITE_GEMM_ROWS_READY, -1, 12, 3, 8);
  r.waited_ns = 60000000000ull;
  mm_describe_device_error(&r, &ctx, m, sizeof m);
  CHECK_HAS(m, "GEMM waiting for its pool rows");
  CHECK_HAS(m, "counter 12 to reach 8; it stayed at 3");
  CHECK_HAS(m, "waited 60.0 s");
  r = report(MEGAMOE_ERR_TIMEOUT, MM_SITE_GRID_BARRIER, -1, 5, 131, 132);
  mm_describe_device_error(&r, &ctx, m, sizeof m);
  CHECK_HAS(m, "grid barrier");
  CHECK_HAS(m, "131 of its 132 CTAs");
  CHECK_HAS(m, "the deadline is 4.0 s, twice timeout_s"); /* the grid barriers' 2 x timeout_s */

  /* A peer's failure names the peer and its status. */
  r = report(MEGAMOE_ERR_PEER_FAILED, MM_SITE_BARRIER_DISPATCH, 0, MEGAMOE_ERR_NULL_POINTER, 14, 14);
  CHECK_EQ_INT(mm_describe_device_error(&r, &ctx, m, sizeof m), MEGAMOE_ERR_PEER_FAILED);
  CHECK_HAS(m, "peer rank 0");
  CHECK_HAS(m, "MEGAMOE_ERR_NULL_POINTER");
  CHECK_HAS(m, "dispatch barrier");
  CHECK_LACKS(m, "0x");

  /* A pool overflow names the rank, the expert and the rows. */
  r = report(MEGAMOE_ERR_TOO_MANY_TOKENS, MM_SITE_POOL, -1, 11, 2048, 1280);
  CHECK_EQ_INT(mm_describe_device_error(&r, &ctx, m, sizeof m), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_HAS(m, "pool of rank 1 overflowed");
  CHECK_HAS(m, "2048 rows");
  CHECK_HAS(m, "holds 1280");
  CHECK_HAS(m, "expert 11 (local 3)");
  CHECK_HAS(m, "pool_imbalance 1.5");

  /* A host rejection repeats the host's message. */
  ctx.host_message = "args->x is NULL";
  r = report(MEGAMOE_ERR_NULL_POINTER, MM_SITE_HOST, -1, 0, 0, 0);
  CHECK_EQ_INT(mm_describe_device_error(&r, &ctx, m, sizeof m), MEGAMOE_ERR_NULL_POINTER);
  CHECK_HAS(m, "args->x is NULL");
  CHECK_HAS(m, "ran empty");
  r = report(MEGAMOE_ERR_TOO_MANY_TOKENS, MM_SITE_HOST, -1, 0, 0, 0);
  CHECK_EQ_INT(mm_describe_device_error(&r, &ctx, m, sizeof m), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_HAS(m, "megamoe_forward failed on this rank with MEGAMOE_ERR_TOO_MANY_TOKENS");
  ctx.host_message = NULL;

  /* A bad index: token and slot. */
  r = report(MEGAMOE_ERR_BAD_TOPK_INDEX, MM_SITE_ROUTE, -1, 9, (uint64_t)(int64_t)-7, 0);
  mm_describe_device_error(&r, &ctx, m, sizeof m);
  CHECK_HAS(m, "topk_idx[2][1]");
  CHECK_HAS(m, "= -7 is outside [-1, 16)");

  /* How many forwards failed; an unknown code. */
  ctx.failed_forwards = 3;
  mm_describe_device_error(&r, &ctx, m, sizeof m);
  CHECK_HAS(m, "3 forwards failed");
  r = report(200, MM_SITE_ROUTE, -1, 0, 0, 0);
  CHECK_EQ_INT(mm_describe_device_error(&r, &ctx, m, sizeof m), MEGAMOE_ERR_INTERNAL);
  /* A tiny buffer is terminated, not overrun. */
  char tiny[8];
  memset(tiny, 'x', sizeof tiny);
  mm_describe_device_error(&r, &ctx, tiny, sizeof tiny);
  CHECK(memchr(tiny, '\0', sizeof tiny) != NULL);
  return MM_TEST_PASS;
}

const mm_test unit_suite_errors[] = {
    {"errors.flags_compare_geq", test_flags_compare_geq},
    {"errors.flags_banks_alternate", test_flags_banks_alternate},
    {"errors.pool_imbalance_sizes", test_pool_imbalance_sizes},
    {"errors.weight_memory", test_weight_memory},
    {"errors.messages", test_messages},
    {NULL, NULL},
};
