/* Device-side random fills for the benchmark: weights of the flash and pro
 * shapes are gigabytes, too many to draw on the host. */
#include <cuda_fp8.h>
#include <stdint.h>

#include "bench.h"

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float unit(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

__global__ void fill_fp8_kernel(uint8_t* dst, size_t n, float spread, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + i);
    /* Sum of four uniforms: roughly normal, mean 0, variance 1/3. */
    const float s = unit(h) + unit(h << 16) + unit(h << 32) + unit(h << 48) - 2.0f;
    dst[i] = (uint8_t)__nv_cvt_float_to_fp8(s * 1.7320508f * spread, __NV_SATFINITE, __NV_E4M3);
  }
}

__global__ void fill_uniform_kernel(float* dst, size_t n, float lo, float hi, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = lo + (hi - lo) * unit(mix(seed * 0x9e3779b97f4a7c15ull + i));
}

extern "C" int mm_bench_fill_fp8(void* dst, size_t n, float spread, uint64_t seed, void* stream) {
  fill_fp8_kernel<<<1024, 256, 0, (cudaStream_t)stream>>>((uint8_t*)dst, n, spread, seed);
  return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int mm_bench_fill_uniform(float* dst, size_t n, float lo, float hi, uint64_t seed, void* stream) {
  fill_uniform_kernel<<<1024, 256, 0, (cudaStream_t)stream>>>(dst, n, lo, hi, seed);
  return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
