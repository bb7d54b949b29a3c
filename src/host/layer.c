/* The layer object: create (collective), weights, forward, sync, destroy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colocated.h"
#include "config.h"
#include "contract.h"
#include "device/gemm/gemm.h"
#include "device/comm/peers.h"
#include "device/weights.h"
#include "fused_forward.h"
#include "plan.h"
#include "split_forward.h"
#include "timeline.h"
#include "staged_forward.h"
#include "device_status.h"
#include "errors.h"
#include "layout.h"
#include "megamoe.h"

struct megamoe_layer {
  megamoe_config config;
  int rank, num_ranks, device;
  ncclComm_t comm;       /* NCCL ranks, or NULL when co-located */
  mm_colocated* colocated; /* co-located ranks (colocated.h), or NULL */
  void* peer_mapped[MM_MAX_RANKS]; /* co-located: the peers' symmetric buffers as opened by CUDA IPC */
  mm_layout layout;
  void* symmetric;       /* ncclMemAlloc + symmetric window; plain cudaMalloc with one rank or co-located */
  int symmetric_is_nccl;
  ncclWindow_t window;
  int window_registered;
  void* workspace;       /* cudaMalloc */
  /* Weights: what the kernels read. In the copying mode all four point into
   * `weights` (the layer's copy); in place, w1p and w2 / w2_sf are the
   * caller's buffers and only w1p_sf is the layer's (`weights` holds it). */
  void* weights;         /* cudaMalloc at preparation */
  size_t weights_bytes;
  megamoe_weights_mode weights_mode;
  uint8_t* w1p;
  float* w1p_sf;
  const uint8_t* w2;
  const float* w2_sf;
  int weights_ready;
  int failed;            /* a timeout left the ranks out of step */
  /* The message of the first forward rejected on the host since the last
   * sync (megamoe_sync repeats it when it reports that forward). */
  char reject_message[512];
  mm_gemm_engine engine;
  mm_plan plan;          /* GEMM problems and plans, made when the weights are set */
  int early_combine_mode; /* MEGAMOE_EARLY_COMBINE (0 never, 1 auto, 2 always; plan.h), read at create */
  uint64_t* timeline;    /* the persistent arms' diagnostic timeline (MEGAMOE_TIMELINE=1 or mapped; its device address), or NULL */
  uint64_t* timeline_mapped;        /* its host address when mapped (then freed with cudaFreeHost), or NULL */
  mm_timeline_watch* timeline_watch; /* MEGAMOE_TIMELINE_WATCH's thread over the mapped stamps, or NULL */
  mm_layer_view view;
};

#define CUDA_TRY(call)                                                                   \
  do {                                                                                   \
    cudaError_t mm_e_ = (call);                                                          \
    if (mm_e_ != cudaSuccess)                                                            \
      return mm_fail(mm_e_ == cudaErrorMemoryAllocation ? MEGAMOE_ERR_OUT_OF_MEMORY      \
                                                        : MEGAMOE_ERR_CUDA,              \
                     "%s: %s", #call, cudaGetErrorString(mm_e_));                        \
  } while (0)

#define NCCL_TRY(call)                                                                  \
  do {                                                                                  \
    ncclResult_t mm_n_ = (call);                                                        \
    if (mm_n_ != ncclSuccess)                                                           \
      return mm_fail(MEGAMOE_ERR_NCCL, "%s: %s", #call, ncclGetErrorString(mm_n_));     \
  } while (0)

megamoe_status megamoe_comm_create(int rank, int num_ranks, const ncclUniqueId* unique_id,
                                   ncclComm_t* comm_out) {
  mm_clear_error();
  MM_CHECK_NULL(unique_id, "unique_id");
  MM_CHECK_NULL(comm_out, "comm_out");
  if (num_ranks < 1 || num_ranks > MEGAMOE_MAX_RANKS)
    return mm_fail(MEGAMOE_ERR_BAD_RANKS, "num_ranks = %d: must be in [1, %d]", num_ranks,
                   MEGAMOE_MAX_RANKS);
  if (rank < 0 || rank >= num_ranks)
    return mm_fail(MEGAMOE_ERR_BAD_RANKS, "rank = %d: must be in [0, %d)", rank, num_ranks);
  /* megamoe never uses NVLink multicast, and NCCL must not set it up either.
   * NCCL 2.28's ncclConfig_t has no field that turns it off (nvlsCTAs must be
   * > 0), and the library does not change the caller's environment: the
   * caller sets NCCL_NVLS_ENABLE=0 before its first NCCL call (NCCL reads it
   * once). Without it no communicator is made. Accepted: a whole base-10
   * zero ("0", "00", "-0"), which NCCL's own parse also reads as 0; anything it
   * might read otherwise (or reject, keeping its default) is refused. */
  const char* nvls = getenv("NCCL_NVLS_ENABLE");
  char* nvls_end = NULL;
  const long nvls_value = nvls ? strtol(nvls, &nvls_end, 10) : -1;
  if (!nvls || nvls_end == nvls || *nvls_end != '\0' || nvls_value != 0)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                   "NCCL_NVLS_ENABLE is %s%s%s, not 0: megamoe never uses NVLink multicast; set "
                   "NCCL_NVLS_ENABLE=0 in the environment before the process's first NCCL call",
                   nvls ? "'" : "unset", nvls ? nvls : "", nvls ? "'" : "");
  int nccl_version = 0;
  NCCL_TRY(ncclGetVersion(&nccl_version));
  if (nccl_version < 22800) /* NCCL_VERSION(2, 28, 0) */
    return mm_fail(MEGAMOE_ERR_NCCL,
                   "NCCL library %d.%d.%d: megamoe needs NCCL >= 2.28 (symmetric memory windows, "
                   "LSA pointers)",
                   nccl_version / 10000, nccl_version / 100 % 100, nccl_version % 100);
  NCCL_TRY(ncclCommInitRank(comm_out, num_ranks, *unique_id, rank));
  return MEGAMOE_OK;
}

/* The wgmma engine; MEGAMOE_GEMM=simple selects the CUDA-core oracle engine
 * (diagnostics, and the GPU tests run the layer on both). */
static mm_gemm_engine engine_from_env(void) {
  const char* e = getenv("MEGAMOE_GEMM");
  if (e && strcmp(e, "simple") == 0) return MM_GEMM_ENGINE_SIMPLE;
  return MM_GEMM_ENGINE_WGMMA;
}

/* How create reaches the other ranks: an NCCL communicator, or a co-located
 * group (colocated.h). */
typedef struct create_group {
  ncclComm_t comm;          /* NCCL ranks, or NULL */
  mm_colocated* colocated;  /* co-located ranks, or NULL */
  int rank, num_ranks;
} create_group;

/* Frees what exists; safe on a partly created layer. Deregistering is
 * collective, so on a partly created layer it only runs when every rank got
 * as far (the window flag is set after the all-rank agreement). */
static megamoe_status colocated_allgather(mm_colocated* g, int rank, const void* mine, size_t bytes, void* all,
                                          const char* what);

static megamoe_status release(megamoe_layer* l, int collective) {
  megamoe_status st = MEGAMOE_OK;
  /* Co-located: this rank's mappings of its peers' buffers go first; then,
   * when collective, every rank waits until every rank has closed its own
   * (as the collective window deregistration), so no buffer is freed while
   * a peer still maps it. */
  for (int p = 0; p < MM_MAX_RANKS; ++p) {
    if (!l->peer_mapped[p]) continue;
    cudaError_t e = cudaIpcCloseMemHandle(l->peer_mapped[p]);
    if (e != cudaSuccess && st == MEGAMOE_OK)
      st = mm_fail(MEGAMOE_ERR_CUDA, "cudaIpcCloseMemHandle (rank %d's buffer): %s", p, cudaGetErrorString(e));
    l->peer_mapped[p] = NULL;
  }
  if (l->colocated && collective) {
    megamoe_status b = colocated_allgather(l->colocated, l->rank, NULL, 0, NULL, "destroy");
    if (b != MEGAMOE_OK && st == MEGAMOE_OK) st = b;
  }
  if (l->window_registered && collective) {
    ncclResult_t r = ncclCommWindowDeregister(l->comm, l->window);
    if (r != ncclSuccess)
      st = mm_fail(MEGAMOE_ERR_NCCL, "ncclCommWindowDeregister: %s", ncclGetErrorString(r));
  }
  if (l->symmetric && l->symmetric_is_nccl) {
    ncclResult_t r = ncclMemFree(l->symmetric);
    if (r != ncclSuccess && st == MEGAMOE_OK)
      st = mm_fail(MEGAMOE_ERR_NCCL, "ncclMemFree: %s", ncclGetErrorString(r));
  }
  /* The watch reads the mapped stamps: stopped before they are freed. */
  mm_timeline_watch_stop(l->timeline_watch);
  if (l->timeline_mapped) {
    cudaError_t e = cudaFreeHost(l->timeline_mapped);
    if (e != cudaSuccess && st == MEGAMOE_OK)
      st = mm_fail(MEGAMOE_ERR_CUDA, "cudaFreeHost (timeline): %s", cudaGetErrorString(e));
    l->timeline = NULL;
  }
  void* plain[4] = {l->symmetric_is_nccl ? NULL : l->symmetric, l->workspace, l->weights, l->timeline};
  for (int i = 0; i < 4; ++i) {
    if (!plain[i]) continue;
    cudaError_t e = cudaFree(plain[i]);
    if (e != cudaSuccess && st == MEGAMOE_OK)
      st = mm_fail(MEGAMOE_ERR_CUDA, "cudaFree (layer buffer %d): %s", i, cudaGetErrorString(e));
  }
  free(l);
  return st;
}

/* Seconds a co-located rank waits for the others in create's and destroy's
 * host collectives (the NCCL path's collectives wait without a limit; a
 * rank may reach them after host work of its own, e.g. a reference check,
 * or after kernels slowed by compute-sanitizer). */
#define MM_COLOCATED_HOST_TIMEOUT_S 600.0

/* The co-located group's allgather (colocated.h) as a status. */
static megamoe_status colocated_allgather(mm_colocated* g, int rank, const void* mine, size_t bytes, void* all,
                                          const char* what) {
  const int r = mm_colocated_allgather(g, rank, mm_colocated_tag(what), mine, bytes, all, MM_COLOCATED_HOST_TIMEOUT_S);
  if (r == MM_COLOCATED_TIMEOUT)
    return mm_fail(MEGAMOE_ERR_TIMEOUT, "co-located ranks, %s: a rank did not arrive within %.0f s (or the group broke earlier)",
                   what, MM_COLOCATED_HOST_TIMEOUT_S);
  if (r == MM_COLOCATED_MISMATCH)
    return mm_fail(MEGAMOE_ERR_INTERNAL, "co-located ranks, %s: another rank made a different call in this round "
                   "(the ranks are out of step)", what);
  if (r != MM_COLOCATED_OK)
    return mm_fail(MEGAMOE_ERR_INTERNAL, "co-located ranks, %s: bad arguments (rank %d, %zu bytes: at most %d)", what,
                   rank, bytes, MM_COLOCATED_SLOT_BYTES);
  return MEGAMOE_OK;
}

/* Every rank learns whether all ranks succeeded so far (a failure on one rank
 * must not leave the others inside the next collective). */
static megamoe_status agree_group(const create_group* g, megamoe_status local) {
  int flag = local == MEGAMOE_OK ? 1 : 0;
  if (g->colocated) {
    int flags[MM_MAX_RANKS];
    MM_TRY(colocated_allgather(g->colocated, g->rank, &flag, sizeof flag, flags, "create agreement"));
    for (int p = 0; p < g->num_ranks; ++p) flag = flag && flags[p];
    if (local != MEGAMOE_OK) return local;
    if (!flag) return mm_fail(MEGAMOE_ERR_PEER_FAILED, "megamoe_create failed on another rank");
    return MEGAMOE_OK;
  }
  ncclComm_t comm = g->comm;
  int* d_flag = NULL;
  CUDA_TRY(cudaMalloc((void**)&d_flag, sizeof(int)));
  cudaError_t ce = cudaMemcpy(d_flag, &flag, sizeof flag, cudaMemcpyHostToDevice);
  ncclResult_t nr = ncclSuccess;
  if (ce == cudaSuccess) nr = ncclAllReduce(d_flag, d_flag, 1, ncclInt32, ncclMin, comm, 0);
  if (ce == cudaSuccess && nr == ncclSuccess) ce = cudaMemcpy(&flag, d_flag, sizeof flag, cudaMemcpyDeviceToHost);
  cudaFree(d_flag);
  if (nr != ncclSuccess) return mm_fail(MEGAMOE_ERR_NCCL, "ncclAllReduce (create agreement): %s", ncclGetErrorString(nr));
  if (ce != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "create agreement: %s", cudaGetErrorString(ce));
  if (local != MEGAMOE_OK) return local;
  if (!flag) return mm_fail(MEGAMOE_ERR_PEER_FAILED, "megamoe_create failed on another rank");
  return MEGAMOE_OK;
}

static megamoe_status agree(megamoe_layer* l, megamoe_status local) {
  const create_group g = {l->comm, l->colocated, l->rank, l->num_ranks};
  return agree_group(&g, local);
}

/* The persistent arms' diagnostic timeline (timeline.h), on request:
 * MEGAMOE_TIMELINE=1 in device memory; =mapped in mapped pinned host memory,
 * with the watch thread when MEGAMOE_TIMELINE_WATCH gives its period in
 * seconds. Anything else: none. Before the all-rank agreement, as every
 * allocation: a failure on one rank fails create on all. */
static megamoe_status create_timeline(megamoe_layer* l) {
  const char* tl = getenv("MEGAMOE_TIMELINE");
  const size_t bytes = sizeof(uint64_t) * MM_TL_MAX_CTAS * MM_TL_EVENTS;
  if (tl && strcmp(tl, "1") == 0) {
    cudaError_t e = cudaMalloc((void**)&l->timeline, bytes);
    if (e == cudaSuccess) e = cudaMemset(l->timeline, 0, bytes);
    if (e != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "timeline buffer (MEGAMOE_TIMELINE=1): %s", cudaGetErrorString(e));
  } else if (tl && strcmp(tl, "mapped") == 0) {
    cudaError_t e = cudaHostAlloc((void**)&l->timeline_mapped, bytes, cudaHostAllocMapped);
    if (e == cudaSuccess) {
      memset(l->timeline_mapped, 0, bytes);
      e = cudaHostGetDevicePointer((void**)&l->timeline, l->timeline_mapped, 0);
    }
    if (e != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "timeline buffer (MEGAMOE_TIMELINE=mapped): %s", cudaGetErrorString(e));
    const char* watch = getenv("MEGAMOE_TIMELINE_WATCH");
    const double period_s = watch ? strtod(watch, NULL) : 0.0;
    if (watch && !(period_s >= MM_TL_WATCH_MIN_S && period_s <= MM_TL_WATCH_MAX_S))
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "MEGAMOE_TIMELINE_WATCH=%s: want seconds in [%g, %g]", watch,
                     MM_TL_WATCH_MIN_S, MM_TL_WATCH_MAX_S);
    if (watch) {
      int sms = 0;
      CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, l->device));
      l->timeline_watch = mm_timeline_watch_start(l->timeline_mapped, sms < MM_TL_MAX_CTAS ? sms : MM_TL_MAX_CTAS,
                                                  l->rank, period_s);
      if (!l->timeline_watch)
        return mm_fail(MEGAMOE_ERR_INTERNAL, "MEGAMOE_TIMELINE_WATCH=%s: the watch thread did not start", watch);
    }
  } else if (getenv("MEGAMOE_TIMELINE_WATCH")) {
    fprintf(stderr, "megamoe: MEGAMOE_TIMELINE_WATCH is ignored without MEGAMOE_TIMELINE=mapped\n");
  }
  return MEGAMOE_OK;
}

static megamoe_status allocate_local(megamoe_layer* l) {
  const mm_layout* lay = &l->layout;
  CUDA_TRY(cudaMalloc(&l->workspace, lay->workspace_bytes));
  CUDA_TRY(cudaMemset(l->workspace, 0, lay->workspace_bytes));
  /* Forward numbers start at 1 (barrier values must exceed the zeroed flags). */
  mm_device_status st;
  memset(&st, 0, sizeof st);
  st.forward = 1;
  const uint64_t first_forward = 1;
  CUDA_TRY(cudaMemcpy((uint8_t*)l->workspace + lay->regions[MM_WS_STATUS].offset, &st, sizeof st,
                      cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy((uint8_t*)l->workspace + lay->regions[MM_WS_EPOCH].offset, &first_forward,
                      sizeof first_forward, cudaMemcpyHostToDevice));
  return l->config.arm == MEGAMOE_ARM_STAGED ? MEGAMOE_OK : create_timeline(l);
}

static void build_view(megamoe_layer* l, uint8_t** peers) {
  mm_layer_view* v = &l->view;
  memset(v, 0, sizeof *v);
  const megamoe_config* c = &l->config;
  v->rank = l->rank;
  v->num_ranks = l->num_ranks;
  v->hidden = (int32_t)c->hidden;
  v->intermediate = (int32_t)c->intermediate;
  v->num_experts = c->num_experts;
  v->local_experts = (int32_t)l->layout.local_experts;
  v->top_k = c->top_k;
  v->quant_group = c->quant_group;
  v->max_tokens = (int32_t)c->max_tokens_per_rank;
  v->pool_rows = (int32_t)l->layout.pool_rows;
  v->ring_blocks = l->layout.ring.blocks;
  v->virtual_blocks = l->layout.ring.virtual_blocks;
  v->has_clamp = c->has_swiglu_clamp;
  v->clamp = c->swiglu_clamp;
  v->ws = (uint8_t*)l->workspace;
  for (int p = 0; p < l->num_ranks; ++p) v->peer_sym[p] = peers[p];
  for (int id = 0; id < MM_REGION_COUNT; ++id) v->offset[id] = l->layout.regions[id].offset;
  double timeout = c->timeout_s > 0 ? c->timeout_s : MEGAMOE_DEFAULT_TIMEOUT_S;
  v->timeout_ns = (uint64_t)(timeout * 1e9);
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, l->device) != cudaSuccess || sms < 1)
    sms = 132; /* never seen: the grid-stride kernels take any value, and a cooperative
                  launch larger than the device holds fails cleanly instead of hanging */
  v->num_sms = sms;
  v->fill_blocks = 4 * sms;
  v->timeline = l->timeline; /* the diagnostic timeline's device address, or NULL */
}

/* The last local step of create: the plan, with the workspace standing in
 * for the weights until megamoe_prepare_weights sets them (an empty forward,
 * which every rank runs when one rejects its arguments, launches the arm's
 * kernels but reads no weights). A failure here is local and cannot happen
 * on one rank only (same config, same device kind, checked before the
 * agreement): the layer is released on every rank alike. */
static megamoe_status finish_create(megamoe_layer* l, megamoe_layer** layer_out) {
  const uint8_t* stand_in = (const uint8_t*)l->workspace;
  megamoe_status st = mm_plan_make(&l->plan, &l->config, &l->view, (int)l->engine, stand_in,
                                   (const float*)stand_in, stand_in, (const float*)stand_in);
  if (st != MEGAMOE_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", megamoe_last_error());
    release(l, 1);
    return mm_fail(st, "%s", msg);
  }
  *layer_out = l;
  return MEGAMOE_OK;
}

/* Every rank's config print (config.h) on every rank, through one NCCL
 * allgather on the current device, or the co-located group's. */
static megamoe_status gather_prints(const create_group* g, const mm_config_print* mine, mm_config_print* all) {
  const int num_ranks = g->num_ranks, rank = g->rank;
  ncclComm_t comm = g->comm;
  _Static_assert(sizeof(mm_config_print) <= MM_COLOCATED_SLOT_BYTES, "a config print fits a co-located slot");
  if (g->colocated) return colocated_allgather(g->colocated, rank, mine, sizeof *mine, all, "config exchange");
  mm_config_print* d_all = NULL;
  const size_t bytes = sizeof(mm_config_print) * (size_t)num_ranks;
  CUDA_TRY(cudaMalloc((void**)&d_all, bytes));
  cudaError_t ce = cudaMemcpy(d_all + rank, mine, sizeof *mine, cudaMemcpyHostToDevice);
  ncclResult_t nr = ncclSuccess;
  if (ce == cudaSuccess)
    nr = ncclAllGather(d_all + rank, d_all, sizeof *mine / sizeof(int64_t), ncclInt64, comm, 0);
  if (ce == cudaSuccess && nr == ncclSuccess) ce = cudaMemcpy(all, d_all, bytes, cudaMemcpyDeviceToHost);
  cudaFree(d_all);
  if (nr != ncclSuccess) return mm_fail(MEGAMOE_ERR_NCCL, "ncclAllGather (config exchange): %s", ncclGetErrorString(nr));
  if (ce != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "config exchange: %s", cudaGetErrorString(ce));
  return MEGAMOE_OK;
}

/* Before anything that depends on the config: every rank learns every
 * other rank's config and whether its arguments passed. A rank with another
 * config (or a NULL one) would otherwise return alone while its peers wait
 * in the next collective forever, or register windows of another size.
 * `local` is this rank's own argument status (its message is current). */
static megamoe_status same_config_everywhere(const megamoe_config* config, megamoe_status local,
                                             const create_group* g) {
  const int num_ranks = g->num_ranks, rank = g->rank;
  char local_message[512];
  snprintf(local_message, sizeof local_message, "%s", megamoe_last_error());
  mm_config_print mine, all[MM_MAX_RANKS];
  mm_config_print_make(config, local, &mine);
  MM_TRY(gather_prints(g, &mine, all));
  if (local != MEGAMOE_OK) return mm_fail(local, "%s", local_message);
  return mm_config_prints_compare(all, num_ranks, rank);
}

static megamoe_status create_layer(const megamoe_config* config, const create_group* g, megamoe_layer** layer_out);
static megamoe_status map_colocated_peers(megamoe_layer* l, uint8_t** peers);

megamoe_status megamoe_create(const megamoe_config* config, ncclComm_t comm,
                              megamoe_layer** layer_out) {
  mm_clear_error();
  MM_CHECK_NULL(comm, "comm"); /* without it this rank cannot tell its peers anything */
  if (layer_out) *layer_out = NULL;
  create_group g = {comm, NULL, 0, 0};
  NCCL_TRY(ncclCommCount(comm, &g.num_ranks));
  NCCL_TRY(ncclCommUserRank(comm, &g.rank));
  if (g.num_ranks < 1 || g.num_ranks > MEGAMOE_MAX_RANKS) /* the same on every rank: nobody waits */
    return mm_fail(MEGAMOE_ERR_BAD_RANKS, "comm has %d ranks: megamoe runs on 1 to %d", g.num_ranks, MEGAMOE_MAX_RANKS);
  return create_layer(config, &g, layer_out);
}

megamoe_status mm_create_colocated(const megamoe_config* config, megamoe_layer** layer_out) {
  mm_clear_error();
  if (layer_out) *layer_out = NULL;
  create_group g = {NULL, NULL, 0, 0};
  g.colocated = mm_colocated_current(&g.rank);
  if (!g.colocated)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                   "mm_create_colocated: this process is not a co-located rank (mm_run_ranks_opt with MM_RANKS_COLOCATED)");
  g.num_ranks = mm_colocated_ranks(g.colocated);
  return create_layer(config, &g, layer_out);
}

/* megamoe_create once the ranks are known (every rank of g calls it). */
static megamoe_status create_layer(const megamoe_config* config, const create_group* g, megamoe_layer** layer_out) {
  const int num_ranks = g->num_ranks, rank = g->rank;
  ncclComm_t comm = g->comm;
  megamoe_status local = MEGAMOE_OK;
  if (!config) local = mm_fail(MEGAMOE_ERR_NULL_POINTER, "config is NULL");
  else if (!layer_out) local = mm_fail(MEGAMOE_ERR_NULL_POINTER, "layer_out is NULL");
  if (num_ranks > 1) MM_TRY(same_config_everywhere(config, local, g));
  MM_TRY(local);
  /* Config errors are the same on every rank now (same config): return at once. */
  MM_TRY(megamoe_check_config(config, num_ranks));
  megamoe_layer* l = (megamoe_layer*)calloc(1, sizeof *l);
  /* Still in the agreement every other rank makes next, so none waits in it. */
  if (!l) return agree_group(g, mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY, "layer object"));
  l->config = *config;
  l->rank = rank;
  l->num_ranks = num_ranks;
  l->comm = comm;
  l->colocated = g->colocated;
  l->engine = engine_from_env();
  l->early_combine_mode = mm_env_int("MEGAMOE_EARLY_COMBINE", 0, 2, MM_EARLY_COMBINE_AUTO);
  megamoe_status st = mm_layout_compute(config, num_ranks, &l->layout);

  /* Local checks and allocations first, then one agreement, then the
   * collective window registration. */
  int lsa = 0;
  if (st == MEGAMOE_OK && cudaGetDevice(&l->device) != cudaSuccess)
    st = mm_fail(MEGAMOE_ERR_NO_DEVICE, "cudaGetDevice failed: no current CUDA device");
  if (st == MEGAMOE_OK) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, l->device) != cudaSuccess)
      st = mm_fail(MEGAMOE_ERR_CUDA, "cudaDeviceGetAttribute(compute capability) failed");
    else if (major != 9)
      st = mm_fail(MEGAMOE_ERR_UNSUPPORTED_DEVICE, "device %d has compute capability %d.x, need 9.0 (Hopper)",
                   l->device, major);
  }
  /* Every GEMM tile the arm can pick fits this device: a config create
   * accepts never fails at forward. */
  if (st == MEGAMOE_OK) st = mm_plan_check(config, num_ranks);
  /* Co-located ranks share one device: every buffer is reachable. */
  if (st == MEGAMOE_OK && !g->colocated) st = mm_lsa_team_size(comm, &lsa);
  if (st == MEGAMOE_OK && !g->colocated && lsa != num_ranks)
    st = mm_fail(MEGAMOE_ERR_NO_PEER_ACCESS,
                 "comm: only %d of %d ranks share this rank's NVLink load/store domain "
                 "(megamoe needs every rank reachable by peer loads and stores)",
                 lsa, num_ranks);
  if (st == MEGAMOE_OK) st = allocate_local(l);
  if (st == MEGAMOE_OK && (num_ranks == 1 || g->colocated)) {
    /* No peers: nothing to register (NCCL sets up no load/store window for a
     * one-rank communicator). Co-located: the peers map it through CUDA IPC. */
    cudaError_t e = cudaMalloc(&l->symmetric, l->layout.symmetric_bytes);
    if (e != cudaSuccess)
      st = mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY, "cudaMalloc(symmetric buffer, %llu bytes): %s",
                   (unsigned long long)l->layout.symmetric_bytes, cudaGetErrorString(e));
  } else if (st == MEGAMOE_OK) {
    ncclResult_t r = ncclMemAlloc(&l->symmetric, l->layout.symmetric_bytes);
    if (r != ncclSuccess)
      st = mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY, "ncclMemAlloc(%llu bytes): %s",
                   (unsigned long long)l->layout.symmetric_bytes, ncclGetErrorString(r));
    else
      l->symmetric_is_nccl = 1;
  }
  /* Flags start at zero everywhere before any rank can signal. */
  if (st == MEGAMOE_OK && cudaMemset(l->symmetric, 0, l->layout.symmetric_bytes) != cudaSuccess)
    st = mm_fail(MEGAMOE_ERR_CUDA, "cudaMemset(symmetric buffer) failed");
  if (st == MEGAMOE_OK && cudaDeviceSynchronize() != cudaSuccess)
    st = mm_fail(MEGAMOE_ERR_CUDA, "cudaDeviceSynchronize after allocation failed");
  megamoe_status agreed = agree(l, st);
  if (agreed != MEGAMOE_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", megamoe_last_error());
    release(l, 1);
    return mm_fail(agreed, "%s", msg);
  }

  uint8_t* peers[MM_MAX_RANKS] = {0};
  if (num_ranks == 1) {
    peers[0] = (uint8_t*)l->symmetric;
    build_view(l, peers);
    return finish_create(l, layer_out);
  }
  if (g->colocated) {
    st = map_colocated_peers(l, peers);
    if (st != MEGAMOE_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", megamoe_last_error());
      release(l, 1); /* every rank saw the same verdict, so every rank is here: the barrier keeps
                        each buffer until its peers closed their mappings (at once on a broken group) */
      return mm_fail(st, "%s", msg);
    }
    build_view(l, peers);
    return finish_create(l, layer_out);
  }
  ncclResult_t r = ncclCommWindowRegister(comm, l->symmetric, l->layout.symmetric_bytes, &l->window,
                                          NCCL_WIN_COLL_SYMMETRIC);
  if (r != ncclSuccess) {
    release(l, 1);
    return mm_fail(MEGAMOE_ERR_NCCL, "ncclCommWindowRegister: %s", ncclGetErrorString(r));
  }
  l->window_registered = 1;
  st = mm_resolve_peers(l->window, num_ranks, peers);
  if (st != MEGAMOE_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", megamoe_last_error());
    release(l, 1);
    return mm_fail(st, "%s", msg);
  }
  build_view(l, peers);
  return finish_create(l, layer_out);
}

/* Co-located ranks: every rank's symmetric buffer in every rank's address
 * space (peers[p]; this rank's own at peers[rank]), by CUDA IPC handles
 * exchanged through the group. Collective: two allgathers (the handles,
 * then whether every rank opened every other's), so every rank returns the
 * same verdict and a failure leaves no rank waiting. */
static megamoe_status map_colocated_peers(megamoe_layer* l, uint8_t** peers) {
  typedef struct handle_entry {
    int ok;
    cudaIpcMemHandle_t handle;
  } handle_entry;
  _Static_assert(sizeof(handle_entry) <= MM_COLOCATED_SLOT_BYTES, "an IPC handle fits a co-located slot");
  handle_entry mine, all[MM_MAX_RANKS];
  memset(&mine, 0, sizeof mine);
  cudaError_t e = cudaIpcGetMemHandle(&mine.handle, l->symmetric);
  megamoe_status st = MEGAMOE_OK;
  if (e != cudaSuccess) st = mm_fail(MEGAMOE_ERR_CUDA, "cudaIpcGetMemHandle (symmetric buffer): %s", cudaGetErrorString(e));
  mine.ok = st == MEGAMOE_OK;
  MM_TRY(colocated_allgather(l->colocated, l->rank, &mine, sizeof mine, all, "IPC handle exchange"));
  for (int p = 0; p < l->num_ranks && st == MEGAMOE_OK; ++p) {
    if (!all[p].ok) {
      st = mm_fail(MEGAMOE_ERR_PEER_FAILED, "co-located rank %d could not export its symmetric buffer", p);
    } else if (p == l->rank) {
      peers[p] = (uint8_t*)l->symmetric;
    } else {
      void* mapped = NULL;
      e = cudaIpcOpenMemHandle(&mapped, all[p].handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        st = mm_fail(MEGAMOE_ERR_CUDA, "cudaIpcOpenMemHandle (rank %d's symmetric buffer): %s", p, cudaGetErrorString(e));
      else
        l->peer_mapped[p] = peers[p] = (uint8_t*)mapped;
    }
  }
  return agree(l, st);
}

megamoe_status mm_layer_timeline(const megamoe_layer* l, uint64_t* host, int max_ctas, int* ctas) {
  MM_CHECK_NULL(l, "layer");
  MM_CHECK_NULL(host, "host");
  MM_CHECK_NULL(ctas, "ctas");
  if (!l->timeline) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "layer: no timeline (create a split or fused layer with MEGAMOE_TIMELINE=1 or mapped)");
  int sms = 0;
  CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, l->device));
  const int n = sms < max_ctas ? sms : max_ctas;
  *ctas = n < MM_TL_MAX_CTAS ? n : MM_TL_MAX_CTAS;
  CUDA_TRY(cudaMemcpy(host, l->timeline, sizeof(uint64_t) * (size_t)*ctas * MM_TL_EVENTS, cudaMemcpyDeviceToHost));
  for (int c = 0; c < *ctas; ++c) host[(size_t)c * MM_TL_EVENTS + MM_TL_SM_KHZ] = mm_timeline_sm_khz(host + (size_t)c * MM_TL_EVENTS);
  return MEGAMOE_OK;
}

megamoe_status mm_layer_timeline_clear(const megamoe_layer* l, cudaStream_t stream) {
  MM_CHECK_NULL(l, "layer");
  if (!l->timeline) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "layer: no timeline (create a split or fused layer with MEGAMOE_TIMELINE=1 or mapped)");
  CUDA_TRY(cudaMemsetAsync(l->timeline, 0, sizeof(uint64_t) * MM_TL_MAX_CTAS * MM_TL_EVENTS, stream));
  return MEGAMOE_OK;
}

megamoe_status megamoe_abandon(megamoe_layer* layer) {
  mm_clear_error();
  if (!layer) return MEGAMOE_OK;
  /* The kernels end by their deadlines; wait for them before freeing what they use. */
  cudaError_t e = cudaDeviceSynchronize();
  megamoe_status st = release(layer, 0);
  if (st == MEGAMOE_OK && e != cudaSuccess)
    st = mm_fail(MEGAMOE_ERR_CUDA, "cudaDeviceSynchronize before abandon: %s", cudaGetErrorString(e));
  return st;
}

megamoe_status megamoe_destroy(megamoe_layer* layer) {
  mm_clear_error();
  if (!layer) return MEGAMOE_OK;
  cudaError_t e = cudaDeviceSynchronize();
  megamoe_status st = release(layer, 1);
  if (st == MEGAMOE_OK && e != cudaSuccess)
    st = mm_fail(MEGAMOE_ERR_CUDA, "cudaDeviceSynchronize before destroy: %s", cudaGetErrorString(e));
  return st;
}

/* Makes `weights` hold exactly `bytes` (the layer's part of the weights in
 * a mode). A reallocation waits for the device first: a forward in flight
 * may still read the old buffer. */
static megamoe_status ensure_weight_buffer(megamoe_layer* l, size_t bytes) {
  if (l->weights && l->weights_bytes == bytes) return MEGAMOE_OK;
  if (l->weights) {
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaFree(l->weights));
    l->weights = NULL;
    l->weights_bytes = 0;
  }
  l->weights_ready = 0;
  cudaError_t e = cudaMalloc(&l->weights, bytes);
  if (e != cudaSuccess) {
    l->weights = NULL;
    return mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY, "cudaMalloc(prepared weights, %zu bytes): %s", bytes,
                   cudaGetErrorString(e));
  }
  l->weights_bytes = bytes;
  return MEGAMOE_OK;
}

static uint64_t round_region(uint64_t v) { return (v + MM_REGION_ALIGN - 1) / MM_REGION_ALIGN * MM_REGION_ALIGN; }

megamoe_status megamoe_prepare_weights(megamoe_layer* l, const megamoe_weights* w,
                                       cudaStream_t stream) {
  mm_clear_error();
  MM_CHECK_NULL(l, "layer");
  MM_CHECK_NULL(w, "weights");
  MM_CHECK_NULL(w->w1, "weights->w1");
  MM_CHECK_NULL(w->w1_sf, "weights->w1_sf");
  MM_CHECK_NULL(w->w2, "weights->w2");
  MM_CHECK_NULL(w->w2_sf, "weights->w2_sf");
  const uint64_t El = (uint64_t)l->layout.local_experts, H = (uint64_t)l->config.hidden,
                 I = (uint64_t)l->config.intermediate;
  if (((uintptr_t)w->w1 | (uintptr_t)w->w2) % 16)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "weights->w1 / w2 must be 16-byte aligned");
  if (((uintptr_t)w->w1_sf | (uintptr_t)w->w2_sf) % 4)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "weights->w1_sf / w2_sf must be 4-byte aligned");
  MM_TRY(ensure_weight_buffer(l, (size_t)l->layout.prepared_weight_bytes));
  uint8_t* p = (uint8_t*)l->weights;
  uint8_t* w1p = p;
  p += round_region(El * 2 * I * H);
  uint8_t* w2 = p;
  p += round_region(El * H * I);
  float* w1p_sf = (float*)p;
  p += round_region(El * (2 * I / MM_W1_INTERLEAVE) * (H / 128) * 4);
  float* w2_sf = (float*)p;
  l->weights_ready = 0;
  MM_TRY(mm_prepare_w1((const uint8_t*)w->w1, w->w1_sf, w1p, w1p_sf, (int32_t)El, (int32_t)H, (int32_t)I,
                       stream));
  CUDA_TRY(cudaMemcpyAsync(w2, w->w2, El * H * I, cudaMemcpyDeviceToDevice, stream));
  CUDA_TRY(cudaMemcpyAsync(w2_sf, w->w2_sf, El * (H / 128) * (I / 128) * 4, cudaMemcpyDeviceToDevice, stream));
  l->w1p = w1p;
  l->w1p_sf = w1p_sf;
  l->w2 = w2;
  l->w2_sf = w2_sf;
  l->weights_mode = MEGAMOE_WEIGHTS_COPY;
  MM_TRY(mm_plan_make(&l->plan, &l->config, &l->view, (int)l->engine, l->w1p, l->w1p_sf, l->w2, l->w2_sf));
  l->weights_ready = 1;
  return MEGAMOE_OK;
}

megamoe_status megamoe_prepare_weights_in_place(megamoe_layer* l, void* w1, const float* w1_sf,
                                                const void* w2, const float* w2_sf, cudaStream_t stream) {
  mm_clear_error();
  MM_CHECK_NULL(l, "layer");
  MM_CHECK_NULL(w1, "w1");
  MM_CHECK_NULL(w1_sf, "w1_sf");
  MM_CHECK_NULL(w2, "w2");
  MM_CHECK_NULL(w2_sf, "w2_sf");
  if (((uintptr_t)w1 | (uintptr_t)w2 | (uintptr_t)w2_sf) % 16)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "w1, w2 and w2_sf must be 16-byte aligned (the kernels read them "
                   "in place)");
  if ((uintptr_t)w1_sf % 4) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "w1_sf must be 4-byte aligned");
  const uint64_t El = (uint64_t)l->layout.local_experts, H = (uint64_t)l->config.hidden,
                 I = (uint64_t)l->config.intermediate;
  MM_TRY(ensure_weight_buffer(l, (size_t)l->layout.in_place_resident_bytes));
  l->weights_ready = 0;
  uint8_t* scratch = NULL;
  CUDA_TRY(cudaMalloc((void**)&scratch, (size_t)(2 * I * H)));
  megamoe_status st = mm_prepare_w1_in_place((uint8_t*)w1, w1_sf, (float*)l->weights, scratch, (int32_t)El,
                                             (int32_t)H, (int32_t)I, stream);
  /* The scratch is freed only after the stream ran every use of it. */
  cudaError_t e = cudaStreamSynchronize(stream);
  cudaError_t f = cudaFree(scratch);
  if (st != MEGAMOE_OK) return st;
  if (e != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "in-place weight preparation: %s (w1 may be half rewritten: reload it)",
                   cudaGetErrorString(e));
  if (f != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "cudaFree(scratch): %s", cudaGetErrorString(f));
  l->w1p = (uint8_t*)w1;
  l->w1p_sf = (float*)l->weights;
  l->w2 = (const uint8_t*)w2;
  l->w2_sf = w2_sf;
  l->weights_mode = MEGAMOE_WEIGHTS_IN_PLACE;
  MM_TRY(mm_plan_make(&l->plan, &l->config, &l->view, (int)l->engine, l->w1p, l->w1p_sf, l->w2, l->w2_sf));
  l->weights_ready = 1;
  return MEGAMOE_OK;
}

/* Part `id` (MM_SYM_INPUT_X or MM_SYM_INPUT_X_SF) of this rank's input
 * staging region, in its symmetric buffer. */
static uint8_t* staging_part(const megamoe_layer* l, int id) { return l->view.peer_sym[l->rank] + l->view.offset[id]; }

megamoe_status megamoe_input_staging(megamoe_layer* l, void** x, float** x_sf) {
  mm_clear_error();
  MM_CHECK_NULL(l, "layer");
  MM_CHECK_NULL(x, "x");
  MM_CHECK_NULL(x_sf, "x_sf");
  *x = staging_part(l, MM_SYM_INPUT_X);
  *x_sf = (float*)staging_part(l, MM_SYM_INPUT_X_SF);
  return MEGAMOE_OK;
}

/* Whether [p, p + n) and [base, base + cap) share a byte (n, cap > 0;
 * written without p + n or base + cap, which could wrap). */
static int ranges_meet(const void* p, uint64_t n, const void* base, uint64_t cap) {
  const uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
  return a >= b ? a - b < cap : b - a < n;
}

/* args->x or args->x_sf against the staging region's two parts: either
 * one is the part's own start (the caller wrote its tokens there: no copy)
 * or it meets neither part (a buffer of its own). Anything else would make
 * the staging copies read what they (or the other copy, which runs at the
 * same time in the persistent arms) are writing. */
static megamoe_status check_staging_overlap(const megamoe_layer* l, const void* p, uint64_t n, int own,
                                            const char* name) {
  static const int ids[2] = {MM_SYM_INPUT_X, MM_SYM_INPUT_X_SF};
  if (p == (const void*)staging_part(l, ids[own])) return MEGAMOE_OK;
  for (int k = 0; k < 2; ++k)
    if (ranges_meet(p, n, staging_part(l, ids[k]), l->layout.regions[ids[k]].bytes))
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                     "%s overlaps the layer's input staging region (its %s part) without being the start of "
                     "its own part (megamoe_input_staging: pass that pointer itself, or a buffer outside the region)",
                     name, k == 0 ? "x" : "x_sf");
  return MEGAMOE_OK;
}

/* The host-side checks of a forward: MEGAMOE_OK, or the status with the
 * message naming the argument. */
static megamoe_status check_forward(const megamoe_layer* l, const megamoe_forward_args* a) {
  MM_CHECK_NULL(a, "args");
  if (l->failed)
    return mm_fail(MEGAMOE_ERR_LAYER_FAILED, "an earlier forward timed out; destroy the layer");
  if (!l->weights_ready)
    return mm_fail(MEGAMOE_ERR_WEIGHTS_NOT_READY, "call megamoe_prepare_weights first");
  MM_TRY(mm_check_forward_args(&l->config, a));
  if (a->num_tokens > 0) {
    /* Sizes below 2^63: T <= T_max and the layout's sizes fit (create). */
    const uint64_t T = (uint64_t)a->num_tokens, H = (uint64_t)l->config.hidden;
    MM_TRY(check_staging_overlap(l, a->x, T * H, 0, "args->x"));
    MM_TRY(check_staging_overlap(l, a->x_sf, T * (H / 128) * 4, 1, "args->x_sf"));
  }
  return MEGAMOE_OK;
}

/* Enqueues the arm's forward for view f (an empty one when f carries an
 * injected error); bound: the call's num_tokens_bound (0 for an empty one). */
static megamoe_status run_arm(megamoe_layer* l, const mm_forward_view* f, mm_regime regime, int64_t bound,
                              cudaStream_t stream) {
  if (l->config.arm == MEGAMOE_ARM_SPLIT) return mm_split_forward(&l->view, f, l->plan.gemm[regime], stream);
  if (l->config.arm == MEGAMOE_ARM_FUSED)
    return mm_fused_forward(&l->view, f, &l->layout.ring, &l->config, bound, l->plan.gemm[regime], stream);
  return mm_staged_forward(&l->view, f, l->plan.gemm[regime], stream);
}

/* An empty forward that carries `status`: the peers stay in step (their
 * sync reports MEGAMOE_ERR_PEER_FAILED), this rank's next sync reports
 * `message`. Returns `status` with the message. */
static megamoe_status enqueue_rejection(megamoe_layer* l, megamoe_status status, const char* message,
                                        cudaStream_t stream) {
  if (l->reject_message[0] == '\0') snprintf(l->reject_message, sizeof l->reject_message, "%s", message);
  mm_forward_view f;
  memset(&f, 0, sizeof f);
  f.injected_error = (int32_t)status;
  megamoe_status run = run_arm(l, &f, MM_REGIME_DECODE, 0, stream);
  if (run != MEGAMOE_OK)
    return mm_fail(status, "%s (and the empty forward that keeps the peers in step failed to enqueue: %s)", message,
                   megamoe_last_error());
  return mm_fail(status, "%s", message);
}

megamoe_status megamoe_forward_reject(megamoe_layer* l, megamoe_status status, const char* message,
                                      cudaStream_t stream) {
  mm_clear_error();
  if (!l) return mm_fail(MEGAMOE_ERR_NULL_POINTER, "layer is NULL (nothing was enqueued)");
  if (status <= MEGAMOE_OK || status >= MEGAMOE_STATUS_COUNT)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "status = %d: not an error status (nothing was enqueued)", (int)status);
  return enqueue_rejection(l, status, message && message[0] ? message : "rejected by the caller", stream);
}

megamoe_status megamoe_forward(megamoe_layer* l, const megamoe_forward_args* a,
                               cudaStream_t stream) {
  mm_clear_error();
  if (!l) return mm_fail(MEGAMOE_ERR_NULL_POINTER, "layer is NULL (nothing was enqueued)");
  mm_forward_view f;
  memset(&f, 0, sizeof f);
  megamoe_status rejected = check_forward(l, a);
  if (rejected == MEGAMOE_OK) {
    /* Stage the tokens where the peers pull them from: the persistent arms
     * copy them in their routing phase (no copy launch before the kernel),
     * the staged arm here. */
    const uint64_t H = (uint64_t)l->config.hidden;
    const int64_t T = a->num_tokens;
    void* stage_x = staging_part(l, MM_SYM_INPUT_X);
    float* stage_sf = (float*)staging_part(l, MM_SYM_INPUT_X_SF);
    if (T > 0 && l->config.arm != MEGAMOE_ARM_STAGED) {
      f.x = a->x != stage_x ? (const uint8_t*)a->x : NULL;
      f.x_sf = a->x_sf != stage_sf ? a->x_sf : NULL;
    } else if (T > 0) {
      cudaError_t e = cudaSuccess;
      if (a->x != stage_x) e = cudaMemcpyAsync(stage_x, a->x, (size_t)T * H, cudaMemcpyDeviceToDevice, stream);
      if (e == cudaSuccess && a->x_sf != stage_sf)
        e = cudaMemcpyAsync(stage_sf, a->x_sf, (size_t)T * (H / 128) * 4, cudaMemcpyDeviceToDevice, stream);
      if (e != cudaSuccess)
        rejected = mm_fail(MEGAMOE_ERR_CUDA, "staging args->x / x_sf (cudaMemcpyAsync): %s", cudaGetErrorString(e));
    }
  }
  if (rejected != MEGAMOE_OK) {
    char message[sizeof l->reject_message];
    snprintf(message, sizeof message, "%s", megamoe_last_error());
    return enqueue_rejection(l, rejected, message, stream);
  }
  f.topk_idx = a->topk_idx;
  f.topk_idx_int64 = a->topk_idx_type == MEGAMOE_INDEX_INT64;
  f.topk_w = a->topk_w;
  f.num_tokens = (int32_t)a->num_tokens;
  f.y = (uint16_t*)a->y;
  f.early_combine = mm_plan_early_combine(&l->config, l->early_combine_mode, a->num_tokens, l->view.num_sms);
  const mm_regime regime = mm_plan_regime(&l->config, l->num_ranks, a->num_tokens, a->num_tokens_bound);
  megamoe_status run = run_arm(l, &f, regime, a->num_tokens_bound, stream);
  if (run != MEGAMOE_OK && l->reject_message[0] == '\0')
    snprintf(l->reject_message, sizeof l->reject_message, "%s", megamoe_last_error());
  return run;
}

static mm_device_status* device_status(const megamoe_layer* l) {
  return (mm_device_status*)((uint8_t*)l->workspace + l->layout.regions[MM_WS_STATUS].offset);
}

megamoe_status megamoe_sync(megamoe_layer* l, cudaStream_t stream) {
  mm_clear_error();
  MM_CHECK_NULL(l, "layer");
  CUDA_TRY(cudaStreamSynchronize(stream));
  mm_device_status ds;
  mm_device_status* where = device_status(l);
  CUDA_TRY(cudaMemcpy(&ds, where, sizeof ds, cudaMemcpyDeviceToHost));
  if (ds.first.key == 0) {
    l->reject_message[0] = '\0';
    if (l->failed || ds.dead)
      return mm_fail(MEGAMOE_ERR_LAYER_FAILED, "rank %d: the layer failed earlier (a timeout left the ranks out "
                     "of step); destroy it", l->rank);
    return MEGAMOE_OK;
  }
  mm_status_context ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.rank = l->rank;
  ctx.num_experts = l->config.num_experts;
  ctx.local_experts = (int)l->layout.local_experts;
  ctx.top_k = l->config.top_k;
  ctx.timeout_s = (double)l->view.timeout_ns * 1e-9;
  ctx.pool_imbalance = l->config.pool_imbalance;
  ctx.pool_rows = l->layout.pool_rows;
  ctx.failed_forwards = ds.failed_forwards;
  ctx.host_message = l->reject_message;
  char message[1024];
  const megamoe_status code = mm_describe_device_error(&ds.first, &ctx, message, sizeof message);
  if (code == MEGAMOE_ERR_TIMEOUT || ds.dead) l->failed = 1;
  /* Reported: clear it (the device record of the current forward stays; it
   * only counts for its own forward). */
  mm_error_report none;
  memset(&none, 0, sizeof none);
  const uint32_t zero = 0;
  CUDA_TRY(cudaMemcpy(&where->first, &none, sizeof none, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(&where->failed_forwards, &zero, sizeof zero, cudaMemcpyHostToDevice));
  l->reject_message[0] = '\0';
  if (ds.dead && code != MEGAMOE_ERR_TIMEOUT && code != MEGAMOE_ERR_LAYER_FAILED)
    return mm_fail(code, "%s; a wait then timed out (in this forward or a later one): the layer failed, destroy it",
                   message);
  return mm_fail(code, "%s", message);
}

megamoe_status megamoe_set_programmatic_launch(megamoe_layer* l, int enable) {
  mm_clear_error();
  MM_CHECK_NULL(l, "layer");
  if (enable != 0 && enable != 1)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "enable = %d: must be 0 or 1", enable);
  l->view.programmatic_launch = enable; /* read by the persistent arms' launches (device/launch.cuh) */
  return MEGAMOE_OK;
}

megamoe_status megamoe_error_word(megamoe_layer* l, const int32_t** word) {
  mm_clear_error();
  MM_CHECK_NULL(l, "layer");
  MM_CHECK_NULL(word, "word");
  *word = &device_status(l)->word;
  return MEGAMOE_OK;
}

const megamoe_config* megamoe_layer_config(const megamoe_layer* l) { return l ? &l->config : NULL; }
int megamoe_layer_rank(const megamoe_layer* l) { return l ? l->rank : -1; }
int megamoe_layer_num_ranks(const megamoe_layer* l) { return l ? l->num_ranks : 0; }
