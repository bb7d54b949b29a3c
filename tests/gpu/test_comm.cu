/* GPU tests of the in-kernel communication primitives (src/device/comm/):
 * counter waits (acquire) with a deadline that records and leaves, the grid
 * barrier (correctness over many rounds, and its deadline), the CTA publish
 * of stores made by other threads, and TMA reading rows that warps wrote
 * after the async-proxy fence. One GPU.
 *
 * Every data check compares what a consumer read with the values the
 * producer was meant to write (a hash of seed, round and index; buffers are
 * poisoned with 0xFF first). The "control" tests plant the bug a check is
 * for (a release before the data, no grid barrier, no CTA barrier before the
 * release, each with a delay that makes the race certain) and assert that
 * the same check then FAILS: they prove the checks can fail. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/grid.cuh"
#include "comm/wait.cuh"
#include "gpu_suites.h"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"

namespace {

const uint64_t kLongTimeoutNs = 10ull * 1000 * 1000 * 1000; /* positive tests: must never fire */

uint32_t test_seed() {
  static uint32_t seed = 0;
  if (seed == 0) {
    const char* s = getenv("MEGAMOE_TEST_SEED");
    seed = (uint32_t)(s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL)) | 1u;
    printf("    comm tests: seed %u (MEGAMOE_TEST_SEED=%u reproduces)\n", seed, seed);
  }
  return seed;
}

/* The value the producer writes at (round, index): never the 0xFFFFFFFF poison. */
__host__ __device__ uint32_t tc_value(uint32_t seed, uint32_t round, uint32_t i) {
  uint32_t x = seed ^ (round * 0x9E3779B1u) ^ (i * 0x85EBCA77u);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x & 0x7fffffffu;
}

__device__ void tc_spin_ns(uint64_t ns) {
  const uint64_t t0 = mm_globaltimer_ns();
  while (mm_globaltimer_ns() - t0 < ns) {
  }
}

/* Compares out[round * n + i] with tc_value(seed, round, i); returns the
 * number of mismatches and prints the first. */
long count_mismatches(const uint32_t* out, uint32_t seed, int rounds, int n, const char* what, int quiet) {
  long bad = 0;
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < n; ++i) {
      const uint32_t want = tc_value(seed, (uint32_t)r, (uint32_t)i);
      if (out[(size_t)r * n + i] != want) {
        if (bad == 0 && !quiet)
          fprintf(stderr, "    %s: round %d index %d read 0x%08x, want 0x%08x\n", what, r, i, out[(size_t)r * n + i],
                  want);
        ++bad;
      }
    }
  return bad;
}

mm_device_status* new_status(uint64_t forward) {
  mm_device_status h;
  memset(&h, 0, sizeof h);
  h.forward = forward;
  mm_device_status* d = NULL;
  if (cudaMalloc((void**)&d, sizeof h) != cudaSuccess) return NULL;
  if (cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaFree(d);
    return NULL;
  }
  return d;
}

/* ---- 1. counter wait satisfied by another CTA ------------------------------
 * CTA 0 thread 0 writes round r's n values, then release-adds the counter;
 * CTA 1 thread 0 waits for counter >= r + 1 (acquire) and copies what it
 * reads. Planted: release first, then (200 us later) the data. */
template <bool kSys>
__global__ void k_counter_single(uint32_t* data, int32_t* counter, uint32_t* out, int rounds, int n, uint32_t seed,
                                 mm_device_status* st, int planted, int* failed_waits) {
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    for (int r = 0; r < rounds; ++r) {
      uint32_t* d = data + (size_t)r * n;
      if (planted) {
        if (kSys) mm_red_release_sys_add_s32(counter, 1);
        else mm_red_release_gpu_add_s32(counter, 1);
        tc_spin_ns(200000);
      }
      for (int i = 0; i < n; ++i) d[i] = tc_value(seed, (uint32_t)r, (uint32_t)i);
      if (!planted) {
        if (kSys) mm_red_release_sys_add_s32(counter, 1);
        else mm_red_release_gpu_add_s32(counter, 1);
      }
    }
  } else {
    const mm_wait_ctx ctx = {st, kLongTimeoutNs, MM_SITE_GEMM_ROWS_READY, NULL};
    for (int r = 0; r < rounds; ++r) {
      if (!mm_wait_counter_geq<kSys>(counter, r + 1, ctx, r)) {
        atomicAdd(failed_waits, 1);
        return;
      }
      const uint32_t* d = data + (size_t)r * n;
      for (int i = 0; i < n; ++i) out[(size_t)r * n + i] = d[i];
    }
  }
}

/* The producer/consumer kernels of sections 1 and 5: CTA 0 writes `rounds`
 * rounds of n values into data and publishes each on counter; CTA 1 waits
 * for it and copies the round into out; a failed wait bumps failed_waits. */
typedef void (*pc_kernel)(uint32_t* data, int32_t* counter, uint32_t* out, int rounds, int n, uint32_t seed,
                          mm_device_status* st, int planted, int* failed_waits);

/* Runs `kernel` on 2 CTAs of `threads` threads over poisoned buffers;
 * returns the mismatches of out (count_mismatches, labelled `what`), or -1
 * on a CUDA failure or a failed wait ("a <waits> wait failed"). */
long run_producer_consumer(pc_kernel kernel, const char* name, int threads, int n, uint32_t seed, int planted,
                           int rounds, const char* what, const char* waits) {
  uint32_t *data = NULL, *out = NULL;
  int32_t* counter = NULL;
  int* failed = NULL;
  mm_device_status* st = new_status(1);
  long result = -1;
  const size_t bytes = sizeof(uint32_t) * (size_t)rounds * n;
  uint32_t* host = (uint32_t*)malloc(bytes);
  if (st && host && cudaMalloc((void**)&data, bytes) == cudaSuccess && cudaMalloc((void**)&out, bytes) == cudaSuccess &&
      cudaMalloc((void**)&counter, sizeof(int32_t)) == cudaSuccess && cudaMalloc((void**)&failed, sizeof(int)) == cudaSuccess &&
      cudaMemset(data, 0xFF, bytes) == cudaSuccess && cudaMemset(out, 0xFF, bytes) == cudaSuccess &&
      cudaMemset(counter, 0, sizeof(int32_t)) == cudaSuccess && cudaMemset(failed, 0, sizeof(int)) == cudaSuccess) {
    kernel<<<2, threads>>>(data, counter, out, rounds, n, seed, st, planted, failed);
    int f = 1;
    if (cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
        cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost) == cudaSuccess) {
      if (f) fprintf(stderr, "    a %s wait failed (timeout or status)\n", waits);
      else result = count_mismatches(host, seed, rounds, n, what, planted);
    } else {
      fprintf(stderr, "    %s: %s\n", name, cudaGetErrorString(cudaGetLastError()));
    }
  }
  cudaFree(data);
  cudaFree(out);
  cudaFree(counter);
  cudaFree(failed);
  cudaFree(st);
  free(host);
  return result;
}

/* Runs k_counter_single; returns the mismatches (or -1 on a CUDA failure
 * or a failed wait). */
template <bool kSys>
long run_counter_single(int planted, int rounds) {
  const uint32_t seed = test_seed() + (kSys ? 11u : 0u) + 101u * (uint32_t)planted;
  return run_producer_consumer(k_counter_single<kSys>, "k_counter_single", 32, 64, seed, planted, rounds,
                               kSys ? "counter wait (sys)" : "counter wait (gpu)", "counter");
}

mm_test_result t_counter_wait(void) {
  const long gpu = run_counter_single<false>(0, 500);
  const long sys = run_counter_single<true>(0, 500);
  CHECK_MSG(gpu == 0, "gpu scope: %ld mismatches (or a failure)", gpu);
  CHECK_MSG(sys == 0, "sys scope: %ld mismatches (or a failure)", sys);
  return MM_TEST_PASS;
}

mm_test_result t_control_early_release(void) {
  const long bad = run_counter_single<false>(1, 5);
  CHECK_MSG(bad != -1, "the planted run failed to run");
  printf("    planted release-before-data: %ld stale values caught\n", bad);
  CHECK_MSG(bad > 0, "the data check did not catch a release made before the data");
  return MM_TEST_PASS;
}

/* ---- 2. counter wait whose deadline fires ------------------------------------
 * mode 0: CTA 0 waits for a counter nobody bumps (timeout 2 ms) and reports
 * whether it returned true, and how long it took.
 * mode 1: the same, with the status already holding an error of the current
 * forward: the wait leaves at once (nothing recorded).
 * mode 2: the status holds an error of an OLDER forward; CTA 1 bumps the
 * counter after 1 ms: the wait must not stop early and returns true. */
__global__ void k_wait_deadline(int32_t* counter, mm_device_status* st, uint64_t timeout_ns, int mode, int* result,
                                unsigned long long* elapsed_ns) {
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 1) {
    if (mode == 2) {
      tc_spin_ns(1000000);
      mm_red_release_gpu_add_s32(counter, 1);
    }
    return;
  }
  const mm_wait_ctx ctx = {st, timeout_ns, MM_SITE_GEMM_ROWS_READY, NULL};
  const uint64_t t0 = mm_globaltimer_ns();
  const bool ok = mm_wait_counter_geq<false>(counter, 1, ctx, 42);
  *elapsed_ns = mm_globaltimer_ns() - t0;
  *result = ok ? 1 : 0;
}

mm_test_result t_counter_deadline(void) {
  int32_t* counter = NULL;
  int* result = NULL;
  unsigned long long* elapsed = NULL;
  mm_device_status* st = new_status(7);
  CHECK(st != NULL);
  CUDA_OK(cudaMalloc((void**)&counter, sizeof(int32_t)));
  CUDA_OK(cudaMalloc((void**)&result, sizeof(int)));
  CUDA_OK(cudaMalloc((void**)&elapsed, sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(counter, 0, sizeof(int32_t)));
  int r = -1;
  unsigned long long ns = 0;
  mm_device_status h;

  /* mode 0: the deadline fires, is recorded keyed by forward 7, the kernel returns. */
  const time_t w0 = time(NULL);
  k_wait_deadline<<<2, 32>>>(counter, st, 2000000ull, 0, result, elapsed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_MSG(time(NULL) - w0 < 5, "the timed-out wait took %lld s to return", (long long)(time(NULL) - w0));
  CUDA_OK(cudaMemcpy(&r, result, sizeof r, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&h, st, sizeof h, cudaMemcpyDeviceToHost));
  CHECK_EQ_INT(r, 0);
  CHECK_MSG(ns >= 2000000ull && ns < 1000000000ull, "returned after %llu ns (deadline 2 ms)", ns);
  CHECK_EQ_INT(h.key, (7ull << MM_STATUS_KEY_SHIFT) | MEGAMOE_ERR_TIMEOUT);
  CHECK_EQ_INT(h.code, MEGAMOE_ERR_TIMEOUT);
  CHECK_EQ_INT(h.epoch, 7);
  CHECK_EQ_INT(h.where, MM_SITE_GEMM_ROWS_READY);
  CHECK_EQ_INT(h.detail, 42);
  CHECK_EQ_INT(h.seen, 0);
  CHECK_EQ_INT(h.want, 1);
  CHECK_MSG(h.waited_ns >= 2000000ull && h.waited_ns < 1000000000ull, "waited_ns %llu",
            (unsigned long long)h.waited_ns);
  CHECK_EQ_INT(h.dead, 1);
  CHECK_EQ_INT(h.failed_forwards, 1);
  CHECK_EQ_INT(h.first.key, h.key);
  CHECK_EQ_INT(h.first.where, MM_SITE_GEMM_ROWS_READY);
  CHECK_EQ_INT(h.first.forward, 7);

  /* mode 1: an error of the current forward ends a wait at once, records nothing more. */
  k_wait_deadline<<<2, 32>>>(counter, st, kLongTimeoutNs, 1, result, elapsed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(&r, result, sizeof r, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
  CHECK_EQ_INT(r, 0);
  CHECK_MSG(ns < 100000000ull, "a wait under an error of its forward took %llu ns", ns);
  mm_device_status h2;
  CUDA_OK(cudaMemcpy(&h2, st, sizeof h2, cudaMemcpyDeviceToHost));
  CHECK_EQ_INT(h2.key, h.key);
  CHECK_EQ_INT(h2.failed_forwards, 1);

  /* mode 2: forward 8 runs; forward 7's error must not stop its wait. */
  const uint64_t next = 8;
  CUDA_OK(cudaMemcpy(&st->forward, &next, sizeof next, cudaMemcpyHostToDevice));
  k_wait_deadline<<<2, 32>>>(counter, st, kLongTimeoutNs, 2, result, elapsed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(&r, result, sizeof r, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
  CHECK_MSG(r == 1, "an error of the previous forward stopped the wait (after %llu ns)", ns);
  CHECK_MSG(ns >= 900000ull, "the wait returned after %llu ns, before the counter moved", ns);
  CUDA_OK(cudaMemcpy(&h2, st, sizeof h2, cudaMemcpyDeviceToHost));
  CHECK_EQ_INT(h2.key, h.key);

  cudaFree(counter);
  cudaFree(result);
  cudaFree(elapsed);
  cudaFree(st);
  return MM_TEST_PASS;
}

/* ---- 3. grid barrier over many rounds ----------------------------------------
 * Round r: every thread of CTA c writes its slot, with a per-CTA skew first
 * (so early CTAs must really wait; one CTA per round much later than all); barrier; every thread reads the slot of
 * CTA (c + 1 + r) mod n and counts mismatches; barrier (nobody overwrites a
 * slot before everyone read it). Odd rounds take the first barrier in two
 * halves (mm_grid_arrive, a short spin between, then
 * mm_grid_wait_round unless this CTA completed the round), as the early
 * combine does. The host launches the kernel twice on one state: the second
 * launch's rounds start where the first's ended, as split kernel 2's do
 * after kernel 1's. use_barrier = 0 is the planted control. */
__global__ void k_grid_rounds(mm_grid_barrier_state* gb, uint32_t* slots, int rounds, uint32_t seed,
                              mm_device_status* st, int use_barrier, unsigned* mismatches, unsigned* failed) {
  const int n = gridDim.x, c = blockIdx.x, tid = threadIdx.x, bd = blockDim.x;
  const mm_wait_ctx ctx = {st, kLongTimeoutNs, MM_SITE_GRID_BARRIER, NULL};
  for (int r = 0; r < rounds; ++r) {
    /* One CTA per round comes 6 us late, the others within 0-2 us: a
     * barrier that lets CTAs through before the last arrival (one short)
     * lets them read its slot before it is written. */
    if (tid == 0) tc_spin_ns(c == (r * 7) % n ? 6000ull : (uint64_t)((c * 37 + r * 11) % 3) * 1000);
    __syncthreads();
    slots[(size_t)c * bd + tid] = tc_value(seed, (uint32_t)r, (uint32_t)(c * bd + tid));
    bool passed = true;
    if (use_barrier && (r & 1)) {
      bool last = false;
      const uint64_t round_end = mm_grid_arrive(gb, &last);
      if (tid == 0) tc_spin_ns(500); /* work between the halves */
      passed = last || mm_grid_wait_round(gb, round_end, ctx);
    } else if (use_barrier) {
      passed = mm_grid_barrier(gb, ctx);
    }
    if (!passed) {
      if (tid == 0) atomicAdd(failed, 1u);
      return;
    }
    const int other = (c + 1 + r) % n;
    const uint32_t v = slots[(size_t)other * bd + tid];
    if (v != tc_value(seed, (uint32_t)r, (uint32_t)(other * bd + tid))) atomicAdd(mismatches, 1u);
    if (use_barrier && !mm_grid_barrier(gb, ctx)) {
      if (tid == 0) atomicAdd(failed, 1u);
      return;
    }
  }
}

/* Co-resident CTAs of a kernel at 128 threads (at most 2 per SM). */
int resident_ctas(const void* kernel) {
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, 0) != cudaSuccess)
    return 0;
  return sms * (per_sm < 2 ? per_sm : 2);
}

/* Two launches of `rounds` rounds each on one barrier state. Returns
 * mismatches, or -1 on a failure (a false barrier, a CUDA error). */
long run_grid_rounds(int use_barrier, int rounds, uint64_t* arrivals_out, int* ctas_out) {
  const int ctas = resident_ctas((const void*)k_grid_rounds), threads = 128;
  if (ctas < 2) return -1;
  const uint32_t seed = test_seed() + 7u + (uint32_t)use_barrier;
  mm_grid_barrier_state* gb = NULL;
  uint32_t* slots = NULL;
  unsigned *mismatches = NULL, *failed = NULL;
  mm_device_status* st = new_status(1);
  long result = -1;
  if (st && cudaMalloc((void**)&gb, sizeof *gb) == cudaSuccess &&
      cudaMalloc((void**)&slots, sizeof(uint32_t) * ctas * threads) == cudaSuccess &&
      cudaMalloc((void**)&mismatches, sizeof(unsigned)) == cudaSuccess &&
      cudaMalloc((void**)&failed, sizeof(unsigned)) == cudaSuccess && cudaMemset(gb, 0, sizeof *gb) == cudaSuccess &&
      cudaMemset(slots, 0xFF, sizeof(uint32_t) * ctas * threads) == cudaSuccess &&
      cudaMemset(mismatches, 0, sizeof(unsigned)) == cudaSuccess && cudaMemset(failed, 0, sizeof(unsigned)) == cudaSuccess) {
    uint32_t launch_seed = seed; /* read by each launch when it is enqueued */
    void* args[] = {&gb, &slots, &rounds, &launch_seed, &st, &use_barrier, &mismatches, &failed};
    /* A cooperative launch guarantees every CTA is resident (or fails). */
    cudaError_t e = cudaSuccess;
    for (int launch = 0; launch < 2 && e == cudaSuccess; ++launch) {
      launch_seed = seed + 0x9e3779b9u * (uint32_t)launch; /* a launch-1 value never passes for launch 2's */
      e = cudaLaunchCooperativeKernel((const void*)k_grid_rounds, dim3(ctas), dim3(threads), args, 0, 0);
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    unsigned m = 0, f = 0;
    mm_grid_barrier_state h = {0};
    if (e == cudaSuccess && cudaMemcpy(&m, mismatches, sizeof m, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(&h, gb, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess) {
      if (f) fprintf(stderr, "    %u grid barrier(s) returned false\n", f);
      else result = (long)m;
      if (arrivals_out) *arrivals_out = h.arrivals;
      if (ctas_out) *ctas_out = ctas;
      if (use_barrier) printf("    %d CTAs x %d threads, 2 launches x %d rounds\n", ctas, threads, rounds);
    } else {
      fprintf(stderr, "    k_grid_rounds: %s\n", cudaGetErrorString(e));
    }
  }
  cudaFree(gb);
  cudaFree(slots);
  cudaFree(mismatches);
  cudaFree(failed);
  cudaFree(st);
  return result;
}

mm_test_result t_grid_barrier(void) {
  const int rounds = 1000;
  uint64_t arrivals = 0;
  int ctas = 0;
  const long bad = run_grid_rounds(1, rounds, &arrivals, &ctas);
  CHECK_MSG(bad == 0, "%ld mismatches (or a failure)", bad);
  /* Two launches, two barriers per round, every CTA once each: no round open. */
  CHECK_EQ_INT(arrivals, (uint64_t)2 * 2 * rounds * ctas);
  return MM_TEST_PASS;
}

mm_test_result t_control_no_grid_barrier(void) {
  const long bad = run_grid_rounds(0, 1000, NULL, NULL);
  CHECK_MSG(bad != -1, "the planted run failed to run");
  printf("    planted missing grid barrier: %ld stale reads caught\n", bad);
  CHECK_MSG(bad > 0, "the data check did not catch a missing grid barrier");
  return MM_TEST_PASS;
}

/* ---- 4. grid barrier whose deadline fires: the last CTA never arrives ------ */
__global__ void k_grid_absent(mm_grid_barrier_state* gb, mm_device_status* st, uint64_t timeout_ns,
                              unsigned* returned_false, unsigned* returned) {
  if (blockIdx.x == gridDim.x - 1) return; /* never arrives */
  const mm_wait_ctx ctx = {st, timeout_ns, MM_SITE_GRID_BARRIER, NULL};
  const bool ok = mm_grid_barrier(gb, ctx);
  if (threadIdx.x == 0) {
    atomicAdd(returned, 1u);
    if (!ok) atomicAdd(returned_false, 1u);
  }
}

/* prior_error: the forward already carries an error (a peer's, recorded
 * before the barrier) when the deadline fires. The timeout must still mark
 * the layer dead (the CTAs are out of step for good), while the record keeps
 * the first error. first_round: the rounds the state has already completed
 * (its arrival count starts at first_round x ctas); the record's detail is
 * that round modulo 2^31, never negative. */
static mm_test_result grid_barrier_deadline(int prior_error, uint64_t first_round) {
  const int ctas = resident_ctas((const void*)k_grid_absent);
  CHECK(ctas >= 2);
  mm_grid_barrier_state* gb = NULL;
  unsigned *rf = NULL, *rn = NULL;
  mm_device_status* st = new_status(3);
  CHECK(st != NULL);
  const unsigned long long prior_key = (3ull << MM_STATUS_KEY_SHIFT) | MEGAMOE_ERR_PEER_FAILED;
  if (prior_error) CUDA_OK(cudaMemcpy(&st->key, &prior_key, sizeof prior_key, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc((void**)&gb, sizeof *gb));
  CUDA_OK(cudaMalloc((void**)&rf, sizeof(unsigned)));
  CUDA_OK(cudaMalloc((void**)&rn, sizeof(unsigned)));
  const mm_grid_barrier_state start = {first_round * (uint64_t)ctas};
  CUDA_OK(cudaMemcpy(gb, &start, sizeof start, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(rf, 0, sizeof(unsigned)));
  CUDA_OK(cudaMemset(rn, 0, sizeof(unsigned)));
  uint64_t timeout = 5000000ull; /* 5 ms */
  void* args[] = {&gb, &st, &timeout, &rf, &rn};
  const time_t w0 = time(NULL);
  CUDA_OK(cudaLaunchCooperativeKernel((const void*)k_grid_absent, dim3(ctas), dim3(128), args, 0, 0));
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_MSG(time(NULL) - w0 < 5, "the kernel took %lld s to return", (long long)(time(NULL) - w0));
  unsigned f = 0, n = 0;
  mm_device_status h;
  CUDA_OK(cudaMemcpy(&f, rf, sizeof f, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&n, rn, sizeof n, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&h, st, sizeof h, cudaMemcpyDeviceToHost));
  CHECK_EQ_INT(n, ctas - 1);
  CHECK_EQ_INT(f, ctas - 1);
  CHECK_EQ_INT(h.dead, 1);
  if (prior_error) {
    CHECK_EQ_INT(h.key, prior_key); /* first error wins */
  } else {
    CHECK_EQ_INT(h.key, (3ull << MM_STATUS_KEY_SHIFT) | MEGAMOE_ERR_TIMEOUT);
    CHECK_EQ_INT(h.where, MM_SITE_GRID_BARRIER);
    CHECK_EQ_INT(h.seen, ctas - 1); /* arrived */
    CHECK_EQ_INT(h.want, ctas);
    CHECK_EQ_INT(h.detail, (int)(first_round & 0x7fffffffu)); /* the round waited on */
    CHECK(h.waited_ns >= timeout);
  }
  cudaFree(gb);
  cudaFree(rf);
  cudaFree(rn);
  cudaFree(st);
  return MM_TEST_PASS;
}

mm_test_result t_grid_barrier_deadline(void) { return grid_barrier_deadline(0, 0); }
mm_test_result t_grid_barrier_deadline_after_error(void) { return grid_barrier_deadline(1, 0); }
/* A state past 2^31 rounds (some 400 million forwards): the detail wraps to
 * round 5, not to a negative int. */
mm_test_result t_grid_barrier_deadline_late_round(void) { return grid_barrier_deadline(0, (1ull << 31) + 5); }

/* ---- 5. release/acquire of data written by other threads of a CTA ----------
 * Producer CTA: all 256 threads write round r's chunk (16 values each), then
 * mm_cta_publish_add. Consumer CTA: mm_cta_wait_counter_geq, then all its
 * threads copy the chunk. (`planted` is unused: the runner's kernel shape
 * carries it; see the note above the TMA test for why there is no control.) */
template <bool kSys>
__global__ void k_cta_publish(uint32_t* data, int32_t* counter, uint32_t* out, int rounds, int n, uint32_t seed,
                              mm_device_status* st, int planted, int* failed_waits) {
  const int tid = threadIdx.x, bd = blockDim.x;
  if (blockIdx.x == 0) {
    for (int r = 0; r < rounds; ++r) {
      uint32_t* d = data + (size_t)r * n;
      for (int i = tid; i < n; i += bd) d[i] = tc_value(seed, (uint32_t)r, (uint32_t)i);
      mm_cta_publish_add<kSys, false>(counter, 1);
    }
  } else {
    const mm_wait_ctx ctx = {st, kLongTimeoutNs, MM_SITE_GEMM_ROWS_READY, NULL};
    for (int r = 0; r < rounds; ++r) {
      if (!mm_cta_wait_counter_geq<kSys, false>(counter, r + 1, ctx, r)) {
        if (tid == 0) atomicAdd(failed_waits, 1);
        return;
      }
      const uint32_t* d = data + (size_t)r * n;
      for (int i = tid; i < n; i += bd) out[(size_t)r * n + i] = d[i];
    }
  }
}

template <bool kSys>
long run_cta_publish(int planted, int rounds) {
  const uint32_t seed = test_seed() + 23u + (kSys ? 5u : 0u);
  return run_producer_consumer(k_cta_publish<kSys>, "k_cta_publish", 256, 4096, seed, planted, rounds,
                               kSys ? "CTA publish (sys)" : "CTA publish (gpu)", "CTA");
}

mm_test_result t_cta_publish(void) {
  const long gpu = run_cta_publish<false>(0, 256);
  const long sys = run_cta_publish<true>(0, 256);
  CHECK_MSG(gpu == 0, "gpu scope: %ld mismatches (or a failure)", gpu);
  CHECK_MSG(sys == 0, "sys scope: %ld mismatches (or a failure)", sys);
  return MM_TEST_PASS;
}

/* No control test for a release without the CTA barrier: on the H200 the
 * other warps' stores reached L2 before the release in every planted run
 * (0 stale values in 4 x 256 rounds), so such a test could not fail; the
 * recipe (comm/wait.cuh) follows the PTX memory model instead. */

/* ---- 6. TMA (bulk copy) reads rows that warps wrote ----------------------------
 * Producer CTA: 4 warps write round r's 8 rows of 512 bytes with st.global,
 * each thread runs the async-proxy fence, then the CTA publish. Consumer CTA:
 * thread 0 acquires, runs the proxy fence, and loads the 4 KB with
 * cp.async.bulk onto an mbarrier; all threads then copy shared memory out. */
__device__ void tc_bulk_load(uint32_t smem_dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__global__ void k_tma_rows(uint32_t* rows, int32_t* counter, uint32_t* out, int rounds, uint32_t seed,
                           mm_device_status* st, int* failed_waits) {
  const int n = 1024; /* u32 per round: 8 rows x 512 bytes */
  const int tid = threadIdx.x, bd = blockDim.x;
  __shared__ __align__(128) uint32_t tile[1024];
  __shared__ __align__(8) uint64_t bar;
  if (blockIdx.x == 0) {
    for (int r = 0; r < rounds; ++r) {
      uint4* d = reinterpret_cast<uint4*>(rows + (size_t)r * n);
      for (int i = tid; i < n / 4; i += bd) {
        uint4 v;
        v.x = tc_value(seed, (uint32_t)r, (uint32_t)(4 * i));
        v.y = tc_value(seed, (uint32_t)r, (uint32_t)(4 * i + 1));
        v.z = tc_value(seed, (uint32_t)r, (uint32_t)(4 * i + 2));
        v.w = tc_value(seed, (uint32_t)r, (uint32_t)(4 * i + 3));
        d[i] = v;
      }
      mm_cta_publish_add<false, true>(counter, 1);
    }
    return;
  }
  const uint32_t b = mm_smem_addr(&bar);
  if (tid == 0) {
    mm_mbar_init(b, 1);
    mm_fence_mbar_init();
  }
  __syncthreads();
  const mm_wait_ctx ctx = {st, kLongTimeoutNs, MM_SITE_GEMM_ROWS_READY, NULL};
  for (int r = 0; r < rounds; ++r) {
    if (!mm_cta_wait_counter_geq<false, true>(counter, r + 1, ctx, r)) {
      if (tid == 0) atomicAdd(failed_waits, 1);
      return;
    }
    if (tid == 0) {
      mm_mbar_arrive_expect_tx(b, n * 4);
      tc_bulk_load(mm_smem_addr(tile), rows + (size_t)r * n, n * 4, b);
    }
    mm_mbar_wait(b, (uint32_t)(r & 1));
    for (int i = tid; i < n; i += bd) out[(size_t)r * n + i] = tile[i];
    /* The generic reads of the tile precede the next bulk write into it. */
    mm_fence_proxy_async_smem();
    __syncthreads();
  }
}

mm_test_result t_tma_after_proxy_fence(void) {
  const int rounds = 300, n = 1024;
  const uint32_t seed = test_seed() + 31u;
  const size_t bytes = sizeof(uint32_t) * (size_t)rounds * n;
  uint32_t *rows = NULL, *out = NULL;
  int32_t* counter = NULL;
  int* failed = NULL;
  mm_device_status* st = new_status(1);
  CHECK(st != NULL);
  CUDA_OK(cudaMalloc((void**)&rows, bytes));
  CUDA_OK(cudaMalloc((void**)&out, bytes));
  CUDA_OK(cudaMalloc((void**)&counter, sizeof(int32_t)));
  CUDA_OK(cudaMalloc((void**)&failed, sizeof(int)));
  CUDA_OK(cudaMemset(rows, 0xFF, bytes));
  CUDA_OK(cudaMemset(out, 0xFF, bytes));
  CUDA_OK(cudaMemset(counter, 0, sizeof(int32_t)));
  CUDA_OK(cudaMemset(failed, 0, sizeof(int)));
  k_tma_rows<<<2, 128>>>(rows, counter, out, rounds, seed, st, failed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  uint32_t* host = (uint32_t*)malloc(bytes);
  CHECK(host != NULL);
  int f = 1;
  CUDA_OK(cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost));
  const long bad = f ? -1 : count_mismatches(host, seed, rounds, n, "TMA rows", 0);
  free(host);
  cudaFree(rows);
  cudaFree(out);
  cudaFree(counter);
  cudaFree(failed);
  cudaFree(st);
  CHECK_MSG(f == 0, "a wait failed");
  CHECK_MSG(bad == 0, "%ld mismatches", bad);
  return MM_TEST_PASS;
}

}  // namespace

extern "C" const mm_test mm_comm_gpu_tests[] = {
    {"comm: counter wait satisfied by another CTA, data checked (gpu, sys)", t_counter_wait},
    {"comm: counter wait deadline fires, recorded by forward, kernel returns", t_counter_deadline},
    {"comm: grid barrier, 2 launches x 1000 rounds over all resident CTAs, both forms", t_grid_barrier},
    {"comm: grid barrier deadline fires when one CTA never arrives", t_grid_barrier_deadline},
    {"comm: grid barrier deadline in a forward that already failed: the layer is dead", t_grid_barrier_deadline_after_error},
    {"comm: grid barrier deadline past round 2^31: the round recorded modulo 2^31", t_grid_barrier_deadline_late_round},
    {"comm: CTA publish of other threads' stores, acquire by a CTA (gpu, sys)", t_cta_publish},
    {"comm: TMA bulk load of rows warps wrote, after the proxy fence", t_tma_after_proxy_fence},
    {"comm control: a release before the data is caught", t_control_early_release},
    {"comm control: a missing grid barrier is caught", t_control_no_grid_barrier},
    {NULL, NULL},
};
