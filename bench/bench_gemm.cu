/* `megamoe bench-gemm`: our grouped FP8 GEMM (wgmma engine) against cuBLASLt
 * block-scaled FP8 (A: VEC128_32F per row per 128-K block, B: BLK128x128_32F)
 * on the same data in one run (issue 4).
 *
 * Shapes: (N, K) in {(4096, 4096), (4096, 2048), (6144, 7168), (7168, 3072)},
 * total rows M in {256, 2048, 16384, 65536} spread over 32 experts (M / 32
 * rows each, padded to 128 in the pool). cuBLASLt 13.1 has no grouped batch
 * mode, so its arm is one cublasLtMatmul per expert (32 per call, bf16 out);
 * ours is one launch (bf16 out).
 *
 * Timing: CUDA events around each call; before every timed call the L2 is
 * flushed (a 256 MB memset) and a 0.5 ms spin kernel lets the host enqueue
 * the call before the GPU reaches it (so host launch overhead, 32 launches
 * for cuBLASLt, is not timed); 3 warm-up rounds, then `iters` rounds (>= 20)
 * alternating the arms' order (A B, B A, ...); each cell is the median.
 * TFLOP/s = 2 M N K / t. HBM floor = E N K bytes at the GPU's read rate
 * (reading the weights once; measured first, bench_rates.h, or the design
 * rate where that fails). diff (DESIGN.md's metric) of ours vs cuBLASLt is printed per
 * shape.
 *
 * Options: --quick (N = K = 4096 only, M in {256, 16384}), --nk N,K and
 * --m M (one shape), --iters I, --tiles (also time every tile shape of ours),
 * --no-check (skip the diff), --stream (no GEMM: the weights read once through
 * ld.global.v4 and through the tile's B boxes by TMA, no math; what feeds the
 * decode GEMM, docs/PERF.md), --mainloop (no GEMM: the math warpgroups' K loop
 * alone per loop structure, bench_mainloop.cu). */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_rates.h"
#include "bench_stream.cuh"
#include "gemm/gemm.h"
#include "gemm/gemm_cfg.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "gemm_cublaslt.cuh"

namespace {

#define BENCH_CUDA(call)                                                                              \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      fprintf(stderr, "bench-gemm: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)

const int kExperts = MM_BENCH_GEMM_EXPERTS;

__global__ void bench_gemm_spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

/* sums[0] += a * b, sums[1] += a * a, sums[2] += b * b over bf16 pairs:
 * a = ours [rows_cap][n]; b = cuBLASLt's, whose expert blocks (rows_per_block
 * pool rows each, count valid) are written transposed, [n][count]. */
__global__ void bench_gemm_diff_kernel(const uint16_t* a, const uint16_t* b, int64_t rows_cap, int n,
                                       int64_t rows_per_block, int count, double* sums) {
  double ab = 0, aa = 0, bb = 0;
  const int64_t total = rows_cap * n;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / n, col = i % n, e = r / rows_per_block, local = r % rows_per_block;
    if (local >= count) continue;
    const int64_t j = e * rows_per_block * n + col * count + local;
    const double x = __uint_as_float((uint32_t)a[i] << 16), y = __uint_as_float((uint32_t)b[j] << 16);
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  for (int o = 16; o > 0; o >>= 1) {
    ab += __shfl_xor_sync(0xffffffffu, ab, o);
    aa += __shfl_xor_sync(0xffffffffu, aa, o);
    bb += __shfl_xor_sync(0xffffffffu, bb, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(sums + 0, ab);
    atomicAdd(sums + 1, aa);
    atomicAdd(sums + 2, bb);
  }
}

int cmp_float(const void* x, const void* y) {
  const float a = *(const float*)x, b = *(const float*)y;
  return a < b ? -1 : a > b;
}

float median(float* v, int n) {
  qsort(v, (size_t)n, sizeof(float), cmp_float);
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* One grouped problem on the device. */
struct gemm_data {
  int n, k, m, rows_per_expert, rows_cap;
  uint8_t* a;
  float* a_sf;
  float* a_sf_lt; /* [E][K/128][c]: cuBLASLt's packed VEC128 layout */
  int* offset;
  int* count;
  uint16_t* d_ours;  /* [rows_cap, n] bf16, or fp32 (sized for it) */
  uint16_t* d_lt;
  uint8_t* q;        /* SwiGLU output [rows_cap, n / 2] fp8 */
  float* q_sf;       /* [n / 2 / 128][rows_cap] */
  float* row_weight; /* [rows_cap] */
  mm_gemm_problem gp;
};

struct arm_ctx {
  gemm_data* g;
  const uint8_t* b;
  const float* b_sf;
  mm_lt* lt;
  mm_gemm_plan plan; /* ours: made once per (shape, tile), as the layer does */
  int sms;           /* the device's SMs */
  int stream_stages; /* --stream: the TMA stream's stages */
  uint32_t* sink;    /* --stream: where the streams leave a word (so nothing is optimized away) */
};

/* ---- --stream: the weight stream alone (no math) -------------------------------------------- */

/* The TMA stream's dynamic shared memory: `stages` boxes of box_rows rows of
 * one K block, and 1 KB to align them for the 128-byte swizzle. */
constexpr size_t kStreamSmemMax = 201 * 1024;
size_t stream_smem_bytes(int stages, int box_rows) { return (size_t)stages * box_rows * MM_GEMM_BLOCK_K + 1024; }

/* Every weight byte once through the GEMM's own B tensor map (its box: 128
 * bytes x BN rows, 128-byte swizzle), one CTA per SM: thread 0 loads the
 * boxes of the CTA's column tiles (stride order, all K blocks) into
 * `stages` stages, thread 32 releases each stage once it has landed. The
 * producer and the pipeline of the GEMM without its consumer. */
__global__ void __launch_bounds__(64, 1)
    bench_tma_stream_kernel(const __grid_constant__ CUtensorMap tm_b, int tiles, int box_rows, int kblocks,
                            int stages, uint32_t* sink) {
  extern __shared__ __align__(1024) uint8_t stage_mem[];
  __shared__ __align__(8) uint64_t bars[2 * 8]; /* full and empty barriers of up to 8 stages */
  /* The 128-byte swizzle wants 1024-byte aligned stages (1 KB extra asked). */
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(stage_mem) + 1023u) & ~1023u;
  const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * 8;
  const uint32_t box_bytes = (uint32_t)box_rows * MM_GEMM_BLOCK_K;
  if (threadIdx.x == 0)
    for (int s = 0; s < stages; ++s) {
      mm_mbar_init(full0 + 8 * s, 1);
      mm_mbar_init(empty0 + 8 * s, 1);
    }
  mm_fence_mbar_init();
  __syncthreads();
  uint32_t stage = 0, phase = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x)
    for (int kb = 0; kb < kblocks; ++kb) {
      if (threadIdx.x == 0) {
        mm_mbar_wait(empty0 + 8 * stage, phase ^ 1u);
        mm_mbar_arrive_expect_tx(full0 + 8 * stage, box_bytes);
        mm_tma_load_2d(base + stage * box_bytes, &tm_b, full0 + 8 * stage, kb * MM_GEMM_BLOCK_K, t * box_rows);
      } else if (threadIdx.x == 32) {
        mm_mbar_wait(full0 + 8 * stage, phase);
        mm_mbar_arrive(empty0 + 8 * stage);
      }
      if (++stage == (uint32_t)stages) {
        stage = 0;
        phase ^= 1u;
      }
    }
  if (threadIdx.x == 32 && stage_mem[1024] == 0x5a && stage_mem[1025] == 0xa5) *sink = 1;
}

int run_ld_stream(arm_ctx* c) {
  const gemm_data* g = c->g;
  /* Every weight byte once through ld.global.v4 (4 CTAs of 256 threads per SM). */
  mm_bench_read_stream_kernel<1><<<4 * c->sms, 256>>>(reinterpret_cast<const uint4*>(g->gp.b),
                                                      (int64_t)kExperts * g->n * g->k / 16, c->sink);
  BENCH_CUDA(cudaGetLastError());
  return 0;
}

int run_tma_stream(arm_ctx* c) {
  const gemm_data* g = c->g;
  const int box_rows = mm_gemm_tile_width(c->plan.tile);
  bench_tma_stream_kernel<<<c->sms, 64, stream_smem_bytes(c->stream_stages, box_rows)>>>(
      *reinterpret_cast<const CUtensorMap*>(c->plan.maps[1]), kExperts * g->n / box_rows, box_rows,
      g->k / MM_GEMM_BLOCK_K, c->stream_stages, c->sink);
  BENCH_CUDA(cudaGetLastError());
  return 0;
}

/* Makes the plan of our arm for a tile (AUTO: the engine's pick) and the
 * output kind timed. */
int plan_ours(arm_ctx* c, mm_gemm_tile tile, int out_kind) {
  mm_gemm_problem* p = &c->g->gp;
  p->out_kind = out_kind;
  p->d = c->g->d_ours;
  p->swiglu.row_weight = c->g->row_weight;
  p->swiglu.group = 128;
  p->swiglu.out = c->g->q;
  p->swiglu.out_sf = c->g->q_sf;
  const megamoe_status st = mm_gemm_plan_make(p, tile, &c->plan);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "bench-gemm: ours (tile %s): %s: %s\n", mm_gemm_tile_name(tile), megamoe_status_string(st),
            megamoe_last_error());
    return 1;
  }
  return 0;
}

/* Runs one arm once on stream 0. Returns 0 on success. */
int run_ours(arm_ctx* c) {
  const megamoe_status st = mm_gemm_plan_launch(&c->plan, 0);
  if (st != MEGAMOE_OK) {
    fprintf(stderr, "bench-gemm: ours: %s: %s\n", megamoe_status_string(st), megamoe_last_error());
    return 1;
  }
  return 0;
}

int run_lt(arm_ctx* c) {
  gemm_data* g = c->g;
  const int L = g->k / 128, cnt = g->rows_per_expert;
  for (int e = 0; e < kExperts; ++e) {
    const int64_t off = (int64_t)e * g->rows_cap / kExperts;
    if (mm_lt_matmul(c->lt, cnt, g->n, g->k, g->a + off * g->k, g->a_sf_lt + (int64_t)e * L * cnt,
                     c->b + (int64_t)e * g->n * g->k, c->b_sf + (int64_t)e * (g->n / 128) * L, g->d_lt + off * g->n,
                     0)) {
      fprintf(stderr, "bench-gemm: cuBLASLt: %s\n", c->lt->error);
      return 1;
    }
  }
  return 0;
}

/* Times one call: flush, spin, events around the call. */
int time_call(int (*fn)(arm_ctx*), arm_ctx* c, void* flush, size_t flush_bytes, int round, cudaEvent_t e0,
              cudaEvent_t e1, float* ms) {
  BENCH_CUDA(cudaMemsetAsync(flush, round & 0xFF, flush_bytes, 0));
  bench_gemm_spin_kernel<<<1, 1>>>(500000ull);
  BENCH_CUDA(cudaEventRecord(e0, 0));
  if (fn(c)) return 1;
  BENCH_CUDA(cudaEventRecord(e1, 0));
  BENCH_CUDA(cudaEventSynchronize(e1));
  BENCH_CUDA(cudaEventElapsedTime(ms, e0, e1));
  return 0;
}

/* --stream rows: ld.global.v4, then the GEMM's B boxes through TMA at 2, 4
 * and 6 stages (as many as fit), each the median of o->iters calls. */
int time_streams(arm_ctx* c, const mm_bench_gemm_opts* o, void* flush, size_t flush_bytes, cudaEvent_t e0,
                 cudaEvent_t e1, float* t, double hbm_us) {
  const double bytes = (double)kExperts * c->g->n * c->g->k;
  const int box_rows = mm_gemm_tile_width(c->plan.tile);
  BENCH_CUDA(
      cudaFuncSetAttribute(bench_tma_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStreamSmemMax));
  for (int v = 0; v < 4; ++v) {
    const int stages = v == 0 ? 0 : 2 * v; /* at most 8: the kernel's barriers */
    if (stream_smem_bytes(stages, box_rows) > kStreamSmemMax) break;
    c->stream_stages = stages;
    int (*fn)(arm_ctx*) = v == 0 ? run_ld_stream : run_tma_stream;
    for (int w = 0; w < 2; ++w)
      if (fn(c)) return 1;
    for (int it = 0; it < o->iters; ++it)
      if (time_call(fn, c, flush, flush_bytes, it, e0, e1, &t[it])) return 1;
    const double us = 1e3 * median(t, o->iters);
    char how[96];
    if (v == 0) snprintf(how, sizeof how, "ld.global.v4, %d x 4 CTAs", c->sms);
    else snprintf(how, sizeof how, "TMA box 128 B x %d rows, %d stages, %d CTAs", box_rows, stages, c->sms);
    printf("stream N %d K %d (tile %s at M %d): %s: %8.1f us, %5.2f TB/s (floor %.1f us)\n", c->g->n, c->g->k,
           mm_gemm_tile_name(c->plan.tile), c->g->m, how, us, bytes / us * 1e-6, hbm_us);
  }
  fflush(stdout);
  return 0;
}

int data_alloc(gemm_data* g, int n, int k, int m, uint64_t seed) {
  memset(g, 0, sizeof *g);
  g->n = n;
  g->k = k;
  g->m = m;
  g->rows_per_expert = m / kExperts;
  const int pad = (g->rows_per_expert + 127) / 128 * 128;
  g->rows_cap = pad * kExperts;
  const int64_t R = g->rows_cap, L = k / 128;
  BENCH_CUDA(cudaMalloc((void**)&g->a, R * k));
  BENCH_CUDA(cudaMalloc((void**)&g->a_sf, sizeof(float) * L * R));
  BENCH_CUDA(cudaMalloc((void**)&g->a_sf_lt, sizeof(float) * L * g->rows_per_expert * kExperts));
  BENCH_CUDA(cudaMalloc((void**)&g->offset, sizeof(int) * (kExperts + 1)));
  BENCH_CUDA(cudaMalloc((void**)&g->count, sizeof(int) * kExperts));
  BENCH_CUDA(cudaMalloc((void**)&g->d_ours, R * n * 4));
  BENCH_CUDA(cudaMalloc((void**)&g->q, R * n / 2));
  BENCH_CUDA(cudaMalloc((void**)&g->q_sf, sizeof(float) * (n / 2 / 128) * R));
  BENCH_CUDA(cudaMalloc((void**)&g->row_weight, sizeof(float) * R));
  BENCH_CUDA(cudaMalloc((void**)&g->d_lt, R * n * 2));
  if (mm_bench_fill_fp8(g->a, (size_t)(R * k), 1.0f, seed, NULL) ||
      mm_bench_fill_uniform(g->a_sf, (size_t)(L * R), 0x1p-10f, 0x1p-6f, seed + 1, NULL) ||
      mm_bench_fill_uniform(g->row_weight, (size_t)R, 0.05f, 1.0f, seed + 2, NULL)) {
    fprintf(stderr, "bench-gemm: fill failed\n");
    return 1;
  }
  int h_off[kExperts + 1], h_cnt[kExperts];
  for (int e = 0; e <= kExperts; ++e) h_off[e] = e * pad;
  for (int e = 0; e < kExperts; ++e) h_cnt[e] = g->rows_per_expert;
  BENCH_CUDA(cudaMemcpy(g->offset, h_off, sizeof h_off, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(g->count, h_cnt, sizeof h_cnt, cudaMemcpyHostToDevice));
  for (int e = 0; e < kExperts; ++e)
    BENCH_CUDA(cudaMemcpy2D(g->a_sf_lt + (int64_t)e * L * g->rows_per_expert, sizeof(float) * g->rows_per_expert,
                            g->a_sf + h_off[e], sizeof(float) * R, sizeof(float) * g->rows_per_expert, L,
                            cudaMemcpyDeviceToDevice));
  /* b and b_sf are set by the caller. */
  g->gp = mm_gemm_problem_make(g->a, g->a_sf, 128, NULL, NULL, 128, g->offset, g->count, kExperts, g->rows_cap, n, k);
  return 0;
}

void data_free(gemm_data* g) {
  cudaFree(g->a);
  cudaFree(g->a_sf);
  cudaFree(g->a_sf_lt);
  cudaFree(g->offset);
  cudaFree(g->count);
  cudaFree(g->d_ours);
  cudaFree(g->d_lt);
  cudaFree(g->q);
  cudaFree(g->q_sf);
  cudaFree(g->row_weight);
  memset(g, 0, sizeof *g);
}

}  // namespace

extern "C" int mm_bench_gemm_run(const mm_bench_gemm_opts* opts) {
  const mm_bench_gemm_opts o = *opts; /* parsed and checked by mm_bench_gemm_parse */
  if (o.mainloop) return mm_bench_mainloop_run(8192) ? 1 : 0;

  static const int kNK[4][2] = {{4096, 4096}, {4096, 2048}, {6144, 7168}, {7168, 3072}};
  static const int kM[4] = {256, 2048, 16384, 65536};
  int nk[4][2], num_nk = 0, ms[4], num_m = 0;
  if (o.n) {
    nk[0][0] = o.n;
    nk[0][1] = o.k;
    num_nk = 1;
  } else {
    for (int i = 0; i < (o.quick ? 1 : 4); ++i) {
      nk[num_nk][0] = kNK[i][0];
      nk[num_nk][1] = kNK[i][1];
      num_nk++;
    }
  }
  if (o.m) {
    ms[num_m++] = o.m;
  } else {
    for (int i = 0; i < 4; ++i)
      if (!o.quick || kM[i] == 256 || kM[i] == 16384) ms[num_m++] = kM[i];
  }

  int dev = 0;
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  const char* out_name = o.out == MM_GEMM_OUT_F32 ? "fp32" : o.out == MM_GEMM_OUT_SWIGLU_FP8 ? "SwiGLU + fp8 (G 128)" : "bf16";
  printf("bench-gemm on %s (%d SMs): grouped FP8 GEMM, %d experts, %s out; ours = one persistent launch, "
         "cuBLASLt = %d cublasLtMatmul calls, bf16 out (block-scaled VEC128_32F x BLK128x128_32F, no grouped mode in "
         "this cuBLASLt); median of %d calls, L2 flushed before each\n",
         prop.name, prop.multiProcessorCount, kExperts, out_name, kExperts, o.iters);

  mm_bench_rates rates;
  char why[256];
  if (mm_bench_rates_measure(&rates, 0, why, sizeof why) != 0)
    fprintf(stderr, "bench-gemm: measuring the HBM read rate failed (%s): the design rate used\n", why);
  printf("hbm_us: the weights read once at %.0f GB/s (%s)\n", rates.hbm_read_gbs,
         rates.source == MM_RATES_MEASURED ? "measured on this GPU: a 2 GiB read-only stream"
                                           : "the design rate of the H200 machines");

  mm_lt lt;
  if (mm_lt_init(&lt)) {
    fprintf(stderr, "bench-gemm: cuBLASLt init: %s\n", lt.error);
    return 1;
  }
  const size_t flush_bytes = (size_t)256 << 20;
  void* flush = NULL;
  double* d_sums = NULL;
  BENCH_CUDA(cudaMalloc(&flush, flush_bytes));
  BENCH_CUDA(cudaMalloc((void**)&d_sums, 3 * sizeof(double)));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  float* t_ours = (float*)malloc(sizeof(float) * o.iters);
  float* t_lt = (float*)malloc(sizeof(float) * o.iters);
  if (!t_ours || !t_lt) {
    fprintf(stderr, "bench-gemm: out of host memory\n");
    return 1;
  }

  if (!o.stream)
    printf("%6s %6s %6s %10s %10s %9s %10s %9s %8s %9s %10s\n", "N", "K", "M", "tile", "ours_us", "ours_TF/s",
           "cublas_us", "cublas_TF", "lt/ours", "hbm_us", "diff");
  int rc = 0;
  for (int si = 0; si < num_nk && rc == 0; ++si) {
    const int n = nk[si][0], k = nk[si][1], L = k / 128;
    uint8_t* b = NULL;
    float* b_sf = NULL;
    BENCH_CUDA(cudaMalloc((void**)&b, (size_t)kExperts * n * k));
    BENCH_CUDA(cudaMalloc((void**)&b_sf, sizeof(float) * kExperts * (n / 128) * L));
    if (mm_bench_fill_fp8(b, (size_t)kExperts * n * k, 1.0f, 1000 + si, NULL) ||
        mm_bench_fill_uniform(b_sf, (size_t)kExperts * (n / 128) * L, 0x1p-10f, 0x1p-6f, 2000 + si, NULL)) {
      fprintf(stderr, "bench-gemm: fill failed\n");
      return 1;
    }
    const double hbm_us = (double)kExperts * n * k / (rates.hbm_read_gbs * 1e9) * 1e6;

    for (int mi = 0; mi < num_m && rc == 0; ++mi) {
      const int m = ms[mi];
      gemm_data g;
      if (data_alloc(&g, n, k, m, 3000 + 17 * si + mi)) {
        rc = 1;
        break;
      }
      g.gp.b = b;
      g.gp.b_sf = b_sf;
      arm_ctx c;
      memset(&c, 0, sizeof c);
      c.g = &g;
      c.b = b;
      c.b_sf = b_sf;
      c.lt = &lt;
      c.sms = prop.multiProcessorCount;
      c.sink = (uint32_t*)d_sums;
      if (plan_ours(&c, (mm_gemm_tile)o.tile, o.out)) {
        data_free(&g);
        rc = 1;
        break;
      }
      if (o.stream) { /* the weight stream alone, no GEMM */
        rc = time_streams(&c, &o, flush, flush_bytes, e0, e1, t_ours, hbm_us);
        data_free(&g);
        continue;
      }
      const mm_gemm_tile auto_tile = c.plan.tile;
      const double flops = 2.0 * m * (double)n * k;

      /* Warm-up (also builds cuBLASLt's plan), then alternating rounds. A
       * shape cuBLASLt refuses is reported as n/a; a failure of ours stops. */
      int lt_ok = 1;
      /* The diff against cuBLASLt compares bf16 outputs only. */
      const int same_output = o.out == MM_GEMM_OUT_BF16;
      for (int w = 0; w < 3 && rc == 0; ++w) {
        rc = run_ours(&c);
        if (lt_ok && run_lt(&c)) lt_ok = 0;
      }
      BENCH_CUDA(cudaDeviceSynchronize());
      for (int it = 0; it < o.iters && rc == 0; ++it) {
        t_lt[it] = NAN;
        if (it % 2 == 0) {
          rc = time_call(run_ours, &c, flush, flush_bytes, it, e0, e1, &t_ours[it]);
          if (rc == 0 && lt_ok) lt_ok = !time_call(run_lt, &c, flush, flush_bytes, it, e0, e1, &t_lt[it]);
        } else {
          if (lt_ok) lt_ok = !time_call(run_lt, &c, flush, flush_bytes, it, e0, e1, &t_lt[it]);
          if (rc == 0) rc = time_call(run_ours, &c, flush, flush_bytes, it, e0, e1, &t_ours[it]);
        }
      }
      if (rc) {
        data_free(&g);
        break;
      }
      const double us_ours = 1e3 * median(t_ours, o.iters);
      const double us_lt = lt_ok ? 1e3 * median(t_lt, o.iters) : NAN;

      double dv = NAN;
      if (o.check && same_output) {
        BENCH_CUDA(cudaMemset(g.d_ours, 0, (size_t)g.rows_cap * n * 2));
        BENCH_CUDA(cudaMemset(g.d_lt, 0, (size_t)g.rows_cap * n * 2));
        BENCH_CUDA(cudaMemset(d_sums, 0, 3 * sizeof(double)));
        if (run_ours(&c)) {
          rc = 1;
          data_free(&g);
          break;
        }
        if (lt_ok && run_lt(&c)) lt_ok = 0;
        bench_gemm_diff_kernel<<<1024, 256>>>(g.d_ours, g.d_lt, (int64_t)g.rows_cap, n,
                                              (int64_t)g.rows_cap / kExperts, g.rows_per_expert, d_sums);
        double sums[3];
        BENCH_CUDA(cudaMemcpy(sums, d_sums, sizeof sums, cudaMemcpyDeviceToHost));
        dv = !lt_ok ? NAN : sums[1] + sums[2] > 0 ? 1.0 - 2.0 * sums[0] / (sums[1] + sums[2]) : 0.0;
      }
      printf("%6d %6d %6d %10s %10.1f %9.1f %10.1f %9.1f %8.3f %9.1f %10.2e\n", n, k, m, mm_gemm_tile_name(auto_tile),
             us_ours, flops / us_ours * 1e-6, us_lt, flops / us_lt * 1e-6, us_lt / us_ours, hbm_us, dv);
      fflush(stdout);

      if (o.tiles) {
        for (int t = MM_GEMM_TILE_128x256; t < MM_GEMM_TILE_COUNT && rc == 0; ++t) {
          if (n % mm_gemm_tile_width((mm_gemm_tile)t)) continue;
          /* Tiles without this output (or this group) are left out. */
          if (mm_gemm_tile_check((mm_gemm_tile)t, o.out, 128, 128, kExperts, NULL) != MEGAMOE_OK) continue;
          rc = plan_ours(&c, (mm_gemm_tile)t, o.out);
          for (int it = 0; it < o.iters && rc == 0; ++it)
            rc = time_call(run_ours, &c, flush, flush_bytes, it, e0, e1, &t_ours[it]);
          if (rc) break;
          const double us = 1e3 * median(t_ours, o.iters);
          printf("%6d %6d %6d %10s %10.1f %9.1f %10s %9s %8.3f %9.1f\n", n, k, m, mm_gemm_tile_name((mm_gemm_tile)t), us,
                 flops / us * 1e-6, "", "", us_lt / us, hbm_us);
          fflush(stdout);
        }
      }
      data_free(&g);
    }
    cudaFree(b);
    cudaFree(b_sf);
  }
  free(t_ours);
  free(t_lt);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(flush);
  cudaFree(d_sums);
  mm_lt_destroy(&lt);
  return rc;
}
