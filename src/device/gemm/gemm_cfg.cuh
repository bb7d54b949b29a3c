/* Tile configuration, shared-memory carve-out and barrier init of the wgmma
 * GEMM engine.
 *
 * ---- Roles and threads --------------------------------------------------------
 * 384 threads, __launch_bounds__(384, 1):
 *   warpgroups 0, 1: math (setmaxnreg.inc to MM_GEMM_MATH_REGS);
 *   warpgroup 2:     producer (setmaxnreg.dec to MM_GEMM_PRODUCER_REGS); one
 *                    thread (warp 8, lane 0) waits for the A rows (when the
 *                    problem has rows-ready counters) and issues every TMA load.
 *
 * ---- Tiles (compile time) --------------------------------------------------------
 * A tile is BM rows of one expert x BN columns. kSplitN: the two math
 * warpgroups take BN / 2 columns each (else BM / 2 rows each). A warpgroup
 * computes kWM x kWN "waves" of 64 rows x 128 columns, each one m64n128k32
 * wgmma chain per 32-wide K slice. kTwoParts (one wave per warpgroup only):
 * two partial accumulators, so the next K block's chain is in flight while the
 * previous block is promoted (gemm_mainloop.cuh). kPromo: A-scale blocks per
 * 128-wide K block (1 for a_sf_block 128, 2 for 64). kStaging: a BM x BN bf16
 * staging area for the TMA-store and scatter epilogues; kSwStage: a BM x
 * BN / 2 byte one for the SwiGLU epilogue's fp8 codes.
 *
 * ---- Shared memory (runtime layout, mm_gemm_layout_make) -------------------
 * The base is aligned up to 1024 bytes, then:
 *   staging    BM x BN x 2 B          (kStaging only) 128-byte-swizzled boxes of 64 columns
 *              BM x BN / 2 B          (kSwStage only) one 128-byte-swizzled box of fp8 codes
 *   A stages   stages x BM x 128 B    TMA, 128-byte swizzle
 *   B stages   stages x BN x 128 B    TMA, 128-byte swizzle
 *   SF stages  stages x kPromo x BM x 4  TMA, A scales of the stage's K block
 *   full[stages], empty[stages]       mbarriers
 *   xwg        2 x BM x 4 B           amax exchange between the math warpgroups
 *   abort      16 B                   set by a role that gives up (the others leave)
 *   scheduler  the scheduler's arrays (size for the problem's expert count)
 * stages = as many as fit (at most 8): a runtime number, so a problem with
 * many experts trades a stage for its scheduler arrays instead of failing. */
#ifndef MEGAMOE_GEMM_CFG_CUH
#define MEGAMOE_GEMM_CFG_CUH

#include <stdint.h>

#include "contract.h"
#include "gemm/gemm.h"

#define MM_GEMM_THREADS 384
#define MM_GEMM_MATH_THREADS 256
/* Warps 9-11 of the producer warpgroup (warp 8 issues the TMA loads): the
 * split arm's pull (kernel 1) and copy warps (kernel 2). */
#define MM_GEMM_AUX_WARP0 9
#define MM_GEMM_COPY_THREADS 96
/* setmaxnreg moves registers within the CTA's pool, 168 x 384 at launch:
 * 2 x 128 x 232 + 128 x 40 = 64512 exactly. A warpgroup whose increase does
 * not fit waits forever, so these three numbers go together. */
#define MM_GEMM_MATH_REGS 232
#define MM_GEMM_PRODUCER_REGS 40
/* Registers of every warp once the roles are done (an arm's tail that the
 * whole CTA runs: barriers, reduction): the launch's 168, so the math
 * warpgroups' decrease frees exactly what the producer warpgroup's increase
 * takes, which must therefore wait for that decrease
 * (mm_gemm_tail_regs_producer, gemm_mainloop.cuh). */
#define MM_GEMM_TAIL_REGS 168
static_assert(2 * 128 * MM_GEMM_MATH_REGS + 128 * MM_GEMM_PRODUCER_REGS <= MM_GEMM_TAIL_REGS * 384, "setmaxnreg budget");
#define MM_GEMM_BLOCK_K 128
#define MM_GEMM_SMEM_LIMIT 232448 /* 227 KB: Hopper's per-block opt-in maximum */
#define MM_GEMM_MAX_STAGES 8
#define MM_GEMM_MIN_STAGES 2
#define MM_GEMM_GROUP_ROWS 2048 /* rows of A per scheduler m-group (L2 reuse) */

template <int BM_, int BN_, bool kSplitN_, bool kTwoParts_, int kPromo_, bool kStaging_, bool kNoScale_ = false,
          bool kSwStage_ = false>
struct mm_gemm_cfg {
  /* kNoScale (diagnostic tile only): no promotion, the chains accumulate
   * straight into acc across K blocks, the way a per-tensor-scaled GEMM
   * runs; the output ignores the scales (wrong by design), the time shows
   * what the promotion costs. */
  static constexpr bool kNoScale = kNoScale_;
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr bool kSplitN = kSplitN_;
  static constexpr bool kTwoParts = kTwoParts_;
  static constexpr int kPromo = kPromo_;
  static constexpr bool kStaging = kStaging_;
  /* kSwStage: a BM x 128-byte staging area for the SwiGLU epilogue's fp8
   * codes, stored by TMA (gemm_epilogue.cuh); 256-wide tiles only (one
   * 128-column output group per row). */
  static constexpr bool kSwStage = kSwStage_;
  static constexpr int kWM = kSplitN ? BM / 64 : BM / 128;  /* waves along M per warpgroup */
  static constexpr int kWN = kSplitN ? BN / 256 : BN / 128; /* waves along N per warpgroup */
  static constexpr int kWaves = kWM * kWN;
  static constexpr int kWgRows = kSplitN ? BM : BM / 2;     /* rows a warpgroup covers */
  static constexpr int kWgCols = kSplitN ? BN / 2 : BN;     /* columns a warpgroup covers */
  static constexpr int kK32PerPromo = 4 / kPromo;           /* k32 wgmmas per scale block */
  static constexpr uint32_t kStageA = BM * MM_GEMM_BLOCK_K;
  static constexpr uint32_t kStageB = BN * MM_GEMM_BLOCK_K;
  static constexpr uint32_t kStageSF = kPromo * BM * 4;
  static constexpr uint32_t kTxBytes = kStageA + kStageB + kStageSF;
  static constexpr uint32_t kStagingBytes = kStaging ? (uint32_t)BM * BN * 2 : kSwStage ? (uint32_t)BM * BN / 2 : 0;
  static constexpr int kGroupM = MM_GEMM_GROUP_ROWS / BM;   /* m-tiles per scheduler group */
  /* Where stage s of each operand sits (bytes from stage 0) and how many A
   * rows one TMA load brings. The engine's own kernels keep each operand's
   * stages contiguous and load a tile's A rows in one box. The fused arm
   * (device/fused/) runs two tile shapes over one pipeline: its tile types
   * derive from this one and override these (mm_fused_tile): stages as large
   * as the larger image, and A loaded per 128-row ring block (a 256-row tile
   * spans two blocks whose ring slots need not be adjacent; tile_info's
   * a_row1 / out_row1 then name the second block's rows). */
  static constexpr uint32_t kStrideA = kStageA;
  static constexpr uint32_t kStrideB = kStageB;
  static constexpr uint32_t kStrideSF = kStageSF;
  static constexpr int kABoxRows = BM;
  /* kBScale128: the problem's B scales are per 128 columns (b_sf_block_n
   * 128), known at compile time, so a wave's two 64-column halves share one
   * scale and its loads: a type whose launcher checks b_sf_block_n sets it
   * (the fused kernel's L2 tile, W2's scales; the engine's kernels take 64
   * or 128 at run time). */
  static constexpr bool kBScale128 = false;

  static_assert(BM == 64 || BM == 128 || BM == 256, "BM");
  static_assert(BN == 128 || BN == 256, "BN");
  static_assert(kWM >= 1 && kWN >= 1 && kWM * 64 == kWgRows && kWN * 128 == kWgCols, "waves");
  static_assert(!kTwoParts || kWaves == 1, "two partial accumulators need one wave per warpgroup");
  static_assert(kPromo == 1 || kPromo == 2, "kPromo");
  static_assert(!kSwStage || (BN == 256 && !kStaging), "the SwiGLU staging area: 256-wide tiles, 128-byte rows");
  static_assert(kStageA % 1024 == 0 && kStageB % 1024 == 0, "swizzle alignment");
  static_assert(kStageSF % 128 == 0, "TMA destination alignment");
  static_assert(kTxBytes < (1u << 20), "mbarrier tx-count range");
};

/* The CTA's control block: the abort word at 0, the staging hand-off
 * barriers (copy_full at 8, copy_empty at 16) of an epilogue whose stores
 * other warps make (mm_gemm_copy_loop); the tile-id ring of a dynamically
 * scheduled GEMM (gemm_dynamic.cuh): MM_GEMM_TILE_RING ids at 32, their
 * full barriers at 64, their empty barriers at 96. */
#define MM_GEMM_TILE_RING 4
#define MM_GEMM_CTRL_BYTES 128u

static inline __host__ __device__ uint32_t mm_align_up_u32(uint32_t v, uint32_t a) { return (v + a - 1) / a * a; }

/* Layout for a config with the given stage/staging sizes and sched_bytes of
 * scheduler arrays; stages = 0 when not even MM_GEMM_MIN_STAGES fit. */
static inline __host__ __device__ mm_gemm_layout mm_gemm_layout_make(uint32_t stage_a, uint32_t stage_b,
                                                                     uint32_t stage_sf, uint32_t staging,
                                                                     uint32_t bm, uint32_t sched_bytes,
                                                                     uint32_t max_stages) {
  mm_gemm_layout L;
  const uint32_t tx = stage_a + stage_b + stage_sf;
  const uint32_t fixed = 1024 /* base alignment slack */ + staging + 2 * bm * 4 + MM_GEMM_CTRL_BYTES + sched_bytes +
                         256 /* static shared memory of device helpers (grid barrier) */;
  uint32_t stages = 0;
  if (fixed < MM_GEMM_SMEM_LIMIT) stages = (MM_GEMM_SMEM_LIMIT - fixed) / (tx + 16);
  if (stages > max_stages) stages = max_stages;
  if (stages < MM_GEMM_MIN_STAGES) stages = 0;
  const uint32_t s = stages ? stages : 1;
  L.stages = stages;
  L.off_a = staging;
  L.off_b = L.off_a + s * stage_a;
  L.off_sf = L.off_b + s * stage_b;
  L.off_full = mm_align_up_u32(L.off_sf + s * stage_sf, 8);
  L.off_empty = L.off_full + 8 * s;
  L.off_xwg = mm_align_up_u32(L.off_empty + 8 * s, 16);
  L.off_abort = L.off_xwg + 2 * bm * 4;
  L.off_sched = mm_align_up_u32(L.off_abort + MM_GEMM_CTRL_BYTES, 16);
  L.bytes = 1024 + L.off_sched + sched_bytes;
  return L;
}

template <class Cfg>
static inline __host__ __device__ mm_gemm_layout mm_gemm_layout_for(uint32_t sched_bytes, uint32_t max_stages) {
  return mm_gemm_layout_make(Cfg::kStageA, Cfg::kStageB, Cfg::kStageSF, Cfg::kStagingBytes, Cfg::BM, sched_bytes,
                             max_stages);
}

#ifdef __CUDACC__
#include "common.cuh"
#include "ptx/mbarrier.cuh"

/* Shared-window addresses and pointers of one CTA's layout. */
struct mm_gemm_smem {
  uint32_t a, b, sf, d;     /* shared-window addresses of stage 0 / the staging area */
  uint32_t full, empty;     /* barrier 0 of each kind */
  uint32_t stages;
  const float* sf_ptr;      /* generic pointer to the SF stages */
  const uint8_t* d_ptr;     /* generic pointer to the staging area */
  uint8_t* a_ptr;           /* generic pointer to stage 0 of A (an arm's scratch before the pipeline starts) */
  float* xwg;               /* [2][BM] */
  volatile int32_t* abort;  /* non-zero: a role gave up */
  uint32_t copy_full;       /* the staging area holds a tile for the copy warps (256 arrivals) */
  uint32_t copy_empty;      /* the copy warps are done reading it (MM_GEMM_COPY_THREADS arrivals) */
  volatile int32_t* tile_ids; /* [MM_GEMM_TILE_RING] tiles the producer claimed (-1: none left) */
  uint32_t tile_full;       /* barrier 0 of the ids' full barriers (1 arrival: the producer) */
  uint32_t tile_empty;      /* barrier 0 of the ids' empty barriers (one arrival per reading warp) */
  uint8_t* sched;           /* the scheduler's arrays */
};

MM_DEVICE mm_gemm_smem mm_gemm_smem_carve(uint8_t* raw, const mm_gemm_layout& L) {
  const uint32_t raw_addr = mm_smem_addr(raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  uint8_t* base = raw + pad;
  const uint32_t addr = raw_addr + pad;
  mm_gemm_smem sm;
  sm.d = addr;
  sm.a = addr + L.off_a;
  sm.b = addr + L.off_b;
  sm.sf = addr + L.off_sf;
  sm.full = addr + L.off_full;
  sm.empty = addr + L.off_empty;
  sm.stages = L.stages;
  sm.sf_ptr = reinterpret_cast<const float*>(base + L.off_sf);
  sm.d_ptr = base;
  sm.a_ptr = base + L.off_a;
  sm.xwg = reinterpret_cast<float*>(base + L.off_xwg);
  sm.abort = reinterpret_cast<volatile int32_t*>(base + L.off_abort);
  sm.copy_full = addr + L.off_abort + 8;
  sm.copy_empty = addr + L.off_abort + 16;
  sm.tile_ids = reinterpret_cast<volatile int32_t*>(base + L.off_abort + 32);
  sm.tile_full = addr + L.off_abort + 64;
  sm.tile_empty = addr + L.off_abort + 96;
  sm.sched = base + L.off_sched;
  return sm;
}

/* One thread; a CTA barrier must follow before any use. full: one arrival
 * (the producer's expect_tx) plus the TMA bytes; empty: one arrival per math
 * warp (8); copy_empty: one per copy thread (the kernel's copy warps).
 * tile_ring_readers: the warps that read each claimed tile id (a dynamically
 * scheduled GEMM; 8 math warps, plus the copy warps if any). */
MM_DEVICE void mm_gemm_init_barriers(const mm_gemm_smem& sm, uint32_t copy_threads = MM_GEMM_COPY_THREADS,
                                     int tile_ring_readers = 8) {
  for (int i = 0; i < MM_GEMM_TILE_RING; ++i) {
    mm_mbar_init(sm.tile_full + 8 * i, 1);
    mm_mbar_init(sm.tile_empty + 8 * i, (uint32_t)tile_ring_readers);
  }
  for (uint32_t s = 0; s < sm.stages; ++s) {
    mm_mbar_init(sm.full + 8 * s, 1);
    mm_mbar_init(sm.empty + 8 * s, 8);
  }
  mm_mbar_init(sm.copy_full, MM_GEMM_MATH_THREADS);
  mm_mbar_init(sm.copy_empty, copy_threads);
  *sm.abort = 0;
  mm_fence_mbar_init();
}
#endif /* __CUDACC__ */

#endif
