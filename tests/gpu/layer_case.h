/* One layer problem for the multi-rank GPU tests: global weights, every
 * rank's tokens and routing (the same on every rank, from a seed), this
 * rank's CPU reference (ref/ref.h), the device copies, and the checks.
 * (Helpers in the manner of test_layer.c, shared by test_errors.c.) */
#ifndef MEGAMOE_TEST_LAYER_CASE_H
#define MEGAMOE_TEST_LAYER_CASE_H

#include <stdint.h>

#include "megamoe.h"
#include "rank_ctx.h"

typedef struct lc_case {
  megamoe_config cfg;
  int64_t tokens[MEGAMOE_MAX_RANKS]; /* T of each rank */
  double mask_ratio;                 /* fraction of slots set to -1 */
  uint64_t seed;                     /* tokens and routing */
  uint64_t weight_seed;              /* weights (0: same as seed) */
} lc_case;

typedef struct lc_data {
  int R, El;
  uint8_t *w1, *w2; /* global [E][2I][H], [E][H][I] */
  float *w1_sf, *w2_sf;
  uint8_t* x[MEGAMOE_MAX_RANKS];
  float* x_sf[MEGAMOE_MAX_RANKS];
  int32_t* idx[MEGAMOE_MAX_RANKS];
  float* w[MEGAMOE_MAX_RANKS];
  uint16_t* y_ref; /* this rank's tokens */
} lc_data;

typedef struct lc_device {
  void *w1, *w2, *w1_sf, *w2_sf;  /* this rank's experts, checkpoint layout */
  void *x, *x_sf, *idx, *w, *y;   /* y has 16 spare bytes after T * H bf16 */
} lc_device;

/* A case with every rank holding T tokens (T_max = max(T, 1)), timeout 20 s. */
lc_case lc_make(const mm_rank_ctx* ctx, int64_t H, int64_t I, int E, int K, int64_t T, uint64_t salt);

/* Builds the problem (identical on every rank) and this rank's reference.
 * 0 on success. */
int lc_build(const lc_case* c, int R, int rank, lc_data* d);
void lc_free(lc_data* d);

/* This rank's weights (checkpoint layout) and inputs on the device. */
int lc_upload(const lc_case* c, const lc_data* d, int rank, lc_device* g);
void lc_device_free(lc_device* g);

megamoe_forward_args lc_args(const lc_case* c, const lc_device* g, int rank);

/* Fills n bf16 of y (plus the 16 spare bytes) with 0xFFFF (a NaN). */
int lc_poison(void* y, int64_t n);
/* 1 when the n bf16 at y (plus the 16 spare bytes) are all still 0xFFFF. */
int lc_still_poisoned(const void* y, int64_t n);

/* Downloads this rank's y and checks it against the reference: no NaN,
 * exact zeros for fully masked tokens, each token's relative L2 error below
 * 3e-2, the whole rank's diff below 1e-2. 0 when right; prints what failed. */
int lc_check_output(const lc_case* c, const lc_data* d, int rank, const void* y_dev, const char* what);

#endif
