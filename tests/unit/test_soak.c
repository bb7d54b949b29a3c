/* `megamoe soak`'s options and per-call draw (bench/soak_draw.c), without a
 * GPU: the ranks of a soak never talk about what a call is, so the draw must
 * be a pure function of the shared seed and the call index; every bound must
 * hold for every rank's T; and the edge cases the soak promises (T = 0,
 * T = T_max, each skew, masked slots) must actually come up. */
#include <math.h>

#include "bench.h"
#include "soak.h"
#include "unit.h"

/* Parses a NULL-terminated argument list. */
static int parse(soak_opts* o, const char* const* args) {
  int argc = 0;
  while (args[argc]) ++argc;
  return soak_parse(argc, (char**)args, o);
}

#define PARSE(o, ...)                                  \
  do {                                                 \
    const char* const args_[] = {__VA_ARGS__, NULL};   \
    rc = parse((o), args_);                            \
  } while (0)

static mm_test_result test_soak_options(void) {
  soak_opts o;
  int rc;
  const char* const none[] = {NULL};
  CHECK_EQ_INT(parse(&o, none), MM_PARSE_OK);
  CHECK_EQ_INT(o.hidden, 1024);
  CHECK_EQ_INT(o.intermediate, 512);
  CHECK_EQ_INT(o.experts, 16);
  CHECK_EQ_INT(o.top_k, 4);
  CHECK_EQ_INT(o.max_tokens, 512);
  CHECK_EQ_INT(o.group, 128);
  CHECK_EQ_INT(o.calls, 1000);
  CHECK_EQ_INT(o.ref_every, 50);
  CHECK_EQ_INT(o.cycles, 100);
  CHECK_EQ_INT(o.ranks, 0);
  CHECK_EQ_INT(o.num_arms, 2);
  CHECK_EQ_INT(o.arms[0], MEGAMOE_ARM_STAGED);
  CHECK_EQ_INT(o.arms[1], MEGAMOE_ARM_SPLIT);

  PARSE(&o, "--calls", "7", "--hidden", "256", "--intermediate", "384", "--experts", "8", "--topk", "2",
        "--max-tokens", "33", "--group", "64", "--ref-every", "0", "--cycles", "3", "--seed", "99", "--ranks", "2");
  CHECK_EQ_INT(rc, MM_PARSE_OK);
  CHECK_EQ_INT(o.calls, 7);
  CHECK_EQ_INT(o.hidden, 256);
  CHECK_EQ_INT(o.intermediate, 384);
  CHECK_EQ_INT(o.experts, 8);
  CHECK_EQ_INT(o.top_k, 2);
  CHECK_EQ_INT(o.max_tokens, 33);
  CHECK_EQ_INT(o.group, 64);
  CHECK_EQ_INT(o.ref_every, 0);
  CHECK_EQ_INT(o.cycles, 3);
  CHECK_EQ_INT(o.seed, 99);
  CHECK_EQ_INT(o.ranks, 2);
  CHECK_EQ_INT(o.colocated, 0);
  PARSE(&o, "--colocated", "--ranks", "4");
  CHECK_EQ_INT(rc, MM_PARSE_OK);
  CHECK_EQ_INT(o.colocated, 1);
  CHECK_EQ_INT(o.ranks, 4);

  /* staged is always arms[0] (the oracle), whatever the order given. */
  PARSE(&o, "--arms", "split,staged");
  CHECK_EQ_INT(rc, MM_PARSE_OK);
  CHECK_EQ_INT(o.num_arms, 2);
  CHECK_EQ_INT(o.arms[0], MEGAMOE_ARM_STAGED);
  CHECK_EQ_INT(o.arms[1], MEGAMOE_ARM_SPLIT);
  PARSE(&o, "--arms", "staged");
  CHECK_EQ_INT(rc, MM_PARSE_OK);
  CHECK_EQ_INT(o.num_arms, 1);

  PARSE(&o, "--help");
  CHECK_EQ_INT(rc, MM_PARSE_HELP);
  /* Rejections (each prints one line naming the option on stderr). */
  static const char* const rejected[][5] = {
      {"--arms", "split"}, /* no oracle */
      {"--arms", "staged,staged"},
      {"--calls", "0"},
      {"--calls", "12x"},
      {"--group", "96"},
      {"--hidden", "200"}, /* not a multiple of 128: the config check */
      {"--topk", "9", "--experts", "8"}, /* K > E */
      {"--max-tokens", "0"},
      {"--ref-every", "-1"},
      {"--ranks", "9"},
      {"--seed"},
      {"--frobnicate"},
  };
  for (size_t i = 0; i < sizeof rejected / sizeof rejected[0]; ++i)
    CHECK_MSG(parse(&o, rejected[i]) == MM_PARSE_ERROR, "%s %s was accepted", rejected[i][0],
              rejected[i][1] ? rejected[i][1] : "");
  return MM_TEST_PASS;
}

static int same_call(const soak_call* a, const soak_call* b) {
  return a->index == b->index && !memcmp(a->tokens, b->tokens, sizeof a->tokens) && a->bound == b->bound &&
         a->bound_kind == b->bound_kind && a->skew == b->skew && a->hot_expert == b->hot_expert &&
         a->mask_ratio == b->mask_ratio && a->idx64 == b->idx64 && a->seed == b->seed;
}

/* Every call, at every rank count: T in [0, T_max], the bound 0 or in
 * [max T, T_max], the same call when drawn again (what every rank does on its
 * own), the edge calls as promised, and over a run every case comes up. */
static mm_test_result test_soak_draw_call(void) {
  soak_opts o;
  const char* const none[] = {NULL};
  CHECK_EQ_INT(parse(&o, none), MM_PARSE_OK);
  mm_rng g = unit_rng(71);
  const uint64_t seed = mm_rng_next(&g);
  const int64_t Tm = o.max_tokens, calls = 2000;
  for (int R = 1; R <= MEGAMOE_MAX_RANKS; R *= 2) {
    int64_t some_empty = 0, all_empty = 0, some_full = 0, decode = 0, bounds[SOAK_BOUND_COUNT] = {0},
            skews[SOAK_SKEW_COUNT] = {0}, masked = 0, all_masked = 0, idx64 = 0, differ = 0;
    soak_call prev;
    memset(&prev, 0, sizeof prev);
    for (int64_t i = 0; i < calls; ++i) {
      soak_call c, again;
      soak_draw_call(&o, R, seed, i, &c);
      soak_draw_call(&o, R, seed, i, &again);
      CHECK_MSG(same_call(&c, &again), "call %lld at R %d drawn twice differs", (long long)i, R);
      int64_t largest = 0, empty = 0, full = 0;
      for (int r = 0; r < R; ++r) {
        CHECK_MSG(c.tokens[r] >= 0 && c.tokens[r] <= Tm, "call %lld rank %d: T %lld", (long long)i, r,
                  (long long)c.tokens[r]);
        largest = c.tokens[r] > largest ? c.tokens[r] : largest;
        empty += c.tokens[r] == 0;
        full += c.tokens[r] == Tm;
        decode += c.tokens[r] > 0 && c.tokens[r] <= 8;
      }
      for (int r = R; r < MEGAMOE_MAX_RANKS; ++r) CHECK_EQ_INT(c.tokens[r], 0);
      CHECK_MSG(c.bound == 0 ? c.bound_kind == SOAK_BOUND_NONE || largest == 0 : c.bound >= largest && c.bound <= Tm,
                "call %lld: bound %lld (%s) with largest T %lld", (long long)i, (long long)c.bound,
                soak_bound_name(c.bound_kind), (long long)largest);
      if (c.bound_kind == SOAK_BOUND_TIGHT) CHECK_EQ_INT(c.bound, largest);
      if (c.bound_kind == SOAK_BOUND_T_MAX) CHECK_EQ_INT(c.bound, Tm);
      CHECK(c.hot_expert >= 0 && c.hot_expert < o.experts);
      CHECK(c.mask_ratio == 0.0 || c.mask_ratio == 0.1 || c.mask_ratio == 0.5 || c.mask_ratio == 1.0);
      if (i % SOAK_EDGE_CYCLE == SOAK_EDGE_ALL_EMPTY) CHECK_EQ_INT(empty, R);
      if (i % SOAK_EDGE_CYCLE == SOAK_EDGE_ALL_FULL) {
        CHECK_EQ_INT(full, R);
        CHECK_EQ_INT(c.skew, SOAK_SKEW_ONE_EXPERT);
        CHECK(c.mask_ratio == 0.0);
      }
      some_empty += empty > 0 && empty < R;
      all_empty += empty == R;
      some_full += full > 0;
      bounds[c.bound_kind]++;
      skews[c.skew]++;
      masked += c.mask_ratio > 0 && c.mask_ratio < 1;
      all_masked += c.mask_ratio == 1.0;
      idx64 += c.idx64;
      differ += i > 0 && (memcmp(c.tokens, prev.tokens, sizeof c.tokens) != 0 || c.seed != prev.seed);
      prev = c;
    }
    /* Each case has a probability of 0.05 or more per call: over 2000 calls
     * a count below 20 is no accident (the edge calls alone give 80 each). */
    if (R > 1) CHECK_MSG(some_empty >= 20, "R %d: T = 0 on some (not all) ranks in %lld calls", R, (long long)some_empty);
    CHECK_MSG(all_empty >= calls / SOAK_EDGE_CYCLE, "R %d: every rank at T = 0 in %lld calls", R, (long long)all_empty);
    CHECK_MSG(some_full >= calls / SOAK_EDGE_CYCLE, "R %d: T_max in %lld calls", R, (long long)some_full);
    CHECK_MSG(decode >= 20, "R %d: T in 1..8 on %lld (rank, call)s", R, (long long)decode);
    for (int b = 0; b < SOAK_BOUND_COUNT; ++b)
      CHECK_MSG(bounds[b] >= 20, "R %d: bound %s in %lld calls", R, soak_bound_name((soak_bound)b), (long long)bounds[b]);
    for (int k = 0; k < SOAK_SKEW_COUNT; ++k)
      CHECK_MSG(skews[k] >= 20, "R %d: skew %s in %lld calls", R, soak_skew_name((soak_skew)k), (long long)skews[k]);
    CHECK_MSG(masked >= 20 && all_masked >= 20, "R %d: masked %lld, all masked %lld", R, (long long)masked,
              (long long)all_masked);
    CHECK_MSG(idx64 >= 20 && idx64 <= calls - 20, "R %d: int64 indices in %lld calls", R, (long long)idx64);
    CHECK_MSG(differ >= calls * 9 / 10, "R %d: only %lld calls differ from the one before", R, (long long)differ);
  }
  /* The draw depends on the seed and on the rank count only through T. */
  soak_call a, b;
  soak_draw_call(&o, 2, seed, 3, &a);
  soak_draw_call(&o, 2, seed + 1, 3, &b);
  CHECK(a.seed != b.seed);
  return MM_TEST_PASS;
}

/* The routing of one rank of a call: indices in [-1, E), NaN weights exactly
 * on the masked slots and [0.05, 1.05) on the others, distinct experts per
 * token (uniform, Zipf), every slot on the hot expert (one expert), nothing
 * masked at ratio 0 and everything at 1; the same again for the same
 * (call, rank), another routing for another rank. Zipf makes its hot expert
 * far more popular than uniform makes any. */
static mm_test_result test_soak_draw_routing(void) {
  soak_opts o;
  const char* const none[] = {NULL};
  CHECK_EQ_INT(parse(&o, none), MM_PARSE_OK);
  const int E = o.experts, K = o.top_k;
  const int64_t T = o.max_tokens;
  int32_t* idx = malloc(sizeof(int32_t) * (size_t)(T * K));
  int32_t* idx2 = malloc(sizeof(int32_t) * (size_t)(T * K));
  float* w = malloc(sizeof(float) * (size_t)(T * K));
  float* w2 = malloc(sizeof(float) * (size_t)(T * K));
  CHECK(idx && idx2 && w && w2);
  mm_rng g = unit_rng(72);
  mm_test_result res = MM_TEST_PASS;
  for (int skew = 0; skew < SOAK_SKEW_COUNT && res == MM_TEST_PASS; ++skew)
    for (int m = 0; m < 3 && res == MM_TEST_PASS; ++m) {
      soak_call c;
      soak_draw_call(&o, 2, mm_rng_next(&g), 1, &c);
      c.tokens[0] = c.tokens[1] = T;
      c.skew = (soak_skew)skew;
      c.mask_ratio = m == 0 ? 0.0 : m == 1 ? 0.5 : 1.0;
      if (soak_draw_routing(&o, &c, 0, idx, w) != 0 || soak_draw_routing(&o, &c, 0, idx2, w2) != 0) {
        res = MM_TEST_FAIL;
        break;
      }
      int64_t live = 0, hits[64] = {0};
      for (int64_t t = 0; t < T && res == MM_TEST_PASS; ++t)
        for (int k = 0; k < K; ++k) {
          const int32_t e = idx[t * K + k];
          const float wk = w[t * K + k];
          if (e < -1 || e >= E || (e < 0) != isnan(wk) || (e >= 0 && !(wk >= 0.05f && wk < 1.05f))) {
            fprintf(stderr, "    skew %s mask %.1f token %lld slot %d: index %d weight %g\n",
                    soak_skew_name((soak_skew)skew), c.mask_ratio, (long long)t, k, e, wk);
            res = MM_TEST_FAIL;
            break;
          }
          if (e < 0) continue;
          live++;
          hits[e]++;
          if (skew == SOAK_SKEW_ONE_EXPERT && e != c.hot_expert) res = MM_TEST_FAIL;
          for (int j = 0; j < k && skew != SOAK_SKEW_ONE_EXPERT; ++j)
            if (idx[t * K + j] == e) {
              fprintf(stderr, "    skew %s: token %lld has expert %d twice\n", soak_skew_name((soak_skew)skew),
                      (long long)t, e);
              res = MM_TEST_FAIL;
            }
        }
      CHECK(res == MM_TEST_PASS);
      CHECK_MSG(!memcmp(idx, idx2, sizeof(int32_t) * (size_t)(T * K)), "the same (call, rank) drew another routing");
      if (m == 0) CHECK_EQ_INT(live, T * K);
      if (m == 2) CHECK_EQ_INT(live, 0);
      if (m == 1) CHECK_MSG(live > T * K / 4 && live < T * K * 3 / 4, "mask 0.5 left %lld of %lld slots live",
                            (long long)live, (long long)(T * K));
      if (m == 0 && skew != SOAK_SKEW_ONE_EXPERT) {
        int64_t top = 0;
        for (int e = 0; e < E; ++e) top = hits[e] > top ? hits[e] : top;
        /* Uniform: each expert gets 1/E of the slots (about 128 here); Zipf:
         * the hot expert is in nearly every token (about 512). */
        if (skew == SOAK_SKEW_UNIFORM)
          CHECK_MSG(top < 2 * live / E, "uniform: an expert got %lld of %lld slots", (long long)top, (long long)live);
        else
          CHECK_MSG(hits[c.hot_expert] == top && top > 3 * live / E, "zipf: the hot expert %d got %lld, the top %lld of %lld",
                    c.hot_expert, (long long)hits[c.hot_expert], (long long)top, (long long)live);
      }
      CHECK(soak_draw_routing(&o, &c, 1, idx2, w2) == 0);
      CHECK_MSG(m == 2 || skew == SOAK_SKEW_ONE_EXPERT || memcmp(idx, idx2, sizeof(int32_t) * (size_t)(T * K)) != 0,
                "ranks 0 and 1 drew the same routing");
      CHECK(soak_input_seed(&c, 0) != soak_input_seed(&c, 1));
    }
  free(idx);
  free(idx2);
  free(w);
  free(w2);
  return res;
}

const mm_test unit_suite_soak[] = {
    {"soak_options", test_soak_options},
    {"soak_draw_call_shared_and_bounded", test_soak_draw_call},
    {"soak_draw_routing", test_soak_draw_routing},
    {NULL, NULL},
};
