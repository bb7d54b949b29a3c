/* The staged forward: the kernel sequence of device/staged/staged.h on one
 * stream, with the two GEMMs on the selected engine.
 *
 * Whatever happens on the host, the sequence keeps its two cross-rank
 * barriers and its last kernel (which ends the forward), so the peers stay in
 * step: an empty forward (F->injected_error) skips the work in between, and a
 * GEMM the engine refuses to enqueue records its status on the device and
 * the rest of the forward skips its work and carries the error. */
#include "staged_forward.h"

#include <stdio.h>
#include <string.h>

#include "device/staged/staged.h"
#include "errors.h"

megamoe_status mm_staged_forward(const mm_layer_view* L, const mm_forward_view* F, const mm_arm_gemm* gemms,
                                 cudaStream_t stream) {
  const int empty = F->injected_error != 0;
  megamoe_status gemm_st = MEGAMOE_OK;
  char gemm_msg[512] = "";
  mm_route_launch(L, F, stream);
  mm_barrier_launch(L, 0, MM_SITE_BARRIER_DISPATCH, stream);
  mm_pool_layout_launch(L, stream);
  if (!empty) {
    mm_dispatch_launch(L, stream);
    /* L1: pool x W1p^T -> fp32 [P, 2I]; SwiGLU + quantization; L2:
     * quantized L1 output x W2^T -> bf16 [P, H]. */
    gemm_st = mm_arm_gemm_run(&gemms[0], stream);
    if (gemm_st == MEGAMOE_OK) {
      mm_swiglu_quant_launch(L, stream);
      gemm_st = mm_arm_gemm_run(&gemms[1], stream);
    }
    if (gemm_st != MEGAMOE_OK) {
      /* Keep the ranks in step: the device records the failure, the
       * combine push skips, the barrier carries it. */
      snprintf(gemm_msg, sizeof gemm_msg, "%s", megamoe_last_error());
      mm_record_error_launch(L, (int)gemm_st, MM_SITE_HOST, 0, stream);
    }
    mm_combine_push_launch(L, stream);
  }
  mm_barrier_launch(L, 1, MM_SITE_BARRIER_COMBINE, stream);
  mm_reduce_launch(L, F, stream);

  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "staged forward launch: %s", cudaGetErrorString(err));
  if (gemm_st != MEGAMOE_OK) return mm_fail(gemm_st, "%s (the forward ran on without its GEMMs)", gemm_msg);
  return MEGAMOE_OK;
}
