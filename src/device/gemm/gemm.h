/* Grouped block-scaled FP8 GEMMs over the expert-major pool (C interface).
 *
 * Two engines implement the same contract (mm_gemm_problem in contract.h):
 *   simple: CUDA-core reference kernel, the oracle for the fast engine;
 *   wgmma:  the Hopper engine (TMA + mbarrier pipeline + wgmma), persistent.
 * Each has three outputs:
 *   MM_GEMM_OUT_F32   D fp32 [rows_cap, n]
 *   MM_GEMM_OUT_BF16  D bf16 [rows_cap, n] (round to nearest even)
 *   MM_GEMM_OUT_SWIGLU_FP8  the L1 epilogue: B is the prepared W1 (gate/up
 *                      64-row chunks interleaved, MM_W1_INTERLEAVE), n = 2I, output written
 *                      through mm_swiglu_epilogue (fp8 + per-group scales).
 * Only rows below expert_count[e] within each expert's range are written. */
#ifndef MEGAMOE_GEMM_H
#define MEGAMOE_GEMM_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mm_gemm_output {
  MM_GEMM_OUT_F32 = 0,
  MM_GEMM_OUT_BF16 = 1,
  MM_GEMM_OUT_SWIGLU_FP8 = 2
} mm_gemm_output;

typedef enum mm_gemm_engine {
  MM_GEMM_ENGINE_SIMPLE = 0,
  MM_GEMM_ENGINE_WGMMA = 1
} mm_gemm_engine;

/* Checks the problem's host-visible fields (dimensions, alignment, pointers). */
megamoe_status mm_gemm_check(const mm_gemm_problem* p, mm_gemm_output out, const void* d,
                             const mm_swiglu_epilogue* swiglu);

/* d: output for F32/BF16 (ignored for SWIGLU_FP8, which writes swiglu->out/out_sf). */
megamoe_status mm_gemm_simple(const mm_gemm_problem* p, mm_gemm_output out, void* d,
                              const mm_swiglu_epilogue* swiglu, cudaStream_t stream);

megamoe_status mm_gemm_wgmma(const mm_gemm_problem* p, mm_gemm_output out, void* d,
                             const mm_swiglu_epilogue* swiglu, cudaStream_t stream);

static inline megamoe_status mm_gemm_run(mm_gemm_engine engine, const mm_gemm_problem* p,
                                         mm_gemm_output out, void* d,
                                         const mm_swiglu_epilogue* swiglu, cudaStream_t stream) {
  return engine == MM_GEMM_ENGINE_WGMMA ? mm_gemm_wgmma(p, out, d, swiglu, stream)
                                        : mm_gemm_simple(p, out, d, swiglu, stream);
}

#ifdef __cplusplus
}
#endif

#endif
