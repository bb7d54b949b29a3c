/* The machine rates behind the bench's floors, measured on the current GPU
 * (bench_rates.h). Host code plus one read kernel. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_rates.h"
#include "bench_stream.cuh"

namespace {

/* Each timing covers kBatch launches back to back (so a launch's host cost
 * and an idle gap's clock boost weigh little); the best of kBatches timings
 * after one untimed warm-up batch. */
constexpr int kBatch = 4;
constexpr int kBatches = 3;
constexpr int kReadUnroll = 4; /* independent 16-byte loads in flight per thread */

/* Why a step failed, into why[] (the first failure only). */
struct failure {
  char* why;
  size_t size;
  bool set;
  int cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return 0;
    if (!set) snprintf(why, size, "%s: %s", what, cudaGetErrorString(e));
    set = true;
    return -1;
  }
  int lt(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    if (!set) snprintf(why, size, "%s: cuBLAS status %d", what, (int)s);
    set = true;
    return -1;
  }
  int fail(const char* what) {
    if (!set) snprintf(why, size, "%s", what);
    set = true;
    return -1;
  }
};

/* Best time in ms of kBatches batches of kBatch calls of launch() (each
 * returns 0 or -1), after one untimed batch. */
template <class Launch>
int time_best(failure& f, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, Launch launch, float* best_ms) {
  for (int batch = 0; batch <= kBatches; ++batch) {
    if (f.cuda(cudaEventRecord(e0, stream), "event")) return -1;
    for (int k = 0; k < kBatch; ++k)
      if (launch()) return -1;
    float ms = 0.f;
    if (f.cuda(cudaEventRecord(e1, stream), "event") || f.cuda(cudaEventSynchronize(e1), "timed batch") ||
        f.cuda(cudaEventElapsedTime(&ms, e0, e1), "event time"))
      return -1;
    ms /= kBatch;
    if (batch == 1 || (batch > 1 && ms < *best_ms)) *best_ms = ms; /* batch 0: warm-up */
  }
  return 0;
}

/* The read rate over MM_RATE_HBM_BYTES (time_best of whole passes). */
int measure_hbm(failure& f, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, double* gbs) {
  int dev = 0, sms = 0;
  if (f.cuda(cudaGetDevice(&dev), "device") ||
      f.cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count"))
    return -1;
  const int blocks = 4 * sms, threads = 256;
  const size_t step = (size_t)blocks * threads * kReadUnroll * 16;
  const size_t bytes = MM_RATE_HBM_BYTES / step * step;
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  int rc = -1;
  if (f.cuda(cudaMalloc(&buf, bytes), "HBM read buffer") || f.cuda(cudaMalloc(&sink, sizeof *sink), "sink") ||
      f.cuda(cudaMemsetAsync(buf, 0x5a, bytes, stream), "buffer fill"))
    goto done;
  {
    float best_ms = 0.f;
    auto pass = [&]() {
      mm_bench_read_stream_kernel<kReadUnroll>
          <<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(buf), (int64_t)(bytes / 16), sink);
      return f.cuda(cudaGetLastError(), "read kernel launch");
    };
    if (time_best(f, stream, e0, e1, pass, &best_ms)) goto done;
    *gbs = (double)bytes / (best_ms * 1e-3) / 1e9;
    rc = 0;
  }
done:
  if (buf) cudaFree(buf);
  if (sink) cudaFree(sink);
  return rc;
}

/* The rate of a cuBLASLt fp8 GEMM (time_best), D[bf16] = A[M, K] B[N, K]^T, the
 * TN form cuBLASLt takes fp8 in, no scale pointers (per-tensor scales of 1). */
int measure_fp8(failure& f, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, double* tflops) {
  const int n = MM_RATE_GEMM_DIM;
  const size_t in_bytes = (size_t)n * n, out_bytes = (size_t)n * n * 2, ws_bytes = (size_t)32 << 20;
  void *a = nullptr, *b = nullptr, *d = nullptr, *ws = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0, rc = -1;
  const float alpha = 1.f, beta = 0.f;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (f.cuda(cudaMalloc(&a, in_bytes), "GEMM A") || f.cuda(cudaMalloc(&b, in_bytes), "GEMM B") ||
      f.cuda(cudaMalloc(&d, out_bytes), "GEMM D") || f.cuda(cudaMalloc(&ws, ws_bytes), "cuBLASLt workspace"))
    goto done;
  /* Random codes as a layer's (the power drawn, so the clock, depends on
   * the bits' activity). */
  if (mm_bench_fill_fp8(a, in_bytes, 1.0f, 78, stream) != 0 || mm_bench_fill_fp8(b, in_bytes, 1.0f, 79, stream) != 0) {
    f.fail("GEMM input fill: launch failed");
    goto done;
  }
  if (f.lt(cublasLtCreate(&lt), "cublasLtCreate") ||
      f.lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor") ||
      f.lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA") ||
      f.lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB") ||
      f.lt(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)n, (uint64_t)n, (int64_t)n), "layout A") ||
      f.lt(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)n, (uint64_t)n, (int64_t)n), "layout B") ||
      f.lt(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, (uint64_t)n, (uint64_t)n, (int64_t)n), "layout D") ||
      f.lt(cublasLtMatmulPreferenceCreate(&pref), "preference") ||
      f.lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof ws_bytes),
           "workspace preference") ||
      f.lt(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found), "heuristic"))
    goto done;
  if (found < 1) {
    f.fail("cuBLASLt heuristic: no fp8 algorithm");
    goto done;
  }
  {
    float best_ms = 0.f;
    auto gemm = [&]() {
      return f.lt(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo, ws, ws_bytes, stream),
                  "cublasLtMatmul");
    };
    if (time_best(f, stream, e0, e1, gemm, &best_ms)) goto done;
    *tflops = 2.0 * n * (double)n * n / (best_ms * 1e-3) / 1e12;
    rc = 0;
  }
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (lt) cublasLtDestroy(lt);
  for (void* p : {a, b, d, ws})
    if (p) cudaFree(p);
  return rc;
}

}  // namespace

extern "C" void mm_bench_rates_design(mm_bench_rates* r) {
  r->fp8_tflops = MM_RATE_DESIGN_FP8_TFLOPS;
  r->hbm_read_gbs = MM_RATE_DESIGN_HBM_READ_GBS;
  r->nvlink_gbs = MM_RATE_DESIGN_NVLINK_GBS;
  r->source = MM_RATES_DESIGN;
}

extern "C" int mm_bench_rates_measure(mm_bench_rates* r, int with_fp8, char* why, size_t why_size) {
  mm_bench_rates_design(r);
  failure f = {why, why_size, false};
  if (why_size) why[0] = '\0';
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double gbs = 0, tflops = r->fp8_tflops; /* the design rate unless measured */
  int rc = -1;
  if (!f.cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") &&
      !f.cuda(cudaEventCreate(&e0), "event") && !f.cuda(cudaEventCreate(&e1), "event") &&
      measure_hbm(f, stream, e0, e1, &gbs) == 0 && (!with_fp8 || measure_fp8(f, stream, e0, e1, &tflops) == 0)) {
    const double lo = MM_RATE_PLAUSIBLE_LO, hi = MM_RATE_PLAUSIBLE_HI;
    if (gbs < lo * r->hbm_read_gbs || gbs > hi * r->hbm_read_gbs || tflops < lo * r->fp8_tflops ||
        tflops > hi * r->fp8_tflops) {
      snprintf(why, why_size, "implausible: %.0f GB/s and %.0f TFLOP/s (outside %.1f-%.1fx the design rates)", gbs,
               tflops, lo, hi);
    } else {
      r->hbm_read_gbs = gbs;
      r->fp8_tflops = tflops;
      r->source = MM_RATES_MEASURED;
      rc = 0;
    }
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (stream) cudaStreamDestroy(stream);
  /* A failed step's error (e.g. an allocation's) must not be taken for the
   * caller's next one. */
  if (rc != 0) (void)cudaGetLastError();
  return rc;
}

extern "C" void mm_bench_rates_format(const mm_bench_rates* r, char* line, size_t size) {
  if (r->source == MM_RATES_MEASURED)
    snprintf(line, size,
             "floors per rank, at this machine's rates (the slowest rank's, measured before the layers: cuBLASLt fp8 "
             "%dx%dx%d, per-tensor scales; a %zu MiB read-only stream): compute at %.0f TFLOP/s fp8, HBM = touched "
             "weights at %.0f GB/s, NVLink = bytes in at %.0f GB/s (the design rate, not measured)",
             MM_RATE_GEMM_DIM, MM_RATE_GEMM_DIM, MM_RATE_GEMM_DIM, MM_RATE_HBM_BYTES >> 20, r->fp8_tflops,
             r->hbm_read_gbs, r->nvlink_gbs);
  else
    snprintf(line, size,
             "floors per rank, at the design rates of the H200 machines (--rates design, or the measurement failed): "
             "compute at %.0f TFLOP/s fp8, HBM = touched weights at %.0f GB/s, NVLink = bytes in at %.0f GB/s",
             r->fp8_tflops, r->hbm_read_gbs, r->nvlink_gbs);
}
