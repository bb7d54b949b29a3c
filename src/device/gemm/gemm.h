/* Grouped block-scaled FP8 GEMMs over the expert-major pool (C interface).
 *
 * One problem description (contract.h, mm_gemm_problem: operands, rows,
 * output kind, hooks), two engines:
 *   simple: CUDA-core reference kernel, the oracle for the fast engine
 *           (dense outputs and SwiGLU only, no hooks);
 *   wgmma:  the Hopper engine (TMA + mbarrier pipeline + wgmma), persistent,
 *           src/device/gemm/ (config, mainloop, epilogues, kernel) and
 *           src/device/sched/ (tile schedulers).
 *
 * The wgmma engine runs from a plan: mm_gemm_plan_make checks the problem,
 * picks the tile, checks shared memory and encodes the tensor maps once (the
 * layer makes its plans when the weights are set); mm_gemm_plan_launch only
 * launches. mm_gemm_wgmma does both, for tests and one-off calls. */
#ifndef MEGAMOE_GEMM_H
#define MEGAMOE_GEMM_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "contract.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Experts of one grouped problem (the scheduler keeps per-expert arrays in
 * shared memory). */
#define MM_GEMM_MAX_EXPERTS 1024

typedef enum mm_gemm_engine {
  MM_GEMM_ENGINE_SIMPLE = 0,
  MM_GEMM_ENGINE_WGMMA = 1
} mm_gemm_engine;

/* A problem with operands and rows set, output MM_GEMM_OUT_F32 into d = NULL,
 * no hooks, no status record, the default deadline. The caller then sets
 * out_kind and the output fields it uses. */
mm_gemm_problem mm_gemm_problem_make(const uint8_t* a, const float* a_sf, int32_t a_sf_block,
                                     const uint8_t* b, const float* b_sf, int32_t b_sf_block_n,
                                     const int32_t* expert_offset, const int32_t* expert_count,
                                     int32_t num_experts, int32_t rows_cap, int32_t n, int32_t k);

/* Checks the problem's host-visible fields (dimensions, alignment, pointers,
 * the output's fields). Common to both engines. */
megamoe_status mm_gemm_check(const mm_gemm_problem* p);

/* ---- wgmma engine tiles ---------------------------------------------------
 * BM x BN, two math warpgroups. "Row split": the warpgroups take BM / 2 rows
 * each; "column split": BN / 2 columns each. A warpgroup computes waves of
 * 64 rows x 128 columns (m64n128k32 wgmma chains).
 *   128x256   row split, 2 waves per warpgroup          SwiGLU G = 128 (pair inside a warpgroup)
 *   256x128   row split, 2 waves per warpgroup, TMA-store bf16 epilogue
 *   128x128   row split, 1 wave, two partial accumulators: the next K block's
 *             wgmmas run while the previous block is promoted
 *   64x256    column split, 1 wave, two partial accumulators (decode sizes);
 *             SwiGLU G = 128 with the amax exchanged between the warpgroups */
typedef enum mm_gemm_tile {
  MM_GEMM_TILE_AUTO = 0,
  MM_GEMM_TILE_128x256 = 1,
  MM_GEMM_TILE_256x128 = 2,
  MM_GEMM_TILE_128x128 = 3,
  MM_GEMM_TILE_64x256 = 4,
  /* Diagnostic: 128x128 with one partial accumulator (every K block's
   * wgmmas wait before its promotion), bf16 output only; measures what the
   * second partial accumulator buys (bench-gemm --tiles). */
  MM_GEMM_TILE_128x128_1P = 5,
  /* Diagnostic: 256x128 without promotion (the scales are ignored: wrong
   * output by design), bf16 only: the tensor pipe's ceiling with this
   * pipeline, for the benchmark. */
  MM_GEMM_TILE_256x128_NOSCALE = 6,
  MM_GEMM_TILE_128x128_NOSCALE = 7, /* the same for the 128x128 tile's feed */
  MM_GEMM_TILE_64x256_NOSCALE = 8,  /* and for the decode tile's weight stream */
  MM_GEMM_TILE_COUNT
} mm_gemm_tile;

const char* mm_gemm_tile_name(mm_gemm_tile tile);
/* Columns of a tile (n must be a multiple of it); 0 for AUTO or unknown. */
int mm_gemm_tile_width(mm_gemm_tile tile);
/* Rows of a tile (BLOCK_M); 0 for MM_GEMM_TILE_AUTO or an unknown tile. */
int mm_gemm_tile_rows(mm_gemm_tile tile);

/* The tile the engine picks for a problem whose experts hold at most
 * rows_per_expert valid rows (the layer passes its estimate from the call's
 * token bound; 0: unknown, use the pool capacity). Never AUTO. */
mm_gemm_tile mm_gemm_pick_tile(const mm_gemm_problem* p, int64_t rows_per_expert);

/* Whether `tile` can run this output kind / A-scale block / expert count
 * within the device's shared memory (bytes needed in *smem_bytes). Pure host
 * arithmetic plus one device attribute query. */
megamoe_status mm_gemm_tile_check(mm_gemm_tile tile, int32_t out_kind, int32_t a_sf_block,
                                  int32_t swiglu_group, int32_t num_experts, uint32_t* smem_bytes);

/* A launch-ready wgmma GEMM. Opaque storage for the four tensor maps
 * (CUtensorMap: 128 bytes, 128-byte aligned) keeps this header free of the
 * driver API. */
/* Shared-memory layout of one kernel instantiation for one problem
 * (offsets from the 1024-aligned base; gemm_cfg.cuh computes it). */
typedef struct mm_gemm_layout {
  uint32_t stages;
  uint32_t off_a, off_b, off_sf, off_full, off_empty, off_xwg, off_abort, off_sched;
  uint32_t bytes; /* dynamic shared memory to request (base alignment slack included) */
} mm_gemm_layout;

#ifdef __cplusplus
#define MM_ALIGN128 alignas(128)
#else
#define MM_ALIGN128 _Alignas(128)
#endif
typedef struct mm_gemm_plan {
  MM_ALIGN128 unsigned char maps[4][128]; /* A, B, A scales, D (TMA-store epilogue) */
  mm_gemm_problem problem;
  mm_gemm_tile tile;
  int32_t grid;
  mm_gemm_layout layout;
} mm_gemm_plan;

megamoe_status mm_gemm_plan_make(const mm_gemm_problem* p, mm_gemm_tile tile, mm_gemm_plan* plan);
megamoe_status mm_gemm_plan_launch(const mm_gemm_plan* plan, cudaStream_t stream);

/* For kernels that load a tile's A rows (and their scales) in boxes of
 * box_rows rows (the fused arm: a 256-row tile spans two 128-row ring
 * blocks whose slots need not be adjacent; gemm_mainloop.cuh,
 * mm_gemm_load_stage): re-encodes the plan's A map with box_rows-row boxes
 * and its A-scale map with (box_rows, 1) boxes. A no-op when the tile is not
 * taller than box_rows. The engine's own kernel (mm_gemm_plan_launch) then
 * must not run the plan. */
megamoe_status mm_gemm_plan_a_boxes(mm_gemm_plan* plan, int box_rows);

/* Plan + launch in one call (tile AUTO: mm_gemm_pick_tile with the pool capacity). */
megamoe_status mm_gemm_wgmma(const mm_gemm_problem* p, mm_gemm_tile tile, cudaStream_t stream);

/* The CUDA-core oracle: F32, BF16 and SWIGLU_FP8 outputs; no hooks. */
megamoe_status mm_gemm_simple(const mm_gemm_problem* p, cudaStream_t stream);

static inline megamoe_status mm_gemm_run(mm_gemm_engine engine, const mm_gemm_problem* p,
                                         cudaStream_t stream) {
  return engine == MM_GEMM_ENGINE_WGMMA ? mm_gemm_wgmma(p, MM_GEMM_TILE_AUTO, stream)
                                        : mm_gemm_simple(p, stream);
}

#ifdef __cplusplus
}
#endif

#endif
