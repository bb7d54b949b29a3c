/* Minimal test harness shared by the CPU and GPU test runners (header-only).
 *
 * A test is a function returning MM_TEST_PASS, MM_TEST_FAIL or MM_TEST_SKIP.
 * CHECK* macros print the failing condition with file and line and return
 * MM_TEST_FAIL from the test. A suite is a NULL-terminated array of mm_test.
 * The runner prints one line per test and the closing line
 *   N passed, N failed, N skipped
 * and returns non-zero when a test failed. */
#ifndef MEGAMOE_TEST_HARNESS_H
#define MEGAMOE_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum mm_test_result { MM_TEST_PASS = 0, MM_TEST_FAIL = 1, MM_TEST_SKIP = 2 } mm_test_result;

typedef struct mm_test {
  const char* name;
  mm_test_result (*fn)(void);
} mm_test;

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "    CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return MM_TEST_FAIL;                                                      \
    }                                                                           \
  } while (0)

#define CHECK_MSG(cond, ...)                                                    \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "    CHECK failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                             \
      fputc('\n', stderr);                                                      \
      return MM_TEST_FAIL;                                                      \
    }                                                                           \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                       \
  do {                                                                           \
    long long mm_a_ = (long long)(a), mm_b_ = (long long)(b);                    \
    if (mm_a_ != mm_b_) {                                                        \
      fprintf(stderr, "    CHECK failed at %s:%d: %s == %s (%lld vs %lld)\n", __FILE__, \
              __LINE__, #a, #b, mm_a_, mm_b_);                                   \
      return MM_TEST_FAIL;                                                       \
    }                                                                            \
  } while (0)

/* A text that must (or must not) contain a piece: messages, tool output. */
#define CHECK_HAS(text, want) CHECK_MSG(strstr((text), (want)) != NULL, "\"%s\" lacks \"%s\"", (text), (want))
#define CHECK_LACKS(text, bad) CHECK_MSG(strstr((text), (bad)) == NULL, "\"%s\" has \"%s\"", (text), (bad))

#define CHECK_STATUS(expr, want)                                                  \
  do {                                                                            \
    megamoe_status mm_got_ = (expr);                                              \
    if (mm_got_ != (want)) {                                                      \
      fprintf(stderr, "    CHECK failed at %s:%d: %s returned %s (want %s): %s\n", \
              __FILE__, __LINE__, #expr, megamoe_status_string(mm_got_),          \
              megamoe_status_string(want), megamoe_last_error());                 \
      return MM_TEST_FAIL;                                                        \
    }                                                                             \
  } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, MEGAMOE_OK)

/* Counts of a run. */
typedef struct mm_test_counts {
  int passed, failed, skipped;
} mm_test_counts;

static inline void mm_test_count(mm_test_counts* c, const char* name, mm_test_result r) {
  const char* word = r == MM_TEST_PASS ? "PASS" : r == MM_TEST_SKIP ? "SKIP" : "FAIL";
  printf("[%s] %s\n", word, name);
  fflush(stdout);
  if (r == MM_TEST_PASS) c->passed++;
  else if (r == MM_TEST_SKIP) c->skipped++;
  else c->failed++;
}

static inline void mm_test_print_summary(const mm_test_counts* c) {
  printf("%d passed, %d failed, %d skipped\n", c->passed, c->failed, c->skipped);
  fflush(stdout);
}

/* Runs every test of suites (a NULL-terminated array of NULL-terminated
 * suites) whose name contains filter (NULL: all), accumulating into c. */
static inline void mm_run_suites(const mm_test* const* suites, const char* filter,
                                 mm_test_counts* c) {
  for (int s = 0; suites[s] != NULL; ++s)
    for (const mm_test* t = suites[s]; t->name != NULL; ++t) {
      if (filter && !strstr(t->name, filter)) continue;
      fflush(stdout);
      mm_test_count(c, t->name, t->fn());
    }
}

/* Deterministic random numbers for tests (splitmix64), seeded per test so a
 * failure can be replayed from the printed seed. */
typedef struct mm_rng {
  uint64_t state;
} mm_rng;

static inline uint64_t mm_rng_next(mm_rng* r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double mm_rng_uniform(mm_rng* r) { return (double)(mm_rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform integer in [0, n). */
static inline uint64_t mm_rng_below(mm_rng* r, uint64_t n) { return mm_rng_next(r) % n; }

/* Approximately normal (sum of uniforms), mean 0, stddev 1. */
static inline double mm_rng_normal(mm_rng* r) {
  double s = 0;
  for (int i = 0; i < 12; ++i) s += mm_rng_uniform(r);
  return s - 6.0;
}

#endif
