/* Combine: push each expert output row to its source rank's row t * K + k
 * (over NVLink for a peer), then, after the barrier, reduce the K slots of
 * every token in slot order. */
#include "comm/forward.cuh"
#include "route/route.cuh"
#include "staged/staged.h"
#include "view.cuh"

__global__ void __launch_bounds__(256) mm_combine_push_kernel(mm_layer_view L) {
  if (mm_failed(mm_status(L))) return;
  const int H = L.hidden;
  const int32_t* pool_offset = mm_ws<int32_t>(L, MM_WS_POOL_OFFSET);
  const mm_pool_row* rows = mm_ws<mm_pool_row>(L, MM_WS_POOL_ROWS);
  const uint16_t* l2 = mm_ws<uint16_t>(L, MM_WS_L2_OUT);
  const int warps = blockDim.x / 32;
  const int total = pool_offset[L.local_experts];
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < total; r += gridDim.x * warps) {
    const mm_pool_row row = rows[r];
    if (row.src_rank < 0) continue;
    uint16_t* dst = mm_sym<uint16_t>(L, row.src_rank, MM_SYM_COMBINE) + (int64_t)row.token_slot * H;
    mm_warp_copy16(reinterpret_cast<uint8_t*>(dst),
                   reinterpret_cast<const uint8_t*>(l2 + (int64_t)r * H), (int64_t)H * 2);
  }
}

extern "C" void mm_combine_push_launch(const mm_layer_view* Lp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_combine_push_kernel<<<L.fill_blocks, 256, 0, stream>>>(L);
}

/* y[t] = bf16(sum over unmasked k, in order k = 0..K-1, of fp32(combine[t][k]))
 * (route.cuh). The forward's last kernel: after an error of this forward y is
 * not written (the error is reported instead), and every CTA ends the
 * forward (comm/forward.cuh). */
__global__ void __launch_bounds__(256) mm_reduce_kernel(mm_layer_view L, mm_forward_view F) {
  if (!mm_failed(mm_status(L))) mm_reduce_tokens(L, F, threadIdx.x / 32, blockDim.x / 32);
  mm_forward_end(L);
}

extern "C" void mm_reduce_launch(const mm_layer_view* Lp, const mm_forward_view* Fp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  const mm_forward_view& F = *Fp;
  mm_reduce_kernel<<<L.fill_blocks, 256, 0, stream>>>(L, F);
}
