/* GPU test suites. Each single-GPU suite runs inside a child process of the
 * GPU test runner that has already selected its device (cudaSetDevice); a
 * test may allocate, launch and synchronize freely and must free what it
 * allocates. */
#ifndef MEGAMOE_GPU_SUITES_H
#define MEGAMOE_GPU_SUITES_H

#include "../harness.h"

/* In a suite's test function (CUDA sources): a failed CUDA call prints
 * where and why, and the test returns MM_TEST_FAIL. */
#define CUDA_OK(call)                                                                                       \
  do {                                                                                                      \
    cudaError_t e_ = (call);                                                                                \
    if (e_ != cudaSuccess) {                                                                                \
      fprintf(stderr, "    CUDA error at %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return MM_TEST_FAIL;                                                                                  \
    }                                                                                                       \
  } while (0)

#ifdef __cplusplus
extern "C" {
#endif

/* tests/gpu/test_gemm.cu: the grouped FP8 GEMM engines. */
extern const mm_test mm_gemm_gpu_tests[];

/* tests/gpu/test_comm.cu: the in-kernel communication primitives of
 * src/device/comm/ (counter waits, grid barrier, CTA publish, TMA after the
 * proxy fence), their deadlines, and controls that plant each bug. */
extern const mm_test mm_comm_gpu_tests[];

/* tests/gpu/test_fused.cu: the fused arm's task stream (src/fused.h) decoded
 * on the device, compared with the host's. */
extern const mm_test mm_fused_gpu_tests[];

/* tests/gpu/test_sanitize.cu: one planted bug per compute-sanitizer tool,
 * run only with MEGAMOE_SANITIZE_CONTROL=1 (scripts/sanitize.sh). */
extern const mm_test mm_sanitize_controls[];

#ifdef __cplusplus
}
#endif

#ifndef __cplusplus
#include "rank_ctx.h"

/* tests/gpu/test_errors.c: the error protocol across ranks (a bad value on
 * one rank, errors keyed by forward, the error word after graph replays),
 * a pool overflow, and weights prepared in place. */
extern const mm_rank_test mm_error_tests[];

/* tests/gpu/test_ring.c: the fused arm's ring against a full pool (bitwise,
 * skewed shapes that wrap it) and its num_tokens_bound verdict; run on the
 * fused variant only. */
extern const mm_rank_test mm_ring_tests[];

/* tests/gpu/test_fuzz.c: random forward arguments (bad and duplicate
 * indices, NaN / Inf inputs and weight scales, token counts at and past the
 * limit, NULL and misaligned pointers), guard regions around y. */
extern const mm_rank_test mm_fuzz_tests[];
#endif

#endif
