/* The process-per-rank launcher (src/host/procs.c), without GPUs: a rank that
 * fails ends the others instead of leaving them waiting; a run past its
 * deadline is ended; a clean run returns OK; the parent never waits forever. */
#include <signal.h>
#include <unistd.h>

#include "host/procs.h"
#include "unit.h"

/* ctx points to an int selecting what each rank does. */
enum { ALL_OK, RANK1_FAILS, RANK0_KILLED, ALL_HANG };

static int rank_body(int rank, int num_ranks, const ncclUniqueId* id, void* ctx) {
  const int mode = *(const int*)ctx;
  if (id != NULL) return 9; /* MM_RANKS_NO_GPU passes no unique id */
  switch (mode) {
    case ALL_OK: return 0;
    case RANK1_FAILS:
      if (rank == 1) return 5;
      pause(); /* as if blocked inside a collective with the dead rank */
      return 0;
    case RANK0_KILLED:
      if (rank == 0) raise(SIGKILL);
      pause();
      return 0;
    case ALL_HANG:
      pause();
      return 0;
  }
  return 7;
}

static mm_test_result test_all_ok(void) {
  int mode = ALL_OK;
  CHECK_EQ_INT(mm_run_ranks_ex(4, 60.0, MM_RANKS_NO_GPU, rank_body, &mode), MM_RANKS_OK);
  return MM_TEST_PASS;
}

static mm_test_result test_failing_rank_ends_the_others(void) {
  int mode = RANK1_FAILS;
  /* Rank 0 would wait forever: only the launcher's reaction ends it, well
   * before the 120 s deadline (which would return MM_RANKS_DEADLINE). */
  CHECK_EQ_INT(mm_run_ranks_ex(3, 120.0, MM_RANKS_NO_GPU, rank_body, &mode), MM_RANKS_RANK_FAILED);
  return MM_TEST_PASS;
}

static mm_test_result test_killed_rank_ends_the_others(void) {
  int mode = RANK0_KILLED;
  CHECK_EQ_INT(mm_run_ranks_ex(2, 120.0, MM_RANKS_NO_GPU, rank_body, &mode), MM_RANKS_RANK_FAILED);
  return MM_TEST_PASS;
}

static mm_test_result test_deadline_ends_all(void) {
  int mode = ALL_HANG;
  CHECK_EQ_INT(mm_run_ranks_ex(2, 0.5, MM_RANKS_NO_GPU, rank_body, &mode), MM_RANKS_DEADLINE);
  return MM_TEST_PASS;
}

static mm_test_result test_bad_rank_count(void) {
  int mode = ALL_OK;
  CHECK_EQ_INT(mm_run_ranks_ex(0, 1.0, MM_RANKS_NO_GPU, rank_body, &mode), MM_RANKS_LAUNCH_FAILED);
  CHECK_EQ_INT(mm_run_ranks_ex(9, 1.0, MM_RANKS_NO_GPU, rank_body, &mode), MM_RANKS_LAUNCH_FAILED);
  return MM_TEST_PASS;
}

const mm_test unit_suite_procs[] = {
    {"procs: every rank succeeds", test_all_ok},
    {"procs: a failing rank ends the waiting ranks", test_failing_rank_ends_the_others},
    {"procs: a killed rank ends the waiting ranks", test_killed_rank_ends_the_others},
    {"procs: the deadline ends hung ranks", test_deadline_ends_all},
    {"procs: rank count out of range", test_bad_rank_count},
    {NULL, NULL},
};
