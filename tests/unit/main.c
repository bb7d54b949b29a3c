/* CPU unit test runner: every suite, optional name filter in argv[1].
 * MEGAMOE_TEST_SEED=<number> replays a run's random inputs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "unit.h"

uint64_t unit_seed;

int main(int argc, char** argv) {
  const char* seed_text = getenv("MEGAMOE_TEST_SEED");
  if (seed_text && *seed_text)
    unit_seed = strtoull(seed_text, NULL, 0);
  else
    unit_seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
  printf("unit tests: seed %llu (MEGAMOE_TEST_SEED=%llu replays it)\n", (unsigned long long)unit_seed,
         (unsigned long long)unit_seed);

  const mm_test* const suites[] = {unit_suite_e4m3,   unit_suite_bf16,      unit_suite_quant,
                                   unit_suite_diff,   unit_suite_ref_layer, unit_suite_ref_check,
                                   unit_suite_config, unit_suite_layout, unit_suite_procs, unit_suite_colocated,
                                   unit_suite_comm,   unit_suite_cli,    unit_suite_errors,
                                   unit_suite_fuzz,   unit_suite_soak,   unit_suite_fuzz_checks, unit_suite_fault_judge,
                                   unit_suite_fused,  unit_suite_fused_kernel, unit_suite_combine, unit_suite_clocks, NULL};
  mm_test_counts counts = {0, 0, 0};
  mm_run_suites(suites, argc > 1 ? argv[1] : NULL, &counts);
  mm_test_print_summary(&counts);
  return counts.failed != 0 ? 1 : 0;
}
