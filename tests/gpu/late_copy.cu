/* A caller's kernel that writes a layer input late (test_layer.c's
 * programmatic-launch test): it lets its dependents launch at once
 * (griddepcontrol.launch_dependents), spins for a delay, then copies. A
 * forward launched programmatically after it may be scheduled while it
 * spins; unless the forward's kernels wait for it (griddepcontrol.wait)
 * before their first read, they read the input as it was before the copy.
 * One warp, few registers and no shared memory. It still never fits beside
 * a layer CTA on an SM (registers: 256 left per sub-partition, a warp takes
 * at least 512), so the layer's cooperative grid, which starts only when all
 * its CTAs fit, waits for it to leave (test_layer.c says what that means). */
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__global__ void __launch_bounds__(32, 1) lc_late_copy_kernel(uint8_t* dst, const uint8_t* src, size_t bytes, unsigned long long delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long t0, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - t0 < delay_ns);
  for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

/* Declared in layer_case.h (C linkage; the header pulls in CUDA headers that
 * cannot sit inside extern "C", so it is not included here). */
extern "C" int lc_late_copy(void* dst, const void* src, size_t bytes, unsigned delay_us, cudaStream_t stream) {
  lc_late_copy_kernel<<<1, 32, 0, stream>>>((uint8_t*)dst, (const uint8_t*)src, bytes,
                                              (unsigned long long)delay_us * 1000ull);
  return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
