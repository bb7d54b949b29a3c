/* Buffer layout of a layer: the symmetric (peer-visible) buffer and the local
 * workspace as lists of named regions. Pure host C: no CUDA calls. */
#ifndef MEGAMOE_LAYOUT_H
#define MEGAMOE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MM_REGION_ALIGN 256 /* every region starts on this many bytes */

typedef enum mm_space { MM_SPACE_SYMMETRIC = 0, MM_SPACE_WORKSPACE = 1 } mm_space;

/* Region ids. Symmetric regions are read or written by peers over NVLink. */
typedef enum mm_region_id {
  /* symmetric */
  MM_SYM_FLAGS = 0,      /* [MEGAMOE_MAX_RANKS] u64 barrier flags, slot p written by peer p */
  MM_SYM_INPUT_X,        /* [T_max, H] fp8: this rank's tokens, pulled by the expert ranks */
  MM_SYM_INPUT_X_SF,     /* [T_max, H/128] fp32 */
  MM_SYM_ROUTE_COUNTS,   /* [R][E_l] i32: rows source rank s routes to each local expert */
  MM_SYM_ROUTE_ENTRIES,  /* [R][T_max*K] mm_route_entry, written by source rank s */
  MM_SYM_COMBINE,        /* [K][T_max][H] bf16: expert outputs pushed back to this source rank */
  /* workspace */
  MM_WS_STATUS,          /* mm_device_status */
  MM_WS_EPOCH,           /* u64 forwards so far, counted on the device (graph replays count too) */
  MM_WS_PEERS,           /* [MEGAMOE_MAX_RANKS] peer base pointers of the symmetric buffer */
  MM_WS_EXPERT_TOKENS,   /* [E] i32: routed slots of this rank's tokens per global expert */
  MM_WS_POOL_OFFSET,     /* [E_l + 1] i32: first pool row of each local expert */
  MM_WS_POOL_COUNT,      /* [E_l] i32: valid rows of each local expert */
  MM_WS_ROUTE_BASE,      /* [R][E_l] i32: first entry of (source, local expert) in the source's list */
  MM_WS_POOL_SRC_START,  /* [E_l][R] i32: first pool row of (local expert, source) */
  MM_WS_POOL_ROWS,       /* [P] mm_pool_row */
  MM_WS_POOL_WEIGHT,     /* [P] fp32 routing weight of each pool row */
  MM_WS_POOL_X,          /* [P, H] fp8 */
  MM_WS_POOL_X_SF,       /* [H/128][P] fp32 (K-block-major) */
  MM_WS_L1_ACC,          /* [P, 2I] fp32 (staged arm: L1 output before SwiGLU) */
  MM_WS_L1_OUT,          /* [P, I] fp8 */
  MM_WS_L1_OUT_SF,       /* [I/G][P] fp32 */
  MM_WS_L2_OUT,          /* [P, H] bf16 (staged arm: L2 output before the combine push) */
  MM_REGION_COUNT
} mm_region_id;

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
  int64_t pool_rows;      /* P: capacity of the expert-major pool */
  uint64_t symmetric_bytes;
  uint64_t workspace_bytes;
  uint64_t prepared_weight_bytes;
  mm_region regions[MM_REGION_COUNT];
} mm_layout;

/* Computes the layout of config for num_ranks ranks. Checks the config first;
 * MEGAMOE_ERR_SIZE_OVERFLOW when a size does not fit in 64 bits. */
megamoe_status mm_layout_compute(const megamoe_config* config, int num_ranks, mm_layout* out);

/* Pool capacity: every routed slot of every rank may land on this rank, plus
 * up to MM_POOL_ROW_ALIGN - 1 padding rows per local expert. */
megamoe_status mm_pool_rows(const megamoe_config* config, int num_ranks, int64_t* rows);

#ifdef __cplusplus
}
#endif

#endif
