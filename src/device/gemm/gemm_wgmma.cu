/* Launcher of the Hopper FP8 GEMM engine: problem checks, tile choice,
 * shared-memory checks, tensor maps (cuTensorMapEncodeTiled through the
 * runtime's driver entry point, no -lcuda), all once per plan; then launches. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/gemm.h"
#include "gemm/gemm_kernel.cuh"

extern "C" {
#include "host/errors.h"
}

static_assert(sizeof(CUtensorMap) == 128 && alignof(CUtensorMap) <= 128, "mm_gemm_plan map storage");

namespace {

typedef CUresult (*encode_tiled_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                    const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                    CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                    CUtensorMapFloatOOBfill);

struct encode_entry {
  encode_tiled_fn fn;
  cudaError_t err;
  cudaDriverEntryPointQueryResult query;
};

encode_entry load_encode_entry() {
  encode_entry e = {nullptr, cudaSuccess, cudaDriverEntryPointSuccess};
  void* fn = nullptr;
  e.err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &e.query);
  if (e.err == cudaSuccess && e.query == cudaDriverEntryPointSuccess) e.fn = (encode_tiled_fn)fn;
  return e;
}

megamoe_status get_encode(encode_tiled_fn* out) {
  static const encode_entry entry = load_encode_entry(); /* thread-safe static init */
  if (!entry.fn)
    return mm_fail(MEGAMOE_ERR_CUDA, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): %s (query %d)",
                   cudaGetErrorString(entry.err), (int)entry.query);
  *out = entry.fn;
  return MEGAMOE_OK;
}

/* 2D tensor map over a row-major [rows, cols] array with row stride
 * row_bytes, box [box_rows, box_cols]. */
megamoe_status make_map_2d(void* out, const char* what, CUtensorMapDataType dtype, const void* base, uint64_t cols,
                           uint64_t rows, uint64_t row_bytes, uint32_t box_cols, uint32_t box_rows,
                           CUtensorMapSwizzle swizzle) {
  encode_tiled_fn encode = nullptr;
  MM_TRY(get_encode(&encode));
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estrides[2] = {1, 1};
  CUresult r = encode(static_cast<CUtensorMap*>(out), dtype, 2, const_cast<void*>(base), dims, strides, box,
                      estrides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return mm_fail(MEGAMOE_ERR_CUDA,
                   "cuTensorMapEncodeTiled(%s: %llu x %llu, row %llu B, box %u x %u) failed with CUresult %d", what,
                   (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)row_bytes, box_rows,
                   box_cols, (int)r);
  return MEGAMOE_OK;
}

int aligned(const void* p, uintptr_t a) { return ((uintptr_t)p % a) == 0; }

/* The tile table. */
struct tile_desc {
  const char* name;
  int bm, bn;
  int swiglu_g128; /* the tile holds a whole 128-column group of a-columns in one warpgroup or across both */
  mm_gemm_lookup_fn lookup;
};

const tile_desc kTiles[MM_GEMM_TILE_COUNT] = {
    {"auto", 0, 0, 0, nullptr},
    {"128x256", 128, 256, 1, mm_gemm_lookup_128x256},
    {"256x128", 256, 128, 0, mm_gemm_lookup_256x128},
    {"128x128", 128, 128, 0, mm_gemm_lookup_128x128},
    {"64x256", 64, 256, 1, mm_gemm_lookup_64x256},
    {"128x128-1p", 128, 128, 0, mm_gemm_lookup_128x128_1p},
    {"256x128-noscale", 256, 128, 0, mm_gemm_lookup_256x128_noscale},
    {"128x128-noscale", 128, 128, 0, mm_gemm_lookup_128x128_noscale},
    {"64x256-noscale", 64, 256, 0, mm_gemm_lookup_64x256_noscale},
};

/* Pipeline stages at most: MM_GEMM_MAX_STAGES, or the diagnostic override
 * MEGAMOE_GEMM_STAGES (2..8, for the benchmark's stage sweep). */
int max_stages() { return mm_env_int("MEGAMOE_GEMM_STAGES", MM_GEMM_MIN_STAGES, MM_GEMM_MAX_STAGES, MM_GEMM_MAX_STAGES); }

const tile_desc* tile_of(mm_gemm_tile t) {
  return (t > MM_GEMM_TILE_AUTO && t < MM_GEMM_TILE_COUNT) ? &kTiles[t] : nullptr;
}

const char* out_name(int out_kind) {
  switch (out_kind) {
    case MM_GEMM_OUT_F32: return "fp32";
    case MM_GEMM_OUT_BF16: return "bf16";
    case MM_GEMM_OUT_SWIGLU_FP8: return "swiglu-fp8";
    case MM_GEMM_OUT_BF16_SCATTER: return "bf16-scatter";
  }
  return "?";
}

megamoe_status device_smem_optin(int* optin) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: device query: %s", cudaGetErrorString(err));
  return MEGAMOE_OK;
}

megamoe_status device_sms(int* sms) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: device query: %s", cudaGetErrorString(err));
  return MEGAMOE_OK;
}

}  // namespace

extern "C" mm_gemm_problem mm_gemm_problem_make(const uint8_t* a, const float* a_sf, int32_t a_sf_block,
                                                const uint8_t* b, const float* b_sf, int32_t b_sf_block_n,
                                                const int32_t* expert_offset, const int32_t* expert_count,
                                                int32_t num_experts, int32_t rows_cap, int32_t n, int32_t k) {
  mm_gemm_problem p;
  memset(&p, 0, sizeof p);
  p.a = a;
  p.a_sf = a_sf;
  p.a_sf_block = a_sf_block;
  p.b = b;
  p.b_sf = b_sf;
  p.b_sf_block_n = b_sf_block_n;
  p.expert_offset = expert_offset;
  p.expert_count = expert_count;
  p.num_experts = num_experts;
  p.rows_cap = rows_cap;
  p.n = n;
  p.k = k;
  p.out_kind = MM_GEMM_OUT_F32;
  p.swiglu.group = 128;
  p.timeout_ns = MM_GEMM_DEFAULT_TIMEOUT_NS;
  return p;
}

extern "C" const char* mm_gemm_tile_name(mm_gemm_tile tile) {
  const tile_desc* t = tile_of(tile);
  return t ? t->name : tile == MM_GEMM_TILE_AUTO ? "auto" : "?";
}

extern "C" int mm_gemm_tile_width(mm_gemm_tile tile) {
  const tile_desc* t = tile_of(tile);
  return t ? t->bn : 0;
}

extern "C" int mm_gemm_tile_rows(mm_gemm_tile tile) {
  const tile_desc* t = tile_of(tile);
  return t ? t->bm : 0;
}

extern "C" megamoe_status mm_gemm_check(const mm_gemm_problem* p) {
  MM_CHECK_NULL(p, "gemm problem");
  if (!p->a || !p->a_sf || !p->b || !p->b_sf || !p->expert_offset || !p->expert_count)
    return mm_fail(MEGAMOE_ERR_NULL_POINTER, "gemm problem: an operand pointer (a, a_sf, b, b_sf, "
                   "expert_offset or expert_count) is NULL");
  if (p->num_experts < 1 || p->num_experts > MM_GEMM_MAX_EXPERTS)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS, "gemm problem: num_experts = %d outside [1, %d]", p->num_experts,
                   MM_GEMM_MAX_EXPERTS);
  if (p->rows_cap <= 0 || p->rows_cap % MM_POOL_ROW_ALIGN)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: rows_cap = %d must be a positive multiple of %d",
                   p->rows_cap, MM_POOL_ROW_ALIGN);
  if (p->n <= 0 || p->n % 128 || p->k <= 0 || p->k % 128)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm problem: n = %d and k = %d must be positive multiples of 128", p->n,
                   p->k);
  if ((int64_t)p->num_experts * p->n > INT32_MAX)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm problem: num_experts * n = %lld does not fit in 31 bits",
                   (long long)p->num_experts * p->n);
  if (((int64_t)p->rows_cap / 64 + p->num_experts) * (p->n / 128) > INT32_MAX)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm problem: too many tiles (rows_cap %d, n %d)", p->rows_cap, p->n);
  if (p->a_sf_block != 64 && p->a_sf_block != 128)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: a_sf_block = %d (want 64 or 128)", p->a_sf_block);
  if (p->b_sf_block_n != 64 && p->b_sf_block_n != 128)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: b_sf_block_n = %d (want 64 or 128)", p->b_sf_block_n);
  if (p->timeout_ns == 0)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: timeout_ns = 0");
  if (p->ready.counters && (p->ready.per_row < 0 || !aligned(p->ready.counters, 4)))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: ready.per_row = %d (>= 0) / counters alignment",
                   p->ready.per_row);
  /* TMA: global addresses 16-byte aligned; row strides are multiples of 16. */
  if (!aligned(p->a, 16) || !aligned(p->b, 16) || !aligned(p->a_sf, 16))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: a, b and a_sf must be 16-byte aligned");
  if (!aligned(p->b_sf, 4) || !aligned(p->expert_offset, 4) || !aligned(p->expert_count, 4) ||
      !aligned(p->expert_a_offset, 4))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: b_sf and the expert arrays must be 4-byte aligned");
  switch (p->out_kind) {
    case MM_GEMM_OUT_F32:
      MM_CHECK_NULL(p->d, "gemm problem: d");
      if (!aligned(p->d, 8)) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: fp32 d must be 8-byte aligned");
      break;
    case MM_GEMM_OUT_BF16:
      MM_CHECK_NULL(p->d, "gemm problem: d");
      if (!aligned(p->d, 16))
        return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: bf16 d must be 16-byte aligned (TMA stores)");
      break;
    case MM_GEMM_OUT_SWIGLU_FP8: {
      const mm_swiglu_epilogue* s = &p->swiglu;
      if (!s->row_weight || !s->out || !s->out_sf)
        return mm_fail(MEGAMOE_ERR_NULL_POINTER, "gemm problem: swiglu row_weight, out or out_sf is NULL");
      if (s->group != 64 && s->group != 128)
        return mm_fail(MEGAMOE_ERR_BAD_QUANT_GROUP, "gemm problem: swiglu group = %d (want 64 or 128)", s->group);
      if ((p->n / 2) % s->group)
        return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm problem: n / 2 = %d is not a multiple of the swiglu group %d",
                       p->n / 2, s->group);
      if (s->has_clamp && !(s->clamp > 0.f && isfinite(s->clamp)))
        return mm_fail(MEGAMOE_ERR_BAD_CLAMP, "gemm problem: swiglu clamp = %g", (double)s->clamp);
      if (!aligned(s->out, 2) || !aligned(s->out_sf, 4) || !aligned(s->row_weight, 4))
        return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: swiglu out / out_sf / row_weight misaligned");
      break;
    }
    case MM_GEMM_OUT_BF16_SCATTER:
      MM_CHECK_NULL(p->scatter.rows, "gemm problem: scatter.rows");
      if (!aligned(p->scatter.rows, 8))
        return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: scatter.rows must be 8-byte aligned");
      for (int r = 0; r < MM_MAX_RANKS; ++r)
        if (!aligned(p->scatter.dst_base[r], 16))
          return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: scatter.dst_base[%d] must be 16-byte aligned", r);
      for (int r = 0; r < MM_MAX_RANKS; ++r) {
        if (!p->scatter.arrived_base[r]) continue;
        if (!aligned(p->scatter.arrived_base[r], 4))
          return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: scatter.arrived_base[%d] must be 4-byte aligned", r);
        if (p->scatter.top_k < 1)
          return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: scatter.top_k = %d with arrival counters",
                         p->scatter.top_k);
        if (p->scatter.source_early && (p->scatter.num_ranks < 1 || p->scatter.num_ranks > MM_MAX_RANKS))
          return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: scatter.num_ranks = %d", p->scatter.num_ranks);
      }
      break;
    default:
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: out_kind = %d", (int)p->out_kind);
  }
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_gemm_tile_check(mm_gemm_tile tile, int32_t out_kind, int32_t a_sf_block,
                                             int32_t swiglu_group, int32_t num_experts, uint32_t* smem_bytes) {
  const tile_desc* t = tile_of(tile);
  if (!t) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: tile %d", (int)tile);
  if (num_experts < 1 || num_experts > MM_GEMM_MAX_EXPERTS)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS, "gemm_wgmma: num_experts = %d outside [1, %d]", num_experts,
                   MM_GEMM_MAX_EXPERTS);
  const mm_gemm_kernel_ref k = t->lookup(a_sf_block, out_kind, num_experts, max_stages());
  if (!k.fn)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: tile %s has no %s output", t->name, out_name(out_kind));
  if (out_kind == MM_GEMM_OUT_SWIGLU_FP8 && swiglu_group == 128 && !t->swiglu_g128)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                   "gemm_wgmma: SwiGLU group 128 needs a tile whose warpgroups hold 128 a-columns "
                   "(128x256 or 64x256), not %s",
                   t->name);
  if (k.layout.stages == 0)
    return mm_fail(MEGAMOE_ERR_UNSUPPORTED_DEVICE,
                   "gemm_wgmma: tile %s (%s) with %d experts does not fit %d pipeline stages in %d B of shared memory",
                   t->name, out_name(out_kind), num_experts, MM_GEMM_MIN_STAGES, MM_GEMM_SMEM_LIMIT);
  int optin = 0;
  MM_TRY(device_smem_optin(&optin));
  if ((int64_t)k.layout.bytes > (int64_t)optin)
    return mm_fail(MEGAMOE_ERR_UNSUPPORTED_DEVICE,
                   "gemm_wgmma: tile %s needs %u B of shared memory per block, the device allows %d", t->name,
                   k.layout.bytes, optin);
  if (smem_bytes) *smem_bytes = k.layout.bytes;
  return MEGAMOE_OK;
}

/* Measured on the H200 (docs/PERF.md, engine v2): at 64 rows per expert
 * the 64-row tile wastes the least tensor work and streams the weights the
 * same (144 us against 149-178 at M 256, N = K = 4096); at 512 and 2048 rows
 * per expert 256x128 is the fastest bf16 tile (1145-1196 TFLOP/s at
 * M 65536 against 1073-1136 for the one-wave tiles and 1025-1078 for
 * 128x256). The SwiGLU epilogue needs a warpgroup-held group of 128
 * a-columns (64x256, which measured ahead of 128x256 in bf16); at G = 64 a
 * group is one wave and the same tiles serve. G = 64 took 128x128 above 128
 * rows per expert until 128x256 measured faster there too (one H100, 512 /
 * 2048 / 8192 tokens: split -2.6 / -6.7 / -6.3 %, fused 0 / -14.7 / -11.4 %;
 * docs/PERF.md, twenty-eighth session). */
extern "C" mm_gemm_tile mm_gemm_pick_tile(const mm_gemm_problem* p, int64_t rows_per_expert) {
  if (rows_per_expert <= 0) rows_per_expert = p->num_experts > 0 ? (int64_t)p->rows_cap / p->num_experts : 0;
  if (p->out_kind == MM_GEMM_OUT_SWIGLU_FP8) {
    /* Above 64 rows per expert, 128-row m-blocks. 65-128 rows: one m-block
     * reads the expert's weights once (two 64-row blocks read them twice:
     * the split arm's L1 GEMM at 512 tokens per rank streamed ~1 GB for
     * 537 MB of weights). Large M: half the tiles and half the B traffic
     * per FLOP of 64x256 (one H200, 8192 tokens: split 3090 -> 2974 us,
     * fused 3760 -> 3341 us with its L2 256x128; docs/PERF.md). */
    return rows_per_expert > 64 ? MM_GEMM_TILE_128x256 : MM_GEMM_TILE_64x256;
  }
  if (rows_per_expert <= 128) return p->n % 256 == 0 ? MM_GEMM_TILE_64x256 : MM_GEMM_TILE_128x128;
  return MM_GEMM_TILE_256x128;
}

extern "C" megamoe_status mm_gemm_plan_make(const mm_gemm_problem* p, mm_gemm_tile tile, mm_gemm_plan* plan) {
  MM_CHECK_NULL(plan, "gemm plan");
  MM_TRY(mm_gemm_check(p));
  if (tile == MM_GEMM_TILE_AUTO) tile = mm_gemm_pick_tile(p, 0);
  const tile_desc* t = tile_of(tile);
  if (!t) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: tile %d", (int)tile);
  if (p->n % t->bn)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm_wgmma: n = %d is not a multiple of the tile width %d (tile %s)", p->n,
                   t->bn, t->name);
  MM_TRY(mm_gemm_tile_check(tile, p->out_kind, p->a_sf_block, p->swiglu.group, p->num_experts, NULL));
  const mm_gemm_kernel_ref k = t->lookup(p->a_sf_block, p->out_kind, p->num_experts, max_stages());

  memset(plan, 0, sizeof *plan);
  plan->problem = *p;
  plan->tile = tile;
  plan->layout = k.layout;
  const int promo = p->a_sf_block == 64 ? 2 : 1;
  MM_TRY(make_map_2d(plan->maps[0], "A", CU_TENSOR_MAP_DATA_TYPE_UINT8, p->a, (uint64_t)p->k, (uint64_t)p->rows_cap,
                     (uint64_t)p->k, MM_GEMM_BLOCK_K, (uint32_t)t->bm, CU_TENSOR_MAP_SWIZZLE_128B));
  MM_TRY(make_map_2d(plan->maps[1], "B", CU_TENSOR_MAP_DATA_TYPE_UINT8, p->b, (uint64_t)p->k,
                     (uint64_t)p->num_experts * (uint64_t)p->n, (uint64_t)p->k, MM_GEMM_BLOCK_K, (uint32_t)t->bn,
                     CU_TENSOR_MAP_SWIZZLE_128B));
  MM_TRY(make_map_2d(plan->maps[2], "A_sf", CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p->a_sf, (uint64_t)p->rows_cap,
                     (uint64_t)(p->k / p->a_sf_block), (uint64_t)p->rows_cap * 4u, (uint32_t)t->bm, (uint32_t)promo,
                     CU_TENSOR_MAP_SWIZZLE_NONE));
  /* The caller's value never counts: only a map made here does. */
  plan->problem.swiglu.tma_out = 0;
  if (p->out_kind == MM_GEMM_OUT_BF16) {
    MM_TRY(make_map_2d(plan->maps[3], "D", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p->d, (uint64_t)p->n,
                       (uint64_t)p->rows_cap, (uint64_t)p->n * 2u, 64, (uint32_t)t->bm, CU_TENSOR_MAP_SWIZZLE_128B));
  } else if (p->out_kind == MM_GEMM_OUT_SWIGLU_FP8 && t->bn == 256 && aligned(p->swiglu.out, 16) &&
             (p->n / 2) % 16 == 0) {
    /* The L1 output's fp8 codes, one 128-byte box per 256-wide tile's rows. */
    MM_TRY(make_map_2d(plan->maps[3], "SwiGLU out", CU_TENSOR_MAP_DATA_TYPE_UINT8, p->swiglu.out,
                       (uint64_t)(p->n / 2), (uint64_t)p->rows_cap, (uint64_t)(p->n / 2), 128, (uint32_t)t->bm,
                       CU_TENSOR_MAP_SWIZZLE_128B));
    plan->problem.swiglu.tma_out = 1;
  } else {
    memcpy(plan->maps[3], plan->maps[0], sizeof plan->maps[3]); /* unused */
  }

  cudaError_t err = cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.layout.bytes);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: cudaFuncSetAttribute(%u B): %s", k.layout.bytes,
                   cudaGetErrorString(err));
  int sms = 0;
  MM_TRY(device_sms(&sms));
  /* Upper bound of the tile count (each expert wastes at most one partial m-tile). */
  const int64_t max_tiles = ((int64_t)p->rows_cap / t->bm + p->num_experts) * (p->n / t->bn);
  plan->grid = (int)(max_tiles < sms ? max_tiles : sms);
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_gemm_plan_a_boxes(mm_gemm_plan* plan, int box_rows) {
  MM_CHECK_NULL(plan, "gemm plan");
  const tile_desc* t = tile_of(plan->tile);
  if (!t) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm plan: tile %d (not made by mm_gemm_plan_make)", (int)plan->tile);
  if (box_rows <= 0 || box_rows % 8)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm plan: A box of %d rows for tile %s", box_rows, t->name);
  if (t->bm <= box_rows) return MEGAMOE_OK; /* one box already */
  if (t->bm % box_rows)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm plan: A box of %d rows does not divide tile %s", box_rows, t->name);
  const mm_gemm_problem* p = &plan->problem;
  MM_TRY(make_map_2d(plan->maps[0], "A", CU_TENSOR_MAP_DATA_TYPE_UINT8, p->a, (uint64_t)p->k, (uint64_t)p->rows_cap,
                     (uint64_t)p->k, MM_GEMM_BLOCK_K, (uint32_t)box_rows, CU_TENSOR_MAP_SWIZZLE_128B));
  return make_map_2d(plan->maps[2], "A_sf", CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p->a_sf, (uint64_t)p->rows_cap,
                     (uint64_t)(p->k / p->a_sf_block), (uint64_t)p->rows_cap * 4u, (uint32_t)box_rows, 1,
                     CU_TENSOR_MAP_SWIZZLE_NONE);
}

extern "C" megamoe_status mm_gemm_plan_launch(const mm_gemm_plan* plan, cudaStream_t stream) {
  MM_CHECK_NULL(plan, "gemm plan");
  const tile_desc* t = tile_of(plan->tile);
  if (!t) return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm plan: tile %d (not made by mm_gemm_plan_make)", (int)plan->tile);
  const mm_gemm_problem* p = &plan->problem;
  /* The engine's own kernel scatters from the math warps and counts no
   * arrivals: only the copy warps of the persistent arms do. */
  if (p->out_kind == MM_GEMM_OUT_BF16_SCATTER)
    for (int r = 0; r < MM_MAX_RANKS; ++r)
      if (p->scatter.arrived_base[r])
        return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT,
                       "gemm plan: scatter.arrived_base[%d] is set, but the engine's kernel counts no arrivals", r);
  /* The kernel of the plan (the layout travels with the plan). */
  const mm_gemm_kernel_ref k = t->lookup(p->a_sf_block, p->out_kind, p->num_experts, MM_GEMM_MAX_STAGES);
  if (!k.fn) return mm_fail(MEGAMOE_ERR_INTERNAL, "gemm plan: no kernel for tile %s", t->name);
  mm_gemm_layout layout = plan->layout;
  mm_gemm_problem problem = *p;
  void* args[6] = {(void*)plan->maps[0], (void*)plan->maps[1], (void*)plan->maps[2], (void*)plan->maps[3],
                   (void*)&problem, (void*)&layout};
  cudaError_t err = cudaLaunchKernel(k.fn, dim3((unsigned)plan->grid), dim3(MM_GEMM_THREADS), args,
                                     layout.bytes, stream);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: launch (tile %s, grid %d, smem %u): %s", t->name, plan->grid,
                   layout.bytes, cudaGetErrorString(err));
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_gemm_wgmma(const mm_gemm_problem* p, mm_gemm_tile tile, cudaStream_t stream) {
  mm_gemm_plan plan;
  MM_TRY(mm_gemm_plan_make(p, tile, &plan));
  return mm_gemm_plan_launch(&plan, stream);
}
