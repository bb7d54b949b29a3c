/* megamoe: the command-line tool.
 *
 *   megamoe bench [options]       the main job: the layer's arms on all visible GPUs;
 *                                 with no GPU, the CPU reference on a small problem
 *   megamoe bench-gemm [options]  our grouped FP8 GEMM vs cuBLASLt block-scaled FP8
 *   megamoe info [options]        the buffer layout (regions, offsets, MiB) of a config
 *   megamoe ref [options]         the CPU reference on a small problem, timed
 *   megamoe soak [options]        many drawn forwards per arm, checked bitwise and against
 *                                 the reference; memory and descriptor drift (docs/RELIABILITY.md)
 *
 * Every command parses and checks all of its options before it does anything
 * else (-h/--help prints the usage and exits 0). Exit codes: MM_EXIT_* in
 * bench/cli.h (0 success, 1 the run failed, 2 bad command line, 4 a GPU is
 * needed and none is visible). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_report.h"
#include "bench_rng.h"
#include "cli.h"
#include "device/fused/fused_arm.h"
#include "host/layout.h"
#include "host/plan.h"
#include "host/procs.h"
#include "megamoe.h"
#include "ref.h"
#include "soak.h"

static const char* const kUsageBench =
    "  bench       the layer's arms side by side on all visible GPUs, one process per GPU;\n"
    "              with no GPU visible, the CPU reference instead (it honours --tokens, --ranks and --group\n"
    "              and names the options it ignores)\n"
    "      --model flash-rank|pro-rank|flash|pro  shape (flash-rank: H 4096, I 2048, 32 experts per rank, top-6)\n"
    "      --ranks R              ranks, 1..8 (all visible GPUs; no GPU: 4 simulated ranks)\n"
    "      --tokens T1,T2,...     tokens per rank, one point each, at most 16 (64,512,2048,8192; no GPU: 256)\n"
    "      --max-tokens T         T_max of the layers, >= every --tokens point (the largest point)\n"
    "      --group 64|128         the L1 output's quantization group (128)\n"
    "      --arms A1,A2,...       of staged, split, fused, each once (all three)\n"
    "      --iters N              timed calls per round, 1..10000 (20)\n"
    "      --rounds N             rounds, arms bracketed A B, B A, ..., 1..100 (3)\n"
    "      --no-bound             pass num_tokens_bound = 0 (T_max) instead of the point's T, which every\n"
    "                             rank knows here (the fused arm sizes its order from the bound)\n"
    "      --x-in-staging         write each point's x and x_sf into every layer's input staging region\n"
    "                             (megamoe_input_staging) and pass them from there: no staging copy in the\n"
    "                             forward, as a caller that writes its tokens there\n"
    "      --back-to-back         time the --iters calls of a round enqueued one after the other (no flush or\n"
    "                             barrier between: successive layers of a serving engine), the mean per call\n"
    "      --clocks               after each row, rank 0's GPU during the cell's timed rounds (their\n"
    "                             flushes and barriers included), sampled by NVML every 5 ms: SM clock\n"
    "                             (mean, min-max), memory clock, power (NVML's running average),\n"
    "                             temperature, and the clock-lowering events seen (power cap, thermal);\n"
    "                             NVML misses the drops inside a forward: --timeline's SM MHz has them\n"
    "      --timeline N           after each split or fused cell, N more forwards with the in-kernel\n"
    "                             timeline (routing phases, tiles, barriers, reduction, the SM clock the\n"
    "                             kernel ran at: min / median / max over the CTAs, each the median of\n"
    "                             the N forwards), 1..1000; the env\n"
    "                             MEGAMOE_TIMELINE=1 alone means 1. Each of those forwards has a flush\n"
    "                             and barrier before it (also with --back-to-back). The timed cells\n"
    "                             then run with the stamps too, and after each split or fused row rank 0\n"
    "                             prints the SM clock of its timed forwards (read after each one's events;\n"
    "                             not with --back-to-back): compare arms without it, builds with it\n"
    "      --pdl off|on|both      programmatic dependent launch of the persistent arms' kernels\n"
    "                             (megamoe_set_programmatic_launch; off); both: each such arm timed\n"
    "                             both ways in the same bracketed rounds, rows <arm>-pdl\n"
    "      --rates measured|design  the rates of the floors: measured on each rank's GPU before the layers\n"
    "                             (cuBLASLt fp8 8192^3, a 2 GiB read-only stream; the slowest rank's;\n"
    "                             ~1 s; a failed or implausible one falls back), or the design rates measured\n"
    "                             on the H200 machines (1458 TFLOP/s, 4470 GB/s; docs/PERF.md's opening);\n"
    "                             NVLink at the design rate, 365 GB/s, either way\n"
    "      --csv FILE, --json FILE  also write the rows there: one per (arm, tokens, experts per rank) with\n"
    "                             us, TFLOP/s, floors, MiB, vs_<arm> = us / that arm's us (no GPU: the\n"
    "                             reference's rows); a progress line per cell goes to stderr\n"
    "              NCCL runs with NCCL_NVLS_ENABLE=0 (set when unset; another value is refused)\n";
static const char* const kUsageGemm =
    "  bench-gemm  grouped FP8 GEMM vs cuBLASLt block-scaled FP8, on one GPU\n"
    "      --quick                N = K = 4096 only, M 256 and 16384\n"
    "      --nk N,K               one shape: N a multiple of 256, K of 512\n"
    "      --m M                  one row count, a multiple of 128\n"
    "      --iters N              timed calls per cell, 20..10000 (30)\n"
    "      --tiles                also time every tile shape of ours\n"
    "      --tile NAME            the main row's tile (128x256, 256x128, 128x128, 64x256; diagnostics 128x128-1p, 256x128-noscale, 128x128-noscale, 64x256-noscale)\n"
    "      --out KIND             bf16 (default, beside cuBLASLt), f32, or swiglu (the L1 epilogue, G = 128)\n"
    "      --no-check             skip the diff against cuBLASLt\n"
    "      --stream               no GEMM: the weights read once by ld.global.v4 and by TMA in the tile's B boxes\n"
    "      --mainloop             no GEMM: the math warpgroups' K loop alone, per loop structure (1p, 2p, noscale,\n"
    "                             1-3 warpgroups, m64n128/192/256), with and without a stage-ring feed\n";
static const char* const kUsageInfo =
    "  info        the buffer layout of a config; flags compose in any order, an explicit flag\n"
    "              overrides the model's value\n"
    "      --model flash|pro      base shape (flash: H 4096, I 2048, 256 experts, top-6)\n"
    "      --hidden H  --intermediate I  --experts E  --topk K  --ranks R (8)\n"
    "      --max-tokens T (or --tokens T; 8192)  --group 64|128  --arm staged|split|fused\n";
static const char* const kUsageRef =
    "  ref         the CPU reference on a small problem, timed\n"
    "      --tokens T (256 per rank)  --hidden H (512)  --intermediate I (512)  --experts E (16)\n"
    "      --topk K (4)  --ranks R (4, simulated)\n";

static const char* const kUsageSoak =
    "  soak        reliability: --calls forwards on one layer per arm on all visible GPUs, one process\n"
    "              per GPU; every call draws T per rank (0 and T_max included), the token bound, the\n"
    "              routing skew (uniform, Zipf, all on one expert), masked slots and the index type from\n"
    "              a seed every rank shares; the split arm is checked bitwise against the staged arm on\n"
    "              every call, every arm against the CPU reference every --ref-every calls; then device\n"
    "              memory and open file descriptors before and after, and over --cycles create/destroy\n"
    "              cycles. Exit 1 on any error, mismatch or drift\n"
    "      --calls N              forwards per arm (1000)\n"
    "      --ranks R              ranks, 1..8 (all visible GPUs)\n"
    "      --colocated            every rank on GPU 0, one process each (no NCCL; peer buffers by CUDA\n"
    "                             IPC): the multi-rank protocols on a one-GPU machine, slowly (2 ranks\n"
    "                             unless --ranks); no NVLink, no timing\n"
    "      --hidden H (1024)  --intermediate I (512)  --experts E (16, in total)  --topk K (4)\n"
    "      --max-tokens T (512)  --group 64|128 (128)\n"
    "      --ref-every N          the CPU reference every N calls, 0 never (50)\n"
    "      --cycles N             create/prepare/forward/destroy cycles after the soak (100)\n"
    "      --seed S               the shared seed of every draw (1)\n"
    "      --arms A1,A2           staged and the arms compared with it (staged,split)\n";

static void usage(FILE* f, const char* only) {
  fprintf(f, "usage: megamoe <command> [options]   (megamoe <command> --help: that command only)\n");
  if (!only || !strcmp(only, "bench")) fputs(kUsageBench, f);
  if (!only || !strcmp(only, "bench-gemm")) fputs(kUsageGemm, f);
  if (!only || !strcmp(only, "info")) fputs(kUsageInfo, f);
  if (!only || !strcmp(only, "ref")) fputs(kUsageRef, f);
  if (!only || !strcmp(only, "soak")) fputs(kUsageSoak, f);
  fprintf(f, "exit codes: 0 success, 1 the run failed, 2 bad command line, 4 a GPU is needed and none is visible\n");
}

/* ---- info ------------------------------------------------------------------ */

/* The info flags, each remembered on its own, so they compose in any order:
 * the model gives the base shape, explicit flags override it. */
typedef struct info_opts {
  const char* model;
  int64_t hidden, intermediate, max_tokens;
  int experts, top_k, group, ranks;
  megamoe_arm arm;
  int has_arm;
} info_opts;

static int parse_arm(const char* cmd, const char* opt, const char* v, megamoe_arm* out) {
  if (!v) return -1;
  for (int a = 0; a < MEGAMOE_ARM_COUNT; ++a)
    if (!strcmp(v, megamoe_arm_name((megamoe_arm)a))) {
      *out = (megamoe_arm)a;
      return 0;
    }
  fprintf(stderr, "%s: %s '%s': unknown arm (staged, split, fused)\n", cmd, opt, v);
  return -1;
}

static int parse_info(int argc, char** argv, megamoe_config* cfg, int* ranks) {
  info_opts o;
  memset(&o, 0, sizeof o);
  o.model = "flash";
  o.ranks = 8;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (mm_cli_is_help(a)) return MM_PARSE_HELP;
    int bad;
    if (!strcmp(a, "--model")) {
      o.model = mm_cli_value("info", argc, argv, &i);
      bad = !o.model;
      if (!bad && strcmp(o.model, "flash") && strcmp(o.model, "pro")) {
        fprintf(stderr, "info: --model '%s': unknown model (flash, pro)\n", o.model);
        bad = 1;
      }
    } else if (!strcmp(a, "--hidden"))
      bad = mm_cli_int64("info", a, mm_cli_value("info", argc, argv, &i), 1, 1 << 24, &o.hidden);
    else if (!strcmp(a, "--intermediate"))
      bad = mm_cli_int64("info", a, mm_cli_value("info", argc, argv, &i), 1, 1 << 24, &o.intermediate);
    else if (!strcmp(a, "--max-tokens") || !strcmp(a, "--tokens"))
      bad = mm_cli_int64("info", a, mm_cli_value("info", argc, argv, &i), 1, (int64_t)1 << 30, &o.max_tokens);
    else if (!strcmp(a, "--experts"))
      bad = mm_cli_int("info", a, mm_cli_value("info", argc, argv, &i), 1, 1 << 20, &o.experts);
    else if (!strcmp(a, "--topk"))
      bad = mm_cli_int("info", a, mm_cli_value("info", argc, argv, &i), 1, 1 << 10, &o.top_k);
    else if (!strcmp(a, "--group"))
      bad = mm_cli_int("info", a, mm_cli_value("info", argc, argv, &i), 1, 1 << 10, &o.group);
    else if (!strcmp(a, "--ranks"))
      bad = mm_cli_int("info", a, mm_cli_value("info", argc, argv, &i), 1, MEGAMOE_MAX_RANKS, &o.ranks);
    else if (!strcmp(a, "--arm")) {
      bad = parse_arm("info", a, mm_cli_value("info", argc, argv, &i), &o.arm);
      o.has_arm = !bad;
    } else {
      fprintf(stderr, "info: unknown option '%s' (megamoe info --help lists them)\n", a);
      bad = 1;
    }
    if (bad) return MM_PARSE_ERROR;
  }
  *cfg = !strcmp(o.model, "pro") ? megamoe_config_make(7168, 3072, 384, 6, 8192)
                                 : megamoe_config_make(4096, 2048, 256, 6, 8192);
  if (o.hidden) cfg->hidden = o.hidden;
  if (o.intermediate) cfg->intermediate = o.intermediate;
  if (o.max_tokens) cfg->max_tokens_per_rank = o.max_tokens;
  if (o.experts) cfg->num_experts = o.experts;
  if (o.top_k) cfg->top_k = o.top_k;
  if (o.group) cfg->quant_group = o.group;
  if (o.has_arm) cfg->arm = o.arm;
  *ranks = o.ranks;
  return MM_PARSE_OK;
}

static int cmd_info(int argc, char** argv) {
  megamoe_config cfg;
  int ranks = 0;
  const int p = parse_info(argc, argv, &cfg, &ranks);
  if (p == MM_PARSE_HELP) {
    usage(stdout, "info");
    return MM_EXIT_OK;
  }
  if (p != MM_PARSE_OK) return MM_EXIT_USAGE;
  mm_layout l;
  megamoe_status st = mm_layout_compute(&cfg, ranks, &l);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "info: %s\n  %s\n", megamoe_status_string(st), megamoe_last_error());
    return MM_EXIT_USAGE;
  }
  const megamoe_config* c = &cfg;
  printf("config: H %lld, I %lld, E %d (%lld per rank), top-%d, T_max %lld per rank, G %d, %d ranks, arm %s\n",
         (long long)c->hidden, (long long)c->intermediate, c->num_experts, (long long)l.local_experts, c->top_k,
         (long long)c->max_tokens_per_rank, c->quant_group, ranks, megamoe_arm_name(c->arm));
  printf("pool capacity: %lld rows\n", (long long)l.pool_rows);
  if (c->arm == MEGAMOE_ARM_FUSED) {
    const mm_fused_ring* g = &l.ring;
    if (g->clamped)
      printf("fused ring: %d blocks of %d rows = the worst case at T_max (below 8 x (lag %d + group %d) + %d): "
             "it never wraps, every call takes the single-wave order\n",
             g->blocks, MM_FUSED_BLOCK_ROWS, g->lag, g->group, MM_FUSED_RING_MARGIN);
    else {
      printf(g->grown_order ? "fused ring: %d blocks of %d rows, grown by MEGAMOE_FUSED_RING_PERCENT from 8 x (lag %d "
                              "+ group %d) + %d and taking its own orders (MEGAMOE_FUSED_RING_ORDER=1; diagnostics)"
                            : "fused ring: %d blocks of %d rows = 8 x (lag %d + group %d) + %d",
             mm_fused_order_blocks(g), MM_FUSED_BLOCK_ROWS, g->lag, g->group, MM_FUSED_RING_MARGIN);
      printf("; num_tokens_bound <= %lld: single-wave order, above: lag order (lag from the bound, at most %d units)\n",
             (long long)mm_fused_single_wave_limit(g, c, ranks), g->lag);
    }
    if (g->extra_blocks)
      printf("fused ring grown by MEGAMOE_FUSED_RING_PERCENT (a diagnostic): %d of its %d blocks are extra; "
             "the calls keep the orders above\n",
             g->extra_blocks, g->blocks);
    printf("fused counters: %d virtual blocks (the worst case at T_max) x %d counters x %d banks\n",
           g->virtual_blocks, MM_FUSED_COUNTERS, MM_FLAG_BANKS);
    static const char* const regimes[MM_REGIME_COUNT] = {"decode", "mid", "large"};
    for (int r = 0; r < MM_REGIME_COUNT; ++r) {
      mm_gemm_tile t1, t2;
      mm_fused_smem_plan sp;
      if (mm_plan_fused_kernel(c, ranks, r, &t1, &t2, &sp) != MEGAMOE_OK) {
        printf("fused kernel, %s regime: %s\n", regimes[r], megamoe_last_error());
        continue;
      }
      printf("fused kernel, %s regime: L1 %s + L2 %s, %u pipeline stages, %u tasks decoded ahead per CTA, "
             "%u B of dynamic shared memory (+ %u B kept for static, limit %u)\n",
             regimes[r], mm_gemm_tile_name(t1), mm_gemm_tile_name(t2), sp.stages, sp.cache_entries, sp.dynamic_bytes,
             sp.static_reserve, sp.limit);
    }
  }
  printf("\n");
  printf("%-10s %-16s %16s %16s %8s %12s\n", "space", "region", "offset", "bytes", "align", "MiB");
  for (int space = 0; space < 2; ++space)
    for (int i = 0; i < MM_REGION_COUNT; ++i) {
      const mm_region* r = &l.regions[i];
      if ((int)r->space != space || r->bytes == 0) continue;
      printf("%-10s %-16s %16llu %16llu %8llu %12.3f\n", space == MM_SPACE_SYMMETRIC ? "symmetric" : "workspace",
             r->name, (unsigned long long)r->offset, (unsigned long long)r->bytes, (unsigned long long)r->align,
             r->bytes / 1048576.0);
    }
  printf("\nsymmetric buffer: %.1f MiB per rank (NCCL window)\n", l.symmetric_bytes / 1048576.0);
  printf("workspace:        %.1f MiB per rank\n", l.workspace_bytes / 1048576.0);
  printf("symmetric + workspace: %.1f MiB per rank (prepared weights apart)\n",
         (l.symmetric_bytes + l.workspace_bytes) / 1048576.0);
  printf("prepared weights: %.1f MiB per rank (copy; peak during preparation the same); in place: %.1f MiB kept, "
         "peak %.1f MiB during preparation\n",
         l.prepared_weight_bytes / 1048576.0, l.in_place_resident_bytes / 1048576.0, l.in_place_peak_bytes / 1048576.0);
  printf("total:            %.1f MiB per rank\n",
         (l.symmetric_bytes + l.workspace_bytes + l.prepared_weight_bytes) / 1048576.0);
  return MM_EXIT_OK;
}

/* ---- ref (and bench without a GPU) ----------------------------------------- */

static void free_rank_data(ref_rank_data* rd, int R) {
  for (int r = 0; r < R; ++r) {
    free((void*)rd[r].x);
    free((void*)rd[r].x_sf);
    free((void*)rd[r].topk_idx);
    free((void*)rd[r].topk_w);
    free(rd[r].y);
  }
}

/* The CPU reference on a small problem: T tokens on each of R ranks, quantization group G (0: the config's default). row
 * (may be NULL): the run as a benchmark row (arm "reference"; no floors:
 * they are the GPU's; the buffer sizes a GPU layer of this config takes). */
static int run_ref(int64_t T, int64_t H, int64_t I, int E, int K, int G, int R, mm_bench_row* row) {
  megamoe_config cfg = megamoe_config_make(H, I, E, K, T);
  if (G) cfg.quant_group = G; /* 0: the config's default */
  megamoe_status st = megamoe_check_config(&cfg, R);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "ref: %s\n  %s\n", megamoe_status_string(st), megamoe_last_error());
    return MM_EXIT_USAGE;
  }
  const int El = E / R;
  mm_bench_rng g = mm_bench_rng_make(12345);
  const int64_t n_w1 = (int64_t)E * 2 * I * H, n_w2 = (int64_t)E * H * I;
  const int64_t n_w1_sf = (int64_t)E * (2 * I / 128) * (H / 128), n_w2_sf = (int64_t)E * (H / 128) * (I / 128);
  uint8_t* w1 = malloc((size_t)n_w1);
  uint8_t* w2 = malloc((size_t)n_w2);
  float* w1_sf = malloc(sizeof(float) * (size_t)n_w1_sf);
  float* w2_sf = malloc(sizeof(float) * (size_t)n_w2_sf);
  ref_rank_data rd[MEGAMOE_MAX_RANKS];
  memset(rd, 0, sizeof rd);
  int rc = MM_EXIT_FAILED;
  if (!w1 || !w2 || !w1_sf || !w2_sf) {
    fprintf(stderr, "ref: out of host memory for the weights (%.1f MiB)\n", (n_w1 + n_w2) / 1048576.0);
    goto done;
  }
  mm_bench_host_fp8(&g, w1, n_w1, 64);
  mm_bench_host_fp8(&g, w2, n_w2, 64);
  for (int64_t i = 0; i < n_w1_sf; ++i) w1_sf[i] = (float)(1.0 / 64 / sqrt((double)H));
  for (int64_t i = 0; i < n_w2_sf; ++i) w2_sf[i] = (float)(1.0 / 64 / sqrt((double)I));
  for (int r = 0; r < R; ++r) {
    uint8_t* x = malloc((size_t)(T * H));
    float* x_sf = malloc(sizeof(float) * (size_t)(T * (H / 128)));
    int32_t* idx = malloc(sizeof(int32_t) * (size_t)(T * K));
    float* w = malloc(sizeof(float) * (size_t)(T * K));
    uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(T * H));
    rd[r] = (ref_rank_data){T, x, x_sf, idx, w, w1 + (int64_t)r * El * 2 * I * H,
                            w1_sf + (int64_t)r * El * (2 * I / 128) * (H / 128), w2 + (int64_t)r * El * H * I,
                            w2_sf + (int64_t)r * El * (H / 128) * (I / 128), y};
    if (!x || !x_sf || !idx || !w || !y) {
      fprintf(stderr, "ref: out of host memory for the inputs of rank %d\n", r);
      goto done;
    }
    mm_bench_host_tokens(&g, x, x_sf, T, H);
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        idx[t * K + k] = (int)((t * K + k + r) % E); /* distinct within a token since K <= E */
        w[t * K + k] = 1.0f / (float)K;
      }
  }
  const double t0 = mm_cli_now_s();
  st = ref_layer_forward(&cfg, R, rd);
  const double dt = mm_cli_now_s() - t0;
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "ref: the reference failed: %s\n", megamoe_last_error());
    goto done;
  }
  double sum = 0, sq = 0;
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < T * H; ++i) {
      const double v = ref_bf16_decode(rd[r].y[i]);
      sum += v;
      sq += v * v;
    }
  const double flops = 2.0 * R * T * K * 3.0 * H * I;
  printf("CPU reference: T %lld per rank, H %lld, I %lld, E %d, top-%d, G %d, %d ranks: %.3f s (%.2f GFLOP/s)\n",
         (long long)T, (long long)H, (long long)I, E, K, cfg.quant_group, R, dt, flops / dt * 1e-9);
  printf("output: mean %.6f, rms %.6f over %lld values\n", sum / (R * T * H), sqrt(sq / (R * T * H)),
         (long long)(R * T * H));
  fflush(stdout);
  if (row) {
    size_t symm = 0, ws = 0;
    megamoe_buffer_sizes(&cfg, R, &symm, &ws); /* the config passed megamoe_check_config above */
    *row = (mm_bench_row){"reference", R, T, El, H, I, K, cfg.quant_group, dt * 1e6, flops / dt * 1e-12, NAN, NAN, NAN, NAN,
                          symm / 1048576.0, ws / 1048576.0, NAN, NAN, NULL};
  }
  rc = MM_EXIT_OK;
done:
  free_rank_data(rd, R);
  free(w1);
  free(w2);
  free(w1_sf);
  free(w2_sf);
  return rc;
}

static int cmd_ref(int argc, char** argv) {
  int64_t T = 256, H = 512, I = 512;
  int E = 16, K = 4, R = 4;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (mm_cli_is_help(a)) {
      usage(stdout, "ref");
      return MM_EXIT_OK;
    }
    int bad;
    if (!strcmp(a, "--tokens")) bad = mm_cli_int64("ref", a, mm_cli_value("ref", argc, argv, &i), 1, 1 << 20, &T);
    else if (!strcmp(a, "--hidden"))
      bad = mm_cli_int64("ref", a, mm_cli_value("ref", argc, argv, &i), 1, MEGAMOE_MAX_HIDDEN, &H);
    else if (!strcmp(a, "--intermediate"))
      bad = mm_cli_int64("ref", a, mm_cli_value("ref", argc, argv, &i), 1, MEGAMOE_MAX_INTERMEDIATE, &I);
    else if (!strcmp(a, "--experts"))
      bad = mm_cli_int("ref", a, mm_cli_value("ref", argc, argv, &i), 1, MEGAMOE_MAX_RANKS * MEGAMOE_MAX_LOCAL_EXPERTS,
                       &E);
    else if (!strcmp(a, "--topk")) bad = mm_cli_int("ref", a, mm_cli_value("ref", argc, argv, &i), 1, MEGAMOE_MAX_TOP_K, &K);
    else if (!strcmp(a, "--ranks")) bad = mm_cli_int("ref", a, mm_cli_value("ref", argc, argv, &i), 1, MEGAMOE_MAX_RANKS, &R);
    else {
      fprintf(stderr, "ref: unknown option '%s' (megamoe ref --help lists them)\n", a);
      bad = 1;
    }
    if (bad) return MM_EXIT_USAGE;
  }
  return run_ref(T, H, I, E, K, 0, R, NULL);
}

/* ---- bench ----------------------------------------------------------------- */

/* Without a GPU: the CPU reference at each --tokens point (default 256) on
 * --ranks simulated ranks (default 4), 4 experts per rank, H = I = 512,
 * top-4, its rows in the --csv / --json files (arm "reference"). The rest
 * of the options only mean something on GPUs. */
static int bench_without_gpu(const mm_bench_layer_opts* o) {
  static const struct {
    unsigned bit;
    const char* name;
  } kIgnored[] = {{MM_BENCH_OPT_MODEL, "--model"},   {MM_BENCH_OPT_ARMS, "--arms"},
                  {MM_BENCH_OPT_ITERS, "--iters"},   {MM_BENCH_OPT_ROUNDS, "--rounds"},
                  {MM_BENCH_OPT_MAX_TOKENS, "--max-tokens"}, {MM_BENCH_OPT_PDL, "--pdl"},
                  {MM_BENCH_OPT_BACK_TO_BACK, "--back-to-back"}, {MM_BENCH_OPT_TIMELINE, "--timeline"},
                  {MM_BENCH_OPT_CLOCKS, "--clocks"}, {MM_BENCH_OPT_RATES, "--rates"},
                  {MM_BENCH_OPT_X_IN_STAGING, "--x-in-staging"}};
  const int R = (o->given & MM_BENCH_OPT_RANKS) ? o->ranks : 4;
  const int64_t default_points[1] = {256};
  const int64_t* points = (o->given & MM_BENCH_OPT_TOKENS) ? o->tokens : default_points;
  const int num_points = (o->given & MM_BENCH_OPT_TOKENS) ? o->num_points : 1;
  printf("no GPU visible: running the CPU reference instead (H 512, I 512, %d experts, top-4, G %d, %d simulated "
         "ranks, T per rank:",
         4 * R, o->group, R);
  for (int p = 0; p < num_points; ++p) printf("%s%lld", p ? "," : " ", (long long)points[p]);
  printf(")\n");
  char ignored[256] = "";
  for (size_t i = 0; i < sizeof kIgnored / sizeof kIgnored[0]; ++i)
    if (o->given & kIgnored[i].bit) {
      if (ignored[0]) strcat(ignored, ", ");
      strcat(ignored, kIgnored[i].name);
    }
  if (ignored[0]) printf("ignored without a GPU: %s (they apply to the GPU benchmark only)\n", ignored);
  fflush(stdout);
  mm_bench_row rows[MM_BENCH_MAX_POINTS];
  for (int p = 0; p < num_points; ++p) {
    const int rc = run_ref(points[p], 512, 512, 4 * R, 4, o->group, R, &rows[p]);
    if (rc != MM_EXIT_OK) return rc;
  }
  if (mm_bench_report_write(rows, num_points, "megamoe bench (CPU reference)", o->csv_path, o->json_path) != 0)
    return MM_EXIT_FAILED;
  return MM_EXIT_OK;
}

/* The benchmark's and the soak's ranks talk through NCCL, which must leave NVLink multicast
 * off (megamoe_comm_create requires NCCL_NVLS_ENABLE=0): set it in this
 * process when unset, before any rank is forked; refuse another value. */
static int nccl_nvls_off(const char* cmd) {
  const char* v = getenv("NCCL_NVLS_ENABLE");
  if (!v) {
    if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) {
      fprintf(stderr, "%s: setenv NCCL_NVLS_ENABLE failed\n", cmd);
      return -1;
    }
    return 0;
  }
  char* end = NULL;
  const long x = strtol(v, &end, 10);
  if (end == v || *end != '\0' || x != 0) {
    fprintf(stderr, "%s: NCCL_NVLS_ENABLE=%s: megamoe never uses NVLink multicast; unset it or set it to 0\n", cmd, v);
    return -1;
  }
  return 0;
}

static int cmd_bench(int argc, char** argv) {
  mm_bench_layer_opts o;
  const int p = mm_bench_layer_parse(argc, argv, &o);
  if (p == MM_PARSE_HELP) {
    usage(stdout, "bench");
    return MM_EXIT_OK;
  }
  if (p != MM_PARSE_OK) return MM_EXIT_USAGE;
  const int gpus = mm_count_gpus(); /* in a throwaway child: this process stays free of CUDA */
  if (gpus == 0) return bench_without_gpu(&o);
  if (nccl_nvls_off("bench") != 0) return MM_EXIT_USAGE;
  return mm_bench_layer_run(&o, gpus);
}

static int cmd_bench_gemm(int argc, char** argv) {
  mm_bench_gemm_opts o;
  const int p = mm_bench_gemm_parse(argc, argv, &o);
  if (p == MM_PARSE_HELP) {
    usage(stdout, "bench-gemm");
    return MM_EXIT_OK;
  }
  if (p != MM_PARSE_OK) return MM_EXIT_USAGE;
  if (mm_count_gpus() == 0) {
    fprintf(stderr, "bench-gemm: no GPU visible: the GEMM benchmark needs one Hopper GPU\n");
    return MM_EXIT_NO_GPU;
  }
  return mm_bench_gemm_run(&o);
}

static int cmd_soak(int argc, char** argv) {
  soak_opts o;
  const int p = soak_parse(argc, argv, &o);
  if (p == MM_PARSE_HELP) {
    usage(stdout, "soak");
    return MM_EXIT_OK;
  }
  if (p != MM_PARSE_OK) return MM_EXIT_USAGE;
  const int gpus = mm_count_gpus(); /* in a throwaway child: this process stays free of CUDA */
  if (gpus == 0) {
    fprintf(stderr, "soak: no GPU visible: the soak runs the layer on Hopper GPUs\n");
    return MM_EXIT_NO_GPU;
  }
  if (nccl_nvls_off("soak") != 0) return MM_EXIT_USAGE;
  return soak_run(&o, gpus);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr, NULL);
    return MM_EXIT_USAGE;
  }
  if (mm_cli_is_help(argv[1])) {
    usage(stdout, NULL);
    return MM_EXIT_OK;
  }
  const char* cmd = argv[1];
  if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
  if (!strcmp(cmd, "ref")) return cmd_ref(argc - 2, argv + 2);
  if (!strcmp(cmd, "bench")) return cmd_bench(argc - 2, argv + 2);
  if (!strcmp(cmd, "bench-gemm")) return cmd_bench_gemm(argc - 2, argv + 2);
  if (!strcmp(cmd, "soak")) return cmd_soak(argc - 2, argv + 2);
  fprintf(stderr, "megamoe: unknown command '%s' (bench, bench-gemm, info, ref, soak; megamoe --help)\n", cmd);
  return MM_EXIT_USAGE;
}
