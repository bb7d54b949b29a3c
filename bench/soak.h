/* `megamoe soak`: many forwards of one layer per arm, every call drawn anew
 * (tokens per rank, token bound, routing skew, masked slots, index type), the
 * non-staged arms checked bitwise against the staged arm on every call, every
 * arm against the CPU reference every --ref-every calls; then device memory
 * and open file descriptors before and after, and over create/destroy cycles
 * (docs/RELIABILITY.md).
 *
 * The options and the per-call draw are plain C (soak_draw.c: no CUDA), so
 * the unit tests check them without a GPU. Every rank draws the same call
 * from the shared seed and the call index, so the ranks agree on every rank's
 * T and on the bound without talking; a rank's routing and inputs come from
 * the same seed, the call and its rank. */
#ifndef MEGAMOE_SOAK_H
#define MEGAMOE_SOAK_H

#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SOAK_MAX_CALLS 10000000
#define SOAK_MAX_CYCLES 100000

typedef struct soak_opts {
  int64_t hidden, intermediate, max_tokens; /* H, I, T_max */
  int experts, top_k, group;                /* E in total, K, G */
  int ranks;                                /* 0: every visible GPU (2 with colocated) */
  int colocated;                            /* --colocated: every rank on GPU 0 (host/colocated.h) */
  int64_t calls;                            /* forwards per arm */
  int64_t ref_every;                        /* the CPU reference every this many calls (0: never) */
  int cycles;                               /* create/destroy cycles after the soak */
  uint64_t seed;
  megamoe_arm arms[MEGAMOE_ARM_COUNT];      /* arms[0] is staged: the oracle */
  int num_arms;
} soak_opts;

/* Parses and checks the options after "soak" (no GPU touched): defaults
 * H 1024, I 512, 16 experts, top-4, T_max 512, G 128, 1000 calls, the
 * reference every 50 calls, 100 cycles, seed 1, arms staged,split. The shape
 * must pass megamoe_check_config for one rank (the rank count is checked when
 * it is known). Returns MM_PARSE_OK, MM_PARSE_HELP or MM_PARSE_ERROR (one line
 * on stderr naming the option). */
int soak_parse(int argc, char** argv, soak_opts* o);

/* ---- The per-call draw ---------------------------------------------------- */
typedef enum soak_skew {
  SOAK_SKEW_UNIFORM = 0, /* K distinct experts per token, uniform */
  SOAK_SKEW_ZIPF,        /* K distinct experts per token, Zipf(1.2) over a rotated expert order */
  SOAK_SKEW_ONE_EXPERT,  /* every slot of every token on one expert */
  SOAK_SKEW_COUNT
} soak_skew;

typedef enum soak_bound {
  SOAK_BOUND_NONE = 0, /* num_tokens_bound 0: the layer's own bound */
  SOAK_BOUND_TIGHT,    /* the largest T of the call's ranks */
  SOAK_BOUND_BETWEEN,  /* uniform in [largest T, T_max] */
  SOAK_BOUND_T_MAX,
  SOAK_BOUND_COUNT
} soak_bound;

/* One call, identical on every rank. */
typedef struct soak_call {
  int64_t index;
  int64_t tokens[MEGAMOE_MAX_RANKS]; /* T of each rank, in [0, T_max] */
  int64_t bound;                     /* 0, or >= every rank's T and <= T_max */
  soak_bound bound_kind;
  soak_skew skew;
  int hot_expert;    /* ONE_EXPERT: the expert; ZIPF: the most popular one */
  double mask_ratio; /* each slot masked (-1) with this probability */
  int idx64;         /* the top-k indices as int64 */
  uint64_t seed;     /* of this call's routing and inputs (with the rank) */
} soak_call;

/* The names the report uses ("uniform", "zipf", "one expert"; "none", ...). */
const char* soak_skew_name(soak_skew skew);
const char* soak_bound_name(soak_bound bound);

/* The edge cases every run has, whatever the seed: calls whose index is
 * SOAK_EDGE_ALL_EMPTY modulo SOAK_EDGE_CYCLE put every rank at T = 0; those
 * at SOAK_EDGE_ALL_FULL put every rank at T_max with every slot on one expert
 * and none masked (the pool's worst case). */
#define SOAK_EDGE_CYCLE 25
#define SOAK_EDGE_ALL_EMPTY 5
#define SOAK_EDGE_ALL_FULL 17

/* Draws call `index` of a run with `seed` for num_ranks ranks: a pure
 * function of its arguments, so every rank draws the same call. */
void soak_draw_call(const soak_opts* o, int num_ranks, uint64_t seed, int64_t index, soak_call* call);

/* This rank's routing of a call: idx [T, K] (int32: -1 masked) and weights w
 * [T, K] (in [0.05, 1.05); NaN on masked slots: nothing may read them).
 * Distinct experts per token under UNIFORM and ZIPF. Returns 0, or -1 when
 * out of host memory. */
int soak_draw_routing(const soak_opts* o, const soak_call* call, int rank, int32_t* idx, float* w);

/* A seed for this rank's inputs of a call (x, x_sf on the device). */
uint64_t soak_input_seed(const soak_call* call, int rank);

/* Runs the soak on the visible GPUs (gpus >= 1), one process per rank; the
 * caller has not initialised CUDA. Returns a process exit code (MM_EXIT_*):
 * MM_EXIT_FAILED on any mismatch, error or drift. */
int soak_run(soak_opts* o, int gpus);

#ifdef __cplusplus
}
#endif

#endif
