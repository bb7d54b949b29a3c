/* `megamoe soak` on the GPUs (soak.h): one process per rank.
 *
 * Per rank: the global weights drawn on the host (every rank draws all of
 * them: the CPU reference routes a token to any expert), its own experts on
 * the device. A warm-up per arm first (create, 50 drawn forwards, destroy),
 * so every kernel is loaded and NCCL's once-per-communicator resources are in
 * place before the device memory and the open file descriptors are counted. Then one layer per
 * arm and --calls forwards on each: every call draws T per rank, the bound,
 * the skew, the mask and the index type (soak_draw_call, the same on every
 * rank), this rank's routing and tokens; y of every arm is poisoned (0xFF)
 * first, including 256 bytes past T_max rows. Checks per call and arm: the
 * forward's status, no poison left in rows [0, T) (every element written),
 * no byte written past row T, and for the other arms y bitwise equal to the
 * staged arm's; every --ref-every calls, each arm against the CPU reference
 * token by token (megamoe_check_output, the GPU tests' bounds). Then the
 * layers are destroyed and memory and descriptors counted again, then
 * --cycles create/prepare/forward/destroy cycles and counted once more. The
 * counts are reduced over the ranks and rank 0 prints the report; any
 * mismatch, error or drift fails the run.
 *
 * Every rank makes every collective call (create, forward, destroy,
 * reductions) whatever happened locally, so a local failure is reported
 * instead of leaving a peer waiting. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench.h"
#include "cli.h"
#include "host/colocated.h"
#include "host/procs.h"
#include "megamoe.h"
#include "soak.h"

#define SOAK_GUARD_BYTES 256 /* poisoned bytes past T_max rows of y: none may be written */
#define SOAK_SAY_LIMIT 5     /* messages of one kind a rank prints */
#define SOAK_TIMEOUT_S 30.0  /* the layers' deadline: a hang ends the call, not the run */
#define SOAK_WARM_CALLS (2 * SOAK_EDGE_CYCLE) /* warm-up calls per arm, before memory is counted */

/* Counters per arm, summed over the ranks. */
enum {
  C_FORWARDS,   /* forwards run */
  C_ERRORS,     /* forwards that returned an error (create, prepare or CUDA failures count here too) */
  C_UNWRITTEN,  /* forwards that left poison (NaN) in rows [0, T) */
  C_PAST_T,     /* forwards that wrote past row T */
  C_MISMATCH,   /* forwards whose y differs bitwise from the staged arm's */
  C_REF_CALLS,  /* forwards judged against the CPU reference */
  C_REF_TOKENS, /* tokens judged */
  C_REF_FAILED, /* forwards the reference check failed */
  C_COUNT
};
/* Largest statistics of the reference checks, per arm (the max over ranks). */
enum { W_REL_ERR, W_ABS_OVER_SCALE, W_DIFF, W_COUNT };
/* Per rank: device memory and descriptors lost (before - after). */
enum { D_MEM_SOAK, D_MEM_CYCLES, D_FD_SOAK, D_FD_CYCLES, D_CYCLE_ERRORS, D_COUNT };

typedef struct soak_ctx {
  const soak_opts* o;
  int verdict_fd; /* rank 0 writes one byte: 0 pass, 1 fail */
} soak_ctx;

typedef struct soak_rank {
  const soak_opts* o;
  int rank, R, El;
  megamoe_config cfg;
  cudaStream_t stream;
  size_t y_bytes; /* T_max rows + the guard */
  /* device */
  void *w1, *w2, *x, *idx, *y[MEGAMOE_ARM_COUNT];
  float *w1_sf, *w2_sf, *x_sf, *w;
  /* host: every rank's weights (checkpoint layout), this rank's call */
  uint8_t *hw1, *hw2, *hx;
  float *hw1_sf, *hw2_sf, *hx_sf, *hw;
  int32_t* hidx;
  int64_t* hidx64;
  uint16_t *hy[MEGAMOE_ARM_COUNT], *href;
  megamoe_weights rank_weights[MEGAMOE_MAX_RANKS];
  int said; /* messages printed */
  int64_t count[MEGAMOE_ARM_COUNT][C_COUNT];
  double worst[MEGAMOE_ARM_COUNT][W_COUNT];
} soak_rank;

/* A failed call's message, the first SOAK_SAY_LIMIT times. */
static void say(soak_rank* s, const char* fmt, const char* a, const char* b, int64_t call) {
  if (s->said++ >= SOAK_SAY_LIMIT) return;
  fprintf(stderr, "soak rank %d call %lld: ", s->rank, (long long)call);
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
}

static int cuda_ok(soak_rank* s, cudaError_t e, const char* what, int64_t call) {
  if (e == cudaSuccess) return 1;
  say(s, "%s: %s", what, cudaGetErrorString(e), call);
  return 0;
}
#define CU(s, call, index) cuda_ok((s), (call), #call, (index))

/* Open file descriptors of this process: the fewest of three counts 10 ms
 * apart, so a descriptor another thread (NCCL's proxy) holds for a moment is
 * not taken for a leak. -1 when /proc cannot say. */
static int64_t open_fds(void) {
  int64_t fewest = -1;
  for (int k = 0; k < 3; ++k) {
    DIR* d = opendir("/proc/self/fd");
    if (!d) return -1;
    int64_t n = 0;
    for (struct dirent* e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    closedir(d);
    fewest = fewest < 0 || n < fewest ? n : fewest;
    if (k < 2) usleep(10000);
  }
  return fewest;
}

/* Free device memory once everything queued has run; 0 when it cannot say. */
static int64_t free_device_bytes(soak_rank* s) {
  size_t free_b = 0, total_b = 0;
  if (!CU(s, cudaDeviceSynchronize(), -1) || !CU(s, cudaMemGetInfo(&free_b, &total_b), -1)) return 0;
  return (int64_t)free_b;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every rank's weights on the host (the same draw on every rank), this
 * rank's experts on the device, the call buffers. 0 on success. */
static int setup(soak_rank* s) {
  const soak_opts* o = s->o;
  const int64_t H = o->hidden, I = o->intermediate, E = o->experts, K = o->top_k, Tm = o->max_tokens;
  const int64_t n_w1 = E * 2 * I * H, n_w2 = E * H * I;
  const int64_t n_w1_sf = E * (2 * I / 128) * (H / 128), n_w2_sf = E * (H / 128) * (I / 128);
  s->hw1 = malloc((size_t)n_w1);
  s->hw2 = malloc((size_t)n_w2);
  s->hw1_sf = malloc(sizeof(float) * (size_t)n_w1_sf);
  s->hw2_sf = malloc(sizeof(float) * (size_t)n_w2_sf);
  s->hx = malloc((size_t)(Tm * H));
  s->hx_sf = malloc(sizeof(float) * (size_t)(Tm * (H / 128)));
  s->hidx = malloc(sizeof(int32_t) * (size_t)(Tm * K));
  s->hidx64 = malloc(sizeof(int64_t) * (size_t)(Tm * K));
  s->hw = malloc(sizeof(float) * (size_t)(Tm * K));
  s->href = malloc(sizeof(uint16_t) * (size_t)(Tm * H));
  int bad = !s->hw1 || !s->hw2 || !s->hw1_sf || !s->hw2_sf || !s->hx || !s->hx_sf || !s->hidx || !s->hidx64 || !s->hw ||
            !s->href;
  for (int a = 0; a < o->num_arms; ++a) bad |= !(s->hy[a] = malloc(s->y_bytes));
  if (bad) {
    fprintf(stderr, "soak rank %d: out of host memory (the weights of all %lld experts: %.1f MiB)\n", s->rank,
            (long long)E, (n_w1 + n_w2) / 1048576.0);
    return -1;
  }
  /* Weights ~ N(0, 64^2) in e4m3 with block scales (0.5 + u) / 64 / sqrt(K_dim): activations stay O(1). */
  mm_bench_rng g = mm_bench_rng_make(o->seed * 0x9e3779b97f4a7c15ull + 11);
  mm_bench_host_fp8(&g, s->hw1, n_w1, 64);
  mm_bench_host_fp8(&g, s->hw2, n_w2, 64);
  for (int64_t i = 0; i < n_w1_sf; ++i) s->hw1_sf[i] = (float)((0.5 + mm_bench_rng_uniform(&g)) / 64.0 / sqrt((double)H));
  for (int64_t i = 0; i < n_w2_sf; ++i) s->hw2_sf[i] = (float)((0.5 + mm_bench_rng_uniform(&g)) / 64.0 / sqrt((double)I));
  const int64_t El = s->El;
  for (int r = 0; r < s->R; ++r)
    s->rank_weights[r] = (megamoe_weights){s->hw1 + r * El * 2 * I * H, s->hw1_sf + r * El * (2 * I / 128) * (H / 128),
                                           s->hw2 + r * El * H * I, s->hw2_sf + r * El * (H / 128) * (I / 128)};
  const megamoe_weights* mine = &s->rank_weights[s->rank];
  const size_t b_w1 = (size_t)(El * 2 * I * H), b_w2 = (size_t)(El * H * I);
  const size_t b_w1_sf = sizeof(float) * (size_t)(El * (2 * I / 128) * (H / 128));
  const size_t b_w2_sf = sizeof(float) * (size_t)(El * (H / 128) * (I / 128));
  bad |= !CU(s, cudaMalloc(&s->w1, b_w1), -1) || !CU(s, cudaMalloc(&s->w2, b_w2), -1) ||
         !CU(s, cudaMalloc((void**)&s->w1_sf, b_w1_sf), -1) || !CU(s, cudaMalloc((void**)&s->w2_sf, b_w2_sf), -1) ||
         !CU(s, cudaMalloc(&s->x, (size_t)(Tm * H)), -1) ||
         !CU(s, cudaMalloc((void**)&s->x_sf, sizeof(float) * (size_t)(Tm * (H / 128))), -1) ||
         !CU(s, cudaMalloc(&s->idx, sizeof(int64_t) * (size_t)(Tm * K)), -1) ||
         !CU(s, cudaMalloc((void**)&s->w, sizeof(float) * (size_t)(Tm * K)), -1);
  for (int a = 0; a < o->num_arms && !bad; ++a) bad |= !CU(s, cudaMalloc(&s->y[a], s->y_bytes), -1);
  if (bad) return -1;
  bad |= !CU(s, cudaMemcpy(s->w1, mine->w1, b_w1, cudaMemcpyHostToDevice), -1) ||
         !CU(s, cudaMemcpy(s->w2, mine->w2, b_w2, cudaMemcpyHostToDevice), -1) ||
         !CU(s, cudaMemcpy(s->w1_sf, mine->w1_sf, b_w1_sf, cudaMemcpyHostToDevice), -1) ||
         !CU(s, cudaMemcpy(s->w2_sf, mine->w2_sf, b_w2_sf, cudaMemcpyHostToDevice), -1);
  return bad ? -1 : 0;
}

static void teardown(soak_rank* s) {
  void* dev[] = {s->w1, s->w2, s->w1_sf, s->w2_sf, s->x, s->x_sf, s->idx, s->w};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) cudaFree(dev[i]);
  void* host[] = {s->hw1, s->hw2, s->hw1_sf, s->hw2_sf, s->hx, s->hx_sf, s->hidx, s->hidx64, s->hw, s->href};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) free(host[i]);
  for (int a = 0; a < MEGAMOE_ARM_COUNT; ++a) {
    cudaFree(s->y[a]);
    free(s->hy[a]);
  }
}

/* Draws this rank's routing and tokens of a call and uploads them (in stream
 * order). 0 on success. */
static int stage_inputs(soak_rank* s, const soak_call* call) {
  const int64_t T = call->tokens[s->rank], H = s->o->hidden, K = s->o->top_k;
  if (soak_draw_routing(s->o, call, s->rank, s->hidx, s->hw) != 0) {
    say(s, "%s%s", "out of host memory drawing the routing", "", call->index);
    return -1;
  }
  mm_bench_rng g = mm_bench_rng_make(soak_input_seed(call, s->rank));
  mm_bench_host_tokens(&g, s->hx, s->hx_sf, T, H);
  size_t idx_bytes = sizeof(int32_t) * (size_t)(T * K);
  const void* idx_src = s->hidx;
  if (call->idx64) {
    for (int64_t i = 0; i < T * K; ++i) s->hidx64[i] = s->hidx[i];
    idx_bytes = sizeof(int64_t) * (size_t)(T * K);
    idx_src = s->hidx64;
  }
  if (T == 0) return 0;
  const int ok = CU(s, cudaMemcpyAsync(s->x, s->hx, (size_t)(T * H), cudaMemcpyHostToDevice, s->stream), call->index) &&
                 CU(s, cudaMemcpyAsync(s->x_sf, s->hx_sf, sizeof(float) * (size_t)(T * (H / 128)), cudaMemcpyHostToDevice,
                                       s->stream), call->index) &&
                 CU(s, cudaMemcpyAsync(s->idx, idx_src, idx_bytes, cudaMemcpyHostToDevice, s->stream), call->index) &&
                 CU(s, cudaMemcpyAsync(s->w, s->hw, sizeof(float) * (size_t)(T * K), cudaMemcpyHostToDevice, s->stream),
                    call->index);
  return ok ? 0 : -1;
}

static megamoe_forward_args forward_args(const soak_rank* s, const soak_call* call, int arm_slot) {
  megamoe_forward_args a = {s->x,  s->x_sf, s->idx, call->idx64 ? MEGAMOE_INDEX_INT64 : MEGAMOE_INDEX_INT32,
                            s->w, call->tokens[s->rank], call->bound, s->y[arm_slot]};
  return a;
}

/* Poisons y, runs one forward and waits for it. The forward is made even
 * when the poisoning failed (the peers wait for it). */
static megamoe_status forward_once(soak_rank* s, megamoe_layer* layer, const soak_call* call, int arm_slot) {
  const int poisoned = CU(s, cudaMemsetAsync(s->y[arm_slot], 0xFF, s->y_bytes, s->stream), call->index);
  megamoe_forward_args a = forward_args(s, call, arm_slot);
  megamoe_status st = megamoe_forward(layer, &a, s->stream);
  const megamoe_status st2 = megamoe_sync(layer, s->stream);
  if (st == MEGAMOE_OK) st = st2;
  if (st != MEGAMOE_OK) say(s, "forward: %s: %s", megamoe_status_string(st), megamoe_last_error(), call->index);
  return st == MEGAMOE_OK && !poisoned ? MEGAMOE_ERR_CUDA : st;
}

/* Elements of y [0, n) that are NaN or Inf: poison the forward left. */
static int64_t nonfinite(const uint16_t* y, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += (y[i] & 0x7F80) == 0x7F80;
  return bad;
}

/* 1 when a byte of y past row T was written. */
static int written_past(const soak_rank* s, const uint16_t* y, int64_t T) {
  const uint8_t* b = (const uint8_t*)y;
  for (size_t i = sizeof(uint16_t) * (size_t)(T * s->o->hidden); i < s->y_bytes; ++i)
    if (b[i] != 0xFF) return 1;
  return 0;
}

/* Judges arm_slot's y of a call (already on the host) against the reference. */
static void check_reference(soak_rank* s, int arm_slot, const soak_call* call) {
  const int64_t T = call->tokens[s->rank];
  megamoe_check_stats st;
  if (megamoe_check_output(s->hy[arm_slot], s->href, T, s->o->hidden, s->hidx, MEGAMOE_INDEX_INT32, s->o->top_k, NULL,
                           &st) != MEGAMOE_OK) {
    say(s, "megamoe_check_output: %s%s", megamoe_last_error(), "", call->index);
    s->count[arm_slot][C_REF_FAILED]++;
    return;
  }
  int64_t* c = s->count[arm_slot];
  double* w = s->worst[arm_slot];
  c[C_REF_CALLS]++;
  c[C_REF_TOKENS] += T;
  if (!st.pass) {
    c[C_REF_FAILED]++;
    say(s, "%s against the reference: %s", megamoe_arm_name(s->o->arms[arm_slot]), st.summary, call->index);
  }
  w[W_REL_ERR] = fmax(w[W_REL_ERR], st.max_rel_err);
  w[W_ABS_OVER_SCALE] = fmax(w[W_ABS_OVER_SCALE], st.max_abs_over_scale);
  if (isfinite(st.diff)) w[W_DIFF] = fmax(w[W_DIFF], st.diff);
}

/* One call on every arm's layer (layers[a] NULL: the arm is not built). */
static void soak_call_once(soak_rank* s, megamoe_layer* const* layers, const soak_call* call, int with_reference) {
  const soak_opts* o = s->o;
  const int64_t T = call->tokens[s->rank], H = o->hidden;
  const int staged_ok = stage_inputs(s, call) == 0;
  int have_reference = 0;
  if (with_reference && staged_ok) {
    megamoe_forward_args host = {s->hx, s->hx_sf, s->hidx, MEGAMOE_INDEX_INT32, s->hw, T, 0, s->href};
    have_reference = megamoe_reference_forward(&s->cfg, s->R, s->rank_weights, &host) == MEGAMOE_OK;
    if (!have_reference) say(s, "the CPU reference: %s%s", megamoe_last_error(), "", call->index);
  }
  int staged_good = 0; /* the staged arm's y of this call is on the host */
  for (int a = 0; a < o->num_arms; ++a) {
    if (!layers[a]) continue;
    int64_t* c = s->count[a];
    c[C_FORWARDS]++;
    const megamoe_status st = forward_once(s, layers[a], call, a);
    if (st != MEGAMOE_OK || !staged_ok ||
        !CU(s, cudaMemcpy(s->hy[a], s->y[a], s->y_bytes, cudaMemcpyDeviceToHost), call->index)) {
      c[C_ERRORS]++;
      continue;
    }
    const int64_t unwritten = nonfinite(s->hy[a], T * H);
    if (unwritten) {
      c[C_UNWRITTEN]++;
      char n[32];
      snprintf(n, sizeof n, "%lld", (long long)unwritten);
      say(s, "%s: %s elements of rows [0, T) not written (NaN)", megamoe_arm_name(o->arms[a]), n, call->index);
    }
    if (written_past(s, s->hy[a], T)) {
      c[C_PAST_T]++;
      say(s, "%s: %s", megamoe_arm_name(o->arms[a]), "a byte of y past row T was written", call->index);
    }
    if (a == 0) {
      staged_good = 1;
    } else if (!staged_good || memcmp(s->hy[a], s->hy[0], sizeof(uint16_t) * (size_t)(T * H)) != 0) {
      c[C_MISMATCH]++;
      say(s, "%s: %s", megamoe_arm_name(o->arms[a]),
          staged_good ? "y differs bitwise from the staged arm's" : "no staged output to compare with", call->index);
    }
    if (have_reference) check_reference(s, a, call);
  }
}

/* What the draws covered (the same on every rank). */
typedef struct soak_coverage {
  int64_t some_empty, all_empty, some_full, bound[SOAK_BOUND_COUNT], skew[SOAK_SKEW_COUNT], masked[4], idx64;
} soak_coverage;

static void cover(soak_coverage* cv, const soak_call* call, int R, int64_t Tm) {
  int empty = 0, full = 0;
  for (int r = 0; r < R; ++r) {
    empty += call->tokens[r] == 0;
    full += call->tokens[r] == Tm;
  }
  cv->some_empty += empty > 0;
  cv->all_empty += empty == R;
  cv->some_full += full > 0;
  cv->bound[call->bound_kind]++;
  cv->skew[call->skew]++;
  cv->masked[call->mask_ratio == 0 ? 0 : call->mask_ratio < 0.2 ? 1 : call->mask_ratio < 1 ? 2 : 3]++;
  cv->idx64 += call->idx64;
}

/* Creates the layer of arm slot a and prepares its weights; NULL when the
 * arm is not built (*not_built set; create says so on every rank alike) or
 * create failed (counted in *failures). */
static megamoe_layer* make_layer(soak_rank* s, int a, ncclComm_t comm, int64_t* failures, int* not_built) {
  megamoe_config cfg = s->cfg;
  cfg.arm = s->o->arms[a];
  megamoe_layer* layer = NULL;
  /* No communicator: co-located ranks (--colocated). */
  const megamoe_status st = comm ? megamoe_create(&cfg, comm, &layer) : mm_create_colocated(&cfg, &layer);
  *not_built = st == MEGAMOE_ERR_NOT_IMPLEMENTED;
  if (*not_built) return NULL;
  if (st != MEGAMOE_OK) {
    say(s, "create %s: %s", megamoe_arm_name(cfg.arm), megamoe_last_error(), -1);
    (*failures)++;
    return NULL;
  }
  megamoe_weights w = {s->w1, s->w1_sf, s->w2, s->w2_sf};
  if (megamoe_prepare_weights(layer, &w, s->stream) != MEGAMOE_OK) {
    say(s, "prepare %s: %s", megamoe_arm_name(cfg.arm), megamoe_last_error(), -1);
    (*failures)++;
  }
  return layer;
}

/* Seconds a co-located rank waits for the others at the soak's own
 * collectives (the reductions, the memory counts): a whole soak may lie
 * between two of them on a slow rank. */
#define SOAK_COLOCATED_WAIT_S 3600.0

/* One collective of the co-located group, named `what`; 0 or -1 (said). */
static int colocated_call(const soak_rank* s, const char* what, const void* mine, size_t bytes, void* all) {
  const int r = mm_colocated_allgather(mm_colocated_current(NULL), s->rank, mm_colocated_tag(what), mine, bytes, all,
                                       SOAK_COLOCATED_WAIT_S);
  if (r == MM_COLOCATED_OK) return 0;
  fprintf(stderr, "soak rank %d: co-located %s: %s\n", s->rank, what,
          r == MM_COLOCATED_TIMEOUT ? "a rank did not arrive" : r == MM_COLOCATED_MISMATCH ? "the ranks are out of step"
                                                                                         : "bad arguments");
  return -1;
}

/* What the soak gathers over the ranks fits one slot of the group. */
_Static_assert(sizeof(((soak_rank*)0)->count) <= MM_COLOCATED_SLOT_BYTES &&
                   sizeof(((soak_rank*)0)->worst) <= MM_COLOCATED_SLOT_BYTES &&
                   sizeof(int64_t) * D_COUNT <= MM_COLOCATED_SLOT_BYTES,
               "the soak's counters, statistics and drift fit a co-located slot");

/* Co-located ranks share the device's free memory: every rank counts it
 * between two barriers, so no rank allocates or frees meanwhile. Otherwise
 * just the count. */
static int64_t free_device_bytes_quiet(soak_rank* s, ncclComm_t comm) {
  if (comm || s->R == 1) return free_device_bytes(s);
  if (colocated_call(s, "soak memory count", NULL, 0, NULL) != 0) return 0;
  const int64_t b = free_device_bytes(s);
  return colocated_call(s, "soak memory count", NULL, 0, NULL) != 0 ? 0 : b;
}

static int reduce(soak_rank* s, ncclComm_t comm, void* values, size_t n, ncclDataType_t type, size_t elem,
                  ncclRedOp_t op) {
  if (!comm && s->R > 1) { /* co-located: gather on the host, reduce here (the two reductions the soak makes) */
    if (!((type == ncclInt64 && op == ncclSum) || (type == ncclFloat64 && op == ncclMax))) {
      fprintf(stderr, "soak rank %d: co-located reduce: only int64 sums and double maxima\n", s->rank);
      return -1; /* the same on every rank: a bug in the caller, not a rank out of step */
    }
    uint8_t all[MEGAMOE_MAX_RANKS * MM_COLOCATED_SLOT_BYTES];
    const int rc = colocated_call(s, "soak gather", values, elem * n, all);
    for (size_t i = 0; rc == 0 && i < n; ++i)
      for (int r = 0; r < s->R; ++r) {
        if (r == s->rank) continue;
        if (type == ncclInt64) ((int64_t*)values)[i] += ((const int64_t*)all)[(size_t)r * n + i];
        else {
          const double v = ((const double*)all)[(size_t)r * n + i];
          if (v > ((double*)values)[i]) ((double*)values)[i] = v;
        }
      }
    return rc;
  }
  if (!comm) return 0; /* one co-located rank: nothing to reduce */
  void* d = NULL;
  int ok = CU(s, cudaMalloc(&d, elem * n), -1) && CU(s, cudaMemcpy(d, values, elem * n, cudaMemcpyHostToDevice), -1);
  ok = ok && ncclAllReduce(d, d, n, type, op, comm, s->stream) == ncclSuccess;
  ok = ok && CU(s, cudaStreamSynchronize(s->stream), -1) && CU(s, cudaMemcpy(values, d, elem * n, cudaMemcpyDeviceToHost), -1);
  cudaFree(d);
  return ok ? 0 : -1;
}

static int gather(soak_rank* s, ncclComm_t comm, const int64_t* mine, int64_t* all, size_t n) {
  if (!comm) return colocated_call(s, "soak gather", mine, sizeof(int64_t) * n, all); /* one rank: a copy */
  int64_t* d = NULL;
  int ok = CU(s, cudaMalloc((void**)&d, sizeof(int64_t) * n * (size_t)(s->R + 1)), -1) &&
           CU(s, cudaMemcpy(d, mine, sizeof(int64_t) * n, cudaMemcpyHostToDevice), -1);
  ok = ok && ncclAllGather(d, d + n, n, ncclInt64, comm, s->stream) == ncclSuccess;
  ok = ok && CU(s, cudaStreamSynchronize(s->stream), -1) &&
       CU(s, cudaMemcpy(all, d + n, sizeof(int64_t) * n * (size_t)s->R, cudaMemcpyDeviceToHost), -1);
  cudaFree(d);
  return ok ? 0 : -1;
}

/* Rank 0's report; returns 1 when the run failed. */
static int report(const soak_rank* s, int64_t count[][C_COUNT], double worst[][W_COUNT], const int64_t* drift,
                  const int* built, const soak_coverage* cv, double soak_s) {
  const soak_opts* o = s->o;
  const int64_t calls = o->calls;
  int failed = 0, compared = 0;
  printf("\ndraws over %lld calls: T = 0 on some rank %lld (every rank %lld), T = T_max on some rank %lld; bound",
         (long long)calls, (long long)cv->some_empty, (long long)cv->all_empty, (long long)cv->some_full);
  for (int b = 0; b < SOAK_BOUND_COUNT; ++b) printf(" %s %lld", soak_bound_name((soak_bound)b), (long long)cv->bound[b]);
  printf("; skew");
  for (int k = 0; k < SOAK_SKEW_COUNT; ++k) printf(" %s %lld", soak_skew_name((soak_skew)k), (long long)cv->skew[k]);
  printf("; masked slots 0%% %lld, 10%% %lld, 50%% %lld, 100%% %lld; int64 top-k %lld\n", (long long)cv->masked[0],
         (long long)cv->masked[1], (long long)cv->masked[2], (long long)cv->masked[3], (long long)cv->idx64);
  printf("soak loop: %.1f s (%.2f ms per call over every arm, reference calls included)\n\n", soak_s,
         calls ? soak_s * 1e3 / (double)calls : 0.0);
  printf("%-7s %7s %7s %10s %7s %11s %17s %9s %12s %14s %10s\n", "arm", "calls", "errors", "unwritten", "past T",
         "mismatches", "reference checks", "failed", "max rel err", "max abs/scale", "max diff");
  for (int a = 0; a < o->num_arms; ++a) {
    const char* name = megamoe_arm_name(o->arms[a]);
    if (!built[a]) {
      printf("%-7s not built (create says MEGAMOE_ERR_NOT_IMPLEMENTED): skipped\n", name);
      continue;
    }
    const int64_t* c = count[a];
    char mism[32], refs[48];
    if (a == 0) snprintf(mism, sizeof mism, "(oracle)");
    else snprintf(mism, sizeof mism, "%lld", (long long)c[C_MISMATCH]);
    snprintf(refs, sizeof refs, "%lld (%lld tok)", (long long)c[C_REF_CALLS], (long long)c[C_REF_TOKENS]);
    printf("%-7s %7lld %7lld %10lld %7lld %11s %17s %9lld %12.3e %14.3e %10.2e\n", name, (long long)(c[C_FORWARDS] / s->R),
           (long long)c[C_ERRORS], (long long)c[C_UNWRITTEN], (long long)c[C_PAST_T], mism, refs,
           (long long)c[C_REF_FAILED], worst[a][W_REL_ERR], worst[a][W_ABS_OVER_SCALE], worst[a][W_DIFF]);
    failed |= c[C_ERRORS] || c[C_UNWRITTEN] || c[C_PAST_T] || c[C_MISMATCH] || c[C_REF_FAILED];
    failed |= c[C_FORWARDS] != calls * s->R;
    compared += a > 0;
  }
  printf("(calls per rank; errors, unwritten, past T, mismatches and failures count (rank, call) pairs over %d rank(s))\n",
         s->R);
  if (compared == 0) printf("no arm besides staged is built: nothing compared bitwise\n");
  printf("\n");
  int drifted = 0;
  for (int r = 0; r < s->R; ++r) {
    const int64_t* d = drift + r * D_COUNT;
    printf("rank %d: device memory lost %lld B over the soak, %lld B over %d create/prepare/forward/destroy cycles; "
           "open file descriptors gained %lld and %lld; cycle errors %lld\n",
           r, (long long)d[D_MEM_SOAK], (long long)d[D_MEM_CYCLES], o->cycles, (long long)d[D_FD_SOAK],
           (long long)d[D_FD_CYCLES], (long long)d[D_CYCLE_ERRORS]);
    for (int k = 0; k < D_COUNT; ++k) drifted |= d[k] != 0;
  }
  printf("\nsoak: %s\n", failed    ? "FAIL: an error, a mismatch, an unwritten element, a stray write or a failed reference check"
                         : drifted ? "FAIL: device memory or open file descriptors drifted, or a cycle failed"
                                   : "PASS: no error, mismatch, stray write or drift");
  failed |= drifted;
  fflush(stdout);
  return failed;
}

static int soak_rank_main(int rank, int num_ranks, const ncclUniqueId* id, void* vctx) {
  const soak_ctx* ctx = (const soak_ctx*)vctx;
  const soak_opts* o = ctx->o;
  soak_rank* s = calloc(1, sizeof *s);
  if (!s) return 3;
  s->o = o, s->rank = rank, s->R = num_ranks, s->El = o->experts / num_ranks;
  s->cfg = megamoe_config_make(o->hidden, o->intermediate, o->experts, o->top_k, o->max_tokens);
  s->cfg.quant_group = o->group;
  s->cfg.timeout_s = SOAK_TIMEOUT_S;
  s->y_bytes = sizeof(uint16_t) * (size_t)(o->max_tokens * o->hidden) + SOAK_GUARD_BYTES;
  ncclComm_t comm = NULL; /* stays NULL for co-located ranks (no id): they create through the group */
  if (id && megamoe_comm_create(rank, num_ranks, id, &comm) != MEGAMOE_OK) {
    fprintf(stderr, "soak rank %d: %s\n", rank, megamoe_last_error());
    return 3;
  }
  if (!CU(s, cudaStreamCreate(&s->stream), -1) || setup(s) != 0) return 3; /* before any collective: the launcher ends the peers */

  /* Warm-up: one layer per arm and SOAK_WARM_CALLS drawn calls (another
   * seed) on it, then destroyed. The draws cover every T regime, bound and
   * index type, so every kernel the soak can launch (each GEMM tile, each
   * index type) is loaded before memory is counted: CUDA loads kernels
   * lazily, on their first launch. */
  int built[MEGAMOE_ARM_COUNT] = {0};
  int64_t drift[D_COUNT] = {0};
  for (int a = 0; a < o->num_arms; ++a) {
    int not_built = 0;
    megamoe_layer* layer = make_layer(s, a, comm, &s->count[a][C_ERRORS], &not_built);
    built[a] = !not_built; /* a create that failed otherwise fails the arm in the report */
    if (!layer) continue;
    for (int i = 0; i < SOAK_WARM_CALLS; ++i) {
      soak_call warm;
      soak_draw_call(o, num_ranks, o->seed ^ 0x3a9c1e57ull, i, &warm);
      if (i == 0) /* a decode call: one token per rank, a tight bound */
        for (int r = 0; r < num_ranks; ++r) warm.tokens[r] = warm.bound = 1;
      if (stage_inputs(s, &warm) != 0 || forward_once(s, layer, &warm, a) != MEGAMOE_OK) s->count[a][C_ERRORS]++;
    }
    if (megamoe_destroy(layer) != MEGAMOE_OK) s->count[a][C_ERRORS]++;
  }

  /* The soak: one layer per arm, every call on each. */
  const int64_t mem0 = free_device_bytes_quiet(s, comm), fd0 = open_fds();
  megamoe_layer* layers[MEGAMOE_ARM_COUNT] = {NULL};
  int not_built = 0;
  for (int a = 0; a < o->num_arms; ++a)
    if (built[a]) layers[a] = make_layer(s, a, comm, &s->count[a][C_ERRORS], &not_built);
  soak_coverage cv;
  memset(&cv, 0, sizeof cv);
  const double t0 = now_s();
  for (int64_t i = 0; i < o->calls; ++i) {
    soak_call call;
    soak_draw_call(o, num_ranks, o->seed, i, &call);
    cover(&cv, &call, num_ranks, o->max_tokens);
    soak_call_once(s, layers, &call, o->ref_every > 0 && i % o->ref_every == 0);
  }
  const double soak_s = now_s() - t0;
  for (int a = 0; a < o->num_arms; ++a)
    if (layers[a] && megamoe_destroy(layers[a]) != MEGAMOE_OK) s->count[a][C_ERRORS]++;
  const int64_t mem1 = free_device_bytes_quiet(s, comm), fd1 = open_fds();

  /* Create/prepare/forward/destroy cycles, the arms in turn. */
  int num_built = 0, built_slot[MEGAMOE_ARM_COUNT];
  for (int a = 0; a < o->num_arms; ++a)
    if (built[a]) built_slot[num_built++] = a;
  for (int i = 0; i < o->cycles && num_built > 0; ++i) {
    const int a = built_slot[i % num_built];
    megamoe_layer* layer = make_layer(s, a, comm, &drift[D_CYCLE_ERRORS], &not_built);
    soak_call call;
    soak_draw_call(o, num_ranks, o->seed, o->calls + i, &call);
    if (stage_inputs(s, &call) != 0) drift[D_CYCLE_ERRORS]++;
    if (layer && forward_once(s, layer, &call, a) != MEGAMOE_OK) drift[D_CYCLE_ERRORS]++;
    if (layer && megamoe_destroy(layer) != MEGAMOE_OK) drift[D_CYCLE_ERRORS]++;
  }
  const int64_t mem2 = free_device_bytes_quiet(s, comm), fd2 = open_fds();
  drift[D_MEM_SOAK] = mem0 - mem1;
  drift[D_MEM_CYCLES] = mem1 - mem2;
  drift[D_FD_SOAK] = fd1 - fd0;
  drift[D_FD_CYCLES] = fd2 - fd1;
  if (!mem0 || !mem1 || !mem2 || fd0 < 0 || fd1 < 0 || fd2 < 0) drift[D_CYCLE_ERRORS]++; /* could not measure */

  /* Reduce over the ranks; rank 0 reports. */
  int64_t all_drift[MEGAMOE_MAX_RANKS * D_COUNT] = {0};
  int failed = reduce(s, comm, s->count, (size_t)(MEGAMOE_ARM_COUNT * C_COUNT), ncclInt64, sizeof(int64_t), ncclSum) != 0;
  failed |= reduce(s, comm, s->worst, (size_t)(MEGAMOE_ARM_COUNT * W_COUNT), ncclFloat64, sizeof(double), ncclMax) != 0;
  failed |= gather(s, comm, drift, all_drift, D_COUNT) != 0;
  if (rank == 0) {
    failed |= report(s, s->count, s->worst, all_drift, built, &cv, soak_s);
    const char verdict = (char)(failed ? 1 : 0);
    if (write(ctx->verdict_fd, &verdict, 1) != 1) perror("soak: verdict");
  }
  teardown(s);
  cudaStreamDestroy(s->stream);
  if (comm) ncclCommDestroy(comm);
  free(s);
  return 0;
}

int soak_run(soak_opts* o, int gpus) {
  if (o->colocated && gpus >= 1 && o->ranks == 0) o->ranks = 2;
  /* Co-located ranks need one GPU, whatever their count. */
  const int picked = mm_cli_pick_ranks("soak", &o->ranks, o->colocated && gpus >= 1 ? o->ranks : gpus);
  if (picked != MM_EXIT_OK) return picked;
  megamoe_config cfg = megamoe_config_make(o->hidden, o->intermediate, o->experts, o->top_k, o->max_tokens);
  cfg.quant_group = o->group;
  if (megamoe_check_config(&cfg, o->ranks) != MEGAMOE_OK) {
    fprintf(stderr, "soak: %s\n", megamoe_last_error());
    return MM_EXIT_USAGE;
  }
  const char* engine = getenv("MEGAMOE_GEMM");
  if (engine && !strcmp(engine, "simple")) {
    fprintf(stderr, "soak: MEGAMOE_GEMM=simple: the arms are bitwise equal on one GEMM engine only (the split arm "
                    "runs on wgmma); unset it\n");
    return MM_EXIT_USAGE;
  }
  printf("megamoe soak: H %lld, I %lld, %d experts (%d per rank), top-%d, T_max %lld, G %d, %d rank(s)%s, seed %llu; "
         "%lld calls per arm, the CPU reference every %lld calls, %d create/destroy cycles\n",
         (long long)o->hidden, (long long)o->intermediate, o->experts, o->experts / o->ranks, o->top_k,
         (long long)o->max_tokens, o->group, o->ranks, o->colocated ? " co-located on GPU 0" : "",
         (unsigned long long)o->seed, (long long)o->calls, (long long)o->ref_every, o->cycles);
  fflush(stdout);
  int fds[2];
  if (pipe(fds) != 0) {
    perror("soak: pipe");
    return MM_EXIT_FAILED;
  }
  soak_ctx ctx = {o, fds[1]};
  /* The layers' deadlines end a hung forward; this one ends a hung run. */
  const mm_ranks_options run = {3600.0 + 0.5 * (double)o->calls, 0.0, o->colocated ? MM_RANKS_COLOCATED : 0};
  const int rc = mm_run_ranks_opt(o->ranks, &run, soak_rank_main, &ctx, NULL);
  close(fds[1]);
  char verdict = 1;
  const int got = (int)read(fds[0], &verdict, 1);
  close(fds[0]);
  if (rc != MM_RANKS_OK || got != 1) {
    fprintf(stderr, "soak: FAIL: the ranks did not finish (launcher code %d; see above)\n", rc);
    return MM_EXIT_FAILED;
  }
  return verdict ? MM_EXIT_FAILED : MM_EXIT_OK;
}
