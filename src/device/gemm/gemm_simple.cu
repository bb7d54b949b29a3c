/* The simple grouped FP8 GEMM: CUDA cores, fp32 FMAs on decoded fp8 values.
 * It is the oracle the wgmma engine is tested against and the fallback that
 * keeps the staged arm correct on any GPU. Not tuned.
 *
 * Block tile: 64 rows x (64 * NSUB) columns, K step 64. Each K step's partial
 * sums are promoted into the accumulator with that step's scales, exactly
 * the contract's sum over K blocks of sa * sb * S (a 64-wide step lies inside
 * one 128-wide scale block and inside one a_sf_block-wide A-scale block). */
#include "common.cuh"
#include "gemm/gemm.h"

extern "C" {
#include "host/errors.h"
}

namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kStepK = 64;
constexpr int kThreads = 256; /* 16 x 16 threads, each 4 rows x 4 columns */

struct simple_tile {
  int expert;
  int row0;      /* first pool row of the tile */
  int row_end;   /* end of the expert's valid rows */
};

/* Which expert owns pool m-tile `mtile`, or expert = -1 if the tile holds no
 * valid rows (offsets are multiples of 128, so a 64-row tile never spans two
 * experts). */
__device__ simple_tile locate_tile(const mm_gemm_problem& p, int mtile) {
  simple_tile t{-1, mtile * kTileM, 0};
  int lo = 0, hi = p.num_experts - 1;
  while (lo < hi) { /* last expert with offset <= row0 */
    int mid = (lo + hi + 1) / 2;
    if (p.expert_offset[mid] <= t.row0) lo = mid; else hi = mid - 1;
  }
  int end = p.expert_offset[lo] + p.expert_count[lo];
  if (t.row0 >= p.expert_offset[lo] && t.row0 < end) {
    t.expert = lo;
    t.row_end = end;
  }
  return t;
}

/* Partial product of one 64x64 sub-tile over one K step, from smem. */
__device__ void step_product(const float (*As)[kTileM], const float (*Bs)[kTileN], int ty, int tx,
                             float part[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) part[i][j] = 0.f;
#pragma unroll 8
  for (int k = 0; k < kStepK; ++k) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = As[k][ty * 4 + i];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx * 4 + j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
  }
}

/* Loads 64 rows x 64 K bytes of fp8 at (rows from row0, k0), decoded and
 * transposed into dst[k][row]. */
__device__ void load_tile(const uint8_t* src, int64_t ld, int64_t row0, int k0,
                          float (*dst)[kTileM]) {
  int r = threadIdx.x / 4, c = (threadIdx.x % 4) * 16;
  uint4 v = *reinterpret_cast<const uint4*>(src + (row0 + r) * ld + k0 + c);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
  for (int i = 0; i < 16; ++i) dst[c + i][r] = mm_e4m3_to_float(b[i]);
}

template <int NSUB>
__global__ void __launch_bounds__(kThreads) gemm_simple_kernel(mm_gemm_problem p, mm_gemm_output out,
                                                               void* d, mm_swiglu_epilogue sw) {
  __shared__ float As[kStepK][kTileM];
  __shared__ float Bs[kStepK][kTileN];
  __shared__ float sa[kTileM];

  const simple_tile tile = locate_tile(p, blockIdx.x);
  if (tile.expert < 0) return;
  const int n0 = blockIdx.y * kTileN * NSUB;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const uint8_t* b_expert = p.b + (int64_t)tile.expert * p.n * p.k;
  const int b_sf_rows = p.n / p.b_sf_block_n, b_sf_cols = p.k / 128;
  const float* b_sf_expert = p.b_sf + (int64_t)tile.expert * b_sf_rows * b_sf_cols;

  float acc[NSUB][4][4];
#pragma unroll
  for (int s = 0; s < NSUB; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[s][i][j] = 0.f;

  for (int k0 = 0; k0 < p.k; k0 += kStepK) {
    __syncthreads(); /* previous step's readers of As / sa are done */
    load_tile(p.a, p.k, tile.row0, k0, As);
    if (threadIdx.x < kTileM)
      sa[threadIdx.x] = p.a_sf[(int64_t)(k0 / p.a_sf_block) * p.rows_cap + tile.row0 + threadIdx.x];
#pragma unroll
    for (int s = 0; s < NSUB; ++s) {
      const int nb = n0 + s * kTileN;
      if (s > 0) __syncthreads(); /* readers of the previous Bs are done */
      load_tile(b_expert, p.k, nb, k0, Bs);
      __syncthreads();
      float part[4][4];
      step_product(As, Bs, ty, tx, part);
      const float sb = b_sf_expert[(nb / p.b_sf_block_n) * b_sf_cols + k0 / 128];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float scale = sa[ty * 4 + i] * sb;
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[s][i][j] = fmaf(part[i][j], scale, acc[s][i][j]);
      }
    }
  }

  if (out != MM_GEMM_OUT_SWIGLU_FP8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = tile.row0 + ty * 4 + i;
      if (row >= tile.row_end) continue;
#pragma unroll
      for (int s = 0; s < NSUB; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t idx = (int64_t)row * p.n + n0 + s * kTileN + tx * 4 + j;
          if (out == MM_GEMM_OUT_F32) static_cast<float*>(d)[idx] = acc[s][i][j];
          else static_cast<uint16_t*>(d)[idx] = mm_float_to_bf16(acc[s][i][j]);
        }
    }
    return;
  }

  /* SwiGLU: sub-tiles 2c and 2c+1 are the gate and up halves of 64 a-columns
   * (MM_W1_INTERLEAVE); the block's NSUB/2 * 64 a-columns form one group. */
  if constexpr (NSUB % 2 == 0) {
    const int intermediate = p.n / 2;
    const int a_col0 = n0 / 2; /* first a-column of this block */
    const int group = NSUB / 2 * 64;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = tile.row0 + ty * 4 + i;
      const float w = row < tile.row_end ? sw.row_weight[row] : 0.f;
      float a[NSUB / 2][4];
      float amax = 0.f;
#pragma unroll
      for (int c = 0; c < NSUB / 2; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a[c][j] = mm_swiglu(acc[2 * c][i][j], acc[2 * c + 1][i][j], sw.has_clamp, sw.clamp) * w;
          amax = fmaxf(amax, fabsf(a[c][j]));
        }
      /* The row's group is spread over the 16 threads of this half-warp. */
#pragma unroll
      for (int m = 1; m < 16; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      if (row >= tile.row_end) continue;
      const float sf = mm_group_scale(amax);
#pragma unroll
      for (int c = 0; c < NSUB / 2; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          sw.out[(int64_t)row * intermediate + a_col0 + c * 64 + tx * 4 + j] = mm_float_to_e4m3(a[c][j] / sf);
      if (tx == 0) sw.out_sf[(int64_t)(a_col0 / group) * p.rows_cap + row] = sf;
    }
    (void)group;
  }
}

template <int NSUB>
cudaError_t launch(const mm_gemm_problem& p, mm_gemm_output out, void* d,
                   const mm_swiglu_epilogue& sw, cudaStream_t stream) {
  dim3 grid(p.rows_cap / kTileM, p.n / (kTileN * NSUB));
  gemm_simple_kernel<NSUB><<<grid, kThreads, 0, stream>>>(p, out, d, sw);
  return cudaGetLastError();
}

}  // namespace

extern "C" megamoe_status mm_gemm_simple(const mm_gemm_problem* p, cudaStream_t stream) {
  MM_TRY(mm_gemm_check(p));
  if (p->out_kind == MM_GEMM_OUT_BF16_SCATTER || p->ready.counters || p->expert_a_offset)
    return mm_fail(MEGAMOE_ERR_NOT_IMPLEMENTED,
                   "gemm_simple: the oracle engine has no scatter output, rows-ready wait or separate A rows");
  const mm_gemm_output out = (mm_gemm_output)p->out_kind;
  const mm_swiglu_epilogue& sw = p->swiglu;
  cudaError_t err;
  if (out != MM_GEMM_OUT_SWIGLU_FP8) err = launch<1>(*p, out, p->d, sw, stream);
  else if (sw.group == 64) err = launch<2>(*p, out, p->d, sw, stream);
  else err = launch<4>(*p, out, p->d, sw, stream);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "gemm_simple launch: %s", cudaGetErrorString(err));
  return MEGAMOE_OK;
}
