/* cuBLASLt block-scaled FP8 GEMM of one expert, the external baseline of the
 * GEMM tests and of `megamoe bench-gemm` (header-only, host code).
 *
 * D = A[c, k] * B[n, k]^T, computed as cuBLASLt allows it on sm_90: its A
 * operand takes the VEC128 scales and its B operand the BLK128x128 scales
 * (NVIDIA's LtBlk128x128Fp8Matmul sample; the other assignment is refused with
 * CUBLAS_STATUS_NOT_SUPPORTED), both in the FP8 "TN" form. So:
 *   cuBLAS A = our A: fp8 [c, k] row-major = k x c col-major (ld k), op T,
 *     scales CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F laid out [k / 128][c]
 *     (rows contiguous: our K-block-major A_sf packed to the expert's c rows,
 *     so callers repack with a 2D copy);
 *   cuBLAS B = our B: fp8 [n, k] K-major = k x n col-major (ld k), op N,
 *     scales CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F laid out
 *     [n / 128][k / 128]: our B_sf as is;
 *   D = c x n col-major (ld c), i.e. D is written TRANSPOSED, [n][c] row-major:
 *     element (row i, column j) of the expert's output is d[j * c + i].
 * The transposed output writes the same bytes as ours, so timings compare;
 * callers that compare values map the index. c must be a multiple of 8 (the
 * ld of a bf16 D in 16-byte units).
 * This CUDA version (cuBLASLt 13.1) has no grouped batch mode, so a grouped
 * GEMM is one call per expert. */
#ifndef MEGAMOE_BENCH_GEMM_CUBLASLT_CUH
#define MEGAMOE_BENCH_GEMM_CUBLASLT_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#define MM_LT_CACHE 16

typedef struct mm_lt_shape {
  int c, n, k;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
} mm_lt_shape;

typedef struct mm_lt {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  void* workspace;
  size_t workspace_bytes;
  mm_lt_shape shapes[MM_LT_CACHE];
  int num_shapes;
  char error[256];
} mm_lt;

#define MM_LT_TRY(call)                                                                  \
  do {                                                                                   \
    cublasStatus_t st_ = (call);                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      snprintf(lt->error, sizeof lt->error, "%s failed: status %d", #call, (int)st_);   \
      return -1;                                                                         \
    }                                                                                    \
  } while (0)

static inline int mm_lt_init(mm_lt* lt) {
  memset(lt, 0, sizeof *lt);
  MM_LT_TRY(cublasLtCreate(&lt->handle));
  MM_LT_TRY(cublasLtMatmulDescCreate(&lt->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MM_LT_TRY(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  MM_LT_TRY(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;     /* cuBLAS A = our activations */
  int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; /* cuBLAS B = our weights */
  MM_LT_TRY(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
  MM_LT_TRY(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
  lt->workspace_bytes = (size_t)64 << 20;
  if (cudaMalloc(&lt->workspace, lt->workspace_bytes) != cudaSuccess) {
    snprintf(lt->error, sizeof lt->error, "cudaMalloc of the cuBLASLt workspace failed");
    return -1;
  }
  return 0;
}

static inline void mm_lt_destroy(mm_lt* lt) {
  for (int i = 0; i < lt->num_shapes; ++i) {
    cublasLtMatrixLayoutDestroy(lt->shapes[i].la);
    cublasLtMatrixLayoutDestroy(lt->shapes[i].lb);
    cublasLtMatrixLayoutDestroy(lt->shapes[i].ld);
  }
  if (lt->desc) cublasLtMatmulDescDestroy(lt->desc);
  if (lt->handle) cublasLtDestroy(lt->handle);
  if (lt->workspace) cudaFree(lt->workspace);
  memset(lt, 0, sizeof *lt);
}

/* Layouts and the heuristic's first algorithm for (c, n, k), cached. */
static inline int mm_lt_shape_get(mm_lt* lt, int c, int n, int k, mm_lt_shape** out) {
  for (int i = 0; i < lt->num_shapes; ++i)
    if (lt->shapes[i].c == c && lt->shapes[i].n == n && lt->shapes[i].k == k) {
      *out = &lt->shapes[i];
      return 0;
    }
  if (lt->num_shapes == MM_LT_CACHE) {
    snprintf(lt->error, sizeof lt->error, "cuBLASLt shape cache full");
    return -1;
  }
  mm_lt_shape* s = &lt->shapes[lt->num_shapes];
  memset(s, 0, sizeof *s);
  s->c = c;
  s->n = n;
  s->k = k;
  MM_LT_TRY(cublasLtMatrixLayoutCreate(&s->la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)c, (int64_t)k));
  MM_LT_TRY(cublasLtMatrixLayoutCreate(&s->lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, (int64_t)k));
  MM_LT_TRY(cublasLtMatrixLayoutCreate(&s->ld, CUDA_R_16BF, (uint64_t)c, (uint64_t)n, (int64_t)c));
  cublasLtMatmulPreference_t pref;
  MM_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  MM_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &lt->workspace_bytes, sizeof lt->workspace_bytes));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt->handle, lt->desc, s->la, s->lb, s->ld, s->ld, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
    snprintf(lt->error, sizeof lt->error, "cublasLtMatmulAlgoGetHeuristic(c %d, n %d, k %d): status %d, %d found", c,
             n, k, (int)st, found);
    cublasLtMatrixLayoutDestroy(s->la);
    cublasLtMatrixLayoutDestroy(s->lb);
    cublasLtMatrixLayoutDestroy(s->ld);
    return -1;
  }
  s->algo = res.algo;
  lt->num_shapes++;
  *out = s;
  return 0;
}

/* One expert: d (bf16, TRANSPOSED: [n][c]) = a[c, k] * b[n, k]^T (see the top). */
static inline int mm_lt_matmul(mm_lt* lt, int c, int n, int k, const void* a, const float* a_scale, const void* b,
                               const float* b_scale, void* d, cudaStream_t stream) {
  if (c == 0) return 0;
  /* cuBLAS's A is our activations, cuBLAS's B our weights. The scale
   * pointers are set before the heuristic runs: with block scale modes and no
   * scale pointers it finds no algorithm (CUBLAS_STATUS_NOT_SUPPORTED). */
  MM_LT_TRY(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale));
  MM_LT_TRY(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale));
  mm_lt_shape* s = NULL;
  if (mm_lt_shape_get(lt, c, n, k, &s)) return -1;
  const float alpha = 1.0f, beta = 0.0f;
  MM_LT_TRY(cublasLtMatmul(lt->handle, lt->desc, &alpha, a, s->la, b, s->lb, &beta, d, s->ld, d, s->ld, &s->algo,
                           lt->workspace, lt->workspace_bytes, stream));
  return 0;
}

#endif
