/* The benchmark's rows as CSV and JSON (see bench_report.h). */
#include "bench_report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The fixed columns after "arm", in file order; vs_<arm> columns follow. */
enum {
  COL_RANKS,
  COL_TOKENS,
  COL_EXPERTS,
  COL_HIDDEN,
  COL_INTERMEDIATE,
  COL_TOP_K,
  COL_GROUP,
  COL_US,
  COL_TFLOPS,
  COL_FLOOR_COMPUTE,
  COL_FLOOR_HBM,
  COL_FLOOR_NVL,
  COL_FLOOR,
  COL_X_FLOOR,
  COL_NVL_GBS,
  COL_SYMM_MIB,
  COL_WS_MIB,
  COL_FP8_TFLOPS,
  COL_HBM_GBS,
  NUM_COLS
};

static const struct {
  const char* name;
  int is_int;
} kCols[NUM_COLS] = {
    {"ranks", 1},           {"tokens_per_rank", 1}, {"experts_per_rank", 1}, {"hidden", 1},
    {"intermediate", 1},    {"top_k", 1},           {"group", 1},            {"us", 0},               {"tflops", 0},
    {"floor_compute_us", 0}, {"floor_hbm_us", 0},   {"floor_nvlink_us", 0},  {"floor_us", 0},
    {"x_floor", 0},         {"nvl_gbs", 0},         {"symm_mib", 0},         {"workspace_mib", 0},
    {"fp8_tflops", 0},      {"hbm_read_gbs", 0}};
/* After the numeric columns: the floors' rates, a word (empty / null: none). */
#define RATES_COLUMN "rates"

#define MAX_RUN_ARMS 8

double mm_bench_row_floor(const mm_bench_row* r) {
  const double f[3] = {r->floor_compute_us, r->floor_hbm_us, r->floor_nvl_us};
  double m = NAN;
  for (int i = 0; i < 3; ++i)
    if (!isnan(f[i]) && (isnan(m) || f[i] > m)) m = f[i];
  return m;
}

static void row_values(const mm_bench_row* r, double v[NUM_COLS]) {
  const double floor = mm_bench_row_floor(r);
  v[COL_RANKS] = r->ranks, v[COL_TOKENS] = (double)r->tokens, v[COL_EXPERTS] = r->experts_per_rank;
  v[COL_HIDDEN] = (double)r->hidden, v[COL_INTERMEDIATE] = (double)r->intermediate, v[COL_TOP_K] = r->top_k;
  v[COL_GROUP] = r->group;
  v[COL_US] = r->us, v[COL_TFLOPS] = r->tflops;
  v[COL_FLOOR_COMPUTE] = r->floor_compute_us, v[COL_FLOOR_HBM] = r->floor_hbm_us, v[COL_FLOOR_NVL] = r->floor_nvl_us;
  v[COL_FLOOR] = floor, v[COL_X_FLOOR] = r->us / floor;
  v[COL_NVL_GBS] = r->nvl_gbs, v[COL_SYMM_MIB] = r->symm_mib, v[COL_WS_MIB] = r->workspace_mib;
  v[COL_FP8_TFLOPS] = r->fp8_tflops, v[COL_HBM_GBS] = r->hbm_read_gbs;
}

/* The arms of the run, in order of first appearance. */
static int run_arms(const mm_bench_row* rows, int n, const char* arms[MAX_RUN_ARMS]) {
  int count = 0;
  for (int i = 0; i < n; ++i) {
    int seen = 0;
    for (int a = 0; a < count; ++a) seen |= !strcmp(arms[a], rows[i].arm);
    if (!seen && count < MAX_RUN_ARMS) arms[count++] = rows[i].arm;
  }
  return count;
}

/* Row i's µs over arm's µs in the same cell (NAN when that cell has no such row). */
static double ratio_to(const mm_bench_row* rows, int n, int i, const char* arm) {
  for (int j = 0; j < n; ++j)
    if (!strcmp(rows[j].arm, arm) && rows[j].tokens == rows[i].tokens &&
        rows[j].experts_per_rank == rows[i].experts_per_rank)
      return rows[i].us / rows[j].us;
  return NAN;
}

/* A value; not finite (not known) as `missing`. */
static void put_value(FILE* f, double v, int is_int, const char* missing) {
  if (!isfinite(v)) fputs(missing, f);
  else if (is_int) fprintf(f, "%lld", (long long)v);
  else fprintf(f, "%.6g", v);
}

static void write_csv(FILE* f, const mm_bench_row* rows, int n, const char* const* arms, int num_arms) {
  fputs("arm", f);
  for (int c = 0; c < NUM_COLS; ++c) fprintf(f, ",%s", kCols[c].name);
  fputs("," RATES_COLUMN, f);
  for (int a = 0; a < num_arms; ++a) fprintf(f, ",vs_%s", arms[a]);
  fputc('\n', f);
  for (int i = 0; i < n; ++i) {
    double v[NUM_COLS];
    row_values(&rows[i], v);
    fputs(rows[i].arm, f);
    for (int c = 0; c < NUM_COLS; ++c) {
      fputc(',', f);
      put_value(f, v[c], kCols[c].is_int, "");
    }
    fprintf(f, ",%s", rows[i].rates ? rows[i].rates : "");
    for (int a = 0; a < num_arms; ++a) {
      fputc(',', f);
      put_value(f, ratio_to(rows, n, i, arms[a]), 0, "");
    }
    fputc('\n', f);
  }
}

static void write_json(FILE* f, const mm_bench_row* rows, int n, const char* source, const char* const* arms,
                       int num_arms) {
  fprintf(f, "{\"source\": \"%s\", \"rows\": [", source);
  for (int i = 0; i < n; ++i) {
    double v[NUM_COLS];
    row_values(&rows[i], v);
    fprintf(f, "%s\n  {\"arm\": \"%s\"", i ? "," : "", rows[i].arm);
    for (int c = 0; c < NUM_COLS; ++c) {
      fprintf(f, ", \"%s\": ", kCols[c].name);
      put_value(f, v[c], kCols[c].is_int, "null");
    }
    if (rows[i].rates) fprintf(f, ", \"" RATES_COLUMN "\": \"%s\"", rows[i].rates);
    else fputs(", \"" RATES_COLUMN "\": null", f);
    for (int a = 0; a < num_arms; ++a) {
      fprintf(f, ", \"vs_%s\": ", arms[a]);
      put_value(f, ratio_to(rows, n, i, arms[a]), 0, "null");
    }
    fputc('}', f);
  }
  fputs("\n]}\n", f);
}

int mm_bench_check_writable(const char* cmd, const char* opt, const char* path) {
  struct stat st;
  const int existed = stat(path, &st) == 0;
  if (existed && !S_ISREG(st.st_mode)) {
    fprintf(stderr, "%s: %s '%s': not a regular file\n", cmd, opt, path);
    return -1;
  }
  FILE* f = fopen(path, "a"); /* creates nothing that existed; changes nothing written */
  if (!f) {
    fprintf(stderr, "%s: %s '%s': cannot write it: %s\n", cmd, opt, path, strerror(errno));
    return -1;
  }
  fclose(f);
  if (!existed) unlink(path);
  return 0;
}

/* Writes one file (CSV, or JSON when json); -1 after a line naming it on failure. */
static int write_file(const char* path, const mm_bench_row* rows, int n, const char* source, int json) {
  FILE* f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "bench: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  const char* arms[MAX_RUN_ARMS];
  const int num_arms = run_arms(rows, n, arms);
  if (json) write_json(f, rows, n, source, arms, num_arms);
  else write_csv(f, rows, n, arms, num_arms);
  const int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    fprintf(stderr, "bench: writing %s failed\n", path);
    return -1;
  }
  return 0;
}

int mm_bench_report_write(const mm_bench_row* rows, int n, const char* source, const char* csv_path,
                          const char* json_path) {
  if (csv_path && write_file(csv_path, rows, n, source, 0) != 0) return -1;
  if (json_path && write_file(json_path, rows, n, source, 1) != 0) return -1;
  return 0;
}
