/* The config/layout fuzz (tests/unit/test_fuzz.c) and the fused arm's
 * schedule tests (tests/unit/test_fused.c) on their own, built with
 * AddressSanitizer and UndefinedBehaviorSanitizer over the host sources they
 * exercise (`make fuzz-sanitized`; CI runs it): an out-of-bounds access, a
 * signed overflow or any other undefined behaviour in the checks, the layout
 * arithmetic or the stream decode ends the run with a report. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../unit/unit.h"

uint64_t unit_seed;

int main(void) {
  const char* s = getenv("MEGAMOE_TEST_SEED");
  unit_seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
  printf("sanitized fuzz: seed %llu (MEGAMOE_TEST_SEED=%llu replays it)\n", (unsigned long long)unit_seed,
         (unsigned long long)unit_seed);
  const mm_test* const suites[] = {unit_suite_fuzz, unit_suite_fused, NULL};
  mm_test_counts counts = {0, 0, 0};
  mm_run_suites(suites, NULL, &counts);
  mm_test_print_summary(&counts);
  return counts.failed ? 1 : 0;
}
