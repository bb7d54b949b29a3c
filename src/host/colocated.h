/* Co-located ranks: several rank processes on ONE GPU, for testing the
 * multi-rank protocols where only a one-GPU machine is lent.
 *
 * NCCL refuses two ranks of a communicator on one device, so co-located
 * ranks do not use NCCL at all. The launcher (procs.h, MM_RANKS_COLOCATED)
 * maps a group in shared memory before it forks the rank processes; create
 * (mm_create_colocated, layer.c) does its agreements and its config
 * exchange through the group's allgather, allocates the symmetric buffer
 * with cudaMalloc and maps every peer's buffer through CUDA IPC instead of
 * an NCCL window. The kernels are the same: they see peer pointers, here
 * into the same device's memory.
 *
 * What this checks and what it does not (docs/RELIABILITY.md): every
 * cross-rank protocol of the layer (routing published to a peer, the pull of
 * its rows, the combine's stores into its buffer, the all-rank barriers and
 * the errors they carry, timeouts when a rank stays away), each rank in its
 * own process and CUDA context, as at EP>1. The contexts share the GPU by
 * time slicing, so a forward is slow and its timing means nothing; stores
 * cross no NVLink, so the system-scope ordering between GPUs is not what is
 * exercised. Performance figures come only from real multi-GPU runs.
 *
 * The group is host memory shared by the rank processes (MAP_SHARED,
 * inherited over fork); its collectives are C11 atomics on it, with a
 * deadline on every wait. Pure host code: the CPU unit tests run it. */
#ifndef MEGAMOE_COLOCATED_H
#define MEGAMOE_COLOCATED_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mm_colocated mm_colocated;

/* Bytes one rank contributes to one allgather, at most. */
#define MM_COLOCATED_SLOT_BYTES 2048

/* A group for num_ranks processes, mapped shared (MAP_SHARED | MAP_ANONYMOUS)
 * by the parent before it forks them; NULL when num_ranks is out of
 * [1, MEGAMOE_MAX_RANKS] or the mapping fails. */
mm_colocated* mm_colocated_create(int num_ranks);
/* Unmaps it (the parent, after the ranks ended). NULL is fine. */
void mm_colocated_destroy(mm_colocated* g);

int mm_colocated_ranks(const mm_colocated* g);

/* What mm_colocated_allgather returns. */
enum {
  MM_COLOCATED_OK = 0,
  MM_COLOCATED_TIMEOUT = -1,  /* a rank did not arrive in time, or the group broke before */
  MM_COLOCATED_BAD_ARGS = -2, /* bytes > MM_COLOCATED_SLOT_BYTES, a bad rank, a NULL buffer */
  MM_COLOCATED_MISMATCH = -3  /* the ranks' calls of this round differ in tag or size */
};

/* Collective (every rank of the group calls it, in the same order as every
 * other collective): rank `rank`'s `bytes` bytes at `mine` land in `all`
 * (num_ranks * bytes, rank order) on every rank. `tag` names the call site:
 * every rank must make the same call (tag and bytes) in the same round, and
 * a round whose calls differ fails on every rank alike, instead of pairing
 * one rank's data with another call's. Waits at most timeout_s for the
 * other ranks. Any failure breaks the group: every later call fails at once
 * (the ranks are out of step); every rank gets the same verdict for a
 * round (a round either completes or breaks, never both). Returns one of
 * the codes above; with a bad argument nothing is written. */
int mm_colocated_allgather(mm_colocated* g, int rank, uint32_t tag, const void* mine, size_t bytes, void* all,
                           double timeout_s);

/* A tag from a call site's name (FNV-1a). */
uint32_t mm_colocated_tag(const char* name);

/* The group this process runs in and its rank there: set in each rank
 * process by the launcher before its body runs (procs.c); NULL (and rank
 * 0) in every other process. rank may be NULL. */
mm_colocated* mm_colocated_current(int* rank);
void mm_colocated_set_current(mm_colocated* g, int rank);

/* megamoe_create for a co-located rank process (collective over the ranks
 * of mm_colocated_current()): the same checks, agreements and statuses, no
 * communicator. MEGAMOE_ERR_BAD_ARGUMENT in a process that is not a
 * co-located rank. The layer is then used and destroyed as any other. */
megamoe_status mm_create_colocated(const megamoe_config* config, megamoe_layer** layer_out);

#ifdef __cplusplus
}
#endif

#endif
