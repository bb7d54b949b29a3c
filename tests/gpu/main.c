/* GPU test runner: `make gpu-test`.
 *
 * The parent never touches CUDA. Each suite runs in child processes (one per
 * rank) made by the library's launcher; rank 0 reports each test's combined
 * result through a pipe, so a rank that crashes or hangs costs the tests it
 * did not report, not the whole run. Without a GPU every test is skipped and
 * the runner says so.
 *
 * Usage: gpu_tests [name-filter]: the tests whose name contains the filter,
 * or one of its '|'-separated parts ("smoke|sanitize small"). Suites with no
 * matching test start no process. gpu_tests --list prints every test name,
 * one per line, and runs nothing. MEGAMOE_TEST_SEED fixes the seed;
 * MEGAMOE_TEST_RANKS (e.g. "1,2") picks the rank counts of the layer tests
 * (default: 1, 2 and all visible GPUs). MEGAMOE_TEST_ARM (staged, split, fused) and
 * MEGAMOE_GEMM (simple, wgmma) set by the caller keep only the layer
 * variants of that arm and engine (unset: every variant).
 *
 * MEGAMOE_SANITIZE_CONTROL=1 (scripts/sanitize.sh) runs only the sanitizer
 * controls (test_sanitize.cu), on every rank of each rank count: each plants
 * one bug that one compute-sanitizer tool must report, proving the tool sees
 * the rank processes.
 *
 * MEGAMOE_TEST_COLOCATED=1: a rank count above the visible GPUs runs
 * co-located on GPU 0 (host/colocated.h: one process and CUDA context per
 * rank, no NCCL, the peers' buffers through CUDA IPC) instead of being
 * skipped; its suites are labelled "EP<n> ... colocated". The multi-rank
 * protocols run as at EP<n>, slowly (the contexts time-slice the GPU); no
 * timing, no NVLink. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu_suites.h"
#include "host/procs.h"
#include "megamoe.h"
#include "rank_ctx.h"

typedef struct suite_run {
  const char* label;            /* e.g. "EP2 simple" */
  const mm_test* single;        /* single-GPU suite, or NULL */
  const mm_rank_test* ranked;   /* multi-rank suite, or NULL */
  const char* filter;
  uint64_t seed;
  int report_fd;
} suite_run;

/* 1 when name contains filter or one of its '|'-separated parts (NULL or
 * empty: all). */
static int name_matches(const char* filter, const char* name) {
  if (!filter || !*filter) return 1;
  for (const char* part = filter;;) {
    const char* bar = strchr(part, '|');
    const size_t len = bar ? (size_t)(bar - part) : strlen(part);
    for (const char* at = name; len > 0 && *at; ++at)
      if (strncmp(at, part, len) == 0) return 1;
    if (!bar) return 0;
    part = bar + 1;
  }
}

static int matches(const suite_run* s, const char* name) { return name_matches(s->filter, name); }

static void report(const suite_run* s, mm_test_result r, const char* name) {
  char line[512];
  int n = snprintf(line, sizeof line, "%d %s %s\n", (int)r, s->label, name);
  if (n > 0 && write(s->report_fd, line, (size_t)n) < 0) perror("report");
  printf("[%s] %s %s\n", r == MM_TEST_PASS ? "PASS" : r == MM_TEST_SKIP ? "SKIP" : "FAIL", s->label, name);
  fflush(stdout);
}

static int single_main(int rank, int num_ranks, const ncclUniqueId* id, void* vctx) {
  const suite_run* s = (const suite_run*)vctx;
  for (const mm_test* t = s->single; t->name; ++t)
    if (matches(s, t->name)) report(s, t->fn(), t->name);
  return 0;
}

/* Combines one test's result over the ranks: any FAIL fails, all SKIP skips. */
static mm_test_result combine(const mm_rank_ctx* ctx, int* d_word, mm_test_result mine) {
  int code = mine == MM_TEST_FAIL ? 2 : mine == MM_TEST_SKIP ? 1 : 0;
  if (ctx->num_ranks == 1) return mine;
  if (!ctx->comm) { /* co-located: the group's host allgather */
    int codes[MEGAMOE_MAX_RANKS];
    if (mm_colocated_allgather(mm_colocated_current(NULL), ctx->rank, mm_colocated_tag("test result"), &code,
                               sizeof code, codes, 600.0) != MM_COLOCATED_OK)
      return MM_TEST_FAIL;
    for (int r = 0; r < ctx->num_ranks; ++r) code = codes[r] > code ? codes[r] : code;
    return code == 2 ? MM_TEST_FAIL : code == 1 ? MM_TEST_SKIP : MM_TEST_PASS;
  }
  if (cudaMemcpy(d_word, &code, sizeof code, cudaMemcpyHostToDevice) != cudaSuccess ||
      ncclAllReduce(d_word, d_word, 1, ncclInt32, ncclMax, ctx->comm, ctx->stream) != ncclSuccess ||
      cudaStreamSynchronize(ctx->stream) != cudaSuccess ||
      cudaMemcpy(&code, d_word, sizeof code, cudaMemcpyDeviceToHost) != cudaSuccess)
    return MM_TEST_FAIL;
  return code == 2 ? MM_TEST_FAIL : code == 1 ? MM_TEST_SKIP : MM_TEST_PASS;
}

static int ranked_main(int rank, int num_ranks, const ncclUniqueId* id, void* vctx) {
  const suite_run* s = (const suite_run*)vctx;
  mm_rank_ctx ctx = {rank, num_ranks, NULL, NULL, s->seed};
  /* Co-located ranks (no id) make no communicator: mm_test_create and
   * combine go through the group. */
  if (id && megamoe_comm_create(rank, num_ranks, id, &ctx.comm) != MEGAMOE_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, megamoe_last_error());
    return 3;
  }
  int* d_word = NULL;
  if (cudaStreamCreate(&ctx.stream) != cudaSuccess || cudaMalloc((void**)&d_word, sizeof(int)) != cudaSuccess) {
    fprintf(stderr, "rank %d: stream/alloc failed\n", rank);
    return 3;
  }
  for (const mm_rank_test* t = s->ranked; t->name; ++t) {
    if (!matches(s, t->name)) continue;
    mm_test_result r = num_ranks < t->min_ranks ? MM_TEST_SKIP : t->fn(&ctx);
    r = combine(&ctx, d_word, r);
    if (rank == 0) report(s, r, t->name);
  }
  cudaFree(d_word);
  cudaStreamDestroy(ctx.stream);
  if (ctx.comm) ncclCommDestroy(ctx.comm);
  return 0;
}

/* Runs one suite on num_ranks processes and counts what rank 0 reported;
 * tests it never reported (a crash, a hang) count as failed. */
/* How many of the suite's tests the filter keeps. */
static int suite_matches(const suite_run* s) {
  int n = 0;
  if (s->single)
    for (const mm_test* t = s->single; t->name; ++t) n += matches(s, t->name);
  else
    for (const mm_rank_test* t = s->ranked; t->name; ++t) n += matches(s, t->name);
  return n;
}

static void run_suite(suite_run* s, int num_ranks, int launch_flags, mm_test_counts* counts) {
  /* A single-GPU suite on several ranks (the controls): every rank reports. */
  const int expected = suite_matches(s) * (s->single ? num_ranks : 1);
  if (expected == 0) return; /* no process for a suite the filter leaves empty */
  int fds[2];
  if (pipe(fds) != 0) {
    perror("pipe");
    counts->failed++;
    return;
  }
  s->report_fd = fds[1];
  const mm_ranks_options opts = {1800.0, 0.0, launch_flags};
  int rc = mm_run_ranks_opt(num_ranks, &opts, s->single ? single_main : ranked_main, s, NULL);
  close(fds[1]);
  char buf[1 << 16];
  size_t len = 0;
  ssize_t n;
  while (len < sizeof buf - 1 && (n = read(fds[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)n;
  close(fds[0]);
  buf[len] = '\0';
  int reported = 0;
  for (char* line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
    int code = atoi(line);
    reported++;
    if (code == MM_TEST_PASS) counts->passed++;
    else if (code == MM_TEST_SKIP) counts->skipped++;
    else counts->failed++;
  }
  if (reported < expected) {
    printf("[FAIL] %s: %d test(s) not reported (launcher rc %d: a rank crashed or hung)\n", s->label,
           expected - reported, rc);
    counts->failed += expected - reported;
  } else if (rc != 0) {
    printf("[FAIL] %s: a rank exited with an error after its tests\n", s->label);
    counts->failed++;
  }
}

/* Runs s on num_ranks ranks, or counts its tests as skipped when that many
 * GPUs are not visible. A ranked suite with colocated set runs co-located
 * on GPU 0 instead (its label gains " colocated"). */
static void run_or_skip(suite_run* s, int num_ranks, int gpus, int colocated, mm_test_counts* counts) {
  if (num_ranks >= 1 && num_ranks <= gpus) {
    run_suite(s, num_ranks, 0, counts);
    return;
  }
  if (colocated && s->ranked && num_ranks >= 2 && num_ranks <= MEGAMOE_MAX_RANKS && gpus >= 1) {
    char label[96];
    snprintf(label, sizeof label, "%s colocated", s->label);
    suite_run c = *s;
    c.label = label;
    run_suite(&c, num_ranks, MM_RANKS_COLOCATED, counts);
    return;
  }
  const int skipped = suite_matches(s);
  if (skipped) printf("[SKIP] %s: needs %d GPUs, %d visible\n", s->label, num_ranks, gpus);
  counts->skipped += skipped;
}

static int count_all(const char* filter) {
  int n = 0;
  if (getenv("MEGAMOE_SANITIZE_CONTROL")) {
    for (const mm_test* t = mm_sanitize_controls; t->name; ++t) n += name_matches(filter, t->name);
    return n;
  }
  for (const mm_test* t = mm_gemm_gpu_tests; t->name; ++t) n += name_matches(filter, t->name);
  for (const mm_test* t = mm_comm_gpu_tests; t->name; ++t) n += name_matches(filter, t->name);
  for (const mm_test* t = mm_fused_gpu_tests; t->name; ++t) n += name_matches(filter, t->name);
  /* Layer tests in 4 variants, error and fuzz tests in 3, the ring tests in 1, at 2 rank counts (as main
   * runs them without a GPU count). */
  for (const mm_rank_test* t = mm_layer_tests; t->name; ++t) n += 4 * 2 * name_matches(filter, t->name);
  for (const mm_rank_test* t = mm_error_tests; t->name; ++t) n += 3 * 2 * name_matches(filter, t->name);
  for (const mm_rank_test* t = mm_fuzz_tests; t->name; ++t) n += 3 * 2 * name_matches(filter, t->name);
  for (const mm_rank_test* t = mm_ring_tests; t->name; ++t) n += 1 * 2 * name_matches(filter, t->name);
  return n;
}

/* The caller's MEGAMOE_TEST_ARM / MEGAMOE_GEMM, read before the runner sets
 * them per variant: empty when unset. */
typedef struct variant_choice {
  char arm[16], engine[16];
} variant_choice;

static variant_choice variant_choice_from_env(void) {
  variant_choice c;
  const char* arm = getenv("MEGAMOE_TEST_ARM");
  const char* engine = getenv("MEGAMOE_GEMM");
  snprintf(c.arm, sizeof c.arm, "%s", arm ? arm : "");
  /* The layer reads anything but "simple" as the wgmma engine (src/host/layer.c). */
  snprintf(c.engine, sizeof c.engine, "%s", !engine ? "" : strcmp(engine, "simple") == 0 ? "simple" : "wgmma");
  return c;
}

static int variant_chosen(const variant_choice* c, const char* engine, const char* arm) {
  return (!c->arm[0] || strcmp(c->arm, arm) == 0) && (!c->engine[0] || strcmp(c->engine, engine) == 0);
}

static void list_tests(void) {
  const mm_test* const singles[] = {mm_gemm_gpu_tests, mm_comm_gpu_tests, mm_fused_gpu_tests, mm_sanitize_controls};
  const mm_rank_test* const ranked[] = {mm_layer_tests, mm_error_tests, mm_fuzz_tests, mm_ring_tests};
  for (size_t i = 0; i < sizeof singles / sizeof singles[0]; ++i)
    for (const mm_test* t = singles[i]; t->name; ++t) printf("%s\n", t->name);
  for (size_t i = 0; i < sizeof ranked / sizeof ranked[0]; ++i)
    for (const mm_rank_test* t = ranked[i]; t->name; ++t) printf("%s\n", t->name);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--list") == 0) {
    list_tests();
    return 0;
  }
  const char* filter = argc > 1 ? argv[1] : NULL;
  const char* seed_env = getenv("MEGAMOE_TEST_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL);
  mm_test_counts counts = {0, 0, 0};
  int gpus = mm_count_gpus();
  if (gpus == 0) {
    printf("no GPU visible: skipping every GPU test\n");
    counts.skipped = count_all(filter);
    mm_test_print_summary(&counts);
    return 0;
  }
  printf("GPU tests on %d visible GPU(s), seed %llu (MEGAMOE_TEST_SEED=%llu reproduces)\n", gpus,
         (unsigned long long)seed, (unsigned long long)seed);

  int rank_counts[4] = {1, 2, gpus, 0}, nrc = 0;
  const char* ranks_env = getenv("MEGAMOE_TEST_RANKS");
  if (ranks_env) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s", ranks_env);
    for (char* tok = strtok(tmp, ","); tok && nrc < 3; tok = strtok(NULL, ",")) rank_counts[nrc++] = atoi(tok);
  } else {
    nrc = gpus > 2 ? 3 : 2;
  }

  if (getenv("MEGAMOE_SANITIZE_CONTROL")) {
    /* Every rank of each rank count runs the controls (no communicator: a
     * control may leave its CUDA context broken, and no peer must wait on it). */
    for (int i = 0; i < nrc; ++i) {
      const int r = rank_counts[i];
      char label[64];
      snprintf(label, sizeof label, "EP%d control", r);
      suite_run s = {label, mm_sanitize_controls, NULL, filter, seed, -1};
      run_or_skip(&s, r, gpus, 0, &counts);
    }
    mm_test_print_summary(&counts);
    return counts.failed ? 1 : 0;
  }

  suite_run gemm = {"gemm", mm_gemm_gpu_tests, NULL, filter, seed, -1};
  run_suite(&gemm, 1, 0, &counts);
  suite_run comm = {"comm", mm_comm_gpu_tests, NULL, filter, seed, -1};
  run_suite(&comm, 1, 0, &counts);
  suite_run fused = {"fused", mm_fused_gpu_tests, NULL, filter, seed, -1};
  run_suite(&fused, 1, 0, &counts);
  const char* colocated_env = getenv("MEGAMOE_TEST_COLOCATED");
  const int colocated = colocated_env && strcmp(colocated_env, "1") == 0;
  if (colocated) printf("MEGAMOE_TEST_COLOCATED=1: rank counts above %d run co-located on GPU 0\n", gpus);

  /* Every layer variant: the staged arm on both GEMM engines (the simple one
   * is the oracle), the split and fused arms (on the wgmma engine they are
   * built on). The error protocol and the argument fuzz on each arm, the
   * ring tests on the fused arm, once per rank count. */
  struct variant {
    const char* engine;
    const char* arm;
    const char* label;
    int errors; /* also run the error-protocol and fuzz suites */
    int ring;   /* also run the ring suite */
  } variants[] = {{"simple", "staged", "simple", 0, 0},
                  {"wgmma", "staged", "wgmma", 1, 0},
                  {"wgmma", "split", "split", 1, 0},
                  {"wgmma", "fused", "fused", 1, 1}};
  const variant_choice choice = variant_choice_from_env();
  const mm_rank_test* const passes[4] = {mm_layer_tests, mm_error_tests, mm_fuzz_tests, mm_ring_tests};
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; ++v) {
    if (!variant_chosen(&choice, variants[v].engine, variants[v].arm)) continue;
    setenv("MEGAMOE_GEMM", variants[v].engine, 1);
    setenv("MEGAMOE_TEST_ARM", variants[v].arm, 1);
    for (int pass = 0; pass < 4; ++pass) {
      if ((pass == 1 || pass == 2) && !variants[v].errors) continue;
      if (pass == 3 && !variants[v].ring) continue;
      const mm_rank_test* suite = passes[pass];
      for (int i = 0; i < nrc; ++i) {
        const int r = rank_counts[i];
        char label[64];
        snprintf(label, sizeof label, "EP%d %s", r, variants[v].label);
        suite_run s = {label, NULL, suite, filter, seed + (uint64_t)r + (uint64_t)pass * 7919u * (uint64_t)r, -1};
        run_or_skip(&s, r, gpus, colocated, &counts);
      }
    }
  }
  mm_test_print_summary(&counts);
  return counts.failed ? 1 : 0;
}
