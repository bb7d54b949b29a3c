/* One process per rank: the launcher the tool, the benchmark and the GPU
 * tests use (serving engines bring their own processes and call the public
 * API directly).
 *
 * The parent never initialises CUDA (a child forked after CUDA init fails
 * with "initialization error"). Child 0 makes the ncclUniqueId and sends it
 * through a pipe; the parent relays it to the other children. The parent
 * watches its children: when one fails or dies, it ends the others (a rank
 * that dies leaves its peers blocked inside NCCL calls forever), and it ends
 * all of them at the deadline. */
#ifndef MEGAMOE_PROCS_H
#define MEGAMOE_PROCS_H

#include <nccl.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Body of one rank. The device (cudaSetDevice(rank); device 0 with
 * MM_RANKS_COLOCATED; none with MM_RANKS_NO_GPU) is already selected.
 * Returns the child's exit code (0 = success). */
typedef int (*mm_rank_fn)(int rank, int num_ranks, const ncclUniqueId* id, void* ctx);

/* What mm_run_ranks returns. */
enum {
  MM_RANKS_OK = 0,
  MM_RANKS_RANK_FAILED = 1,  /* a rank exited non-zero or died; the others were ended */
  MM_RANKS_LAUNCH_FAILED = 2,
  MM_RANKS_DEADLINE = 3      /* the deadline passed; every rank was ended */
};

/* Flags of mm_run_ranks_ex. */
enum {
  MM_RANKS_NO_GPU = 1,   /* no cudaSetDevice, no ncclUniqueId (fn gets id = NULL) */
  /* Every rank on device 0 and no NCCL (fn gets id = NULL): the ranks share
   * a co-located group (colocated.h, mm_colocated_current() in each rank),
   * mapped before the fork and unmapped after the run. */
  MM_RANKS_COLOCATED = 2
};

/* Runs fn on num_ranks child processes and waits. Returns MM_RANKS_OK when
 * every rank returned 0; otherwise one of the codes above, after printing
 * which rank failed and how. deadline_s: the whole run's limit (<= 0: none). */
int mm_run_ranks(int num_ranks, double deadline_s, mm_rank_fn fn, void* ctx);
int mm_run_ranks_ex(int num_ranks, double deadline_s, int flags, mm_rank_fn fn, void* ctx);

/* How each rank ended (mm_run_ranks_opt). */
typedef struct mm_ranks_report {
  int first_failed;                         /* the first rank seen to fail or die; -1 when none did */
  int exit_code[MEGAMOE_MAX_RANKS];   /* its exit code; -1 when a signal ended it */
  int signal[MEGAMOE_MAX_RANKS];      /* the signal that ended it; 0 when it exited */
  int ended[MEGAMOE_MAX_RANKS];       /* 1 when the launcher ended it (a peer failed, or the deadline) */
} mm_ranks_report;

typedef struct mm_ranks_options {
  double deadline_s; /* the whole run's limit (<= 0: none) */
  /* After a rank fails or dies, how long the others may still run before
   * the launcher ends them (0: at once, as mm_run_ranks). A fault test gives
   * the survivors this long to report what they saw. */
  double grace_s;
  int flags;         /* MM_RANKS_NO_GPU, MM_RANKS_COLOCATED */
} mm_ranks_options;

/* mm_run_ranks with options, and how each rank ended in *report (may be
 * NULL). */
int mm_run_ranks_opt(int num_ranks, const mm_ranks_options* options, mm_rank_fn fn, void* ctx,
                     mm_ranks_report* report);

/* CUDA devices visible, counted in a throwaway child so the caller stays
 * free of CUDA. 0 when there is no device or no driver. */
int mm_count_gpus(void);

#ifdef __cplusplus
}
#endif

#endif
