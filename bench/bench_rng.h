/* A small deterministic generator for the tool and the benchmarks' host-side
 * data (the tests keep their own). xorshift64* for the bits, Box-Muller for
 * normal values. Header-only, C11. */
#ifndef MEGAMOE_BENCH_RNG_H
#define MEGAMOE_BENCH_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct mm_bench_rng {
  uint64_t state; /* never 0 */
  double spare;   /* the second value of the last Box-Muller pair */
  int has_spare;
} mm_bench_rng;

static inline mm_bench_rng mm_bench_rng_make(uint64_t seed) {
  mm_bench_rng r = {seed ? seed : 0x853c49e6748fea9bull, 0.0, 0};
  return r;
}

static inline uint64_t mm_bench_rng_next(mm_bench_rng* r) {
  r->state ^= r->state >> 12;
  r->state ^= r->state << 25;
  r->state ^= r->state >> 27;
  return r->state * 0x2545f4914f6cdd1dull;
}

/* Uniform in (0, 1): never 0, so its logarithm is finite. */
static inline double mm_bench_rng_uniform(mm_bench_rng* r) {
  return ((double)(mm_bench_rng_next(r) >> 11) + 0.5) * 0x1.0p-53;
}

/* Standard normal. */
static inline double mm_bench_rng_normal(mm_bench_rng* r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  const double radius = sqrt(-2.0 * log(mm_bench_rng_uniform(r)));
  const double angle = 6.283185307179586 * mm_bench_rng_uniform(r);
  r->spare = radius * sin(angle);
  r->has_spare = 1;
  return radius * cos(angle);
}

#endif
