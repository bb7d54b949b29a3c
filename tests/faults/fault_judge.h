/* Fault tests (issue 14, part 3): what each rank of a case saw, written by
 * the rank into memory shared with the launcher's parent, and the verdicts
 * the parent draws from it. Pure host code (no CUDA): the CPU tests plant
 * each failure the judge is for (tests/unit/test_fault_judge.c). */
#ifndef MEGAMOE_TEST_FAULT_JUDGE_H
#define MEGAMOE_TEST_FAULT_JUDGE_H

#include <stdint.h>
#include <stdio.h>

#include "host/procs.h"
#include "megamoe.h"

typedef enum ft_kind {
  FT_KILL_INSIDE = 0, /* the victim dies (SIGKILL) inside its forward, stuck at a barrier; the peers enter after */
  FT_KILL_WAITING,    /* the peers wait inside their forward; the victim dies before it joins */
  FT_SKIP,            /* the victim skips one forward, then joins the next */
  FT_CONFIG           /* one rank passes another config (or none) to megamoe_create */
} ft_kind;

/* What one rank saw. Times are CLOCK_MONOTONIC seconds (one clock for every
 * process of the machine). */
typedef struct ft_rank_result {
  int reported;    /* the rank reached the end of its part */
  int setup_ok;    /* communicator, layer, weights and a checked warm-up forward */
  char note[256];  /* what went wrong before the fault, if anything */
  /* The fault step: forwards until the first error. */
  megamoe_status error; /* MEGAMOE_OK when none came */
  int error_forward;    /* which forward of the step (1-based) reported it */
  double t_start;       /* the step's first forward enqueued */
  double t_error;       /* megamoe_forward / megamoe_sync returned the error */
  char message[640];
  /* After the error: one more forward (documented: MEGAMOE_ERR_LAYER_FAILED after a timeout). */
  megamoe_status later_forward, later_sync;
  /* The layer freed (megamoe_abandon after a death, megamoe_destroy when every rank lives) and the
   * communicator (megamoe_comm_abort / megamoe_comm_destroy). */
  megamoe_status release, comm_release;
  double release_s, comm_release_s;
} ft_rank_result;

/* The create sub-cases of FT_CONFIG: what the odd rank (the last) passes. */
enum { FT_CONFIG_CASES = 9 };

typedef struct ft_config_case {
  const char* name;
  megamoe_status odd_status, others_status; /* what megamoe_create returns there */
  const char *odd_text, *others_text;        /* what the messages name ("%d": the odd rank) */
} ft_config_case;

extern const ft_config_case ft_config_cases[FT_CONFIG_CASES];

/* The odd rank's config in sub-case i (from the shared one); *null_config
 * set when it passes none. */
void ft_config_apply(int i, megamoe_config* config, int* null_config);

typedef struct ft_create_result {
  int reported;
  megamoe_status status;
  double seconds; /* megamoe_create's duration */
  int layer_made;
  megamoe_status forward; /* the control sub-case: a forward on the layer made */
  char message[512];
} ft_create_result;

/* Memory shared by the parent and the ranks of one case (mmap, MAP_SHARED),
 * zeroed before the case. The int fields are updated with __atomic builtins. */
typedef struct ft_shared {
  int arrived[FT_CONFIG_CASES + 4]; /* host barriers between the ranks */
  int launched;                     /* survivors whose fault-step forward is enqueued */
  int done;                         /* ranks past their fault step (FT_SKIP) */
  int64_t kill_ns;                  /* CLOCK_MONOTONIC ns just before the victim's SIGKILL (0 until then) */
  ft_rank_result rank[MEGAMOE_MAX_RANKS];
  ft_create_result create[FT_CONFIG_CASES][MEGAMOE_MAX_RANKS];
} ft_shared;

typedef struct ft_case {
  ft_kind kind;
  megamoe_arm arm;
  int num_ranks;
  int victim;       /* the rank that dies, skips, or passes the odd config: the last */
  double timeout_s; /* the layer's deadline (config timeout_s) */
  char label[96];
} ft_case;

/* How the launcher ended the case. */
typedef struct ft_launch {
  int rc; /* mm_run_ranks_opt's return */
  mm_ranks_report report;
} ft_launch;

typedef struct ft_counts {
  int passed, failed, skipped;
} ft_counts;

/* Judges one case and prints one "[PASS]"/"[FAIL]" line per verdict (the
 * config case: one per sub-case) with the measured times, and the reasons
 * of a failure. bound_factor: the time-to-error bound as a multiple of the
 * deadline (1.10: the deadline + 10 %). */
void ft_judge(const ft_case* c, const ft_shared* sh, const ft_launch* launch, double bound_factor, FILE* out,
              ft_counts* counts);

/* How many verdicts a case gives (for the skip count without GPUs). */
int ft_verdicts(ft_kind kind);

#endif
