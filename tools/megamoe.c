/* megamoe: the command-line tool.
 *
 *   megamoe bench [options]       the main job: the layer's arms on all visible GPUs;
 *                                 with no GPU, the CPU reference on a small default problem
 *   megamoe bench-gemm [options]  our grouped FP8 GEMM vs cuBLASLt block-scaled FP8
 *   megamoe info [options]        the buffer layout (regions, offsets, MiB) of a config
 *   megamoe ref [options]         the CPU reference on a small problem, timed */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "harness.h"
#include "host/layout.h"
#include "host/procs.h"
#include "megamoe.h"
#include "ref.h"

static void usage(void) {
  printf(
      "usage: megamoe <command> [options]\n"
      "  bench       layer benchmark on all visible GPUs (CPU reference when none):\n"
      "              --model flash-rank|pro-rank|flash|pro  --ranks N  --tokens 64,512,2048,8192\n"
      "              --arms staged,split,fused  --iters 20  --rounds 3  --max-tokens T\n"
      "  bench-gemm  grouped FP8 GEMM vs cuBLASLt (one GPU)\n"
      "  info        buffer layout: --model flash|pro | --hidden H --intermediate I --experts E --topk K\n"
      "              --ranks R --max-tokens T --group G --arm staged|split|fused\n"
      "  ref         CPU reference: --tokens T --hidden H --intermediate I --experts E --topk K --ranks R\n");
}

typedef struct shape_opts {
  megamoe_config cfg;
  int ranks;
} shape_opts;

static int parse_shape(int argc, char** argv, shape_opts* s) {
  s->cfg = megamoe_config_make(4096, 2048, 256, 6, 8192);
  s->ranks = 8;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "option %s needs a value\n", a);
      return -1;
    }
    const char* v = argv[++i];
    if (!strcmp(a, "--model")) {
      if (!strcmp(v, "flash")) s->cfg = megamoe_config_make(4096, 2048, 256, 6, s->cfg.max_tokens_per_rank);
      else if (!strcmp(v, "pro")) s->cfg = megamoe_config_make(7168, 3072, 384, 6, s->cfg.max_tokens_per_rank);
      else {
        fprintf(stderr, "unknown model '%s' (flash, pro)\n", v);
        return -1;
      }
    } else if (!strcmp(a, "--hidden")) s->cfg.hidden = atoll(v);
    else if (!strcmp(a, "--intermediate")) s->cfg.intermediate = atoll(v);
    else if (!strcmp(a, "--experts")) s->cfg.num_experts = atoi(v);
    else if (!strcmp(a, "--topk")) s->cfg.top_k = atoi(v);
    else if (!strcmp(a, "--max-tokens") || !strcmp(a, "--tokens")) s->cfg.max_tokens_per_rank = atoll(v);
    else if (!strcmp(a, "--group")) s->cfg.quant_group = atoi(v);
    else if (!strcmp(a, "--ranks")) s->ranks = atoi(v);
    else if (!strcmp(a, "--arm")) {
      if (!strcmp(v, "staged")) s->cfg.arm = MEGAMOE_ARM_STAGED;
      else if (!strcmp(v, "split")) s->cfg.arm = MEGAMOE_ARM_SPLIT;
      else if (!strcmp(v, "fused")) s->cfg.arm = MEGAMOE_ARM_FUSED;
      else {
        fprintf(stderr, "unknown arm '%s'\n", v);
        return -1;
      }
    } else {
      fprintf(stderr, "unknown option '%s'\n", a);
      return -1;
    }
  }
  return 0;
}

static int cmd_info(int argc, char** argv) {
  shape_opts s;
  if (parse_shape(argc, argv, &s) != 0) return 2;
  mm_layout l;
  megamoe_status st = mm_layout_compute(&s.cfg, s.ranks, &l);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "%s\n  %s\n", megamoe_status_string(st), megamoe_last_error());
    return 1;
  }
  const megamoe_config* c = &s.cfg;
  printf("config: H %lld, I %lld, E %d (%lld per rank), top-%d, T_max %lld per rank, G %d, %d ranks, arm %s\n",
         (long long)c->hidden, (long long)c->intermediate, c->num_experts, (long long)l.local_experts, c->top_k,
         (long long)c->max_tokens_per_rank, c->quant_group, s.ranks, megamoe_arm_name(c->arm));
  printf("pool capacity: %lld rows\n\n", (long long)l.pool_rows);
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
  printf("prepared weights: %.1f MiB per rank (copy; peak during preparation the same); in place: %.1f MiB kept, "
         "peak %.1f MiB during preparation\n",
         l.prepared_weight_bytes / 1048576.0, l.in_place_resident_bytes / 1048576.0, l.in_place_peak_bytes / 1048576.0);
  printf("total:            %.1f MiB per rank\n",
         (l.symmetric_bytes + l.workspace_bytes + l.prepared_weight_bytes) / 1048576.0);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The CPU reference on a small problem: T tokens on each of R ranks. */
static int run_ref(int64_t T, int64_t H, int64_t I, int E, int K, int R) {
  megamoe_config cfg = megamoe_config_make(H, I, E, K, T);
  megamoe_status st = megamoe_check_config(&cfg, R);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "%s\n  %s\n", megamoe_status_string(st), megamoe_last_error());
    return 1;
  }
  const int El = E / R;
  mm_rng g = {12345};
  uint8_t* w1 = malloc((size_t)(E * 2 * I * H));
  uint8_t* w2 = malloc((size_t)(E * H * I));
  float* w1_sf = malloc(sizeof(float) * (size_t)(E * (2 * I / 128) * (H / 128)));
  float* w2_sf = malloc(sizeof(float) * (size_t)(E * (H / 128) * (I / 128)));
  for (int64_t i = 0; i < E * 2 * I * H; ++i) w1[i] = ref_e4m3_encode((float)(mm_rng_normal(&g) * 64));
  for (int64_t i = 0; i < E * H * I; ++i) w2[i] = ref_e4m3_encode((float)(mm_rng_normal(&g) * 64));
  for (int64_t i = 0; i < E * (2 * I / 128) * (H / 128); ++i) w1_sf[i] = (float)(1.0 / 64 / sqrt((double)H));
  for (int64_t i = 0; i < E * (H / 128) * (I / 128); ++i) w2_sf[i] = (float)(1.0 / 64 / sqrt((double)I));
  ref_rank_data rd[MEGAMOE_MAX_RANKS];
  memset(rd, 0, sizeof rd);
  for (int r = 0; r < R; ++r) {
    uint8_t* x = malloc((size_t)(T * H));
    float* x_sf = malloc(sizeof(float) * (size_t)(T * (H / 128)));
    int32_t* idx = malloc(sizeof(int32_t) * (size_t)(T * K));
    float* w = malloc(sizeof(float) * (size_t)(T * K));
    float row[128];
    for (int64_t i = 0; i < T * (H / 128); ++i) {
      for (int j = 0; j < 128; ++j) row[j] = (float)mm_rng_normal(&g);
      ref_quantize_group(row, 128, x + i * 128, &x_sf[i]);
    }
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        idx[t * K + k] = (int)((t * K + k + r) % E); /* distinct within a token since K <= E */
        w[t * K + k] = 1.0f / (float)K;
      }
    rd[r] = (ref_rank_data){T, x, x_sf, idx, w, w1 + (int64_t)r * El * 2 * I * H,
                            w1_sf + (int64_t)r * El * (2 * I / 128) * (H / 128), w2 + (int64_t)r * El * H * I,
                            w2_sf + (int64_t)r * El * (H / 128) * (I / 128), malloc(sizeof(uint16_t) * (size_t)(T * H))};
  }
  const double t0 = now_s();
  st = ref_layer_forward(&cfg, R, rd);
  const double dt = now_s() - t0;
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "reference failed: %s\n", megamoe_last_error());
    return 1;
  }
  double sum = 0, sq = 0;
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < T * H; ++i) {
      const double v = ref_bf16_decode(rd[r].y[i]);
      sum += v;
      sq += v * v;
    }
  const double flops = 2.0 * R * T * K * 3.0 * H * I;
  printf("CPU reference: T %lld per rank, H %lld, I %lld, E %d, top-%d, %d ranks: %.3f s (%.2f GFLOP/s)\n",
         (long long)T, (long long)H, (long long)I, E, K, R, dt, flops / dt * 1e-9);
  printf("output: mean %.6f, rms %.6f over %lld values\n", sum / (R * T * H), sqrt(sq / (R * T * H)),
         (long long)(R * T * H));
  for (int r = 0; r < R; ++r) {
    free((void*)rd[r].x);
    free((void*)rd[r].x_sf);
    free((void*)rd[r].topk_idx);
    free((void*)rd[r].topk_w);
    free(rd[r].y);
  }
  free(w1);
  free(w2);
  free(w1_sf);
  free(w2_sf);
  return 0;
}

static int cmd_ref(int argc, char** argv) {
  int64_t T = 256, H = 512, I = 512;
  int E = 16, K = 4, R = 4;
  for (int i = 0; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tokens")) T = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--hidden")) H = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--intermediate")) I = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--experts")) E = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--topk")) K = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--ranks")) R = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  return run_ref(T, H, I, E, K, R);
}

int main(int argc, char** argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
  if (!strcmp(cmd, "ref")) return cmd_ref(argc - 2, argv + 2);
  if (!strcmp(cmd, "bench")) {
    if (mm_count_gpus() == 0) {
      printf("no GPU found: running the CPU reference on the small default problem instead "
             "(T 256 per rank, H 512, I 512, 16 experts, top-4, 4 simulated ranks)\n");
      return run_ref(256, 512, 512, 16, 4, 4);
    }
    return mm_bench_layer_main(argc - 2, argv + 2);
  }
  if (!strcmp(cmd, "bench-gemm")) {
    if (mm_count_gpus() == 0) {
      fprintf(stderr, "bench-gemm: no GPU found\n");
      return 2;
    }
    return mm_bench_gemm_main(argc - 2, argv + 2);
  }
  fprintf(stderr, "unknown command '%s'\n\n", cmd);
  usage();
  return 2;
}
