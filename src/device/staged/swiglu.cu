/* Staged SwiGLU: fp32 L1 output -> a = silu(g) * u * weight -> fp8 with one
 * scale per G columns. One warp per pool row, 128 a-columns per step (each
 * lane 4), so a G = 128 group is one warp step and G = 64 a half-warp. */
#include "staged/staged.h"
#include "view.cuh"

__global__ void __launch_bounds__(256) mm_swiglu_quant_kernel(mm_layer_view L) {
  if (mm_failed(mm_status(L))) return;
  const int El = L.local_experts, I = L.intermediate, G = L.quant_group;
  const int32_t* pool_offset = mm_ws<int32_t>(L, MM_WS_POOL_OFFSET);
  const mm_pool_row* rows = mm_ws<mm_pool_row>(L, MM_WS_POOL_ROWS);
  const float* weights = mm_ws<float>(L, MM_WS_POOL_WEIGHT);
  const float* acc = mm_ws<float>(L, MM_WS_L1_ACC);
  uint8_t* out = mm_ws<uint8_t>(L, MM_WS_L1_OUT);
  float* out_sf = mm_ws<float>(L, MM_WS_L1_OUT_SF);
  const int64_t P = L.pool_rows;
  const int lane = threadIdx.x & 31, warps = blockDim.x / 32;
  const int total = pool_offset[El];
  const unsigned group_lanes = G / 4; /* lanes sharing one scale: 32 or 16 */

  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < total; r += gridDim.x * warps) {
    const bool valid = rows[r].src_rank >= 0;
    const float w = weights[r];
    const float* h = acc + (int64_t)r * 2 * I;
    for (int c0 = 0; c0 < I; c0 += 128) {
      const int col = c0 + lane * 4;               /* first of this lane's 4 a-columns */
      const int gate = (col / MM_W1_INTERLEAVE) * 2 * MM_W1_INTERLEAVE + col % MM_W1_INTERLEAVE;
      float a[4] = {0.f, 0.f, 0.f, 0.f};
      float amax = 0.f;
      if (valid) {
        const float4 g = *reinterpret_cast<const float4*>(h + gate);
        const float4 u = *reinterpret_cast<const float4*>(h + gate + MM_W1_INTERLEAVE);
        a[0] = mm_swiglu(g.x, u.x, L.has_clamp, L.clamp) * w;
        a[1] = mm_swiglu(g.y, u.y, L.has_clamp, L.clamp) * w;
        a[2] = mm_swiglu(g.z, u.z, L.has_clamp, L.clamp) * w;
        a[3] = mm_swiglu(g.w, u.w, L.has_clamp, L.clamp) * w;
        amax = fmaxf(fmaxf(fabsf(a[0]), fabsf(a[1])), fmaxf(fabsf(a[2]), fabsf(a[3])));
      }
      for (unsigned m = 1; m < group_lanes; m <<= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      const float sf = mm_group_scale(amax);
      uint32_t packed = 0;
      if (valid)
        for (int q = 0; q < 4; ++q) packed |= (uint32_t)mm_float_to_e4m3(a[q] / sf) << (8 * q);
      *reinterpret_cast<uint32_t*>(out + (int64_t)r * I + col) = packed;
      if (lane % group_lanes == 0) out_sf[(int64_t)(col / G) * P + r] = valid ? sf : 0.f;
    }
  }
}

extern "C" void mm_swiglu_quant_launch(const mm_layer_view* Lp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_swiglu_quant_kernel<<<L.fill_blocks, 256, 0, stream>>>(L);
}
