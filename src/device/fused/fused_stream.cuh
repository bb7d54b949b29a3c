/* The fused arm's task stream on the device (src/fused.h, docs/FUSED.md
 * section 2): each CTA builds the stream of the forward in its shared
 * memory, and every role turns a task into the engine's tile description
 * with its ring rows. */
#ifndef MEGAMOE_FUSED_STREAM_CUH
#define MEGAMOE_FUSED_STREAM_CUH

#include "comm/wait.cuh"
#include "common.cuh"
#include "fused.h"
#include "sched/sched_grouped.cuh"

/* The shared-memory part of a stream: the struct, the valid rows per local
 * expert, the prefixes (MM_FUSED_STREAM_WORDS). */
#define MM_FUSED_SHARED_WORDS(experts) ((experts) + 1 + MM_FUSED_STREAM_WORDS(experts))
static inline __host__ __device__ uint32_t mm_fused_stream_smem_bytes(int experts) {
  return (uint32_t)((sizeof(mm_fused_stream) + 15) / 16 * 16 + 4 * (uint32_t)MM_FUSED_SHARED_WORDS(experts));
}

/* The prefixes of s (set up by mm_fused_stream_setup) by one warp, equal to
 * what mm_fused_stream_build writes: lane l sums a contiguous chunk of the
 * experts, a warp scan gives each chunk its start, the lane writes its
 * chunk's exclusive prefixes; the last lane writes entry [experts]. */
MM_DEVICE void mm_fused_stream_scan_warp(mm_fused_stream* s) {
  const int lane = threadIdx.x & 31, E = s->experts;
  const int chunk = (E + 31) / 32;
  const int lo = min(E, lane * chunk), hi = min(E, lo + chunk);
  int sum[4] = {0, 0, 0, 0};
  for (int e = lo; e < hi; ++e) {
    const int64_t r = s->rows[e];
    sum[0] += (int)mm_fused_expert_blocks(r);
    sum[1] += (int)mm_fused_expert_units(r);
    sum[2] += (int)mm_fused_ceil_div(r, s->bm[0]);
    sum[3] += (int)mm_fused_ceil_div(r, s->bm[1]);
  }
  int32_t* arr[4] = {s->block_start, s->unit_start, s->m_start[0], s->m_start[1]};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    int incl = sum[k];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    if (lane == 31) arr[k][E] = incl;
    sum[k] = incl - sum[k]; /* this lane's chunk starts here */
  }
  for (int e = lo; e < hi; ++e) {
    const int64_t r = s->rows[e];
    s->block_start[e] = sum[0];
    s->unit_start[e] = sum[1];
    s->m_start[0][e] = sum[2];
    s->m_start[1][e] = sum[3];
    sum[0] += (int)mm_fused_expert_blocks(r);
    sum[1] += (int)mm_fused_expert_units(r);
    sum[2] += (int)mm_fused_ceil_div(r, s->bm[0]);
    sum[3] += (int)mm_fused_ceil_div(r, s->bm[1]);
  }
}

/* Every thread of the CTA: the stream of this forward at `smem`
 * (mm_fused_stream_smem_bytes(experts) bytes, 16-byte aligned) from the
 * valid rows per local expert (`counts`, device memory written earlier in
 * this kernel before a grid barrier: read coherently). Ends with a CTA
 * barrier; returns the stream. */
MM_DEVICE const mm_fused_stream* mm_fused_stream_build_cta(uint8_t* smem, const int32_t* counts,
                                                           mm_fused_order order, int experts, int bm0, int bm1,
                                                           int tiles_n0, int tiles_n1) {
  mm_fused_stream* s = reinterpret_cast<mm_fused_stream*>(smem);
  int32_t* rows = reinterpret_cast<int32_t*>(smem + (sizeof(mm_fused_stream) + 15) / 16 * 16);
  int32_t* words = rows + experts + 1;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) rows[e] = mm_ld_relaxed_gpu_s32(counts + e);
  if (threadIdx.x == 0) mm_fused_stream_setup(s, order, experts, rows, words, bm0, bm1, tiles_n0, tiles_n1);
  __syncthreads();
  if (threadIdx.x < 32) mm_fused_stream_scan_warp(s);
  __syncthreads();
  if (threadIdx.x == 0) mm_fused_stream_finish(s);
  __syncthreads();
  return s;
}

/* The engine's description of a task's tile (gemm_mainloop.cuh): its rows
 * at their ring rows (A, the A scales, and the outputs: the L1 output, the
 * row weights and the row table all live in the block's slot). A tile of
 * more than 128 rows (256-row L2 tiles) loads its second 128-row block at
 * that block's ring row (a_row1 / out_row1; the slots wrap), or, when the
 * tile does not reach a second block, its first block again: padding rows,
 * never stored, and never a slot another block is being pulled into. */
MM_DEVICE int64_t mm_fused_tile_vrow0(const mm_fused_task& t) { /* virtual row of tile row 0 */
  return t.block0 * MM_FUSED_BLOCK_ROWS + t.row0 % MM_FUSED_BLOCK_ROWS;
}
MM_DEVICE int64_t mm_fused_tile_vrow1(const mm_fused_task& t, int64_t v0) { /* of the second block's first row */
  return t.rows > MM_FUSED_BLOCK_ROWS ? (t.block0 + 1) * MM_FUSED_BLOCK_ROWS : v0;
}
MM_DEVICE mm_gemm_tile_info mm_fused_tile_of(const mm_fused_stream* s, const mm_fused_task& t, int bn) {
  const mm_fused_order& o = s->order;
  mm_gemm_tile_info ti;
  const int64_t v0 = mm_fused_tile_vrow0(t);
  const int64_t v1 = mm_fused_tile_vrow1(t, v0);
  ti.expert = t.expert;
  ti.a_row0 = ti.out_row0 = (int32_t)mm_fused_ring_row(&o, v0);
  ti.a_row1 = ti.out_row1 = (int32_t)mm_fused_ring_row(&o, v1);
  ti.rows = t.rows;
  ti.n0 = t.n * bn;
  /* Not used: the fused kernel waits on its per-block counters, not on the
   * engine's rows-ready counters (which index A rows). */
  ti.expert_a_row0 = -1;
  ti.expert_rows = s->rows[t.expert];
  return ti;
}

/* Rows of a task's tile in its first block and in the next (0 when the tile
 * stays in one block): what it adds to a per-block counter. */
MM_DEVICE int32_t mm_fused_rows_in_block0(const mm_fused_task& t) {
  return t.rows < MM_FUSED_BLOCK_ROWS ? t.rows : MM_FUSED_BLOCK_ROWS;
}
MM_DEVICE int32_t mm_fused_rows_in_block1(const mm_fused_task& t) {
  return t.rows > MM_FUSED_BLOCK_ROWS ? t.rows - MM_FUSED_BLOCK_ROWS : 0;
}

#endif
