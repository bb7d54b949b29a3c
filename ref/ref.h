/* megamoe CPU reference (C11, no CUDA): the numerics contract of DESIGN.md
 * section 1, written out exactly. The GPU arms are compared against it token
 * by token with ref_check_output (ref_check.h: per-row bounds and a tight
 * whole-rank diff, NaN never passes).
 *
 * Number formats
 *   e4m3 (fp8, "e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
 *     infinity; 0x7F / 0xFF are NaN; largest finite 448 (0x7E); smallest
 *     subnormal 2^-9. Encoding rounds to nearest, ties to even, and saturates
 *     finite overflow and +-inf to +-448, like CUDA's
 *     __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3). Every NaN (either
 *     sign, any payload) encodes to 0x7F, as that function's host path does.
 *   bf16: the top 16 bits of an fp32, rounded to nearest, ties to even;
 *     overflow rounds to +-inf; every NaN encodes to 0x7FFF (a quiet NaN, as
 *     CUDA's __float2bfloat16 host path does).
 *
 * The layer (per routed token t, slot k, expert e = topk_idx[t, k] >= 0)
 *   L1   For every output column n in [0, 2I) and every 128-wide K block kb:
 *          S(kb) = sum_{i in kb} x[t, i] * W1[e, n, i]
 *        computed exactly (each product of two e4m3 values has <= 8
 *        significant bits and is a multiple of 2^-18; a 128-term sum is below
 *        2^25, so every partial sum is exact in double and the order of the
 *        terms does not matter). Then, in double, kb ascending from 0:
 *          acc += ((double)x_sf[t, kb] * (double)W1_sf[e, n / 128, kb]) * S(kb)
 *        (the scale product is exact; the multiply by S and the add each round
 *        once), and h[n] = (float)acc.
 *   SwiGLU  g = h[j], u = h[I + j] (floats). With the clamp c:
 *          g = g > c ? c : g;  u = u > c ? c : (u < -c ? -c : u)
 *        (a NaN stays NaN). In double:
 *          a[j] = (float)(((g / (1 + exp(-g))) * u) * topk_w[t, k]).
 *   Quantize  per G = quant_group contiguous columns with ref_quantize_group.
 *   L2   Like L1 with G-wide K blocks: for output column n in [0, H), block kb
 *        (columns [kb G, kb G + G) of q), S(kb) exact, then in double, kb
 *        ascending:
 *          acc += ((double)q_sf[kb] * (double)W2_sf[e, n / 128, (kb G) / 128]) * S(kb)
 *        and o[n] = ref_bf16_encode((float)acc).
 *   Combine  per token, in float: acc = 0.0f; for k = 0 .. K-1 with
 *        topk_idx[t, k] >= 0: acc += ref_bf16_decode(o_k[n]); y[t, n] =
 *        ref_bf16_encode(acc). A token with every slot masked gets +0.0.
 *
 * Build: IEEE single/double with SSE arithmetic (no x87 excess precision),
 * no -ffast-math and no floating-point contraction (the default of -std=c11;
 * an FMA would change the rounding of the scale step above). On x86 the exact
 * block sums also have an AVX2 build, taken when the CPU has AVX2 and FMA;
 * the results are the same bits either way.
 * Verified: ref_e4m3_encode and ref_bf16_encode equal CUDA's host
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and __float2bfloat16
 * on all 2^32 float bit patterns (CUDA 13 headers). */
#ifndef MEGAMOE_REF_H
#define MEGAMOE_REF_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define REF_E4M3_MAX 448.0f

/* Round to nearest even, saturate finite overflow and +-inf to +-448
 * (0x7E / 0xFE); NaN -> 0x7F; -0.0 -> 0x80. */
uint8_t ref_e4m3_encode(float x);
/* 0x7F and 0xFF decode to NaN (e4m3fn has no inf). */
float ref_e4m3_decode(uint8_t v);

/* Round to nearest even; NaN -> 0x7FFF (quiet). */
uint16_t ref_bf16_encode(float x);
float ref_bf16_decode(uint16_t v);
/* ref_bf16_decode(ref_bf16_encode(x)). */
float ref_bf16_round(float x);

/* Quantizes one group of n values: amax = max |a[i]| (NaN elements do not
 * take part), sf = max(amax, 1e-10f) / 448.0f (fp32 division),
 * q[i] = ref_e4m3_encode(a[i] / sf) (fp32 division). */
void ref_quantize_group(const float* a, int n, uint8_t* q, float* sf);

/* diff(a, b) = 1 - 2 sum(a b) / sum(a^2 + b^2) in float64; 0 when both are
 * all zero; NaN when any element is NaN (callers treat NaN as failure). */
double ref_diff(const float* a, const float* b, size_t n);
double ref_diff_bf16(const uint16_t* a, const uint16_t* b, size_t n);

typedef struct ref_rank_data {
  int64_t num_tokens;        /* T of this rank */
  const uint8_t* x;          /* [T, H] e4m3 */
  const float* x_sf;         /* [T, H/128] */
  const int32_t* topk_idx;   /* [T, K] global expert id, -1 = masked */
  const float* topk_w;       /* [T, K] */
  const uint8_t* w1;         /* this rank's experts, CHECKPOINT layout: [E_l, 2I, H] (gate rows 0..I-1, up rows I..2I-1) */
  const float* w1_sf;        /* [E_l, 2I/128, H/128] */
  const uint8_t* w2;         /* [E_l, H, I] */
  const float* w2_sf;        /* [E_l, H/128, I/128] */
  uint16_t* y;               /* [T, H] bf16 output, every element written */
} ref_rank_data;

/* The whole layer (above) for num_ranks simulated ranks in one process:
 * token t of rank r routed to expert e is computed with the weights of rank
 * e / E_l, local expert e % E_l. Rank splitting does not change the numbers:
 * the same global weights give bitwise the same y for any rank count.
 * Validates: the config (megamoe_check_config), ranks non-NULL, every rank's
 * weights non-NULL, num_tokens in [0, T_max] (else
 * MEGAMOE_ERR_TOO_MANY_TOKENS), x / x_sf / topk_idx / topk_w / y non-NULL
 * unless num_tokens == 0 (MEGAMOE_ERR_NULL_POINTER), every top-k index in
 * [-1, E) (else MEGAMOE_ERR_BAD_TOPK_INDEX). Failures leave a message naming
 * the argument in megamoe_last_error(); y is untouched on a validation
 * failure. MEGAMOE_ERR_OUT_OF_MEMORY when a scratch allocation fails. */
megamoe_status ref_layer_forward(const megamoe_config* cfg, int num_ranks, const ref_rank_data* ranks);

#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_REF_H */
