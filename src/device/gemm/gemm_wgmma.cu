/* Whole-kernel launcher of the Hopper FP8 GEMM engine (gemm_wgmma.cuh):
 * problem checks, tensor maps (cuTensorMapEncodeTiled through the runtime's
 * driver entry point, no -lcuda), tile choice, launch. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gemm/gemm_wgmma.cuh"

extern "C" {
#include "host/errors.h"
}

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
megamoe_status make_map_2d(CUtensorMap* map, const char* what, CUtensorMapDataType dtype, const void* base,
                           uint64_t cols, uint64_t rows, uint64_t row_bytes, uint32_t box_cols,
                           uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  encode_tiled_fn encode = nullptr;
  MM_TRY(get_encode(&encode));
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estrides[2] = {1, 1};
  CUresult r = encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, estrides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return mm_fail(MEGAMOE_ERR_CUDA,
                   "cuTensorMapEncodeTiled(%s: %llu x %llu, row %llu B, box %u x %u) failed with CUresult %d",
                   what, (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)row_bytes,
                   box_rows, box_cols, (int)r);
  return MEGAMOE_OK;
}

int aligned(const void* p, uintptr_t a) { return ((uintptr_t)p % a) == 0; }

/* Kernel variants of one tile shape. */
enum { VARIANT_PLAIN = 0, VARIANT_SKEW = 1, VARIANT_SKEW_TMA = 2 };

/* Launches one instantiation. kVariant: VARIANT_PLAIN (mm_gemm_wgmma_kernel),
 * VARIANT_SKEW or VARIANT_SKEW_TMA (mm_gemm_wgmma_skew_kernel without / with
 * the TMA-store epilogue; the latter bf16 only, Cfg with the staging area). */
template <class Cfg, int kOut, int kVariant>
megamoe_status launch_cfg(const mm_gemm_problem* p, const mm_gemm_dev_args& args, cudaStream_t stream) {
  CUtensorMap tm_a, tm_b, tm_sfa, tm_d;
  MM_TRY(make_map_2d(&tm_a, "A", CU_TENSOR_MAP_DATA_TYPE_UINT8, p->a, (uint64_t)p->k, (uint64_t)p->rows_cap,
                     (uint64_t)p->k, MM_GEMM_BLOCK_K, Cfg::BM, CU_TENSOR_MAP_SWIZZLE_128B));
  MM_TRY(make_map_2d(&tm_b, "B", CU_TENSOR_MAP_DATA_TYPE_UINT8, p->b, (uint64_t)p->k,
                     (uint64_t)p->num_experts * (uint64_t)p->n, (uint64_t)p->k, MM_GEMM_BLOCK_K, Cfg::BN,
                     CU_TENSOR_MAP_SWIZZLE_128B));
  MM_TRY(make_map_2d(&tm_sfa, "A_sf", CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p->a_sf, (uint64_t)p->rows_cap,
                     (uint64_t)(p->k / p->a_sf_block), (uint64_t)p->rows_cap * 4u, Cfg::BM, Cfg::kPromo,
                     CU_TENSOR_MAP_SWIZZLE_NONE));
  if (kVariant == VARIANT_SKEW_TMA) {
    MM_TRY(make_map_2d(&tm_d, "D", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, args.d, (uint64_t)p->n, (uint64_t)p->rows_cap,
                       (uint64_t)p->n * 2u, 64, Cfg::BM, CU_TENSOR_MAP_SWIZZLE_128B));
  } else {
    tm_d = tm_a; /* unused */
  }

  int dev = 0, sms = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: device query: %s", cudaGetErrorString(err));

  const uint32_t smem = mm_gemm_smem_bytes<Cfg>(p->num_experts);
  if ((int64_t)smem > (int64_t)smem_optin)
    return mm_fail(MEGAMOE_ERR_UNSUPPORTED_DEVICE,
                   "gemm_wgmma: tile %dx%d needs %u B of shared memory per block, the device allows %d",
                   Cfg::BM, Cfg::BN, smem, smem_optin);

  /* Upper bound of the tile count (each expert wastes at most one partial m-tile). */
  const int64_t max_tiles = ((int64_t)p->rows_cap / Cfg::BM + p->num_experts) * (p->n / Cfg::BN);
  const int grid = (int)(max_tiles < sms ? max_tiles : sms);
  if constexpr (kVariant == VARIANT_PLAIN) {
    auto kernel = mm_gemm_wgmma_kernel<Cfg, kOut>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
      return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: cudaFuncSetAttribute(%u B): %s", smem, cudaGetErrorString(err));
    kernel<<<grid, MM_GEMM_THREADS, smem, stream>>>(tm_a, tm_b, tm_sfa, args);
  } else {
    auto kernel = mm_gemm_wgmma_skew_kernel<Cfg, kOut, kVariant == VARIANT_SKEW_TMA>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
      return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: cudaFuncSetAttribute(%u B): %s", smem, cudaGetErrorString(err));
    kernel<<<grid, MM_GEMM_THREADS, smem, stream>>>(tm_a, tm_b, tm_sfa, tm_d, args);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "gemm_wgmma: launch (tile %dx%d, grid %d, smem %u): %s", Cfg::BM, Cfg::BN,
                   grid, smem, cudaGetErrorString(err));
  return MEGAMOE_OK;
}

/* kVariant VARIANT_SKEW_TMA: the bf16 output takes the TMA-store kernel (its
 * Cfg with the staging area) when d is 16-byte aligned; every other case the
 * plain skewed kernel. */
template <class Cfg, int kVariant>
megamoe_status launch_out(const mm_gemm_problem* p, mm_gemm_output out, const mm_gemm_dev_args& args,
                          cudaStream_t stream) {
  constexpr int kV = kVariant == VARIANT_SKEW_TMA ? VARIANT_SKEW : kVariant;
  switch (out) {
    case MM_GEMM_OUT_F32: return launch_cfg<Cfg, MM_GEMM_OUT_KIND_F32, kV>(p, args, stream);
    case MM_GEMM_OUT_BF16:
      if constexpr (kVariant == VARIANT_SKEW_TMA) {
        if (aligned(args.d, 16)) {
          using CfgT = mm_gemm_cfg<Cfg::BM, Cfg::BN, Cfg::kSplitN, Cfg::kPromo, Cfg::BM * Cfg::BN * 2>;
          return launch_cfg<CfgT, MM_GEMM_OUT_KIND_BF16, VARIANT_SKEW_TMA>(p, args, stream);
        }
      }
      return launch_cfg<Cfg, MM_GEMM_OUT_KIND_BF16, kV>(p, args, stream);
    case MM_GEMM_OUT_SWIGLU_FP8: return launch_cfg<Cfg, MM_GEMM_OUT_KIND_SWIGLU, kV>(p, args, stream);
  }
  return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm output kind %d", (int)out);
}

template <int BM, int BN, bool kSplitN, int kVariant = VARIANT_PLAIN>
megamoe_status launch_tile(const mm_gemm_problem* p, mm_gemm_output out, const mm_gemm_dev_args& args,
                           cudaStream_t stream) {
  if (p->a_sf_block == 128) return launch_out<mm_gemm_cfg<BM, BN, kSplitN, 1>, kVariant>(p, out, args, stream);
  return launch_out<mm_gemm_cfg<BM, BN, kSplitN, 2>, kVariant>(p, out, args, stream);
}

}  // namespace

extern "C" const char* mm_gemm_tile_name(mm_gemm_tile tile) {
  switch (tile) {
    case MM_GEMM_TILE_AUTO: return "auto";
    case MM_GEMM_TILE_128x256: return "128x256";
    case MM_GEMM_TILE_256x128: return "256x128";
    case MM_GEMM_TILE_128x128: return "128x128";
    case MM_GEMM_TILE_64x256: return "64x256";
    case MM_GEMM_TILE_128x256_SKEW: return "128x256s";
    case MM_GEMM_TILE_256x128_SKEW: return "256x128s";
    case MM_GEMM_TILE_128x128_SKEW: return "128x128s";
    case MM_GEMM_TILE_128x256_SKEW_TMA: return "128x256t";
    case MM_GEMM_TILE_256x128_SKEW_TMA: return "256x128t";
    case MM_GEMM_TILE_128x128_SKEW_TMA: return "128x128t";
    case MM_GEMM_TILE_COUNT: break;
  }
  return "?";
}

extern "C" int mm_gemm_tile_width(mm_gemm_tile tile) {
  switch (tile) {
    case MM_GEMM_TILE_128x256:
    case MM_GEMM_TILE_64x256:
    case MM_GEMM_TILE_128x256_SKEW:
    case MM_GEMM_TILE_128x256_SKEW_TMA: return 256;
    case MM_GEMM_TILE_256x128:
    case MM_GEMM_TILE_128x128:
    case MM_GEMM_TILE_256x128_SKEW:
    case MM_GEMM_TILE_128x128_SKEW:
    case MM_GEMM_TILE_256x128_SKEW_TMA:
    case MM_GEMM_TILE_128x128_SKEW_TMA: return 128;
    case MM_GEMM_TILE_AUTO:
    case MM_GEMM_TILE_COUNT: break;
  }
  return 0;
}

extern "C" megamoe_status mm_gemm_check(const mm_gemm_problem* p, mm_gemm_output out, const void* d,
                                        const mm_swiglu_epilogue* swiglu) {
  MM_CHECK_NULL(p, "gemm problem");
  if (!p->a || !p->a_sf || !p->b || !p->b_sf || !p->expert_offset || !p->expert_count)
    return mm_fail(MEGAMOE_ERR_NULL_POINTER, "gemm problem: an operand pointer (a, a_sf, b, b_sf, "
                   "expert_offset or expert_count) is NULL");
  if (p->num_experts < 1 || p->num_experts > MEGAMOE_MAX_LOCAL_EXPERTS)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS, "gemm problem: num_experts = %d outside [1, %d]", p->num_experts,
                   MEGAMOE_MAX_LOCAL_EXPERTS);
  if (p->rows_cap <= 0 || p->rows_cap % MM_POOL_ROW_ALIGN)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: rows_cap = %d must be a positive multiple of %d",
                   p->rows_cap, MM_POOL_ROW_ALIGN);
  if (p->n <= 0 || p->n % 128 || p->k <= 0 || p->k % 128)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm problem: n = %d and k = %d must be positive multiples of 128",
                   p->n, p->k);
  if ((int64_t)p->num_experts * p->n > INT32_MAX)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm problem: num_experts * n = %lld does not fit in 31 bits",
                   (long long)p->num_experts * p->n);
  if (p->a_sf_block != 64 && p->a_sf_block != 128)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: a_sf_block = %d (want 64 or 128)", p->a_sf_block);
  if (p->b_sf_block_n != 64 && p->b_sf_block_n != 128)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm problem: b_sf_block_n = %d (want 64 or 128)", p->b_sf_block_n);
  switch (out) {
    case MM_GEMM_OUT_F32:
    case MM_GEMM_OUT_BF16:
      MM_CHECK_NULL(d, "gemm output d");
      break;
    case MM_GEMM_OUT_SWIGLU_FP8:
      MM_CHECK_NULL(swiglu, "swiglu epilogue");
      if (!swiglu->row_weight || !swiglu->out || !swiglu->out_sf)
        return mm_fail(MEGAMOE_ERR_NULL_POINTER, "swiglu epilogue: row_weight, out or out_sf is NULL");
      if (swiglu->group != 64 && swiglu->group != 128)
        return mm_fail(MEGAMOE_ERR_BAD_QUANT_GROUP, "swiglu epilogue: group = %d (want 64 or 128)", swiglu->group);
      if ((p->n / 2) % swiglu->group)
        return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "swiglu epilogue: n / 2 = %d is not a multiple of the group %d",
                       p->n / 2, swiglu->group);
      if (swiglu->has_clamp && !(swiglu->clamp > 0.f && isfinite(swiglu->clamp)))
        return mm_fail(MEGAMOE_ERR_BAD_CLAMP, "swiglu epilogue: clamp = %g", (double)swiglu->clamp);
      break;
    default:
      return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm output kind %d", (int)out);
  }
  return MEGAMOE_OK;
}

extern "C" mm_gemm_tile mm_gemm_wgmma_pick_tile(const mm_gemm_problem* p, mm_gemm_output out,
                                                const mm_swiglu_epilogue* swiglu) {
  if (out == MM_GEMM_OUT_SWIGLU_FP8 && swiglu && swiglu->group == 128) return MM_GEMM_TILE_128x256;
  /* Rows per expert are only known on the device; the pool capacity per
   * expert bounds them. Decode-sized pools (<= 128 rows per expert): the
   * 64-row tile wastes the least tensor work and streams the weights the same. */
  const int64_t per_expert = p->num_experts > 0 ? (int64_t)p->rows_cap / p->num_experts : 0;
  if (per_expert <= 128 && p->n % 256 == 0) return MM_GEMM_TILE_64x256;
  /* bf16 output with larger pools: the TMA-store epilogue measured best on the
   * H200 (docs/PERF.md, engine v2: 1126 vs 1004 TFLOP/s at M 16384, N = K = 4096). */
  if (out == MM_GEMM_OUT_BF16) return MM_GEMM_TILE_256x128_SKEW_TMA;
  if (p->n % 256 == 0) return MM_GEMM_TILE_128x256;
  return MM_GEMM_TILE_256x128;
}

extern "C" megamoe_status mm_gemm_wgmma_tiled(const mm_gemm_problem* p, mm_gemm_output out, void* d,
                                              const mm_swiglu_epilogue* swiglu, mm_gemm_tile tile,
                                              cudaStream_t stream) {
  MM_TRY(mm_gemm_check(p, out, d, swiglu));
  if (tile == MM_GEMM_TILE_AUTO) tile = mm_gemm_wgmma_pick_tile(p, out, swiglu);
  if (tile <= MM_GEMM_TILE_AUTO || tile >= MM_GEMM_TILE_COUNT)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: tile %d", (int)tile);
  const int bn = mm_gemm_tile_width(tile);
  if (p->n % bn)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm_wgmma: n = %d is not a multiple of the tile width %d (tile %s)",
                   p->n, bn, mm_gemm_tile_name(tile));
  if (out == MM_GEMM_OUT_SWIGLU_FP8 && swiglu->group == 128 && tile != MM_GEMM_TILE_128x256 &&
      tile != MM_GEMM_TILE_128x256_SKEW && tile != MM_GEMM_TILE_128x256_SKEW_TMA)
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: SwiGLU group 128 needs a 128x256 tile, not %s",
                   mm_gemm_tile_name(tile));
  if (p->num_experts > MM_GEMM_MAX_EXPERTS)
    return mm_fail(MEGAMOE_ERR_BAD_EXPERTS, "gemm_wgmma: num_experts = %d above %d", p->num_experts,
                   MM_GEMM_MAX_EXPERTS);
  /* TMA: global addresses 16-byte aligned; row strides are multiples of 16. */
  if (!aligned(p->a, 16) || !aligned(p->b, 16) || !aligned(p->a_sf, 16))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: a, b and a_sf must be 16-byte aligned");
  if (!aligned(p->b_sf, 4) || !aligned(p->expert_offset, 4) || !aligned(p->expert_count, 4))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: b_sf and the expert arrays must be 4-byte aligned");
  if (out == MM_GEMM_OUT_F32 && !aligned(d, 8))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: fp32 output must be 8-byte aligned");
  if (out == MM_GEMM_OUT_BF16 && !aligned(d, 4))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: bf16 output must be 4-byte aligned");
  if (out == MM_GEMM_OUT_SWIGLU_FP8 &&
      (!aligned(swiglu->out, 2) || !aligned(swiglu->out_sf, 4) || !aligned(swiglu->row_weight, 4)))
    return mm_fail(MEGAMOE_ERR_BAD_ARGUMENT, "gemm_wgmma: swiglu out / out_sf / row_weight misaligned");
  /* Tile indices are int32 on the device. */
  if (((int64_t)p->rows_cap / 64 + p->num_experts) * (p->n / 128) > INT32_MAX)
    return mm_fail(MEGAMOE_ERR_BAD_SHAPE, "gemm_wgmma: too many tiles (rows_cap %d, n %d)", p->rows_cap, p->n);

  mm_gemm_dev_args args;
  args.b_sf = p->b_sf;
  args.expert_offset = p->expert_offset;
  args.expert_count = p->expert_count;
  args.num_experts = p->num_experts;
  args.rows_cap = p->rows_cap;
  args.n = p->n;
  args.k = p->k;
  args.b_sf_block_n = p->b_sf_block_n;
  args.d = d;
  args.row_weight = nullptr;
  args.out = nullptr;
  args.out_sf = nullptr;
  args.group = 128;
  args.has_clamp = 0;
  args.clamp = 0.f;
  if (out == MM_GEMM_OUT_SWIGLU_FP8) {
    args.row_weight = swiglu->row_weight;
    args.out = swiglu->out;
    args.out_sf = swiglu->out_sf;
    args.group = swiglu->group;
    args.has_clamp = swiglu->has_clamp ? 1 : 0;
    args.clamp = swiglu->clamp;
  }

  switch (tile) {
    case MM_GEMM_TILE_128x256: return launch_tile<128, 256, false>(p, out, args, stream);
    case MM_GEMM_TILE_256x128: return launch_tile<256, 128, false>(p, out, args, stream);
    case MM_GEMM_TILE_128x128: return launch_tile<128, 128, false>(p, out, args, stream);
    case MM_GEMM_TILE_64x256: return launch_tile<64, 256, true>(p, out, args, stream);
    case MM_GEMM_TILE_128x256_SKEW: return launch_tile<128, 256, false, VARIANT_SKEW>(p, out, args, stream);
    case MM_GEMM_TILE_256x128_SKEW: return launch_tile<256, 128, false, VARIANT_SKEW>(p, out, args, stream);
    case MM_GEMM_TILE_128x128_SKEW: return launch_tile<128, 128, false, VARIANT_SKEW>(p, out, args, stream);
    case MM_GEMM_TILE_128x256_SKEW_TMA: return launch_tile<128, 256, false, VARIANT_SKEW_TMA>(p, out, args, stream);
    case MM_GEMM_TILE_256x128_SKEW_TMA: return launch_tile<256, 128, false, VARIANT_SKEW_TMA>(p, out, args, stream);
    case MM_GEMM_TILE_128x128_SKEW_TMA: return launch_tile<128, 128, false, VARIANT_SKEW_TMA>(p, out, args, stream);
    default: break;
  }
  return mm_fail(MEGAMOE_ERR_INTERNAL, "gemm_wgmma: unhandled tile %d", (int)tile);
}

extern "C" megamoe_status mm_gemm_wgmma(const mm_gemm_problem* p, mm_gemm_output out, void* d,
                                        const mm_swiglu_epilogue* swiglu, cudaStream_t stream) {
  return mm_gemm_wgmma_tiled(p, out, d, swiglu, MM_GEMM_TILE_AUTO, stream);
}
