/* What a multi-rank GPU test sees: its rank, the communicator, a stream. */
#ifndef MEGAMOE_TEST_RANK_CTX_H
#define MEGAMOE_TEST_RANK_CTX_H

#include "../harness.h"
#include "host/colocated.h"
#include "megamoe.h"

typedef struct mm_rank_ctx {
  int rank, num_ranks;
  ncclComm_t comm;     /* NULL when the ranks are co-located on one GPU (host/colocated.h) */
  cudaStream_t stream;
  uint64_t seed; /* the run's base seed, printed by the runner */
} mm_rank_ctx;

/* megamoe_create on the ranks of ctx: through the communicator, or, for
 * co-located ranks, mm_create_colocated (the same checks, agreements and
 * statuses). Collective, as megamoe_create. */
static inline megamoe_status mm_test_create(const mm_rank_ctx* ctx, const megamoe_config* config,
                                            megamoe_layer** layer_out) {
  return ctx->comm ? megamoe_create(config, ctx->comm, layer_out) : mm_create_colocated(config, layer_out);
}

/* A test every rank runs; the results of all ranks combine (any FAIL fails). */
typedef struct mm_rank_test {
  const char* name;
  mm_test_result (*fn)(const mm_rank_ctx* ctx);
  int min_ranks; /* skipped below this many ranks */
} mm_rank_test;

/* The arm the layer tests build their configs with: MEGAMOE_TEST_ARM
 * ("staged" when unset; the runner sets it per suite run). */
static inline megamoe_arm mm_test_arm(void) {
  const char* a = getenv("MEGAMOE_TEST_ARM");
  if (a && strcmp(a, "split") == 0) return MEGAMOE_ARM_SPLIT;
  if (a && strcmp(a, "fused") == 0) return MEGAMOE_ARM_FUSED;
  return MEGAMOE_ARM_STAGED;
}

/* tests/gpu/test_layer.c */
extern const mm_rank_test mm_layer_tests[];

#endif
