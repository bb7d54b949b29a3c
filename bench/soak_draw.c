/* `megamoe soak`: its options and its per-call draw (soak.h). Plain C, no
 * CUDA: the unit tests call it without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_rng.h"
#include "cli.h"
#include "soak.h"

/* ---- Options ---------------------------------------------------------------- */

int soak_parse(int argc, char** argv, soak_opts* o) {
  memset(o, 0, sizeof *o);
  o->hidden = 1024, o->intermediate = 512, o->max_tokens = 512;
  o->experts = 16, o->top_k = 4, o->group = 128;
  o->calls = 1000, o->ref_every = 50, o->cycles = 100, o->seed = 1;
  o->arms[0] = MEGAMOE_ARM_STAGED, o->arms[1] = MEGAMOE_ARM_SPLIT, o->num_arms = 2;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (mm_cli_is_help(a)) return MM_PARSE_HELP;
    int bad;
    int64_t seed = 0;
    if (!strcmp(a, "--calls"))
      bad = mm_cli_int64("soak", a, mm_cli_value("soak", argc, argv, &i), 1, SOAK_MAX_CALLS, &o->calls);
    else if (!strcmp(a, "--ranks"))
      bad = mm_cli_int("soak", a, mm_cli_value("soak", argc, argv, &i), 1, MEGAMOE_MAX_RANKS, &o->ranks);
    else if (!strcmp(a, "--colocated"))
      bad = 0, o->colocated = 1;
    else if (!strcmp(a, "--hidden"))
      bad = mm_cli_int64("soak", a, mm_cli_value("soak", argc, argv, &i), 1, MEGAMOE_MAX_HIDDEN, &o->hidden);
    else if (!strcmp(a, "--intermediate"))
      bad = mm_cli_int64("soak", a, mm_cli_value("soak", argc, argv, &i), 1, MEGAMOE_MAX_INTERMEDIATE,
                         &o->intermediate);
    else if (!strcmp(a, "--experts"))
      bad = mm_cli_int("soak", a, mm_cli_value("soak", argc, argv, &i), 1,
                       MEGAMOE_MAX_RANKS * MEGAMOE_MAX_LOCAL_EXPERTS, &o->experts);
    else if (!strcmp(a, "--topk"))
      bad = mm_cli_int("soak", a, mm_cli_value("soak", argc, argv, &i), 1, MEGAMOE_MAX_TOP_K, &o->top_k);
    else if (!strcmp(a, "--max-tokens"))
      bad = mm_cli_int64("soak", a, mm_cli_value("soak", argc, argv, &i), 1, MM_BENCH_MAX_TOKENS, &o->max_tokens);
    else if (!strcmp(a, "--group")) {
      bad = mm_cli_int("soak", a, mm_cli_value("soak", argc, argv, &i), 64, 128, &o->group);
      if (!bad && o->group != 64 && o->group != 128) {
        fprintf(stderr, "soak: --group %d: want 64 or 128\n", o->group);
        bad = 1;
      }
    } else if (!strcmp(a, "--ref-every"))
      bad = mm_cli_int64("soak", a, mm_cli_value("soak", argc, argv, &i), 0, SOAK_MAX_CALLS, &o->ref_every);
    else if (!strcmp(a, "--cycles"))
      bad = mm_cli_int("soak", a, mm_cli_value("soak", argc, argv, &i), 0, SOAK_MAX_CYCLES, &o->cycles);
    else if (!strcmp(a, "--seed")) {
      bad = mm_cli_int64("soak", a, mm_cli_value("soak", argc, argv, &i), 0, INT64_MAX, &seed);
      o->seed = (uint64_t)seed;
    } else if (!strcmp(a, "--arms")) {
      bad = mm_cli_arm_list("soak", a, mm_cli_value("soak", argc, argv, &i), o->arms, &o->num_arms);
      int has_staged = 0;
      for (int k = 0; !bad && k < o->num_arms; ++k) has_staged |= o->arms[k] == MEGAMOE_ARM_STAGED;
      if (!bad && !has_staged) {
        fprintf(stderr, "soak: --arms %s: the staged arm must be one of them (every other arm is compared with it)\n",
                argv[i]);
        bad = 1;
      }
      for (int k = 0; !bad && k < o->num_arms; ++k) /* staged first: the oracle of each call */
        if (o->arms[k] == MEGAMOE_ARM_STAGED) {
          o->arms[k] = o->arms[0];
          o->arms[0] = MEGAMOE_ARM_STAGED;
        }
    } else {
      fprintf(stderr, "soak: unknown option '%s' (megamoe soak --help lists them)\n", a);
      bad = 1;
    }
    if (bad) return MM_PARSE_ERROR;
  }
  megamoe_config cfg = megamoe_config_make(o->hidden, o->intermediate, o->experts, o->top_k, o->max_tokens);
  cfg.quant_group = o->group;
  if (megamoe_check_config(&cfg, 1) != MEGAMOE_OK) {
    fprintf(stderr, "soak: %s\n", megamoe_last_error());
    return MM_PARSE_ERROR;
  }
  return MM_PARSE_OK;
}

/* ---- The draw ------------------------------------------------------------------ */

const char* soak_skew_name(soak_skew skew) {
  static const char* const names[SOAK_SKEW_COUNT] = {"uniform", "zipf", "one expert"};
  return skew >= 0 && skew < SOAK_SKEW_COUNT ? names[skew] : "?";
}

const char* soak_bound_name(soak_bound bound) {
  static const char* const names[SOAK_BOUND_COUNT] = {"none", "tight", "between", "T_max"};
  return bound >= 0 && bound < SOAK_BOUND_COUNT ? names[bound] : "?";
}

/* splitmix64's finalizer over (a, b, salt): the seeds of every stream. */
static uint64_t soak_hash(uint64_t a, uint64_t b, uint64_t salt) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull ^ (b + salt) * 0xd1342543de82ef95ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t below(mm_bench_rng* g, uint64_t n) { return mm_bench_rng_next(g) % n; }

void soak_draw_call(const soak_opts* o, int num_ranks, uint64_t seed, int64_t index, soak_call* call) {
  memset(call, 0, sizeof *call);
  mm_bench_rng g = mm_bench_rng_make(soak_hash(seed, (uint64_t)index, 0x50a4ca11ull));
  const int64_t Tm = o->max_tokens;
  const int64_t edge = index % SOAK_EDGE_CYCLE;
  call->index = index;
  call->seed = soak_hash(seed, (uint64_t)index, 0x5eedull);
  /* T per rank: 0, T_max, a decode-sized few, or anything. */
  for (int r = 0; r < num_ranks; ++r) {
    const double u = mm_bench_rng_uniform(&g);
    call->tokens[r] = u < 0.12   ? 0
                      : u < 0.24 ? Tm
                      : u < 0.40 ? 1 + (int64_t)below(&g, (uint64_t)(Tm < 8 ? Tm : 8))
                                 : 1 + (int64_t)below(&g, (uint64_t)Tm);
  }
  const double su = mm_bench_rng_uniform(&g);
  call->skew = su < 0.5 ? SOAK_SKEW_UNIFORM : su < 0.85 ? SOAK_SKEW_ZIPF : SOAK_SKEW_ONE_EXPERT;
  call->hot_expert = (int)below(&g, (uint64_t)o->experts);
  const double mu = mm_bench_rng_uniform(&g);
  call->mask_ratio = mu < 0.4 ? 0.0 : mu < 0.7 ? 0.1 : mu < 0.95 ? 0.5 : 1.0;
  call->idx64 = (int)below(&g, 2);
  if (edge == SOAK_EDGE_ALL_EMPTY) {
    for (int r = 0; r < num_ranks; ++r) call->tokens[r] = 0;
  } else if (edge == SOAK_EDGE_ALL_FULL) { /* every slot of every rank on one expert: the pool's worst case */
    for (int r = 0; r < num_ranks; ++r) call->tokens[r] = Tm;
    call->skew = SOAK_SKEW_ONE_EXPERT;
    call->mask_ratio = 0.0;
  }
  int64_t largest = 0;
  for (int r = 0; r < num_ranks; ++r) largest = call->tokens[r] > largest ? call->tokens[r] : largest;
  const double bu = mm_bench_rng_uniform(&g);
  call->bound_kind = bu < 0.15 ? SOAK_BOUND_NONE : bu < 0.5 ? SOAK_BOUND_TIGHT : bu < 0.8 ? SOAK_BOUND_BETWEEN
                                                                                          : SOAK_BOUND_T_MAX;
  call->bound = call->bound_kind == SOAK_BOUND_NONE    ? 0
                : call->bound_kind == SOAK_BOUND_TIGHT ? largest
                : call->bound_kind == SOAK_BOUND_T_MAX ? Tm
                                                       : largest + (int64_t)below(&g, (uint64_t)(Tm - largest + 1));
}

uint64_t soak_input_seed(const soak_call* call, int rank) { return soak_hash(call->seed, (uint64_t)rank, 0x1e9075ull); }

/* Zipf(1.2) popularity over the experts in the order hot, hot + 1, ...
 * (modulo E): the hot experts sit together, so one rank runs hot too. */
static void zipf_mass(const soak_call* call, int E, double* mass) {
  for (int j = 0; j < E; ++j) mass[(call->hot_expert + j) % E] = pow((double)(j + 1), -1.2);
}

int soak_draw_routing(const soak_opts* o, const soak_call* call, int rank, int32_t* idx, float* w) {
  const int E = o->experts, K = o->top_k;
  const int64_t T = call->tokens[rank];
  mm_bench_rng g = mm_bench_rng_make(soak_hash(call->seed, (uint64_t)rank, 0x70bbull));
  double* mass = NULL;
  unsigned char* taken = calloc((size_t)E, 1);
  if (!taken) return -1;
  if (call->skew == SOAK_SKEW_ZIPF) {
    mass = malloc(sizeof(double) * (size_t)E);
    if (!mass) {
      free(taken);
      return -1;
    }
    zipf_mass(call, E, mass);
  }
  for (int64_t t = 0; t < T; ++t) {
    int32_t* ti = idx + t * K;
    if (call->skew == SOAK_SKEW_ONE_EXPERT) {
      for (int k = 0; k < K; ++k) ti[k] = call->hot_expert;
    } else if (call->skew == SOAK_SKEW_UNIFORM) {
      for (int k = 0; k < K; ++k) { /* distinct experts: K <= E (the config's check) */
        int e;
        do e = (int)below(&g, (uint64_t)E);
        while (taken[e]);
        taken[e] = 1;
        ti[k] = e;
      }
    } else {
      for (int k = 0; k < K; ++k) { /* without replacement: the mass of the experts left */
        double left = 0;
        for (int e = 0; e < E; ++e) left += taken[e] ? 0.0 : mass[e];
        double u = mm_bench_rng_uniform(&g) * left;
        int pick = -1;
        for (int e = 0; e < E; ++e) {
          if (taken[e]) continue;
          pick = e; /* the last expert left, should rounding leave u above the sum */
          if ((u -= mass[e]) < 0) break;
        }
        taken[pick] = 1;
        ti[k] = pick;
      }
    }
    for (int k = 0; k < K; ++k) {
      if (ti[k] >= 0) taken[ti[k]] = 0;
      const int masked = mm_bench_rng_uniform(&g) < call->mask_ratio;
      w[t * K + k] = masked ? NAN : (float)(0.05 + mm_bench_rng_uniform(&g));
      if (masked) ti[k] = -1;
    }
  }
  free(mass);
  free(taken);
  return 0;
}
