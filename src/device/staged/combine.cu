/* Combine: push each expert output row to its source rank's slot [k][t]
 * (over NVLink for a peer), then, after the barrier, reduce the K slots of
 * every token in slot order. */
#include "comm/forward.cuh"
#include "staged/staged.h"
#include "view.cuh"

__global__ void __launch_bounds__(256) mm_combine_push_kernel(mm_layer_view L) {
  if (mm_failed(mm_status(L))) return;
  const int H = L.hidden, K = L.top_k;
  const int32_t* pool_offset = mm_ws<int32_t>(L, MM_WS_POOL_OFFSET);
  const mm_pool_row* rows = mm_ws<mm_pool_row>(L, MM_WS_POOL_ROWS);
  const uint16_t* l2 = mm_ws<uint16_t>(L, MM_WS_L2_OUT);
  const int warps = blockDim.x / 32;
  const int total = pool_offset[L.local_experts];
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < total; r += gridDim.x * warps) {
    const mm_pool_row row = rows[r];
    if (row.src_rank < 0) continue;
    const int t = row.token_slot / K, k = row.token_slot % K;
    uint16_t* dst = mm_sym<uint16_t>(L, row.src_rank, MM_SYM_COMBINE) +
                    ((int64_t)k * L.max_tokens + t) * H;
    mm_warp_copy16(reinterpret_cast<uint8_t*>(dst),
                   reinterpret_cast<const uint8_t*>(l2 + (int64_t)r * H), (int64_t)H * 2);
  }
}

extern "C" void mm_combine_push_launch(const mm_layer_view* Lp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_combine_push_kernel<<<L.fill_blocks, 256, 0, stream>>>(L);
}

/* This CTA's share of the tokens' sums (mm_reduce_kernel). */
MM_DEVICE void mm_reduce_tokens(const mm_layer_view& L, const mm_forward_view& F) {
  const int H = L.hidden, K = L.top_k;
  const uint16_t* combine = mm_sym<uint16_t>(L, L.rank, MM_SYM_COMBINE);
  const int lane = threadIdx.x & 31, warps = blockDim.x / 32;
  for (int t = blockIdx.x * warps + threadIdx.x / 32; t < F.num_tokens; t += gridDim.x * warps) {
    uint32_t live = 0; /* bit k: slot k is routed */
    for (int k = 0; k < K; ++k) live |= (uint32_t)(mm_topk_at(F, (int64_t)t * K + k) >= 0) << k;
    for (int c = lane * 8; c < H; c += 32 * 8) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < K; ++k) {
        if (!(live >> k & 1)) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(combine + ((int64_t)k * L.max_tokens + t) * H + c);
        const uint16_t* b = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += mm_bf16_to_float(b[i]);
      }
      uint4 o;
      uint16_t* ob = reinterpret_cast<uint16_t*>(&o);
#pragma unroll
      for (int i = 0; i < 8; ++i) ob[i] = mm_float_to_bf16(acc[i]);
      *reinterpret_cast<uint4*>(F.y + (int64_t)t * H + c) = o;
    }
  }
}

/* y[t] = bf16(sum over unmasked k, in order k = 0..K-1, of fp32(combine[k][t])).
 * One warp per token, 8 columns (16 bytes) per lane per step. The forward's
 * last kernel: after an error of this forward y is not written (the error is
 * reported instead), and every CTA ends the forward (comm/forward.cuh). */
__global__ void __launch_bounds__(256) mm_reduce_kernel(mm_layer_view L, mm_forward_view F) {
  if (!mm_failed(mm_status(L))) mm_reduce_tokens(L, F);
  mm_forward_end(L);
}

extern "C" void mm_reduce_launch(const mm_layer_view* Lp, const mm_forward_view* Fp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  const mm_forward_view& F = *Fp;
  mm_reduce_kernel<<<L.fill_blocks, 256, 0, stream>>>(L, F);
}
