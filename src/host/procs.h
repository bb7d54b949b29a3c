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

#ifdef __cplusplus
extern "C" {
#endif

/* Body of one rank. The device (cudaSetDevice(rank)) is already selected.
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
  MM_RANKS_NO_GPU = 1 /* no cudaSetDevice, no ncclUniqueId (fn gets id = NULL) */
};

/* Runs fn on num_ranks child processes and waits. Returns MM_RANKS_OK when
 * every rank returned 0; otherwise one of the codes above, after printing
 * which rank failed and how. deadline_s: the whole run's limit (<= 0: none). */
int mm_run_ranks(int num_ranks, double deadline_s, mm_rank_fn fn, void* ctx);
int mm_run_ranks_ex(int num_ranks, double deadline_s, int flags, mm_rank_fn fn, void* ctx);

/* CUDA devices visible, counted in a throwaway child so the caller stays
 * free of CUDA. 0 when there is no device or no driver. */
int mm_count_gpus(void);

#ifdef __cplusplus
}
#endif

#endif
