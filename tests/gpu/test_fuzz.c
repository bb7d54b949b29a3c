/* Random forward arguments on 1..8 GPUs (issue 14, part 4, the GPU half):
 * every call is one collective forward whose arguments are drawn from one
 * seed that every rank shares, so every rank knows what each must see.
 *
 * Per call, on every rank: the token count (0 .. T_max, at the limit half
 * the time), a token bound, x at an odd address (allowed), NULL token
 * pointers with T = 0 (allowed), non-finite values planted in a few tokens
 * (NaN / Inf in x_sf, NaN in x, NaN / Inf in a live or masked slot's routing
 * weight), a duplicated expert inside a token's top-k (allowed); and on one
 * rank, in about a third of the calls, one error: a top-k index >= E, < -1
 * or (int64) past 2^32, num_tokens above T_max or negative, a bound below T
 * or above T_max, a NULL pointer, NULL args, y / topk_idx / topk_w / x_sf
 * misaligned, a bad index type.
 *
 * What every call must show (megamoe.h):
 *  - an error: the bad rank's forward returns the status at once when the
 *    host finds it, its sync returns it naming the argument (or the bad
 *    element); every peer's sync returns MEGAMOE_ERR_PEER_FAILED naming the
 *    bad rank and the status; the error word says the same; no rank's y
 *    buffer changed at all;
 *  - no error: OK everywhere, error word 0; every element of the rows
 *    [0, T) written; a row whose token has a NaN input (or an Inf routing
 *    weight, or an Inf scale without the clamp) NaN in every element; a row
 *    with a duplicated expert as the reference computes it; every other row
 *    bitwise the clean run's (a token's row depends on its own inputs only);
 *  - always: nothing written outside the caller's rows, checked on
 *    FZ_GUARD_BYTES of guard before and after y and on the rows past T; the
 *    inputs unchanged.
 * A separate test plants NaN / Inf in one expert's W1 or W2 scales through
 * megamoe_prepare_weights: the rows of exactly the tokens routed there.
 *
 * The checks are pure host code (fuzz_check.h), each shown to fail on its
 * planted bug on the CPU (tests/unit/test_fuzz_checks.c, test_ref_layer.c).
 * On the GPU, MEGAMOE_FUZZ_PLANT=guard|row|nan|status plants one bug into
 * what rank 0 judges (a guard byte, a clean row's bit, a finite element in
 * a NaN row, the expected status): every fuzz test must then FAIL (with
 * "status" the two random-forward tests: the weight-scale tests carry no
 * argument errors).
 *
 * Collective calls are made by every rank whatever it found (EXPECT records,
 * never returns early), so a failed check never leaves a peer waiting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fuzz_check.h"
#include "layer_case.h"
#include "rank_ctx.h"
#include "ref.h"

/* Checks that record instead of returning; the first few print. */
#define EXPECT(cond, ...)                                                                                       \
  do {                                                                                                          \
    if (!(cond)) {                                                                                              \
      if (fz->failures++ < 8) {                                                                                 \
        fprintf(stderr, "    rank %d call %d: EXPECT failed at %s:%d: %s: ", fz->rank, fz->call, __FILE__, __LINE__, \
                #cond);                                                                                         \
        fprintf(stderr, __VA_ARGS__);                                                                           \
        fputc('\n', stderr);                                                                                    \
      }                                                                                                         \
    }                                                                                                           \
  } while (0)

/* ---- the environment of one fuzz test ----------------------------------------- */
typedef struct fz_env {
  int rank, R, call, failures;
  int64_t H, K, Tmax;
  lc_case c;
  lc_data d;
  lc_device g;           /* the checkpoint weights on the device */
  megamoe_layer* layer;
  const int32_t* word;   /* the error word */
  /* Device buffers of one call's inputs, 16 spare bytes each (misalignments). */
  uint8_t *x_dev, *x_sf_dev, *idx_dev, *w_dev;
  uint8_t* y_dev;        /* guard | T_max rows | guard */
  size_t y_total, y_off;
  uint8_t *image, *after; /* host: the y buffer before (as filled) and after a call */
  uint16_t* clean;       /* the clean run's rows [T_max, H] */
  fz_inputs in;          /* host: one call's inputs and what each row must be */
  uint16_t *ref_rows, *y_rows;
  int setup_bad;
  /* What the run saw, for the closing line. */
  int errors_seen[FZ_ERROR_COUNT], calls_ok, zero_t, odd_x;
} fz_env;

/* Calls per random test, forwards per weight-scale test. */
#define FZ_CALLS 160
#define FZ_WEIGHT_CALLS 8

static int fz_planted(const char* what) {
  const char* v = getenv("MEGAMOE_FUZZ_PLANT");
  return v && strcmp(v, what) == 0;
}

static size_t idx_size(const fz_env* fz) { return fz->c.idx64 ? 8 : 4; }

static int fz_teardown(fz_env* fz) {
  const int bad = fz->layer && megamoe_destroy(fz->layer) != MEGAMOE_OK;
  void* dev[] = {fz->x_dev, fz->x_sf_dev, fz->idx_dev, fz->w_dev, fz->y_dev};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) cudaFree(dev[i]);
  void* host[] = {fz->image,  fz->after,     fz->clean,        fz->in.x,       fz->in.x_sf, fz->in.w,
                  fz->in.idx, fz->in.idx_wire, fz->in.expect, fz->ref_rows, fz->y_rows};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) free(host[i]);
  lc_device_free(&fz->g);
  lc_free(&fz->d);
  return bad;
}

/* Builds the problem, the layer (collective) and the clean run. Returns -1
 * only when create failed on every rank (nothing else is collective then). */
static int fz_setup(const mm_rank_ctx* ctx, fz_env* fz, const lc_case* c) {
  memset(fz, 0, sizeof *fz);
  fz->rank = ctx->rank;
  fz->R = ctx->num_ranks;
  fz->call = -1;
  fz->c = *c;
  fz->H = c->cfg.hidden;
  fz->K = c->cfg.top_k;
  fz->Tmax = c->cfg.max_tokens_per_rank;
  const int64_t H = fz->H, K = fz->K, T = fz->Tmax;
  int bad = lc_build(c, ctx->num_ranks, ctx->rank, &fz->d) != 0;
  if (!bad) bad = lc_upload(c, &fz->d, ctx->rank, &fz->g) != 0;
  fz->y_off = FZ_GUARD_BYTES;
  fz->y_total = FZ_GUARD_BYTES + sizeof(uint16_t) * (size_t)(T * H) + FZ_GUARD_BYTES;
  bad |= cudaMalloc((void**)&fz->x_dev, (size_t)(T * H) + 16) != cudaSuccess;
  bad |= cudaMalloc((void**)&fz->x_sf_dev, sizeof(float) * (size_t)(T * H / 128) + 16) != cudaSuccess;
  bad |= cudaMalloc((void**)&fz->idx_dev, 8 * (size_t)(T * K) + 16) != cudaSuccess;
  bad |= cudaMalloc((void**)&fz->w_dev, sizeof(float) * (size_t)(T * K) + 16) != cudaSuccess;
  bad |= cudaMalloc((void**)&fz->y_dev, fz->y_total) != cudaSuccess;
  fz->image = malloc(fz->y_total);
  fz->after = malloc(fz->y_total);
  fz->clean = malloc(sizeof(uint16_t) * (size_t)(T * H));
  fz_inputs* in = &fz->in;
  in->x = malloc((size_t)(T * H));
  in->x_sf = malloc(sizeof(float) * (size_t)(T * H / 128));
  in->w = malloc(sizeof(float) * (size_t)(T * K));
  in->idx = malloc(sizeof(int32_t) * (size_t)(T * K));
  in->idx_wire = malloc(8 * (size_t)(T * K));
  in->expect = calloc((size_t)T, sizeof(fz_row_expect));
  fz->ref_rows = malloc(sizeof(uint16_t) * (size_t)(T * H));
  fz->y_rows = malloc(sizeof(uint16_t) * (size_t)(T * H));
  bad |= !fz->image || !fz->after || !fz->clean || !in->x || !in->x_sf || !in->w || !in->idx || !in->idx_wire ||
         !in->expect || !fz->ref_rows || !fz->y_rows;
  if (mm_test_create(ctx, &c->cfg, &fz->layer) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: megamoe_create: %s\n", ctx->rank, megamoe_last_error());
    fz->layer = NULL;
    fz_teardown(fz);
    return -1;
  }
  if (!bad) {
    megamoe_weights w = {fz->g.w1, fz->g.w1_sf, fz->g.w2, fz->g.w2_sf};
    if (megamoe_prepare_weights(fz->layer, &w, ctx->stream) != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
      bad = 1;
    }
  }
  bad |= megamoe_error_word(fz->layer, &fz->word) != MEGAMOE_OK;
  /* The clean run: every rank's T_max tokens as built, checked against the
   * reference; its rows are what an unchanged token must give bitwise. */
  megamoe_forward_args a = lc_args(c, &fz->g, ctx->rank);
  if (bad) a.x = NULL; /* an empty forward still keeps the peers in step */
  const megamoe_status st = megamoe_forward(fz->layer, &a, ctx->stream);
  const megamoe_status st2 = megamoe_sync(fz->layer, ctx->stream);
  if (!bad && (st != MEGAMOE_OK || st2 != MEGAMOE_OK)) {
    fprintf(stderr, "    rank %d: clean run: %s\n", ctx->rank, megamoe_last_error());
    bad = 1;
  }
  if (!bad && (lc_download(fz->g.y, T * H, fz->clean) != 0 || lc_check_output(c, &fz->d, ctx->rank, fz->g.y, "clean run") != 0))
    bad = 1;
  fz->setup_bad = bad;
  fz->failures = bad;
  fz->call = 0;
  return 0;
}

/* The reference of this rank's tokens marked FZ_ROW_REF (with this call's
 * inputs), into fz->ref_rows at their own row; 0 on success. The tokens are
 * compacted first: a row depends on its own token only. */
static int fz_reference_rows(fz_env* fz, int64_t T) {
  const int64_t H = fz->H, K = fz->K;
  int64_t n = 0;
  for (int64_t t = 0; t < T; ++t) n += fz->in.expect[t].kind == FZ_ROW_REF;
  if (n == 0) return 0;
  uint8_t* x = malloc((size_t)(n * H));
  float* x_sf = malloc(sizeof(float) * (size_t)(n * H / 128));
  int32_t* idx = malloc(sizeof(int32_t) * (size_t)(n * K));
  float* w = malloc(sizeof(float) * (size_t)(n * K));
  uint16_t* y = malloc(sizeof(uint16_t) * (size_t)(n * H));
  int rc = -1;
  if (x && x_sf && idx && w && y) {
    int64_t j = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (fz->in.expect[t].kind != FZ_ROW_REF) continue;
      memcpy(x + j * H, fz->in.x + t * H, (size_t)H);
      memcpy(x_sf + j * H / 128, fz->in.x_sf + t * H / 128, sizeof(float) * (size_t)(H / 128));
      memcpy(idx + j * K, fz->in.idx + t * K, sizeof(int32_t) * (size_t)K);
      memcpy(w + j * K, fz->in.w + t * K, sizeof(float) * (size_t)K);
      ++j;
    }
    const int64_t I = fz->c.cfg.intermediate, El = fz->d.El;
    ref_rank_data rd[MEGAMOE_MAX_RANKS];
    memset(rd, 0, sizeof rd);
    for (int r = 0; r < fz->R; ++r) {
      rd[r].w1 = fz->d.w1 + (int64_t)r * El * 2 * I * H;
      rd[r].w1_sf = fz->d.w1_sf + (int64_t)r * El * (2 * I / 128) * (H / 128);
      rd[r].w2 = fz->d.w2 + (int64_t)r * El * H * I;
      rd[r].w2_sf = fz->d.w2_sf + (int64_t)r * El * (H / 128) * (I / 128);
    }
    rd[fz->rank].num_tokens = n;
    rd[fz->rank].x = x;
    rd[fz->rank].x_sf = x_sf;
    rd[fz->rank].topk_idx = idx;
    rd[fz->rank].topk_w = w;
    rd[fz->rank].y = y;
    if (ref_layer_forward(&fz->c.cfg, fz->R, rd) == MEGAMOE_OK) {
      j = 0;
      for (int64_t t = 0; t < T; ++t)
        if (fz->in.expect[t].kind == FZ_ROW_REF) memcpy(fz->ref_rows + t * H, y + (j++) * H, sizeof(uint16_t) * (size_t)H);
      rc = 0;
    } else {
      fprintf(stderr, "    rank %d call %d: reference: %s\n", fz->rank, fz->call, megamoe_last_error());
    }
  }
  free(x);
  free(x_sf);
  free(idx);
  free(w);
  free(y);
  return rc;
}

/* Uploads the call's inputs and the filled y buffer; returns the args. */
static megamoe_forward_args fz_upload(fz_env* fz, const fz_rank_plan* q) {
  const int64_t H = fz->H, K = fz->K, T = fz->Tmax;
  const fz_inputs* in = &fz->in;
  EXPECT(cudaMemcpy(fz->x_dev + q->x_offset, in->x, (size_t)(T * H), cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(fz->x_sf_dev, in->x_sf, sizeof(float) * (size_t)(T * H / 128), cudaMemcpyHostToDevice) ==
                 cudaSuccess &&
             cudaMemcpy(fz->idx_dev, in->idx_wire, idx_size(fz) * (size_t)(T * K), cudaMemcpyHostToDevice) ==
                 cudaSuccess &&
             cudaMemcpy(fz->w_dev, in->w, sizeof(float) * (size_t)(T * K), cudaMemcpyHostToDevice) == cudaSuccess,
         "upload");
  fz_fill_image(fz->image, fz->y_total, fz->y_off, sizeof(uint16_t) * (size_t)(T * H));
  EXPECT(cudaMemcpy(fz->y_dev, fz->image, fz->y_total, cudaMemcpyHostToDevice) == cudaSuccess, "fill y");
  return fz_make_args(q, fz->x_dev, fz->x_sf_dev, fz->idx_dev, fz->w_dev, fz->y_dev + fz->y_off, fz->c.idx64);
}

/* The inputs are as uploaded (megamoe_forward reads them only). */
static void fz_check_inputs(fz_env* fz, const fz_rank_plan* q) {
  const int64_t H = fz->H, K = fz->K, T = fz->Tmax;
  const size_t bytes[4] = {(size_t)(T * H), sizeof(float) * (size_t)(T * H / 128), idx_size(fz) * (size_t)(T * K),
                           sizeof(float) * (size_t)(T * K)};
  const uint8_t* dev[4] = {fz->x_dev + q->x_offset, fz->x_sf_dev, fz->idx_dev, fz->w_dev};
  const void* host[4] = {fz->in.x, fz->in.x_sf, fz->in.idx_wire, fz->in.w};
  static const char* const name[4] = {"x", "x_sf", "topk_idx", "topk_w"};
  uint8_t* got = malloc(bytes[0] > bytes[2] ? bytes[0] : bytes[2]);
  for (int i = 0; i < 4 && got; ++i) {
    EXPECT(cudaMemcpy(got, dev[i], bytes[i], cudaMemcpyDeviceToHost) == cudaSuccess, "download %s", name[i]);
    EXPECT(memcmp(got, host[i], bytes[i]) == 0, "the forward changed its input %s", name[i]);
  }
  free(got);
}

/* The status name without its explanation. */
static void fz_status_name(megamoe_status st, char* buf, size_t n) {
  const char* s = megamoe_status_string(st);
  const char* colon = strchr(s, ':');
  snprintf(buf, n, "%.*s", colon ? (int)(colon - s) : (int)strlen(s), s);
}

/* Runs and judges one call of plan p; expect (may be NULL) replaces the
 * rows' expectations the plan gives. */
static void fz_call(const mm_rank_ctx* ctx, fz_env* fz, const fz_plan* p, const fz_row_expect* expect) {
  const fz_rank_plan* q = &p->rank[fz->rank];
  const int64_t H = fz->H, K = fz->K;
  if (fz->setup_bad) { /* keep the peers in step; this rank's test already failed */
    megamoe_forward_reject(fz->layer, MEGAMOE_ERR_INTERNAL, "fuzz setup failed on this rank", ctx->stream);
    megamoe_sync(fz->layer, ctx->stream);
    return;
  }
  const int r = fz->rank;
  fz_make_inputs(q, fz->d.x[r], fz->d.x_sf[r], fz->d.idx[r], fz->d.w[r], fz->Tmax, H, K, fz->c.cfg.has_swiglu_clamp,
                 fz->c.idx64, &fz->in);
  const fz_row_expect* ex = fz->in.expect;
  if (expect) memcpy(fz->in.expect, expect, sizeof(fz_row_expect) * (size_t)fz->Tmax);
  const megamoe_forward_args a = fz_upload(fz, q);
  const megamoe_status st = megamoe_forward(fz->layer, q->error == FZ_NULL_ARGS ? NULL : &a, ctx->stream);
  char fwd_msg[600], sync_msg[1024];
  snprintf(fwd_msg, sizeof fwd_msg, "%s", megamoe_last_error());
  const megamoe_status sst = megamoe_sync(fz->layer, ctx->stream);
  snprintf(sync_msg, sizeof sync_msg, "%s", megamoe_last_error());
  int32_t word = -1;
  EXPECT(cudaMemcpy(&word, fz->word, sizeof word, cudaMemcpyDeviceToHost) == cudaSuccess, "error word");
  EXPECT(cudaMemcpy(fz->after, fz->y_dev, fz->y_total, cudaMemcpyDeviceToHost) == cudaSuccess, "download y");
  if (fz_planted("guard") && fz->rank == 0) fz->after[fz->y_total - 1] ^= 0x01;

  if (fz_planted("status") && fz->rank == 0)
    EXPECT(p->bad_rank < 0, "planted: rank 0 expects no error (call with an error on rank %d)", p->bad_rank);
  if (p->bad_rank >= 0) {
    const int me_bad = fz->rank == p->bad_rank;
    const megamoe_status err = fz_errors[p->rank[p->bad_rank].error].status, want = err;
    if (me_bad) {
      fz->errors_seen[q->error]++;
      EXPECT(st == (fz_errors[q->error].host ? want : MEGAMOE_OK), "%s: forward gave %s: %s", fz_errors[q->error].name,
             megamoe_status_string(st), fwd_msg);
      EXPECT(sst == want, "%s: sync gave %s, want %s: %s", fz_errors[q->error].name, megamoe_status_string(sst),
             megamoe_status_string(want), sync_msg);
      char text[96];
      if (fz_errors[q->error].host) {
        snprintf(text, sizeof text, "%s", fz_errors[q->error].text);
        EXPECT(strstr(fwd_msg, text) != NULL, "forward message lacks \"%s\": %s", text, fwd_msg);
      } else {
        snprintf(text, sizeof text, "topk_idx[%lld][%d]", (long long)q->err_t, q->err_k);
      }
      EXPECT(strstr(sync_msg, text) != NULL, "sync message lacks \"%s\": %s", text, sync_msg);
      EXPECT(word == (int32_t)want, "error word %d, want %d", word, (int)want);
    } else {
      char name[64], peer[32];
      fz_status_name(err, name, sizeof name);
      snprintf(peer, sizeof peer, "peer rank %d", p->bad_rank);
      EXPECT(st == MEGAMOE_OK, "forward (a peer carries %s) gave %s: %s", name, megamoe_status_string(st), fwd_msg);
      EXPECT(sst == MEGAMOE_ERR_PEER_FAILED && strstr(sync_msg, peer) && strstr(sync_msg, name),
             "sync gave %s, want PEER_FAILED naming \"%s\" and %s: %s", megamoe_status_string(sst), peer, name,
             sync_msg);
      EXPECT(word == MEGAMOE_ERR_PEER_FAILED, "error word %d, want PEER_FAILED", word);
    }
    /* A failed forward writes nothing to any y. */
    const int64_t at = fz_changed_outside(fz->image, fz->after, fz->y_total, 0, 0);
    EXPECT(at < 0, "a failed forward wrote the y buffer at byte %lld (y starts at %zu)", (long long)at, fz->y_off);
  } else {
    const int64_t T = q->T;
    fz->calls_ok++;
    fz->zero_t += T == 0;
    fz->odd_x += q->x_offset != 0;
    EXPECT(st == MEGAMOE_OK && sst == MEGAMOE_OK && word == 0, "forward %s, sync %s, word %d: %s",
           megamoe_status_string(st), megamoe_status_string(sst), word, st != MEGAMOE_OK ? fwd_msg : sync_msg);
    const size_t owned = sizeof(uint16_t) * (size_t)(T * H);
    const int64_t at = fz_changed_outside(fz->image, fz->after, fz->y_total, fz->y_off, fz->y_off + owned);
    EXPECT(at < 0, "byte %lld of the y buffer changed: outside the %lld rows the call owns (y at %zu, %zu bytes)",
           (long long)at, (long long)T, fz->y_off, owned);
    if (T > 0) {
      memcpy(fz->y_rows, fz->after + fz->y_off, owned);
      if (fz_planted("row") && fz->rank == 0) {
        for (int64_t t = 0; t < T; ++t)
          if (ex[t].kind == FZ_ROW_SAME) {
            fz->y_rows[t * H] ^= 1u;
            break;
          }
      }
      if (fz_planted("nan") && fz->rank == 0)
        for (int64_t t = 0; t < T; ++t)
          if (ex[t].kind == FZ_ROW_NAN) {
            fz->y_rows[t * H + H - 1] = 0x3F80;
            break;
          }
      const int ref_ok = fz_reference_rows(fz, T) == 0;
      EXPECT(ref_ok, "reference rows");
      char why[600] = "";
      const int64_t t = ref_ok ? fz_judge_rows(fz->y_rows, fz->clean, fz->ref_rows, fz->in.idx, K, T, H, ex, why,
                                               sizeof why)
                               : -1;
      EXPECT(t < 0, "token %lld (%s): %s", (long long)t,
             t < 0 ? "" : ex[t].kind == FZ_ROW_NAN ? "a NaN input" : ex[t].kind == FZ_ROW_REF ? "judged against the reference" : "unchanged", why);
    }
  }
  fz_check_inputs(fz, q);
}

/* ---- the tests -------------------------------------------------------------- */

/* A small shape (always the decode tiles), top-4, 20% masked slots. */
static lc_case fz_case(const mm_rank_ctx* ctx, int G, int idx64, int clamp, uint64_t salt) {
  lc_case c = lc_make(ctx, 512, 256, 4 * ctx->num_ranks, 4, 64, salt);
  c.cfg.quant_group = G;
  c.cfg.has_swiglu_clamp = clamp;
  c.cfg.swiglu_clamp = 1.0f;
  c.idx64 = idx64;
  c.mask_ratio = 0.2;
  return c;
}

static mm_test_result fz_run(const mm_rank_ctx* ctx, const lc_case* c, int calls) {
  fz_env fz_storage;
  fz_env* fz = &fz_storage;
  if (fz_setup(ctx, fz, c) != 0) return MM_TEST_FAIL;
  mm_rng g = {c->seed ^ 0xf022f022ull};
  for (fz->call = 0; fz->call < calls; ++fz->call) {
    fz_plan p;
    fz_draw(&g, ctx->num_ranks, fz->Tmax, (int)fz->K, c->cfg.num_experts, c->idx64, &p);
    fz_call(ctx, fz, &p, NULL);
  }
  /* After all of it the layer still gives the clean run's output, bitwise. */
  fz_plan clean;
  fz_clean_plan(fz->R, fz->Tmax, &clean);
  fz_call(ctx, fz, &clean, NULL);
  if (ctx->rank == 0) {
    int errors = 0;
    for (int e = 0; e < FZ_ERROR_COUNT; ++e) errors += fz->errors_seen[e];
    printf("    rank 0: %d calls (%s, G %d, %s top-k%s): %d ran (%d with T = 0, %d with x at an odd address, %d rows "
           "NaN by a planted input, %d duplicated experts), %d carried an error of this rank (",
           calls, megamoe_arm_name(c->cfg.arm), c->cfg.quant_group, c->idx64 ? "int64" : "int32",
           c->cfg.has_swiglu_clamp ? ", clamp" : "", fz->calls_ok, fz->zero_t, fz->odd_x, fz->in.nan_rows, fz->in.dups,
           errors);
    for (int e = 0, first = 1; e < FZ_ERROR_COUNT; ++e)
      if (fz->errors_seen[e]) {
        printf("%s%s %d", first ? "" : ", ", fz_errors[e].name, fz->errors_seen[e]);
        first = 0;
      }
    printf("); %d check(s) failed\n", fz->failures);
  }
  const int bad = fz->failures != 0;
  return fz_teardown(fz) || bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

static mm_test_result t_fuzz_g128(const mm_rank_ctx* ctx) {
  const lc_case c = fz_case(ctx, 128, 0, 0, 971);
  return fz_run(ctx, &c, FZ_CALLS);
}

static mm_test_result t_fuzz_g64_clamp(const mm_rank_ctx* ctx) {
  const lc_case c = fz_case(ctx, 64, 1, 1, 972);
  return fz_run(ctx, &c, FZ_CALLS);
}

/* NaN / Inf in one expert's W1 or W2 scales (prepared into the layer on the
 * rank that owns it; the others keep theirs), all inputs clean: the rows of
 * exactly the tokens routed to that expert, on every rank. */
static mm_test_result fz_run_weight_scales(const mm_rank_ctx* ctx, const lc_case* c) {
  fz_env fz_storage;
  fz_env* fz = &fz_storage;
  if (fz_setup(ctx, fz, c) != 0) return MM_TEST_FAIL;
  const int64_t H = fz->H, I = c->cfg.intermediate, K = fz->K, El = fz->d.El, T = fz->Tmax;
  const size_t w1_sf_n = (size_t)(El * (2 * I / 128) * (H / 128)), w2_sf_n = (size_t)(El * (H / 128) * (I / 128));
  float *w1_sf = NULL, *w2_sf = NULL; /* this rank's scales, one of them poisoned */
  EXPECT(cudaMalloc((void**)&w1_sf, sizeof(float) * w1_sf_n) == cudaSuccess &&
             cudaMalloc((void**)&w2_sf, sizeof(float) * w2_sf_n) == cudaSuccess,
         "alloc");
  mm_rng g = {c->seed ^ 0x5ca1e5ull};
  fz_plan clean_plan;
  fz_clean_plan(fz->R, fz->Tmax, &clean_plan);
  fz_row_expect* expect = calloc((size_t)T, sizeof(fz_row_expect));
  EXPECT(expect != NULL, "alloc");
  for (fz->call = 0; fz->call < FZ_WEIGHT_CALLS && expect; ++fz->call) {
    const int is_w2 = fz->call & 1, is_inf = (fz->call >> 1) & 1;
    const int expert = (int)mm_rng_below(&g, (uint64_t)c->cfg.num_experts), owner = expert / (int)El;
    const int64_t local = expert % El;
    /* W1: [e][2I/128][H/128]; W2: [e][H/128][I/128] (block = the output block). */
    const int64_t row_block = (int64_t)mm_rng_below(&g, (uint64_t)(is_w2 ? H / 128 : 2 * I / 128));
    const int64_t col_block = (int64_t)mm_rng_below(&g, (uint64_t)(is_w2 ? I / 128 : H / 128));
    const int64_t per_expert = is_w2 ? (H / 128) * (I / 128) : (2 * I / 128) * (H / 128);
    const int64_t at = row_block * (is_w2 ? I / 128 : H / 128) + col_block;
    float* global = (is_w2 ? fz->d.w2_sf : fz->d.w1_sf) + expert * per_expert + at;
    const float keep = *global;
    *global = is_inf ? INFINITY : NAN; /* the reference's weights (fz_reference_rows) */
    if (ctx->rank == owner && !fz->setup_bad) {
      EXPECT(cudaMemcpy(w1_sf, fz->g.w1_sf, sizeof(float) * w1_sf_n, cudaMemcpyDeviceToDevice) == cudaSuccess &&
                 cudaMemcpy(w2_sf, fz->g.w2_sf, sizeof(float) * w2_sf_n, cudaMemcpyDeviceToDevice) == cudaSuccess &&
                 cudaMemcpy((is_w2 ? w2_sf : w1_sf) + local * per_expert + at, global, sizeof(float),
                            cudaMemcpyHostToDevice) == cudaSuccess,
             "poison");
      megamoe_weights w = {fz->g.w1, w1_sf, fz->g.w2, w2_sf};
      EXPECT(megamoe_prepare_weights(fz->layer, &w, ctx->stream) == MEGAMOE_OK, "prepare: %s", megamoe_last_error());
    }
    int routed = 0;
    for (int64_t t = 0; t < T; ++t) {
      expect[t] = fz_weight_poison_expect(is_w2, (int)row_block, is_inf, c->cfg.has_swiglu_clamp, expert,
                                          fz->d.idx[ctx->rank] + t * K, K);
      routed += expect[t].kind != FZ_ROW_SAME;
    }
    fz_call(ctx, fz, &clean_plan, expect);
    if (ctx->rank == 0)
      printf("    %s in W%d's scale [%lld][%lld] of expert %d (rank %d): %d of rank 0's %lld tokens routed there\n",
             is_inf ? "Inf" : "NaN", 1 + is_w2, (long long)row_block, (long long)col_block, expert, owner, routed,
             (long long)T);
    *global = keep;
    if (ctx->rank == owner && !fz->setup_bad) {
      megamoe_weights w = {fz->g.w1, fz->g.w1_sf, fz->g.w2, fz->g.w2_sf};
      EXPECT(megamoe_prepare_weights(fz->layer, &w, ctx->stream) == MEGAMOE_OK, "prepare: %s", megamoe_last_error());
    }
  }
  /* The clean weights back: the clean run again. */
  fz_call(ctx, fz, &clean_plan, NULL);
  free(expect);
  cudaFree(w1_sf);
  cudaFree(w2_sf);
  const int bad = fz->failures != 0;
  return fz_teardown(fz) || bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

static mm_test_result t_fuzz_weight_scales(const mm_rank_ctx* ctx) {
  const lc_case c = fz_case(ctx, 128, 0, 0, 973);
  return fz_run_weight_scales(ctx, &c);
}

static mm_test_result t_fuzz_weight_scales_clamp(const mm_rank_ctx* ctx) {
  const lc_case c = fz_case(ctx, 64, 0, 1, 974);
  return fz_run_weight_scales(ctx, &c);
}

const mm_rank_test mm_fuzz_tests[] = {
    {"fuzz: 160 random forwards (G 128, int32 top-k)", t_fuzz_g128, 1},
    {"fuzz: 160 random forwards (G 64, int64 top-k, clamp 1)", t_fuzz_g64_clamp, 1},
    {"fuzz: NaN / Inf in one expert's weight scales (G 128)", t_fuzz_weight_scales, 1},
    {"fuzz: NaN / Inf in one expert's weight scales (G 64, clamp 1)", t_fuzz_weight_scales_clamp, 1},
    {NULL, NULL, 0},
};
