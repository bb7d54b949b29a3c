/* GPU tests of the fused arm's schedule (src/fused.h): the header the kernel
 * will decode its tasks with, compiled as device code, gives on the device
 * the stream the host gives (the CPU tests, tests/unit/test_fused.c, prove
 * the host's stream right). One GPU. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fused.h"
#include "fused/fused_stream.cuh"
#include "gpu_suites.h"

namespace {

/* One thread builds the stream's arrays (as a CTA's setup would), then every
 * thread decodes its share of the tasks and the counter targets. */
__global__ void fs_decode(mm_fused_order order, int32_t experts, const int32_t* rows, int32_t* arrays, int bm0,
                          int bm1, int tn0, int tn1, mm_fused_task* tasks, int64_t* targets, int64_t* totals) {
  __shared__ mm_fused_stream s;
  if (threadIdx.x == 0) {
    mm_fused_stream_init(&s, order, experts, rows, arrays, bm0, bm1, tn0, tn1);
    totals[0] = s.tasks;
    totals[1] = s.blocks;
  }
  __syncthreads();
  for (int64_t t = threadIdx.x; t < s.tasks; t += blockDim.x) mm_fused_task_at(&s, t, &tasks[t]);
  for (int64_t b = threadIdx.x; b < s.blocks; b += blockDim.x)
    for (int k = 0; k < MM_FUSED_COUNTERS; ++k) targets[b * MM_FUSED_COUNTERS + k] = mm_fused_counter_target(&s, k, b);
}

mm_test_result t_stream_on_device() {
  uint64_t x = 0x2545F4914F6CDD1Dull;
  int cases = 0;
  for (int i = 0; i < 24; ++i) {
    const int32_t experts = 1 + (int32_t)(x % 33);
    int32_t rows[64];
    for (int e = 0; e < experts; ++e) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      rows[e] = (x % 5 == 0) ? 0 : (int32_t)(x % 5000);
    }
    const mm_fused_order order = {i % 4 == 0, (int32_t)(x % 30), 1 + (int32_t)(x % 5), 100, 0};
    const int bm0 = 64 << (i % 3), bm1 = 64 << ((i + 1) % 3), tn0 = 1 + i % 3, tn1 = 1 + (i + 1) % 4;
    /* host */
    int32_t harr[MM_FUSED_STREAM_WORDS(64)];
    mm_fused_stream h;
    mm_fused_stream_init(&h, order, experts, rows, harr, bm0, bm1, tn0, tn1);
    /* device */
    int32_t *d_rows = nullptr, *d_arr = nullptr;
    mm_fused_task* d_tasks = nullptr;
    int64_t *d_targets = nullptr, *d_totals = nullptr;
    const size_t ntasks = (size_t)h.tasks + 1, nblocks = (size_t)h.blocks + 1;
    CUDA_OK(cudaMalloc(&d_rows, sizeof rows));
    CUDA_OK(cudaMalloc(&d_arr, sizeof harr));
    CUDA_OK(cudaMalloc(&d_tasks, sizeof(mm_fused_task) * ntasks));
    CUDA_OK(cudaMalloc(&d_targets, sizeof(int64_t) * MM_FUSED_COUNTERS * nblocks));
    CUDA_OK(cudaMalloc(&d_totals, 2 * sizeof(int64_t)));
    CUDA_OK(cudaMemcpy(d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
    fs_decode<<<1, 256>>>(order, experts, d_rows, d_arr, bm0, bm1, tn0, tn1, d_tasks, d_targets, d_totals);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    mm_fused_task* got = (mm_fused_task*)malloc(sizeof(mm_fused_task) * ntasks);
    int64_t* targets = (int64_t*)malloc(sizeof(int64_t) * MM_FUSED_COUNTERS * nblocks);
    int64_t totals[2];
    CUDA_OK(cudaMemcpy(got, d_tasks, sizeof(mm_fused_task) * ntasks, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(targets, d_targets, sizeof(int64_t) * MM_FUSED_COUNTERS * nblocks, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(totals, d_totals, sizeof totals, cudaMemcpyDeviceToHost));
    cudaFree(d_rows);
    cudaFree(d_arr);
    cudaFree(d_tasks);
    cudaFree(d_targets);
    cudaFree(d_totals);
    int64_t bad = totals[0] == h.tasks && totals[1] == h.blocks ? -1 : 0;
    for (int64_t t = 0; t < h.tasks && bad < 0; ++t) {
      mm_fused_task w;
      mm_fused_task_at(&h, t, &w);
      const mm_fused_task* g = &got[t];
      if (g->gemm != w.gemm || g->expert != w.expert || g->unit != w.unit || g->m != w.m || g->n != w.n ||
          g->row0 != w.row0 || g->rows != w.rows || g->block0 != w.block0)
        bad = t;
    }
    for (int64_t b = 0; b < h.blocks && bad < 0; ++b)
      for (int k = 0; k < MM_FUSED_COUNTERS; ++k)
        if (targets[b * MM_FUSED_COUNTERS + k] != mm_fused_counter_target(&h, k, b)) bad = h.tasks + b;
    free(got);
    free(targets);
    if (bad >= 0) {
      fprintf(stderr, "    case %d: the device's stream differs from the host's at %lld (tasks %lld / %lld)\n", i,
              (long long)bad, (long long)totals[0], (long long)h.tasks);
      return MM_TEST_FAIL;
    }
    cases++;
  }
  printf("    %d streams decoded alike on the device and the host\n", cases);
  return MM_TEST_PASS;
}

/* The kernel's CTA-parallel build (fused_stream.cuh, one warp's scan) from
 * counts in device memory, its arrays and totals copied out. */
__global__ void fs_build_cta(mm_fused_order order, int32_t experts, const int32_t* counts, int bm0, int bm1, int tn0,
                             int tn1, int32_t* words_out, int64_t* totals) {
  extern __shared__ __align__(16) uint8_t smem[];
  const mm_fused_stream* s = mm_fused_stream_build_cta(smem, counts, order, experts, bm0, bm1, tn0, tn1);
  for (int i = threadIdx.x; i < MM_FUSED_STREAM_WORDS(experts); i += blockDim.x) words_out[i] = s->block_start[i];
  if (threadIdx.x == 0) {
    totals[0] = s->tasks;
    totals[1] = s->blocks;
    totals[2] = s->units;
    totals[3] = s->phases;
  }
}

mm_test_result t_stream_build_cta() {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  int cases = 0;
  for (int i = 0; i < 40; ++i) {
    /* Up to 1024 experts (MM_GEMM_MAX_EXPERTS): chunks of several experts per lane. */
    const int32_t experts = 1 + (int32_t)(x % (i < 20 ? 40 : 1024));
    int32_t* rows = (int32_t*)malloc(sizeof(int32_t) * (size_t)experts);
    for (int e = 0; e < experts; ++e) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      rows[e] = (x % 4 == 0) ? 0 : (int32_t)(x % 3000);
    }
    const mm_fused_order order = {i % 3 == 0, 8 + (int32_t)(x % 20), 4, 100, 0};
    const int bm0 = 64 << (i % 2), bm1 = 64 << (i % 3), tn0 = 1 + i % 5, tn1 = 1 + i % 7;
    const int words = MM_FUSED_STREAM_WORDS(experts);
    int32_t* harr = (int32_t*)malloc(sizeof(int32_t) * (size_t)words);
    mm_fused_stream h;
    mm_fused_stream_init(&h, order, experts, rows, harr, bm0, bm1, tn0, tn1);
    int32_t *d_rows = nullptr, *d_words = nullptr;
    int64_t* d_totals = nullptr;
    CUDA_OK(cudaMalloc(&d_rows, sizeof(int32_t) * (size_t)experts));
    CUDA_OK(cudaMalloc(&d_words, sizeof(int32_t) * (size_t)words));
    CUDA_OK(cudaMalloc(&d_totals, 4 * sizeof(int64_t)));
    CUDA_OK(cudaMemcpy(d_rows, rows, sizeof(int32_t) * (size_t)experts, cudaMemcpyHostToDevice));
    fs_build_cta<<<1, 384, mm_fused_stream_smem_bytes(experts)>>>(order, experts, d_rows, bm0, bm1, tn0, tn1, d_words,
                                                                  d_totals);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    int32_t* got = (int32_t*)malloc(sizeof(int32_t) * (size_t)words);
    int64_t totals[4];
    CUDA_OK(cudaMemcpy(got, d_words, sizeof(int32_t) * (size_t)words, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(totals, d_totals, sizeof totals, cudaMemcpyDeviceToHost));
    cudaFree(d_rows);
    cudaFree(d_words);
    cudaFree(d_totals);
    int bad = memcmp(got, harr, sizeof(int32_t) * (size_t)words) != 0;
    bad |= totals[0] != h.tasks || totals[1] != h.blocks || totals[2] != h.units || totals[3] != h.phases;
    free(got);
    free(harr);
    free(rows);
    if (bad) {
      fprintf(stderr, "    case %d (%d experts): the CTA's stream differs from the host's (tasks %lld / %lld)\n", i,
              experts, (long long)totals[0], (long long)h.tasks);
      return MM_TEST_FAIL;
    }
    cases++;
  }
  printf("    %d streams built alike by a CTA and by the host\n", cases);
  return MM_TEST_PASS;
}

}  // namespace

extern "C" const mm_test mm_fused_gpu_tests[] = {
    {"fused: the task stream decoded on the device equals the host's", t_stream_on_device},
    {"fused: the stream a CTA builds in parallel equals the host's serial build", t_stream_build_cta},
    {NULL, NULL},
};
