/* The GEMM engine's mainloop: the shared-memory pipeline, the producer's K
 * loop (TMA loads, after the rows-ready wait) and the math warpgroups' K loop
 * (wgmma chains and the per-block promotion).
 *
 * ---- Numerics ------------------------------------------------------------------
 * Every 128-wide K block (64-wide half when a_sf_block = 64: a "promotion
 * block") goes into a fresh wgmma accumulator `part` (the tensor cores' fp32
 * accumulation over that block), then acc = fma(part, sa[row] * sb[col], acc),
 * promotion blocks in K order: the contract's h = sum_kb sa * sb * S_kb. Every
 * tile uses the same m64n128k32 chains and the same promotion order, so the
 * result is bitwise the same whatever the tile.
 *
 * ---- Barrier protocol ----------------------------------------------------------
 * A ring of `stages` stages; (stage, phase) advance together in producer and
 * consumers (mm_gemm_pipe), which walk the same tile sequence, K block by K
 * block, across tiles.
 *   full[s]:  count 1. The producer thread waits empty[s] (parity phase ^ 1),
 *             arrives with expect_tx(kTxBytes), then issues the A, B and A-scale
 *             TMA loads of the K block, which complete the transaction bytes.
 *   empty[s]: count 8 (lane 0 of each math warp). A math warp reads its A
 *             scales from the stage, waits for its last wgmma chain reading the
 *             stage (wgmma.wait_group), then arrives; before its promotion, so
 *             the producer refills the stage as early as possible.
 * No generic-proxy writes to the stages exist, so no proxy fence is needed.
 *
 * ---- Leaving early ---------------------------------------------------------------
 * Every wait is bounded by the problem's deadline. A role that gives up (a
 * rows-ready or pipeline wait past the deadline: MEGAMOE_ERR_TIMEOUT recorded
 * in the status record; or an error already recorded by another kernel or
 * rank) sets the CTA's abort word; the other roles, spinning on a stage that
 * will never fill, see it and stop waiting. Stages already issued are
 * consumed normally first (their TMA loads complete), so no copy is in flight
 * into the shared memory of a CTA that exits.
 *
 * A math warpgroup never leaves its K loop early: the four warps of a
 * warpgroup must issue the same wgmma sequence (.sync.aligned), and a path
 * that leaves with a wgmma in flight makes ptxas serialize every wgmma of the
 * kernel (C7514). So a failed wait only marks the tile: the loop runs on
 * (every later wait fails at once on the abort word, the chains multiply
 * stale shared memory, harmlessly), and the kernel decides with one vote over
 * the 256 math threads (mm_gemm_math_vote_ok) whether to store the tile or
 * leave. */
#ifndef MEGAMOE_GEMM_MAINLOOP_CUH
#define MEGAMOE_GEMM_MAINLOOP_CUH

#include <cuda.h>

#include "comm/wait.cuh"
#include "common.cuh"
#include "gemm/gemm_cfg.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "sched/sched_grouped.cuh"

#define MM_GEMM_BAR_VOTE 2 /* named barrier of the math threads' per-tile vote */
#define MM_GEMM_BAR_REGS 5 /* named barrier of the tail's register hand-back (all MM_GEMM_THREADS) */

/* The math warpgroups take their registers at the roles' start. Test builds
 * only (-DMM_TEST_MATH_REGS_LATE_NS=N): they wait N ns first, so that every
 * CTA without a tile ends its producer roles before they ask: the order the
 * tail's barrier must survive, made certain (scripts/plants/tail_regs.sed
 * removes the barrier; the forward then never ends). */
#ifndef MM_TEST_MATH_REGS_LATE_NS
#define MM_TEST_MATH_REGS_LATE_NS 0
#endif
template <uint32_t kRegs>
MM_DEVICE void mm_gemm_math_regs_take() {
#if MM_TEST_MATH_REGS_LATE_NS > 0
  const uint64_t t0 = mm_globaltimer_ns();
  while (mm_globaltimer_ns() - t0 < (uint64_t)MM_TEST_MATH_REGS_LATE_NS) {
  }
#endif
  mm_setmaxnreg_inc<kRegs>();
}

/* The hand-back of the registers for a tail the whole CTA runs (the
 * persistent arms' combine): the math warpgroups give up theirs, then the
 * producer warpgroup takes its own back. The barrier orders the two: a
 * producer warpgroup whose roles end before the math warpgroups' setmaxnreg.inc
 * (a CTA with no tile to load or copy) would otherwise take back registers
 * that inc still waits for, and the math warps would wait forever (no
 * deadline there). Racecheck's slowed warps hit that race in split kernel 2,
 * which had no barrier (docs/RELIABILITY.md, racecheck on split). It also
 * saves the issue slots a retried setmaxnreg.inc takes (18 % of the fused
 * kernel's instructions once). */
MM_DEVICE void mm_gemm_tail_regs_math() {
  mm_setmaxnreg_dec<MM_GEMM_TAIL_REGS>();
  mm_named_barrier_arrive(MM_GEMM_BAR_REGS, MM_GEMM_THREADS); /* the registers are free */
}
MM_DEVICE void mm_gemm_tail_regs_producer() {
  __syncwarp(); /* converged first: warp 8's lane 0 ran the producer alone */
  mm_named_barrier_sync(MM_GEMM_BAR_REGS, MM_GEMM_THREADS);
  mm_setmaxnreg_inc<MM_GEMM_TAIL_REGS>();
}

/* Pipeline position, identical in producer and consumers. */
struct mm_gemm_pipe {
  uint32_t stage;
  uint32_t phase;
};

MM_DEVICE void mm_gemm_pipe_advance(mm_gemm_pipe& p, uint32_t stages) {
  if (++p.stage == stages) {
    p.stage = 0;
    p.phase ^= 1u;
  }
}

/* One decision for all 256 math threads: true when every thread's tile went
 * through and no role has given up (bar.red.or over the math threads: the
 * result is the same in every thread, so later named barriers stay matched). */
MM_DEVICE bool mm_gemm_math_vote_ok(const mm_gemm_smem& sm, bool mine_ok) {
  const bool bad = mm_named_barrier_or(MM_GEMM_BAR_VOTE, MM_GEMM_MATH_THREADS, !mine_ok || *sm.abort != 0);
  return !bad;
}

/* Diagnostic builds only (-DMM_GEMM_WAIT_TIMER=1): the ns each thread of
 * the first MM_TL_MAX_CTAS CTAs spent in mm_gemm_wait calls that had to wait
 * (its own slot: no race), read by a role's timeline (the math parts of the
 * persistent arms: how much of a mainloop was waiting for its stages' data).
 * A call has to wait when a non-suspending probe finds the phase open; the
 * timer starts before the first try_wait, which may itself suspend the
 * thread (until the phase completes or a hardware time limit): before the
 * thirtieth session it started after that try, and so missed every wait
 * shorter than the suspension (the fused L1 mainloops' "0.3 us"). */
#ifndef MM_GEMM_WAIT_TIMER
#define MM_GEMM_WAIT_TIMER 0
#endif
#if MM_GEMM_WAIT_TIMER
static __device__ uint64_t mm_gemm_waited_ns[MM_TL_MAX_CTAS * MM_GEMM_THREADS];
MM_DEVICE uint64_t* mm_gemm_waited_slot() {
  return blockIdx.x < MM_TL_MAX_CTAS && threadIdx.x < MM_GEMM_THREADS
             ? &mm_gemm_waited_ns[blockIdx.x * MM_GEMM_THREADS + threadIdx.x]
             : nullptr;
}
#endif
/* The calling thread's waited ns so far (a running total across launches:
 * take differences), 0 in builds without the timer. */
MM_DEVICE uint64_t mm_gemm_waited_total() {
#if MM_GEMM_WAIT_TIMER
  if (const uint64_t* slot = mm_gemm_waited_slot()) return *slot;
#endif
  return 0;
}

/* Diagnostic builds only (-DMM_GEMM_PART_TIMER=1; docs/PERF.md, seventh
 * session): the engine kernel's tile loop by part, in clock64 cycles, per CTA
 * (the first MM_TL_MAX_CTAS) and math warpgroup, kept by the warpgroup's
 * first thread (its own slot: no race):
 *   wait      the full-barrier waits, from before the first try (a try that
 *             suspends the thread counts, as in the wait timer above);
 *   loop      from the end of one tile's epilogue (or the loop's start) to the
 *             start of the next one's: the K loop, its waits and the scheduler;
 *   epilogue  the epilogues.
 * Timing every wait perturbs the K loop (the timed kernel ran 17-23 % slower
 * in the eighth session's runs, with its counts in global or in shared
 * memory); -DMM_GEMM_PART_TIMER=2 leaves the waits untimed (wait prints 0)
 * and keeps the loop and epilogue counts, which stay trustworthy for the
 * epilogue (the build still runs ~16 % slower: the loop count is not).
 * mm_gemm_part_begin zeroes the slot at the loop's start; at the last tile of
 * launch MM_GEMM_PART_LAUNCH of the process (counted by CTA 0's producer
 * thread, mm_gemm_part_count_launch) each slot is printed as one line starting
 * "gemm-parts". The default build compiles none of this. In this build the
 * arms' kernels time their waits too and print nothing; the fused kernel then
 * spills (604 bytes): time only the engine kernel (bench-gemm) with it. */
#ifndef MM_GEMM_PART_TIMER
#define MM_GEMM_PART_TIMER 0
#endif
#if MM_GEMM_PART_TIMER
#include <cstdio>
static_assert(!MM_GEMM_WAIT_TIMER, "one diagnostic timer at a time");
#ifndef MM_GEMM_PART_LAUNCH
#define MM_GEMM_PART_LAUNCH 6 /* bench-gemm: past its warm-up calls */
#endif
struct mm_gemm_parts {
  unsigned long long wait, loop, epilogue, tiles, mark;
};
static __device__ mm_gemm_parts mm_gemm_part_acc[MM_TL_MAX_CTAS][2];
static __device__ unsigned int mm_gemm_part_launches;
MM_DEVICE mm_gemm_parts* mm_gemm_part_slot() {
  return blockIdx.x < MM_TL_MAX_CTAS && threadIdx.x < MM_GEMM_MATH_THREADS && (threadIdx.x & 127) == 0
             ? &mm_gemm_part_acc[blockIdx.x][threadIdx.x >> 7]
             : nullptr;
}
MM_DEVICE void mm_gemm_part_count_launch() {
  if (blockIdx.x == 0) atomicAdd(&mm_gemm_part_launches, 1u);
}
MM_DEVICE void mm_gemm_part_begin() {
  if (mm_gemm_parts* s = mm_gemm_part_slot()) *s = {0ull, 0ull, 0ull, 0ull, (unsigned long long)clock64()};
}
MM_DEVICE void mm_gemm_part_epilogue_start() {
  if (mm_gemm_parts* s = mm_gemm_part_slot()) {
    const unsigned long long now = clock64();
    s->loop += now - s->mark;
    s->mark = now;
  }
}
MM_DEVICE void mm_gemm_part_epilogue_end(bool last) {
  if (mm_gemm_parts* s = mm_gemm_part_slot()) {
    const unsigned long long now = clock64();
    s->epilogue += now - s->mark;
    s->mark = now;
    s->tiles++;
    if (last && *(volatile unsigned int*)&mm_gemm_part_launches == MM_GEMM_PART_LAUNCH)
      printf("gemm-parts cta %d wg %d tiles %llu loop %llu wait %llu epilogue %llu cycles\n", (int)blockIdx.x,
             (int)(threadIdx.x >> 7), s->tiles, s->loop, s->wait, s->epilogue);
  }
}
#endif

/* Waits for a pipeline barrier phase. False when another role gave up, or
 * when twice the deadline passed (recorded as MM_SITE_GEMM_PIPE; the abort
 * word is set so the other roles leave too). Twice: a stage waits at most
 * for the producer's rows-ready wait plus a TMA load, so the producer's own
 * deadline fires first and names the real cause. (The diagnostic build
 * wraps it in the timed mm_gemm_wait below.) */
#if MM_GEMM_WAIT_TIMER || MM_GEMM_PART_TIMER
#define MM_GEMM_WAIT_FN mm_gemm_wait_untimed
#else
#define MM_GEMM_WAIT_FN mm_gemm_wait
#endif
MM_DEVICE bool MM_GEMM_WAIT_FN(const mm_gemm_smem& sm, uint32_t bar, uint32_t parity, const mm_gemm_problem& p) {
  if (mm_mbar_try_wait(bar, parity)) return true;
  if (*sm.abort) return false;
  uint64_t t0 = 0;
  for (uint32_t spin = 1;; ++spin) {
    if (mm_mbar_try_wait(bar, parity)) return true;
    if ((spin & 63u) == 0) {
      if (*sm.abort) return false;
      const uint64_t now = mm_globaltimer_ns();
      if (t0 == 0) {
        t0 = now;
      } else if (now - t0 > 2 * p.timeout_ns) {
        if (p.status) mm_record_error(p.status, MEGAMOE_ERR_TIMEOUT, MM_SITE_GEMM_PIPE, -1, (int)blockIdx.x, 0, 0);
        *sm.abort = 1;
        return false;
      }
    }
  }
}
#undef MM_GEMM_WAIT_FN
#if MM_GEMM_WAIT_TIMER
MM_DEVICE bool mm_gemm_wait(const mm_gemm_smem& sm, uint32_t bar, uint32_t parity, const mm_gemm_problem& p) {
  if (mm_mbar_test_wait(bar, parity)) return true;
  const uint64_t t_wait = mm_globaltimer_ns();
  const bool got = mm_gemm_wait_untimed(sm, bar, parity, p);
  if (uint64_t* slot = mm_gemm_waited_slot()) *slot += mm_globaltimer_ns() - t_wait;
  return got;
}
#endif
#if MM_GEMM_PART_TIMER
MM_DEVICE bool mm_gemm_wait(const mm_gemm_smem& sm, uint32_t bar, uint32_t parity, const mm_gemm_problem& p) {
  if (MM_GEMM_PART_TIMER >= 2) return mm_gemm_wait_untimed(sm, bar, parity, p); /* parts only, waits untimed */
  mm_gemm_parts* slot = mm_gemm_part_slot();
  const unsigned long long t0 = clock64();
  const bool got = mm_gemm_wait_untimed(sm, bar, parity, p);
  if (slot) slot->wait += clock64() - t0;
  return got;
}
#endif

/* Producer: waits (acquire, the problem's deadline, site GEMM_ROWS_READY)
 * until *counter >= target; gives up on the abort word or an error of this
 * forward, and then sets the abort word. detail: the counter's index, for
 * the message. The caller runs the async-proxy fence before its TMA loads. */
MM_DEVICE bool mm_gemm_wait_counter(const mm_gemm_smem& sm, const mm_gemm_problem& p, const int32_t* counter,
                                    int32_t target, int detail) {
  mm_wait_ctx ctx;
  ctx.status = p.status;
  ctx.timeout_ns = p.timeout_ns;
  ctx.site = MM_SITE_GEMM_ROWS_READY;
  ctx.abort_flag = sm.abort;
  if (mm_wait_counter_geq<false>(counter, target, ctx, detail)) return true;
  *sm.abort = 1;
  return false;
}

/* Producer: waits until every rows-ready block the tile's A rows touch holds
 * its target, then orders those rows (written through the generic proxy)
 * before the TMA loads. */
template <class Cfg>
MM_DEVICE bool mm_gemm_wait_rows_ready(const mm_gemm_smem& sm, const mm_gemm_problem& p,
                                       const mm_gemm_tile_info& ti) {
  if (!p.ready.counters) return true;
  const int b0 = ti.a_row0 / MM_READY_BLOCK_ROWS;
  const int b1 = (ti.a_row0 + ti.rows - 1) / MM_READY_BLOCK_ROWS;
  for (int b = b0; b <= b1; ++b) {
    const int rows_in_block = min(MM_READY_BLOCK_ROWS, ti.expert_rows - (b * MM_READY_BLOCK_ROWS - ti.expert_a_row0));
    const int target = p.ready.base + p.ready.per_row * rows_in_block;
    if (!mm_gemm_wait_counter(sm, p, p.ready.counters + b, target, b)) return false;
  }
  mm_fence_proxy_async_global();
  return true;
}

/* The TMA loads of K block kb of a tile into stage s, completing on `full`.
 * A in one box of BM rows at a_row0, or (Cfg::kABoxRows < BM) in two boxes
 * of kABoxRows rows at a_row0 and a_row1: the same shared-memory image (the
 * 128-byte swizzle repeats every 8 rows, and the second box starts on a
 * 1024-byte boundary), with the A scales [kPromo][BM] loaded per (box,
 * promotion block): the tensor map's box is then (kABoxRows, 1)
 * (mm_gemm_plan_a_boxes). */
template <class Cfg>
MM_DEVICE void mm_gemm_load_stage(const mm_gemm_smem& sm, uint32_t s, uint32_t full, const CUtensorMap* tm_a,
                                  const CUtensorMap* tm_b, const CUtensorMap* tm_sfa, const mm_gemm_tile_info& ti,
                                  int kb, int b_row) {
  if constexpr (Cfg::kABoxRows == Cfg::BM) {
    mm_tma_load_2d(sm.a + s * Cfg::kStrideA, tm_a, full, kb * MM_GEMM_BLOCK_K, ti.a_row0);
    mm_tma_load_2d(sm.b + s * Cfg::kStrideB, tm_b, full, kb * MM_GEMM_BLOCK_K, b_row);
    mm_tma_load_2d(sm.sf + s * Cfg::kStrideSF, tm_sfa, full, ti.a_row0, kb * Cfg::kPromo);
  } else {
    static_assert(Cfg::BM == 2 * Cfg::kABoxRows && (Cfg::kABoxRows * 128) % 1024 == 0, "A in two boxes");
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = j ? ti.a_row1 : ti.a_row0;
      mm_tma_load_2d(sm.a + s * Cfg::kStrideA + (uint32_t)(j * Cfg::kABoxRows * 128), tm_a, full,
                     kb * MM_GEMM_BLOCK_K, row);
#pragma unroll
      for (int h = 0; h < Cfg::kPromo; ++h)
        mm_tma_load_2d(sm.sf + s * Cfg::kStrideSF + (uint32_t)((h * Cfg::BM + j * Cfg::kABoxRows) * 4), tm_sfa, full,
                       row, kb * Cfg::kPromo + h);
    }
    mm_tma_load_2d(sm.b + s * Cfg::kStrideB, tm_b, full, kb * MM_GEMM_BLOCK_K, b_row);
  }
}

/* Producer thread: the K loop of one tile whose A rows are ready. tm_b rows
 * are expert-major (row = e * n + column). False when it gave up (the abort
 * word is set). */
template <class Cfg>
MM_DEVICE bool mm_gemm_produce_tile_loads(const mm_gemm_smem& sm, mm_gemm_pipe& pipe, const CUtensorMap* tm_a,
                                          const CUtensorMap* tm_b, const CUtensorMap* tm_sfa,
                                          const mm_gemm_problem& p, const mm_gemm_tile_info& ti) {
  const int kblocks = p.k / MM_GEMM_BLOCK_K;
  const int b_row = ti.expert * p.n + ti.n0;
  for (int kb = 0; kb < kblocks; ++kb) {
    const uint32_t s = pipe.stage;
    if (!mm_gemm_wait(sm, sm.empty + 8 * s, pipe.phase ^ 1u, p)) return false;
    const uint32_t full = sm.full + 8 * s;
    mm_mbar_arrive_expect_tx(full, Cfg::kTxBytes);
    mm_gemm_load_stage<Cfg>(sm, s, full, tm_a, tm_b, tm_sfa, ti, kb, b_row);
    mm_gemm_pipe_advance(pipe, sm.stages);
  }
  return true;
}

/* Producer thread: one tile, after the problem's rows-ready wait. */
template <class Cfg>
MM_DEVICE bool mm_gemm_produce_tile(const mm_gemm_smem& sm, mm_gemm_pipe& pipe, const CUtensorMap* tm_a,
                                    const CUtensorMap* tm_b, const CUtensorMap* tm_sfa, const mm_gemm_problem& p,
                                    const mm_gemm_tile_info& ti) {
  if (!mm_gemm_wait_rows_ready<Cfg>(sm, p, ti)) return false;
  return mm_gemm_produce_tile_loads<Cfg>(sm, pipe, tm_a, tm_b, tm_sfa, p, ti);
}

/* Rows / columns of math warpgroup wg (0, 1) inside the tile. */
template <class Cfg>
MM_DEVICE int mm_gemm_wg_row0(int wg) {
  return Cfg::kSplitN ? 0 : wg * Cfg::kWgRows;
}
template <class Cfg>
MM_DEVICE int mm_gemm_wg_col0(int wg) {
  return Cfg::kSplitN ? wg * Cfg::kWgCols : 0;
}

/* Fragment coordinates of the calling thread for wave (wm, wn): tile-local
 * row of registers with (i >> 1) & 1 == 0 (the others are 8 rows below), and
 * tile-local column of register 0 (register i adds 8 * (i >> 2) + (i & 1)). */
template <class Cfg>
MM_DEVICE int mm_gemm_frag_row(int wg, int wm) {
  return mm_gemm_wg_row0<Cfg>(wg) + 64 * wm + ((threadIdx.x >> 5) & 3) * 16 + ((threadIdx.x & 31) >> 2);
}
template <class Cfg>
MM_DEVICE int mm_gemm_frag_col(int wg, int wn) {
  return mm_gemm_wg_col0<Cfg>(wg) + 128 * wn + 2 * (threadIdx.x & 3);
}

/* One wgmma chain into part: slice kk's low descriptor words from
 * slice(kk, a_lo, b_lo), accumulate = 0 on the first slice; the fences order
 * part's registers around the asynchronous wgmmas. */
template <class Cfg, class Slice>
MM_DEVICE void mm_gemm_issue_slices(float (&part)[64], Slice&& slice) {
#pragma unroll
  for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
  mm_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kK32PerPromo; ++kk) {
    uint32_t a_lo, b_lo;
    slice(kk, a_lo, b_lo);
    mm_wgmma_m64n128k32_e4m3(part, mm_wgmma_desc(a_lo), mm_wgmma_desc(b_lo), kk > 0 ? 1u : 0u);
  }
  mm_wgmma_commit();
#pragma unroll
  for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
}

/* Issues one wgmma chain: the k32 slices of promotion block h of stage s for
 * wave (wm, wn) into part (accumulate = 0 on the first slice). */
template <class Cfg>
MM_DEVICE void mm_gemm_issue_chain(const mm_gemm_smem& sm, uint32_t s, int h, int row_w, int col_w, int wm, int wn,
                                   float (&part)[64]) {
  const uint32_t a_lo0 = mm_wgmma_desc_sw128_lo(sm.a);
  const uint32_t b_lo0 = mm_wgmma_desc_sw128_lo(sm.b);
  mm_gemm_issue_slices<Cfg>(part, [&](int kk, uint32_t& a_lo, uint32_t& b_lo) {
    const int k32 = h * Cfg::kK32PerPromo + kk;
    a_lo = a_lo0 + ((s * Cfg::kStrideA + (uint32_t)(row_w + 64 * wm) * 128u + 32u * k32) >> 4);
    b_lo = b_lo0 + ((s * Cfg::kStrideB + (uint32_t)(col_w + 128 * wn) * 128u + 32u * k32) >> 4);
  });
}

/* The same chain from descriptors computed ahead: a_lo / b_lo are the low
 * descriptor words of the chain's first k32 slice (the wave's rows in the
 * stage, promotion block h); each further slice is 32 bytes on, +2 in the
 * 16-byte start field. mm_gemm_consume_tile_1p computes the tile's per-wave
 * bases once per tile and adds the stage's offset per chain from a
 * warp-uniform stage index, so ptxas builds the slices' descriptors with
 * uniform instructions between the QGMMAs, in the running chain's shadow.
 * Rebuilt per slice from a regular stage index (mm_gemm_issue_chain), the
 * descriptors took 32 R2UR moves per K block, and in the fused kernel ptxas
 * built all four of a chain's before its first QGMMA, on each warpgroup's
 * serial path (docs/PERF.md, thirty-third and thirty-fourth sessions: split
 * -2.6 to -2.9 %, fused -1.0 to -5.0 % at 2048-8192 tokens). */
template <class Cfg>
MM_DEVICE void mm_gemm_issue_chain_at(uint32_t a_lo, uint32_t b_lo, float (&part)[64]) {
  mm_gemm_issue_slices<Cfg>(part, [&](int kk, uint32_t& a, uint32_t& b) {
    a = a_lo + 2u * kk;
    b = b_lo + 2u * kk;
  });
}

/* acc += part * (sa[row] * sb[col]): registers i < 32 are the wave's first 64
 * columns (sb0), i >= 32 the next 64 (sb1); rows with (i >> 1) & 1 are 8 below
 * (sa1). */
MM_DEVICE void mm_gemm_promote(float (&acc)[64], const float (&part)[64], float sa0, float sa1, float sb0,
                               float sb1) {
  const float s00 = sa0 * sb0, s01 = sa0 * sb1, s10 = sa1 * sb0, s11 = sa1 * sb1;
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const bool hi_col = i >= 32, hi_row = (i >> 1) & 1;
    const float sc = hi_row ? (hi_col ? s11 : s10) : (hi_col ? s01 : s00);
    acc[i] = fmaf(part[i], sc, acc[i]);
  }
}

/* B-scale rows of the waves of a tile: b_sf [E][n / bsn][k / 128] rows for the
 * first and second 64 columns of each 128-wide wave. */
template <class Cfg>
MM_DEVICE void mm_gemm_sfb_rows(const mm_gemm_problem& p, const mm_gemm_tile_info& ti, int col_w,
                                const float* (&sfb)[Cfg::kWN][2]) {
  const int kblocks = p.k / MM_GEMM_BLOCK_K;
  const int bsn = p.b_sf_block_n;
  const float* sfb_e = p.b_sf + (int64_t)ti.expert * (p.n / bsn) * kblocks;
#pragma unroll
  for (int wn = 0; wn < Cfg::kWN; ++wn)
#pragma unroll
    for (int h = 0; h < 2; ++h) sfb[wn][h] = sfb_e + (int64_t)((ti.n0 + col_w + 128 * wn + 64 * h) / bsn) * kblocks;
}

/* The B scales of wave column wn for K block kb, its two 64-column halves.
 * With Cfg::kBScale128 both halves are one scale: one load, and the second
 * row pointer is never read (so not kept live across the K loop). */
template <class Cfg>
MM_DEVICE void mm_gemm_sb_load(const float* const (&sfb)[2], int kb, float (&sb)[2]) {
  sb[0] = __ldg(sfb[0] + kb);
  sb[1] = Cfg::kBScale128 ? sb[0] : __ldg(sfb[1] + kb);
}

/* Math warpgroup, one partial accumulator: per K block and wave, issue the
 * chain, wait for it, promote. acc[w] (w = wm * kWN + wn) is the promoted
 * fp32 result of wave (wm, wn) in the m64n128 fragment layout. Every thread
 * of the warpgroup calls it. False when the pipeline was abandoned.
 *
 * kEarlyProbe: the next K block's stage is probed while the block's last
 * chain is on the tensor cores (a non-suspending test_wait before that
 * chain's wait_group 0); only when it answered "not yet" does the next block
 * start with the full wait. So in the common case no barrier wait sits
 * between the last promotion and the next block's first issue, the
 * warpgroup's critical path while the other warpgroup's chain keeps the
 * tensor cores busy (`bench-gemm --mainloop`, "1p early", which waits there
 * in full instead of probing: 82.2 -> 84.0 % of the tensor bound). A
 * warpgroup whose last wave is past the expert's rows probes after its
 * chains, with nothing to overlap: correct, only not faster on those tiles.
 * K has at least one block (the config's hidden and intermediate are
 * multiples of 128). Measured per kernel (docs/PERF.md, ninth session): the
 * split arm's kernels gain (2 %), the engine's own kernel loses (128x256
 * SwiGLU 5 % slower: the try_wait it skips also hands the scheduler to the
 * other warpgroup, a nanosleep there won back 2 of the 5 %), so only the
 * persistent arms' loops ask for it: the dynamically scheduled loop (the
 * split arm) and the fused kernel (-7 % at 8192 tokens once its L1 codes
 * went through a TMA store, tenth session). Without it the order is the
 * engine's original one. The promotions are the same FMAs in
 * the same order either way. */
template <class Cfg, bool kEarlyProbe = false>
MM_DEVICE bool mm_gemm_consume_tile_1p(const mm_gemm_smem& sm, mm_gemm_pipe& pipe, const mm_gemm_problem& p,
                                       const mm_gemm_tile_info& ti, int wg, float (&acc)[Cfg::kWaves][64]) {
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
  const int kblocks = p.k / MM_GEMM_BLOCK_K;
  const int row_w = mm_gemm_wg_row0<Cfg>(wg);
  const int col_w = mm_gemm_wg_col0<Cfg>(wg);
  const int r_in = warp * 16 + (lane >> 2); /* fragment row of registers i with (i >> 1) & 1 == 0 */

  bool wave_ok[Cfg::kWM];
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) wave_ok[wm] = row_w + 64 * wm < ti.rows;
#pragma unroll
  for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[w][i] = 0.f;

  const float* sfb[Cfg::kWN][2];
  mm_gemm_sfb_rows<Cfg>(p, ti, col_w, sfb);
  float sb_next[Cfg::kWN][2];
#pragma unroll
  for (int wn = 0; wn < Cfg::kWN; ++wn) mm_gemm_sb_load<Cfg>(sfb[wn], 0, sb_next[wn]);

  /* Low descriptor words of each wave's first k32 slice in stage 0: the
   * terms of mm_gemm_issue_chain's address are multiples of 16 bytes, so
   * its shifted sum is the sum of the shifted terms (the same descriptors). */
  uint32_t a_lo_w[Cfg::kWM], b_lo_w[Cfg::kWN];
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) a_lo_w[wm] = mm_wgmma_desc_sw128_lo(sm.a) + (uint32_t)(row_w + 64 * wm) * 8u;
#pragma unroll
  for (int wn = 0; wn < Cfg::kWN; ++wn) b_lo_w[wn] = mm_wgmma_desc_sw128_lo(sm.b) + (uint32_t)(col_w + 128 * wn) * 8u;
  static_assert(Cfg::kStrideA % 16 == 0 && Cfg::kStrideB % 16 == 0, "stage strides in 16-byte units");
  bool stage_ready = false; /* kEarlyProbe: the probe found the pipe's current stage full */
  /* K block kb, in the pipe's current stage; with kProbe (kEarlyProbe, not
   * the tile's last block), block kb + 1's stage is probed while kb's last
   * chain runs. The pipe advances at the block's end. */
  auto block = [&](int kb, auto probe_tag, uint32_t s) {
    constexpr bool kProbe = decltype(probe_tag)::value;
    /* B scales: this block's, and the next block's load in flight. */
    float sb[Cfg::kWN][2];
    const int kn = kb + 1 < kblocks ? kb + 1 : kb;
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      sb[wn][0] = sb_next[wn][0];
      sb[wn][1] = sb_next[wn][1];
      mm_gemm_sb_load<Cfg>(sfb[wn], kn, sb_next[wn]);
    }
    /* A wait that gives up leaves the abort word set, which the return
     * value reads (and every caller's vote): a flag of its own here, kept
     * through the K loop, was spilled by ptxas to the stack in the fused
     * kernel and reloaded every K block (from L2 after an L1 invalidation;
     * removed in the thirtieth session, fused -1 % at 8192 tokens). */
    if (!stage_ready) (void)mm_gemm_wait(sm, sm.full + 8 * s, pipe.phase, p);
    stage_ready = false;

    /* A scales of this warp's rows, read before the stage is released. */
    float sa[Cfg::kPromo][Cfg::kWM][2];
    const float* sf_stage = sm.sf_ptr + s * (Cfg::kStrideSF / 4);
#pragma unroll
    for (int h = 0; h < Cfg::kPromo; ++h)
#pragma unroll
      for (int wm = 0; wm < Cfg::kWM; ++wm) {
        const int r = row_w + 64 * wm + r_in;
        sa[h][wm][0] = wave_ok[wm] ? sf_stage[h * Cfg::BM + r] : 0.f;
        sa[h][wm][1] = wave_ok[wm] ? sf_stage[h * Cfg::BM + r + 8] : 0.f;
      }

    /* The pipe advances once per block in straight-line code, outside the
     * per-wave branches (which ptxas cannot prove uniform), so the per-wave
     * paths carry no stage update (a shorter loop). The probe, where it
     * runs, tests the next block's stage. */
    mm_gemm_pipe next = pipe;
    mm_gemm_pipe_advance(next, sm.stages);
    auto probe_next = [&]() {
      if (kProbe) stage_ready = mm_mbar_test_wait(sm.full + 8 * next.stage, next.phase) != 0;
    };
#pragma unroll
    for (int h = 0; h < Cfg::kPromo; ++h)
#pragma unroll
      for (int wm = 0; wm < Cfg::kWM; ++wm)
#pragma unroll
        for (int wn = 0; wn < Cfg::kWN; ++wn) {
          const bool last = h == Cfg::kPromo - 1 && wm == Cfg::kWM - 1 && wn == Cfg::kWN - 1;
          if (wave_ok[wm]) {
            float part[64];
            const uint32_t k_lo = 2u * (uint32_t)(h * Cfg::kK32PerPromo);
            mm_gemm_issue_chain_at<Cfg>(a_lo_w[wm] + s * (Cfg::kStrideA >> 4) + k_lo,
                                        b_lo_w[wn] + s * (Cfg::kStrideB >> 4) + k_lo, part);
            if (kProbe && last) probe_next();
            mm_wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
            /* The stage's last chain of this warp has completed. */
            if (last && lane == 0) mm_mbar_arrive(sm.empty + 8 * s);
            mm_gemm_promote(acc[wm * Cfg::kWN + wn], part, sa[h][wm][0], sa[h][wm][1], sb[wn][0], sb[wn][1]);
          } else if (last) {
            if (kProbe) probe_next();
            if (lane == 0) mm_mbar_arrive(sm.empty + 8 * s); /* a wave past the expert's rows: nothing to read */
          }
        }
    pipe = next;
  };

  /* The stage is the same in every lane; said so, it keeps the descriptors uniform. */
  auto stage = [&]() { return mm_warp_uniform(pipe.stage); };
  if constexpr (kEarlyProbe) {
    for (int kb = 0; kb + 1 < kblocks; ++kb) block(kb, mm_bool_tag<true>(), stage());
    block(kblocks - 1, mm_bool_tag<false>(), stage());
  } else {
    for (int kb = 0; kb < kblocks; ++kb) block(kb, mm_bool_tag<false>(), stage());
  }
  return *sm.abort == 0;
}

/* Math warpgroup, two partial accumulators (one wave per warpgroup). Units
 * u = 0 .. kblocks * kPromo - 1 are the promotion blocks in K order; unit u
 * goes into part[u & 1]. Unit u + 1 is issued before unit u is waited for and
 * promoted, so the tensor cores work on it during the promotion:
 *
 *   issue(0)
 *   for u: issue(u + 1) if any; wait until <= 1 group pending (unit u done);
 *          release u's stage if u is its last unit; promote u
 *
 * A unit's scales travel with it (sa read from the stage at issue, sb loaded
 * from global at issue and used at promotion, hundreds of cycles later). */
template <class Cfg>
MM_DEVICE bool mm_gemm_consume_tile_2p(const mm_gemm_smem& sm, mm_gemm_pipe& pipe, const mm_gemm_problem& p,
                                       const mm_gemm_tile_info& ti, int wg, float (&acc)[1][64]) {
  static_assert(Cfg::kTwoParts && Cfg::kWaves == 1, "two-part mainloop: one wave per warpgroup");
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
  const int units = (p.k / MM_GEMM_BLOCK_K) * Cfg::kPromo;
  const int row_w = mm_gemm_wg_row0<Cfg>(wg);
  const int col_w = mm_gemm_wg_col0<Cfg>(wg);
  const int r = row_w + warp * 16 + (lane >> 2);
  const bool wave_ok = row_w < ti.rows;

#pragma unroll
  for (int i = 0; i < 64; ++i) acc[0][i] = 0.f;
  const float* sfb[1][2];
  mm_gemm_sfb_rows<Cfg>(p, ti, col_w, sfb);

  /* A wave past the expert's rows (only the second warpgroup of a row-split
   * tile with <= 64 rows): walk the stages and release them. */
  if (!wave_ok) {
    bool ok = true;
    for (int kb = 0; kb < units / Cfg::kPromo; ++kb) {
      if (!mm_gemm_wait(sm, sm.full + 8 * pipe.stage, pipe.phase, p)) ok = false;
      if (lane == 0) mm_mbar_arrive(sm.empty + 8 * pipe.stage);
      mm_gemm_pipe_advance(pipe, sm.stages);
    }
    return ok;
  }

  bool ok = true;
  float part0[64], part1[64];
  float sa0[2], sa1[2], sb0[2], sb1[2]; /* scales of the unit in part0 / part1 */
  uint32_t st0 = 0, st1 = 0;            /* stage of the unit in part0 / part1 */

  /* Issues unit u into part (stage, scales); on the stage's first unit waits
   * for it to fill; on its last unit advances the pipe. */
#define MM_GEMM_ISSUE(u, part, st, sa, sb)                                                      \
  do {                                                                                          \
    const int h_ = Cfg::kPromo == 1 ? 0 : ((u) & 1);                                            \
    const int kb_ = (u) / Cfg::kPromo;                                                          \
    if (h_ == 0 && !mm_gemm_wait(sm, sm.full + 8 * pipe.stage, pipe.phase, p)) ok = false;       \
    st = pipe.stage;                                                                            \
    const float* sf_ = sm.sf_ptr + st * (Cfg::kStrideSF / 4) + h_ * Cfg::BM;                    \
    sa[0] = sf_[r];                                                                             \
    sa[1] = sf_[r + 8];                                                                         \
    mm_gemm_sb_load<Cfg>(sfb[0], kb_, sb);                                                      \
    mm_gemm_issue_chain<Cfg>(sm, st, h_, row_w, col_w, 0, 0, part);                             \
    if (h_ == Cfg::kPromo - 1) mm_gemm_pipe_advance(pipe, sm.stages);                           \
  } while (0)

  /* Unit u has completed: release its stage after its last unit, promote. */
#define MM_GEMM_FINISH(u, part, st, sa, sb)                                                     \
  do {                                                                                          \
    _Pragma("unroll") for (int i_ = 0; i_ < 64; ++i_) mm_wgmma_fence_operand(part[i_]);         \
    if ((Cfg::kPromo == 1 || ((u) & 1)) && lane == 0) mm_mbar_arrive(sm.empty + 8 * st);        \
    mm_gemm_promote(acc[0], part, sa[0], sa[1], sb[0], sb[1]);                                  \
  } while (0)

  /* Straight-line from each issue to its wait (a control-flow merge between
   * them makes ptxas serialize the wgmmas): two units per iteration while at
   * least three remain, then the one- or two-unit tail. */
  MM_GEMM_ISSUE(0, part0, st0, sa0, sb0);
  int u = 0;
  for (; u + 2 < units; u += 2) {
    MM_GEMM_ISSUE(u + 1, part1, st1, sa1, sb1);
    mm_wgmma_wait<1>();
    MM_GEMM_FINISH(u, part0, st0, sa0, sb0);
    MM_GEMM_ISSUE(u + 2, part0, st0, sa0, sb0);
    mm_wgmma_wait<1>();
    MM_GEMM_FINISH(u + 1, part1, st1, sa1, sb1);
  }
  if (u + 1 < units) {
    MM_GEMM_ISSUE(u + 1, part1, st1, sa1, sb1);
    mm_wgmma_wait<1>();
    MM_GEMM_FINISH(u, part0, st0, sa0, sb0);
    mm_wgmma_wait<0>();
    MM_GEMM_FINISH(u + 1, part1, st1, sa1, sb1);
  } else {
    mm_wgmma_wait<0>();
    MM_GEMM_FINISH(u, part0, st0, sa0, sb0);
  }
#undef MM_GEMM_ISSUE
#undef MM_GEMM_FINISH
  return ok;
}

/* Diagnostic (Cfg::kNoScale): every wave's chains accumulate straight into
 * acc over all K blocks, one wgmma group per K block, the stage of block
 * kb - 1 released once block kb's group is issued and the one before has
 * completed (wait_group 1): the per-tensor-scaled GEMM's mainloop. */
template <class Cfg>
MM_DEVICE bool mm_gemm_consume_tile_noscale(const mm_gemm_smem& sm, mm_gemm_pipe& pipe, const mm_gemm_problem& p,
                                            const mm_gemm_tile_info& ti, int wg, float (&acc)[Cfg::kWaves][64]) {
  const int lane = threadIdx.x & 31;
  const int kblocks = p.k / MM_GEMM_BLOCK_K;
  const int row_w = mm_gemm_wg_row0<Cfg>(wg);
  const int col_w = mm_gemm_wg_col0<Cfg>(wg);
  const uint32_t a_lo0 = mm_wgmma_desc_sw128_lo(sm.a);
  const uint32_t b_lo0 = mm_wgmma_desc_sw128_lo(sm.b);
  bool ok = true;
  uint32_t prev_stage = 0;
#pragma unroll
  for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[w][i] = 0.f;
  for (int kb = 0; kb < kblocks; ++kb) {
    const uint32_t s = pipe.stage;
    if (!mm_gemm_wait(sm, sm.full + 8 * s, pipe.phase, p)) ok = false;
#pragma unroll
    for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
      for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(acc[w][i]);
    mm_wgmma_fence();
#pragma unroll
    for (int wm = 0; wm < Cfg::kWM; ++wm)
#pragma unroll
      for (int wn = 0; wn < Cfg::kWN; ++wn)
#pragma unroll
        for (int k32 = 0; k32 < 4; ++k32) {
          const uint32_t a_lo = a_lo0 + ((s * Cfg::kStrideA + (uint32_t)(row_w + 64 * wm) * 128u + 32u * k32) >> 4);
          const uint32_t b_lo = b_lo0 + ((s * Cfg::kStrideB + (uint32_t)(col_w + 128 * wn) * 128u + 32u * k32) >> 4);
          mm_wgmma_m64n128k32_e4m3(acc[wm * Cfg::kWN + wn], mm_wgmma_desc(a_lo), mm_wgmma_desc(b_lo), 1u);
        }
    mm_wgmma_commit();
#pragma unroll
    for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
      for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(acc[w][i]);
    mm_wgmma_wait<1>();
    if (kb > 0 && lane == 0) mm_mbar_arrive(sm.empty + 8 * prev_stage);
    prev_stage = s;
    mm_gemm_pipe_advance(pipe, sm.stages);
  }
  mm_wgmma_wait<0>();
#pragma unroll
  for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
    for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(acc[w][i]);
  if (lane == 0) mm_mbar_arrive(sm.empty + 8 * prev_stage);
  (void)ti;
  return ok;
}

/* The mainloop of a tile for either accumulator scheme. Returns this
 * thread's view of whether every stage arrived; the kernel combines the
 * views with mm_gemm_math_vote_ok. */
template <class Cfg, bool kEarlyProbe = false>
MM_DEVICE bool mm_gemm_consume_tile(const mm_gemm_smem& sm, mm_gemm_pipe& pipe, const mm_gemm_problem& p,
                                    const mm_gemm_tile_info& ti, int wg, float (&acc)[Cfg::kWaves][64]) {
  if constexpr (Cfg::kNoScale) return mm_gemm_consume_tile_noscale<Cfg>(sm, pipe, p, ti, wg, acc);
  else if constexpr (Cfg::kTwoParts) return mm_gemm_consume_tile_2p<Cfg>(sm, pipe, p, ti, wg, acc);
  else return mm_gemm_consume_tile_1p<Cfg, kEarlyProbe>(sm, pipe, p, ti, wg, acc);
}

#endif
