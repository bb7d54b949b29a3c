/* The static grouped tile scheduler of the GEMM engine: every tile of every
 * expert, each CTA taking tiles blockIdx.x, blockIdx.x + gridDim.x, ...
 *
 * Computed on the device by every CTA from expert_offset / expert_count /
 * expert_a_offset (device memory, read coherently: the split and fused arms
 * write them in the same kernel before a grid barrier), so the host never
 * syncs: the prefix of tiles per expert goes into shared memory, then tile t
 * is decoded by a cursor over the experts (t only grows in one CTA).
 *
 * Order inside an expert: m-tiles in groups of kGroupM = 2048 / BM; within a
 * group the m-tile index runs fastest, then the n-tile. Consecutive CTAs share
 * the same B (weight) tile in L2, and the A rows of a group (2048 rows) stay
 * in L2 while every n-tile passes over them.
 *
 * Interface a kernel uses (the split and fused arms add schedulers beside
 * this one with the same shape):
 *   Sched::smem_bytes(num_experts)          arrays in shared memory
 *   Sched s; s.build(smem, problem, BM, BN, tid, nthreads)   all threads, then a CTA barrier
 *   Sched::iter it = s.begin();  while (s.next<Cfg>(it, tile)) ...   each role replays the same sequence
 * Defensive clamps: an expert's valid rows are clamped to
 * [0, min(offset[e+1], rows_cap) - offset[e]] and to the A rows available. */
#ifndef MEGAMOE_SCHED_GROUPED_CUH
#define MEGAMOE_SCHED_GROUPED_CUH

#include "comm/wait.cuh"
#include "common.cuh"
#include "contract.h"

/* One decoded tile. */
struct mm_gemm_tile_info {
  int32_t expert;
  int32_t a_row0;   /* first A row (TMA rows, A scales, rows-ready counters) */
  int32_t out_row0; /* first output row (d, SwiGLU outputs, row weights, scatter table) */
  int32_t rows;     /* valid rows in the tile, 1..BM */
  int32_t n0;       /* first column */
  int32_t expert_a_row0; /* the expert's first A row (a multiple of MM_READY_BLOCK_ROWS) */
  int32_t expert_rows;   /* the expert's valid rows (for the rows-ready targets) */
  /* Tiles whose A is loaded in two boxes (Cfg::kABoxRows < BM, the fused
   * arm's 256-row tiles): the first A row and output row of the second box
   * (tile rows kABoxRows ..). Not set by this scheduler (its tiles load A in
   * one box). */
  int32_t a_row1;
  int32_t out_row1;
};

struct mm_sched_grouped {
  int32_t* tile_start; /* [E + 1] first tile of each expert (exclusive prefix) */
  int32_t* out_off;    /* [E] first output row */
  int32_t* a_off;      /* [E] first A row */
  int32_t* valid;      /* [E] valid rows (clamped) */
  int32_t tiles_n;
  int32_t num_experts;

  struct iter {
    int32_t t;
    int32_t cursor;
  };

  static __host__ __device__ uint32_t smem_bytes(int num_experts) {
    return (uint32_t)(4 * num_experts + 1) * 4u;
  }

  /* Every thread of the CTA calls it; the caller runs a CTA barrier after. */
  MM_DEVICE void build(uint8_t* smem, const mm_gemm_problem& p, int bm, int bn, int tid, int nthreads) {
    const int E = p.num_experts;
    int32_t* base = reinterpret_cast<int32_t*>(smem);
    tile_start = base;
    out_off = base + E + 1;
    a_off = base + 2 * E + 1;
    valid = base + 3 * E + 1;
    tiles_n = p.n / bn;
    num_experts = E;
    for (int e = tid; e < E; e += nthreads) {
      const int off = mm_ld_relaxed_gpu_s32(p.expert_offset + e);
      const int next = mm_ld_relaxed_gpu_s32(p.expert_offset + e + 1);
      const int cnt = mm_ld_relaxed_gpu_s32(p.expert_count + e);
      const int aoff = p.expert_a_offset ? mm_ld_relaxed_gpu_s32(p.expert_a_offset + e) : off;
      int lim = min(next, p.rows_cap) - off;
      if (off < 0 || off >= p.rows_cap) lim = 0;
      if (aoff < 0 || aoff >= p.rows_cap) lim = 0;
      else lim = min(lim, p.rows_cap - aoff);
      const int v = max(0, min(cnt, lim));
      out_off[e] = off;
      a_off[e] = aoff;
      valid[e] = v;
      tile_start[e + 1] = (v + bm - 1) / bm * tiles_n;
    }
    __syncthreads();
    if (tid < 32) {
      /* Inclusive scan of tile_start[1..E] by one warp: lane l owns a chunk. */
      const int chunk = (E + 31) / 32;
      const int lo = min(E, tid * chunk), hi = min(E, lo + chunk);
      int sum = 0;
      for (int e = lo; e < hi; ++e) sum += tile_start[e + 1];
      int run = mm_warp_inclusive_scan(sum) - sum; /* tid is threadIdx.x: warp 0 */
      for (int e = lo; e < hi; ++e) {
        run += tile_start[e + 1];
        tile_start[e + 1] = run;
      }
      if (tid == 0) tile_start[0] = 0;
    }
  }

  MM_DEVICE int total() const { return tile_start[num_experts]; }

  MM_DEVICE iter begin() const {
    iter it;
    it.t = (int)blockIdx.x - (int)gridDim.x;
    it.cursor = 0;
    return it;
  }

  /* Whether this CTA has a tile after the current one. */
  MM_DEVICE bool has_next(const iter& it) const { return it.t + (int)gridDim.x < total(); }

  /* Advances to this CTA's next tile; false when none is left. */
  template <class Cfg>
  MM_DEVICE bool next(iter& it, mm_gemm_tile_info& ti) const {
    it.t += (int)gridDim.x;
    if (it.t >= total()) return false;
    seek<Cfg>(it, it.t, ti);
    return true;
  }

  /* Decodes tile t (0 <= t < total()) into ti; the tiles one iterator is
   * moved to must only grow (the cursor over the experts only moves on):
   * the static order above, or the tiles a CTA claims from a counter. */
  template <class Cfg>
  MM_DEVICE void seek(iter& it, int t, mm_gemm_tile_info& ti) const {
    it.t = t;
    while (it.t >= tile_start[it.cursor + 1]) ++it.cursor;
    const int e = it.cursor;
    const int local = it.t - tile_start[e];
    const int v = valid[e];
    const int mt = (v + Cfg::BM - 1) / Cfg::BM;
    const int per_group = Cfg::kGroupM * tiles_n;
    const int g = local / per_group;
    const int gsz = min(Cfg::kGroupM, mt - g * Cfg::kGroupM);
    const int r = local - g * per_group;
    const int n_t = r / gsz;
    const int m_t = g * Cfg::kGroupM + (r - n_t * gsz);
    ti.expert = e;
    ti.a_row0 = a_off[e] + m_t * Cfg::BM;
    ti.out_row0 = out_off[e] + m_t * Cfg::BM;
    ti.rows = min(Cfg::BM, v - m_t * Cfg::BM);
    ti.n0 = n_t * Cfg::BN;
    ti.expert_a_row0 = a_off[e];
    ti.expert_rows = v;
  }
};

#endif
