/* Epilogues of the GEMM engine: what a math warpgroup does with a tile's
 * promoted accumulators (gemm_mainloop.cuh's acc[kWaves][64], m64n128
 * fragment layout).
 *
 *   mm_gemm_epilogue_store<Cfg, bf16>   fp32 / bf16 d, direct st.global from
 *                                        the fragment (valid rows only)
 *   mm_gemm_stage_bf16<Cfg>              bf16 tile into the staging area
 *                                        (stmatrix, 128-byte-swizzled boxes of
 *                                        64 columns, the layout TMA expects)
 *   mm_gemm_epilogue_tma_store<Cfg>      staging + TMA stores (full tiles)
 *   mm_gemm_epilogue_scatter<Cfg>        staging + each valid row copied to
 *                                        its destination (16-byte stores;
 *                                        destinations loaded before staging)
 *   mm_gemm_epilogue_swiglu<Cfg>         SwiGLU + routing weight + per-G fp8
 *
 * The staging epilogues and the SwiGLU epilogue of a column-split tile use
 * CTA-wide named barriers over the 256 math threads: every math thread must
 * call them, whatever its wave holds. */
#ifndef MEGAMOE_GEMM_EPILOGUE_CUH
#define MEGAMOE_GEMM_EPILOGUE_CUH

#include <cuda.h>

#include "comm/wait.cuh"
#include "common.cuh"
#include "gemm/gemm_cfg.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "ptx/stmatrix.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"

#define MM_GEMM_BAR_EPI 3 /* named barrier of the epilogues (0: __syncthreads) */

MM_DEVICE void mm_gemm_math_barrier() { mm_named_barrier_sync_c<MM_GEMM_BAR_EPI, MM_GEMM_MATH_THREADS>(); }

MM_DEVICE uint32_t mm_pack_bf16x2(float lo, float hi) {
  return (uint32_t)mm_float_to_bf16(lo) | ((uint32_t)mm_float_to_bf16(hi) << 16);
}

/* fp32 (kBf16 = false) or bf16 d [rows_cap, n] at the tile's output rows,
 * valid rows only. */
template <class Cfg, bool kBf16>
MM_DEVICE void mm_gemm_epilogue_store(const mm_gemm_problem& p, const mm_gemm_tile_info& ti, int wg,
                                      float (&acc)[Cfg::kWaves][64]) {
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) {
    const int r0 = mm_gemm_frag_row<Cfg>(wg, wm);
    const bool ok0 = r0 < ti.rows, ok1 = r0 + 8 < ti.rows;
    const int64_t grow = (int64_t)ti.out_row0 + r0;
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      const float* a = acc[wm * Cfg::kWN + wn];
      const int64_t col = ti.n0 + mm_gemm_frag_col<Cfg>(wg, wn);
      if (kBf16) {
        uint32_t* d0 = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.d) + grow * p.n + col);
        uint32_t* d1 = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.d) + (grow + 8) * p.n + col);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (ok0) d0[4 * j] = mm_pack_bf16x2(a[4 * j], a[4 * j + 1]);
          if (ok1) d1[4 * j] = mm_pack_bf16x2(a[4 * j + 2], a[4 * j + 3]);
        }
      } else {
        float2* d0 = reinterpret_cast<float2*>(static_cast<float*>(p.d) + grow * p.n + col);
        float2* d1 = reinterpret_cast<float2*>(static_cast<float*>(p.d) + (grow + 8) * p.n + col);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (ok0) d0[4 * j] = make_float2(a[4 * j], a[4 * j + 1]);
          if (ok1) d1[4 * j] = make_float2(a[4 * j + 2], a[4 * j + 3]);
        }
      }
    }
  }
}

/* TMA's 128-byte swizzle: rows of 128 bytes whose 16-byte chunks are
 * XOR-permuted by row % 8. Where chunk `chunk` of row r sits in its row: */
MM_DEVICE uint32_t mm_swz128_chunk(uint32_t r, uint32_t chunk) { return (chunk ^ (r & 7u)) << 4; }
/* and the byte offset of byte c (< 128) of row r. */
MM_DEVICE uint32_t mm_swz128(uint32_t r, uint32_t c) { return r * 128u + (mm_swz128_chunk(r, c >> 4) | (c & 15u)); }

/* Staging layout: BN / 64 boxes of BM rows x 128 bytes (64 bf16 columns),
 * each row in the 128-byte swizzle; the address of the 16-byte chunk that
 * holds column col. */
template <class Cfg>
MM_DEVICE uint32_t mm_gemm_staging_addr(uint32_t base, uint32_t row, uint32_t col) {
  return base + (col >> 6) * (uint32_t)(Cfg::BM * 128) + row * 128u + mm_swz128_chunk(row, (col & 63u) >> 3);
}

/* The tile's bf16 values into the staging area (stmatrix), this thread's
 * share; the caller makes sure no reader of the previous tile remains. */
template <class Cfg>
MM_DEVICE void mm_gemm_stage_bf16_writes(const mm_gemm_smem& sm, int wg, float (&acc)[Cfg::kWaves][64]) {
  static_assert(Cfg::kStaging, "staging area");
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
  const int mi = lane >> 3; /* the 8x8 matrix whose row this lane addresses */
  const int r_in = warp * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) {
    const uint32_t row = (uint32_t)(mm_gemm_wg_row0<Cfg>(wg) + 64 * wm + r_in);
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      const float* a = acc[wm * Cfg::kWN + wn];
#pragma unroll
      for (int jp = 0; jp < 8; ++jp) {
        const int j0 = 2 * jp, j1 = 2 * jp + 1;
        const uint32_t col = (uint32_t)(mm_gemm_wg_col0<Cfg>(wg) + 128 * wn + 8 * (j0 + (mi >> 1)));
        mm_stmatrix_x4(mm_gemm_staging_addr<Cfg>(sm.d, row, col), mm_pack_bf16x2(a[4 * j0], a[4 * j0 + 1]),
                       mm_pack_bf16x2(a[4 * j0 + 2], a[4 * j0 + 3]), mm_pack_bf16x2(a[4 * j1], a[4 * j1 + 1]),
                       mm_pack_bf16x2(a[4 * j1 + 2], a[4 * j1 + 3]));
      }
    }
  }
}

/* The tile's bf16 values into the staging area; all 256 math threads. On
 * return the staging area holds the whole tile (a named barrier was passed
 * after the writes). `wait_tma` (thread 0): first wait until the previous
 * tile's TMA stores have read the area. */
template <class Cfg>
MM_DEVICE void mm_gemm_stage_bf16(const mm_gemm_smem& sm, int wg, float (&acc)[Cfg::kWaves][64], bool wait_tma,
                                  bool for_async_proxy) {
  if (wait_tma && threadIdx.x == 0) mm_bulk_wait_group_read<0>();
  mm_gemm_math_barrier(); /* the previous tile's readers of the staging area are done */
  mm_gemm_stage_bf16_writes<Cfg>(sm, wg, acc);
  if (for_async_proxy) mm_fence_proxy_async_smem(); /* TMA reads what stmatrix wrote */
  mm_gemm_math_barrier();
}

/* bf16 epilogue of a FULL tile through the staging area and TMA stores.
 * tm_d: bf16 [rows_cap, n], box 64 x BM, 128-byte swizzle. Thread 0 issues
 * and tracks the stores. */
template <class Cfg>
MM_DEVICE void mm_gemm_epilogue_tma_store(const mm_gemm_smem& sm, const CUtensorMap* tm_d,
                                          const mm_gemm_tile_info& ti, int wg, float (&acc)[Cfg::kWaves][64]) {
  mm_gemm_stage_bf16<Cfg>(sm, wg, acc, true, true);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < Cfg::BN / 64; ++b)
      mm_tma_store_2d(tm_d, sm.d + (uint32_t)b * (uint32_t)(Cfg::BM * 128), ti.n0 + 64 * b, ti.out_row0);
    mm_bulk_commit_group();
  }
}

/* Output row of tile row r (the row the scatter table is indexed by): rows
 * past the first A box of a two-box tile (Cfg::kABoxRows < BM) sit at the
 * second box's rows. */
template <class Cfg>
MM_DEVICE int64_t mm_gemm_out_row(const mm_gemm_tile_info& ti, int r) {
  if constexpr (Cfg::kABoxRows == Cfg::BM) return (int64_t)ti.out_row0 + r;
  else return r < Cfg::kABoxRows ? (int64_t)ti.out_row0 + r : (int64_t)ti.out_row1 + (r - Cfg::kABoxRows);
}

/* Where output row r of the tile goes (contract.h, mm_gemm_scatter): its
 * source rank's combine row at the tile's first column, or NULL for a row
 * that is skipped. */
template <class Cfg>
MM_DEVICE uint8_t* mm_gemm_scatter_dst(const mm_gemm_problem& p, const mm_gemm_tile_info& ti, int r) {
  const mm_pool_row d = p.scatter.rows[mm_gemm_out_row<Cfg>(ti, r)];
  uint8_t* base = d.src_rank >= 0 && d.src_rank < MM_MAX_RANKS ? p.scatter.dst_base[d.src_rank] : nullptr;
  return base ? base + ((int64_t)d.token_slot * p.n + ti.n0) * 2 : nullptr;
}

/* bf16 rows to per-row destinations (contract.h, mm_gemm_scatter): the tile
 * goes through the staging area, then the 256 math threads copy each valid
 * row's BN columns in 16-byte chunks (a warp covers 512 contiguous bytes:
 * one or two rows), over NVLink when the destination is a peer's. */
template <class Cfg>
MM_DEVICE void mm_gemm_epilogue_scatter(const mm_gemm_smem& sm, const mm_gemm_problem& p,
                                        const mm_gemm_tile_info& ti, int wg, float (&acc)[Cfg::kWaves][64]) {
  /* Thread t copies 16-byte chunk t % kChunks of rows t / kChunks + i * kRowStep. */
  constexpr int kChunks = Cfg::BN * 2 / 16; /* 16-byte chunks per row */
  constexpr int kRowStep = MM_GEMM_MATH_THREADS / kChunks;
  constexpr int kRowsPerThread = Cfg::BM / kRowStep;
  static_assert(Cfg::BM % kRowStep == 0, "scatter rows");
  const int c = threadIdx.x % kChunks, r_first = threadIdx.x / kChunks; /* math threads are 0..255 */
  /* The rows' destinations first: their loads are in flight while the tile is staged. */
  uint8_t* dst[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = r_first + i * kRowStep;
    dst[i] = r < ti.rows ? mm_gemm_scatter_dst<Cfg>(p, ti, r) : nullptr;
  }
  mm_gemm_stage_bf16<Cfg>(sm, wg, acc, false, false);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (!dst[i]) continue;
    const uint32_t off = mm_gemm_staging_addr<Cfg>(0u, (uint32_t)(r_first + i * kRowStep), (uint32_t)(8 * c));
    reinterpret_cast<uint4*>(dst[i])[c] = *reinterpret_cast<const uint4*>(sm.d_ptr + off);
  }
}

/* ---- Scatter with the stores off the math warps --------------------------
 * The math warpgroups only stage the tile (bf16, stmatrix) and hand it to the
 * copy warps (MM_GEMM_COPY_THREADS threads of the producer warpgroup), which
 * copy each valid row to its destination (contract.h, mm_gemm_scatter) while
 * the math warpgroups run the next tile's K loop: the row stores, over
 * NVLink for a peer's rows, no longer hold the tensor cores.
 * Hand-off of tile j (the j-th tile of this CTA, the same in both roles, as
 * both walk the scheduler): math waits copy_empty phase j - 1 (the copy
 * warps read tile j - 1 out), writes, arrives on copy_full (release); the
 * copy warps wait copy_full phase j (acquire), copy, arrive on copy_empty.
 * Every wait has the pipeline's deadline and gives up on the abort word. */

/* Math side, every math thread; tile_index: j. When the wait gives up the
 * tile is not staged: the abort word is set, and the copy warps leave on it. */
template <class Cfg>
MM_DEVICE void mm_gemm_epilogue_stage_for_copy(const mm_gemm_smem& sm, const mm_gemm_problem& p, int tile_index,
                                               int wg, float (&acc)[Cfg::kWaves][64]) {
  if (tile_index > 0 && !mm_gemm_wait(sm, sm.copy_empty, (uint32_t)(tile_index - 1) & 1u, p)) return;
  mm_gemm_stage_bf16_writes<Cfg>(sm, wg, acc);
  mm_mbar_arrive(sm.copy_full);
}

#define MM_GEMM_BAR_COPY 4 /* named barrier of the copy warps */

/* The combine's arrival counts of one copied tile (contract.h,
 * mm_gemm_scatter.arrived_base): the first copy warp, after the copy's
 * closing barrier, which ordered every copy thread's row stores before it.
 * Its system-scope fence makes the relaxed adds that follow releases
 * cumulative over those stores (comm/wait.cuh), so a source rank that
 * acquires a counter sees the rows. One fence per tile, not one per row.
 * The rows counted are exactly the rows stored (mm_gemm_scatter_dst), from
 * the row table: dst[] in shared memory is the next tile's already. The
 * closing warp barrier orders the lanes' table reads before whatever lane
 * 0 releases next (the fused arm's L2_DONE, which frees the ring slot).
 * The sources' orders (MM_SYM_COMBINE_ORDER) were written before barrier 0,
 * which this kernel (or, for the split arm's kernel 2, kernel 1) passed. */
template <class Cfg>
MM_DEVICE void mm_gemm_count_arrivals(const mm_gemm_problem& p, const mm_gemm_tile_info& ti, int lane) {
  static_assert(MM_COMBINE_UNIT_COLS % Cfg::BN == 0, "a tile's row adds to one combine unit");
  /* Only for sources that take the early order this forward; none (the
   * large calls): no fence, no add. */
  uint32_t early = 0xffffffffu;
  if (p.scatter.source_early) {
    const int32_t mine = lane < p.scatter.num_ranks ? mm_ld_relaxed_gpu_s32(p.scatter.source_early + lane) : 0;
    early = __ballot_sync(0xffffffffu, mine != 0);
    if (early == 0) return;
  }
  mm_fence_acq_rel_sys();
  const int32_t cols = mm_combine_row_columns(p.n, ti.n0, Cfg::BN);
  for (int r = lane; r < ti.rows; r += 32) {
    const mm_pool_row d = p.scatter.rows[mm_gemm_out_row<Cfg>(ti, r)];
    if (d.src_rank < 0 || d.src_rank >= MM_MAX_RANKS || !p.scatter.dst_base[d.src_rank]) continue;
    if (!(early >> d.src_rank & 1u)) continue;
    int32_t* counters = p.scatter.arrived_base[d.src_rank];
    if (counters)
      mm_red_relaxed_sys_add_s32(counters + mm_combine_arrival_index(d.token_slot, p.scatter.top_k, p.n, ti.n0), cols);
  }
  __syncwarp();
}

/* Copy side, one tile (the j-th this CTA stages for its copy threads): the
 * kThreads copy threads (index c_tid; barrier MM_GEMM_BAR_COPY over them).
 * The rows' destinations are looked up into shared memory (the xwg area: BM
 * pointers) while the math warps still compute the tile, then the threads
 * wait for the staged tile and store it. All copy threads take one decision
 * (bar.red.or): false when the pipeline was abandoned (nothing stored, the
 * caller leaves). rows_ready: this thread may read the scatter table now
 * (the engine's kernels: always; the fused arm: after its rows' pull was
 * acquired); false counts as abandoned. */
template <class Cfg, int kThreads>
MM_DEVICE bool mm_gemm_copy_tile(const mm_gemm_smem& sm, const mm_gemm_problem& p, const mm_gemm_tile_info& ti,
                                 uint32_t j, int c_tid, bool rows_ready = true) {
  static_assert(2 * Cfg::BM * sizeof(float) >= Cfg::BM * sizeof(void*), "row destinations fit the xwg area");
  static_assert(kThreads % 32 == 0, "whole copy warps");
  constexpr int kChunks = Cfg::BN * 2 / 16; /* 16-byte chunks per row */
  uint8_t** dst = reinterpret_cast<uint8_t**>(sm.xwg);
  if (rows_ready)
    for (int r = c_tid; r < ti.rows; r += kThreads) dst[r] = mm_gemm_scatter_dst<Cfg>(p, ti, r);
  const bool staged = rows_ready && mm_gemm_wait(sm, sm.copy_full, j & 1u, p);
  /* Also the barrier that publishes dst[] to every copy thread. */
  if (mm_named_barrier_or(MM_GEMM_BAR_COPY, kThreads, !staged)) return false;
  /* The rows are read once, by the combine's reduction after barrier 1:
   * stored evict-first, so they do not push out of L2 the weights and rows
   * the GEMMs still read (8192 tokens, one H200, mean of four A/B pairs:
   * fused -1.5 %, split unchanged; docs/PERF.md, tenth session). */
  const uint64_t policy = mm_l2_policy_evict_first();
#pragma unroll 2
  for (int idx = c_tid; idx < ti.rows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    uint8_t* row = dst[r];
    if (!row) continue;
    const uint32_t off = mm_gemm_staging_addr<Cfg>(0u, (uint32_t)r, (uint32_t)(8 * c));
    mm_st_global_v4_hint(reinterpret_cast<uint4*>(row) + c, *reinterpret_cast<const uint4*>(sm.d_ptr + off), policy);
  }
  mm_mbar_arrive(sm.copy_empty); /* this thread's reads of the staging area are done (their values are stored) */
  mm_named_barrier_sync_c<MM_GEMM_BAR_COPY, kThreads>(); /* dst[] is read out before the next tile's lookups */
  if (MM_EARLY_COMBINE && p.scatter.top_k > 0 && c_tid < 32) mm_gemm_count_arrivals<Cfg>(p, ti, c_tid);
  return true;
}

/* Copy side: the MM_GEMM_COPY_THREADS copy threads (index c_tid), every tile
 * of this CTA in the order next_tile gives them (the math warpgroups' order),
 * until none is left or the pipeline is abandoned. next_tile(ti): 1 a tile,
 * 0 none left, -1 gave up (the same in every copy thread but a give-up). */
template <class Cfg, class NextTile>
MM_DEVICE void mm_gemm_copy_loop(const mm_gemm_smem& sm, const mm_gemm_problem& p, int c_tid, NextTile&& next_tile) {
  for (uint32_t j = 0;; ++j) {
    mm_gemm_tile_info ti;
    const int got = next_tile(ti);
    if (!mm_gemm_copy_tile<Cfg, MM_GEMM_COPY_THREADS>(sm, p, ti, j, c_tid, got == 1)) break;
  }
}

/* Whether the SwiGLU epilogue stores this tile's codes through the staging
 * area and one TMA store (a full tile of a kSwStage config with the codes'
 * map), or row by row; the same in every math thread. A kernel that shares
 * the staging area with another use (the fused arm) asks it too. */
template <class Cfg>
MM_DEVICE bool mm_gemm_swiglu_staged(const mm_gemm_problem& p, const mm_gemm_tile_info& ti,
                                     const CUtensorMap* tm_out) {
  return Cfg::kSwStage && tm_out != nullptr && p.swiglu.tma_out && ti.rows == Cfg::BM;
}

/* Epilogue of the L1 GEMM: B is the prepared W1 (MM_W1_INTERLEAVE = 64), so
 * a 128-wide wave holds gate columns in registers i < 32 and the matching up
 * columns in i + 32, for a-columns (n0 + wave column) / 2 + 0..63.
 * a = silu(g) * u * row_weight (clamp first), quantized per `group`
 * a-columns: sf = max(amax, 1e-10) / 448, q = e4m3(a / sf). A group of 64 is
 * one wave. A group of 128 is two waves: the two waves of a warpgroup
 * (kWN == 2, the 128x256 tile), or the two warpgroups' waves of a
 * column-split 256-wide tile (64x256), whose per-row amax is exchanged
 * through shared memory. The row's amax is spread over the 4 threads of a
 * quad (lanes 4q .. 4q + 3). max is exact, so every split gives bitwise the
 * same scales and codes. */
template <class Cfg, bool kLateWeights = true>
MM_DEVICE void mm_gemm_epilogue_swiglu(const mm_gemm_smem& sm, const mm_gemm_problem& p, const mm_gemm_tile_info& ti,
                                       int wg, float (&acc)[Cfg::kWaves][64], const CUtensorMap* tm_out = nullptr) {
  const mm_swiglu_epilogue& q = p.swiglu;
  const int inter = p.n / 2;
  const bool pair_in_wg = Cfg::kWN == 2 && q.group == 128;
  constexpr bool kCanPairAcross = Cfg::kSplitN && Cfg::kWN == 1 && Cfg::BN == 256;
  const bool pair_across = kCanPairAcross && q.group == 128;
  /* A full tile's codes go through the staging area and one TMA store (the
   * same for every math thread: the barriers below are CTA-wide); a partial
   * tile's are stored row by row, valid rows only. */
  const bool staged = mm_gemm_swiglu_staged<Cfg>(p, ti, tm_out);
  if (staged) {
    if (threadIdx.x == 0) mm_bulk_wait_group_read<0>(); /* the previous tile's store has read the area */
    mm_gemm_math_barrier();
  }
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) {
    const int r0 = mm_gemm_frag_row<Cfg>(wg, wm);
    const bool ok0 = r0 < ti.rows, ok1 = r0 + 8 < ti.rows;
    const int64_t grow = (int64_t)ti.out_row0 + r0;
    /* Coherent loads: the split arm's pull writes the weights in this kernel.
     * kLateWeights: first used after the whole tile's SwiGLU math, which
     * hides their latency (bench-gemm 128x256 at M 65536: ~55 us); else in
     * the same pass as the math (the fused kernel: the late order cost it
     * 1 % at 2048 tokens once, and gained nothing in the thirty-third
     * session's A/B). The same operations on each element either way. */
    const float w0 = ok0 ? mm_ld_relaxed_gpu_f32(q.row_weight + grow) : 0.f;
    const float w1 = ok1 ? mm_ld_relaxed_gpu_f32(q.row_weight + grow + 8) : 0.f;
    if constexpr (kLateWeights) {
#pragma unroll
      for (int wn = 0; wn < Cfg::kWN; ++wn) {
        float* a = acc[wm * Cfg::kWN + wn];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int i = 4 * j + b;
            a[i] = mm_swiglu(a[i], a[i + 32], q.has_clamp, q.clamp);
          }
      }
    }
    float amax[Cfg::kWN][2];
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      float* a = acc[wm * Cfg::kWN + wn];
      float m0 = 0.f, m1 = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int i0 = 4 * j + b, i1 = 4 * j + 2 + b;
          if constexpr (!kLateWeights) {
            a[i0] = mm_swiglu(a[i0], a[i0 + 32], q.has_clamp, q.clamp);
            a[i1] = mm_swiglu(a[i1], a[i1 + 32], q.has_clamp, q.clamp);
          }
          a[i0] *= w0;
          a[i1] *= w1;
          m0 = fmaxf(m0, fabsf(a[i0]));
          m1 = fmaxf(m1, fabsf(a[i1]));
        }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
      }
      amax[wn][0] = m0;
      amax[wn][1] = m1;
    }
    if (pair_in_wg) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m = fmaxf(amax[0][h], amax[Cfg::kWN - 1][h]);
        amax[0][h] = m;
        amax[Cfg::kWN - 1][h] = m;
      }
    }
    if constexpr (kCanPairAcross) {
      if (pair_across) {
        /* Both warpgroups hold the same rows (column split): publish this
         * warpgroup's row amax, take the other's. The second barrier keeps
         * the next tile from overwriting values the other side still reads. */
        const int rl = r0 - mm_gemm_wg_row0<Cfg>(wg);
        if ((threadIdx.x & 3) == 0) {
          sm.xwg[wg * Cfg::BM + rl] = amax[0][0];
          sm.xwg[wg * Cfg::BM + rl + 8] = amax[0][1];
        }
        mm_gemm_math_barrier();
        amax[0][0] = fmaxf(amax[0][0], sm.xwg[(1 - wg) * Cfg::BM + rl]);
        amax[0][1] = fmaxf(amax[0][1], sm.xwg[(1 - wg) * Cfg::BM + rl + 8]);
        mm_gemm_math_barrier();
      }
    }
    if (mm_gemm_wg_row0<Cfg>(wg) + 64 * wm >= ti.rows) continue; /* nothing to store */
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      const float* a = acc[wm * Cfg::kWN + wn];
      const float sf0 = mm_group_scale(amax[wn][0]);
      const float sf1 = mm_group_scale(amax[wn][1]);
      const float rcp0 = __frcp_rn(sf0), rcp1 = __frcp_rn(sf1);
      const int acol0 = (ti.n0 + mm_gemm_wg_col0<Cfg>(wg) + 128 * wn) / 2; /* first a-column of the wave */
      if (staged) {
        /* Tile row r0 (and r0 + 8), byte column c of the tile's 128-byte
         * output row: the 16-byte chunks XOR-permuted by row % 8, as the
         * store's 128-byte swizzle reads them. The 8 rows of one store
         * instruction land in 8 different chunks: no bank conflict. */
        const uint32_t c0 = (uint32_t)((mm_gemm_wg_col0<Cfg>(wg) + 128 * wn) / 2 + 2 * (threadIdx.x & 3));
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t c = c0 + 8u * (uint32_t)j;
          mm_st_shared_u16(sm.d + mm_swz128((uint32_t)r0, c), mm_quant_e4m3x2(a[4 * j], a[4 * j + 1], sf0, rcp0));
          mm_st_shared_u16(sm.d + mm_swz128((uint32_t)r0 + 8u, c),
                           mm_quant_e4m3x2(a[4 * j + 2], a[4 * j + 3], sf1, rcp1));
        }
      } else {
        const int acol = acol0 + 2 * (threadIdx.x & 3);
        uint16_t* o0 = reinterpret_cast<uint16_t*>(q.out + grow * inter + acol);
        uint16_t* o1 = reinterpret_cast<uint16_t*>(q.out + (grow + 8) * inter + acol);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (ok0) o0[4 * j] = mm_quant_e4m3x2(a[4 * j], a[4 * j + 1], sf0, rcp0);
          if (ok1) o1[4 * j] = mm_quant_e4m3x2(a[4 * j + 2], a[4 * j + 3], sf1, rcp1);
        }
      }
      /* One scale per group: the group's first wave writes it. */
      const bool writes_sf = acol0 % q.group == 0;
      if ((threadIdx.x & 3) == 0 && writes_sf) {
        const int64_t gi = acol0 / q.group;
        if (ok0) q.out_sf[gi * p.rows_cap + grow] = sf0;
        if (ok1) q.out_sf[gi * p.rows_cap + grow + 8] = sf1;
      }
    }
  }
  if (staged) {
    mm_fence_proxy_async_smem(); /* the TMA store reads what the generic stores wrote */
    mm_gemm_math_barrier();
    if (threadIdx.x == 0) {
      mm_tma_store_2d(tm_out, sm.d, ti.n0 / 2, ti.out_row0);
      mm_bulk_commit_group();
    }
  }
}

#endif
