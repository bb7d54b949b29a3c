/* The machine rates behind `megamoe bench`'s floors (compute, HBM, NVLink).
 *
 * Why measured: the floors were the design rates (docs/PERF.md's opening:
 * 1458 TFLOP/s fp8, 4470 GB/s HBM read, measured on the H200 machines),
 * printed the same on the H100s most sessions got, whose HBM3 streams ~3
 * TB/s: every "x floor" there was against another machine. By default the bench now measures the first two
 * on each rank's GPU before it creates a layer (about a second) and uses the
 * slowest rank's; `--rates design` keeps the design rates (to compare with
 * rows printed before). NVLink is the design rate either way (it needs two
 * GPUs and is a property of the machine kind, not of a card). */
#ifndef MEGAMOE_BENCH_RATES_H
#define MEGAMOE_BENCH_RATES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The design rates, measured on the 2 x H200 NVLink machines (docs/PERF.md's opening). */
#define MM_RATE_DESIGN_FP8_TFLOPS 1458.0 /* cuBLAS fp8, per-tensor scales, 8192^3 */
#define MM_RATE_DESIGN_HBM_READ_GBS 4470.0 /* HBM read-only */
#define MM_RATE_DESIGN_NVLINK_GBS 365.0    /* SM-driven writes/reads over NVLink, one way */

/* The measured GEMM: M = N = K = MM_RATE_GEMM_DIM, fp8 e4m3 in, bf16 out,
 * per-tensor scales (cuBLASLt's default), fp32 accumulation without fast
 * accumulation: the same definition as the design rate's 1458. */
#define MM_RATE_GEMM_DIM 8192
/* The HBM read: a buffer far larger than the 50-60 MB L2, read once per
 * pass with 16-byte loads, best of the passes. */
#define MM_RATE_HBM_BYTES ((size_t)2 << 30)
/* A measured rate outside these multiples of the design rate is taken for a
 * broken measurement (the Hopper cards here are within 0.6-1.1x of it). */
#define MM_RATE_PLAUSIBLE_LO 0.3
#define MM_RATE_PLAUSIBLE_HI 1.2

typedef enum { MM_RATES_MEASURED = 0, MM_RATES_DESIGN = 1 } mm_rates_source;

typedef struct mm_bench_rates {
  double fp8_tflops;   /* dense fp8 GEMM rate the compute floor assumes */
  double hbm_read_gbs; /* HBM read rate the weight floor assumes */
  double nvlink_gbs;   /* one-way NVLink rate the NVLink floor assumes */
  mm_rates_source source;
} mm_bench_rates;

/* The three design rates. */
void mm_bench_rates_design(mm_bench_rates* r);

/* Measures hbm_read_gbs, and fp8_tflops when with_fp8 (else it stays the
 * design rate: bench-gemm needs only the read rate), on the current CUDA
 * device (nvlink_gbs is the design rate). 0 on success; -1 with why[] naming the step that
 * failed, or a measured value outside MM_RATE_PLAUSIBLE_LO..HI times the
 * design rate (*r then holds the design rates). A step that failed with a
 * non-sticky error (e.g. out of memory) leaves no error behind for the
 * caller's next cudaGetLastError; a kernel fault is sticky and ends the
 * process's CUDA use whatever this returns. Needs MM_RATE_HBM_BYTES of free
 * device memory (then 288 MiB for the GEMM), freed before it returns. */
int mm_bench_rates_measure(mm_bench_rates* r, int with_fp8, char* why, size_t why_size);

/* The header line of the bench's floors for these rates (no newline). */
void mm_bench_rates_format(const mm_bench_rates* r, char* line, size_t size);

#ifdef __cplusplus
}
#endif

#endif
