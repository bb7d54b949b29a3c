/* Benchmarks callable from the megamoe tool.
 *
 * Each benchmark's options are parsed and checked first, in plain host code
 * that touches no GPU (bench_opts.c), so the tool can answer --help, reject a
 * bad option and say which options a run without a GPU ignores. */
#ifndef MEGAMOE_BENCH_H
#define MEGAMOE_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "bench_rng.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Results of the option parsers. */
enum { MM_PARSE_OK = 0, MM_PARSE_HELP = 1, MM_PARSE_ERROR = 2 };

/* ---- `megamoe bench`: the layer's arms side by side ---------------------- */
#define MM_BENCH_MAX_POINTS 16
#define MM_BENCH_MAX_TOKENS (1 << 20) /* per rank, for --tokens and --max-tokens */
#define MM_BENCH_MAX_ITERS 10000
#define MM_BENCH_MAX_ROUNDS 100
#define MM_BENCH_MAX_TIMELINE 1000 /* --timeline: forwards per cell */

/* Which options the command line gave (mm_bench_layer_opts.given). */
enum {
  MM_BENCH_OPT_MODEL = 1 << 0,
  MM_BENCH_OPT_RANKS = 1 << 1,
  MM_BENCH_OPT_TOKENS = 1 << 2,
  MM_BENCH_OPT_ARMS = 1 << 3,
  MM_BENCH_OPT_ITERS = 1 << 4,
  MM_BENCH_OPT_ROUNDS = 1 << 5,
  MM_BENCH_OPT_MAX_TOKENS = 1 << 6,
  MM_BENCH_OPT_CSV = 1 << 7,
  MM_BENCH_OPT_JSON = 1 << 8,
  MM_BENCH_OPT_PDL = 1 << 9,
  MM_BENCH_OPT_BACK_TO_BACK = 1 << 10,
  MM_BENCH_OPT_TIMELINE = 1 << 11,
  MM_BENCH_OPT_CLOCKS = 1 << 12,
  MM_BENCH_OPT_GROUP = 1 << 13,
  MM_BENCH_OPT_RATES = 1 << 14,
  MM_BENCH_OPT_X_IN_STAGING = 1 << 15
};

enum { MM_BENCH_PDL_OFF = 0, MM_BENCH_PDL_ON = 1, MM_BENCH_PDL_BOTH = 2 };

typedef struct mm_bench_layer_opts {
  const char* model;                  /* flash-rank (default), pro-rank, flash, pro */
  int64_t hidden, intermediate;
  int experts_per_rank;               /* the -rank models: experts per rank */
  int experts_total;                  /* the whole models: experts in total (else 0) */
  int top_k;
  int group;                          /* --group: the L1 output's quantization group, 64 or 128 (128) */
  int ranks;                          /* 0: every visible GPU */
  int64_t tokens[MM_BENCH_MAX_POINTS]; /* tokens per rank, one point each */
  int num_points;
  int64_t max_tokens;                 /* T_max of the layers; 0: the largest point */
  megamoe_arm arms[MEGAMOE_ARM_COUNT];
  int num_arms;
  int iters, rounds;
  int no_bound;                       /* --no-bound: num_tokens_bound 0 (T_max) instead of the point's T */
  int x_in_staging;                   /* --x-in-staging: x and x_sf written once per point into each layer's
                                         megamoe_input_staging region and passed from there (no staging copy) */
  int back_to_back;                   /* --back-to-back: the iters calls enqueued without flush or barrier between */
  int clocks;                         /* --clocks: rank 0's GPU clocks, power, temperature per cell (NVML) */
  int timeline;                       /* --timeline N: the in-kernel timeline of N more forwards per persistent-arm
                                         cell (0: off, unless MEGAMOE_TIMELINE=1, which means 1) */
  int pdl;                            /* --pdl: MM_BENCH_PDL_OFF (default), _ON, or _BOTH (each persistent
                                         arm timed both ways in the same rounds; rows "<arm>-pdl") */
  int rates;                          /* --rates: the floors' rates, MM_RATES_MEASURED (default) or
                                         MM_RATES_DESIGN (bench_rates.h) */
  const char* csv_path;               /* --csv: the rows as CSV (bench_report.h); NULL: none */
  const char* json_path;              /* --json: the rows as JSON; NULL: none */
  unsigned given;                     /* MM_BENCH_OPT_* bits */
} mm_bench_layer_opts;

/* Parses and checks the options after "bench" (no GPU touched). Returns
 * MM_PARSE_OK, MM_PARSE_HELP (-h/--help seen; nothing printed) or
 * MM_PARSE_ERROR (a line naming the option printed on stderr). */
int mm_bench_layer_parse(int argc, char** argv, mm_bench_layer_opts* o);

/* Runs the layer benchmark on the visible GPUs (gpus >= 1), one process per
 * rank. Checks what depends on the GPU count first. Returns a process exit
 * code (MM_EXIT_*). The caller has not initialised CUDA (it forks). */
int mm_bench_layer_run(mm_bench_layer_opts* o, int gpus);

/* ---- `megamoe bench-gemm`: our grouped FP8 GEMM vs cuBLASLt --------------- */
#define MM_BENCH_GEMM_EXPERTS 32

typedef struct mm_bench_gemm_opts {
  int quick, tiles, check; /* --quick, --tiles, !--no-check */
  int stream;              /* --stream: the weight stream alone (ld.global.v4, TMA boxes), no GEMM */
  int mainloop;            /* --mainloop: the math warpgroups' K loop alone (bench_mainloop.cu), no GEMM */
  int tile;                /* --tile NAME: the main row's tile (mm_gemm_tile; 0: the engine's pick) */
  int out;                 /* --out bf16|f32|swiglu: the output kind timed (mm_gemm_output; bf16 default) */
  int iters;               /* >= 20 */
  int n, k, m;             /* 0: the default lists */
} mm_bench_gemm_opts;

int mm_bench_gemm_parse(int argc, char** argv, mm_bench_gemm_opts* o);

/* In this process, on the current device. Returns a process exit code. */
int mm_bench_gemm_run(const mm_bench_gemm_opts* o);

/* bench-gemm --mainloop: the loop structures' tensor-pipe share, kblocks K blocks per CTA
 * (bench_mainloop.cu). On the current device; 0 on success. */
int mm_bench_mainloop_run(int kblocks);

/* ---- Device fills --------------------------------------------------------- */
/* Fills n fp8 bytes on the device with values ~ N(0, spread^2) (hash of seed
 * and index: no host data), and n floats with values in [lo, hi). 0 on
 * success. */
int mm_bench_fill_fp8(void* dst, size_t n, float spread, uint64_t seed, void* stream);
int mm_bench_fill_uniform(float* dst, size_t n, float lo, float hi, uint64_t seed, void* stream);

/* ---- Host data (bench_host.c) --------------------------------------------- */
/* n e4m3 values ~ N(0, spread^2), saturating at +-448. */
void mm_bench_host_fp8(mm_bench_rng* g, uint8_t* dst, int64_t n, double spread);
/* T tokens of H channels the way a producer quantizes them: N(0, 1) values,
 * one scale per 128 channels, sf = amax / 448 (ref_quantize_group). */
void mm_bench_host_tokens(mm_bench_rng* g, uint8_t* x, float* x_sf, int64_t T, int64_t H);

#ifdef __cplusplus
}
#endif

#endif
