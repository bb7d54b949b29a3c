// Diagnostic (not part of the library): which cuBLASLt block-scaled FP8
// configurations does this cuBLASLt accept on this GPU? Prints the heuristic
// status of each variant for one 512 x 4096 x 4096 problem.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>

int main() {
  cublasLtHandle_t h;
  cublasLtCreate(&h);
  int ver = (int)cublasLtGetVersion();
  printf("cublasLt version %d\n", ver);
  const int m = 512, n = 4096, k = 4096;
  void *A, *B, *D, *sa, *sb, *ws;
  cudaMalloc(&A, (size_t)m * k); cudaMalloc(&B, (size_t)n * k); cudaMalloc(&D, (size_t)m * n * 2);
  cudaMalloc(&sa, 1 << 20); cudaMalloc(&sb, 1 << 20);
  size_t wsb = 64 << 20; cudaMalloc(&ws, wsb);
  int modes[2] = {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F};
  for (int swap = 0; swap < 2; ++swap)
    for (int ptrs = 0; ptrs < 2; ++ptrs)
      for (int dtype = 0; dtype < 2; ++dtype) {
        cublasLtMatmulDesc_t d;
        cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        int ma = modes[swap], mb = modes[1 - swap];
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
        if (ptrs) {
          cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
          cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
        }
        // cuBLAS A: k x M (op T -> M x k), B: k x N (op N), D: M x N.
        int M = swap ? n : m, N = swap ? m : n;
        cublasLtMatrixLayout_t la, lb, lc;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, M, k);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, N, k);
        cublasLtMatrixLayoutCreate(&lc, dtype ? CUDA_R_32F : CUDA_R_16BF, M, N, M);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 1, &res, &found);
        printf("A mode %s, B mode %s, scale ptrs %s, D %s: status %d, found %d\n", ma == modes[0] ? "VEC128" : "BLK128",
               mb == modes[0] ? "VEC128" : "BLK128", ptrs ? "set" : "unset", dtype ? "f32" : "bf16", (int)st, found);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(d);
      }
  return 0;
}
