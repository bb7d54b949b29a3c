/* Number formats of the reference: e4m3, bf16, the group quantizer and the
 * diff metric. See ref.h for the contract. */
#include <math.h>
#include <string.h>

#include "ref.h"

static uint32_t float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

static float bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

uint8_t ref_e4m3_encode(float x) {
  const uint32_t bits = float_bits(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
  /* CUDA's host conversion canonicalizes every NaN to 0x7FFFFFFF first, so
   * the sign is lost and the result is always 0x7F. */
  if (abs_bits > 0x7F800000u) return 0x7F;
  const float mag = bits_float(abs_bits);
  /* 464 = 448 + half an ulp: above it (and +-inf) saturate; 464 itself is a
   * tie that goes to the even mantissa of 448 in the normal path below. */
  if (mag > 464.0f) return (uint8_t)(sign | 0x7E);
  if (mag >= 0x1p-6f) {
    /* Normal e4m3: keep 3 of the 23 fp32 mantissa bits, round the other 20.
     * A carry out of the mantissa correctly bumps the exponent. */
    const uint32_t exponent = (abs_bits >> 23) - 127u + 7u; /* 1..15 */
    const uint32_t mantissa = abs_bits & 0x7FFFFFu;
    uint32_t code = (exponent << 3) | (mantissa >> 20);
    const uint32_t dropped = mantissa & 0xFFFFFu;
    if (dropped > 0x80000u || (dropped == 0x80000u && (code & 1u))) code++;
    return (uint8_t)(sign | code);
  }
  /* Subnormal e4m3: multiples of 2^-9. Scaling by 512 is exact and lands
   * below 8, where the fractional part is exact too. Rounding 7.5+ gives 8,
   * which is the code of the smallest normal 2^-6. */
  const float scaled = mag * 512.0f;
  uint32_t units = (uint32_t)scaled;
  const float frac = scaled - (float)units;
  if (frac > 0.5f || (frac == 0.5f && (units & 1u))) units++;
  return (uint8_t)(sign | units);
}

float ref_e4m3_decode(uint8_t v) {
  if ((v & 0x7Fu) == 0x7Fu) return NAN;
  const int exponent = (v >> 3) & 0xF;
  const int mantissa = v & 0x7;
  /* Subnormal: m * 2^-9; normal: (8 + m) * 2^(e - 7 - 3). */
  const float mag = exponent == 0 ? ldexpf((float)mantissa, -9)
                                  : ldexpf((float)(8 + mantissa), exponent - 10);
  return (v & 0x80u) ? -mag : mag;
}

uint16_t ref_bf16_encode(float x) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  /* Adding 0x7FFF plus the kept lsb rounds the low half to nearest even;
   * a carry into the exponent is the right answer, up to inf. */
  const uint32_t kept_lsb = (bits >> 16) & 1u;
  return (uint16_t)((bits + 0x7FFFu + kept_lsb) >> 16);
}

float ref_bf16_decode(uint16_t v) { return bits_float((uint32_t)v << 16); }

float ref_bf16_round(float x) { return ref_bf16_decode(ref_bf16_encode(x)); }

void ref_quantize_group(const float* a, int n, uint8_t* q, float* sf) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float m = fabsf(a[i]);
    if (m > amax) amax = m; /* a NaN compares false: it does not take part */
  }
  const float scale = (amax > 1e-10f ? amax : 1e-10f) / REF_E4M3_MAX;
  for (int i = 0; i < n; ++i) q[i] = ref_e4m3_encode(a[i] / scale);
  *sf = scale;
}

/* Accumulates one pair into the two sums of the metric; 1 when a value is NaN. */
static int diff_accumulate(double a, double b, double* sum_ab, double* sum_sq) {
  if (isnan(a) || isnan(b)) return 1;
  *sum_ab += a * b;
  *sum_sq += a * a + b * b;
  return 0;
}

static double diff_finish(double sum_ab, double sum_sq) {
  if (sum_sq == 0.0) return 0.0;
  return 1.0 - 2.0 * sum_ab / sum_sq;
}

double ref_diff(const float* a, const float* b, size_t n) {
  double sum_ab = 0.0, sum_sq = 0.0;
  for (size_t i = 0; i < n; ++i)
    if (diff_accumulate(a[i], b[i], &sum_ab, &sum_sq)) return NAN;
  return diff_finish(sum_ab, sum_sq);
}

double ref_diff_bf16(const uint16_t* a, const uint16_t* b, size_t n) {
  double sum_ab = 0.0, sum_sq = 0.0;
  for (size_t i = 0; i < n; ++i)
    if (diff_accumulate(ref_bf16_decode(a[i]), ref_bf16_decode(b[i]), &sum_ab, &sum_sq))
      return NAN;
  return diff_finish(sum_ab, sum_sq);
}
