/* Buffer layout of a layer: the symmetric (peer-visible) buffer and the local
 * workspace as lists of named regions. Pure host C: no CUDA calls. */
#ifndef MEGAMOE_LAYOUT_H
#define MEGAMOE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "contract.h"
#include "fused_plan.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MM_REGION_ALIGN 256 /* every region starts on this many bytes */

typedef enum mm_space { MM_SPACE_SYMMETRIC = 0, MM_SPACE_WORKSPACE = 1 } mm_space;


typedef struct mm_region {
  const char* name;
  mm_space space;
  uint64_t offset;  /* within its space's allocation */
  uint64_t bytes;   /* 0 when the arm does not use the region */
  uint64_t align;
} mm_region;

typedef struct mm_layout {
  int num_ranks;
  int64_t local_experts;  /* E_l */
  int64_t pool_rows;      /* P: capacity of the expert-major pool; the fused arm's ring rows */
  /* The fused arm's ring (fused_plan.h; all 0 for the other arms): the pool
   * regions hold ring.blocks slots of MM_FUSED_BLOCK_ROWS rows. */
  mm_fused_ring ring;
  uint64_t symmetric_bytes;
  uint64_t workspace_bytes;
  uint64_t prepared_weight_bytes;   /* copying mode: the layer's full prepared copy */
  uint64_t in_place_resident_bytes; /* in-place mode: what the layer keeps (W1 chunk scales) */
  uint64_t in_place_peak_bytes;     /* in-place mode: the most it holds while preparing */
  mm_region regions[MM_REGION_COUNT];
} mm_layout;

/* Computes the layout of config for num_ranks ranks. Checks the config first;
 * MEGAMOE_ERR_SIZE_OVERFLOW when a size does not fit in 64 bits. */
megamoe_status mm_layout_compute(const megamoe_config* config, int num_ranks, mm_layout* out);

/* Pool capacity: the routed rows one rank may receive, plus
 * MM_POOL_ROW_ALIGN rows of padding per local expert. The routed rows are
 * R * T_max * K (every slot of every rank on this rank: never overflows) for
 * pool_imbalance 0, else min(R * T_max * K, ceil(pool_imbalance * T_max * K)),
 * rounded up to MM_POOL_ROW_ALIGN. The worst case must fit in int32 in either
 * case (the device sums routed rows in int32). */
megamoe_status mm_pool_rows(const megamoe_config* config, int num_ranks, int64_t* rows);

#ifdef __cplusplus
}
#endif

#endif
