/* Host/device contract: plain C structs and constants shared by the C11 host
 * code and the CUDA kernels. Nothing here may depend on CUDA headers. */
#ifndef MEGAMOE_CONTRACT_H
#define MEGAMOE_CONTRACT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Each expert's rows in the expert-major pool start at a multiple of this, so
 * no GEMM m-tile (64 or 128 rows) ever spans two experts. */
#define MM_POOL_ROW_ALIGN 128

/* Scale block of the inputs x and of the weights (DESIGN.md section 1). */
#define MM_SCALE_BLOCK 128

/* Metadata of one pool row: where its token lives. Padding rows have
 * src_rank = -1. token_slot = t * K + k on the source rank. */
typedef struct mm_pool_row {
  int32_t src_rank;
  int32_t token_slot;
} mm_pool_row;

/* One routed (token, slot) as the source rank publishes it to the expert's
 * rank: sorted by local expert, then token, then slot. The routing weight
 * travels with it so the expert side never reads the source's topk_w. */
typedef struct mm_route_entry {
  int32_t token_slot; /* t * K + k */
  float weight;
} mm_route_entry;

/* Device-side error record, one per layer, in the workspace. The first
 * failing kernel writes code (a megamoe_status) with atomicCAS from 0;
 * kernels that start after it skip their work (but still take part in the
 * cross-rank barriers, so the ranks stay in step unless the failure is a
 * timeout). */
typedef struct mm_device_status {
  int32_t code;
  int32_t where;   /* mm_wait_site or kernel id, for the message */
  int32_t peer;    /* the peer a wait was waiting on, or -1 */
  int32_t detail;  /* e.g. the bad index, or the token */
  uint64_t seen;   /* the flag value seen when a wait gave up */
  uint64_t want;   /* the flag value it waited for */
} mm_device_status;

/* Barrier flags: a 64-bit word per peer in the symmetric buffer. Peer p
 * writes slot p of every rank with st.release.sys. The value is
 * (sequence << 8) | error_code: sequences only grow over the life of a layer
 * (never reset), so a waiter compares with >= and no zeroing pass is needed. */
#define MM_FLAG_SEQ_SHIFT 8
#define MM_FLAG_ERR_MASK 0xffull

/* Wait sites, for the timeout message. */
enum mm_wait_site {
  MM_SITE_NONE = 0,
  MM_SITE_BARRIER_DISPATCH = 1, /* after routing was published, before the pull */
  MM_SITE_BARRIER_COMBINE = 2,  /* after the combine push, before the reduction */
  MM_SITE_ROUTE = 3,
  MM_SITE_DISPATCH = 4
};

/* Arguments of one grouped block-scaled FP8 GEMM over the expert-major pool:
 *   D[rows of expert e] = A[rows of expert e] * B[e]^T
 * A   fp8 e4m3 [rows_cap, k], row stride k bytes
 * A_sf fp32 [k / a_sf_block][rows_cap]  (K-block-major: one scale per row per
 *      a_sf_block-wide K block; a_sf_block is 128, or 64 for the L2 input when G = 64)
 * B   fp8 e4m3 [num_experts, n, k], K-major
 * B_sf fp32 [num_experts, n / b_sf_block_n, k / 128]: one scale per
 *      b_sf_block_n x 128 block (b_sf_block_n = 128, or 64 for the prepared W1)
 * expert_offset [num_experts + 1] (device), multiples of MM_POOL_ROW_ALIGN;
 * expert_count  [num_experts] (device): valid rows of each expert. Rows past
 * the count (padding) may hold anything; their outputs are not written. */
typedef struct mm_gemm_problem {
  const uint8_t* a;
  const float* a_sf;
  int32_t a_sf_block;
  const uint8_t* b;
  const float* b_sf;
  int32_t b_sf_block_n;
  const int32_t* expert_offset;
  const int32_t* expert_count;
  int32_t num_experts;
  int32_t rows_cap;
  int32_t n;
  int32_t k;
} mm_gemm_problem;

/* The prepared W1 (what megamoe_prepare_weights produces): 64-row chunks of
 * gate and up interleaved, so prepared rows [128 c, 128 c + 64) are gate rows
 * [64 c, 64 c + 64) of the checkpoint and prepared rows [128 c + 64, 128 c + 128)
 * the matching up rows I + 64 c ... Its scales are per 64-row chunk:
 * W1p_sf [E_l, 2I / 64, H / 128], each the checkpoint's 128x128 block scale of
 * the chunk's rows. Any 128-wide column tile of the L1 output therefore holds
 * 64 matching (gate, up) pairs: a-columns [64 c, 64 c + 64). */
#define MM_W1_INTERLEAVE 64

/* Epilogue of the L1 GEMM when it applies SwiGLU itself. B is the prepared
 * W1 (above). Output: a = silu(g) * u * weight, quantized
 * per `group` columns (64 or 128): out [rows_cap, I] fp8, out_sf
 * [I / group][rows_cap] fp32 with sf = max(amax, 1e-10) / 448. */
typedef struct mm_swiglu_epilogue {
  const float* row_weight; /* [rows_cap] routing weight of each pool row */
  int32_t group;
  int32_t has_clamp;
  float clamp;
  uint8_t* out;
  float* out_sf;
} mm_swiglu_epilogue;

#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_CONTRACT_H */
