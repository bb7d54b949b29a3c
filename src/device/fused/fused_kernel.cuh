/* The fused arm's kernel (fused_arm.h; docs/FUSED.md): one cooperative
 * launch per forward, one CTA per SM, 384 threads.
 *
 *   A-C  routing, all-rank barrier 0, the num_tokens_bound verdict and the
 *        pool layout in virtual rows (route/route_phases.cuh); phase A clears
 *        the per-block counter bank the NEXT forward uses
 *   D    each CTA builds the task stream (fused_stream.cuh); every warp of
 *        the grid pulls its 2 of the first rows (mm_fused_pull_prologue)
 *        and every thread decodes its task of the stream's task list; its
 *        producer claims tasks from a grid counter in stream order, reads
 *        them from the list (order.dynamic_claim = 0: takes t = blockIdx.x,
 *        + gridDim.x, ...) and hands them to the other roles through the
 *        task ring:
 *          warp 8 lane 0  producer: the counter wait of the task's blocks
 *                         (PULLED for an L1 tile, L1_DONE for an L2 tile),
 *                         then the TMA loads (A per 128-row block at its
 *                         ring row)
 *          warps 0-7      math: L1 tile -> SwiGLU + per-G fp8 into the ring,
 *                         L1_DONE += rows; L2 tile -> bf16 staged for the
 *                         copy warps
 *          warps 9-10     copy (MM_FUSED_COPY_WARPS): each staged L2 tile's
 *                         rows to their source rank's combine rows,
 *                         L2_DONE += rows
 *          warp 11        pull: virtual rows in pool order over every pull
 *                         warp of the grid, MM_FUSED_PULL_CHUNK at a time;
 *                         the slot guard, the rows, PULLED += the chunk's rows
 *   E    grid barrier, all-rank barrier 1 (CTA 0), grid barrier, the
 *        reduction in slot order, the end of the forward.
 *
 * Counters (fused.h): three int32 per virtual block in the bank of this
 * forward's parity, each counting rows; every wait on them is an acquire
 * with the layer's deadline, every increment a release after the data it
 * publishes (docs/FUSED.md section 5 has the recipes).
 *
 * One shared-memory pipeline serves both GEMMs: a stage holds the larger of
 * the two tiles' A + B images (mm_fused_tiles), and each role carries a view
 * of the pipeline per GEMM (the B operand sits right after that tile's A in
 * the stage). Producer and math warps walk the same tasks, so the stages'
 * (stage, phase) stay matched across the two shapes. */
#ifndef MEGAMOE_FUSED_KERNEL_CUH
#define MEGAMOE_FUSED_KERNEL_CUH

#include <cuda.h>

#include "comm/barrier.cuh"
#include "comm/forward.cuh"
#include "comm/grid.cuh"
#include "comm/wait.cuh"
#include "fused.h"
#include "fused/fused_stream.cuh"
#include "gemm/gemm_cfg.cuh"
#include "gemm/gemm_dynamic.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "route/route.cuh"
#include "route/route_phases.cuh"
#include "timeline.cuh"
#include "view.cuh"

/* Warps of the producer warpgroup (warp 8 issues the TMA loads): copy warps,
 * then pull warps (docs/FUSED.md section 10: the split is a knob). */
#define MM_FUSED_PRODUCER_WARP 8
#define MM_FUSED_COPY_WARP0 9
#ifndef MM_FUSED_COPY_WARPS
#define MM_FUSED_COPY_WARPS 2 /* 1 measured 3-10 % slower on one H200 (docs/PERF.md, fused arm v1) */
#endif
#define MM_FUSED_PULL_WARP0 (MM_FUSED_COPY_WARP0 + MM_FUSED_COPY_WARPS)
#define MM_FUSED_PULL_WARPS (MM_GEMM_THREADS / 32 - MM_FUSED_PULL_WARP0)
#define MM_FUSED_COPY_THREADS (32 * MM_FUSED_COPY_WARPS)
static_assert(MM_FUSED_COPY_WARPS >= 1 && MM_FUSED_PULL_WARPS >= 1, "the producer warpgroup holds both roles");
/* Warps that read each task of the ring (the math warps and the copy warps). */
#define MM_FUSED_TASK_READERS (8 + MM_FUSED_COPY_WARPS)
/* Rows a pull warp copies before one release of PULLED (the seed batches up
 * to 16 too): a release per row is a gpu-scope fence per 4 KB row, and with
 * one pull warp per SM the producers waited ~125 us per CTA for pulled rows
 * at 2048 tokens (docs/PERF.md, fused arm v1). */
#ifndef MM_FUSED_PULL_CHUNK
#define MM_FUSED_PULL_CHUNK 16
#endif
/* The register split of the roles (setmaxnreg, multiples of 8; 2 x 128 x
 * math + 128 x producer = 64512, the CTA's pool at launch). The fused
 * producer warpgroup runs the producer, copy and pull roles at once and
 * spilled ~560 B under the engine's 40 (ncu: 22x the split L1 kernel's
 * local-memory requests); overridable to measure the trade. */
#ifndef MM_FUSED_PRODUCER_REGS
#define MM_FUSED_PRODUCER_REGS MM_GEMM_PRODUCER_REGS
#endif
#define MM_FUSED_MATH_REGS ((64512 / 128 - MM_FUSED_PRODUCER_REGS) / 2)
static_assert(MM_FUSED_PRODUCER_REGS >= 24 && MM_FUSED_PRODUCER_REGS <= MM_GEMM_TAIL_REGS,
              "setmaxnreg: the producer warpgroup decreases from the launch's 168, the math warpgroups increase");
static_assert(MM_FUSED_PRODUCER_REGS % 8 == 0 && MM_FUSED_MATH_REGS % 8 == 0 &&
                  2 * MM_FUSED_MATH_REGS + MM_FUSED_PRODUCER_REGS == 64512 / 128,
              "setmaxnreg: multiples of 8 that fill the CTA's register pool");
/* At most this many of a CTA's first tasks (stride order; fewer where they
 * would cost a pipeline stage: mm_fused_task_cache_entries), decoded ahead
 * by the whole CTA before the roles start and read back by the producer (fused.h,
 * mm_fused_task_pack): decoding one task costs the producer thread ~5-10 us
 * under its 40 registers, during which the math warps waited for it (1.0 ms
 * per CTA summed at 8192 tokens, EP1; docs/PERF.md). Tasks past these are
 * decoded by the producer as before. */
#define MM_FUSED_TASK_CACHE 256
/* A tile shape of the fused kernel: the engine's config with one stage size
 * for both shapes (kStage bytes, A at the stage's start, B right after the
 * tile's A) and the A scales at a stride of the larger tile's, and A loaded
 * per 128-row ring block (gemm_cfg.cuh). kBScale128_: the L2 tile's B
 * scales (W2's) are per 128 columns, which mm_fused_prepare checks. */
template <class Base, uint32_t kStage, uint32_t kStageSFMax, bool kBScale128_ = false>
struct mm_fused_tile : Base {
  static constexpr bool kBScale128 = kBScale128_;
  static constexpr uint32_t kStrideA = kStage;
  static constexpr uint32_t kStrideB = kStage;
  static constexpr uint32_t kStrideSF = kStageSFMax;
  static constexpr int kABoxRows = Base::BM < MM_FUSED_BLOCK_ROWS ? Base::BM : MM_FUSED_BLOCK_ROWS;
  static_assert(Base::kStageA + Base::kStageB <= kStage && Base::kStageSF <= kStageSFMax, "the stage holds the tile");
  static_assert(kStage % 1024 == 0 && kStageSFMax % 128 == 0, "stage alignment (swizzle, TMA)");
};

/* The two tiles of one kernel: L1 (C1, SwiGLU epilogue) and L2 (C2, staged
 * for the copy warps). */
template <class C1, class C2>
struct mm_fused_tiles {
  static constexpr uint32_t kAB1 = C1::kStageA + C1::kStageB, kAB2 = C2::kStageA + C2::kStageB;
  static constexpr uint32_t kStage = kAB1 > kAB2 ? kAB1 : kAB2;
  static constexpr uint32_t kStageSF = C1::kStageSF > C2::kStageSF ? C1::kStageSF : C2::kStageSF;
  static constexpr uint32_t kBM = C1::BM > C2::BM ? C1::BM : C2::BM;
  using T1 = mm_fused_tile<C1, kStage, kStageSF>;
  using T2 = mm_fused_tile<C2, kStage, kStageSF, true>;
  static_assert(!C1::kStaging && C2::kStaging, "L1 stores its fp8 codes, L2 stages bf16 for the copy warps");
  /* An L1 tile with the SwiGLU staging (kSwStage) puts its codes (BM rows
   * of 128 bytes) into the L2 tile's staging area, between two L2 tiles'
   * uses of it (mm_fused_math). */
  static_assert(!C1::kSwStage || C1::BM * 128u <= C2::kStagingBytes, "the L1 codes fit the L2 staging area");
  static_assert(C1::BM <= MM_FUSED_BLOCK_ROWS, "an L1 tile sits inside one ring block");
  static_assert(C2::BM <= 2 * MM_FUSED_BLOCK_ROWS, "an L2 tile covers at most two ring blocks");
};

/* Static shared memory the fused layout adds to the engine's 256 B reserve
 * (which covers the grid barrier's and other helpers' words): mm_fused_cta
 * (static_assert below), 536 B, and 64 B of margin for the kernel's other
 * static words (ptxas: 8 B).
 * Every byte counts against the stages: against the 512 B reserve before
 * the math state moved here, the large pairs lose their third stage at 6
 * local expert counts each (E_l 350-355 for 256x128 at G = 64, 504-509 at
 * G = 128, 606-611 / 683-688 for 128x256), none up to 256 (a host-side
 * sweep of E_l 1-1024 with mm_fused_layout_with; 25 counts each at the
 * thirtieth session's 1024 B, before the per-warp state shrank to 24 B and
 * the laps went to timeline builds only). Back to 512 B would need the
 * task ring's 40-byte entries packed. The timeline build's laps take 96 B
 * more (its windows 12-13 counts). */
#ifndef MM_FUSED_STATIC_SMEM
#define MM_FUSED_STATIC_SMEM (MM_FUSED_MATH_TIMELINE ? 768u : 640u)
#endif

/* Where the task cache starts in the scheduler area: after the copy warps'
 * row destinations (C2::BM pointers) and the stream, 8-byte aligned. */
template <class C2>
static inline __host__ __device__ uint32_t mm_fused_task_cache_offset(int experts) {
  return ((uint32_t)C2::BM * 8u + mm_fused_stream_smem_bytes(experts) + 7u) / 8u * 8u;
}

/* The kernel's shared memory: the engine's layout (gemm_cfg.cuh) with one
 * stage of kStage bytes (stage_b = 0: B lives inside the stage), the L2
 * tile's staging area (also the L1 tile's codes on their way to the TMA
 * store: mm_fused_math), the xwg area of the L1 epilogue's amax exchange, and
 * in the scheduler area the copy warps' row destinations (C2::BM pointers:
 * not the xwg area, which the L1 epilogue uses at the same time) and the
 * stream (fused_stream.cuh). */
template <class C1, class C2>
static inline __host__ __device__ mm_gemm_layout mm_fused_layout_with(int experts, uint32_t cache_entries) {
  using P = mm_fused_tiles<C1, C2>;
  /* The stage count leaves room for the kernel's static shared memory beyond
   * the 256 B the engine's layout keeps for it (mm_fused_cta: static_assert
   * below), but that room is not part of the dynamic request: the static
   * memory comes on top of it. */
  const uint32_t extra =
      mm_fused_task_cache_offset<C2>(experts) + cache_entries * 8u + MM_FUSED_STATIC_SMEM;
  mm_gemm_layout L = mm_gemm_layout_make(P::kStage, 0, P::kStageSF, C2::kStagingBytes, P::kBM, extra, MM_GEMM_MAX_STAGES);
  L.bytes -= MM_FUSED_STATIC_SMEM;
  return L;
}

/* Tasks the CTA decodes ahead (MM_FUSED_TASK_CACHE): the most of 256, 128,
 * ..., 0 that costs no pipeline stage (a stage is worth more than the
 * decode). Host and kernel compute it alike. */
template <class C1, class C2>
static inline __host__ __device__ uint32_t mm_fused_task_cache_entries(int experts) {
  const uint32_t stages = mm_fused_layout_with<C1, C2>(experts, 0).stages;
  for (uint32_t n = MM_FUSED_TASK_CACHE; n > 0; n /= 2)
    if (mm_fused_layout_with<C1, C2>(experts, n).stages >= stages) return n;
  return 0;
}

/* The math loop's state between tasks (the task index, the L2 tiles staged,
 * the pending L1 tile, the current task's block), in shared memory, one copy
 * per math warp (its lanes store the same values), read where it is used;
 * the CTA-wide words it needs too (the L1_DONE counters, the task ring's
 * barriers) are read from mm_fused_cta the same way (mm_fused_cta_v). Kept
 * in registers it was
 * spilled by ptxas across the mainloops (~10 words), and ncu put ~3.4 % of
 * the math warps' samples on the reloads, which missed L1: every counter
 * acquire and bulk wait of the SM's roles invalidates it (`CCTL.IVALL`).
 * Measured fused -1.3 / -3.4 % at 2048 / 8192 tokens on an H100
 * (docs/PERF.md, thirtieth session). volatile: every use is a load from
 * here, so nothing of it stays live across a mainloop. */
struct mm_fused_math_state {
  uint32_t j;          /* the next task's index in the task ring */
  int32_t l2_tiles;    /* L2 tiles staged so far (the copy hand-off's index) */
  int32_t pend_block0; /* the L1 tile whose L1_DONE is pending (-1: none); virtual blocks fit 32 bits
                        * (mm_fused_stream's block_start) */
  int32_t pend_rows;
  int32_t task_block0; /* the current task's first block and rows */
  int32_t task_rows;
};
static_assert(sizeof(mm_fused_math_state) == 24, "the per-warp state's share of the static reserve");

/* The math timeline's sums (-DMM_FUSED_MATH_TIMELINE=1 builds; math thread 0
 * only), in shared memory for the same reason: in registers they were
 * spilled, and each lap's reload, after the lap's clock read, went to L2 and
 * was counted in the next lap (docs/PERF.md, thirtieth session). */
struct mm_fused_math_laps {
  uint64_t spent[MM_TL_MATH_L2_PUB - MM_TL_MATH_TASK + 1]; /* ns per part */
  uint64_t mark;                                         /* the last lap's clock */
  uint64_t data_wait[2];                                 /* MM_GEMM_WAIT_TIMER: the mainloops' waits */
  uint64_t waited_mark;
};

/* What the producer warpgroup's roles share, in static shared memory
 * (written by thread 0 before the roles start). They run under
 * MM_FUSED_PRODUCER_REGS registers after setmaxnreg.dec: every value live
 * across that instruction must fit them, so they take their context from
 * here after it (mm_fused_role_ctx) instead of from registers. (The math
 * warpgroups only gain registers: they keep theirs.) */
struct mm_fused_cta {
  mm_gemm_smem sm;           /* the pipeline (each GEMM sees it through mm_fused_view_l1 / _l2) */
  mm_fused_task ring[MM_GEMM_TILE_RING]; /* the producer's decoded tasks for the math and copy warps (below) */
  const mm_fused_stream* s;  /* the stream (fused_stream.cuh) */
  int32_t* pulled;           /* this forward's counter bank, per virtual block */
  int32_t* l1_done;
  int32_t* l2_done;
  int32_t* claim;            /* the grid's task counter (order.dynamic_claim), or NULL: tasks by stride */
  const int32_t* decoded;    /* with claim: CTAs whose share of the task list is written (target gridDim.x) */
  const uint64_t* list;      /* with claim: the stream's tasks [0, list_n), packed, decoded by the grid */
  int64_t list_n;
  const uint64_t* cache;     /* without claim: this CTA's first cache_n tasks, packed (stride order), or NULL */
  uint32_t cache_n;          /* mm_fused_task_cache_entries */
  mm_fused_math_state math_state[8]; /* per math warp (mm_fused_math) */
#if MM_FUSED_MATH_TIMELINE
  mm_fused_math_laps math_laps;      /* math thread 0's timeline (mm_fused_math) */
#endif
};

/* The context read through volatile (the math loop: a load at each use, so
 * no copy of it stays live in a register across a mainloop). */
MM_DEVICE volatile mm_fused_cta* mm_fused_cta_v(mm_fused_cta& c) { return &c; }

static_assert(sizeof(mm_fused_cta) + 64 <= MM_FUSED_STATIC_SMEM, "the fused kernel's static shared memory is reserved");

/* Keeps the compiler from moving shared-memory reads of the context above
 * the register reconfiguration (or from keeping copies in registers across
 * it). */
MM_DEVICE void mm_fused_role_ctx() { asm volatile("" ::: "memory"); }

/* The pipeline seen by each GEMM: B right after the tile's A in a stage; the
 * L2 view's xwg area holds the copy warps' row destinations (the scheduler
 * area's first C2::BM pointers), the L1 view's is the SwiGLU epilogue's
 * amax exchange. */
template <class T1>
MM_DEVICE mm_gemm_smem mm_fused_view_l1(const mm_gemm_smem& sm) {
  mm_gemm_smem v = sm;
  v.b = sm.a + T1::kStageA;
  return v;
}
template <class T2>
MM_DEVICE mm_gemm_smem mm_fused_view_l2(const mm_gemm_smem& sm) {
  mm_gemm_smem v = sm;
  v.b = sm.a + T2::kStageA;
  v.xwg = reinterpret_cast<float*>(sm.sched);
  return v;
}

/* ---- The task ring ----------------------------------------------------------
 * The producer thread takes each of the CTA's tasks once (read back from
 * the task cache, or decoded by mm_fused_task_at: binary searches and
 * 64-bit divisions, microseconds per task in 40 registers) and hands it to the math and copy warps through
 * MM_GEMM_TILE_RING entries of shared memory, with the engine's tile-id
 * barriers and protocol (gemm_dynamic.cuh, mm_gemm_ring_*): the producer waits tile_empty[s], writes the
 * entry, arrives tile_full[s] (release); every reading warp waits
 * tile_full[s] (acquire), reads, and its lane 0 arrives tile_empty[s]. The
 * math warps thus start each tile's mainloop without decoding anything. A
 * task with gemm = -1 ends the sequence. */
MM_DEVICE bool mm_fused_publish_task(mm_fused_cta& c, const mm_gemm_problem& p, uint32_t j, const mm_fused_task& t) {
  return mm_gemm_ring_publish(c.sm, p, j, c.ring, t);
}

/* Every thread of a reading warp: the j-th task into *t (gemm = -1 when the
 * wait gave up: one answer per warp, mm_gemm_ring_read). */
MM_DEVICE bool mm_fused_read_task(const mm_gemm_smem& sm, const mm_fused_task* ring, const mm_gemm_problem& p,
                                  uint32_t j, mm_fused_task* t) {
  t->gemm = -1;
  return mm_gemm_ring_read(sm, p, j, ring, t);
}

/* ---- Producer (warp 8, lane 0) ------------------------------------------- */

/* Waits until counter[b] of the task's blocks reaches its target (the first
 * block, and the next when the tile reaches it), then orders the blocks'
 * generic-proxy writes before this thread's TMA loads. */
MM_DEVICE bool mm_fused_wait_blocks(const mm_gemm_smem& sm, const mm_gemm_problem& p, const mm_fused_stream* s,
                                    const int32_t* counter, int kind, const mm_fused_task& t) {
  const int64_t last = t.block0 + (mm_fused_rows_in_block1(t) > 0 ? 1 : 0);
  for (int64_t b = t.block0; b <= last; ++b)
    if (!mm_gemm_wait_counter(sm, p, counter + b, (int32_t)mm_fused_counter_target(s, kind, b), (int)b))
      return false;
  mm_fence_proxy_async_global();
  return true;
}

/* A tile the producer loads. A two-box tile (the 256-row L2 tiles): NVVM
 * sank the 64-bit remainders of its two ring rows (mm_fused_ring_row) into
 * the K loop, recomputed at every K block, and the loop spilled under the
 * producer's 40 registers. The same rows here in 32 bits (virtual rows fit
 * 31 bits, as in mm_fused_pull), held before the loop by the empty asm (NVVM
 * sinks a 32-bit remainder too). Other tiles: mm_fused_tile_of as it is. */
template <class T>
MM_DEVICE mm_gemm_tile_info mm_fused_producer_tile(const mm_fused_stream* s, const mm_fused_task& t) {
  mm_gemm_tile_info ti = mm_fused_tile_of(s, t, T::BN);
  if constexpr (T::kABoxRows < T::BM) {
    const uint32_t ring_rows = (uint32_t)s->order.ring_blocks * MM_FUSED_BLOCK_ROWS;
    const uint32_t v0 = (uint32_t)mm_fused_tile_vrow0(t);
    const uint32_t v1 = (uint32_t)mm_fused_tile_vrow1(t, v0);
    ti.a_row0 = (int32_t)(v0 % ring_rows);
    ti.a_row1 = (int32_t)(v1 % ring_rows);
    asm volatile("" : "+r"(ti.a_row0), "+r"(ti.a_row1));
  }
  return ti;
}

template <class T1, class T2>
MM_DEVICE void mm_fused_produce(const mm_layer_view& L, mm_fused_cta& c, const CUtensorMap* tm_a1, const CUtensorMap* tm_b1,
                                const CUtensorMap* tm_sf1, const CUtensorMap* tm_a2, const CUtensorMap* tm_b2,
                                const CUtensorMap* tm_sf2, const mm_gemm_problem& p1, const mm_gemm_problem& p2) {
  const mm_fused_stream* s = c.s;
  mm_gemm_pipe pipe = {0u, 0u};
  /* timeline: ns in the counter waits per GEMM; with MM_FUSED_MATH_TIMELINE
   * also in the task publications and the tile loads */
  uint64_t waited[4] = {};
  bool first[2] = {true, true};
  uint32_t j = 0;
  /* Tasks in stream order: claimed from the grid's counter (a CTA that runs
   * fast takes more, so the CTAs end together; every task's inputs come
   * from tasks earlier in the stream, so from tasks claimed before it), or
   * by stride. A claimed task is read from the list the grid decoded: every
   * CTA's share is written (its release after a CTA barrier) before the
   * first read. Decoding one here instead costs this thread ~5 us under its
   * 40 registers, which the math warps waited for (8192 tokens, one H200:
   * 3.68 against 3.28 ms for the stride order; docs/PERF.md, thirteenth
   * session). */
  if (c.claim && !mm_gemm_wait_counter(c.sm, p1, c.decoded, (int32_t)gridDim.x, -1))
    return; /* the abort word is set: the other roles leave too */
  /* A claimed task's list entry (MM_FUSED_TASK_UNPACKED: decode it here). */
  auto list_entry = [&](int64_t t) {
    return t < c.list_n ? mm_ld_relaxed_gpu_u64(c.list + t) : MM_FUSED_TASK_UNPACKED;
  };
  int64_t t = c.claim ? atomicAdd(c.claim, 1) : blockIdx.x;
  uint64_t w = c.claim ? list_entry(t) : MM_FUSED_TASK_UNPACKED;
  for (;;) {
    mm_fused_task task;
    if (t >= s->tasks) {
      task.gemm = -1; /* the end of the sequence */
    } else {
      if (!c.claim) w = c.cache && j < c.cache_n ? c.cache[j] : MM_FUSED_TASK_UNPACKED;
      if (w != MM_FUSED_TASK_UNPACKED) mm_fused_task_unpack(s, w, &task);
      else mm_fused_task_at(s, t, &task);
    }
    /* The next task claimed now, and its list entry read once this task's
     * blocks are ready, before its loads: both round trips run under this
     * task. A claim only ever runs ahead of the tasks before it in this CTA,
     * which wait on nothing later in the stream. */
    const int64_t t_next = t >= s->tasks ? t : c.claim ? (int64_t)atomicAdd(c.claim, 1) : t + gridDim.x;
    uint64_t w_next = MM_FUSED_TASK_UNPACKED;
    const uint64_t tp = MM_FUSED_MATH_TIMELINE ? mm_tl_now(L) : 0;
    if (!mm_fused_publish_task(c, p1, j++, task) || task.gemm < 0) break;
    const uint64_t t0 = mm_tl_now(L);
    if (MM_FUSED_MATH_TIMELINE) waited[2] += t0 - tp;
    bool ok;
    if (task.gemm == 0) {
      /* The block's rows pulled into its slot. */
      const mm_gemm_smem sm1 = mm_fused_view_l1<T1>(c.sm);
      const mm_gemm_tile_info ti = mm_fused_tile_of(s, task, T1::BN);
      ok = mm_fused_wait_blocks(sm1, p1, s, c.pulled, MM_FUSED_PULLED, task);
      waited[0] += mm_tl_now(L) - t0;
      if (c.claim) w_next = list_entry(t_next);
      if (first[0]) mm_tl_stamp(L, MM_TL_L1_FIRST_LOAD);
      const uint64_t tl = MM_FUSED_MATH_TIMELINE ? mm_tl_now(L) : 0;
      ok = ok && mm_gemm_produce_tile_loads<T1>(sm1, pipe, tm_a1, tm_b1, tm_sf1, p1, ti);
      if (MM_FUSED_MATH_TIMELINE) waited[3] += mm_tl_now(L) - tl;
    } else {
      /* Every L1 tile of the blocks written (their fp8 rows and scales). */
      const mm_gemm_smem sm2 = mm_fused_view_l2<T2>(c.sm);
      const mm_gemm_tile_info ti = mm_fused_producer_tile<T2>(s, task);
      ok = mm_fused_wait_blocks(sm2, p2, s, c.l1_done, MM_FUSED_L1_DONE, task);
      waited[1] += mm_tl_now(L) - t0;
      if (c.claim) w_next = list_entry(t_next);
      const uint64_t tl = MM_FUSED_MATH_TIMELINE ? mm_tl_now(L) : 0;
      ok = ok && mm_gemm_produce_tile_loads<T2>(sm2, pipe, tm_a2, tm_b2, tm_sf2, p2, ti);
      if (MM_FUSED_MATH_TIMELINE) waited[3] += mm_tl_now(L) - tl;
    }
    if (!ok) break; /* the abort word is set: the other roles leave too */
    if (first[task.gemm]) mm_tl_stamp(L, task.gemm == 0 ? MM_TL_L1_FIRST_TILE : MM_TL_K2_START);
    first[task.gemm] = false;
    if (task.gemm == 0) mm_tl_stamp(L, MM_TL_L1_LAST_ISSUED);
    t = t_next;
    w = w_next;
  }
  mm_tl_add(L, MM_TL_WAIT_PULLED, waited[0]);
  mm_tl_add(L, MM_TL_WAIT_L1_DONE, waited[1]);
#if MM_FUSED_MATH_TIMELINE
  mm_tl_add(L, MM_TL_PROD_PUBLISH, waited[2]);
  mm_tl_add(L, MM_TL_PROD_LOADS, waited[3]);
#endif
}

/* ---- Math warpgroups (warps 0-7) ------------------------------------------ */
/* L1_DONE of an L1 tile is published late: after the NEXT tile's mainloop,
 * when the tile's fp8 stores have long completed, so neither the proxy
 * fence nor the release stalls the tensor cores. Before an L2 tile's
 * mainloop it is published first: that tile's producer may be waiting on
 * this very counter (the single-wave order's first L2 tile depends on the
 * CTA's own last L1 tiles). Tiles of one L1 unit never wait on each other,
 * and the lag order keeps an L2 task >= lag units behind. */
/* One tile pending at a time, released by the math threads. Two (one proxy
 * fence, math barrier and membar per two tiles) were built and, beside the
 * early-combine option, measured slower on an H100 (its own share about +8
 * us at 2048 tokens, no gain at 8192: docs/PERF.md, seventeenth session).
 * The release moved to the first copy thread (math thread 0 handing each
 * tile over a shared-memory barrier) was built too: no gain at 2048 or 8192
 * tokens with the 256x128 L2 tile, +1.8 % at 2048 with 128x256 (one H100,
 * twenty-fifth session). Both removed; fused.ring_simulation keeps their
 * rules (SIM_PUBLISH_PAIRS, SIM_PUBLISH_BY_COPY) as checked designs. */
/* Every math thread: L1_DONE for the pending tile, if any. Its fp8 codes
 * and scales (a TMA store's completion first: usually long done, as the
 * publication follows the next tile's mainloop; waited in full where an L2
 * task or the ring's distance publishes it first), then the async-proxy
 * fence (an L2 producer's TMA reads them next), the math threads' barrier,
 * one release that is cumulative over them. */
MM_DEVICE void mm_fused_publish_l1(const mm_layer_view& L, mm_fused_cta& c, volatile mm_fused_math_state* ms) {
  const int32_t block0 = ms->pend_block0;
  if (block0 < 0) return;
  /* Read by every lane before the barrier: after it, the warp's other lanes
   * reset the pending tile while thread 0 releases (no read of the state
   * may follow that reset unordered). */
  int32_t* const counter = mm_fused_cta_v(c)->l1_done + block0;
  const int32_t rows = ms->pend_rows;
  /* The pending tile's TMA store written (thread 0 issued it, one bulk
   * group; it has no other: the next L1 tile's epilogue comes after this
   * publication). */
  if (threadIdx.x == 0) mm_bulk_wait_group<0>();
  mm_fence_proxy_async_global();
  mm_gemm_math_barrier();
  if (threadIdx.x == 0) {
    mm_red_release_gpu_add_s32(counter, rows);
    mm_tl_stamp(L, MM_TL_L1_MATH_END);
  }
  ms->pend_block0 = -1;
}

template <class T1, class T2>
MM_DEVICE void mm_fused_math(const mm_layer_view& L, mm_fused_cta& c, const mm_gemm_smem& sm,
                             const mm_fused_stream* s, const mm_gemm_problem& p1,
                             const mm_gemm_problem& p2, const CUtensorMap* tm_out1, int wg) {
  const mm_gemm_smem sm1 = mm_fused_view_l1<T1>(sm), sm2 = mm_fused_view_l2<T2>(sm);
  mm_gemm_pipe pipe = {0u, 0u};
  /* The staging area is shared by the two GEMMs' epilogues: an L1 tile's
   * codes go through it to one TMA store (full tiles of a kSwStage L1 tile;
   * the engine measured the store 7 % faster than direct stores on its L1
   * GEMM, docs/PERF.md), an L2 tile's bf16 values to the copy warps. So an
   * L1 epilogue first waits until the copy warps have read the last L2 tile
   * out (copy_empty, thread 0, then a vote), and an L2 epilogue after an L1
   * tile until that tile's store is done: every L1 tile leaves L1_DONE
   * pending, and an L2 task publishes it before its mainloop
   * (mm_fused_publish_l1: thread 0's wait_group 0, then a math barrier).
   * The same tasks in every math thread: the waits are uniform. */
  volatile mm_fused_math_state* ms = c.math_state + (threadIdx.x >> 5);
  ms->j = 0;
  ms->l2_tiles = 0; /* the copy hand-off's tile index (gemm_epilogue.cuh) */
  ms->pend_block0 = -1;
  ms->pend_rows = 0;
  __syncwarp();
  /* Timeline of the math warps' parts (thread 0 only): compiled in only with
   * -DMM_FUSED_MATH_TIMELINE=1 (its sums in shared memory: mm_fused_math_laps), e.g.
   * make BUILD=build_tl NVCC="nvcc -DMM_FUSED_MATH_TIMELINE=1" build_tl/megamoe,
   * then MEGAMOE_TIMELINE=1 build_tl/megamoe bench --arms fused. */
  const bool timed = MM_FUSED_MATH_TIMELINE && L.timeline != nullptr && threadIdx.x == 0;
#if MM_FUSED_MATH_TIMELINE
  volatile mm_fused_math_laps* laps = &c.math_laps;
#else
  volatile mm_fused_math_laps* laps = nullptr; /* never used: timed is false */
#endif
  if (timed) {
    for (int e = 0; e <= MM_TL_MATH_L2_PUB - MM_TL_MATH_TASK; ++e) laps->spent[e] = 0;
    laps->data_wait[0] = laps->data_wait[1] = 0;
    laps->waited_mark = mm_gemm_waited_total();
    laps->mark = mm_globaltimer_ns();
  }
  /* With -DMM_GEMM_WAIT_TIMER=1 also the mainloops' waits for data (the
   * engine's per-thread wait time, gemm_mainloop.cuh). */
  auto lap = [&](int event) {
    if (!timed) return;
    const uint64_t now = mm_globaltimer_ns();
    laps->spent[event - MM_TL_MATH_TASK] += now - laps->mark;
    laps->mark = now;
    if (MM_GEMM_WAIT_TIMER) {
      const uint64_t waited = mm_gemm_waited_total();
      if (event == MM_TL_MATH_L1 || event == MM_TL_MATH_L2)
        laps->data_wait[event == MM_TL_MATH_L2] += waited - laps->waited_mark;
      laps->waited_mark = waited;
    }
  };
  for (;;) {
    mm_fused_task task;
    const uint32_t j = ms->j;
    mm_gemm_smem sm_ring = sm;
    sm_ring.tile_full = mm_fused_cta_v(c)->sm.tile_full;
    sm_ring.tile_empty = mm_fused_cta_v(c)->sm.tile_empty;
    const bool got = mm_fused_read_task(sm_ring, c.ring, p1, j, &task);
    ms->j = j + 1;
    ms->task_block0 = (int32_t)task.block0; /* the L1 tile's, pending after its epilogue (stale when not an L1 task: unread) */
    ms->task_rows = task.rows;
    lap(MM_TL_MATH_TASK);
    /* One decision for the 256 math threads (a wait that gave up in some). */
    if (!mm_gemm_math_vote_ok(sm1, got)) return;
    lap(MM_TL_MATH_VOTE);
    if (task.gemm < 0) break;
    if (task.gemm == 0) {
      /* The deferral needs this tile's pulls not to wait, through the ring
       * slots' guard, on L2 tiles of the pending block: published first when
       * this block is a ring's length ahead of it (block0 + 1 >= pending +
       * ring; never with the stride order, 132 CTAs and the ring's minimum;
       * possible with the dynamic claim, where a CTA's consecutive tasks can
       * be far apart). */
      if (ms->pend_block0 >= 0 && task.block0 + 1 >= ms->pend_block0 + s->order.ring_blocks)
        mm_fused_publish_l1(L, c, ms);
      const mm_gemm_tile_info ti = mm_fused_tile_of(s, task, T1::BN);
      float acc[T1::kWaves][64];
      const bool mine = mm_gemm_consume_tile<T1, true>(sm1, pipe, p1, ti, wg, acc);
      if (!mm_gemm_math_vote_ok(sm1, mine)) return;
      lap(MM_TL_MATH_L1);
      mm_fused_publish_l1(L, c, ms);
      lap(MM_TL_MATH_L1_PUB);
      const int32_t l2_tiles = ms->l2_tiles;
      if (mm_gemm_swiglu_staged<T1>(p1, ti, tm_out1) && l2_tiles > 0) {
        /* A give-up (the abort word is set) must not overwrite what the
         * copy warps may still be reading: all math threads leave. */
        const bool read_out =
            threadIdx.x != 0 || mm_gemm_wait(sm2, sm2.copy_empty, (uint32_t)(l2_tiles - 1) & 1u, p2);
        if (!mm_gemm_math_vote_ok(sm1, read_out)) return;
      }
      /* The routing weights in the same pass as the math: the split arm's
       * late order gained nothing here (+0.7 % in a 4-run A/B, within the
       * noise; thirty-third session). */
      mm_gemm_epilogue_swiglu<T1, false>(sm1, p1, ti, wg, acc, tm_out1);
      ms->pend_block0 = ms->task_block0;
      ms->pend_rows = ms->task_rows;
      lap(MM_TL_MATH_L1_EPI);
    } else {
      mm_fused_publish_l1(L, c, ms);
      lap(MM_TL_MATH_L2_PUB);
      const mm_gemm_tile_info ti = mm_fused_tile_of(s, task, T2::BN);
      float acc[T2::kWaves][64];
      const bool mine = mm_gemm_consume_tile<T2, true>(sm2, pipe, p2, ti, wg, acc);
      if (!mm_gemm_math_vote_ok(sm2, mine)) return;
      lap(MM_TL_MATH_L2);
      /* A give-up in the hand-off (the abort word is set) stages nothing;
       * the next tile's vote leaves, the copy warps leave on the abort word. */
      const int32_t l2_tiles = ms->l2_tiles;
      __syncwarp(); /* every lane's read before any lane's write */
      ms->l2_tiles = l2_tiles + 1;
      (void)mm_gemm_epilogue_stage_for_copy<T2>(sm2, p2, l2_tiles, wg, acc);
      if (threadIdx.x == 0) {
        mm_tl_stamp(L, MM_TL_L2_MATH_END);
        mm_tl_clock_end(L);
      }
      lap(MM_TL_MATH_L2_EPI);
    }
  }
  mm_fused_publish_l1(L, c, ms);
  if (timed) {
    for (int e = MM_TL_MATH_TASK; e <= MM_TL_MATH_L2_PUB; ++e) mm_tl_add(L, e, laps->spent[e - MM_TL_MATH_TASK]);
    mm_tl_add(L, MM_TL_MATH_L1_DATA, laps->data_wait[0]); /* 0 without MM_GEMM_WAIT_TIMER: nothing added */
    mm_tl_add(L, MM_TL_MATH_L2_DATA, laps->data_wait[1]);
  }
}

/* ---- Copy warps (MM_FUSED_COPY_WARP0 on) ----------------------------------------------------- */
template <class T2>
MM_DEVICE void mm_fused_copy(const mm_layer_view& L, const mm_fused_cta& c, const mm_gemm_problem& p2, int c_tid) {
  const int lane = threadIdx.x & 31;
  const mm_fused_stream* s = c.s;
  uint32_t j = 0; /* L2 tiles of this CTA so far: the hand-off's index */
  for (uint32_t k = 0;; ++k) {
    mm_fused_task task; /* every task of the ring: this warp is one of its readers */
    const bool got = mm_fused_read_task(c.sm, c.ring, p2, k, &task);
    /* One decision for all copy warps (a give-up in one warp, while another
     * read the task, would leave the other alone at the copy barrier). */
    if (mm_named_barrier_or(MM_GEMM_BAR_COPY, MM_FUSED_COPY_THREADS, !got)) break;
    if (task.gemm < 0) break;
    if (task.gemm == 0) continue;
    const mm_gemm_smem sm2 = mm_fused_view_l2<T2>(c.sm);
    const mm_gemm_tile_info ti = mm_fused_tile_of(s, task, T2::BN);
    const int32_t rows1 = mm_fused_rows_in_block1(task);
    /* The copy reads the blocks' row tables (destinations) before the tile
     * is staged, to overlap the lookups with its mainloop: unlike the split
     * arm's kernel 2 it must first acquire the blocks' pulls (the row table's
     * writers). The tile's L1_DONE wait, which its producer passes before
     * any load, implies them, so this rarely waits. */
    int ready = 1;
    if (lane == 0) {
      const uint64_t t0 = mm_tl_now(L);
      mm_wait_ctx ctx;
      ctx.status = p2.status;
      ctx.timeout_ns = p2.timeout_ns;
      ctx.site = MM_SITE_GEMM_ROWS_READY;
      ctx.abort_flag = sm2.abort;
      for (int64_t b = task.block0; ready && b <= task.block0 + (rows1 > 0 ? 1 : 0); ++b)
        ready = mm_wait_counter_geq<false>(c.pulled + b, (int32_t)mm_fused_counter_target(s, MM_FUSED_PULLED, b), ctx,
                                           (int)b);
      if (!ready) *c.sm.abort = 1; /* the CTA's other roles leave too, not after their own deadlines */
      mm_tl_add(L, MM_TL_WAIT_COPY, mm_tl_now(L) - t0);
    }
    __syncwarp(); /* lane 0's acquire before the other lanes' lookups */
    ready = __shfl_sync(0xffffffffu, ready, 0);
    if (!mm_gemm_copy_tile<T2, MM_FUSED_COPY_THREADS>(sm2, p2, ti, j++, c_tid, ready != 0)) break;
    /* Every copy thread's row-table reads and stores precede the copy's
     * closing barrier: the slot's last readers of this tile are done. */
    if (c_tid == 0) {
      mm_red_release_gpu_add_s32(c.l2_done + task.block0, mm_fused_rows_in_block0(task));
      if (rows1 > 0) mm_red_release_gpu_add_s32(c.l2_done + task.block0 + 1, rows1);
    }
  }
}

/* ---- Pull warps (the producer warpgroup's last) ------------------------------------------------ */

/* The first virtual rows, pulled by every warp of the grid before the roles
 * start (mm_fused_pull_prologue): MM_FUSED_PROLOGUE_ROWS per warp, at most
 * the ring's first pass (those slots have no predecessor to wait for), a
 * whole number of pull chunks. One pull warp per SM took ~100 us after the
 * layout to bring the first tiles' rows (a chunk's rows one after the
 * other), and at decode the last row arrived at ~90 us, with most of the
 * grid's pull warps idle (docs/PERF.md, tenth session). */
#ifndef MM_FUSED_PROLOGUE_ROWS
#define MM_FUSED_PROLOGUE_ROWS 2
#endif
MM_DEVICE int mm_fused_prologue_rows(const mm_fused_stream* s) {
  const int rows = MM_FUSED_PROLOGUE_ROWS * (int)gridDim.x * (MM_GEMM_THREADS / 32);
  return min(rows, s->order.ring_blocks * MM_FUSED_BLOCK_ROWS) / MM_FUSED_PULL_CHUNK * MM_FUSED_PULL_CHUNK;
}

/* Every warp of the CTA: its share of the prologue's rows, MM_FUSED_PROLOGUE_ROWS
 * consecutive rows per warp of the grid (one block: the block size is a
 * multiple), at their ring rows (the ring's first pass: a virtual row is its
 * own ring row), PULLED += the rows after their stores (the async-proxy
 * fence: the L1 producer's TMA reads them). */
MM_DEVICE void mm_fused_pull_prologue(const mm_layer_view& L, const mm_fused_stream* s, int32_t* pulled) {
  static_assert(MM_FUSED_PULL_CHUNK % MM_FUSED_PROLOGUE_ROWS == 0 && MM_FUSED_PROLOGUE_ROWS <= 32,
                "a warp's prologue rows stay inside one block");
  const int rows = mm_fused_prologue_rows(s);
  const int ring_rows = s->order.ring_blocks * MM_FUSED_BLOCK_ROWS;
  const int nw = (int)gridDim.x * (MM_GEMM_THREADS / 32);
  for (int r0 = (blockIdx.x * (MM_GEMM_THREADS / 32) + (threadIdx.x >> 5)) * MM_FUSED_PROLOGUE_ROWS; r0 < rows;
       r0 += nw * MM_FUSED_PROLOGUE_ROWS) {
    const int b = r0 / MM_FUSED_BLOCK_ROWS;
    const int e = mm_fused_find(s->block_start, s->experts, b);
    const int n = min(MM_FUSED_PROLOGUE_ROWS, s->block_start[e] * MM_FUSED_BLOCK_ROWS + s->rows[e] - r0);
    if (n <= 0) continue; /* the block's padding */
    mm_pull_rows_to(L, r0, n, e, r0, ring_rows);
    mm_pull_publish(pulled + b, n);
  }
}

/* Chunks of MM_FUSED_PULL_CHUNK virtual rows gw, gw + nw, ... (pool order
 * over every pull warp of the grid, so the first blocks complete first).
 * Before the first row of a block this warp writes, the slot guard: the
 * slot's previous block in this forward (mm_fused_slot_predecessor) must
 * have finished its L2 tiles (L2_DONE at its target). Then the chunk's valid
 * rows at their ring rows, and PULLED += those rows after their stores (the
 * async-proxy fence: the L1 producer's TMA reads them next). 32-bit rows: a forward's virtual rows fit 31 bits (create
 * checks the worst case at T_max), and so do the ring's. */
MM_DEVICE void mm_fused_pull(const mm_layer_view& L, const mm_fused_cta& c, int gw, int nw) {
  static_assert(MM_FUSED_BLOCK_ROWS % MM_FUSED_PULL_CHUNK == 0, "a chunk stays inside one block");
  const int lane = threadIdx.x & 31;
  const mm_fused_stream* s = c.s;
  const int chunks = (int)s->blocks * (MM_FUSED_BLOCK_ROWS / MM_FUSED_PULL_CHUNK);
  const int ring_rows = s->order.ring_blocks * MM_FUSED_BLOCK_ROWS;
  int guarded = -1; /* the last block whose slot this warp found free */
  /* The rows before mm_fused_prologue_rows were pulled by the whole grid. */
  for (int k = mm_fused_prologue_rows(s) / MM_FUSED_PULL_CHUNK + gw; k < chunks; k += nw) {
    const int r0 = k * MM_FUSED_PULL_CHUNK;
    const int b = r0 / MM_FUSED_BLOCK_ROWS;
    const int e = mm_fused_find(s->block_start, s->experts, b);
    /* Valid rows of the chunk (the rest is the block's padding: never pulled, never counted). */
    const int valid_end = s->block_start[e] * MM_FUSED_BLOCK_ROWS + s->rows[e];
    const int n = min(MM_FUSED_PULL_CHUNK, valid_end - r0);
    if (n <= 0) continue;
    if (b != guarded) {
      const int prev = b - s->order.ring_blocks; /* mm_fused_slot_predecessor */
      if (prev >= 0) {
        int slot_free = 1;
        if (lane == 0) {
          const uint64_t t0 = mm_tl_now(L);
          mm_wait_ctx ctx;
          ctx.status = mm_status(L);
          ctx.timeout_ns = L.timeout_ns;
          ctx.site = MM_SITE_RING_SLOT;
          ctx.abort_flag = c.sm.abort;
          slot_free = mm_wait_counter_geq<false>(
              c.l2_done + prev, (int32_t)mm_fused_counter_target(s, MM_FUSED_L2_DONE, prev), ctx, prev);
          if (!slot_free) *c.sm.abort = 1; /* this CTA's other roles leave too */
          mm_tl_add(L, MM_TL_WAIT_SLOT, mm_tl_now(L) - t0);
          /* The slot's earlier readers include TMA (async proxy) loads,
           * complete before L2_DONE was released; ordered before this
           * warp's generic stores to the slot (docs/FUSED.md Q4). */
          mm_fence_proxy_async_global();
        }
        __syncwarp(); /* lane 0's acquire before every lane's stores */
        if (!__shfl_sync(0xffffffffu, slot_free, 0)) break;
      }
      guarded = b;
    }
    /* mm_fused_ring_row: a chunk never wraps the ring (ring_rows is a
     * multiple of the chunk), so its rows are consecutive there too. */
    const int dst0 = (int)((uint32_t)r0 % (uint32_t)ring_rows);
    mm_pull_rows_to(L, r0, n, e, dst0, ring_rows);
    mm_pull_publish(c.pulled + b, n); /* one release for the chunk's rows */
  }
  if (lane == 0) mm_tl_stamp_latest(L, MM_TL_PULL_END);
}

/* ---- The kernel ------------------------------------------------------------ */
template <class C1, class C2>
__global__ void __launch_bounds__(MM_GEMM_THREADS, 1)
    mm_fused_kernel(const __grid_constant__ CUtensorMap tm_a1, const __grid_constant__ CUtensorMap tm_b1,
                    const __grid_constant__ CUtensorMap tm_sf1, const __grid_constant__ CUtensorMap tm_a2,
                    const __grid_constant__ CUtensorMap tm_b2, const __grid_constant__ CUtensorMap tm_sf2,
                    const __grid_constant__ CUtensorMap tm_out1, const mm_gemm_problem p1, const mm_gemm_problem p2, const mm_gemm_layout lay,
                    const mm_layer_view L, const mm_forward_view F, const mm_fused_order order, const int64_t bound) {
  using P = mm_fused_tiles<C1, C2>;
  using T1 = typename P::T1;
  using T2 = typename P::T2;
  extern __shared__ uint8_t mm_gemm_smem_raw[];
  __shared__ mm_fused_cta ctl;
  const mm_gemm_smem sm = mm_gemm_smem_carve(mm_gemm_smem_raw, lay);
  const int tid = threadIdx.x;
  const int warp = (int)mm_warp_uniform((uint32_t)(tid >> 5)); /* the role branches below: warp-uniform */
  const int lane = tid & 31;
  mm_device_status* st = mm_status(L);
  mm_programmatic_launch_prologue(); /* before any global memory access (megamoe_set_programmatic_launch) */

  /* A-C. Phase A clears the counter bank of forward f + 1, the one forward
   * f - 1 used (finished before this kernel started; nothing of it is read;
   * f, the forward number, is stable for the whole kernel). The pool is
   * virtual: in the single-wave order it must fit the ring (the bound
   * verdict in front makes this the last line against a bug), in the lag
   * order the counters of one bank (the worst case at T_max). */
  /* The task counter and the task list's count of CTAs, zeroed before the
   * routing's first grid barrier; the CTAs count and the producers claim
   * only after the last one. */
  if (order.dynamic_claim && blockIdx.x == 0 && tid < MM_TILE_COUNTERS) mm_ws<int32_t>(L, MM_WS_TILE_COUNTERS)[tid] = 0;
  {
    const uint64_t fwd = mm_forward_number(st);
    mm_route_hooks h;
    h.clear = mm_ws<int32_t>(L, MM_WS_BLOCK_COUNTERS) + mm_fused_counter_index(L.virtual_blocks, fwd + 1, 0, 0);
    h.clear_count = MM_FUSED_COUNTERS * L.virtual_blocks; /* < 2^31: virtual blocks < 2^31 / 128 (create) */
    h.capacity = (order.single_wave ? order.ring_blocks : L.virtual_blocks) * MM_FUSED_BLOCK_ROWS;
    h.capacity_site = MM_SITE_RING;
    h.has_call = 1;
    h.call = mm_call_tokens{F.num_tokens, bound};
    static_assert(T1::kStageA >= (64 + MM_ROUTE_KEEP_MAX) * 4, "the routing's scratch: stage 0 of A");
    if (!mm_route_phases(L, F, h, reinterpret_cast<int*>(sm.a_ptr))) {
      mm_forward_end(L); /* every CTA once, whatever happened */
      return;
    }
  }

  /* D. The pipeline barriers and the producer warpgroup's context (thread
   * 256, thread 0), the stream (every thread; its closing CTA barrier
   * publishes the barriers' init), a CTA barrier (the context). */
  const uint64_t fwd = mm_forward_number(st);
  int32_t* l1_done = mm_ws<int32_t>(L, MM_WS_BLOCK_COUNTERS) +
                     mm_fused_counter_index(L.virtual_blocks, fwd, MM_FUSED_L1_DONE, 0);
  const mm_fused_stream* s;
  {
    if (tid == 256) {
      mm_tma_prefetch_map(&tm_a1);
      mm_tma_prefetch_map(&tm_b1);
      mm_tma_prefetch_map(&tm_sf1);
      mm_tma_prefetch_map(&tm_a2);
      mm_tma_prefetch_map(&tm_b2);
      mm_tma_prefetch_map(&tm_sf2);
      if (p1.swiglu.tma_out) mm_tma_prefetch_map(&tm_out1);
      mm_gemm_init_barriers(sm, MM_FUSED_COPY_THREADS, MM_FUSED_TASK_READERS);
    }
    uint8_t* stream_smem = sm.sched + (uint32_t)C2::BM * 8u; /* after the copy warps' row destinations */
    s = mm_fused_stream_build_cta(stream_smem, mm_ws<int32_t>(L, MM_WS_POOL_COUNT), order, L.local_experts, C1::BM,
                                  C2::BM, p1.n / C1::BN, p2.n / C2::BN);
    if (tid == 0) mm_tl_stamp(L, MM_TL_STREAM_BUILT);
    /* The tasks decoded ahead, one per thread: with the dynamic claim this
     * CTA's share of the stream's task list (tasks blockIdx.x + k gridDim.x,
     * every k; the CTA barrier below publishes them to the grid), else the
     * CTA's first tasks in the stride order for its own producer
     * (MM_FUSED_TASK_CACHE; the barrier below publishes them). */
    uint64_t* cache = reinterpret_cast<uint64_t*>(sm.sched + mm_fused_task_cache_offset<C2>(L.local_experts));
    const int cache_n = (int)mm_fused_task_cache_entries<C1, C2>(L.local_experts);
    uint64_t* list = mm_ws<uint64_t>(L, MM_WS_TASK_LIST);
    int32_t* list_written = mm_ws<int32_t>(L, MM_WS_TILE_COUNTERS) + 1;
    const int64_t list_n = min(s->tasks, mm_fused_task_list_entries(L.virtual_blocks, L.hidden, L.intermediate));
    const int64_t ahead = order.dynamic_claim ? INT64_MAX : cache_n; /* the k of this CTA's tasks decoded */
    const int64_t decoded_n = order.dynamic_claim ? list_n : s->tasks;
    for (int64_t k = tid; k < ahead; k += MM_GEMM_THREADS) {
      const int64_t t = blockIdx.x + k * gridDim.x;
      if (t >= decoded_n) break;
      mm_fused_task task;
      mm_fused_task_at(s, t, &task);
      (order.dynamic_claim ? list[t] : cache[k]) = mm_fused_task_pack(&task);
    }
    if (tid == 0) mm_tl_stamp(L, MM_TL_TASKS_DECODED);
    int32_t* counters = mm_ws<int32_t>(L, MM_WS_BLOCK_COUNTERS);
    /* Every warp pulls the first rows now, ahead of the roles (the math
     * warps would only wait for them). */
    if (!mm_failed(st))
      mm_fused_pull_prologue(L, s, counters + mm_fused_counter_index(L.virtual_blocks, fwd, MM_FUSED_PULLED, 0));
    if (tid == 0) {
      ctl.sm = sm;
      ctl.s = s;
      ctl.pulled = counters + mm_fused_counter_index(L.virtual_blocks, fwd, MM_FUSED_PULLED, 0);
      ctl.l1_done = l1_done;
      ctl.l2_done = counters + mm_fused_counter_index(L.virtual_blocks, fwd, MM_FUSED_L2_DONE, 0);
      ctl.claim = order.dynamic_claim ? mm_ws<int32_t>(L, MM_WS_TILE_COUNTERS) : nullptr;
      ctl.decoded = list_written;
      ctl.list = list;
      ctl.list_n = list_n;
      ctl.cache = order.dynamic_claim ? nullptr : cache;
      ctl.cache_n = (uint32_t)cache_n;
    }
    /* With the dynamic claim, also this CTA's share of the list to the grid
     * (every thread's stores, then thread 0's release). */
    if (order.dynamic_claim) mm_cta_publish_add<false, false>(list_written, 1);
    else __syncthreads();
    if (tid == 0) mm_tl_stamp(L, MM_TL_ROLES);
  }
  if (warp >= 8) {
    /* setmaxnreg moves registers inside the CTA's pool (168 x 384 at launch):
     * the math warpgroups' MM_FUSED_MATH_REGS need exactly what
     * MM_FUSED_PRODUCER_REGS here frees. */
    mm_setmaxnreg_dec<MM_FUSED_PRODUCER_REGS>();
    mm_fused_role_ctx();
    if (warp == MM_FUSED_PRODUCER_WARP) {
      if (lane == 0) mm_fused_produce<T1, T2>(L, ctl, &tm_a1, &tm_b1, &tm_sf1, &tm_a2, &tm_b2, &tm_sf2, p1, p2);
    } else if (warp < MM_FUSED_PULL_WARP0) {
      mm_fused_copy<T2>(L, ctl, p2, tid - 32 * MM_FUSED_COPY_WARP0);
    } else if (!mm_failed(st)) {
      mm_fused_pull(L, ctl, blockIdx.x * MM_FUSED_PULL_WARPS + (warp - MM_FUSED_PULL_WARP0),
                    gridDim.x * MM_FUSED_PULL_WARPS);
    }
    /* The registers come back only when the math warpgroups give theirs up
     * (the pull warps finish long before the GEMMs). */
    mm_gemm_tail_regs_producer();
  } else {
    mm_gemm_math_regs_take<MM_FUSED_MATH_REGS>();
    mm_fused_math<T1, T2>(L, ctl, sm, s, p1, p2, &tm_out1, warp >> 2);
    /* An L1 store still reading shared memory (the loop may have left on a
     * vote, with L1_DONE unpublished) completes before the CTA ends. */
    if (tid == 0) mm_bulk_wait_group<0>();
    mm_gemm_tail_regs_math();
  }

  /* E. Barrier 1 and the reduction (route/route_phases.cuh). */
  mm_persistent_combine_tail(L, F, warp, MM_GEMM_THREADS / 32);
}

#endif
