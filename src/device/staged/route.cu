/* Routing kernels of the staged arm: count the slots of this rank's tokens
 * per global expert, publish each expert's list to its rank, lay out the
 * pool (the work is in route/route.cuh, shared with the split arm). */
#include "comm/forward.cuh"
#include "route/route.cuh"
#include "staged/staged.h"
#include "view.cuh"

/* Block e counts the slots routed to global expert e and validates its
 * share of the slots (a bad index records MEGAMOE_ERR_BAD_TOPK_INDEX). Block
 * 0 starts the forward first (records the host's injected error, see
 * comm/forward.cuh). An empty forward has num_tokens = 0 and reads nothing. */
__global__ void __launch_bounds__(256) mm_route_count_kernel(mm_layer_view L, mm_forward_view F) {
  __shared__ int scratch[33];
  const int e = blockIdx.x;
  if (e == 0) {
    if (threadIdx.x == 0) mm_forward_start(mm_status(L), F.injected_error);
    __syncthreads(); /* the injected error wins over a bad index */
  }
  const int64_t slots = (int64_t)F.num_tokens * L.top_k;
  const int64_t share = (slots + gridDim.x - 1) / gridDim.x;
  const int64_t lo = min(slots, e * share), hi = min(slots, lo + share);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) mm_route_validate(L, F, i, i + 1);
  mm_route_count_expert(L, F, e, scratch);
}

/* Block e publishes global expert e to its rank (route.cuh). */
__global__ void __launch_bounds__(256) mm_route_publish_kernel(mm_layer_view L, mm_forward_view F) {
  __shared__ int scratch[33];
  mm_route_publish_expert(L, F, blockIdx.x, mm_failed(mm_status(L)), scratch);
}

/* The pool layout (route.cuh), one block. */
__global__ void __launch_bounds__(1024) mm_pool_layout_kernel(mm_layer_view L) {
  __shared__ int scratch[33];
  mm_pool_layout_cta(L, scratch);
}

extern "C" void mm_route_launch(const mm_layer_view* Lp, const mm_forward_view* Fp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  const mm_forward_view& F = *Fp;
  mm_route_count_kernel<<<L.num_experts, 256, 0, stream>>>(L, F);
  mm_route_publish_kernel<<<L.num_experts, 256, 0, stream>>>(L, F);
}

extern "C" void mm_pool_layout_launch(const mm_layer_view* Lp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_pool_layout_kernel<<<1, 1024, 0, stream>>>(L);
}
