/* Public helpers for language bindings and users' own tests (megamoe.h):
 * library facts, the CUDA / NCCL calls a program needs around a layer, the
 * buffer layout as data, and the CPU reference and the per-token checker of
 * ref/ behind the public types. Every argument is checked here, with a
 * message naming it, before anything is computed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "layout.h"
#include "megamoe.h"
#include "ref.h"
#include "ref_check.h"

_Static_assert((int)MEGAMOE_CHECK_PASSED == (int)REF_CHECK_PASSED, "check failure codes drifted");
_Static_assert((int)MEGAMOE_CHECK_BAD_REFERENCE == (int)REF_CHECK_BAD_REFERENCE, "check failure codes drifted");
_Static_assert((int)MEGAMOE_CHECK_NONFINITE == (int)REF_CHECK_NONFINITE, "check failure codes drifted");
_Static_assert((int)MEGAMOE_CHECK_MASKED_NONZERO == (int)REF_CHECK_MASKED_NONZERO, "check failure codes drifted");
_Static_assert((int)MEGAMOE_CHECK_ROW_REL_ERR == (int)REF_CHECK_ROW_REL_ERR, "check failure codes drifted");
_Static_assert((int)MEGAMOE_CHECK_ROW_ABS_ERR == (int)REF_CHECK_ROW_ABS_ERR, "check failure codes drifted");
_Static_assert((int)MEGAMOE_CHECK_DIFF == (int)REF_CHECK_DIFF, "check failure codes drifted");
_Static_assert((int)MEGAMOE_SPACE_SYMMETRIC == (int)MM_SPACE_SYMMETRIC, "layout spaces drifted");
_Static_assert((int)MEGAMOE_SPACE_WORKSPACE == (int)MM_SPACE_WORKSPACE, "layout spaces drifted");

/* ---- Library facts ------------------------------------------------------- */

int megamoe_version(void) { return MEGAMOE_VERSION; }

megamoe_status megamoe_nccl_versions(int* header_version, int* library_version) {
  mm_clear_error();
  if (header_version) *header_version = NCCL_VERSION_CODE;
  if (library_version) {
    int v = 0;
    const ncclResult_t r = ncclGetVersion(&v);
    if (r != ncclSuccess) return mm_fail(MEGAMOE_ERR_NCCL, "ncclGetVersion: %s", ncclGetErrorString(r));
    *library_version = v;
  }
  return MEGAMOE_OK;
}

/* ---- Process helpers ----------------------------------------------------- */

megamoe_status megamoe_unique_id(ncclUniqueId* unique_id) {
  mm_clear_error();
  MM_CHECK_NULL(unique_id, "unique_id");
  const ncclResult_t r = ncclGetUniqueId(unique_id);
  if (r != ncclSuccess) return mm_fail(MEGAMOE_ERR_NCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  return MEGAMOE_OK;
}

/* Ends a communicator with ncclCommDestroy or ncclCommAbort (`name`); NULL is fine. */
static megamoe_status comm_end(ncclComm_t comm, ncclResult_t (*end)(ncclComm_t), const char* name) {
  mm_clear_error();
  if (!comm) return MEGAMOE_OK;
  const ncclResult_t r = end(comm);
  if (r != ncclSuccess) return mm_fail(MEGAMOE_ERR_NCCL, "%s(comm): %s", name, ncclGetErrorString(r));
  return MEGAMOE_OK;
}

megamoe_status megamoe_comm_destroy(ncclComm_t comm) { return comm_end(comm, ncclCommDestroy, "ncclCommDestroy"); }

megamoe_status megamoe_comm_abort(ncclComm_t comm) { return comm_end(comm, ncclCommAbort, "ncclCommAbort"); }

/* The visible device count; MEGAMOE_ERR_NO_DEVICE when there is none (or no
 * driver to ask). */
static megamoe_status device_count(int* count) {
  *count = 0;
  const cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess || *count < 1) {
    (void)cudaGetLastError(); /* clear the runtime's last error: the caller's next call starts clean */
    return mm_fail(MEGAMOE_ERR_NO_DEVICE, "no CUDA device visible (cudaGetDeviceCount: %s)",
                   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  return MEGAMOE_OK;
}

megamoe_status megamoe_set_device(int device) {
  mm_clear_error();
  int count = 0;
  MM_TRY(device_count(&count));
  if (device < 0 || device >= count)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "device = %d: outside [0, %d) (the visible CUDA devices)", device,
                   count);
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
  return MEGAMOE_OK;
}

megamoe_status megamoe_get_device(int* device) {
  mm_clear_error();
  MM_CHECK_NULL(device, "device");
  int count = 0;
  MM_TRY(device_count(&count));
  const cudaError_t e = cudaGetDevice(device);
  if (e != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "cudaGetDevice: %s", cudaGetErrorString(e));
  return MEGAMOE_OK;
}

/* ---- Buffer layout ------------------------------------------------------- */

megamoe_status megamoe_layout(const megamoe_config* config, int num_ranks, megamoe_layout_info* info,
                              megamoe_region* regions, int capacity) {
  mm_clear_error();
  MM_CHECK_NULL(info, "info");
  mm_layout l;
  MM_TRY(mm_layout_compute(config, num_ranks, &l));
  if (regions && capacity < MM_REGION_COUNT)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "capacity = %d: the layout has %d regions", capacity,
                   (int)MM_REGION_COUNT);
  megamoe_layout_info out;
  memset(&out, 0, sizeof out);
  out.num_ranks = l.num_ranks;
  out.num_regions = MM_REGION_COUNT;
  out.local_experts = l.local_experts;
  out.pool_rows = l.pool_rows;
  out.symmetric_bytes = l.symmetric_bytes;
  out.workspace_bytes = l.workspace_bytes;
  out.prepared_weight_bytes = l.prepared_weight_bytes;
  out.in_place_resident_bytes = l.in_place_resident_bytes;
  out.in_place_peak_bytes = l.in_place_peak_bytes;
  out.ring_blocks = l.ring.blocks;
  out.ring_lag = l.ring.lag;
  out.ring_group = l.ring.group;
  out.ring_virtual_blocks = l.ring.virtual_blocks;
  *info = out;
  if (regions)
    for (int i = 0; i < MM_REGION_COUNT; ++i) {
      regions[i].name = l.regions[i].name;
      regions[i].space = (megamoe_space)l.regions[i].space;
      regions[i].offset = l.regions[i].offset;
      regions[i].bytes = l.regions[i].bytes;
      regions[i].align = l.regions[i].align;
    }
  return MEGAMOE_OK;
}

/* ---- The CPU reference and the checker ----------------------------------- */

static megamoe_status check_index_type(megamoe_index_type type, const char* name) {
  if (type != MEGAMOE_INDEX_INT32 && type != MEGAMOE_INDEX_INT64)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "%s = %d: not a megamoe_index_type", name, (int)type);
  return MEGAMOE_OK;
}

/* count elements of `size` bytes, overflow-checked (the caller names what). */
static int byte_count(int64_t a, int64_t b, size_t size, size_t* bytes) {
  uint64_t n = 0, total = 0;
  if (a < 0 || b < 0 || mm_mul_u64((uint64_t)a, (uint64_t)b, &n) || mm_mul_u64(n, size, &total) ||
      total > (uint64_t)SIZE_MAX)
    return 1;
  *bytes = (size_t)total;
  return 0;
}

megamoe_status megamoe_reference_forward(const megamoe_config* config, int num_ranks,
                                         const megamoe_weights* rank_weights,
                                         const megamoe_forward_args* args) {
  mm_clear_error();
  MM_TRY(megamoe_check_config(config, num_ranks));
  MM_CHECK_NULL(rank_weights, "rank_weights");
  MM_CHECK_NULL(args, "args");
  for (int r = 0; r < num_ranks; ++r) {
    const megamoe_weights* w = &rank_weights[r];
    const void* ptrs[4] = {w->w1, w->w1_sf, w->w2, w->w2_sf};
    const char* names[4] = {"w1", "w1_sf", "w2", "w2_sf"};
    for (int i = 0; i < 4; ++i)
      if (!ptrs[i]) return mm_fail(MEGAMOE_ERR_NULL_POINTER, "rank_weights[%d].%s is NULL", r, names[i]);
  }
  const int64_t T = args->num_tokens, K = config->top_k;
  if (T < 0) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "args->num_tokens = %lld: negative", (long long)T);
  if (T > config->max_tokens_per_rank)
    return mm_fail(MEGAMOE_ERR_TOO_MANY_TOKENS, "args->num_tokens = %lld: above max_tokens_per_rank = %lld",
                   (long long)T, (long long)config->max_tokens_per_rank);
  MM_TRY(check_index_type(args->topk_idx_type, "args->topk_idx_type"));
  if (T > 0) {
    MM_CHECK_NULL(args->x, "args->x");
    MM_CHECK_NULL(args->x_sf, "args->x_sf");
    MM_CHECK_NULL(args->topk_idx, "args->topk_idx");
    MM_CHECK_NULL(args->topk_w, "args->topk_w");
    MM_CHECK_NULL(args->y, "args->y");
  }
  /* The reference reads int32 indices: check every one (naming the element)
   * and narrow int64 ones. T * K < 2^31 (the config check). */
  const int64_t slots = T * K;
  int32_t* narrowed = NULL;
  const int32_t* idx32 = (const int32_t*)args->topk_idx;
  if (args->topk_idx_type == MEGAMOE_INDEX_INT64 && slots > 0) {
    narrowed = (int32_t*)malloc(sizeof(int32_t) * (size_t)slots);
    if (!narrowed)
      return mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY, "megamoe_reference_forward: %lld int32 indices",
                     (long long)slots);
  }
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t v = args->topk_idx_type == MEGAMOE_INDEX_INT64 ? ((const int64_t*)args->topk_idx)[i]
                                                                  : (int64_t)idx32[i];
    if (v < -1 || v >= config->num_experts) {
      free(narrowed);
      return mm_fail(MEGAMOE_ERR_BAD_TOPK_INDEX, "args->topk_idx[%lld] (token %lld, slot %lld) = %lld: outside [-1, %d)",
                     (long long)i, (long long)(i / K), (long long)(i % K), (long long)v, (int)config->num_experts);
    }
    if (narrowed) narrowed[i] = (int32_t)v;
  }
  if (narrowed) idx32 = narrowed;

  /* Every rank's weights; this rank's tokens on rank 0 (the source rank does
   * not enter a token's numbers). */
  ref_rank_data ranks[MEGAMOE_MAX_RANKS];
  memset(ranks, 0, sizeof ranks);
  for (int r = 0; r < num_ranks; ++r) {
    ranks[r].w1 = (const uint8_t*)rank_weights[r].w1;
    ranks[r].w1_sf = rank_weights[r].w1_sf;
    ranks[r].w2 = (const uint8_t*)rank_weights[r].w2;
    ranks[r].w2_sf = rank_weights[r].w2_sf;
  }
  ranks[0].num_tokens = T;
  ranks[0].x = (const uint8_t*)args->x;
  ranks[0].x_sf = args->x_sf;
  ranks[0].topk_idx = idx32;
  ranks[0].topk_w = args->topk_w;
  ranks[0].y = (uint16_t*)args->y;
  const megamoe_status st = ref_layer_forward(config, num_ranks, ranks);
  free(narrowed);
  return st;
}

megamoe_check_bounds megamoe_check_default_bounds(void) {
  const ref_check_bounds d = ref_check_default_bounds();
  megamoe_check_bounds b;
  b.row_rel_err = d.row_rel_err;
  b.row_abs_over_scale = d.row_abs_over_scale;
  b.diff = d.diff;
  b.scale_floor = d.scale_floor;
  return b;
}

static megamoe_status check_bound(double v, const char* name) {
  if (!(v > 0.0 && isfinite(v)))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "bounds->%s = %g: must be positive and finite", name, v);
  return MEGAMOE_OK;
}

megamoe_status megamoe_check_output(const uint16_t* y, const uint16_t* y_ref, int64_t num_tokens,
                                    int64_t hidden, const void* topk_idx,
                                    megamoe_index_type topk_idx_type, int64_t top_k,
                                    const megamoe_check_bounds* bounds, megamoe_check_stats* stats) {
  mm_clear_error();
  MM_CHECK_NULL(stats, "stats");
  if (num_tokens < 0)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "num_tokens = %lld: negative", (long long)num_tokens);
  if (hidden < 1) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "hidden = %lld: must be at least 1", (long long)hidden);
  if (top_k < 1) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "top_k = %lld: must be at least 1", (long long)top_k);
  MM_TRY(check_index_type(topk_idx_type, "topk_idx_type"));
  if (num_tokens > 0) {
    MM_CHECK_NULL(y, "y");
    MM_CHECK_NULL(y_ref, "y_ref");
    MM_CHECK_NULL(topk_idx, "topk_idx");
  }
  size_t y_bytes = 0, idx_bytes = 0;
  if (byte_count(num_tokens, hidden, sizeof(uint16_t), &y_bytes))
    return mm_fail(MEGAMOE_ERR_SIZE_OVERFLOW, "num_tokens = %lld, hidden = %lld: the output size overflows",
                   (long long)num_tokens, (long long)hidden);
  if (byte_count(num_tokens, top_k, sizeof(int64_t), &idx_bytes))
    return mm_fail(MEGAMOE_ERR_SIZE_OVERFLOW, "num_tokens = %lld, top_k = %lld: the index count overflows",
                   (long long)num_tokens, (long long)top_k);
  ref_check_bounds rb = ref_check_default_bounds();
  if (bounds) {
    MM_TRY(check_bound(bounds->row_rel_err, "row_rel_err"));
    MM_TRY(check_bound(bounds->row_abs_over_scale, "row_abs_over_scale"));
    MM_TRY(check_bound(bounds->diff, "diff"));
    MM_TRY(check_bound(bounds->scale_floor, "scale_floor"));
    rb.row_rel_err = bounds->row_rel_err;
    rb.row_abs_over_scale = bounds->row_abs_over_scale;
    rb.diff = bounds->diff;
    rb.scale_floor = bounds->scale_floor;
  }
  /* The checker reads int32 indices, and only their sign. */
  const int64_t slots = num_tokens * top_k;
  int32_t* signs = NULL;
  const int32_t* idx32 = (const int32_t*)topk_idx;
  if (topk_idx_type == MEGAMOE_INDEX_INT64 && slots > 0) {
    signs = (int32_t*)malloc(sizeof(int32_t) * (size_t)slots);
    if (!signs)
      return mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY, "megamoe_check_output: %lld int32 indices", (long long)slots);
    for (int64_t i = 0; i < slots; ++i) signs[i] = ((const int64_t*)topk_idx)[i] < 0 ? -1 : 0;
    idx32 = signs;
  }
  ref_check_stats rs;
  ref_check_output(y, y_ref, num_tokens, hidden, idx32, top_k, &rb, &rs);
  free(signs);
  if (rs.first_failure == REF_CHECK_BAD_INPUT)
    return mm_fail(MEGAMOE_ERR_INTERNAL, "megamoe_check_output: the checker refused arguments this call accepted");
  megamoe_check_stats out;
  memset(&out, 0, sizeof out);
  out.pass = rs.pass;
  out.first_failure = (megamoe_check_failure)rs.first_failure;
  out.first_failure_name = ref_check_failure_name(rs.first_failure);
  out.first_failure_token = rs.first_failure_token;
  out.tokens_checked = rs.tokens_checked;
  out.tokens_masked = rs.tokens_masked;
  out.tokens_failed = rs.tokens_failed;
  out.nonfinite = rs.nonfinite;
  out.max_rel_err = rs.max_rel_err;
  out.max_rel_err_token = rs.max_rel_err_token;
  out.max_abs_over_scale = rs.max_abs_over_scale;
  out.max_abs_over_scale_token = rs.max_abs_over_scale_token;
  out.diff = rs.diff;
  out.diff_judged = rs.diff_judged;
  out.diff_min_tokens = REF_CHECK_DIFF_MIN_TOKENS;
  out.bounds.row_rel_err = rs.bounds.row_rel_err;
  out.bounds.row_abs_over_scale = rs.bounds.row_abs_over_scale;
  out.bounds.diff = rs.bounds.diff;
  out.bounds.scale_floor = rs.bounds.scale_floor;
  ref_check_format(&rs, out.summary, sizeof out.summary);
  *stats = out;
  return MEGAMOE_OK;
}
