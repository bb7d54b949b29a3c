/* Controls for scripts/sanitize.sh: each test plants one bug that one
 * compute-sanitizer tool must report. The script runs them (with
 * MEGAMOE_SANITIZE_CONTROL=1) on every rank process of an EP run, the way the
 * layer tests run, and requires the tool to report the bug in every rank's
 * log: a clean report of the real targets then means "checked and clean",
 * not "the tool never saw the processes the launcher forked".
 *
 * Without a sanitizer every planted bug is harmless on the hardware: the
 * write past the end lands inside the allocation's rounding, the race and the
 * uninitialized read change no control flow, and the threads that skip the
 * barrier exit. A test passes when its kernel ran; its verdict is the
 * sanitizer's. After memcheck reports an error the context may be unusable:
 * the test reports what CUDA said and still passes. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "gpu_suites.h"

namespace {

/* 1000 bytes: memcheck knows the requested size, so index 250 is past the
 * end, while the allocator's rounding keeps it mapped. */
const size_t kBufferInts = 250;

__global__ void write_one_past_end(int* buf, size_t n) {
  if (threadIdx.x == 0) buf[n] = 7; /* memcheck: invalid __global__ write, 0 bytes after the allocation */
}

/* Both warps write s[t % 32], then each thread reads a word the other warp
 * may have written, with no barrier between the warps: write-after-write
 * and read-after-write hazards across warps (racecheck reports them as
 * errors). Plain shared memory, not volatile: the first control (warp 0
 * writes a volatile array, warp 1 reads it) was reported by no run on the
 * H200 (docs/RELIABILITY.md). */
__global__ void shared_race(int* out) {
  __shared__ int s[32];
  const int t = (int)threadIdx.x;
  s[t % 32] = t + 1;
  __syncwarp(); /* orders the warp's own lanes only, not the other warp */
  out[t] = s[(t + 1) % 32];
}

/* Two planted barrier misuses. First, every lane of warp 0 runs a
 * __syncwarp whose mask names lanes 0..15 only: lanes 16..31 execute a warp
 * barrier that does not name them (invalid arguments; added in the ninth
 * session because the tool on sm_90 did not report the second plant). Then
 * threads 48..63 skip the __syncthreads that threads 0..47 reach: a barrier
 * under divergence, inside warp 1 (the pattern of the tool's own
 * documentation, reported only before independent thread scheduling). The
 * skipping threads exit, and an exited thread counts as arrived, so the
 * hardware does not hang. Run only under scripts/sanitize.sh. */
__global__ void divergent_barrier(int* out) {
  __shared__ int s[48];
  const int t = (int)threadIdx.x;
  if (t < 32) __syncwarp(0x0000ffffu);
  if (t < 48) {
    s[t] = t;
    __syncthreads();
    out[t] = s[(t + 1) % 48];
  }
}

/* Reads a buffer nothing ever wrote (initcheck). */
__global__ void read_unwritten(const int* never_written, int* out) {
  if (threadIdx.x == 0) out[0] = never_written[3] & 1;
}

/* Frees, reports what the kernel's completion said, and passes: the verdict
 * is the sanitizer's (see the top of the file). */
mm_test_result finish(const char* what, void* a, void* b) {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) printf("    %s: after the planted bug CUDA says %s (expected under the tool)\n", what, cudaGetErrorString(e));
  cudaFree(a);
  cudaFree(b);
  return MM_TEST_PASS;
}

mm_test_result t_memcheck_control(void) {
  int* buf = NULL;
  CUDA_OK(cudaMalloc((void**)&buf, kBufferInts * sizeof(int)));
  write_one_past_end<<<1, 32>>>(buf, kBufferInts);
  CUDA_OK(cudaGetLastError());
  return finish("memcheck control", buf, NULL);
}

mm_test_result t_racecheck_control(void) {
  int* out = NULL;
  CUDA_OK(cudaMalloc((void**)&out, 64 * sizeof(int)));
  CUDA_OK(cudaMemset(out, 0, 64 * sizeof(int)));
  shared_race<<<1, 64>>>(out);
  CUDA_OK(cudaGetLastError());
  return finish("racecheck control", out, NULL);
}

mm_test_result t_synccheck_control(void) {
  int* out = NULL;
  CUDA_OK(cudaMalloc((void**)&out, 64 * sizeof(int)));
  CUDA_OK(cudaMemset(out, 0, 64 * sizeof(int)));
  divergent_barrier<<<1, 64>>>(out);
  CUDA_OK(cudaGetLastError());
  return finish("synccheck control", out, NULL);
}

mm_test_result t_initcheck_control(void) {
  int *never_written = NULL, *out = NULL;
  CUDA_OK(cudaMalloc((void**)&never_written, kBufferInts * sizeof(int)));
  CUDA_OK(cudaMalloc((void**)&out, sizeof(int)));
  CUDA_OK(cudaMemset(out, 0, sizeof(int)));
  read_unwritten<<<1, 32>>>(never_written, out);
  CUDA_OK(cudaGetLastError());
  return finish("initcheck control", never_written, out);
}

}  // namespace

/* The script filters on "control: <tool>". */
extern "C" const mm_test mm_sanitize_controls[] = {
    {"sanitize control: memcheck (a write one past the end)", t_memcheck_control},
    {"sanitize control: racecheck (a shared-memory race between warps)", t_racecheck_control},
    {"sanitize control: synccheck (a __syncwarp mask that leaves out lanes running it)", t_synccheck_control},
    {"sanitize control: initcheck (a read of never-written memory)", t_initcheck_control},
    {NULL, NULL},
};
