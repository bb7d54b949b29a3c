/* The co-located ranks' host collectives (src/host/colocated.c) and the
 * launcher's co-located mode, without GPUs: every rank gets every other
 * rank's bytes of the same round whatever order they arrive in, a rank that
 * stays away ends the others' waits at the deadline (and every later call
 * at once), an oversized contribution breaks the group instead of leaving
 * the others waiting, a round whose calls differ (tag or size) fails on
 * every rank, and create outside a co-located rank is refused. */
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/colocated.h"
#include "host/procs.h"
#include "unit.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { ROUNDS, STAY_AWAY, OVERSIZED, MISMATCH };

/* A word of rank r's contribution to round k: unlike any other (rank,
 * round, word). */
static uint32_t word_of(int rank, int round, int i) { return (uint32_t)rank * 0x01000193u ^ (uint32_t)round * 7919u ^ (uint32_t)i * 31u; }

/* Exit codes: 0 success, 10+ which check failed (the launcher prints it). */
static int rank_body(int rank, int num_ranks, const ncclUniqueId* id, void* ctx) {
  const int mode = *(const int*)ctx;
  int me = -1;
  mm_colocated* g = mm_colocated_current(&me);
  if (id != NULL || !g || me != rank || mm_colocated_ranks(g) != num_ranks) return 10;
  if (mode == ROUNDS) {
    /* Rounds of different sizes; the ranks take turns being slow (before
     * their arrival, or between the rounds), so fast ranks run a round ahead
     * of a slow one's read of the round before: one bank instead of two
     * gives a rank the next round's bytes. */
    uint32_t mine[MM_COLOCATED_SLOT_BYTES / 4], all[8 * MM_COLOCATED_SLOT_BYTES / 4];
    for (int k = 0; k < 300; ++k) {
      const int words = 1 + (k * 37) % (MM_COLOCATED_SLOT_BYTES / 4);
      for (int i = 0; i < words; ++i) mine[i] = word_of(rank, k, i);
      if ((k + rank) % num_ranks == 0) usleep(200 + 50 * rank);
      memset(all, 0, sizeof all);
      if (mm_colocated_allgather(g, rank, 7u, mine, (size_t)words * 4, all, 30.0) != MM_COLOCATED_OK) return 11;
      for (int r = 0; r < num_ranks; ++r)
        for (int i = 0; i < words; ++i)
          if (all[r * words + i] != word_of(r, k, i)) return 12;
    }
    return 0;
  }
  if (mode == STAY_AWAY) {
    if (rank == num_ranks - 1) return 0; /* never arrives */
    int v = rank, all[8];
    const double t0 = now_s();
    if (mm_colocated_allgather(g, rank, 7u, &v, sizeof v, all, 0.5) != MM_COLOCATED_TIMEOUT) return 13;
    const double waited = now_s() - t0;
    if (rank == 0 && (waited < 0.4 || waited > 10.0)) return 14; /* the first to give up waited its deadline */
    const double t1 = now_s();
    if (mm_colocated_allgather(g, rank, 7u, &v, sizeof v, all, 30.0) != MM_COLOCATED_TIMEOUT) return 15; /* broken: at once */
    if (now_s() - t1 > 5.0) return 16;
    return 0;
  }
  if (mode == OVERSIZED) {
    static uint8_t big[MM_COLOCATED_SLOT_BYTES + 1], out[8 * (MM_COLOCATED_SLOT_BYTES + 1)];
    const double t0 = now_s();
    if (rank == 0) return mm_colocated_allgather(g, rank, 7u, big, sizeof big, out, 30.0) == MM_COLOCATED_BAD_ARGS ? 0 : 17;
    if (mm_colocated_allgather(g, rank, 7u, big, 4, out, 30.0) != MM_COLOCATED_TIMEOUT) return 18;
    return now_s() - t0 < 10.0 ? 0 : 19; /* broken by rank 0, not its 30 s deadline */
  }
  if (mode == MISMATCH) {
    /* Round 0 agrees; in round 1 the last rank makes another call (another
     * tag, then in a second group another size): every rank must say so,
     * and the group stays broken. */
    int v = rank, all[8];
    if (mm_colocated_allgather(g, rank, 7u, &v, sizeof v, all, 30.0) != MM_COLOCATED_OK) return 21;
    const uint32_t tag = rank == num_ranks - 1 ? 8u : 7u;
    if (mm_colocated_allgather(g, rank, tag, &v, sizeof v, all, 30.0) != MM_COLOCATED_MISMATCH) return 22;
    if (mm_colocated_allgather(g, rank, 7u, &v, sizeof v, all, 30.0) != MM_COLOCATED_TIMEOUT) return 23;
    return 0;
  }
  if (mode == MISMATCH + 1) { /* the same tag, another size */
    int v[2] = {rank, rank}, all[16];
    const size_t bytes = rank == 0 ? sizeof v : sizeof v[0];
    return mm_colocated_allgather(g, rank, 7u, v, bytes, all, 30.0) == MM_COLOCATED_MISMATCH ? 0 : 24;
  }
  return 20;
}

static mm_test_result test_rounds(void) {
  int mode = ROUNDS;
  CHECK_EQ_INT(mm_run_ranks_ex(4, 120.0, MM_RANKS_NO_GPU | MM_RANKS_COLOCATED, rank_body, &mode), MM_RANKS_OK);
  CHECK_EQ_INT(mm_run_ranks_ex(2, 120.0, MM_RANKS_NO_GPU | MM_RANKS_COLOCATED, rank_body, &mode), MM_RANKS_OK);
  CHECK(mm_colocated_current(NULL) == NULL); /* the parent is no rank */
  return MM_TEST_PASS;
}

static mm_test_result test_stay_away(void) {
  int mode = STAY_AWAY;
  CHECK_EQ_INT(mm_run_ranks_ex(3, 120.0, MM_RANKS_NO_GPU | MM_RANKS_COLOCATED, rank_body, &mode), MM_RANKS_OK);
  return MM_TEST_PASS;
}

static mm_test_result test_oversized(void) {
  int mode = OVERSIZED;
  CHECK_EQ_INT(mm_run_ranks_ex(2, 120.0, MM_RANKS_NO_GPU | MM_RANKS_COLOCATED, rank_body, &mode), MM_RANKS_OK);
  return MM_TEST_PASS;
}

static mm_test_result test_mismatch(void) {
  int mode = MISMATCH;
  CHECK_EQ_INT(mm_run_ranks_ex(3, 120.0, MM_RANKS_NO_GPU | MM_RANKS_COLOCATED, rank_body, &mode), MM_RANKS_OK);
  mode = MISMATCH + 1;
  CHECK_EQ_INT(mm_run_ranks_ex(2, 120.0, MM_RANKS_NO_GPU | MM_RANKS_COLOCATED, rank_body, &mode), MM_RANKS_OK);
  return MM_TEST_PASS;
}

static mm_test_result test_create_outside(void) {
  megamoe_config cfg = megamoe_config_make(256, 256, 8, 2, 16);
  megamoe_layer* layer = (megamoe_layer*)&cfg; /* must come back NULL */
  CHECK_EQ_INT(mm_create_colocated(&cfg, &layer), MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK(layer == NULL);
  CHECK_MESSAGE_HAS("not a co-located rank");
  CHECK(mm_colocated_create(0) == NULL);
  CHECK(mm_colocated_create(MEGAMOE_MAX_RANKS + 1) == NULL);
  CHECK_EQ_INT(mm_colocated_allgather(NULL, 0, 7u, NULL, 0, NULL, 1.0), MM_COLOCATED_BAD_ARGS);
  CHECK(mm_colocated_tag("create agreement") != mm_colocated_tag("config exchange"));
  return MM_TEST_PASS;
}

const mm_test unit_suite_colocated[] = {
    {"colocated: every rank gets every round's bytes, in any arrival order", test_rounds},
    {"colocated: a rank that stays away ends the others' waits at the deadline", test_stay_away},
    {"colocated: an oversized contribution breaks the group at once", test_oversized},
    {"colocated: calls that differ between the ranks fail on every rank", test_mismatch},
    {"colocated: create outside a co-located rank is refused", test_create_outside},
    {NULL, NULL},
};
