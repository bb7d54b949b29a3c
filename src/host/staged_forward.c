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

#include "device/gemm/gemm.h"
#include "device/staged/staged.h"
#include "errors.h"

megamoe_status mm_staged_forward(const mm_layer_view* L, const mm_forward_view* F,
                                 const uint8_t* w1p, const float* w1p_sf, const uint8_t* w2,
                                 const float* w2_sf, int engine, cudaStream_t stream) {
  const int empty = F->injected_error != 0;
  megamoe_status gemm_st = MEGAMOE_OK;
  char gemm_msg[512] = "";
  mm_route_launch(L, F, stream);
  mm_barrier_launch(L, 0, MM_SITE_BARRIER_DISPATCH, stream);
  mm_pool_layout_launch(L, stream);
  if (!empty) {
    mm_dispatch_launch(L, stream);

    mm_gemm_problem l1;
    l1.a = L->ws + L->offset[MM_WS_POOL_X];
    l1.a_sf = (const float*)(L->ws + L->offset[MM_WS_POOL_X_SF]);
    l1.a_sf_block = MM_SCALE_BLOCK;
    l1.b = w1p;
    l1.b_sf = w1p_sf;
    l1.b_sf_block_n = MM_W1_INTERLEAVE;
    l1.expert_offset = (const int32_t*)(L->ws + L->offset[MM_WS_POOL_OFFSET]);
    l1.expert_count = (const int32_t*)(L->ws + L->offset[MM_WS_POOL_COUNT]);
    l1.num_experts = L->local_experts;
    l1.rows_cap = L->pool_rows;
    l1.n = 2 * L->intermediate;
    l1.k = L->hidden;
    gemm_st = mm_gemm_run((mm_gemm_engine)engine, &l1, MM_GEMM_OUT_F32, L->ws + L->offset[MM_WS_L1_ACC], NULL,
                          stream);
    if (gemm_st == MEGAMOE_OK) {
      mm_swiglu_quant_launch(L, stream);
      mm_gemm_problem l2 = l1;
      l2.a = L->ws + L->offset[MM_WS_L1_OUT];
      l2.a_sf = (const float*)(L->ws + L->offset[MM_WS_L1_OUT_SF]);
      l2.a_sf_block = L->quant_group;
      l2.b = w2;
      l2.b_sf = w2_sf;
      l2.b_sf_block_n = MM_SCALE_BLOCK;
      l2.n = L->hidden;
      l2.k = L->intermediate;
      gemm_st = mm_gemm_run((mm_gemm_engine)engine, &l2, MM_GEMM_OUT_BF16, L->ws + L->offset[MM_WS_L2_OUT], NULL,
                            stream);
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
