/* GPU test suites. Each single-GPU suite runs inside a child process of the
 * GPU test runner that has already selected its device (cudaSetDevice); a
 * test may allocate, launch and synchronize freely and must free what it
 * allocates. */
#ifndef MEGAMOE_GPU_SUITES_H
#define MEGAMOE_GPU_SUITES_H

#include "../harness.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tests/gpu/test_gemm.cu: the grouped FP8 GEMM engines. */
extern const mm_test mm_gemm_gpu_tests[];

#ifdef __cplusplus
}
#endif

#endif
