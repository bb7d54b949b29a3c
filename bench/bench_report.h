/* The benchmark's rows as files: `megamoe bench --csv FILE --json FILE`.
 *
 * One row per (arm, tokens per rank, experts per rank) cell. The CSV has a
 * header line and the columns below, in this order, then one vs_<arm> column
 * per arm of the run (order of first appearance): the row's µs over that
 * arm's µs in the same cell (below 1: this arm is faster; the row's own arm
 * gives 1). A value not known (the floors of the CPU reference) is an empty
 * field in the CSV and null in the JSON. Every column is a number but arm
 * and rates (the floors' rates: measured or design, bench_rates.h). The JSON is {"source": ..., "rows":
 * [{column: value, ...}, ...]} with the same names. python/megamoe/plot.py
 * reads both; python/megamoe/benchfile.py writes the same columns. */
#ifndef MEGAMOE_BENCH_REPORT_H
#define MEGAMOE_BENCH_REPORT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mm_bench_row {
  const char* arm; /* staged, split, fused, or reference (the CPU reference) */
  int ranks;
  int64_t tokens; /* per rank */
  int experts_per_rank;
  int64_t hidden, intermediate;
  int top_k;
  int group; /* the L1 output's quantization group */
  double us;                                           /* median */
  double tflops;                                       /* per GPU, the busiest rank's routed slots */
  double nvl_gbs;                                      /* NVLink bytes in / µs (NAN: not known) */
  double floor_compute_us, floor_hbm_us, floor_nvl_us; /* NAN: not known */
  double symm_mib, workspace_mib;                      /* per rank */
  double fp8_tflops, hbm_read_gbs;                     /* the floors' rates (bench_rates.h); NAN: no floors */
  const char* rates;                                   /* "measured" or "design"; NULL: no floors */
} mm_bench_row;

/* The row's floor: the largest of its known floors (NAN when none is known). */
double mm_bench_row_floor(const mm_bench_row* r);

/* Checks at parse time that path can be written: an existing regular file
 * opened for appending (left as it was), or a new file created and removed
 * again. Prints "<cmd>: <opt> '<path>': ..." on stderr and returns -1 when not. */
int mm_bench_check_writable(const char* cmd, const char* opt, const char* path);

/* Writes rows[0, n) to csv_path and json_path (either may be NULL: skipped),
 * replacing them. source names the producer ("megamoe bench"). Returns 0, or
 * -1 after a line on stderr naming the file. */
int mm_bench_report_write(const mm_bench_row* rows, int n, const char* source, const char* csv_path,
                          const char* json_path);

#ifdef __cplusplus
}
#endif

#endif
