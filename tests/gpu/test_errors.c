/* The error protocol on 1..8 GPUs (megamoe.h, megamoe_forward and
 * megamoe_sync): a bad value on ONE rank gives that rank the specific status
 * and its peers MEGAMOE_ERR_PEER_FAILED, with nothing written to any y, and
 * the next forward is right everywhere; errors are kept per forward (a
 * failed forward n and a right forward n + 1 back to back); the error word
 * read after graph replays without megamoe_sync; a pool too small for the
 * routing; weights prepared in place equal to copied weights, bitwise.
 *
 * The "bad" rank is the last one (rank 0 on one GPU: then there are no
 * peers). Every rank makes every collective call (create, forward, destroy)
 * whatever it found, so a failed check never leaves a peer waiting: checks
 * record into `bad` (EXPECT) instead of returning. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "layer_case.h"
#include "rank_ctx.h"

#define EXPECT LC_EXPECT

/* The name part of a status string ("MEGAMOE_ERR_NULL_POINTER"). */
static const char* status_name(megamoe_status st, char* buf, size_t n) {
  const char* s = megamoe_status_string(st);
  const char* colon = strchr(s, ':');
  snprintf(buf, n, "%.*s", colon ? (int)(colon - s) : (int)strlen(s), s);
  return buf;
}

/* ---- one layer with one case ------------------------------------------------ */
typedef struct et_env {
  lc_case c;
  lc_data d;
  lc_device g;
  megamoe_layer* layer;
  int bad_rank;
  int setup_bad; /* a local setup failure (the rank still makes every collective call) */
} et_env;

/* Builds, uploads, creates the layer (collective) and, unless skip_prepare,
 * prepares the weights. Returns 0 unless create failed (then nothing else
 * is collective: every rank got the same agreement). */
static int et_setup(const mm_rank_ctx* ctx, et_env* env, const lc_case* c, int skip_prepare) {
  memset(env, 0, sizeof *env);
  env->c = *c;
  env->bad_rank = ctx->num_ranks - 1;
  env->setup_bad = lc_build(c, ctx->num_ranks, ctx->rank, &env->d) != 0;
  if (!env->setup_bad) env->setup_bad = lc_upload(c, &env->d, ctx->rank, &env->g) != 0;
  if (mm_test_create(ctx, &c->cfg, &env->layer) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: megamoe_create: %s\n", ctx->rank, megamoe_last_error());
    lc_device_free(&env->g);
    lc_free(&env->d);
    return -1;
  }
  if (!skip_prepare && !env->setup_bad) {
    megamoe_weights w = {env->g.w1, env->g.w1_sf, env->g.w2, env->g.w2_sf};
    if (megamoe_prepare_weights(env->layer, &w, ctx->stream) != MEGAMOE_OK) {
      fprintf(stderr, "    rank %d: prepare: %s\n", ctx->rank, megamoe_last_error());
      env->setup_bad = 1;
    }
  }
  return 0;
}

static int et_teardown(et_env* env) {
  const int bad = megamoe_destroy(env->layer) != MEGAMOE_OK;
  lc_device_free(&env->g);
  lc_free(&env->d);
  return bad;
}

static int32_t read_word(megamoe_layer* layer) {
  const int32_t* p = NULL;
  int32_t w = -1;
  if (megamoe_error_word(layer, &p) != MEGAMOE_OK || cudaMemcpy(&w, p, sizeof w, cudaMemcpyDeviceToHost) != cudaSuccess)
    return -1;
  return w;
}

/* megamoe_sync, and its message copied into msg (the next call overwrites
 * megamoe_last_error). */
static megamoe_status et_sync(const mm_rank_ctx* ctx, et_env* env, char* msg, size_t n) {
  const megamoe_status st = megamoe_sync(env->layer, ctx->stream);
  snprintf(msg, n, "%s", megamoe_last_error());
  return st;
}

/* n error words in pinned memory, each -1 until a forward's word is copied
 * in (et_keep_word); NULL when the allocation failed. */
static int32_t* et_words(int n) {
  int32_t* words = NULL;
  if (cudaMallocHost((void**)&words, (size_t)n * sizeof(int32_t)) != cudaSuccess) return NULL;
  for (int i = 0; i < n; ++i) words[i] = -1;
  return words;
}

/* Copies the error word as the forwards enqueued so far leave it into
 * words[i], in stream order (no sync). */
static void et_keep_word(const mm_rank_ctx* ctx, int32_t* words, int i, const int32_t* word) {
  if (words && word) cudaMemcpyAsync(&words[i], word, sizeof(int32_t), cudaMemcpyDeviceToHost, ctx->stream);
}

/* A right forward on every rank: OK from forward and sync, y right, error
 * word 0. Returns 1 when something was wrong. */
static int et_good_forward(const mm_rank_ctx* ctx, et_env* env, const char* what) {
  int bad = 0;
  const int64_t T = env->c.tokens[ctx->rank], H = env->c.cfg.hidden;
  EXPECT(lc_poison(env->g.y, T * H) == 0, "poison");
  megamoe_forward_args a = lc_args(&env->c, &env->g, ctx->rank);
  const megamoe_status st = megamoe_forward(env->layer, &a, ctx->stream);
  EXPECT(st == MEGAMOE_OK, "%s: forward: %s", what, megamoe_last_error());
  const megamoe_status st2 = megamoe_sync(env->layer, ctx->stream);
  EXPECT(st2 == MEGAMOE_OK, "%s: sync: %s", what, megamoe_last_error());
  EXPECT(read_word(env->layer) == 0, "%s: error word %d", what, read_word(env->layer));
  EXPECT(lc_check_output(&env->c, &env->d, ctx->rank, env->g.y, what) == 0, "%s: output", what);
  return bad;
}

/* What a failed forward must show on every rank: the bad rank `want` (from
 * megamoe_sync, repeated with `bad_text` in the message), the peers
 * MEGAMOE_ERR_PEER_FAILED naming the bad rank and `want`; `word`, the error
 * word as that forward left it (read right after it: a later forward
 * overwrites the word), the same; y untouched. */
static int et_expect_failed(const mm_rank_ctx* ctx, et_env* env, megamoe_status sync_st, const char* sync_msg,
                            megamoe_status want, const char* bad_text, const void* y, int64_t n, int32_t word,
                            const char* what) {
  int bad = 0;
  char name[64], peer_text[32];
  status_name(want, name, sizeof name);
  snprintf(peer_text, sizeof peer_text, "peer rank %d", env->bad_rank);
  if (ctx->rank == env->bad_rank) {
    EXPECT(sync_st == want, "%s: sync gave %s, want %s: %s", what, megamoe_status_string(sync_st), name, sync_msg);
    EXPECT(!bad_text || strstr(sync_msg, bad_text), "%s: sync message lacks \"%s\": %s", what, bad_text, sync_msg);
    EXPECT(word == (int32_t)want, "%s: error word %d, want %d", what, word, (int)want);
  } else {
    EXPECT(sync_st == MEGAMOE_ERR_PEER_FAILED, "%s: sync gave %s, want PEER_FAILED: %s", what,
           megamoe_status_string(sync_st), sync_msg);
    EXPECT(strstr(sync_msg, peer_text) && strstr(sync_msg, name), "%s: sync message lacks \"%s\" / \"%s\": %s", what,
           peer_text, name, sync_msg);
    EXPECT(word == MEGAMOE_ERR_PEER_FAILED, "%s: error word %d, want PEER_FAILED", what, word);
  }
  EXPECT(lc_still_poisoned(y, n), "%s: y was written by a failed forward", what);
  return bad;
}

/* ---- host rejections on one rank ---------------------------------------------- */
typedef enum reject_kind {
  REJECT_NULL_X,
  REJECT_ABOVE_TMAX,
  REJECT_MISALIGNED_Y,
  REJECT_BOUND_BELOW_T,
  REJECT_NULL_ARGS,
  REJECT_WEIGHTS_NOT_READY
} reject_kind;

static mm_test_result et_reject(const mm_rank_ctx* ctx, reject_kind kind, megamoe_status want, const char* arg,
                                uint64_t salt) {
  lc_case c = lc_make(ctx, 512, 384, 4 * ctx->num_ranks, 2, 96, salt);
  c.mask_ratio = 0.1;
  et_env env;
  if (et_setup(ctx, &env, &c, kind == REJECT_WEIGHTS_NOT_READY && ctx->rank == ctx->num_ranks - 1) != 0)
    return MM_TEST_FAIL;
  int bad = env.setup_bad;
  const int64_t T = c.tokens[ctx->rank], H = c.cfg.hidden;
  const int me_bad = ctx->rank == env.bad_rank;
  EXPECT(lc_poison(env.g.y, T * H) == 0, "poison");
  megamoe_forward_args a = lc_args(&c, &env.g, ctx->rank);
  const megamoe_forward_args* pa = &a;
  if (me_bad) switch (kind) {
      case REJECT_NULL_X: a.x = NULL; break;
      case REJECT_ABOVE_TMAX: a.num_tokens = c.cfg.max_tokens_per_rank + 1; break;
      case REJECT_MISALIGNED_Y: a.y = (char*)a.y + 2; break;
      case REJECT_BOUND_BELOW_T: a.num_tokens_bound = a.num_tokens - 1; break;
      case REJECT_NULL_ARGS: pa = NULL; break;
      case REJECT_WEIGHTS_NOT_READY: break;
    }
  const megamoe_status st = megamoe_forward(env.layer, pa, ctx->stream);
  char forward_msg[512];
  snprintf(forward_msg, sizeof forward_msg, "%s", megamoe_last_error());
  if (me_bad) {
    EXPECT(st == want, "forward gave %s, want %s: %s", megamoe_status_string(st), megamoe_status_string(want),
           forward_msg);
    EXPECT(strstr(forward_msg, arg) != NULL, "forward message lacks \"%s\": %s", arg, forward_msg);
  } else {
    EXPECT(st == MEGAMOE_OK, "forward: %s", forward_msg);
  }
  char sync_msg[1024];
  const megamoe_status st2 = et_sync(ctx, &env, sync_msg, sizeof sync_msg);
  bad |= et_expect_failed(ctx, &env, st2, sync_msg, want, arg, env.g.y, T * H, read_word(env.layer),
                          "rejected forward");
  /* The error is reported once: the next sync is clean. */
  EXPECT(megamoe_sync(env.layer, ctx->stream) == MEGAMOE_OK, "second sync: %s", megamoe_last_error());
  if (kind == REJECT_WEIGHTS_NOT_READY && me_bad && !env.setup_bad) {
    megamoe_weights w = {env.g.w1, env.g.w1_sf, env.g.w2, env.g.w2_sf};
    EXPECT(megamoe_prepare_weights(env.layer, &w, ctx->stream) == MEGAMOE_OK, "prepare: %s", megamoe_last_error());
  }
  /* The layer is usable on every rank: the next forward is right. */
  bad |= et_good_forward(ctx, &env, "forward after the rejection");
  bad |= et_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

static mm_test_result t_reject_null_x(const mm_rank_ctx* ctx) {
  return et_reject(ctx, REJECT_NULL_X, MEGAMOE_ERR_NULL_POINTER, "args->x", 901);
}
static mm_test_result t_reject_above_tmax(const mm_rank_ctx* ctx) {
  return et_reject(ctx, REJECT_ABOVE_TMAX, MEGAMOE_ERR_TOO_MANY_TOKENS, "num_tokens", 902);
}
static mm_test_result t_reject_misaligned_y(const mm_rank_ctx* ctx) {
  return et_reject(ctx, REJECT_MISALIGNED_Y, MEGAMOE_ERR_BAD_ARGUMENT, "args->y", 903);
}
static mm_test_result t_reject_bound_below_t(const mm_rank_ctx* ctx) {
  return et_reject(ctx, REJECT_BOUND_BELOW_T, MEGAMOE_ERR_TOO_MANY_TOKENS, "num_tokens_bound", 904);
}
static mm_test_result t_reject_null_args(const mm_rank_ctx* ctx) {
  return et_reject(ctx, REJECT_NULL_ARGS, MEGAMOE_ERR_NULL_POINTER, "args", 905);
}
static mm_test_result t_reject_weights_not_ready(const mm_rank_ctx* ctx) {
  return et_reject(ctx, REJECT_WEIGHTS_NOT_READY, MEGAMOE_ERR_WEIGHTS_NOT_READY, "megamoe_prepare_weights", 906);
}

/* A NULL layer enqueues nothing and says so. */
static mm_test_result t_null_layer(const mm_rank_ctx* ctx) {
  megamoe_forward_args a;
  memset(&a, 0, sizeof a);
  CHECK_STATUS(megamoe_forward(NULL, &a, ctx->stream), MEGAMOE_ERR_NULL_POINTER);
  CHECK(strstr(megamoe_last_error(), "layer") != NULL);
  const int32_t* w = NULL;
  CHECK_STATUS(megamoe_error_word(NULL, &w), MEGAMOE_ERR_NULL_POINTER);
  CHECK_STATUS(megamoe_sync(NULL, ctx->stream), MEGAMOE_ERR_NULL_POINTER);
  /* A call that succeeds clears the message, so the next check reads this call's own. */
  const megamoe_config cfg = megamoe_config_make(512, 256, 8, 2, 64);
  CHECK_STATUS(megamoe_check_config(&cfg, 1), MEGAMOE_OK);
  CHECK_STATUS(megamoe_set_programmatic_launch(NULL, 1), MEGAMOE_ERR_NULL_POINTER);
  CHECK(strstr(megamoe_last_error(), "layer") != NULL);
  return MM_TEST_PASS;
}

/* ---- errors keyed by forward --------------------------------------------------- */

/* Forward n with a bad top-k index on the bad rank and a right forward n + 1
 * are enqueued back to back with no sync between: forward n fails on every
 * rank (bad index there, PEER_FAILED on the peers, nothing written to its
 * y), forward n + 1 is right on every rank, the error words say so, and the
 * one megamoe_sync reports forward n's error. */
static mm_test_result t_device_error_then_right(const mm_rank_ctx* ctx) {
  lc_case c = lc_make(ctx, 512, 256, 4 * ctx->num_ranks, 3, 80, 910);
  et_env env;
  if (et_setup(ctx, &env, &c, 0) != 0) return MM_TEST_FAIL;
  int bad = env.setup_bad;
  const int64_t T = c.tokens[ctx->rank], H = c.cfg.hidden, K = c.cfg.top_k;
  const int me_bad = ctx->rank == env.bad_rank;
  void *y1 = NULL, *idx_bad = NULL;
  EXPECT(cudaMalloc(&y1, sizeof(uint16_t) * (size_t)(T * H) + 16) == cudaSuccess, "alloc");
  EXPECT(cudaMalloc(&idx_bad, sizeof(int32_t) * (size_t)(T * K)) == cudaSuccess, "alloc");
  int32_t* words = et_words(2);
  EXPECT(words != NULL, "pinned alloc");
  const int slot = (int)(T / 2) * (int)K + 1;
  if (!bad) {
    int32_t* h = malloc(sizeof(int32_t) * (size_t)(T * K));
    memcpy(h, env.d.idx[ctx->rank], sizeof(int32_t) * (size_t)(T * K));
    h[slot] = me_bad ? -5 : h[slot];
    EXPECT(cudaMemcpy(idx_bad, h, sizeof(int32_t) * (size_t)(T * K), cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    free(h);
  }
  EXPECT(lc_poison(y1, T * H) == 0 && lc_poison(env.g.y, T * H) == 0, "poison");
  const int32_t* word = NULL;
  EXPECT(megamoe_error_word(env.layer, &word) == MEGAMOE_OK, "error word: %s", megamoe_last_error());
  megamoe_forward_args a1 = lc_args(&c, &env.g, ctx->rank);
  a1.topk_idx = idx_bad;
  a1.y = y1;
  megamoe_forward_args a2 = lc_args(&c, &env.g, ctx->rank);
  EXPECT(megamoe_forward(env.layer, &a1, ctx->stream) == MEGAMOE_OK, "forward n: %s", megamoe_last_error());
  et_keep_word(ctx, words, 0, word);
  EXPECT(megamoe_forward(env.layer, &a2, ctx->stream) == MEGAMOE_OK, "forward n+1: %s", megamoe_last_error());
  et_keep_word(ctx, words, 1, word);
  char msg[1024];
  const megamoe_status st = et_sync(ctx, &env, msg, sizeof msg);
  char where[64];
  snprintf(where, sizeof where, "topk_idx[%d][%d]", slot / (int)K, slot % (int)K);
  bad |= et_expect_failed(ctx, &env, st, msg, MEGAMOE_ERR_BAD_TOPK_INDEX, where, y1, T * H, words ? words[0] : -1,
                          "forward n");
  if (words) {
    EXPECT(words[0] == (me_bad ? MEGAMOE_ERR_BAD_TOPK_INDEX : MEGAMOE_ERR_PEER_FAILED), "word after forward n: %d",
           words[0]);
    EXPECT(words[1] == 0, "word after forward n+1: %d (forward n's error leaked into it)", words[1]);
  }
  EXPECT(read_word(env.layer) == 0, "error word now %d", read_word(env.layer));
  EXPECT(lc_check_output(&c, &env.d, ctx->rank, env.g.y, "forward n+1") == 0, "forward n+1 output");
  EXPECT(megamoe_sync(env.layer, ctx->stream) == MEGAMOE_OK, "second sync: %s", megamoe_last_error());
  bad |= et_good_forward(ctx, &env, "forward n+2");
  cudaFree(y1);
  cudaFree(idx_bad);
  cudaFreeHost(words);
  bad |= et_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* Forward n rejected on the bad rank's host (it ran empty, fast) while the
 * peers run a heavy forward n; forward n + 1 right everywhere, enqueued at
 * once. The bad rank reaches the next forward's barriers while its peers
 * still look at forward n's: the peers must still see forward n's error
 * (the flag compare is >=, and the banks keep barrier n's error bits). */
static mm_test_result t_peer_error_back_to_back(const mm_rank_ctx* ctx) {
  lc_case c = lc_make(ctx, 1024, 512, 4 * ctx->num_ranks, 4, 256, 920);
  et_env env;
  if (et_setup(ctx, &env, &c, 0) != 0) return MM_TEST_FAIL;
  int bad = env.setup_bad;
  const int64_t T = c.tokens[ctx->rank], H = c.cfg.hidden;
  const int me_bad = ctx->rank == env.bad_rank;
  void* y1 = NULL;
  EXPECT(cudaMalloc(&y1, sizeof(uint16_t) * (size_t)(T * H) + 16) == cudaSuccess, "alloc");
  int32_t* words = et_words(2);
  EXPECT(words != NULL, "pinned alloc");
  EXPECT(lc_poison(y1, T * H) == 0 && lc_poison(env.g.y, T * H) == 0, "poison");
  const int32_t* word = NULL;
  EXPECT(megamoe_error_word(env.layer, &word) == MEGAMOE_OK, "error word");
  for (int round = 0; round < 3; ++round) {
    megamoe_forward_args a1 = lc_args(&c, &env.g, ctx->rank);
    a1.y = y1;
    if (me_bad) a1.x = NULL;
    const megamoe_status s1 = megamoe_forward(env.layer, &a1, ctx->stream);
    EXPECT(s1 == (me_bad ? MEGAMOE_ERR_NULL_POINTER : MEGAMOE_OK), "round %d forward n: %s", round,
           megamoe_last_error());
    et_keep_word(ctx, words, 0, word);
    megamoe_forward_args a2 = lc_args(&c, &env.g, ctx->rank);
    EXPECT(megamoe_forward(env.layer, &a2, ctx->stream) == MEGAMOE_OK, "round %d forward n+1: %s", round,
           megamoe_last_error());
    et_keep_word(ctx, words, 1, word);
    char msg[1024];
    const megamoe_status st = et_sync(ctx, &env, msg, sizeof msg);
    bad |= et_expect_failed(ctx, &env, st, msg, MEGAMOE_ERR_NULL_POINTER, "args->x", y1, T * H,
                            words ? words[0] : -1, "forward n");
    if (words) {
      EXPECT(words[0] == (me_bad ? MEGAMOE_ERR_NULL_POINTER : MEGAMOE_ERR_PEER_FAILED), "round %d word n: %d", round,
             words[0]);
      EXPECT(words[1] == 0, "round %d word n+1: %d", round, words[1]);
    }
    EXPECT(lc_check_output(&c, &env.d, ctx->rank, env.g.y, "forward n+1") == 0, "round %d output n+1", round);
    EXPECT(lc_poison(env.g.y, T * H) == 0, "poison");
  }
  cudaFree(y1);
  cudaFreeHost(words);
  bad |= et_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* One forward captured in a CUDA graph, replayed twice with no megamoe_sync
 * between: first with a bad top-k index on the bad rank (copied into the
 * captured buffer on the stream), then with the right one. The error word,
 * copied after each replay to pinned memory, says which replay failed on
 * which rank; the second replay's y is right; megamoe_sync then reports the
 * first replay's error once. */
static mm_test_result t_graph_error_word(const mm_rank_ctx* ctx) {
  lc_case c = lc_make(ctx, 512, 384, 4 * ctx->num_ranks, 3, 64, 930);
  et_env env;
  if (et_setup(ctx, &env, &c, 0) != 0) return MM_TEST_FAIL;
  int bad = env.setup_bad;
  const int64_t T = c.tokens[ctx->rank], H = c.cfg.hidden, K = c.cfg.top_k;
  const int me_bad = ctx->rank == env.bad_rank;
  const size_t idx_bytes = sizeof(int32_t) * (size_t)(T * K);
  void *idx_good = NULL, *idx_bad = NULL;
  EXPECT(cudaMalloc(&idx_good, idx_bytes) == cudaSuccess && cudaMalloc(&idx_bad, idx_bytes) == cudaSuccess, "alloc");
  int32_t* words = et_words(3);
  EXPECT(words != NULL, "pinned alloc");
  if (!bad) {
    int32_t* h = malloc(idx_bytes);
    memcpy(h, env.d.idx[ctx->rank], idx_bytes);
    EXPECT(cudaMemcpy(idx_good, h, idx_bytes, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    h[3] = c.cfg.num_experts; /* one past the last expert */
    EXPECT(cudaMemcpy(idx_bad, h, idx_bytes, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    free(h);
  }
  const int32_t* word = NULL;
  EXPECT(megamoe_error_word(env.layer, &word) == MEGAMOE_OK, "error word");
  EXPECT(cudaStreamSynchronize(ctx->stream) == cudaSuccess, "sync");
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  megamoe_forward_args a = lc_args(&c, &env.g, ctx->rank);
  EXPECT(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
  const megamoe_status cap = megamoe_forward(env.layer, &a, ctx->stream);
  EXPECT(cudaStreamEndCapture(ctx->stream, &graph) == cudaSuccess && cap == MEGAMOE_OK, "capture: %s",
         megamoe_last_error());
  EXPECT(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
  /* Every rank replays the same number of times, whatever went wrong locally. */
  for (int replay = 0; replay < 3; ++replay) {
    const void* src = (replay == 0 && me_bad) ? idx_bad : idx_good;
    if (src) cudaMemcpyAsync(env.g.idx, src, idx_bytes, cudaMemcpyDeviceToDevice, ctx->stream);
    cudaMemsetAsync(env.g.y, 0xFF, sizeof(uint16_t) * (size_t)(T * H) + 16, ctx->stream);
    if (exec) EXPECT(cudaGraphLaunch(exec, ctx->stream) == cudaSuccess, "replay %d", replay);
    et_keep_word(ctx, words, replay, word);
    if (replay == 0) {
      /* The failed replay wrote nothing to y: checked before the next replay
       * overwrites it (a plain stream sync, not megamoe_sync). */
      EXPECT(cudaStreamSynchronize(ctx->stream) == cudaSuccess, "stream sync");
      EXPECT(lc_still_poisoned(env.g.y, T * H), "the failed replay wrote y");
    }
  }
  EXPECT(cudaStreamSynchronize(ctx->stream) == cudaSuccess, "stream sync");
  if (words) {
    EXPECT(words[0] == (me_bad ? MEGAMOE_ERR_BAD_TOPK_INDEX : MEGAMOE_ERR_PEER_FAILED), "word after replay 0: %d",
           words[0]);
    EXPECT(words[1] == 0 && words[2] == 0, "words after replays 1, 2: %d %d", words[1], words[2]);
  }
  EXPECT(lc_check_output(&c, &env.d, ctx->rank, env.g.y, "replay 2") == 0, "replay output");
  char msg[1024];
  const megamoe_status st = et_sync(ctx, &env, msg, sizeof msg);
  if (me_bad) {
    EXPECT(st == MEGAMOE_ERR_BAD_TOPK_INDEX && strstr(msg, "topk_idx[1][0]"), "sync: %s: %s",
           megamoe_status_string(st), msg);
  } else {
    EXPECT(st == MEGAMOE_ERR_PEER_FAILED, "sync: %s: %s", megamoe_status_string(st), msg);
  }
  EXPECT(megamoe_sync(env.layer, ctx->stream) == MEGAMOE_OK, "second sync: %s", megamoe_last_error());
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaFree(idx_good);
  cudaFree(idx_bad);
  cudaFreeHost(words);
  bad |= et_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* ---- a pool too small for the routing ------------------------------------------- */

/* pool_imbalance 1 and every slot of every rank routed to the last rank's
 * experts: the last rank's pool overflows. It reports
 * MEGAMOE_ERR_TOO_MANY_TOKENS naming itself and the first expert that does
 * not fit, its peers MEGAMOE_ERR_PEER_FAILED, no y is written, and a
 * balanced forward on the same layer is then right everywhere. */
static mm_test_result t_pool_overflow(const mm_rank_ctx* ctx) {
  if (mm_test_arm() == MEGAMOE_ARM_FUSED) {
    /* Its ring holds any routing and it ignores pool_imbalance (megamoe.h);
     * its own capacity tests are tests/gpu/test_ring.c. */
    if (ctx->rank == 0) printf("    the fused arm keeps no pool (pool_imbalance does not apply): skipped\n");
    return MM_TEST_SKIP;
  }
  const int R = ctx->num_ranks, El = 2, K = 2;
  const int64_t Tmax = 256, Tgood = 48;
  lc_case c = lc_make(ctx, 256, 256, El * R, K, Tgood, 940);
  c.cfg.max_tokens_per_rank = Tmax;
  c.cfg.pool_imbalance = 1.0;
  et_env env;
  if (et_setup(ctx, &env, &c, 0) != 0) return MM_TEST_FAIL;
  int bad = env.setup_bad;
  const int64_t H = c.cfg.hidden;
  /* The pool: round_up(T_max K, 128) + E_l * 128 rows. */
  const int64_t P = (Tmax * K + 127) / 128 * 128 + El * 128;
  /* Every rank's every token: slot k -> expert E_l + k. The last rank's
   * local expert k gets R * T_max rows (padded to 128). */
  int expert = -1;
  int64_t offset = 0;
  for (int k = 0; k < El && expert < 0; ++k) {
    const int64_t padded = (R * Tmax + 127) / 128 * 128;
    if (offset + padded > P) expert = (R - 1) * El + k;
    offset += padded;
  }
  EXPECT(expert >= 0, "the routing was meant to overflow (P %lld)", (long long)P);
  void *x = NULL, *x_sf = NULL, *idx = NULL, *w = NULL, *y = NULL;
  EXPECT(cudaMalloc(&x, (size_t)(Tmax * H)) == cudaSuccess && cudaMalloc(&x_sf, sizeof(float) * (size_t)(Tmax * H / 128)) == cudaSuccess &&
             cudaMalloc(&idx, sizeof(int32_t) * (size_t)(Tmax * K)) == cudaSuccess &&
             cudaMalloc(&w, sizeof(float) * (size_t)(Tmax * K)) == cudaSuccess &&
             cudaMalloc(&y, sizeof(uint16_t) * (size_t)(Tmax * H) + 16) == cudaSuccess,
         "alloc");
  if (!bad) {
    int32_t* hi = malloc(sizeof(int32_t) * (size_t)(Tmax * K));
    float* hw = malloc(sizeof(float) * (size_t)(Tmax * K));
    float* hsf = malloc(sizeof(float) * (size_t)(Tmax * H / 128));
    for (int64_t i = 0; i < Tmax * K; ++i) {
      hi[i] = (R - 1) * El + (int)(i % K);
      hw[i] = 0.5f;
    }
    for (int64_t i = 0; i < Tmax * H / 128; ++i) hsf[i] = 0.01f;
    EXPECT(cudaMemcpy(idx, hi, sizeof(int32_t) * (size_t)(Tmax * K), cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemcpy(w, hw, sizeof(float) * (size_t)(Tmax * K), cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemcpy(x_sf, hsf, sizeof(float) * (size_t)(Tmax * H / 128), cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemset(x, 0x38, (size_t)(Tmax * H)) == cudaSuccess,
           "upload");
    free(hi);
    free(hw);
    free(hsf);
  }
  EXPECT(lc_poison(y, Tmax * H) == 0, "poison");
  megamoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.x = x;
  a.x_sf = (const float*)x_sf;
  a.topk_idx = idx;
  a.topk_idx_type = MEGAMOE_INDEX_INT32;
  a.topk_w = (const float*)w;
  a.num_tokens = Tmax;
  a.y = y;
  EXPECT(megamoe_forward(env.layer, &a, ctx->stream) == MEGAMOE_OK, "forward: %s", megamoe_last_error());
  char msg[1024], text[64];
  const megamoe_status st = et_sync(ctx, &env, msg, sizeof msg);
  snprintf(text, sizeof text, "expert %d (local %d)", expert, expert % El);
  bad |= et_expect_failed(ctx, &env, st, msg, MEGAMOE_ERR_TOO_MANY_TOKENS, text, y, Tmax * H, read_word(env.layer),
                          "overflow");
  if (ctx->rank == env.bad_rank) {
    char rank_text[48];
    snprintf(rank_text, sizeof rank_text, "pool of rank %d overflowed", env.bad_rank);
    EXPECT(strstr(msg, rank_text) != NULL, "message lacks \"%s\": %s", rank_text, msg);
  }
  bad |= et_good_forward(ctx, &env, "balanced forward after the overflow");
  cudaFree(x);
  cudaFree(x_sf);
  cudaFree(idx);
  cudaFree(w);
  cudaFree(y);
  bad |= et_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

/* ---- weights without a second copy -------------------------------------------------- */

/* Two layers on the same ranks and inputs: one with copied weights, one with
 * W1 rewritten in place (its W1 scales freed right after) and W2 adopted.
 * The rewritten W1 holds the documented layout, and both layers' outputs
 * are bitwise equal (and right). */
static mm_test_result t_in_place_weights(const mm_rank_ctx* ctx) {
  lc_case c = lc_make(ctx, 512, 384, 4 * ctx->num_ranks, 2, 96, 950);
  c.mask_ratio = 0.1;
  et_env env;
  if (et_setup(ctx, &env, &c, 0) != 0) return MM_TEST_FAIL;
  int bad = env.setup_bad;
  const int64_t H = c.cfg.hidden, I = c.cfg.intermediate, El = env.d.El, T = c.tokens[ctx->rank];
  const size_t w1_bytes = (size_t)(El * 2 * I * H), w1_sf_bytes = sizeof(float) * (size_t)(El * (2 * I / 128) * (H / 128));
  void *w1 = NULL, *w1_sf = NULL, *y2 = NULL;
  EXPECT(cudaMalloc(&w1, w1_bytes) == cudaSuccess && cudaMalloc(&w1_sf, w1_sf_bytes) == cudaSuccess &&
             cudaMalloc(&y2, sizeof(uint16_t) * (size_t)(T * H) + 16) == cudaSuccess,
         "alloc");
  if (!bad)
    EXPECT(cudaMemcpy(w1, env.g.w1, w1_bytes, cudaMemcpyDeviceToDevice) == cudaSuccess &&
               cudaMemcpy(w1_sf, env.g.w1_sf, w1_sf_bytes, cudaMemcpyDeviceToDevice) == cudaSuccess,
           "copy");
  megamoe_layer* layer2 = NULL;
  if (mm_test_create(ctx, &c.cfg, &layer2) != MEGAMOE_OK) {
    fprintf(stderr, "    rank %d: create (second layer): %s\n", ctx->rank, megamoe_last_error());
    cudaFree(w1);
    cudaFree(w1_sf);
    cudaFree(y2);
    et_teardown(&env);
    return MM_TEST_FAIL;
  }
  if (!bad) {
    EXPECT(megamoe_prepare_weights_in_place(layer2, w1, (const float*)w1_sf, env.g.w2, (const float*)env.g.w2_sf,
                                            ctx->stream) == MEGAMOE_OK,
           "in place: %s", megamoe_last_error());
    EXPECT(cudaFree(w1_sf) == cudaSuccess, "free w1_sf");
    w1_sf = NULL;
    /* The documented layout: per expert, 64-row gate and up chunks alternate. */
    uint8_t* got = malloc(w1_bytes);
    EXPECT(got && cudaMemcpy(got, w1, w1_bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
    const uint8_t* ck = env.d.w1 + (int64_t)ctx->rank * El * 2 * I * H;
    long wrong = 0;
    for (int64_t e = 0; got && e < El; ++e)
      for (int64_t r = 0; r < 2 * I; ++r) {
        const int64_t chunk = r / 64, pair = chunk / 2;
        const int64_t src = (chunk % 2 == 0 ? 0 : I) + pair * 64 + r % 64;
        wrong += memcmp(got + (e * 2 * I + r) * H, ck + (e * 2 * I + src) * H, (size_t)H) != 0;
      }
    EXPECT(wrong == 0, "%ld rows of the rewritten W1 are not in the documented layout", wrong);
    free(got);
  }
  /* Both layers, same inputs (every rank runs both forwards in the same order). */
  megamoe_forward_args a = lc_args(&c, &env.g, ctx->rank);
  EXPECT(lc_poison(env.g.y, T * H) == 0 && lc_poison(y2, T * H) == 0, "poison");
  EXPECT(megamoe_forward(env.layer, &a, ctx->stream) == MEGAMOE_OK, "forward (copy): %s", megamoe_last_error());
  a.y = y2;
  EXPECT(megamoe_forward(layer2, &a, ctx->stream) == MEGAMOE_OK, "forward (in place): %s", megamoe_last_error());
  EXPECT(megamoe_sync(env.layer, ctx->stream) == MEGAMOE_OK, "sync (copy): %s", megamoe_last_error());
  EXPECT(megamoe_sync(layer2, ctx->stream) == MEGAMOE_OK, "sync (in place): %s", megamoe_last_error());
  EXPECT(lc_check_output(&c, &env.d, ctx->rank, env.g.y, "copied weights") == 0, "copy output");
  if (T > 0) {
    const size_t bytes = sizeof(uint16_t) * (size_t)(T * H);
    uint8_t* h1 = malloc(bytes);
    uint8_t* h2 = malloc(bytes);
    EXPECT(h1 && h2 && cudaMemcpy(h1, env.g.y, bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
               cudaMemcpy(h2, y2, bytes, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(h1, h2, bytes) == 0,
           "in-place output differs bitwise from the copied weights' output");
    free(h1);
    free(h2);
  }
  bad |= megamoe_destroy(layer2) != MEGAMOE_OK;
  cudaFree(w1);
  cudaFree(w1_sf);
  cudaFree(y2);
  bad |= et_teardown(&env);
  return bad ? MM_TEST_FAIL : MM_TEST_PASS;
}

const mm_rank_test mm_error_tests[] = {
    {"errors: NULL x on one rank", t_reject_null_x, 1},
    {"errors: T above T_max on one rank", t_reject_above_tmax, 1},
    {"errors: misaligned y on one rank", t_reject_misaligned_y, 1},
    {"errors: token bound below T on one rank", t_reject_bound_below_t, 1},
    {"errors: NULL args on one rank", t_reject_null_args, 1},
    {"errors: weights not prepared on one rank", t_reject_weights_not_ready, 1},
    {"errors: NULL layer enqueues nothing", t_null_layer, 1},
    {"errors: device error of forward n, right forward n+1 back to back", t_device_error_then_right, 1},
    {"errors: peer error kept over back-to-back forwards (>=, banks)", t_peer_error_back_to_back, 1},
    {"errors: error word after graph replays, no megamoe_sync", t_graph_error_word, 1},
    {"memory: pool overflow reported, ranks in step, layer usable", t_pool_overflow, 2},
    {"memory: weights in place bitwise equal to copied weights", t_in_place_weights, 1},
    {NULL, NULL, 0},
};
