/* The Hopper FP8 GEMM engine: block-scaled grouped GEMM over the expert-major
 * pool on TMA + mbarrier + wgmma (issue 4). Device functions that a kernel of
 * its own (the split and fused arms) can call, plus the host entry points of
 * the whole-kernel launcher (gemm_wgmma.cu).
 *
 * ---- What it computes (contract.h, mm_gemm_problem) --------------------------
 * D[rows of expert e] = A[rows of e] * B[e]^T with fp32 accumulation promoted
 * per K block: every 128-wide K block (64-wide half when a_sf_block = 64) goes
 * into a fresh wgmma accumulator `part`, then acc += part * (sa[row] * sb[col]),
 * the contract's h = sum_kb sa * sb * S_kb. Outputs: fp32, bf16 (round to
 * nearest even), or the SwiGLU + FP8 quantization epilogue of the L1 GEMM.
 * Only rows below expert_count[e] are written.
 *
 * ---- Roles and threads --------------------------------------------------------
 * 384 threads, __launch_bounds__(384, 1):
 *   warpgroups 0, 1: math (setmaxnreg.inc to MM_GEMM_MATH_REGS), each owns
 *                    a fixed part of every tile (below);
 *   warpgroup 2:     producer (setmaxnreg.dec to MM_GEMM_PRODUCER_REGS); one
 *                    thread (warp 8, lane 0) issues all TMA loads, the other
 *                    127 threads have nothing to do.
 *
 * ---- Tiles ---------------------------------------------------------------------
 * A tile is BM rows of one expert x BN columns. Each math warpgroup computes
 * kWM x kWN "waves" of 64 rows x 128 columns (one m64n128k32 wgmma chain each):
 *   mm_gemm_tile         BM x BN   warpgroup split   waves per warpgroup
 *   MM_GEMM_TILE_128x256 128 x 256 rows (64 each)    1 x 2   (SwiGLU G = 128 needs this one)
 *   MM_GEMM_TILE_256x128 256 x 128 rows (128 each)   2 x 1
 *   MM_GEMM_TILE_128x128 128 x 128 rows (64 each)    1 x 1
 *   MM_GEMM_TILE_64x256   64 x 256 columns (128 each) 1 x 1  (decode sizes)
 *   ..._SKEW ("128x256s", "256x128s", "128x128s"): the same tiles, skewed
 *   schedule; ..._SKEW_TMA ("128x256t", "256x128t", "128x128t"): skewed plus
 *   the TMA-store bf16 epilogue (kStages 3, 3, 5).
 * A wave whose 64 rows are all past the expert's count skips its wgmmas. The
 * K block is 128 (one 128-byte swizzle row of fp8 per tile row).
 *
 * ---- Shared memory (mm_gemm_cfg; base aligned up to 1024 bytes) ------------
 *   D staging  kEpiSmem = BM x BN x 2 B   (TMA-store tiles only; else absent)
 *   A stages   kStages x BM x 128 B       TMA, 128-byte swizzle
 *   B stages   kStages x BN x 128 B       TMA, 128-byte swizzle
 *   SF stages  kStages x kPromo x BM x 4  TMA, A scales of the stage's K block
 *                                          (kPromo = 128 / a_sf_block rows)
 *   full[kStages], empty[kStages]         mbarriers (8 B each)
 *   scheduler  (3 E + 1) x 4 B            mm_gemm_sched
 * kStages is as many as fit in 227 KB with 16 KB kept for the scheduler (E <=
 * 1024): 4 for 128x256 / 256x128, 6 for 128x128, 5 for 64x256.
 *
 * ---- Barrier protocol ----------------------------------------------------------
 * A ring of kStages stages; (stage, phase) advance together in producer and
 * consumers (mm_gemm_pipe), which walk the same tile sequence, K block by K
 * block, across tiles.
 *   full[s]:  count 1. The producer thread waits empty[s] (parity phase ^ 1),
 *             arrives with expect_tx(kTxBytes), then issues the A, B and A-scale
 *             TMA loads of the K block, which complete the transaction bytes.
 *   empty[s]: count 8 (lane 0 of each of the 8 math warps). Each math warp waits
 *             full[s] (parity phase), reads its A scales from the stage, runs
 *             and waits (wgmma.wait_group 0) all of its wgmmas on the stage,
 *             then arrives. A warp arrives on every stage even when all of its
 *             waves are skipped.
 * No generic-proxy writes to the stages exist, so no proxy fence is needed.
 *
 * ---- Tile scheduler (mm_gemm_sched) --------------------------------------------
 * Static and deterministic, computed on the device by every CTA from
 * expert_offset / expert_count (device memory; the host never syncs): the
 * prefix of tiles per expert in shared memory, then tile t = blockIdx.x,
 * + gridDim.x, ... . Inside an expert, m-tiles come in groups of
 * kGroupRows / BM; within a group the m-tile index runs fastest, then the
 * n-tile: consecutive CTAs share the same B (weight) tile in L2, and the A rows
 * of a group (2048 rows) stay in L2 while every n-tile passes over them.
 * Defensive clamps: an expert's valid rows are clamped to
 * [0, min(offset[e+1], rows_cap) - offset[e]].
 *
 * ---- Device functions (all inline, templated on the compile-time tile) -----
 *   mm_gemm_smem_carve<Cfg>(raw)          pointers of the layout above
 *   mm_gemm_init_barriers<Cfg>(sm)        one thread, then a CTA barrier
 *   mm_gemm_sched_build(...)              all threads of the CTA, then a CTA barrier
 *   mm_gemm_sched_tile(...)               decode tile t (cursor over experts)
 *   mm_gemm_produce_tile<Cfg>(...)        producer thread: the K loop of one tile
 *   mm_gemm_consume_tile<Cfg>(...)        math warpgroup: the K loop of one tile
 *                                          into acc[kWaves][64] (registers)
 *   mm_gemm_epilogue_store<Cfg, bf16>(...)  math warpgroup: fp32 / bf16 D from acc
 *   mm_gemm_epilogue_swiglu<Cfg>(...)       math warpgroup: SwiGLU + FP8 from acc
 *   mm_gemm_wgmma_kernel<Cfg, kOut>         the whole persistent kernel, as a
 *                                           template of how to combine them
 * Skewed schedule (tiles *_SKEW, *_SKEW_TMA; section at the end of the file):
 *   mm_gemm_consume_tile_skew<Cfg>(...)     math warpgroup: the K loop, chains
 *                                           issued in turns with the other
 *                                           warpgroup (named barriers 1, 2)
 *   mm_gemm_epilogue_tma_bf16<Cfg>(...)     both math warpgroups: bf16 full
 *                                           tile via stmatrix + TMA store
 *                                           (named barrier 3)
 *   mm_gemm_wgmma_skew_kernel<Cfg, kOut, kTmaStore>
 * A kernel of its own can use another shared-memory layout: the device
 * functions only need an mm_gemm_smem (stage and barrier addresses, the
 * scheduler arrays) and an mm_gemm_pipe per role, advanced identically.
 * Output stores are plain st.global from the accumulator fragment, masked to
 * valid rows; the epilogues use no shared memory and no CTA-wide barrier
 * (each math warpgroup stores its own part of the tile). The exception is
 * mm_gemm_epilogue_tma_bf16 (full tiles only, staging area at the start of
 * shared memory when Cfg::kEpiSmem > 0).
 *
 * ---- Numerics ------------------------------------------------------------------
 * acc = fma(part, sa * sb, acc) per (promotion block, wave), in K order; the
 * wgmma chain inside a block accumulates in the tensor cores' fp32. bf16:
 * round to nearest even. SwiGLU: common.cuh's mm_swiglu (clamp, then
 * g / (1 + expf(-g)) * u), times the row weight, sf = mm_group_scale(amax)
 * = max(amax, 1e-10f) / 448, q = e4m3 satfinite of a / sf (IEEE division).
 */
#ifndef MEGAMOE_GEMM_WGMMA_CUH
#define MEGAMOE_GEMM_WGMMA_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "contract.h"
#include "gemm/gemm.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tile shapes of the engine (host-visible, for tests and benchmarks). */
typedef enum mm_gemm_tile {
  MM_GEMM_TILE_AUTO = 0,   /* the launcher's heuristic */
  MM_GEMM_TILE_128x256 = 1,
  MM_GEMM_TILE_256x128 = 2,
  MM_GEMM_TILE_128x128 = 3,
  MM_GEMM_TILE_64x256 = 4,
  /* The same tiles with the skewed ("turn-taking") math schedule: the two
   * math warpgroups issue their wgmma chains alternately, so one's wait and
   * promotion overlap the other's chain on the tensor cores (see the device
   * section). Same numerics, same outputs. */
  MM_GEMM_TILE_128x256_SKEW = 5,     /* "128x256s" */
  MM_GEMM_TILE_256x128_SKEW = 6,     /* "256x128s" */
  MM_GEMM_TILE_128x128_SKEW = 7,     /* "128x128s" */
  /* Skewed, plus the bf16 epilogue through shared memory and TMA stores for
   * full tiles (one stage fewer; fp32 and SwiGLU outputs, partial tiles and
   * a d not 16-byte aligned use the direct stores of the skewed tile). */
  MM_GEMM_TILE_128x256_SKEW_TMA = 8, /* "128x256t" */
  MM_GEMM_TILE_256x128_SKEW_TMA = 9, /* "256x128t" */
  MM_GEMM_TILE_128x128_SKEW_TMA = 10, /* "128x128t" */
  MM_GEMM_TILE_COUNT
} mm_gemm_tile;

const char* mm_gemm_tile_name(mm_gemm_tile tile);

/* Columns of a tile (its BN): n must be a multiple of it. 0 for AUTO or an
 * unknown tile. */
int mm_gemm_tile_width(mm_gemm_tile tile);

/* The tile mm_gemm_wgmma picks for this problem (never AUTO). */
mm_gemm_tile mm_gemm_wgmma_pick_tile(const mm_gemm_problem* p, mm_gemm_output out,
                                     const mm_swiglu_epilogue* swiglu);

/* mm_gemm_wgmma with a forced tile. SWIGLU_FP8 with group 128 needs a
 * 128x256 tile (MM_GEMM_TILE_128x256, _SKEW or _SKEW_TMA;
 * MEGAMOE_ERR_BAD_ARGUMENT otherwise). */
megamoe_status mm_gemm_wgmma_tiled(const mm_gemm_problem* p, mm_gemm_output out, void* d,
                                   const mm_swiglu_epilogue* swiglu, mm_gemm_tile tile,
                                   cudaStream_t stream);

#ifdef __cplusplus
}
#endif

/* ======================= device side (CUDA only) =========================== */
#ifdef __CUDACC__

#include <cuda.h>

#include "common.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/stmatrix.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

#define MM_GEMM_THREADS 384
#define MM_GEMM_MATH_REGS 232
#define MM_GEMM_PRODUCER_REGS 40
#define MM_GEMM_BLOCK_K 128
#define MM_GEMM_SMEM_LIMIT 232448       /* 227 KB: Hopper's per-block opt-in maximum */
#define MM_GEMM_SCHED_RESERVE 16384     /* scheduler arrays, E <= 1024 */
#define MM_GEMM_MAX_EXPERTS 1024
#define MM_GEMM_SCHED_RESERVE_SMALL 4096 /* with an output staging area (sizes kStages only; the
                                            launcher checks the real size for E) */
#define MM_GEMM_GROUP_ROWS 2048         /* rows of A per scheduler m-group */

enum { MM_GEMM_OUT_KIND_F32 = 0, MM_GEMM_OUT_KIND_BF16 = 1, MM_GEMM_OUT_KIND_SWIGLU = 2 };

/* Compile-time tile configuration. kSplitN: the two math warpgroups split
 * the tile's columns (else its rows). kPromo: A-scale blocks per 128-K block
 * (1 for a_sf_block 128, 2 for 64). kEpiSmem: bytes of an output staging
 * area at the start of the layout (the TMA-store epilogue, BM x BN bf16;
 * 0: none, and the layout is the original one). With staging, kStages is
 * sized with MM_GEMM_SCHED_RESERVE_SMALL for the scheduler arrays, so that a
 * third stage fits; the launcher checks the real size for E (for the tiles
 * of the engine, E up to ~1000 fits). */
template <int BM_, int BN_, bool kSplitN_, int kPromo_, int kEpiSmem_ = 0>
struct mm_gemm_cfg {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr bool kSplitN = kSplitN_;
  static constexpr int kPromo = kPromo_;
  static constexpr uint32_t kEpiSmem = (uint32_t)kEpiSmem_;
  static constexpr uint32_t kSchedReserve = kEpiSmem_ ? MM_GEMM_SCHED_RESERVE_SMALL : MM_GEMM_SCHED_RESERVE;
  static constexpr int kWM = kSplitN ? BM / 64 : BM / 128;   /* waves along M per warpgroup */
  static constexpr int kWN = kSplitN ? BN / 256 : BN / 128;  /* waves along N per warpgroup */
  static constexpr int kWaves = kWM * kWN;
  static constexpr int kWgRows = kSplitN ? BM : BM / 2;      /* rows a warpgroup covers */
  static constexpr int kWgCols = kSplitN ? BN / 2 : BN;      /* columns a warpgroup covers */
  static constexpr int kK32PerPromo = 4 / kPromo;            /* k32 wgmmas per scale block */
  static constexpr uint32_t kStageA = BM * MM_GEMM_BLOCK_K;
  static constexpr uint32_t kStageB = BN * MM_GEMM_BLOCK_K;
  static constexpr uint32_t kStageSF = kPromo * BM * 4;
  static constexpr uint32_t kTxBytes = kStageA + kStageB + kStageSF;
  static constexpr int kStagesFit =
      (int)((MM_GEMM_SMEM_LIMIT - 1024 - kSchedReserve - kEpiSmem) / (kTxBytes + 16));
  static constexpr int kStages = kStagesFit > 8 ? 8 : kStagesFit;
  static constexpr uint32_t kOffD = 0;                       /* staging (kEpiSmem bytes) */
  static constexpr uint32_t kOffA = kEpiSmem;
  static constexpr uint32_t kOffB = kOffA + kStages * kStageA;
  static constexpr uint32_t kOffSF = kOffB + kStages * kStageB;
  static constexpr uint32_t kOffBar = kOffSF + kStages * kStageSF;
  static constexpr uint32_t kOffSched = kOffBar + 2 * kStages * 8;
  static constexpr int kGroupM = MM_GEMM_GROUP_ROWS / BM;    /* m-tiles per scheduler group */

  static_assert(BM == 64 || BM == 128 || BM == 256, "BM");
  static_assert(BN == 128 || BN == 256, "BN");
  static_assert(kWM >= 1 && kWN >= 1 && kWM * 64 == kWgRows && kWN * 128 == kWgCols, "waves");
  static_assert(kPromo == 1 || kPromo == 2, "kPromo");
  static_assert(kStages >= 3, "too few pipeline stages");
  static_assert(kStageA % 1024 == 0 && kStageB % 1024 == 0 && kOffSF % 1024 == 0, "swizzle alignment");
  static_assert(kEpiSmem % 1024 == 0 && (kEpiSmem == 0 || kEpiSmem == (uint32_t)BM * BN * 2), "staging size");
  static_assert(kStageSF % 128 == 0, "TMA destination alignment");
  static_assert(kTxBytes < (1u << 20), "mbarrier tx-count range");
};

/* Bytes of dynamic shared memory a kernel of this configuration needs for E experts. */
template <class Cfg>
__host__ __device__ constexpr uint32_t mm_gemm_smem_bytes(int num_experts) {
  return 1024 + Cfg::kOffSched + (uint32_t)(3 * num_experts + 1) * 4u;
}

/* Runtime arguments shared by the roles (device pointers). */
struct mm_gemm_dev_args {
  const float* b_sf;
  const int32_t* expert_offset;
  const int32_t* expert_count;
  int32_t num_experts;
  int32_t rows_cap;
  int32_t n;
  int32_t k;
  int32_t b_sf_block_n;
  void* d;                   /* F32 / BF16 output [rows_cap, n] */
  const float* row_weight;   /* SwiGLU */
  uint8_t* out;              /* SwiGLU [rows_cap, n / 2] fp8 */
  float* out_sf;             /* SwiGLU [n / 2 / group][rows_cap] */
  int32_t group;
  int32_t has_clamp;
  float clamp;
};

/* Scheduler arrays in shared memory. */
struct mm_gemm_sched {
  int32_t* tile_start; /* [E + 1] first tile of each expert (exclusive prefix) */
  int32_t* row_off;    /* [E] first pool row */
  int32_t* valid;      /* [E] valid rows (clamped) */
};

/* Pointers (generic) and shared-window addresses of one CTA's layout. */
struct mm_gemm_smem {
  uint32_t a, b, sf;        /* shared-window addresses of stage 0 */
  uint32_t d;               /* output staging (Cfg::kEpiSmem > 0 only) */
  uint32_t full, empty;     /* shared-window address of barrier 0 of each kind */
  const float* sf_ptr;      /* generic pointer to the SF stages */
  mm_gemm_sched sched;
};

/* Pipeline position, identical in producer and consumers. */
struct mm_gemm_pipe {
  uint32_t stage;
  uint32_t phase;
};

template <class Cfg>
__device__ __forceinline__ void mm_gemm_pipe_advance(mm_gemm_pipe& p) {
  if (++p.stage == (uint32_t)Cfg::kStages) {
    p.stage = 0;
    p.phase ^= 1u;
  }
}

/* One decoded tile. */
struct mm_gemm_tile_info {
  int32_t expert;
  int32_t row0;  /* first pool row */
  int32_t rows;  /* valid rows in the tile, 1..BM */
  int32_t n0;    /* first column */
};

template <class Cfg>
__device__ __forceinline__ mm_gemm_smem mm_gemm_smem_carve(uint8_t* raw, int num_experts) {
  const uint32_t raw_addr = mm_smem_addr(raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  uint8_t* base = raw + pad;
  const uint32_t addr = raw_addr + pad;
  mm_gemm_smem sm;
  sm.d = addr + Cfg::kOffD;
  sm.a = addr + Cfg::kOffA;
  sm.b = addr + Cfg::kOffB;
  sm.sf = addr + Cfg::kOffSF;
  sm.full = addr + Cfg::kOffBar;
  sm.empty = addr + Cfg::kOffBar + Cfg::kStages * 8;
  sm.sf_ptr = reinterpret_cast<const float*>(base + Cfg::kOffSF);
  int32_t* sched = reinterpret_cast<int32_t*>(base + Cfg::kOffSched);
  sm.sched.tile_start = sched;
  sm.sched.row_off = sched + num_experts + 1;
  sm.sched.valid = sched + 2 * num_experts + 1;
  return sm;
}

/* One thread; a CTA barrier must follow before any use. */
template <class Cfg>
__device__ __forceinline__ void mm_gemm_init_barriers(const mm_gemm_smem& sm) {
#pragma unroll
  for (int s = 0; s < Cfg::kStages; ++s) {
    mm_mbar_init(sm.full + 8 * s, 1);
    mm_mbar_init(sm.empty + 8 * s, 8);
  }
  mm_fence_mbar_init();
}

/* Builds the tile table: every thread of the CTA calls it (tid, nthreads),
 * then the caller runs a CTA barrier. Uses one extra CTA barrier inside, so
 * all threads must call it. Returns nothing; the total is tile_start[E]. */
__device__ __forceinline__ void mm_gemm_sched_build(const mm_gemm_sched& s, const mm_gemm_dev_args& args,
                                                    int bm, int tiles_n, int tid, int nthreads) {
  const int E = args.num_experts;
  for (int e = tid; e < E; e += nthreads) {
    const int off = __ldg(args.expert_offset + e);
    const int next = __ldg(args.expert_offset + e + 1);
    const int cnt = __ldg(args.expert_count + e);
    int lim = min(next, args.rows_cap) - off;
    if (off < 0 || off >= args.rows_cap) lim = 0;
    const int v = max(0, min(cnt, lim));
    s.row_off[e] = off;
    s.valid[e] = v;
    s.tile_start[e + 1] = (v + bm - 1) / bm * tiles_n;
  }
  __syncthreads();
  if (tid < 32) {
    /* Inclusive scan of tile_start[1..E] by one warp: lane l owns a chunk. */
    const int chunk = (E + 31) / 32;
    const int lo = min(E, tid * chunk), hi = min(E, lo + chunk);
    int sum = 0;
    for (int e = lo; e < hi; ++e) sum += s.tile_start[e + 1];
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, incl, d);
      if (tid >= d) incl += o;
    }
    int run = incl - sum;
    for (int e = lo; e < hi; ++e) {
      run += s.tile_start[e + 1];
      s.tile_start[e + 1] = run;
    }
    if (tid == 0) s.tile_start[0] = 0;
  }
}

/* Decodes tile t (< tile_start[E]); cursor is the caller's expert cursor,
 * starting at 0, for increasing t. */
template <class Cfg>
__device__ __forceinline__ mm_gemm_tile_info mm_gemm_sched_tile(const mm_gemm_sched& s, int t,
                                                                 int& cursor, int tiles_n) {
  while (t >= s.tile_start[cursor + 1]) ++cursor;
  const int e = cursor;
  const int local = t - s.tile_start[e];
  const int v = s.valid[e];
  const int mt = (v + Cfg::BM - 1) / Cfg::BM;
  const int per_group = Cfg::kGroupM * tiles_n;
  const int g = local / per_group;
  const int gsz = min(Cfg::kGroupM, mt - g * Cfg::kGroupM);
  const int r = local - g * per_group;
  const int n_t = r / gsz;
  const int m_t = g * Cfg::kGroupM + (r - n_t * gsz);
  mm_gemm_tile_info ti;
  ti.expert = e;
  ti.row0 = s.row_off[e] + m_t * Cfg::BM;
  ti.rows = min(Cfg::BM, v - m_t * Cfg::BM);
  ti.n0 = n_t * Cfg::BN;
  return ti;
}

/* Producer thread: the K loop of one tile. tm_b rows are expert-major
 * (row = e * n + column). */
template <class Cfg>
__device__ __forceinline__ void mm_gemm_produce_tile(const mm_gemm_smem& sm, mm_gemm_pipe& pipe,
                                                     const CUtensorMap* tm_a, const CUtensorMap* tm_b,
                                                     const CUtensorMap* tm_sfa,
                                                     const mm_gemm_tile_info& ti, int n, int kblocks) {
  const int b_row = ti.expert * n + ti.n0;
  for (int kb = 0; kb < kblocks; ++kb) {
    const uint32_t s = pipe.stage;
    mm_mbar_wait(sm.empty + 8 * s, pipe.phase ^ 1u);
    const uint32_t full = sm.full + 8 * s;
    mm_mbar_arrive_expect_tx(full, Cfg::kTxBytes);
    mm_tma_load_2d(sm.a + s * Cfg::kStageA, tm_a, full, kb * MM_GEMM_BLOCK_K, ti.row0);
    mm_tma_load_2d(sm.b + s * Cfg::kStageB, tm_b, full, kb * MM_GEMM_BLOCK_K, b_row);
    mm_tma_load_2d(sm.sf + s * Cfg::kStageSF, tm_sfa, full, ti.row0, kb * Cfg::kPromo);
    mm_gemm_pipe_advance<Cfg>(pipe);
  }
}

/* Rows / columns of the calling math warpgroup (wg = 0, 1) inside the tile. */
template <class Cfg>
__device__ __forceinline__ int mm_gemm_wg_row0(int wg) {
  return Cfg::kSplitN ? 0 : wg * Cfg::kWgRows;
}
template <class Cfg>
__device__ __forceinline__ int mm_gemm_wg_col0(int wg) {
  return Cfg::kSplitN ? wg * Cfg::kWgCols : 0;
}

/* Math warpgroup: the K loop of one tile. acc[w] (w = wm * kWN + wn) is the
 * promoted fp32 result of wave (wm, wn) in the m64n128 fragment layout
 * (ptx/wgmma.cuh). wg: 0 or 1; every thread of the warpgroup calls it. */
template <class Cfg>
__device__ __forceinline__ void mm_gemm_consume_tile(const mm_gemm_smem& sm, mm_gemm_pipe& pipe,
                                                     const mm_gemm_dev_args& args,
                                                     const mm_gemm_tile_info& ti, int wg,
                                                     float (&acc)[Cfg::kWaves][64]) {
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
  const int kblocks = args.k / MM_GEMM_BLOCK_K;
  const int row_w = mm_gemm_wg_row0<Cfg>(wg);
  const int col_w = mm_gemm_wg_col0<Cfg>(wg);

  bool wave_ok[Cfg::kWM];
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) wave_ok[wm] = row_w + 64 * wm < ti.rows;

#pragma unroll
  for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[w][i] = 0.f;

  /* B scales of the waves: rows of b_sf [E][n / bsn][k / 128] for the
   * first and second 64 columns of each 128-wide wave. */
  const int bsn = args.b_sf_block_n;
  const float* sfb_e = args.b_sf + (int64_t)ti.expert * (args.n / bsn) * kblocks;
  const float* sfb[Cfg::kWN][2];
#pragma unroll
  for (int wn = 0; wn < Cfg::kWN; ++wn)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sfb[wn][h] = sfb_e + (int64_t)((ti.n0 + col_w + 128 * wn + 64 * h) / bsn) * kblocks;

  const uint32_t a_lo0 = mm_wgmma_desc_sw128_lo(sm.a);
  const uint32_t b_lo0 = mm_wgmma_desc_sw128_lo(sm.b);
  const int r_in = warp * 16 + (lane >> 2); /* fragment row of registers i with (i >> 1) & 1 == 0 */

  for (int kb = 0; kb < kblocks; ++kb) {
    const uint32_t s = pipe.stage;
    float sb[Cfg::kWN][2];
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn)
#pragma unroll
      for (int h = 0; h < 2; ++h) sb[wn][h] = __ldg(sfb[wn][h] + kb);

    mm_mbar_wait(sm.full + 8 * s, pipe.phase);

    /* A scales of this warp's rows, read before the stage is released. */
    float sa[Cfg::kWM][Cfg::kPromo][2];
    const float* sf_stage = sm.sf_ptr + s * (Cfg::kStageSF / 4);
#pragma unroll
    for (int wm = 0; wm < Cfg::kWM; ++wm)
#pragma unroll
      for (int h = 0; h < Cfg::kPromo; ++h) {
        const int r = row_w + 64 * wm + r_in;
        sa[wm][h][0] = wave_ok[wm] ? sf_stage[h * Cfg::BM + r] : 0.f;
        sa[wm][h][1] = wave_ok[wm] ? sf_stage[h * Cfg::BM + r + 8] : 0.f;
      }

#pragma unroll
    for (int h = 0; h < Cfg::kPromo; ++h) {
#pragma unroll
      for (int wm = 0; wm < Cfg::kWM; ++wm) {
        if (!wave_ok[wm]) continue;
#pragma unroll
        for (int wn = 0; wn < Cfg::kWN; ++wn) {
          float part[64];
#pragma unroll
          for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
          mm_wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < Cfg::kK32PerPromo; ++kk) {
            const int k32 = h * Cfg::kK32PerPromo + kk;
            const uint32_t a_lo =
                a_lo0 + ((s * Cfg::kStageA + (uint32_t)(row_w + 64 * wm) * 128u + 32u * k32) >> 4);
            const uint32_t b_lo =
                b_lo0 + ((s * Cfg::kStageB + (uint32_t)(col_w + 128 * wn) * 128u + 32u * k32) >> 4);
            mm_wgmma_m64n128k32_e4m3(part, mm_wgmma_desc(a_lo), mm_wgmma_desc(b_lo), kk > 0 ? 1u : 0u);
          }
          mm_wgmma_commit();
#pragma unroll
          for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
          mm_wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);

          /* Promotion: registers i < 32 are the wave's first 64 columns. */
          const float s00 = sa[wm][h][0] * sb[wn][0], s01 = sa[wm][h][0] * sb[wn][1];
          const float s10 = sa[wm][h][1] * sb[wn][0], s11 = sa[wm][h][1] * sb[wn][1];
          float* a = acc[wm * Cfg::kWN + wn];
#pragma unroll
          for (int i = 0; i < 64; ++i) {
            const bool hi_col = i >= 32, hi_row = (i >> 1) & 1;
            const float sc = hi_row ? (hi_col ? s11 : s10) : (hi_col ? s01 : s00);
            a[i] = fmaf(part[i], sc, a[i]);
          }
        }
      }
    }
    /* Every wgmma of this warp on stage s has completed (wait_group 0). */
    if (lane == 0) mm_mbar_arrive(sm.empty + 8 * s);
    mm_gemm_pipe_advance<Cfg>(pipe);
  }
}

/* Fragment coordinates of the calling thread for wave (wm, wn): tile-local
 * row of registers with (i >> 1) & 1 == 0 (the others are 8 rows below), and
 * tile-local column of register 0 (register i adds 8 * (i >> 2) + (i & 1)). */
template <class Cfg>
__device__ __forceinline__ int mm_gemm_frag_row(int wg, int wm) {
  return mm_gemm_wg_row0<Cfg>(wg) + 64 * wm + ((threadIdx.x >> 5) & 3) * 16 + ((threadIdx.x & 31) >> 2);
}
template <class Cfg>
__device__ __forceinline__ int mm_gemm_frag_col(int wg, int wn) {
  return mm_gemm_wg_col0<Cfg>(wg) + 128 * wn + 2 * (threadIdx.x & 3);
}

/* Epilogue: fp32 (kBf16 = false) or bf16 D [rows_cap, n], valid rows only. */
template <class Cfg, bool kBf16>
__device__ __forceinline__ void mm_gemm_epilogue_store(const mm_gemm_dev_args& args,
                                                       const mm_gemm_tile_info& ti, int wg,
                                                       float (&acc)[Cfg::kWaves][64]) {
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) {
    const int r0 = mm_gemm_frag_row<Cfg>(wg, wm);
    const bool ok0 = r0 < ti.rows, ok1 = r0 + 8 < ti.rows;
    const int64_t grow = (int64_t)ti.row0 + r0;
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      const float* a = acc[wm * Cfg::kWN + wn];
      const int64_t col = ti.n0 + mm_gemm_frag_col<Cfg>(wg, wn);
      if (kBf16) {
        uint32_t* d0 = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(args.d) + grow * args.n + col);
        uint32_t* d1 = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(args.d) + (grow + 8) * args.n + col);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (ok0) d0[4 * j] = (uint32_t)mm_float_to_bf16(a[4 * j]) | ((uint32_t)mm_float_to_bf16(a[4 * j + 1]) << 16);
          if (ok1) d1[4 * j] = (uint32_t)mm_float_to_bf16(a[4 * j + 2]) | ((uint32_t)mm_float_to_bf16(a[4 * j + 3]) << 16);
        }
      } else {
        float2* d0 = reinterpret_cast<float2*>(static_cast<float*>(args.d) + grow * args.n + col);
        float2* d1 = reinterpret_cast<float2*>(static_cast<float*>(args.d) + (grow + 8) * args.n + col);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (ok0) d0[4 * j] = make_float2(a[4 * j], a[4 * j + 1]);
          if (ok1) d1[4 * j] = make_float2(a[4 * j + 2], a[4 * j + 3]);
        }
      }
    }
  }
}

/* Epilogue of the L1 GEMM: B is the prepared W1 (MM_W1_INTERLEAVE = 64), so
 * a 128-wide wave holds gate columns in registers i < 32 and the matching up
 * columns in i + 32, for a-columns (n0 + wave column) / 2 + 0..63.
 * a = silu(g) * u * row_weight (clamp first), quantized per args.group
 * a-columns: sf = max(amax, 1e-10) / 448, q = e4m3(a / sf). A group of 64 is
 * one wave; a group of 128 is the two waves of a warpgroup (kWN == 2, the
 * 128x256 tile, whose n0 is a multiple of 256). The row's amax is spread over
 * the 4 threads of a quad (lanes 4q .. 4q + 3). */
template <class Cfg>
__device__ __forceinline__ void mm_gemm_epilogue_swiglu(const mm_gemm_dev_args& args,
                                                        const mm_gemm_tile_info& ti, int wg,
                                                        float (&acc)[Cfg::kWaves][64]) {
  const int inter = args.n / 2;
  const bool pair = Cfg::kWN == 2 && args.group == 128;
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) {
    const int r0 = mm_gemm_frag_row<Cfg>(wg, wm);
    if (mm_gemm_wg_row0<Cfg>(wg) + 64 * wm >= ti.rows) continue; /* whole wave past the count */
    const bool ok0 = r0 < ti.rows, ok1 = r0 + 8 < ti.rows;
    const int64_t grow = (int64_t)ti.row0 + r0;
    const float w0 = ok0 ? __ldg(args.row_weight + grow) : 0.f;
    const float w1 = ok1 ? __ldg(args.row_weight + grow + 8) : 0.f;
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
          const float v0 = mm_swiglu(a[i0], a[i0 + 32], args.has_clamp, args.clamp) * w0;
          const float v1 = mm_swiglu(a[i1], a[i1 + 32], args.has_clamp, args.clamp) * w1;
          a[i0] = v0;
          a[i1] = v1;
          m0 = fmaxf(m0, fabsf(v0));
          m1 = fmaxf(m1, fabsf(v1));
        }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
      }
      amax[wn][0] = m0;
      amax[wn][1] = m1;
    }
    if (pair) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m = fmaxf(amax[0][h], amax[Cfg::kWN - 1][h]);
        amax[0][h] = m;
        amax[Cfg::kWN - 1][h] = m;
      }
    }
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn) {
      const float* a = acc[wm * Cfg::kWN + wn];
      const float sf0 = mm_group_scale(amax[wn][0]);
      const float sf1 = mm_group_scale(amax[wn][1]);
      const int acol0 = (ti.n0 + mm_gemm_wg_col0<Cfg>(wg) + 128 * wn) / 2; /* first a-column of the wave */
      const int acol = acol0 + 2 * (threadIdx.x & 3);
      uint16_t* o0 = reinterpret_cast<uint16_t*>(args.out + grow * inter + acol);
      uint16_t* o1 = reinterpret_cast<uint16_t*>(args.out + (grow + 8) * inter + acol);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (ok0)
          o0[4 * j] = (uint16_t)(mm_float_to_e4m3(a[4 * j] / sf0) |
                                 ((uint32_t)mm_float_to_e4m3(a[4 * j + 1] / sf0) << 8));
        if (ok1)
          o1[4 * j] = (uint16_t)(mm_float_to_e4m3(a[4 * j + 2] / sf1) |
                                 ((uint32_t)mm_float_to_e4m3(a[4 * j + 3] / sf1) << 8));
      }
      if ((threadIdx.x & 3) == 0 && (!pair || wn == 0)) {
        const int64_t gi = acol0 / args.group;
        if (ok0) args.out_sf[gi * args.rows_cap + grow] = sf0;
        if (ok1) args.out_sf[gi * args.rows_cap + grow + 8] = sf1;
      }
    }
  }
}

/* The whole persistent kernel: scheduler, producer, two math warpgroups. */
template <class Cfg, int kOut>
__global__ void __launch_bounds__(MM_GEMM_THREADS, 1)
    mm_gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                         const __grid_constant__ CUtensorMap tm_sfa, const mm_gemm_dev_args args) {
  extern __shared__ uint8_t mm_gemm_smem_raw[];
  const mm_gemm_smem sm = mm_gemm_smem_carve<Cfg>(mm_gemm_smem_raw, args.num_experts);
  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int lane = tid & 31;
  const int tiles_n = args.n / Cfg::BN;
  const int kblocks = args.k / MM_GEMM_BLOCK_K;

  if (tid == 256) {
    mm_tma_prefetch_map(&tm_a);
    mm_tma_prefetch_map(&tm_b);
    mm_tma_prefetch_map(&tm_sfa);
    mm_gemm_init_barriers<Cfg>(sm);
  }
  mm_gemm_sched_build(sm.sched, args, Cfg::BM, tiles_n, tid, MM_GEMM_THREADS);
  __syncthreads();
  const int total = sm.sched.tile_start[args.num_experts];

  if (warp >= 8) {
    /* Producer warpgroup. */
    mm_setmaxnreg_dec<MM_GEMM_PRODUCER_REGS>();
    if (warp == 8 && lane == 0) {
      mm_gemm_pipe pipe = {0u, 0u};
      int cursor = 0;
      for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const mm_gemm_tile_info ti = mm_gemm_sched_tile<Cfg>(sm.sched, t, cursor, tiles_n);
        mm_gemm_produce_tile<Cfg>(sm, pipe, &tm_a, &tm_b, &tm_sfa, ti, args.n, kblocks);
      }
    }
  } else {
    /* Math warpgroups. */
    mm_setmaxnreg_inc<MM_GEMM_MATH_REGS>();
    const int wg = warp >> 2;
    mm_gemm_pipe pipe = {0u, 0u};
    int cursor = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      const mm_gemm_tile_info ti = mm_gemm_sched_tile<Cfg>(sm.sched, t, cursor, tiles_n);
      float acc[Cfg::kWaves][64];
      mm_gemm_consume_tile<Cfg>(sm, pipe, args, ti, wg, acc);
      if constexpr (kOut == MM_GEMM_OUT_KIND_SWIGLU) mm_gemm_epilogue_swiglu<Cfg>(args, ti, wg, acc);
      else mm_gemm_epilogue_store<Cfg, kOut == MM_GEMM_OUT_KIND_BF16>(args, ti, wg, acc);
    }
  }
}

/* ======================= skewed ("turn-taking") schedule ======================
 * Tiles MM_GEMM_TILE_*_SKEW(_TMA). Same tiles, shared-memory ring, producer,
 * scheduler, numerics and epilogues as above; what changes is the order in
 * which the two math warpgroups issue their wgmma chains.
 *
 * Why: above, both warpgroups wait on the same full barrier and issue their
 * chains at the same moment, so the tensor cores interleave the two chains
 * and both finish together; then both warpgroups wait (wait_group 0) and
 * promote at the same time and the tensor cores idle for that whole gap, once
 * per chain. Here a "chain" is the k32 wgmmas of one (promotion block, wave)
 * of one warpgroup (4 x m64n128k32 for a_sf_block 128), and the chains of
 * the CTA are issued in the strict order WG0 c0, WG1 c0, WG0 c1, WG1 c1, ...
 * Each warpgroup waits for its own chain right after issuing it, so while
 * WG0 waits and promotes chain c, the tensor cores run WG1's chain c, and
 * WG0's chain c + 1 is issued before that one ends as long as wait +
 * promotion + issue take less than one chain (256 tensor cycles).
 *
 * Turn protocol (named barriers over the 256 math threads):
 *   WG0, chain c: if c > 0, bar.sync TURN0 (WG1 has issued chain c - 1);
 *                 issue chain c; bar.arrive TURN1.
 *   WG1, chain c: bar.sync TURN1 (WG0 has issued chain c); issue chain c;
 *                 bar.arrive TURN0.
 *   WG1 does not arrive after the last chain of its last tile, so no barrier
 *   is left half-arrived at exit. (A bar.sync after the tile loop instead
 *   made ptxas cap the math registers at the kernel's entry budget, 168, and
 *   spill.)
 * Both warpgroups walk the same tiles, stages and waves, so they have the
 * same chain count; a wave whose rows are all past the expert's count still
 * takes its turns (without wgmmas). A warpgroup never arrives twice on one
 * barrier phase: its next arrival on TURN1 (TURN0) follows its own sync on
 * TURN0 (TURN1), which needs the other warpgroup's sync of the previous phase.
 * The two warpgroups are never more than one chain apart, and the full /
 * empty ring protocol is the one above, so no wait cycle exists.
 *
 * Also: the empty barrier of a stage is signalled right after the stage's
 * last chain completed (before its promotion); the scale products of the
 * stage are computed (so the A-scale loads from the stage have completed)
 * before any wgmma of the stage is issued. B scales are loaded one K block
 * ahead. */
#define MM_GEMM_BAR_TURN0 1
#define MM_GEMM_BAR_TURN1 2
#define MM_GEMM_BAR_EPI 3
#define MM_GEMM_MATH_THREADS 256

__device__ __forceinline__ void mm_gemm_turn_wait(int wg, uint32_t turns) {
  if (wg == 0) {
    if (turns != 0) mm_named_barrier_sync_c<MM_GEMM_BAR_TURN0, MM_GEMM_MATH_THREADS>();
  } else {
    mm_named_barrier_sync_c<MM_GEMM_BAR_TURN1, MM_GEMM_MATH_THREADS>();
  }
}

/* skip: WG1's very last chain of the kernel (nobody waits for it). */
__device__ __forceinline__ void mm_gemm_turn_pass(int wg, uint32_t& turns, bool skip) {
  if (wg == 0) mm_named_barrier_arrive_c<MM_GEMM_BAR_TURN1, MM_GEMM_MATH_THREADS>();
  else if (!skip) mm_named_barrier_arrive_c<MM_GEMM_BAR_TURN0, MM_GEMM_MATH_THREADS>();
  ++turns;
}

/* Math warpgroup, skewed schedule: the K loop of one tile into acc (as
 * mm_gemm_consume_tile). turns: this warpgroup's chain count so far (0 at
 * the start of the kernel, carried across tiles). final_tile: this is the
 * CTA's last tile (the same value in both warpgroups). */
template <class Cfg>
__device__ __forceinline__ void mm_gemm_consume_tile_skew(const mm_gemm_smem& sm, mm_gemm_pipe& pipe,
                                                          const mm_gemm_dev_args& args,
                                                          const mm_gemm_tile_info& ti, int wg, uint32_t& turns,
                                                          bool final_tile, float (&acc)[Cfg::kWaves][64]) {
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
  const int kblocks = args.k / MM_GEMM_BLOCK_K;
  const int row_w = mm_gemm_wg_row0<Cfg>(wg);
  const int col_w = mm_gemm_wg_col0<Cfg>(wg);

  bool wave_ok[Cfg::kWM];
#pragma unroll
  for (int wm = 0; wm < Cfg::kWM; ++wm) wave_ok[wm] = row_w + 64 * wm < ti.rows;

#pragma unroll
  for (int w = 0; w < Cfg::kWaves; ++w)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[w][i] = 0.f;

  const int bsn = args.b_sf_block_n;
  const float* sfb_e = args.b_sf + (int64_t)ti.expert * (args.n / bsn) * kblocks;
  const float* sfb[Cfg::kWN][2];
  float sb_next[Cfg::kWN][2];
#pragma unroll
  for (int wn = 0; wn < Cfg::kWN; ++wn)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sfb[wn][h] = sfb_e + (int64_t)((ti.n0 + col_w + 128 * wn + 64 * h) / bsn) * kblocks;
      sb_next[wn][h] = __ldg(sfb[wn][h]);
    }

  const uint32_t a_lo0 = mm_wgmma_desc_sw128_lo(sm.a);
  const uint32_t b_lo0 = mm_wgmma_desc_sw128_lo(sm.b);
  const int r_in = warp * 16 + (lane >> 2);

  for (int kb = 0; kb < kblocks; ++kb) {
    const uint32_t s = pipe.stage;
    float sb[Cfg::kWN][2];
    const int kn = kb + 1 < kblocks ? kb + 1 : kb;
#pragma unroll
    for (int wn = 0; wn < Cfg::kWN; ++wn)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sb[wn][h] = sb_next[wn][h];
        sb_next[wn][h] = __ldg(sfb[wn][h] + kn);
      }

    mm_mbar_wait(sm.full + 8 * s, pipe.phase);

    /* Scale products of the stage: sc[h][wm][wn][2 * row half + column half]. */
    float sc[Cfg::kPromo][Cfg::kWM][Cfg::kWN][4];
    const float* sf_stage = sm.sf_ptr + s * (Cfg::kStageSF / 4);
#pragma unroll
    for (int h = 0; h < Cfg::kPromo; ++h)
#pragma unroll
      for (int wm = 0; wm < Cfg::kWM; ++wm) {
        const int r = row_w + 64 * wm + r_in;
        const float sa0 = wave_ok[wm] ? sf_stage[h * Cfg::BM + r] : 0.f;
        const float sa1 = wave_ok[wm] ? sf_stage[h * Cfg::BM + r + 8] : 0.f;
#pragma unroll
        for (int wn = 0; wn < Cfg::kWN; ++wn) {
          sc[h][wm][wn][0] = sa0 * sb[wn][0];
          sc[h][wm][wn][1] = sa0 * sb[wn][1];
          sc[h][wm][wn][2] = sa1 * sb[wn][0];
          sc[h][wm][wn][3] = sa1 * sb[wn][1];
#pragma unroll
          for (int q = 0; q < 4; ++q) mm_wgmma_fence_operand(sc[h][wm][wn][q]);
        }
      }

#pragma unroll
    for (int h = 0; h < Cfg::kPromo; ++h) {
#pragma unroll
      for (int wm = 0; wm < Cfg::kWM; ++wm) {
#pragma unroll
        for (int wn = 0; wn < Cfg::kWN; ++wn) {
          const bool last = h == Cfg::kPromo - 1 && wm == Cfg::kWM - 1 && wn == Cfg::kWN - 1;
          const bool skip_pass = last && final_tile && kb == kblocks - 1;
          if (wave_ok[wm]) {
            /* Straight-line from issue to wait: no control-flow merge may
             * separate the wgmmas from their wait_group (ptxas would inject
             * a wait right after the issue, before the turn is passed). */
            float part[64];
            mm_gemm_turn_wait(wg, turns);
#pragma unroll
            for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
            mm_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Cfg::kK32PerPromo; ++kk) {
              const int k32 = h * Cfg::kK32PerPromo + kk;
              const uint32_t a_lo =
                  a_lo0 + ((s * Cfg::kStageA + (uint32_t)(row_w + 64 * wm) * 128u + 32u * k32) >> 4);
              const uint32_t b_lo =
                  b_lo0 + ((s * Cfg::kStageB + (uint32_t)(col_w + 128 * wn) * 128u + 32u * k32) >> 4);
              mm_wgmma_m64n128k32_e4m3(part, mm_wgmma_desc(a_lo), mm_wgmma_desc(b_lo), kk > 0 ? 1u : 0u);
            }
            mm_wgmma_commit();
#pragma unroll
            for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
            mm_gemm_turn_pass(wg, turns, skip_pass);
            mm_wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 64; ++i) mm_wgmma_fence_operand(part[i]);
            /* Every wgmma of this warp on stage s has completed. */
            if (last && lane == 0) mm_mbar_arrive(sm.empty + 8 * s);
            const float* c = sc[h][wm][wn];
            float* a = acc[wm * Cfg::kWN + wn];
#pragma unroll
            for (int i = 0; i < 64; ++i) {
              const int hi_col = i >= 32, hi_row = (i >> 1) & 1;
              a[i] = fmaf(part[i], c[2 * hi_row + hi_col], a[i]);
            }
          } else {
            /* A wave past the expert's count: its turn, no wgmmas. */
            mm_gemm_turn_wait(wg, turns);
            mm_gemm_turn_pass(wg, turns, skip_pass);
            if (last && lane == 0) mm_mbar_arrive(sm.empty + 8 * s);
          }
        }
      }
    }
    mm_gemm_pipe_advance<Cfg>(pipe);
  }
}

/* bf16 epilogue of a FULL tile (ti.rows == BM) through the staging area and
 * TMA stores; all 256 math threads call it (it has CTA-wide named barriers
 * over them). Staging layout: BN / 64 boxes of BM rows x 128 bytes (64 bf16
 * columns), each box 128-byte swizzled as TMA expects (16-byte chunk c of row
 * r at r * 128 + ((c ^ (r % 8)) * 16)). tm_d: bf16 [rows_cap, n], box 64 x BM,
 * 128-byte swizzle. Thread 0 issues and tracks the stores: before the staging
 * area is written again it waits until the previous tile's stores have read it. */
template <class Cfg>
__device__ __forceinline__ void mm_gemm_epilogue_tma_bf16(const mm_gemm_smem& sm, const CUtensorMap* tm_d,
                                                          const mm_gemm_tile_info& ti, int wg,
                                                          float (&acc)[Cfg::kWaves][64]) {
  static_assert(Cfg::kEpiSmem == (uint32_t)Cfg::BM * Cfg::BN * 2, "staging area");
  if (threadIdx.x == 0) mm_bulk_wait_group_read<0>();
  mm_named_barrier_sync_c<MM_GEMM_BAR_EPI, MM_GEMM_MATH_THREADS>();

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
        const uint32_t addr = sm.d + (col >> 6) * (uint32_t)(Cfg::BM * 128) + row * 128u +
                              ((((col & 63u) >> 3) ^ (row & 7u)) << 4);
        const uint32_t r0 = (uint32_t)mm_float_to_bf16(a[4 * j0]) | ((uint32_t)mm_float_to_bf16(a[4 * j0 + 1]) << 16);
        const uint32_t r1 =
            (uint32_t)mm_float_to_bf16(a[4 * j0 + 2]) | ((uint32_t)mm_float_to_bf16(a[4 * j0 + 3]) << 16);
        const uint32_t r2 = (uint32_t)mm_float_to_bf16(a[4 * j1]) | ((uint32_t)mm_float_to_bf16(a[4 * j1 + 1]) << 16);
        const uint32_t r3 =
            (uint32_t)mm_float_to_bf16(a[4 * j1 + 2]) | ((uint32_t)mm_float_to_bf16(a[4 * j1 + 3]) << 16);
        mm_stmatrix_x4(addr, r0, r1, r2, r3);
      }
    }
  }
  mm_fence_proxy_async_smem();
  mm_named_barrier_sync_c<MM_GEMM_BAR_EPI, MM_GEMM_MATH_THREADS>();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < Cfg::BN / 64; ++b)
      mm_tma_store_2d(tm_d, sm.d + (uint32_t)b * (uint32_t)(Cfg::BM * 128), ti.n0 + 64 * b, ti.row0);
    mm_bulk_commit_group();
  }
}

/* The whole persistent kernel with the skewed schedule. kTmaStore (bf16
 * output only): full tiles go through mm_gemm_epilogue_tma_bf16 (Cfg must
 * have the staging area), partial tiles through the direct stores. */
template <class Cfg, int kOut, bool kTmaStore>
__global__ void __launch_bounds__(MM_GEMM_THREADS, 1)
    mm_gemm_wgmma_skew_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                              const __grid_constant__ CUtensorMap tm_sfa, const __grid_constant__ CUtensorMap tm_d,
                              const mm_gemm_dev_args args) {
  static_assert(!kTmaStore || kOut == MM_GEMM_OUT_KIND_BF16, "TMA-store epilogue: bf16 only");
  static_assert(!kTmaStore || Cfg::kEpiSmem > 0, "TMA-store epilogue needs the staging area");
  static_assert(!Cfg::kSplitN, "skewed schedule: row-split tiles only");
  extern __shared__ uint8_t mm_gemm_smem_raw[];
  const mm_gemm_smem sm = mm_gemm_smem_carve<Cfg>(mm_gemm_smem_raw, args.num_experts);
  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int lane = tid & 31;
  const int tiles_n = args.n / Cfg::BN;
  const int kblocks = args.k / MM_GEMM_BLOCK_K;

  if (tid == 256) {
    mm_tma_prefetch_map(&tm_a);
    mm_tma_prefetch_map(&tm_b);
    mm_tma_prefetch_map(&tm_sfa);
    if (kTmaStore) mm_tma_prefetch_map(&tm_d);
    mm_gemm_init_barriers<Cfg>(sm);
  }
  mm_gemm_sched_build(sm.sched, args, Cfg::BM, tiles_n, tid, MM_GEMM_THREADS);
  __syncthreads();
  const int total = sm.sched.tile_start[args.num_experts];

  if (warp >= 8) {
    mm_setmaxnreg_dec<MM_GEMM_PRODUCER_REGS>();
    if (warp == 8 && lane == 0) {
      mm_gemm_pipe pipe = {0u, 0u};
      int cursor = 0;
      for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const mm_gemm_tile_info ti = mm_gemm_sched_tile<Cfg>(sm.sched, t, cursor, tiles_n);
        mm_gemm_produce_tile<Cfg>(sm, pipe, &tm_a, &tm_b, &tm_sfa, ti, args.n, kblocks);
      }
    }
  } else {
    mm_setmaxnreg_inc<MM_GEMM_MATH_REGS>();
    const int wg = warp >> 2;
    mm_gemm_pipe pipe = {0u, 0u};
    int cursor = 0;
    uint32_t turns = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      const mm_gemm_tile_info ti = mm_gemm_sched_tile<Cfg>(sm.sched, t, cursor, tiles_n);
      const bool final_tile = t + (int)gridDim.x >= total;
      float acc[Cfg::kWaves][64];
      mm_gemm_consume_tile_skew<Cfg>(sm, pipe, args, ti, wg, turns, final_tile, acc);
      if constexpr (kTmaStore) {
        if (ti.rows == Cfg::BM) mm_gemm_epilogue_tma_bf16<Cfg>(sm, &tm_d, ti, wg, acc);
        else mm_gemm_epilogue_store<Cfg, true>(args, ti, wg, acc);
        /* The staging area must stay valid until the last stores have read
         * it (the CTA's shared memory goes away at exit). Waited inside the
         * loop: code after the loop made ptxas cap the math registers. */
        if (final_tile && tid == 0) mm_bulk_wait_group<0>();
      } else if constexpr (kOut == MM_GEMM_OUT_KIND_SWIGLU) {
        mm_gemm_epilogue_swiglu<Cfg>(args, ti, wg, acc);
      } else {
        mm_gemm_epilogue_store<Cfg, kOut == MM_GEMM_OUT_KIND_BF16>(args, ti, wg, acc);
      }
    }
  }
}

#endif /* __CUDACC__ */

#endif
