/* The staged forward: the kernel sequence of device/staged/staged.h on one
 * stream, with the two GEMMs on the selected engine. */
#include "staged_forward.h"

#include "device/gemm/gemm.h"
#include "device/staged/staged.h"
#include "errors.h"

megamoe_status mm_staged_forward(const mm_layer_view* L, const mm_forward_view* F,
                                 const uint8_t* w1p, const float* w1p_sf, const uint8_t* w2,
                                 const float* w2_sf, int engine, cudaStream_t stream) {
  mm_route_launch(L, F, stream);
  mm_barrier_launch(L, 0, MM_SITE_BARRIER_DISPATCH, stream);
  mm_pool_layout_launch(L, stream);
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
  MM_TRY(mm_gemm_run((mm_gemm_engine)engine, &l1, MM_GEMM_OUT_F32, L->ws + L->offset[MM_WS_L1_ACC],
                     NULL, stream));
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
  MM_TRY(mm_gemm_run((mm_gemm_engine)engine, &l2, MM_GEMM_OUT_BF16, L->ws + L->offset[MM_WS_L2_OUT],
                     NULL, stream));
  mm_combine_push_launch(L, stream);
  mm_barrier_launch(L, 1, MM_SITE_BARRIER_COMBINE, stream);
  mm_reduce_launch(L, F, stream);

  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "staged forward launch: %s", cudaGetErrorString(err));
  return MEGAMOE_OK;
}
