/* Dispatch pull: each pool row copies its token's x row (H bytes) and x_sf
 * row from the source rank's symmetric input (over NVLink for a peer), plus
 * its metadata and routing weight from the entry the source published here.
 * Padding rows are zeroed so the GEMMs never read uninitialized memory. */
#include "comm/barrier.cuh"
#include "route/route.cuh"
#include "staged/staged.h"
#include "view.cuh"

__global__ void __launch_bounds__(256) mm_dispatch_kernel(mm_layer_view L) {
  extern __shared__ int32_t s_offset[]; /* [E_l + 1] pool offsets */
  const int El = L.local_experts, H = L.hidden;
  const int32_t* pool_offset = mm_ws<int32_t>(L, MM_WS_POOL_OFFSET);
  for (int i = threadIdx.x; i <= El; i += blockDim.x) s_offset[i] = pool_offset[i];
  __syncthreads();
  if (mm_failed(mm_status(L))) return;
  const int32_t* pool_count = mm_ws<int32_t>(L, MM_WS_POOL_COUNT);
  const int64_t P = L.pool_rows;
  const int sf_cols = H / MM_SCALE_BLOCK;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int total = s_offset[El];
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < total; r += gridDim.x * warps) {
    const int le = mm_pool_expert_of(s_offset, El, r);
    if (r - s_offset[le] < pool_count[le]) {
      mm_pull_row(L, r, le);
      continue;
    }
    /* A padding row: zeros, so the GEMMs never read uninitialized memory. */
    uint8_t* dst = mm_ws<uint8_t>(L, MM_WS_POOL_X) + (int64_t)r * H;
    for (int i = lane; i < H / 16; i += 32) reinterpret_cast<uint4*>(dst)[i] = make_uint4(0, 0, 0, 0);
    for (int i = lane; i < sf_cols; i += 32) mm_ws<float>(L, MM_WS_POOL_X_SF)[i * P + r] = 0.f;
    if (lane == 0) {
      mm_ws<mm_pool_row>(L, MM_WS_POOL_ROWS)[r] = mm_pool_row{-1, -1};
      mm_ws<float>(L, MM_WS_POOL_WEIGHT)[r] = 0.f;
    }
  }
}

extern "C" void mm_dispatch_launch(const mm_layer_view* Lp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  const size_t smem = sizeof(int32_t) * (L.local_experts + 1);
  mm_dispatch_kernel<<<L.fill_blocks, 256, smem, stream>>>(L);
}

/* One block; thread p signals and waits on peer p. Barrier `which` (0:
 * dispatch, 1: combine) of the forward in progress waits for
 * mm_barrier_value(forward, which): values grow over the layer's life. */
__global__ void mm_barrier_kernel(mm_layer_view L, int which, int site) {
  mm_device_status* st = mm_status(L);
  mm_barrier_thread(L, st, mm_barrier_value(mm_forward_number(st), which), site);
}

/* Records a host-side failure found in the middle of enqueueing a forward
 * (a GEMM launch that was refused): the rest of the forward then skips its
 * work, and its barriers carry the code to the peers. */
__global__ void mm_record_error_kernel(mm_layer_view L, int code, int site, int detail) {
  mm_record_error(mm_status(L), code, site, -1, detail, 0, 0);
}

extern "C" void mm_record_error_launch(const mm_layer_view* Lp, int code, int site, int detail,
                                       cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_record_error_kernel<<<1, 1, 0, stream>>>(L, code, site, detail);
}

extern "C" void mm_barrier_launch(const mm_layer_view* Lp, int which, int site, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_barrier_kernel<<<1, 32, 0, stream>>>(L, which, site);
}
