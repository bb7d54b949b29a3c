/* The command-line tool, run as a user runs it: build/megamoe with arguments
 * (fork + exec), its exit status, stdout and stderr. The GPUs are hidden from
 * it (CUDA_VISIBLE_DEVICES=""), so these tests take the same paths on a CPU
 * machine and on a GPU machine and never need a GPU.
 *
 * The tool is found next to this test binary (both are in the build folder),
 * or at $MEGAMOE_TOOL. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "megamoe.h"
#include "unit.h"

/* The tool's documented exit codes (its usage, the README). */
enum { MM_EXIT_OK = 0, MM_EXIT_USAGE = 2, MM_EXIT_NO_GPU = 4 };

typedef struct tool_run {
  int status;       /* exit code; -1 when it did not exit normally */
  char out[16384];  /* stdout, truncated */
  char err[16384];  /* stderr, truncated */
} tool_run;

static int tool_path(char* path, size_t n) {
  const char* env = getenv("MEGAMOE_TOOL");
  if (env && *env) {
    snprintf(path, n, "%s", env);
    return access(path, X_OK);
  }
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return -1;
  self[len] = '\0';
  char* slash = strrchr(self, '/');
  if (!slash) return -1;
  *slash = '\0';
  if ((size_t)snprintf(path, n, "%.*s/megamoe", (int)(n - 16), self) >= n) return -1;
  return access(path, X_OK);
}

static void read_back(int fd, char* buf, size_t n) {
  buf[0] = '\0';
  if (lseek(fd, 0, SEEK_SET) != 0) return;
  size_t got = 0;
  while (got + 1 < n) {
    const ssize_t r = read(fd, buf + got, n - 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  buf[got] = '\0';
}

/* Runs the tool with args (NULL-terminated, without the program name), GPUs
 * hidden, at most timeout_s seconds. 0 when it ran (any exit status). */
static int run_tool(const char* const* args, double timeout_s, tool_run* res) {
  static char path[PATH_MAX];
  memset(res, 0, sizeof *res);
  res->status = -1;
  if (tool_path(path, sizeof path) != 0) {
    fprintf(stderr, "    the tool is not built next to the tests (%s): make all\n", path);
    return -1;
  }
  char out_name[] = "/tmp/megamoe_cli_out_XXXXXX", err_name[] = "/tmp/megamoe_cli_err_XXXXXX";
  const int out = mkstemp(out_name), err = mkstemp(err_name);
  if (out < 0 || err < 0) return -1;
  unlink(out_name);
  unlink(err_name);
  const char* argv[64];
  int argc = 0;
  argv[argc++] = path;
  for (int i = 0; args[i] && argc < 63; ++i) argv[argc++] = args[i];
  argv[argc] = NULL;
  fflush(NULL);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    execv(path, (char* const*)argv);
    _exit(127);
  }
  int status = 0;
  const struct timespec tick = {0, 5 * 1000 * 1000};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return -1;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fprintf(stderr, "    the tool ran past %.0f s\n", timeout_s);
      close(out);
      close(err);
      return -1;
    }
    nanosleep(&tick, NULL);
  }
  res->status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  read_back(out, res->out, sizeof res->out);
  read_back(err, res->err, sizeof res->err);
  close(out);
  close(err);
  return 0;
}

#define RUN(res, ...)                                                           \
  do {                                                                          \
    const char* const args_[] = {__VA_ARGS__, NULL};                            \
    CHECK_MSG(run_tool(args_, 120.0, (res)) == 0, "could not run the tool");    \
  } while (0)


/* A usage error: exit 2, a message on stderr naming `names`, nothing run. */
#define CHECK_USAGE_ERROR(res, names)                                                               \
  do {                                                                                              \
    CHECK_MSG((res)->status == MM_EXIT_USAGE, "exit %d (want 2); stderr: %s", (res)->status, (res)->err); \
    CHECK_HAS((res)->err, names);                                                                   \
    CHECK_LACKS((res)->out, "CPU reference: T");                                                     \
  } while (0)

static tool_run g_res; /* large: kept off the stack */

static mm_test_result test_help(void) {
  tool_run* r = &g_res;
  RUN(r, "--help");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "usage: megamoe");
  CHECK_HAS(r->out, "bench-gemm");
  RUN(r, "info", "-h");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "--intermediate");
  RUN(r, "frobnicate");
  CHECK_USAGE_ERROR(r, "frobnicate");
  const char* const none[] = {NULL};
  CHECK(run_tool(none, 60.0, r) == 0);
  CHECK_EQ_INT(r->status, MM_EXIT_USAGE);
  CHECK_HAS(r->err, "usage: megamoe");
  return MM_TEST_PASS;
}

/* Without a GPU, bench still reads its options first: --help prints the
 * usage and runs nothing; an unknown option is an error. */
static mm_test_result test_bench_help_and_unknown_option_without_gpu(void) {
  tool_run* r = &g_res;
  RUN(r, "bench", "--help");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "--rounds");
  CHECK_LACKS(r->out, "CPU reference: T");
  RUN(r, "bench", "--tokens", "16", "--help");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_LACKS(r->out, "CPU reference: T");
  RUN(r, "bench", "--frobnicate");
  CHECK_USAGE_ERROR(r, "'--frobnicate'");
  RUN(r, "bench", "--model", "flash-rankk");
  CHECK_USAGE_ERROR(r, "--model 'flash-rankk'");
  RUN(r, "bench", "--arms", "staged,bogus");
  CHECK_USAGE_ERROR(r, "'bogus'");
  RUN(r, "bench", "--arms", "staged,staged");
  CHECK_USAGE_ERROR(r, "given twice");
  RUN(r, "bench", "--ranks");
  CHECK_USAGE_ERROR(r, "--ranks needs a value");
  RUN(r, "bench", "--ranks", "9");
  CHECK_USAGE_ERROR(r, "--ranks 9");
  return MM_TEST_PASS;
}

/* --rounds, --iters and --max-tokens size the benchmark's buffers: values
 * that would write or read outside them are rejected, naming the option. */
static mm_test_result test_bench_rejects_out_of_range_counts(void) {
  tool_run* r = &g_res;
  RUN(r, "bench", "--rounds", "101"); /* the usage says 1..100 */
  CHECK_USAGE_ERROR(r, "--rounds 101");
  RUN(r, "bench", "--rounds", "0");
  CHECK_USAGE_ERROR(r, "--rounds 0");
  RUN(r, "bench", "--iters", "0");
  CHECK_USAGE_ERROR(r, "--iters 0");
  RUN(r, "bench", "--iters", "-5");
  CHECK_USAGE_ERROR(r, "--iters -5");
  RUN(r, "bench", "--tokens", "64,512", "--max-tokens", "100");
  CHECK_USAGE_ERROR(r, "--max-tokens 100 is below the --tokens point 512");
  RUN(r, "bench", "--max-tokens", "100", "--tokens", "64,512"); /* either order */
  CHECK_USAGE_ERROR(r, "--max-tokens 100");
  RUN(r, "bench", "--max-tokens", "100"); /* below the default points */
  CHECK_USAGE_ERROR(r, "--max-tokens 100 is below the --tokens point 512");
  return MM_TEST_PASS;
}

/* Integer values are checked whole: no trailing text, no overflow, no empty
 * list items, no more points than the benchmark holds. */
static mm_test_result test_integer_values_are_checked(void) {
  tool_run* r = &g_res;
  RUN(r, "bench", "--iters", "20x");
  CHECK_USAGE_ERROR(r, "--iters");
  RUN(r, "bench", "--rounds", "99999999999999999999999");
  CHECK_USAGE_ERROR(r, "--rounds");
  RUN(r, "bench", "--tokens", "64,,512");
  CHECK_USAGE_ERROR(r, "--tokens '64,,512'");
  RUN(r, "bench", "--tokens", "64,abc");
  CHECK_USAGE_ERROR(r, "'abc' is not a whole number");
  RUN(r, "bench", "--tokens", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17");
  CHECK_USAGE_ERROR(r, "at most 16 values");
  RUN(r, "ref", "--tokens", "12abc");
  CHECK_USAGE_ERROR(r, "--tokens");
  RUN(r, "ref", "--hidden", "");
  CHECK_USAGE_ERROR(r, "--hidden");
  RUN(r, "info", "--experts", "-3");
  CHECK_USAGE_ERROR(r, "--experts -3");
  RUN(r, "bench-gemm", "--nk", "4096");
  CHECK_USAGE_ERROR(r, "--nk 4096");
  RUN(r, "bench-gemm", "--iters", "5");
  CHECK_USAGE_ERROR(r, "--iters 5");
  return MM_TEST_PASS;
}

/* Without a GPU, bench runs the CPU reference with the options that make
 * sense there (--tokens, --ranks) and names the ones it ignores. */
static mm_test_result test_bench_without_gpu_honours_options(void) {
  tool_run* r = &g_res;
  RUN(r, "bench", "--tokens", "16,32", "--ranks", "2", "--rounds", "17", "--arms", "staged", "--iters", "7");
  CHECK_MSG(r->status == MM_EXIT_OK, "exit %d; stderr: %s", r->status, r->err);
  CHECK_HAS(r->out, "CPU reference: T 16 per rank");
  CHECK_HAS(r->out, "CPU reference: T 32 per rank");
  CHECK_HAS(r->out, "2 ranks");
  CHECK_HAS(r->out, "ignored without a GPU: --arms, --iters, --rounds");
  CHECK_LACKS(r->out, "--model");
  RUN(r, "bench");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "CPU reference: T 256 per rank");
  CHECK_LACKS(r->out, "ignored");
  /* The GPU-only timing options parse, are named as ignored, and a bad
   * --pdl value is a usage error naming it. */
  RUN(r, "bench", "--tokens", "16", "--pdl", "both", "--back-to-back", "--timeline", "20", "--clocks", "--rates",
      "design", "--x-in-staging");
  CHECK_MSG(r->status == MM_EXIT_OK, "exit %d; stderr: %s", r->status, r->err);
  CHECK_HAS(r->out, "ignored without a GPU: --pdl, --back-to-back, --timeline, --clocks, --rates, --x-in-staging");
  RUN(r, "bench", "--rates", "h200");
  CHECK_USAGE_ERROR(r, "--rates h200");
  RUN(r, "bench", "--timeline", "0");
  CHECK_USAGE_ERROR(r, "--timeline");
  RUN(r, "bench", "--timeline", "1001");
  CHECK_USAGE_ERROR(r, "--timeline");
  RUN(r, "bench", "--pdl", "yes");
  CHECK_USAGE_ERROR(r, "--pdl yes");
  RUN(r, "bench", "--pdl");
  CHECK_USAGE_ERROR(r, "--pdl needs a value");
  /* --group: the reference runs it (the GPU bench's layers take it too);
   * anything but 64 or 128 is a usage error naming it. */
  RUN(r, "bench", "--tokens", "16", "--group", "64");
  CHECK_MSG(r->status == MM_EXIT_OK, "exit %d; stderr: %s", r->status, r->err);
  CHECK_HAS(r->out, "top-4, G 64,");                      /* the header */
  CHECK_HAS(r->out, "CPU reference: T 16 per rank, H 512, I 512, E 16, top-4, G 64, 4 ranks"); /* the run's config */
  CHECK_LACKS(r->out, "ignored");
  RUN(r, "bench", "--tokens", "16");
  CHECK_HAS(r->out, "CPU reference: T 16 per rank, H 512, I 512, E 16, top-4, G 128, 4 ranks");
  RUN(r, "bench", "--group", "96");
  CHECK_USAGE_ERROR(r, "--group 96");
  RUN(r, "bench", "--group");
  CHECK_USAGE_ERROR(r, "--group needs a value");
  return MM_TEST_PASS;
}

/* ref: an option given without a value is an error naming it (it used to be
 * dropped), as is one followed by another option. */
static mm_test_result test_ref_option_without_value(void) {
  tool_run* r = &g_res;
  RUN(r, "ref", "--tokens");
  CHECK_USAGE_ERROR(r, "option --tokens needs a value");
  RUN(r, "ref", "--tokens", "16", "--hidden");
  CHECK_USAGE_ERROR(r, "option --hidden needs a value");
  RUN(r, "ref", "--tokens", "--hidden", "512");
  CHECK_USAGE_ERROR(r, "option --tokens needs a value");
  RUN(r, "ref", "--tokens", "8", "--ranks", "2", "--experts", "4", "--topk", "2", "--hidden", "256",
      "--intermediate", "256");
  CHECK_MSG(r->status == MM_EXIT_OK, "exit %d; stderr: %s", r->status, r->err);
  CHECK_HAS(r->out, "CPU reference: T 8 per rank, H 256, I 256, E 4, top-2, G 128, 2 ranks");
  return MM_TEST_PASS;
}

/* info: flags compose in any order; an explicit flag wins over the model. */
static mm_test_result test_info_flags_compose(void) {
  static tool_run first;
  tool_run* r = &g_res;
  RUN(&first, "info", "--hidden", "1024", "--ranks", "4", "--model", "pro");
  CHECK_MSG(first.status == MM_EXIT_OK, "exit %d; stderr: %s", first.status, first.err);
  CHECK_HAS(first.out, "config: H 1024, I 3072, E 384 (96 per rank)");
  CHECK_HAS(first.out, "4 ranks");
  RUN(r, "info", "--model", "pro", "--ranks", "4", "--hidden", "1024");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_MSG(!strcmp(first.out, r->out), "the order of the flags changed the output:\n%s\n---\n%s", first.out, r->out);
  RUN(r, "info", "--max-tokens", "64", "--group", "64", "--arm", "staged", "--model", "flash");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "T_max 64 per rank, G 64");
  RUN(r, "info", "--group", "96");
  CHECK_EQ_INT(r->status, MM_EXIT_USAGE);
  CHECK_HAS(r->err, "MEGAMOE_ERR_BAD_QUANT_GROUP");
  /* The fused arm: its kernel per regime, tiles and shared memory. */
  RUN(r, "info", "--arm", "fused", "--model", "flash", "--ranks", "8");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "fused kernel, decode regime: L1 64x256 + L2 64x256, 4 pipeline stages, 256 tasks decoded ahead");
  CHECK_HAS(r->out, "fused kernel, large regime: L1 128x256 + L2 128x256, 3 pipeline stages, 256 tasks decoded ahead");
  return MM_TEST_PASS;
}

/* bench-gemm reads its options first too, then needs a GPU (exit 4). */
static mm_test_result test_bench_gemm_without_gpu(void) {
  tool_run* r = &g_res;
  RUN(r, "bench-gemm", "--help");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "--nk");
  RUN(r, "bench-gemm", "--bogus");
  CHECK_USAGE_ERROR(r, "'--bogus'");
  RUN(r, "bench-gemm", "--quick");
  CHECK_EQ_INT(r->status, MM_EXIT_NO_GPU);
  CHECK_HAS(r->err, "no GPU visible");
  /* The diagnostics parse: the stream mode and the decode tile without promotion. */
  RUN(r, "bench-gemm", "--stream", "--tile", "64x256-noscale");
  CHECK_EQ_INT(r->status, MM_EXIT_NO_GPU);
  RUN(r, "bench-gemm", "--mainloop");
  CHECK_EQ_INT(r->status, MM_EXIT_NO_GPU);
  RUN(r, "bench-gemm", "--tile", "64x256-nope");
  CHECK_USAGE_ERROR(r, "not a tile of the engine");
  return MM_TEST_PASS;
}

/* ---- bench --csv / --json ----------------------------------------------------- */

/* A CSV as the bench writes it (no quoting: no field holds a comma). */
#define CSV_MAX_LINES 32
#define CSV_MAX_FIELDS 32
typedef struct csv_table {
  char text[16384];
  char* cell[CSV_MAX_LINES][CSV_MAX_FIELDS];
  int lines, fields[CSV_MAX_LINES];
} csv_table;

static int read_file(const char* path, char* buf, size_t n) {
  const int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  read_back(fd, buf, n);
  close(fd);
  return 0;
}

static int csv_read(const char* path, csv_table* t) {
  memset(t, 0, sizeof *t);
  if (read_file(path, t->text, sizeof t->text) != 0) return -1;
  char* save_line = NULL;
  for (char* line = strtok_r(t->text, "\n", &save_line); line && t->lines < CSV_MAX_LINES;
       line = strtok_r(NULL, "\n", &save_line)) {
    int n = 0;
    for (char* p = line; p;) { /* strsep keeps empty fields */
      char* field = strsep(&p, ",");
      if (n < CSV_MAX_FIELDS) t->cell[t->lines][n++] = field;
    }
    t->fields[t->lines++] = n;
  }
  return 0;
}

static int csv_col(const csv_table* t, const char* name) {
  for (int c = 0; t->lines > 0 && c < t->fields[0]; ++c)
    if (!strcmp(t->cell[0][c], name)) return c;
  return -1;
}

/* Row `line`'s value of column name; NAN when empty or not a number. */
static double csv_num(const csv_table* t, int line, const char* name) {
  const int c = csv_col(t, name);
  if (c < 0 || c >= t->fields[line] || !t->cell[line][c][0]) return NAN;
  char* end = NULL;
  const double v = strtod(t->cell[line][c], &end);
  return *end ? NAN : v;
}

/* The value after "key": in text (the first at or after from); NAN when
 * absent or null. *next: just past it. */
static double json_num(const char* from, const char* key, const char** next) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char* p = strstr(from, pat);
  if (!p) return NAN;
  p += strlen(pat);
  char* end = NULL;
  const double v = strtod(p, &end);
  if (next) *next = end;
  return end == p ? NAN : v;
}

/* Runs body(dir) in a fresh temporary folder, removed afterwards with what
 * is in it. */
static mm_test_result in_temp_dir(mm_test_result (*body)(const char* dir)) {
  char dir[] = "/tmp/megamoe_cli_rows_XXXXXX";
  if (!mkdtemp(dir)) return MM_TEST_FAIL;
  const mm_test_result r = body(dir);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "    could not remove %s\n", dir);
  return r;
}

static const char* const kRowColumns[] = {
    "arm",          "ranks", "tokens_per_rank", "experts_per_rank", "hidden",          "intermediate",
    "top_k",        "group", "us",    "tflops",          "floor_compute_us", "floor_hbm_us",    "floor_nvlink_us",
    "floor_us",     "x_floor", "nvl_gbs",       "symm_mib",         "workspace_mib",   "fp8_tflops",
    "hbm_read_gbs", "rates",   "vs_reference"};

/* Without a GPU, --csv and --json get the CPU reference's rows: one per
 * --tokens point, in order, with the columns of a GPU run, the timings the
 * run printed, TFLOP/s that match them, and no floors (they are the GPU's). */
static mm_test_result bench_rows_body(const char* dir) {
  tool_run* r = &g_res;
  char csv[PATH_MAX], json[PATH_MAX];
  snprintf(csv, sizeof csv, "%s/b.csv", dir);
  snprintf(json, sizeof json, "%s/b.json", dir);
  RUN(r, "bench", "--tokens", "16,8,24", "--ranks", "2", "--csv", csv, "--json", json);
  CHECK_MSG(r->status == MM_EXIT_OK, "exit %d; stderr: %s", r->status, r->err);
  static csv_table t;
  CHECK_MSG(csv_read(csv, &t) == 0, "no %s", csv);
  CHECK_EQ_INT(t.lines, 1 + 3);
  for (size_t c = 0; c < sizeof kRowColumns / sizeof kRowColumns[0]; ++c)
    CHECK_MSG(csv_col(&t, kRowColumns[c]) >= 0, "no column %s in %s", kRowColumns[c], csv);
  static char js[16384];
  CHECK_MSG(read_file(json, js, sizeof js) == 0, "no %s", json);
  CHECK_HAS(js, "{\"source\": \"megamoe bench (CPU reference)\", \"rows\": [");
  const char* row_json = js;
  const int64_t points[3] = {16, 8, 24};
  const char* printed = r->out;
  for (int i = 1; i < t.lines; ++i) {
    const int64_t T = points[i - 1];
    CHECK_EQ_INT(t.fields[i], t.fields[0]);
    CHECK_MSG(!strcmp(t.cell[i][csv_col(&t, "arm")], "reference"), "arm '%s'", t.cell[i][csv_col(&t, "arm")]);
    CHECK_EQ_INT(csv_num(&t, i, "ranks"), 2);
    CHECK_EQ_INT(csv_num(&t, i, "tokens_per_rank"), T);
    CHECK_EQ_INT(csv_num(&t, i, "experts_per_rank"), 4);
    CHECK_EQ_INT(csv_num(&t, i, "hidden"), 512);
    CHECK_EQ_INT(csv_num(&t, i, "intermediate"), 512);
    CHECK_EQ_INT(csv_num(&t, i, "top_k"), 4);
    CHECK_EQ_INT(csv_num(&t, i, "group"), 128);
    const double us = csv_num(&t, i, "us"), tflops = csv_num(&t, i, "tflops");
    CHECK_MSG(isfinite(us) && us > 0 && isfinite(tflops) && tflops > 0, "us %g, tflops %g", us, tflops);
    const double flops = 2.0 * 2 * (double)T * 4 * 3.0 * 512 * 512; /* 2 * R * T * K * 3 * H * I */
    CHECK_MSG(fabs(tflops / (flops / (us * 1e-6) * 1e-12) - 1) < 1e-4, "tflops %g for %g flops in %g us", tflops,
              flops, us);
    /* The stdout line of this point says the same time (in s, 3 decimals). */
    char want[64];
    snprintf(want, sizeof want, "CPU reference: T %lld per rank", (long long)T);
    printed = strstr(printed, want);
    CHECK_MSG(printed != NULL, "stdout lacks \"%s\" (in order):\n%s", want, r->out);
    const char* secs = strstr(printed, " ranks: ");
    double s = NAN;
    CHECK(secs && sscanf(secs + strlen(" ranks: "), "%lf s", &s) == 1);
    CHECK_MSG(fabs(s - us * 1e-6) <= 0.0006, "stdout %.3f s, CSV %g us", s, us);
    CHECK(isfinite(csv_num(&t, i, "symm_mib")) && csv_num(&t, i, "symm_mib") > 0);
    CHECK(isfinite(csv_num(&t, i, "workspace_mib")) && csv_num(&t, i, "workspace_mib") > 0);
    CHECK_MSG(!t.cell[i][csv_col(&t, "floor_us")][0] && !t.cell[i][csv_col(&t, "x_floor")][0],
              "the CPU reference has floors: '%s'", t.cell[i][csv_col(&t, "floor_us")]);
    CHECK_MSG(!t.cell[i][csv_col(&t, "fp8_tflops")][0] && !t.cell[i][csv_col(&t, "rates")][0],
              "the CPU reference has floor rates: '%s' '%s'", t.cell[i][csv_col(&t, "fp8_tflops")],
              t.cell[i][csv_col(&t, "rates")]);
    CHECK(csv_num(&t, i, "vs_reference") == 1.0);
    /* The JSON row: the same numbers (the same text, so the same doubles). */
    row_json = strstr(row_json, "{\"arm\": \"reference\"");
    CHECK_MSG(row_json != NULL, "JSON row %d missing:\n%s", i, js);
    CHECK_EQ_INT(json_num(row_json, "tokens_per_rank", NULL), T);
    CHECK(json_num(row_json, "us", NULL) == us);
    CHECK(json_num(row_json, "tflops", NULL) == tflops);
    CHECK(json_num(row_json, "workspace_mib", NULL) == csv_num(&t, i, "workspace_mib"));
    const char* floor_key = strstr(row_json, "\"floor_us\": ");
    CHECK(floor_key && !strncmp(floor_key + strlen("\"floor_us\": "), "null", 4));
    row_json += 1;
  }
  CHECK_LACKS(row_json, "{\"arm\": "); /* no fourth row */
  CHECK_HAS(js, "]}\n");
  return MM_TEST_PASS;
}

static mm_test_result test_bench_rows_without_gpu(void) { return in_temp_dir(bench_rows_body); }

/* --csv / --json are checked when parsed: a path that cannot be written is
 * a usage error naming the option, nothing run; a file the check made for a
 * run refused later is not left behind. */
static mm_test_result bench_rows_rejected_body(const char* dir) {
  tool_run* r = &g_res;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/missing/b.csv", dir);
  RUN(r, "bench", "--csv", path);
  CHECK_USAGE_ERROR(r, "--csv '");
  CHECK_HAS(r->err, "No such file or directory");
  RUN(r, "bench", "--json", dir);
  CHECK_USAGE_ERROR(r, "--json '");
  CHECK_HAS(r->err, "not a regular file");
  RUN(r, "bench", "--json");
  CHECK_USAGE_ERROR(r, "--json needs a value");
  snprintf(path, sizeof path, "%s/b.csv", dir);
  RUN(r, "bench", "--csv", path, "--json", path);
  CHECK_USAGE_ERROR(r, "--csv and --json name the same file");
  RUN(r, "bench", "--csv", path, "--iters", "0");
  CHECK_USAGE_ERROR(r, "--iters 0");
  CHECK_MSG(access(path, F_OK) != 0, "%s left behind by a refused run", path);
  return MM_TEST_PASS;
}

static mm_test_result test_bench_rows_rejected_at_parse(void) { return in_temp_dir(bench_rows_rejected_body); }

/* soak: --help and bad options answer without a GPU; a good command line
 * then needs a GPU (exit 4), and says so. */
static mm_test_result test_soak_without_gpu(void) {
  tool_run* r = &g_res;
  RUN(r, "soak", "--help");
  CHECK_EQ_INT(r->status, MM_EXIT_OK);
  CHECK_HAS(r->out, "--ref-every");
  CHECK_HAS(r->out, "--cycles");
  RUN(r, "--help");
  CHECK_HAS(r->out, "  soak ");
  RUN(r, "soak", "--calls", "0");
  CHECK_USAGE_ERROR(r, "--calls 0");
  RUN(r, "soak", "--arms", "split");
  CHECK_USAGE_ERROR(r, "the staged arm must be one of them");
  RUN(r, "soak", "--hidden", "200");
  CHECK_USAGE_ERROR(r, "hidden");
  RUN(r, "soak", "--calls", "5");
  CHECK_EQ_INT(r->status, MM_EXIT_NO_GPU);
  CHECK_HAS(r->err, "no GPU visible");
  return MM_TEST_PASS;
}

const mm_test unit_suite_cli[] = {
    {"cli_help_and_unknown_command", test_help},
    {"cli_bench_help_and_unknown_option_without_gpu", test_bench_help_and_unknown_option_without_gpu},
    {"cli_bench_rejects_out_of_range_counts", test_bench_rejects_out_of_range_counts},
    {"cli_integer_values_are_checked", test_integer_values_are_checked},
    {"cli_bench_without_gpu_honours_options", test_bench_without_gpu_honours_options},
    {"cli_ref_option_without_value", test_ref_option_without_value},
    {"cli_info_flags_compose", test_info_flags_compose},
    {"cli_bench_gemm_without_gpu", test_bench_gemm_without_gpu},
    {"cli_bench_rows_without_gpu", test_bench_rows_without_gpu},
    {"cli_bench_rows_rejected_at_parse", test_bench_rows_rejected_at_parse},
    {"cli_soak_without_gpu", test_soak_without_gpu},
    {NULL, NULL}};
