/* The fault tests' verdicts (tests/faults/fault_judge.h) on the CPU: a
 * plausible run passes, and each failure the judge is for fails it (an
 * error past the deadline + 10 %, the wrong status, a survivor that never
 * reported, a message that does not name the dead rank, a layer still
 * usable after a timeout, a teardown that failed, the launcher naming the
 * wrong rank; for create: a rank that made a layer, a message without the
 * field). And the launcher with a grace period, without GPUs: a rank that
 * SIGKILLs itself is named with its signal while its peer, given the grace,
 * still reports and exits 0. */
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "faults/fault_judge.h"
#include "unit.h"

static ft_case kill_case(ft_kind kind) {
  ft_case c = {kind, MEGAMOE_ARM_STAGED, 2, 1, 1.0, "test case"};
  return c;
}

/* A run that went as it should: rank 1 killed at t = 100 s, rank 0's error
 * 1.02 s later. */
static void good_kill(ft_shared* sh, ft_launch* l) {
  memset(sh, 0, sizeof *sh);
  memset(l, 0, sizeof *l);
  sh->kill_ns = 100000000000ll;
  ft_rank_result* x = &sh->rank[0];
  x->reported = x->setup_ok = 1;
  x->error = MEGAMOE_ERR_TIMEOUT;
  x->error_forward = 1;
  x->t_start = 100.001;
  x->t_error = 101.02;
  snprintf(x->message, sizeof x->message,
           "rank 0, forward 3: rank 1 did not arrive at the combine barrier: waited 1.0 s (timeout_s 1.0)");
  x->later_forward = x->later_sync = MEGAMOE_ERR_LAYER_FAILED;
  l->rc = MM_RANKS_RANK_FAILED;
  l->report.first_failed = 1;
  l->report.signal[1] = SIGKILL;
  l->report.exit_code[1] = -1;
}

static int judge_fails(const ft_case* c, const ft_shared* sh, const ft_launch* l) {
  ft_counts n = {0, 0, 0};
  FILE* sink = fopen("/dev/null", "w");
  ft_judge(c, sh, l, 1.10, sink ? sink : stdout, &n);
  if (sink) fclose(sink);
  return n.failed;
}

static mm_test_result t_kill_verdicts(void) {
  static ft_shared sh;
  ft_launch l;
  for (int k = 0; k < 2; ++k) {
    const ft_case c = kill_case(k ? FT_KILL_WAITING : FT_KILL_INSIDE);
    good_kill(&sh, &l);
    CHECK_EQ_INT(judge_fails(&c, &sh, &l), 0);
    /* Each planted failure fails the verdict. */
    for (int plant = 0; plant < 13; ++plant) {
      good_kill(&sh, &l);
      ft_rank_result* x = &sh.rank[0];
      switch (plant) {
        case 0: x->t_error = 101.2; break;                     /* past the deadline + 10 % */
        case 1: x->error = MEGAMOE_OK; break;                  /* no error at all */
        case 2: x->error = MEGAMOE_ERR_CUDA; break;            /* the wrong error */
        case 3: x->reported = 0; break;                        /* crashed or hung */
        case 4: snprintf(x->message, sizeof x->message, "rank 0: something timed out"); break; /* no dead rank */
        case 5: x->later_forward = MEGAMOE_OK; break;          /* a timed-out layer still runs */
        case 6: x->release = MEGAMOE_ERR_CUDA; break;          /* abandon failed */
        case 7: x->comm_release = MEGAMOE_ERR_NCCL; break;     /* comm abort failed */
        case 8: l.report.first_failed = 0; break;              /* the launcher named the wrong rank */
        case 9: l.rc = MM_RANKS_OK; break;                     /* the launcher missed the death */
        case 10: l.report.ended[0] = 1; l.report.signal[0] = SIGTERM; break; /* the survivor was ended */
        case 11: sh.kill_ns = 0; break;                        /* the victim never died */
        case 12: /* the deadline in effect was not the configured 1 s */
          snprintf(x->message, sizeof x->message, "rank 0: rank 1 did not arrive: waited 60.0 s (timeout_s 60.0)");
          break;
      }
      CHECK_MSG(judge_fails(&c, &sh, &l) == 1, "kind %d plant %d passed", k, plant);
    }
    /* The error in the second forward of the step: allowed only when the
     * victim died inside its forward (its kernels may have finished it). */
    good_kill(&sh, &l);
    sh.rank[0].error_forward = 2;
    CHECK_EQ_INT(judge_fails(&c, &sh, &l), k ? 1 : 0);
  }
  return MM_TEST_PASS;
}

static mm_test_result t_skip_and_config_verdicts(void) {
  static ft_shared sh;
  ft_launch l;
  const ft_case skip = kill_case(FT_SKIP);
  memset(&sh, 0, sizeof sh);
  memset(&l, 0, sizeof l);
  for (int r = 0; r < 2; ++r) {
    ft_rank_result* x = &sh.rank[r];
    x->reported = x->setup_ok = 1;
    x->error = MEGAMOE_ERR_TIMEOUT;
    x->error_forward = 1;
    x->t_start = 50.0 + r;
    x->t_error = 51.01 + r;
    snprintf(x->message, sizeof x->message, "rank %d, forward 2: rank %d did not arrive: waited 1.0 s (timeout_s 1.0)",
             r, 1 - r);
    x->later_forward = x->later_sync = MEGAMOE_ERR_LAYER_FAILED;
  }
  CHECK_EQ_INT(judge_fails(&skip, &sh, &l), 0);
  sh.rank[1].t_error = 52.5; /* the skipper's own step too slow */
  CHECK_EQ_INT(judge_fails(&skip, &sh, &l), 1);
  sh.rank[1].t_error = 52.01;
  sh.rank[0].release = MEGAMOE_ERR_NCCL; /* the collective destroy failed */
  CHECK_EQ_INT(judge_fails(&skip, &sh, &l), 1);

  const ft_case config = kill_case(FT_CONFIG);
  memset(&sh, 0, sizeof sh);
  for (int i = 0; i < FT_CONFIG_CASES; ++i)
    for (int r = 0; r < 2; ++r) {
      ft_create_result* x = &sh.create[i][r];
      const ft_config_case* k = &ft_config_cases[i];
      x->reported = 1;
      x->status = r == 1 ? k->odd_status : k->others_status;
      x->layer_made = x->status == MEGAMOE_OK;
      x->forward = MEGAMOE_OK;
      char text[96];
      snprintf(text, sizeof text, r == 1 ? k->odd_text : k->others_text, 1);
      snprintf(x->message, sizeof x->message, "config differs across ranks%s ... %s", text, "");
    }
  CHECK_EQ_INT(judge_fails(&config, &sh, &l), 0);
  sh.create[0][0].status = MEGAMOE_OK; /* one rank made a layer the other refused */
  CHECK_EQ_INT(judge_fails(&config, &sh, &l), 1);
  sh.create[0][0].status = MEGAMOE_ERR_BAD_ARGUMENT;
  snprintf(sh.create[3][1].message, sizeof sh.create[3][1].message, "configs differ"); /* no field named */
  CHECK_EQ_INT(judge_fails(&config, &sh, &l), 1);
  return MM_TEST_PASS;
}

/* ---- the launcher's grace, without GPUs ----------------------------------------- */
static int64_t clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Rank 1 notes the time and SIGKILLs itself; rank 0 waits for that, then
 * reports what a survivor would (an error 0.2 s after the kill). */
static int grace_rank(int rank, int num_ranks, const ncclUniqueId* id, void* vsh) {
  ft_shared* sh = (ft_shared*)vsh;
  if (rank == 1) {
    __atomic_store_n(&sh->kill_ns, clock_ns(), __ATOMIC_RELEASE);
    raise(SIGKILL);
  }
  while (__atomic_load_n(&sh->kill_ns, __ATOMIC_ACQUIRE) == 0) usleep(100);
  usleep(200000);
  ft_rank_result* x = &sh->rank[0];
  x->reported = x->setup_ok = 1;
  x->error = MEGAMOE_ERR_TIMEOUT;
  x->error_forward = 1;
  /* Times as a survivor would note them, not read from the clock here (a
   * slow machine must not fail this test). */
  x->t_start = (double)sh->kill_ns * 1e-9 - 0.5;
  x->t_error = x->t_start + 0.7;
  snprintf(x->message, sizeof x->message, "rank 0: rank 1 did not arrive: waited 1.0 s (timeout_s 1.0)");
  x->later_forward = x->later_sync = MEGAMOE_ERR_LAYER_FAILED;
  return 0;
}

/* A survivor stuck for good (as in a collective with the dead rank). */
static int stuck_rank(int rank, int num_ranks, const ncclUniqueId* id, void* vsh) {
  if (rank == 1) raise(SIGKILL);
  for (;;) pause();
  return 0;
}

static mm_test_result t_launcher_grace(void) {
  ft_shared* sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  const mm_ranks_options o = {120.0, 30.0, MM_RANKS_NO_GPU};
  ft_launch l;
  l.rc = mm_run_ranks_opt(2, &o, grace_rank, sh, &l.report);
  CHECK_EQ_INT(l.rc, MM_RANKS_RANK_FAILED);
  CHECK_EQ_INT(l.report.first_failed, 1);
  CHECK_EQ_INT(l.report.signal[1], SIGKILL);
  CHECK_EQ_INT(l.report.exit_code[0], 0);
  CHECK_EQ_INT(l.report.ended[0], 0);
  const ft_case c = kill_case(FT_KILL_WAITING);
  CHECK_EQ_INT(judge_fails(&c, sh, &l), 0);
  /* A survivor that never reports is ended when the grace is over. */
  memset(sh, 0, sizeof *sh);
  const mm_ranks_options short_grace = {120.0, 0.5, MM_RANKS_NO_GPU};
  l.rc = mm_run_ranks_opt(2, &short_grace, stuck_rank, sh, &l.report);
  CHECK_EQ_INT(l.rc, MM_RANKS_RANK_FAILED);
  CHECK_EQ_INT(l.report.ended[0], 1);
  CHECK_EQ_INT(sh->rank[0].reported, 0);
  CHECK_EQ_INT(judge_fails(&c, sh, &l), 1);
  munmap(sh, sizeof *sh);
  return MM_TEST_PASS;
}

const mm_test unit_suite_fault_judge[] = {
    {"fault_judge.kill_verdicts_fail_on_each_planted_fault", t_kill_verdicts},
    {"fault_judge.skip_and_config_verdicts", t_skip_and_config_verdicts},
    {"fault_judge.launcher_grace_lets_a_survivor_report", t_launcher_grace},
    {NULL, NULL},
};
