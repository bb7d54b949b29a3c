/* Weight preparation: the checkpoint's W1 [E_l, 2I, H] (gate rows, then up
 * rows) becomes the interleaved W1p of contract.h (64-row gate and up chunks
 * alternating) with one scale per 64-row chunk, so every 128-wide column tile
 * of the L1 GEMM holds matching gate/up pairs. W2 keeps its layout. */
#include "common.cuh"
#include "weights.h"

extern "C" {
#include "host/errors.h"
}

/* One block per prepared 64-row chunk of one expert. */
__global__ void mm_prepare_w1_kernel(const uint8_t* w1, const float* w1_sf, uint8_t* w1p,
                                     float* w1p_sf, int hidden, int intermediate) {
  const int chunks = 2 * intermediate / MM_W1_INTERLEAVE;
  const int e = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int pair = chunk / 2;
  /* Even chunks are gate rows 64*pair.., odd chunks the up rows I + 64*pair.. */
  const int64_t src_row0 = (chunk % 2 == 0 ? 0 : intermediate) + (int64_t)pair * MM_W1_INTERLEAVE;
  const int64_t rows2 = 2 * (int64_t)intermediate;
  const uint4* src = reinterpret_cast<const uint4*>(w1 + ((int64_t)e * rows2 + src_row0) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(
      w1p + ((int64_t)e * rows2 + (int64_t)chunk * MM_W1_INTERLEAVE) * hidden);
  const int64_t words = (int64_t)MM_W1_INTERLEAVE * hidden / 16;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
  const int kb = hidden / MM_SCALE_BLOCK;
  const float* sf_src = w1_sf + ((int64_t)e * (rows2 / MM_SCALE_BLOCK) + src_row0 / MM_SCALE_BLOCK) * kb;
  float* sf_dst = w1p_sf + ((int64_t)e * (rows2 / MM_W1_INTERLEAVE) + chunk) * kb;
  for (int i = threadIdx.x; i < kb; i += blockDim.x) sf_dst[i] = sf_src[i];
}

extern "C" megamoe_status mm_prepare_w1(const uint8_t* w1, const float* w1_sf, uint8_t* w1p,
                                        float* w1p_sf, int32_t local_experts, int32_t hidden,
                                        int32_t intermediate, cudaStream_t stream) {
  const int blocks = local_experts * (2 * intermediate / MM_W1_INTERLEAVE);
  mm_prepare_w1_kernel<<<blocks, 256, 0, stream>>>(w1, w1_sf, w1p, w1p_sf, hidden, intermediate);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "prepare_w1 launch: %s", cudaGetErrorString(err));
  return MEGAMOE_OK;
}

extern "C" megamoe_status mm_prepare_w1_in_place(uint8_t* w1, const float* w1_sf, float* w1p_sf,
                                                 uint8_t* scratch, int32_t local_experts, int32_t hidden,
                                                 int32_t intermediate, cudaStream_t stream) {
  const int64_t rows2 = 2 * (int64_t)intermediate;
  const int64_t expert_bytes = rows2 * hidden;
  const int64_t kb = hidden / MM_SCALE_BLOCK;
  for (int32_t e = 0; e < local_experts; ++e) {
    uint8_t* w = w1 + e * expert_bytes;
    /* Stream order: the copy out finishes before the kernel writes w back,
     * and the kernel finishes before the next expert's copy reuses scratch. */
    cudaError_t err = cudaMemcpyAsync(scratch, w, (size_t)expert_bytes, cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess)
      return mm_fail(MEGAMOE_ERR_CUDA, "prepare_w1 in place, expert %d: cudaMemcpyAsync: %s", (int)e,
                     cudaGetErrorString(err));
    MM_TRY(mm_prepare_w1(scratch, w1_sf + e * (rows2 / MM_SCALE_BLOCK) * kb, w,
                         w1p_sf + e * (rows2 / MM_W1_INTERLEAVE) * kb, 1, hidden, intermediate, stream));
  }
  return MEGAMOE_OK;
}
