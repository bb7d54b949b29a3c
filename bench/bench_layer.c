/* `megamoe bench`: the layer on the visible GPUs, arms side by side.
 *
 * Method (docs/DESIGN.md section 7): one process per rank; random weights and
 * inputs drawn on the device; warm-up; before every timed call an L2 flush
 * (a 256 MiB write) and an all-rank barrier; CUDA events around the forward;
 * median over --iters calls per round; --rounds rounds with the arms
 * bracketed (A B, B A, A B ...); each cell is the median of the round
 * medians, the slowest rank's. Floors next to each row: compute at the
 * measured fp8 rate, HBM bytes of the touched weights, NVLink bytes.
 *
 * Rank 0 prints the table on stdout, a progress line per measured cell and
 * round on stderr, and, with --csv / --json, rewrites those files with every
 * row so far after each tokens point (bench_report.h), so an interrupted run
 * keeps the cells it measured.
 *
 * With --timeline N (or MEGAMOE_TIMELINE=1 in the environment: N = 1), each
 * split- or fused-arm cell is followed by N more forwards whose in-kernel
 * timeline (src/host/timeline.h: routing phases, pull end, first and last
 * L1 tile, L2 end, barriers, reduction; the fused arm's waits on its
 * counters; the SM clock each CTA ran at from kernel 1's start to its last
 * math stamp there, %clock64 over %globaltimer, which NVML's samples do not
 * show; min / median / max over the CTAs, each the median over the N
 * forwards) every rank prints. One forward varies by tens of µs at
 * thousands of tokens (docs/PERF.md, twentieth session): take N >= 10 to
 * place a 1 % effect. The stamps cost a few stores per CTA; timed cells are
 * measured with them on, so compare arms without it. With it, rank 0 also
 * reads the SM clock of every timed split or fused forward (after its
 * events, outside the time; not with --back-to-back) and prints the median
 * after the row: a difference between builds is the code's only at equal
 * clocks (docs/PERF.md, twenty-first session). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench.h"
#include "bench_clocks.h"
#include "bench_rates.h"
#include "bench_report.h"
#include "cli.h"
#include "host/procs.h"
#include "megamoe.h"
#include "host/timeline.h"

#define MAX_ARMS MEGAMOE_ARM_COUNT
/* A timed slot: one layer (arm) with programmatic launch off or on (--pdl). */
#define MAX_SLOTS (2 * MAX_ARMS)

typedef mm_bench_layer_opts bench_opts;

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CK(call)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_)); \
      return 3;                                                                   \
    }                                                                             \
  } while (0)

#define MK(call)                                                                       \
  do {                                                                                 \
    megamoe_status s_ = (call);                                                        \
    if (s_ != MEGAMOE_OK) {                                                            \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, megamoe_last_error());          \
      return 3;                                                                        \
    }                                                                                  \
  } while (0)

typedef struct routing_stats {
  double routed;        /* slots routed from every rank to this rank's experts */
  double remote_in;     /* of those, from other ranks (pulled over NVLink) */
  double experts_hit;   /* local experts with at least one row */
  double my_remote;     /* this rank's slots going to other ranks (combine comes back) */
} routing_stats;

/* Routing of rank r: distinct uniform experts per token, drawn from a seed
 * every rank knows, so each rank can count what lands on it. */
static void draw_routing(int r, int64_t T, int K, int E, uint64_t seed, int32_t* idx, float* w) {
  uint64_t s = seed * 7919u + (uint64_t)r * 104729u + 1;
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      int e, fresh;
      do {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        e = (int)((s >> 33) % (uint64_t)E);
        fresh = 1;
        for (int j = 0; j < k; ++j) fresh &= idx[t * K + j] != e;
      } while (!fresh);
      idx[t * K + k] = e;
      w[t * K + k] = 1.0f / (float)K;
    }
}

static routing_stats routing_for(const bench_opts* o, int rank, int64_t T, uint64_t seed, int32_t* scratch_idx,
                                 float* scratch_w) {
  routing_stats s = {0, 0, 0, 0};
  const int E = o->experts_total, K = o->top_k, El = E / o->ranks;
  int* hit = calloc((size_t)El, sizeof(int));
  if (!hit) {
    s.routed = -1;
    return s;
  }
  for (int r = 0; r < o->ranks; ++r) {
    draw_routing(r, T, K, E, seed, scratch_idx, scratch_w);
    for (int64_t i = 0; i < T * K; ++i) {
      const int dest = scratch_idx[i] / El;
      if (dest == rank) {
        s.routed += 1;
        s.remote_in += r != rank;
        hit[scratch_idx[i] % El] = 1;
      }
      if (r == rank && dest != rank) s.my_remote += 1;
    }
  }
  for (int e = 0; e < El; ++e) s.experts_hit += hit[e];
  free(hit);
  return s;
}

typedef struct rank_ctx {
  const bench_opts* o;
} rank_ctx;

static int allreduce_max(double* v, int n, ncclComm_t comm, cudaStream_t stream, int rank) {
  double* d = NULL;
  CK(cudaMalloc((void**)&d, sizeof(double) * (size_t)n));
  CK(cudaMemcpy(d, v, sizeof(double) * (size_t)n, cudaMemcpyHostToDevice));
  if (ncclAllReduce(d, d, (size_t)n, ncclFloat64, ncclMax, comm, stream) != ncclSuccess) return 3;
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(v, d, sizeof(double) * (size_t)n, cudaMemcpyDeviceToHost));
  cudaFree(d);
  return 0;
}

/* The in-kernel timeline (src/host/timeline.h), one rank's view. Per
 * event and forward: the CTAs' stamps relative to the earliest kernel-1
 * start (the [sum] events: per-CTA durations as they are; MM_TL_SM_KHZ:
 * kHz, so its "µs" read as MHz), as min / median / max µs over the CTAs,
 * and how many CTAs stamped it (0: none). */
typedef struct tl_stat {
  double min_us, med_us, max_us;
  int ctas;
} tl_stat;

static int cmp_u64(const void* x, const void* y) {
  const uint64_t a = *(const uint64_t*)x, b = *(const uint64_t*)y;
  return a < b ? -1 : a > b;
}

/* The last forward's timeline into out[MM_TL_EVENTS]; *ctas: the grid. */
static int timeline_read(const megamoe_layer* layer, tl_stat* out, int* ctas) {
  uint64_t* stamps = malloc(sizeof(uint64_t) * MM_TL_MAX_CTAS * MM_TL_EVENTS);
  uint64_t col[MM_TL_MAX_CTAS];
  *ctas = 0;
  if (!stamps || mm_layer_timeline(layer, stamps, MM_TL_MAX_CTAS, ctas) != MEGAMOE_OK) {
    fprintf(stderr, "bench: timeline: %s\n", stamps ? megamoe_last_error() : "out of host memory");
    free(stamps);
    return 1;
  }
  uint64_t t0 = UINT64_MAX;
  for (int c = 0; c < *ctas; ++c)
    if (stamps[c * MM_TL_EVENTS + MM_TL_K1_START] && stamps[c * MM_TL_EVENTS + MM_TL_K1_START] < t0)
      t0 = stamps[c * MM_TL_EVENTS + MM_TL_K1_START];
  for (int e = 0; e < MM_TL_EVENTS; ++e) {
    int n = 0;
    for (int c = 0; c < *ctas; ++c)
      if (stamps[c * MM_TL_EVENTS + e]) col[n++] = stamps[c * MM_TL_EVENTS + e] - (e < MM_TL_FIRST_DURATION ? t0 : 0);
    out[e] = (tl_stat){0, 0, 0, n};
    if (n == 0) continue;
    qsort(col, (size_t)n, sizeof col[0], cmp_u64);
    out[e] = (tl_stat){col[0] * 1e-3, col[n / 2] * 1e-3, col[n - 1] * 1e-3, n};
  }
  free(stamps);
  return 0;
}

/* Prints the timelines of `forwards` forwards (st[f * MM_TL_EVENTS + e]):
 * per event the median over the forwards of each column, and with more
 * than one forward the range of the CTA median over them. */
static int print_timeline(const tl_stat* st, int forwards, int ctas, const char* arm, int64_t T, int rank) {
  double* v = malloc(sizeof(double) * 4 * (size_t)forwards);
  if (!v) {
    fprintf(stderr, "bench: timeline: out of host memory\n");
    return 1;
  }
  printf("  timeline %s T %lld (rank %d, %d CTAs, %d forward%s; us after the first CTA entered kernel 1:\n"
         "  min / median / max over the CTAs%s; [sum]: us spent per CTA, summed over the forward;\n"
         "  SM MHz: each CTA's cycles over time from kernel 1's start to its last math stamp there):\n",
         arm, (long long)T, rank, ctas, forwards, forwards > 1 ? "s" : "",
         forwards > 1 ? ", each the median over the forwards, then the range of the CTA median" : "");
  for (int e = 0; e < MM_TL_EVENTS; ++e) {
    const char* name = mm_timeline_event_name(e);
    if (!name) continue;
    /* Columns over the forwards that stamped the event: min, median, max, CTAs. */
    double* col[4] = {v, v + forwards, v + 2 * forwards, v + 3 * forwards};
    int n = 0;
    for (int f = 0; f < forwards; ++f) {
      const tl_stat* x = &st[f * MM_TL_EVENTS + e];
      if (x->ctas == 0) continue;
      col[0][n] = x->min_us, col[1][n] = x->med_us, col[2][n] = x->max_us, col[3][n] = x->ctas;
      ++n;
    }
    if (n == 0) {
      printf("    %-22s (no CTA)\n", name);
      continue;
    }
    /* median() sorts its column: the range of the CTA median is read after. */
    const double lo = median(col[0], n), mid = median(col[1], n), hi = median(col[2], n), in = median(col[3], n);
    printf("    %-22s %9.1f %9.1f %9.1f   (%.0f CTAs", name, lo, mid, hi, in);
    if (n < forwards) printf("; in %d of %d forwards", n, forwards);
    printf(")");
    if (forwards > 1) printf("   median %.1f-%.1f", col[1][0], col[1][n - 1]);
    printf("\n");
  }
  free(v);
  return 0;
}

/* One row of the table on stdout, from the row the files get. W GB/s: the
 * touched weights' bytes over the call's time, the rate the HBM floor
 * assumes at hbm_gbs (floor_hbm_us is those bytes at that rate). */
static void print_row(const mm_bench_row* r, double hbm_gbs) {
  printf("%-9s %7lld %10.1f %8.1f %9.1f %9.1f %8.1f %9.1f %9.1f %8.0f %9.1f %7.2f\n", r->arm, (long long)r->tokens, r->us,
         r->tflops, r->nvl_gbs, r->symm_mib, r->workspace_mib, r->floor_compute_us, r->floor_hbm_us,
         r->floor_hbm_us * hbm_gbs / r->us, r->floor_nvl_us, r->us / mm_bench_row_floor(r));
  fflush(stdout);
}

/* The rates of the floors (bench_rates.h): each rank measures its GPU before
 * any layer memory exists, and every rank takes the slowest rank's rates; if
 * a rank's measurement failed (it says why), every rank takes the design
 * rates. */
static int bench_rates(const bench_opts* o, int rank, ncclComm_t comm, cudaStream_t stream, mm_bench_rates* rates) {
  mm_bench_rates_design(rates);
  if (o->rates == MM_RATES_DESIGN) return 0;
  char why[256];
  const int failed = mm_bench_rates_measure(rates, 1, why, sizeof why) != 0;
  if (failed) fprintf(stderr, "rank %d: measuring the floors' rates failed (%s): the design rates used\n", rank, why);
  double v[3] = {failed, -rates->fp8_tflops, -rates->hbm_read_gbs}; /* max of the negatives: the slowest rank */
  if (allreduce_max(v, 3, comm, stream, rank) != 0) return -1;
  if (v[0] > 0) {
    mm_bench_rates_design(rates);
  } else {
    rates->fp8_tflops = -v[1];
    rates->hbm_read_gbs = -v[2];
  }
  return 0;
}

static int bench_rank(int rank, int num_ranks, const ncclUniqueId* id, void* vctx) {
  const bench_opts* o = ((rank_ctx*)vctx)->o;
  const double t_start = mm_cli_now_s();
  ncclComm_t comm;
  MK(megamoe_comm_create(rank, num_ranks, id, &comm));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  mm_bench_rates rates;
  if (bench_rates(o, rank, comm, stream, &rates) != 0) return 3;
  const int64_t H = o->hidden, I = o->intermediate, Tm = o->max_tokens;
  const int E = o->experts_total, K = o->top_k, El = E / num_ranks;

  /* Weights (checkpoint layout) drawn on the device. */
  void *w1, *w2;
  float *w1_sf, *w2_sf;
  CK(cudaMalloc(&w1, (size_t)(El * 2 * I * H)));
  CK(cudaMalloc(&w2, (size_t)(El * H * I)));
  CK(cudaMalloc((void**)&w1_sf, sizeof(float) * (size_t)(El * (2 * I / 128) * (H / 128))));
  CK(cudaMalloc((void**)&w2_sf, sizeof(float) * (size_t)(El * (H / 128) * (I / 128))));
  const float s1 = (float)(1.0 / 64.0 / sqrt((double)H)), s2 = (float)(1.0 / 64.0 / sqrt((double)I));
  if (mm_bench_fill_fp8(w1, (size_t)(El * 2 * I * H), 64.f, 11 + (uint64_t)rank, stream) ||
      mm_bench_fill_fp8(w2, (size_t)(El * H * I), 64.f, 23 + (uint64_t)rank, stream) ||
      mm_bench_fill_uniform(w1_sf, (size_t)(El * (2 * I / 128) * (H / 128)), 0.5f * s1, 1.5f * s1,
                            31 + (uint64_t)rank, stream) ||
      mm_bench_fill_uniform(w2_sf, (size_t)(El * (H / 128) * (I / 128)), 0.5f * s2, 1.5f * s2,
                            37 + (uint64_t)rank, stream)) {
    fprintf(stderr, "rank %d: weight fill kernel failed to launch\n", rank);
    return 3;
  }
  /* Inputs at the largest T; smaller points use a prefix. */
  void *x, *y;
  float *x_sf, *topk_w;
  int32_t* topk_idx;
  CK(cudaMalloc(&x, (size_t)(Tm * H)));
  CK(cudaMalloc((void**)&x_sf, sizeof(float) * (size_t)(Tm * (H / 128))));
  CK(cudaMalloc((void**)&topk_idx, sizeof(int32_t) * (size_t)(Tm * K)));
  CK(cudaMalloc((void**)&topk_w, sizeof(float) * (size_t)(Tm * K)));
  CK(cudaMalloc(&y, sizeof(uint16_t) * (size_t)(Tm * H)));
  if (mm_bench_fill_fp8(x, (size_t)(Tm * H), 100.f, 41 + (uint64_t)rank, stream) ||
      mm_bench_fill_uniform(x_sf, (size_t)(Tm * (H / 128)), 0.004f, 0.006f, 43 + (uint64_t)rank, stream)) {
    fprintf(stderr, "rank %d: input fill kernel failed to launch\n", rank);
    return 3;
  }
  const size_t flush_bytes = 256u << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  double* d_sync;
  CK(cudaMalloc((void**)&d_sync, sizeof(double)));
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));

  megamoe_layer* layers[MAX_ARMS] = {0};
  size_t sym_bytes[MAX_ARMS] = {0}, ws_bytes[MAX_ARMS] = {0};
  /* The in-kernel timeline: --timeline N forwards per persistent-arm cell,
   * or one with MEGAMOE_TIMELINE=1 (which mm_bench_layer_run sets for
   * --timeline before the ranks start: the layers stamp only when created
   * with it, src/host/layer.c). */
  const char* tl_env = getenv("MEGAMOE_TIMELINE");
  const int timeline_forwards = o->timeline > 0 ? o->timeline : (tl_env && !strcmp(tl_env, "1"));
  /* --clocks: rank 0's GPU sampled every 5 ms (bench_clocks.h). */
  mm_clock_sampler* clocks = NULL;
  if (o->clocks && rank == 0) {
    int dev = 0;
    char bus[32];
    const char* why = NULL;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev));
    clocks = mm_clocks_start(bus, 5, &why);
    if (!clocks) printf("clocks: not sampled (%s)\n", why);
  }
  for (int a = 0; a < o->num_arms; ++a) {
    megamoe_config cfg = megamoe_config_make(H, I, E, K, Tm);
    cfg.quant_group = o->group;
    cfg.arm = o->arms[a];
    megamoe_status st = megamoe_create(&cfg, comm, &layers[a]);
    if (st == MEGAMOE_ERR_NOT_IMPLEMENTED) {
      if (rank == 0) printf("arm %s: not implemented yet, skipped\n", megamoe_arm_name(cfg.arm));
      layers[a] = NULL;
      continue;
    }
    MK(st);
    MK(megamoe_buffer_sizes(&cfg, num_ranks, &sym_bytes[a], &ws_bytes[a]));
    megamoe_weights w = {w1, w1_sf, w2, w2_sf};
    MK(megamoe_prepare_weights(layers[a], &w, stream));
  }
  CK(cudaStreamSynchronize(stream));
  /* The slots timed per point: every layer built, with programmatic launch
   * off, on, or both ways (--pdl both; the staged arm ignores it, so it gets
   * one slot). The same on every rank: the options and the arms built are. */
  int slot_arm[MAX_SLOTS], slot_pdl[MAX_SLOTS], num_slots = 0;
  char slot_name[MAX_SLOTS][32];
  for (int a = 0; a < o->num_arms; ++a) {
    if (!layers[a]) continue;
    const int both = o->pdl == MM_BENCH_PDL_BOTH && o->arms[a] != MEGAMOE_ARM_STAGED;
    for (int v = 0; v < (both ? 2 : 1); ++v) {
      const int pdl = both ? v : o->pdl == MM_BENCH_PDL_ON;
      slot_arm[num_slots] = a;
      slot_pdl[num_slots] = pdl;
      snprintf(slot_name[num_slots], sizeof slot_name[0], "%s%s", megamoe_arm_name(o->arms[a]),
               pdl && o->arms[a] != MEGAMOE_ARM_STAGED ? "-pdl" : "");
      ++num_slots;
    }
  }
  mm_bench_row rows[MM_BENCH_MAX_POINTS * MAX_SLOTS];
  int num_rows = 0;

  int32_t* h_idx = malloc(sizeof(int32_t) * (size_t)(Tm * K));
  float* h_w = malloc(sizeof(float) * (size_t)(Tm * K));
  /* Sized by the options: iters per round, rounds per arm (checked at parse). */
  double* times = malloc(sizeof(double) * (size_t)o->iters);
  double* round_median = malloc(sizeof(double) * (size_t)(MAX_SLOTS * o->rounds));
  /* With the timeline (rank 0, the persistent arms): the SM clock of every
   * timed forward, read after its events, so a time can be read against the
   * clock it ran at (docs/PERF.md, twenty-first session). */
  const int clock_rows = timeline_forwards > 0 && rank == 0;
  double* fwd_mhz = clock_rows ? malloc(sizeof(double) * (size_t)(MAX_SLOTS * o->rounds * o->iters)) : NULL;
  int fwd_mhz_n[MAX_SLOTS];
  if (!h_idx || !h_w || !times || !round_median || (clock_rows && !fwd_mhz)) {
    fprintf(stderr, "rank %d: out of host memory\n", rank);
    return 3;
  }
  if (rank == 0) {
    printf("\nmegamoe bench: %s, H %lld, I %lld, %d experts (%d per rank), top-%d, G %d, %d rank(s), T_max %lld\n",
           o->model, (long long)H, (long long)I, E, El, K, o->group, num_ranks, (long long)Tm);
    if (o->back_to_back)
      printf("timing: %d calls back to back per round (one L2 flush + all-rank barrier before them), the mean per call, "
             "%d rounds, arms bracketed; each cell the slowest rank's median of the rounds\n",
             o->iters, o->rounds);
    else
      printf("timing: L2 flush + all-rank barrier before each call, median of %d calls per round, %d rounds, arms "
             "bracketed; each cell the slowest rank's median of round medians\n",
             o->iters, o->rounds);
    const char* engine = getenv("MEGAMOE_GEMM");
    printf("GEMM engine: %s (MEGAMOE_GEMM)\n", engine && !strcmp(engine, "simple") ? "simple" : "wgmma");
    if (o->x_in_staging)
      printf("inputs: x and x_sf in each layer's input staging region (--x-in-staging: no staging copy)\n");
    char line[512];
    mm_bench_rates_format(&rates, line, sizeof line);
    printf("%s;\nW GB/s = the touched weights' bytes over the time (the rate the HBM floor assumes: %.0f)\n\n", line,
           rates.hbm_read_gbs);
    printf("%-9s %7s %10s %8s %9s %9s %8s %9s %9s %8s %9s %7s\n", "arm", "T/rank", "us", "TFLOP/s", "NVL GB/s",
           "symm MiB", "ws MiB", "fl.comp", "fl.HBM", "W GB/s", "fl.NVL", "x floor");
  }
  for (int p = 0; p < o->num_points; ++p) {
    const int64_t T = o->tokens[p];
    /* The routing of a token count is its own, wherever the count stands in
     * the list: one count per process (scripts/ab_bench.sh) and the whole
     * list in one process draw the same routing. */
    const uint64_t seed = 1000 + (uint64_t)T;
    if (T > Tm) { /* mm_bench_layer_parse rejects this; the buffers hold Tm rows */
      fprintf(stderr, "rank %d: %lld tokens above T_max %lld\n", rank, (long long)T, (long long)Tm);
      return 3;
    }
    routing_stats rs = routing_for(o, rank, T, seed, h_idx, h_w);
    if (rs.routed < 0) {
      fprintf(stderr, "rank %d: out of host memory\n", rank);
      return 3;
    }
    draw_routing(rank, T, K, E, seed, h_idx, h_w);
    CK(cudaMemcpy(topk_idx, h_idx, sizeof(int32_t) * (size_t)(T * K), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(topk_w, h_w, sizeof(float) * (size_t)(T * K), cudaMemcpyHostToDevice));
    /* Pageable copies may still be in flight when cudaMemcpy returns, and the
     * non-blocking stream does not wait for them. */
    CK(cudaDeviceSynchronize());
    /* Every rank runs T tokens: T is the call's bound, as a serving engine
     * that knows its batch would pass it (--no-bound: 0, read as T_max). */
    const megamoe_forward_args args = {x, x_sf, topk_idx, MEGAMOE_INDEX_INT32, topk_w, T, o->no_bound ? 0 : T, y};
    /* Each layer's arguments: with --x-in-staging, x and x_sf from the
     * layer's own staging region, written here once per point (no forward
     * writes a region whose layer is passed its own pointers). */
    megamoe_forward_args layer_args[MAX_ARMS];
    for (int a = 0; a < o->num_arms; ++a) {
      layer_args[a] = args;
      if (!o->x_in_staging || T == 0 || !layers[a]) continue;
      void* sx = NULL;
      float* ssf = NULL;
      MK(megamoe_input_staging(layers[a], &sx, &ssf));
      /* On the forwards' stream (a device-to-device cudaMemcpy does not
       * wait for its copy, and the stream does not wait for the legacy one). */
      CK(cudaMemcpyAsync(sx, x, (size_t)(T * H), cudaMemcpyDeviceToDevice, stream));
      CK(cudaMemcpyAsync(ssf, x_sf, sizeof(float) * (size_t)(T * (H / 128)), cudaMemcpyDeviceToDevice, stream));
      layer_args[a].x = sx;
      layer_args[a].x_sf = ssf;
    }
    double cell[MAX_SLOTS] = {0};
    mm_clock_stats cell_clocks[MAX_SLOTS]; /* --clocks: this GPU during each cell's timed rounds */
    for (int s = 0; s < num_slots; ++s) cell_clocks[s] = mm_clock_stats_empty(), fwd_mhz_n[s] = 0;
    for (int s = 0; s < num_slots; ++s) {
      megamoe_layer* layer = layers[slot_arm[s]];
      MK(megamoe_set_programmatic_launch(layer, slot_pdl[s]));
      for (int i = 0; i < 3; ++i) MK(megamoe_forward(layer, &layer_args[slot_arm[s]], stream)); /* warm-up */
      MK(megamoe_sync(layer, stream));
    }
    for (int round = 0; round < o->rounds; ++round) {
      for (int j = 0; j < num_slots; ++j) {
        const int s = round % 2 == 0 ? j : num_slots - 1 - j, a = slot_arm[s];
        MK(megamoe_set_programmatic_launch(layers[a], slot_pdl[s]));
        if (rank == 0)
          fprintf(stderr, "bench: cell %d of %d (%s, T %lld), round %d of %d, %.1f s elapsed\n",
                  p * num_slots + s + 1, o->num_points * num_slots, slot_name[s], (long long)T, round + 1,
                  o->rounds, mm_cli_now_s() - t_start);
        mm_clocks_mark(clocks);
        if (o->back_to_back) {
          /* --back-to-back: the iters forwards enqueued one after the other
           * (as a serving engine's layers follow each other), one flush and
           * barrier before them; the round's figure is the mean per call. */
          CK(cudaMemsetAsync(flush, round & 0xff, flush_bytes, stream));
          if (ncclAllReduce(d_sync, d_sync, 1, ncclFloat64, ncclSum, comm, stream) != ncclSuccess) return 3;
          CK(cudaEventRecord(ev0, stream));
          for (int it = 0; it < o->iters; ++it) MK(megamoe_forward(layers[a], &layer_args[a], stream));
          CK(cudaEventRecord(ev1, stream));
          CK(cudaEventSynchronize(ev1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, ev0, ev1));
          MK(megamoe_sync(layers[a], stream));
          round_median[s * o->rounds + round] = ms * 1000.0 / o->iters;
          mm_clocks_add_window(clocks, &cell_clocks[s]);
          continue;
        }
        for (int it = 0; it < o->iters; ++it) {
          CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, stream));
          if (ncclAllReduce(d_sync, d_sync, 1, ncclFloat64, ncclSum, comm, stream) != ncclSuccess) return 3;
          CK(cudaEventRecord(ev0, stream));
          MK(megamoe_forward(layers[a], &layer_args[a], stream));
          CK(cudaEventRecord(ev1, stream));
          CK(cudaEventSynchronize(ev1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, ev0, ev1));
          times[it] = ms * 1000.0;
          if (clock_rows && o->arms[a] != MEGAMOE_ARM_STAGED) {
            /* The forward's timeline; its SM_KHZ column's median over the CTAs, read as MHz. */
            tl_stat last[MM_TL_EVENTS];
            int ctas = 0;
            if (timeline_read(layers[a], last, &ctas) != 0) return 3;
            if (last[MM_TL_SM_KHZ].ctas > 0)
              fwd_mhz[(size_t)s * o->rounds * o->iters + fwd_mhz_n[s]++] = last[MM_TL_SM_KHZ].med_us;
          }
        }
        MK(megamoe_sync(layers[a], stream));
        round_median[s * o->rounds + round] = median(times, o->iters);
        mm_clocks_add_window(clocks, &cell_clocks[s]);
      }
    }
    for (int s = 0; s < num_slots; ++s) cell[s] = median(&round_median[s * o->rounds], o->rounds);
    double worst[MAX_SLOTS];
    memcpy(worst, cell, sizeof worst);
    if (allreduce_max(worst, MAX_SLOTS, comm, stream, rank) != 0) return 3;
    /* Floors for this rank (from its routing), then the slowest rank's. */
    const double flops = 2.0 * rs.routed * 3.0 * (double)H * (double)I;
    const double weight_bytes = rs.experts_hit * (3.0 * (double)H * (double)I);
    const double nvl_bytes = rs.remote_in * ((double)H + (double)H / 32.0) + rs.my_remote * 2.0 * (double)H;
    double floors[4] = {flops / (rates.fp8_tflops * 1e12) * 1e6, weight_bytes / (rates.hbm_read_gbs * 1e9) * 1e6,
                        nvl_bytes / (rates.nvlink_gbs * 1e9) * 1e6, flops};
    double nvl_rate[1] = {0};
    if (allreduce_max(floors, 4, comm, stream, rank) != 0) return 3;
    for (int s = 0; s < num_slots; ++s) {
      const int a = slot_arm[s];
      nvl_rate[0] = nvl_bytes / (worst[s] * 1e-6) / 1e9;
      double rate = nvl_rate[0];
      if (allreduce_max(&rate, 1, comm, stream, rank) != 0) return 3;
      if (rank == 0) {
        mm_bench_row* row = &rows[num_rows++];
        *row = (mm_bench_row){slot_name[s], num_ranks, T, El, H, I, K, o->group, worst[s],
                              floors[3] / (worst[s] * 1e-6) / 1e12, rate, floors[0], floors[1], floors[2],
                              sym_bytes[a] / 1048576.0, ws_bytes[a] / 1048576.0, rates.fp8_tflops,
                              rates.hbm_read_gbs, rates.source == MM_RATES_MEASURED ? "measured" : "design"};
        print_row(row, rates.hbm_read_gbs);
        if (clocks) {
          char line[320];
          mm_clock_stats_format(&cell_clocks[s], line, (int)sizeof line);
          printf("  clocks %s T %lld (rank 0's GPU, the timed rounds): %s\n", slot_name[s], (long long)T, line);
        }
        if (clock_rows && fwd_mhz_n[s] > 0) {
          double* v = &fwd_mhz[(size_t)s * o->rounds * o->iters];
          const int n = fwd_mhz_n[s];
          const double mid = median(v, n); /* sorts v: its ends are the range */
          printf("  SM MHz %s T %lld (rank 0, the timed forwards, each its CTAs' median): %.0f median (%.0f-%.0f, %d "
                 "forwards)\n", slot_name[s], (long long)T, mid, v[0], v[n - 1], n);
        }
      }
      /* The persistent arms' in-kernel timeline of more forwards (--timeline N,
       * or MEGAMOE_TIMELINE=1: one). */
      if (o->arms[a] != MEGAMOE_ARM_STAGED && timeline_forwards > 0) {
        tl_stat* st = malloc(sizeof(tl_stat) * MM_TL_EVENTS * (size_t)timeline_forwards);
        if (!st) {
          fprintf(stderr, "rank %d: out of host memory\n", rank);
          return 3;
        }
        int ctas = 0, bad = 0;
        MK(megamoe_set_programmatic_launch(layers[a], slot_pdl[s]));
        /* Every rank runs every forward and every collective below, whatever
         * its reads gave (a rank that left early would leave its peers waiting). */
        for (int f = 0; f < timeline_forwards; ++f) {
          CK(cudaMemsetAsync(flush, f & 0xff, flush_bytes, stream));
          MK(mm_layer_timeline_clear(layers[a], stream)); /* no stamp of an earlier forward survives */
          if (ncclAllReduce(d_sync, d_sync, 1, ncclFloat64, ncclSum, comm, stream) != ncclSuccess) return 3;
          MK(megamoe_forward(layers[a], &layer_args[a], stream));
          MK(megamoe_sync(layers[a], stream));
          bad |= timeline_read(layers[a], st + (size_t)f * MM_TL_EVENTS, &ctas);
        }
        /* Every rank's, in rank order (a slow peer shows as rank 0's wait at barrier 1). */
        for (int r = 0; r < num_ranks; ++r) {
          if (rank == r && !bad) bad |= print_timeline(st, timeline_forwards, ctas, slot_name[s], T, rank);
          fflush(stdout);
          if (ncclAllReduce(d_sync, d_sync, 1, ncclFloat64, ncclSum, comm, stream) != ncclSuccess) return 3;
          CK(cudaStreamSynchronize(stream));
        }
        free(st);
        if (bad) return 3;
      }
    }
    if (rank == 0 && mm_bench_report_write(rows, num_rows, "megamoe bench", o->csv_path, o->json_path) != 0)
      return 3;
  }
  if (rank == 0)
    printf("\nTFLOP/s per GPU = 2 * routed * 3 * H * I / t (the busiest rank's routed slots); x floor = us / max(floors)\n");
  for (int a = 0; a < o->num_arms; ++a) MK(megamoe_destroy(layers[a]));
  mm_clocks_stop(clocks);
  free(h_idx);
  free(h_w);
  free(times);
  free(round_median);
  free(fwd_mhz);
  cudaFree(w1);
  cudaFree(w2);
  cudaFree(w1_sf);
  cudaFree(w2_sf);
  cudaFree(x);
  cudaFree(x_sf);
  cudaFree(topk_idx);
  cudaFree(topk_w);
  cudaFree(y);
  cudaFree(flush);
  cudaFree(d_sync);
  ncclCommDestroy(comm);
  return 0;
}

int mm_bench_layer_run(mm_bench_layer_opts* o, int gpus) {
  const int picked = mm_cli_pick_ranks("bench", &o->ranks, gpus);
  if (picked != MM_EXIT_OK) return picked;
  if (o->experts_per_rank > 0) o->experts_total = o->experts_per_rank * o->ranks;
  if (o->experts_total % o->ranks) {
    fprintf(stderr, "bench: --model %s: %d experts do not split over %d ranks (--ranks)\n", o->model,
            o->experts_total, o->ranks);
    return MM_EXIT_USAGE;
  }
  if (o->max_tokens == 0)
    for (int p = 0; p < o->num_points; ++p) o->max_tokens = o->tokens[p] > o->max_tokens ? o->tokens[p] : o->max_tokens;
  /* --timeline: the layers must be created with MEGAMOE_TIMELINE=1; set in
   * this process, before any rank (or library thread) exists. */
  if (o->timeline > 0 && setenv("MEGAMOE_TIMELINE", "1", 1) != 0) {
    fprintf(stderr, "bench: --timeline: setenv MEGAMOE_TIMELINE failed\n");
    return MM_EXIT_FAILED;
  }
  rank_ctx ctx = {o};
  const int rc = mm_run_ranks(o->ranks, 3000.0, bench_rank, &ctx);
  return rc == MM_RANKS_OK ? MM_EXIT_OK : MM_EXIT_FAILED; /* the launcher said which rank failed and how */
}
