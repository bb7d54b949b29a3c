/* The two kernels of the split arm (split.h) and their launch. */
#ifndef MEGAMOE_SPLIT_KERNELS_CUH
#define MEGAMOE_SPLIT_KERNELS_CUH

#include <cuda.h>

#include "comm/barrier.cuh"
#include "comm/forward.cuh"
#include "comm/grid.cuh"
#include "comm/wait.cuh"
#include "gemm/gemm_dynamic.cuh"
#include "gemm/gemm_kernel.cuh"
#include "route/route.cuh"
#include "route/route_phases.cuh"
#include "split/split.h"
#include "timeline.cuh"
#include "view.cuh"

#ifndef MM_SPLIT_PULL_FIRST
#define MM_SPLIT_PULL_FIRST 0
#endif

/* Warps of the producer warpgroup that pull rows (warp 8 issues the TMA loads). */
#define MM_SPLIT_PULL_WARP0 MM_GEMM_AUX_WARP0
#define MM_SPLIT_PULL_WARPS 3

/* Phases A-C of kernel 1 (route/route_phases.cuh): the split arm zeroes
 * its rows-ready counters in phase A and lays the pool out in L.pool_rows. */
MM_DEVICE bool mm_split_route(const mm_layer_view& L, const mm_forward_view& F, int* scratch) {
  mm_route_hooks h;
  h.clear = mm_ws<int32_t>(L, MM_WS_READY);
  h.clear_count = L.pool_rows / MM_READY_BLOCK_ROWS;
  h.capacity = L.pool_rows;
  h.capacity_site = MM_SITE_POOL;
  h.has_call = 0;
  h.call = mm_call_tokens{0, 0};
  /* Both GEMMs' tile counters, zeroed in phase A (before its grid
   * barrier): the L1 GEMM claims after the routing's last grid barrier
   * (the third, or the second in one-scan calls), the L2 GEMM in kernel 2. */
  if (blockIdx.x == 0 && threadIdx.x < MM_TILE_COUNTERS) mm_ws<int32_t>(L, MM_WS_TILE_COUNTERS)[threadIdx.x] = 0;
  return mm_route_phases(L, F, h, scratch);
}

/* Kernel 1: routing, then the L1 GEMM while the pull runs (split.h). */
template <class Cfg>
__global__ void __launch_bounds__(MM_GEMM_THREADS, 1)
    mm_split_l1_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                       const __grid_constant__ CUtensorMap tm_sfa, const __grid_constant__ CUtensorMap tm_out,
                       const mm_gemm_problem p, const mm_gemm_layout lay, const mm_layer_view L,
                       const mm_forward_view F) {
  extern __shared__ uint8_t mm_gemm_smem_raw[];
  const mm_gemm_smem sm = mm_gemm_smem_carve(mm_gemm_smem_raw, lay);
  const int tid = threadIdx.x;
  const int warp = (int)mm_warp_uniform((uint32_t)(tid >> 5)); /* the role branches below: warp-uniform */
  const int lane = tid & 31;
  mm_programmatic_launch_prologue(); /* before any global memory access (megamoe_set_programmatic_launch) */
  static_assert(Cfg::kStageA >= (64 + MM_ROUTE_KEEP_MAX) * 4, "the routing's scratch: stage 0 of A");
  if (!mm_split_route(L, F, reinterpret_cast<int*>(sm.a_ptr))) return;

  mm_sched_grouped sched;
  mm_gemm_cta_setup<Cfg>(sm, sched, p, &tm_a, &tm_b, &tm_sfa, nullptr);
  int32_t* tile_counter = mm_ws<int32_t>(L, MM_WS_TILE_COUNTERS) + 0;
  if (tid == 0) mm_tl_stamp(L, MM_TL_ROLES);

  if (warp >= 8) {
    /* setmaxnreg moves registers inside the CTA's pool (168 x 384 at launch):
     * the math warpgroups' 232 need exactly what 40 here frees; any more
     * and their setmaxnreg.inc would wait forever (no deadline there). */
    mm_setmaxnreg_dec<MM_GEMM_PRODUCER_REGS>();
    if (warp == 8) {
      if (lane == 0) {
#if MM_SPLIT_PULL_FIRST
        /* Diagnostic build only (-DMM_SPLIT_PULL_FIRST=1, e.g. make
         * BUILD=build_pf NVCC='$(CUDA_HOME)/bin/nvcc -DMM_SPLIT_PULL_FIRST=1'
         * build_pf/megamoe): no L1 tile before every row of the pool is
         * pulled, so the GEMM runs without the pull beside it. Read the L1
         * phase of MEGAMOE_TIMELINE=1 (first tile to math end), not the
         * total: this walk over every tile takes ~1 ms at 8192 tokens
         * (docs/PERF.md, "The split arm's GEMMs inside the layer"). */
        {
          typename mm_sched_grouped::iter it = sched.begin();
          mm_gemm_tile_info ti;
          for (int t = 0; t < sched.total(); ++t) {
            sched.template seek<Cfg>(it, t, ti);
            if (ti.n0 == 0 && !mm_gemm_wait_rows_ready<Cfg>(sm, p, ti)) break; /* once per m-block */
          }
        }
#endif
        mm_gemm_producer_loop_dynamic<Cfg>(sm, sched, tile_counter, &tm_a, &tm_b, &tm_sfa, p,
                                           mm_tl_slot(L, MM_TL_L1_FIRST_TILE));
        mm_tl_stamp(L, MM_TL_L1_LAST_ISSUED);
      }
    } else if (!mm_failed(mm_status(L))) {
      /* The pull: rows in pool order, interleaved over every pull warp of
       * the grid, so the first blocks (the first tiles) complete first. The
       * scheduler's arrays hold the pool layout: out_off = pool offsets,
       * valid = rows per expert. */
      const int El = L.local_experts;
      const int total = mm_ld_relaxed_gpu_s32(mm_ws<int32_t>(L, MM_WS_POOL_OFFSET) + El);
      int32_t* ready = mm_ws<int32_t>(L, MM_WS_READY);
      const int nw = gridDim.x * MM_SPLIT_PULL_WARPS;
      for (int r = blockIdx.x * MM_SPLIT_PULL_WARPS + (warp - MM_SPLIT_PULL_WARP0); r < total; r += nw) {
        const int le = mm_pool_expert_of(sched.out_off, El, r);
        if (r - sched.out_off[le] >= sched.valid[le]) continue; /* padding: never counted, never stored */
        mm_pull_row(L, r, le);
        mm_pull_publish(ready + r / MM_READY_BLOCK_ROWS, 1);
      }
      if (lane == 0) mm_tl_stamp_latest(L, MM_TL_PULL_END);
    }
  } else {
    mm_setmaxnreg_inc<MM_GEMM_MATH_REGS>();
    const int wg = warp >> 2;
    const uint64_t waited0 = mm_gemm_waited_total(); /* -DMM_GEMM_WAIT_TIMER=1 builds */
    mm_gemm_math_loop_dynamic<Cfg>(
        sm, sched, p, wg,
        [&](const mm_gemm_tile_info& ti, float (&acc)[Cfg::kWaves][64], bool) {
          const uint64_t t0 = MM_FUSED_MATH_TIMELINE && tid == 0 ? mm_tl_now(L) : 0;
          mm_gemm_epilogue_swiglu<Cfg>(sm, p, ti, wg, acc, &tm_out);
          if (MM_FUSED_MATH_TIMELINE && tid == 0) mm_tl_add(L, MM_TL_MATH_L1_EPI, mm_tl_now(L) - t0);
        },
        []() {});
    /* The tiles' TMA stores (full tiles of a kernel with the SwiGLU staging
     * area) complete, and stop reading shared memory, before the CTA ends. */
    if (Cfg::kSwStage && tid == 0) mm_bulk_wait_group<0>();
    if (tid == 0) {
      mm_tl_stamp(L, MM_TL_L1_MATH_END);
      mm_tl_clock_end(L);
      /* The data waits of thread 0's L1 mainloops (and its tile-id reads,
       * which find their id published one tile ahead). */
      if (MM_FUSED_MATH_TIMELINE) mm_tl_add(L, MM_TL_MATH_L1_DATA, mm_gemm_waited_total() - waited0);
    }
  }
}

/* Kernel 2: the L2 GEMM with the scatter epilogue, the combine barrier, the
 * reduction, the end of the forward (split.h). */
template <class Cfg>
__global__ void __launch_bounds__(MM_GEMM_THREADS, 1)
    mm_split_l2_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                       const __grid_constant__ CUtensorMap tm_sfa, const mm_gemm_problem p, const mm_gemm_layout lay,
                       const mm_layer_view L, const mm_forward_view F) {
  extern __shared__ uint8_t mm_gemm_smem_raw[];
  const mm_gemm_smem sm = mm_gemm_smem_carve(mm_gemm_smem_raw, lay);
  const int tid = threadIdx.x;
  const int warp = (int)mm_warp_uniform((uint32_t)(tid >> 5)); /* the role branches below: warp-uniform */
  const int lane = tid & 31;
  mm_programmatic_launch_prologue(); /* kernel 1 has completed from here on */
  if (tid == 0) mm_tl_stamp(L, MM_TL_K2_START); /* with programmatic launch: when kernel 1 completed */

  mm_sched_grouped sched;
  /* The claimed tile ids are read by the 8 math warps and the 3 copy warps. */
  mm_gemm_cta_setup<Cfg>(sm, sched, p, &tm_a, &tm_b, &tm_sfa, nullptr, 8 + MM_GEMM_COPY_THREADS / 32);
  int32_t* tile_counter = mm_ws<int32_t>(L, MM_WS_TILE_COUNTERS) + 1;

  if (warp >= 8) {
    /* Warp 8 loads the tiles; warps 9-11 copy each finished tile's rows to
     * their destinations (gemm_epilogue.cuh, mm_gemm_copy_loop). */
    mm_setmaxnreg_dec<MM_GEMM_PRODUCER_REGS>();
    if (warp == 8) {
      /* The register hand-off's stamps (this one, the math side's below): a
       * CTA that never leaves kernel 2 under a tool shows in the watch which
       * side of it stopped (docs/RELIABILITY.md, racecheck on split). */
      if (lane == 0) {
        mm_tl_stamp(L, MM_TL_K2_PRODUCER_REGS);
        mm_gemm_producer_loop_dynamic<Cfg>(sm, sched, tile_counter, &tm_a, &tm_b, &tm_sfa, p);
      }
    } else {
      mm_gemm_copy_next_dynamic<Cfg, mm_sched_grouped> next_tile(sm, sched, p);
      mm_gemm_copy_loop<Cfg>(sm, p, tid - 32 * MM_GEMM_AUX_WARP0, next_tile);
    }
    mm_gemm_tail_regs_producer();
  } else {
    mm_gemm_math_regs_take<MM_GEMM_MATH_REGS>();
    if (tid == 0) mm_tl_stamp(L, MM_TL_K2_MATH_REGS);
    const int wg = warp >> 2;
    const uint64_t waited0 = mm_gemm_waited_total(); /* -DMM_GEMM_WAIT_TIMER=1 builds */
    int tile_index = 0;
    mm_gemm_math_loop_dynamic<Cfg>(
        sm, sched, p, wg,
        [&](const mm_gemm_tile_info&, float (&acc)[Cfg::kWaves][64], bool) {
          if (tid == 0 && tile_index == 0) mm_tl_stamp(L, MM_TL_K2_FIRST_MAIN);
          const uint64_t t0 = MM_FUSED_MATH_TIMELINE && tid == 0 ? mm_tl_now(L) : 0;
          mm_gemm_epilogue_stage_for_copy<Cfg>(sm, p, tile_index++, wg, acc);
          if (MM_FUSED_MATH_TIMELINE && tid == 0) mm_tl_add(L, MM_TL_MATH_L2_EPI, mm_tl_now(L) - t0);
        },
        []() {});
    if (tid == 0) {
      mm_tl_stamp(L, MM_TL_L2_MATH_END);
      if (MM_FUSED_MATH_TIMELINE) mm_tl_add(L, MM_TL_MATH_L2_DATA, mm_gemm_waited_total() - waited0);
    }
    mm_gemm_tail_regs_math();
  }

  /* Barrier 1 and the reduction (route/route_phases.cuh). */
  mm_persistent_combine_tail(L, F, warp, MM_GEMM_THREADS / 32);
}

#endif
