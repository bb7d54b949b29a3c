/* One layer problem for the multi-rank GPU tests (test_layer.c and
 * test_errors.c): global weights, every rank's tokens and routing (the same
 * on every rank, from a seed), this rank's CPU reference (ref/ref.h), the
 * device copies, and the checks (ref/ref_check.h). */
#ifndef MEGAMOE_TEST_LAYER_CASE_H
#define MEGAMOE_TEST_LAYER_CASE_H

#include <stdint.h>

#include "megamoe.h"
#include "rank_ctx.h"

/* In a ranked test: a check that records its failure in the caller's `bad`
 * (and says where on stderr) instead of returning, so the rank still makes
 * every collective call. Needs `ctx` (mm_rank_ctx*) and `int bad` in scope. */
#define LC_EXPECT(cond, ...)                                                                            \
  do {                                                                                                  \
    if (!(cond)) {                                                                                      \
      fprintf(stderr, "    rank %d: EXPECT failed at %s:%d: %s: ", ctx->rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                                     \
      fputc('\n', stderr);                                                                              \
      bad = 1;                                                                                          \
    }                                                                                                   \
  } while (0)

/* Make cases with lc_make: one_expert and one_rank are off at -1, not 0. */
typedef struct lc_case {
  megamoe_config cfg;
  int64_t tokens[MEGAMOE_MAX_RANKS]; /* T of each rank */
  double mask_ratio;                 /* fraction of slots set to -1 */
  int one_expert;                    /* >= 0: every token's slot 0 goes there, other slots masked */
  int one_rank;                      /* >= 0: every slot goes to distinct experts of this rank (K <= E_l) */
  int repeat_expert;                 /* 1: slots of a token share an expert (patterns in fill_routing) */
  int idx64;                         /* int64 top-k indices */
  int skew_experts;                  /* > 0: a slot picks one of experts [0, skew_experts) with probability
                                        skew_ratio (most slots on a few experts of rank 0), else any expert */
  double skew_ratio;                 /* < 1 when skew_experts < K (a token's K experts are distinct) */
  int no_reference;                  /* 1: lc_build computes no reference (y_ref NULL; tests that compare
                                        arms bitwise and judge nothing against it) */
  uint64_t seed;                     /* tokens and routing */
  uint64_t weight_seed;              /* weights (0: same as seed) */
} lc_case;

typedef struct lc_data {
  int R, El;
  uint8_t *w1, *w2; /* global [E][2I][H], [E][H][I] */
  float *w1_sf, *w2_sf;
  uint8_t* x[MEGAMOE_MAX_RANKS];
  float* x_sf[MEGAMOE_MAX_RANKS];
  int32_t* idx[MEGAMOE_MAX_RANKS]; /* int32 on the host whatever idx64 says */
  float* w[MEGAMOE_MAX_RANKS];     /* NaN on masked slots: nothing may read them */
  uint16_t* y_ref; /* this rank's tokens */
} lc_data;

typedef struct lc_device {
  void *w1, *w2, *w1_sf, *w2_sf;  /* this rank's experts, checkpoint layout */
  void *x, *x_sf, *idx, *w, *y;   /* y has 16 spare bytes after T * H bf16 */
} lc_device;

/* A case with every rank holding T tokens (T_max = max(T, 1)), timeout 20 s,
 * the arm of mm_test_arm(), seed from the run's seed and salt, no mask and
 * none of one_expert, one_rank, repeat_expert, idx64, skew, no_reference. */
lc_case lc_make(const mm_rank_ctx* ctx, int64_t H, int64_t I, int E, int K, int64_t T, uint64_t salt);

/* Builds the problem (identical on every rank) and this rank's reference.
 * 0 on success. */
int lc_build(const lc_case* c, int R, int rank, lc_data* d);
void lc_free(lc_data* d);

/* This rank's weights (checkpoint layout) and inputs on the device; top-k
 * as int32 or (idx64) int64. */
int lc_upload(const lc_case* c, const lc_data* d, int rank, lc_device* g);
void lc_device_free(lc_device* g);

megamoe_forward_args lc_args(const lc_case* c, const lc_device* g, int rank);

/* Poisons a->y's T x H bf16 (0xFFFF, a NaN), runs one forward, syncs. When
 * the poison fails the forward still runs, empty (peers must not wait), and
 * the call reports the failure. */
megamoe_status lc_forward(megamoe_layer* layer, const mm_rank_ctx* ctx, const megamoe_forward_args* a, int64_t H);

/* Elements of two bf16 outputs that differ bitwise; the first one's index
 * in *first (-1 when none). */
int64_t lc_count_differences(const uint16_t* want, const uint16_t* got, int64_t n, int64_t* first);

/* Fills n bf16 of y (plus the 16 spare bytes) with 0xFFFF (a NaN). */
int lc_poison(void* y, int64_t n);

/* Enqueues a one-CTA kernel that lets its dependents launch at once, spins
 * delay_us, then copies bytes from src to dst (tests/gpu/late_copy.cu): a
 * caller's kernel writing a layer input while a programmatically launched
 * forward may already be scheduled. 0 when enqueued. */
int lc_late_copy(void* dst, const void* src, size_t bytes, unsigned delay_us, cudaStream_t stream);
/* 1 when the n bf16 at y (plus the 16 spare bytes) are all still 0xFFFF. */
int lc_still_poisoned(const void* y, int64_t n);

/* Copies n bf16 of the device's y_dev to host (nothing when n is 0). 0 on success. */
int lc_download(const void* y_dev, int64_t n, uint16_t* host);

/* Judges this rank's y (on the host) against the reference with
 * ref_check_output (every token) and prints the statistics line to stdout;
 * with MEGAMOE_TEST_PLANT_BUG set (and not "0") a bug is planted in y first,
 * so the check must fail. 0: pass; prints what failed. */
int lc_compare(const lc_case* c, const lc_data* d, int rank, uint16_t* y, const char* what);

/* Downloads this rank's y and checks it against the reference with
 * ref_check_output, quietly (no statistics line, no planted bug). 0 when
 * right; prints what failed. */
int lc_check_output(const lc_case* c, const lc_data* d, int rank, const void* y_dev, const char* what);

#endif
