/* The split arm: two persistent kernels per forward (C interface; the host
 * side is src/host/split_forward.c).
 *
 * Kernel 1 (route + dispatch + L1), every CTA of a cooperative grid of one
 * CTA per SM:
 *   A  start the forward; validate and count this rank's slots per expert;
 *      zero the rows-ready counters                              grid barrier
 *   B  publish each expert's routed list to its rank             grid barrier
 *   C  CTA 0: all-rank barrier 0 (routing published), pool layout grid barrier
 *   D  the L1 GEMM on the engine (producer + two math warpgroups, SwiGLU +
 *      per-G quantization epilogue) while the producer warpgroup's three
 *      other warps pull the routed rows over NVLink into the pool, each row
 *      counted into its 128-row block's rows-ready counter (release); the
 *      GEMM producer waits for a tile's blocks (acquire) and TMA-loads them
 *      as soon as they are complete.
 * Kernel 2 (L2 + combine):
 *   the L2 GEMM: the math warpgroups stage each bf16 tile in shared memory
 *   and run on; the producer warpgroup's three other warps (the copy warps)
 *   write each row into its source rank's combine buffer at row token_slot
 *   (over NVLink for a peer's rows; gemm_epilogue.cuh, mm_gemm_copy_loop)
 *                                                                grid barrier
 *   CTA 0: all-rank barrier 1 (combine rows landed)              grid barrier
 *   every CTA: its share of the tokens' reductions in slot order, then the
 *   end of the forward (comm/forward.cuh).
 *
 * Same pool, same order, same GEMM chains and the same reduction as the
 * staged arm: bitwise equal to it at equal G. */
#ifndef MEGAMOE_SPLIT_H
#define MEGAMOE_SPLIT_H

#include <cuda_runtime_api.h>

#include "contract.h"
#include "gemm/gemm.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Once per plan (at create and when the weights are set): checks that the
 * arm's kernels exist for the plans' tiles and lets them use the plans'
 * shared memory, so a forward only launches. */
megamoe_status mm_split_prepare(const mm_gemm_plan* l1, const mm_gemm_plan* l2);

/* Enqueue kernel 1 / kernel 2 of the forward, a cooperative grid of
 * L->num_sms CTAs. The plans' problems carry the pool, the weights and the
 * hooks (host/plan.c). */
megamoe_status mm_split_l1_launch(const mm_layer_view* L, const mm_forward_view* F, const mm_gemm_plan* l1,
                                  cudaStream_t stream);
megamoe_status mm_split_l2_launch(const mm_layer_view* L, const mm_forward_view* F, const mm_gemm_plan* l2,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
