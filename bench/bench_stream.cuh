/* The read-only stream kernel of the bench tools: `megamoe bench-gemm
 * --stream`'s ld row (the weights once, kUnroll 1) and the HBM read rate of
 * the floors (bench_rates.cu, kUnroll 4: enough bytes in flight per SM to
 * saturate HBM). */
#ifndef MEGAMOE_BENCH_STREAM_CUH
#define MEGAMOE_BENCH_STREAM_CUH

#include <stdint.h>

/* Every 16-byte word of p[0, words) once, kUnroll independent loads per
 * thread per step (word i + u * threads, u < kUnroll); with kUnroll > 1,
 * words must be a multiple of the grid's threads times kUnroll. The XOR
 * keeps the loads (sink is written practically never). */
template <int kUnroll>
__global__ void mm_bench_read_stream_kernel(const uint4* p, int64_t words, uint32_t* sink) {
  const int64_t threads = (int64_t)gridDim.x * blockDim.x;
  uint32_t x = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += kUnroll * threads) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(p + i + u * threads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (x == 0x9e3779b9u) *sink = x;
}

#endif
