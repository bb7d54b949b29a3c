/* The layer's plan: what is decided once instead of per call.
 *
 * At create (mm_plan_check): every GEMM tile the arm can pick is checked
 * against the device's shared memory for this config, so any config that
 * create accepts runs. When the weights are set (mm_plan_make): the GEMM
 * problems of the arm and, on the wgmma engine, their plans (tile, tensor
 * maps, shared-memory layout) for each tile regime. Per call
 * (mm_plan_select): the regime from the call's token bound (or its T), so a
 * decode call on a layer sized for 8192 tokens takes the decode tile; a
 * forward then only launches. */
#ifndef MEGAMOE_PLAN_H
#define MEGAMOE_PLAN_H

#include <stdint.h>

#include "contract.h"
#include "device/gemm/gemm.h"
#include "megamoe.h"

/* Tile regimes: the decode tile where an expert holds few rows (one 64-row
 * m-block), one 128-row m-block up to 128 rows (the expert's weights read
 * once), the large tiles above. */
typedef enum mm_regime { MM_REGIME_DECODE = 0, MM_REGIME_MID = 1, MM_REGIME_LARGE = 2, MM_REGIME_COUNT } mm_regime;

/* Rows per expert up to which the decode and the mid regimes are picked
 * (bench-gemm, docs/PERF.md: the 64-row tile wins at 64 rows per expert,
 * the large tiles from 512; at 65-128 two 64-row m-blocks stream the
 * weights twice). */
#define MM_DECODE_ROWS_PER_EXPERT 64
#define MM_MID_ROWS_PER_EXPERT 128

/* The GEMMs of an arm, in order. */
#define MM_ARM_MAX_GEMMS 2

/* One GEMM of an arm: the problem (both engines) and its plan (wgmma). */
typedef struct mm_arm_gemm {
  mm_gemm_problem problem;
  mm_gemm_plan plan;
  int engine; /* mm_gemm_engine */
} mm_arm_gemm;

typedef struct mm_plan {
  mm_arm_gemm gemm[MM_REGIME_COUNT][MM_ARM_MAX_GEMMS];
} mm_plan;

/* Create-time check of every tile the arm of `config` can pick. */
megamoe_status mm_plan_check(const megamoe_config* config, int num_ranks);

/* The L1 and L2 tiles the arm of `config` runs in regime r (host
 * arithmetic, no device). */
megamoe_status mm_plan_tiles(const megamoe_config* config, int num_ranks, int regime, mm_gemm_tile* l1,
                             mm_gemm_tile* l2);

/* The fused arm's kernel in regime r (config->arm fused): its L1 and L2
 * tiles and its shared-memory plan (host arithmetic, no device; megamoe
 * info prints it). */
typedef struct mm_fused_smem_plan mm_fused_smem_plan;
megamoe_status mm_plan_fused_kernel(const megamoe_config* config, int num_ranks, int regime, mm_gemm_tile* l1,
                                    mm_gemm_tile* l2, mm_fused_smem_plan* smem);

/* The GEMM problems and plans of the arm, for the weights given. */
megamoe_status mm_plan_make(mm_plan* plan, const megamoe_config* config, const mm_layer_view* view, int engine,
                            const uint8_t* w1p, const float* w1p_sf, const uint8_t* w2, const float* w2_sf);

/* The regime of a call: rows per local expert estimated from the bound (or
 * T when the bound is 0) under uniform routing. */
mm_regime mm_plan_regime(const megamoe_config* config, int num_ranks, int64_t num_tokens, int64_t bound);

/* The early combine (route_phases.cuh) for a call of T tokens on this
 * rank: mode 0 never, 2 always (MEGAMOE_EARLY_COMBINE, for measurements),
 * 1 (the default) where the reduction's units fit one per warp of the
 * persistent grid (sms CTAs of 12 warps): there its copy into y is a single
 * round trip, while the reduction it moves ahead of barrier 1 is at least
 * one (docs/PERF.md, sixteenth session). Never on the staged arm. */
#define MM_EARLY_COMBINE_AUTO 1
int mm_plan_early_combine(const megamoe_config* config, int mode, int64_t num_tokens, int sms);

/* 1 when the kernels were built with the early combine (MM_EARLY_COMBINE,
 * src/device/common.cuh), else 0: then mm_plan_early_combine says 0. */
int mm_early_combine_built(void);

/* Launches GEMM g of the arm in regime r. */
megamoe_status mm_arm_gemm_run(const mm_arm_gemm* g, cudaStream_t stream);

#endif
