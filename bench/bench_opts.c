/* Option parsing of the benchmarks (see bench.h): host code only, no GPU. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_rates.h"
#include "bench_report.h"
#include "gemm/gemm.h"
#include "cli.h"

static int set_model(mm_bench_layer_opts* o, const char* v) {
  if (!strcmp(v, "flash-rank")) {
    o->hidden = 4096, o->intermediate = 2048, o->experts_per_rank = 32, o->experts_total = 0;
  } else if (!strcmp(v, "pro-rank")) {
    o->hidden = 7168, o->intermediate = 3072, o->experts_per_rank = 48, o->experts_total = 0;
  } else if (!strcmp(v, "flash")) {
    o->hidden = 4096, o->intermediate = 2048, o->experts_per_rank = 0, o->experts_total = 256;
  } else if (!strcmp(v, "pro")) {
    o->hidden = 7168, o->intermediate = 3072, o->experts_per_rank = 0, o->experts_total = 384;
  } else {
    fprintf(stderr, "bench: --model '%s': unknown model (flash-rank, pro-rank, flash, pro)\n", v);
    return -1;
  }
  o->model = v;
  o->top_k = 6;
  return 0;
}

int mm_bench_layer_parse(int argc, char** argv, mm_bench_layer_opts* o) {
  memset(o, 0, sizeof *o);
  set_model(o, "flash-rank");
  o->tokens[0] = 64, o->tokens[1] = 512, o->tokens[2] = 2048, o->tokens[3] = 8192;
  o->num_points = 4;
  o->iters = 20;
  o->rounds = 3;
  o->group = 128;
  for (int a = 0; a < MEGAMOE_ARM_COUNT; ++a) o->arms[a] = (megamoe_arm)a;
  o->num_arms = MEGAMOE_ARM_COUNT;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (mm_cli_is_help(a)) return MM_PARSE_HELP;
    int bad;
    if (!strcmp(a, "--model")) {
      const char* v = mm_cli_value("bench", argc, argv, &i);
      bad = !v || set_model(o, v) != 0;
      o->given |= MM_BENCH_OPT_MODEL;
    } else if (!strcmp(a, "--ranks")) {
      bad = mm_cli_int("bench", a, mm_cli_value("bench", argc, argv, &i), 1, MEGAMOE_MAX_RANKS, &o->ranks) != 0;
      o->given |= MM_BENCH_OPT_RANKS;
    } else if (!strcmp(a, "--tokens")) {
      bad = mm_cli_int64_list("bench", a, mm_cli_value("bench", argc, argv, &i), 1, MM_BENCH_MAX_TOKENS, o->tokens,
                              MM_BENCH_MAX_POINTS, &o->num_points) != 0;
      o->given |= MM_BENCH_OPT_TOKENS;
    } else if (!strcmp(a, "--max-tokens")) {
      bad = mm_cli_int64("bench", a, mm_cli_value("bench", argc, argv, &i), 1, MM_BENCH_MAX_TOKENS,
                         &o->max_tokens) != 0;
      o->given |= MM_BENCH_OPT_MAX_TOKENS;
    } else if (!strcmp(a, "--iters")) {
      bad = mm_cli_int("bench", a, mm_cli_value("bench", argc, argv, &i), 1, MM_BENCH_MAX_ITERS, &o->iters) != 0;
      o->given |= MM_BENCH_OPT_ITERS;
    } else if (!strcmp(a, "--rounds")) {
      bad = mm_cli_int("bench", a, mm_cli_value("bench", argc, argv, &i), 1, MM_BENCH_MAX_ROUNDS, &o->rounds) != 0;
      o->given |= MM_BENCH_OPT_ROUNDS;
    } else if (!strcmp(a, "--arms")) {
      bad = mm_cli_arm_list("bench", a, mm_cli_value("bench", argc, argv, &i), o->arms, &o->num_arms) != 0;
      o->given |= MM_BENCH_OPT_ARMS;
    } else if (!strcmp(a, "--group")) {
      static const char* const names[] = {"64", "128"};
      static const int values[] = {64, 128};
      bad = mm_cli_choice("bench", a, mm_cli_value("bench", argc, argv, &i), names, values, 2, &o->group) != 0;
      o->given |= MM_BENCH_OPT_GROUP;
    } else if (!strcmp(a, "--no-bound")) {
      o->no_bound = 1;
      bad = 0;
    } else if (!strcmp(a, "--x-in-staging")) {
      o->x_in_staging = 1;
      o->given |= MM_BENCH_OPT_X_IN_STAGING;
      bad = 0;
    } else if (!strcmp(a, "--back-to-back")) {
      o->back_to_back = 1;
      o->given |= MM_BENCH_OPT_BACK_TO_BACK;
      bad = 0;
    } else if (!strcmp(a, "--clocks")) {
      o->clocks = 1;
      o->given |= MM_BENCH_OPT_CLOCKS;
      bad = 0;
    } else if (!strcmp(a, "--timeline")) {
      bad = mm_cli_int("bench", a, mm_cli_value("bench", argc, argv, &i), 1, MM_BENCH_MAX_TIMELINE, &o->timeline) != 0;
      o->given |= MM_BENCH_OPT_TIMELINE;
    } else if (!strcmp(a, "--pdl")) {
      static const char* const names[] = {"off", "on", "both"};
      static const int values[] = {MM_BENCH_PDL_OFF, MM_BENCH_PDL_ON, MM_BENCH_PDL_BOTH};
      bad = mm_cli_choice("bench", a, mm_cli_value("bench", argc, argv, &i), names, values, 3, &o->pdl) != 0;
      o->given |= MM_BENCH_OPT_PDL;
    } else if (!strcmp(a, "--rates")) {
      static const char* const names[] = {"measured", "design"};
      static const int values[] = {MM_RATES_MEASURED, MM_RATES_DESIGN};
      bad = mm_cli_choice("bench", a, mm_cli_value("bench", argc, argv, &i), names, values, 2, &o->rates) != 0;
      o->given |= MM_BENCH_OPT_RATES;
    } else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) {
      const char* v = mm_cli_value("bench", argc, argv, &i);
      bad = !v || mm_bench_check_writable("bench", a, v) != 0;
      if (!strcmp(a, "--csv")) o->csv_path = v, o->given |= MM_BENCH_OPT_CSV;
      else o->json_path = v, o->given |= MM_BENCH_OPT_JSON;
    } else {
      fprintf(stderr, "bench: unknown option '%s' (megamoe bench --help lists them)\n", a);
      bad = 1;
    }
    if (bad) return MM_PARSE_ERROR;
  }
  /* The inputs are allocated for max_tokens rows; every point must fit. */
  if (o->max_tokens > 0)
    for (int p = 0; p < o->num_points; ++p)
      if (o->tokens[p] > o->max_tokens) {
        fprintf(stderr, "bench: --max-tokens %lld is below the --tokens point %lld\n", (long long)o->max_tokens,
                (long long)o->tokens[p]);
        return MM_PARSE_ERROR;
      }
  if (o->csv_path && o->json_path && !strcmp(o->csv_path, o->json_path)) {
    fprintf(stderr, "bench: --csv and --json name the same file '%s'\n", o->csv_path);
    return MM_PARSE_ERROR;
  }
  return MM_PARSE_OK;
}

int mm_bench_gemm_parse(int argc, char** argv, mm_bench_gemm_opts* o) {
  memset(o, 0, sizeof *o);
  o->iters = 30;
  o->check = 1;
  o->out = MM_GEMM_OUT_BF16;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (mm_cli_is_help(a)) return MM_PARSE_HELP;
    int bad = 0;
    if (!strcmp(a, "--quick")) o->quick = 1;
    else if (!strcmp(a, "--tiles")) o->tiles = 1;
    else if (!strcmp(a, "--no-check")) o->check = 0;
    else if (!strcmp(a, "--stream")) o->stream = 1;
    else if (!strcmp(a, "--mainloop")) o->mainloop = 1;
    else if (!strcmp(a, "--out")) {
      static const char* const names[] = {"bf16", "f32", "swiglu"};
      static const int values[] = {MM_GEMM_OUT_BF16, MM_GEMM_OUT_F32, MM_GEMM_OUT_SWIGLU_FP8};
      bad = mm_cli_choice("bench-gemm", a, mm_cli_value("bench-gemm", argc, argv, &i), names, values, 3, &o->out) != 0;
    } else if (!strcmp(a, "--tile")) {
      const char* v = mm_cli_value("bench-gemm", argc, argv, &i);
      bad = 1;
      for (int t = 1; v && t < MM_GEMM_TILE_COUNT; ++t)
        if (!strcmp(v, mm_gemm_tile_name((mm_gemm_tile)t))) o->tile = t, bad = 0;
      if (bad && v) fprintf(stderr, "bench-gemm: --tile %s: not a tile of the engine\n", v);
    }
    else if (!strcmp(a, "--iters"))
      bad = mm_cli_int("bench-gemm", a, mm_cli_value("bench-gemm", argc, argv, &i), 20, MM_BENCH_MAX_ITERS,
                       &o->iters) != 0;
    else if (!strcmp(a, "--m")) {
      bad = mm_cli_int("bench-gemm", a, mm_cli_value("bench-gemm", argc, argv, &i), 1, 1 << 22, &o->m) != 0;
      if (!bad && o->m % (4 * MM_BENCH_GEMM_EXPERTS)) {
        fprintf(stderr, "bench-gemm: --m %d: must be a multiple of %d\n", o->m, 4 * MM_BENCH_GEMM_EXPERTS);
        bad = 1;
      }
    } else if (!strcmp(a, "--nk")) {
      int64_t nk[2];
      int count = 0;
      bad = mm_cli_int64_list("bench-gemm", a, mm_cli_value("bench-gemm", argc, argv, &i), 1, 1 << 16, nk, 2,
                              &count) != 0;
      if (!bad && (count != 2 || nk[0] % 256 || nk[1] % 512)) {
        fprintf(stderr, "bench-gemm: --nk %s: want N,K with N a multiple of 256 and K of 512\n", argv[i]);
        bad = 1;
      }
      if (!bad) o->n = (int)nk[0], o->k = (int)nk[1];
    } else {
      fprintf(stderr, "bench-gemm: unknown option '%s' (megamoe bench-gemm --help lists them)\n", a);
      bad = 1;
    }
    if (bad) return MM_PARSE_ERROR;
  }
  return MM_PARSE_OK;
}
