/* Number formats of the reference: e4m3, bf16, the group quantizer and the
 * diff metric, each against an independent formulation. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ref.h"
#include "unit.h"

static uint32_t bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

static float float_of(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* ---- e4m3 ---------------------------------------------------------------- */

/* Value of a non-NaN e4m3 code from the textbook formula (bias 7, 3 mantissa
 * bits, exponent field 0 subnormal). */
static double e4m3_formula(int code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  const double mag = exponent == 0 ? ldexp(mantissa / 8.0, -6) : ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (code & 0x80) ? -mag : mag;
}

static int e4m3_is_nan_code(int code) { return (code & 0x7F) == 0x7F; }

/* Nearest of all finite non-negative codes by distance, ties to the even
 * mantissa; beyond the largest code that is 448 (saturation). NaN -> 0x7F. */
static uint8_t e4m3_brute_force(float x) {
  if (isnan(x)) return 0x7F;
  const int negative = signbit(x) != 0;
  static double candidates[0x7F];
  static int have_candidates = 0;
  if (!have_candidates) {
    for (int c = 0; c <= 0x7E; ++c) candidates[c] = e4m3_formula(c);
    have_candidates = 1;
  }
  int best = 0x7E;
  if (!isinf(x)) {
    const double mag = fabs((double)x);
    double best_dist = INFINITY;
    for (int c = 0; c <= 0x7E; ++c) {
      const double d = fabs(mag - candidates[c]);
      if (d < best_dist || (d == best_dist && (c & 1) == 0)) {
        best = c;
        best_dist = d;
      }
    }
  }
  return (uint8_t)(negative ? best | 0x80 : best);
}

static mm_test_result test_e4m3_decode_all_codes(void) {
  for (int c = 0; c < 256; ++c) {
    const float got = ref_e4m3_decode((uint8_t)c);
    if (e4m3_is_nan_code(c)) {
      CHECK_MSG(isnan(got), "code 0x%02X decoded to %g, want NaN", c, got);
      continue;
    }
    const double want = e4m3_formula(c);
    CHECK_MSG((double)got == want && (signbit(got) != 0) == (signbit(want) != 0),
              "code 0x%02X decoded to %a, want %a", c, got, want);
  }
  CHECK(ref_e4m3_decode(0x7E) == 448.0f);
  CHECK(ref_e4m3_decode(0xFE) == -448.0f);
  CHECK(ref_e4m3_decode(0x01) == 0x1p-9f);
  CHECK(ref_e4m3_decode(0x08) == 0x1p-6f);
  CHECK(ref_e4m3_decode(0x38) == 1.0f);
  return MM_TEST_PASS;
}

static mm_test_result test_e4m3_roundtrip_codes(void) {
  for (int c = 0; c < 256; ++c) {
    if (e4m3_is_nan_code(c)) continue;
    const uint8_t again = ref_e4m3_encode(ref_e4m3_decode((uint8_t)c));
    CHECK_MSG(again == c, "encode(decode(0x%02X)) = 0x%02X", c, again);
  }
  return MM_TEST_PASS;
}

static mm_test_result test_e4m3_special_values(void) {
  CHECK_EQ_INT(ref_e4m3_encode(NAN), 0x7F);
  CHECK_EQ_INT(ref_e4m3_encode(-NAN), 0x7F);
  CHECK_EQ_INT(ref_e4m3_encode(float_of(0x7F800001u)), 0x7F); /* signaling NaN */
  CHECK_EQ_INT(ref_e4m3_encode(float_of(0xFFC12345u)), 0x7F);
  CHECK_EQ_INT(ref_e4m3_encode(INFINITY), 0x7E);
  CHECK_EQ_INT(ref_e4m3_encode(-INFINITY), 0xFE);
  CHECK_EQ_INT(ref_e4m3_encode(FLT_MAX), 0x7E);
  CHECK_EQ_INT(ref_e4m3_encode(-1e30f), 0xFE);
  CHECK_EQ_INT(ref_e4m3_encode(448.0f), 0x7E);
  CHECK_EQ_INT(ref_e4m3_encode(460.0f), 0x7E);
  CHECK_EQ_INT(ref_e4m3_encode(464.0f), 0x7E); /* tie between 448 and (absent) 480: even */
  CHECK_EQ_INT(ref_e4m3_encode(nextafterf(464.0f, 1e9f)), 0x7E);
  CHECK_EQ_INT(ref_e4m3_encode(-500.0f), 0xFE);
  CHECK_EQ_INT(ref_e4m3_encode(0.0f), 0x00);
  CHECK_EQ_INT(ref_e4m3_encode(-0.0f), 0x80);
  CHECK_EQ_INT(ref_e4m3_encode(-1e-30f), 0x80);  /* underflow keeps the sign */
  CHECK_EQ_INT(ref_e4m3_encode(0x1p-10f), 0x00); /* tie between 0 and 2^-9: even */
  CHECK_EQ_INT(ref_e4m3_encode(nextafterf(0x1p-10f, 1.0f)), 0x01);
  CHECK_EQ_INT(ref_e4m3_encode(3 * 0x1p-10f), 0x02);  /* tie between 1 and 2 (x 2^-9): even */
  CHECK_EQ_INT(ref_e4m3_encode(15 * 0x1p-10f), 0x08); /* tie 7 x 2^-9 / 2^-6 carries into the exponent */
  CHECK_EQ_INT(ref_e4m3_encode(1.0625f), 0x38);       /* tie 1 / 1.125: even */
  CHECK_EQ_INT(ref_e4m3_encode(1.1875f), 0x3A);       /* tie 1.125 / 1.25: even */
  CHECK_EQ_INT(ref_e4m3_encode(-1.1875f), 0xBA);
  CHECK_EQ_INT(ref_e4m3_encode(15.5f), 0x58);         /* tie 15 / 16 carries into the exponent */
  CHECK_EQ_INT(ref_e4m3_encode(float_of(0x00000001u)), 0x00); /* fp32 subnormal */
  return MM_TEST_PASS;
}

/* A float from a mix of the cases that matter: any bit pattern, the e4m3
 * range with random mantissas, exact midpoints between codes (and their
 * neighbours), codes themselves, and the edges near 448 and 2^-6 / 2^-9. */
static float e4m3_test_value(mm_rng* rng) {
  const uint64_t kind = mm_rng_below(rng, 100);
  const uint32_t sign = (uint32_t)mm_rng_below(rng, 2) << 31;
  if (kind < 25) return float_of((uint32_t)mm_rng_next(rng));
  if (kind < 65) {
    const uint32_t exponent = (uint32_t)(127 - 14 + (int)mm_rng_below(rng, 25)); /* 2^-14 .. 2^10 */
    return float_of(sign | exponent << 23 | ((uint32_t)mm_rng_next(rng) & 0x7FFFFFu));
  }
  const int code = (int)mm_rng_below(rng, 0x7E);
  const float lo = (float)e4m3_formula(code), hi = (float)e4m3_formula(code + 1);
  float v;
  if (kind < 85) {
    v = (lo + hi) * 0.5f; /* exact: a few significant bits */
    const uint64_t nudge = mm_rng_below(rng, 3);
    if (nudge == 1) v = nextafterf(v, 0.0f);
    if (nudge == 2) v = nextafterf(v, 1e9f);
  } else if (kind < 92) {
    v = lo;
  } else {
    static const float edges[] = {448.0f, 464.0f, 480.0f, 0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f};
    v = edges[mm_rng_below(rng, sizeof edges / sizeof edges[0])];
    v = v * (float)(1.0 + (mm_rng_uniform(rng) - 0.5) * 0.1);
  }
  return float_of(bits_of(v) | sign);
}

static mm_test_result test_e4m3_random_vs_brute_force(void) {
  mm_rng rng = unit_rng(1);
  const int count = 1200000;
  for (int i = 0; i < count; ++i) {
    const float x = e4m3_test_value(&rng);
    const uint8_t got = ref_e4m3_encode(x), want = e4m3_brute_force(x);
    CHECK_MSG(got == want, "encode(%a) [bits 0x%08X] = 0x%02X, brute force 0x%02X", x, bits_of(x),
              got, want);
  }
  return MM_TEST_PASS;
}

const mm_test unit_suite_e4m3[] = {
    {"e4m3.decode_all_codes", test_e4m3_decode_all_codes},
    {"e4m3.roundtrip_codes", test_e4m3_roundtrip_codes},
    {"e4m3.special_values", test_e4m3_special_values},
    {"e4m3.random_vs_brute_force", test_e4m3_random_vs_brute_force},
    {NULL, NULL},
};

/* ---- bf16 ---------------------------------------------------------------- */

static int bf16_is_quiet_nan(uint16_t v) { return (v & 0x7F80) == 0x7F80 && (v & 0x0040) != 0; }

/* Nearest bf16 by distance between the truncated value and the next one up
 * in magnitude (2^128, i.e. inf, past the largest), ties to even. */
static uint16_t bf16_by_distance(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t lo = b & 0xFFFF0000u;
  if (lo == b) return (uint16_t)(b >> 16);
  const double v_lo = float_of(lo);
  const double v_hi = (lo & 0x7FFFFFFFu) == 0x7F7F0000u ? copysign(0x1p128, x) : float_of(lo + 0x10000u);
  const double d_lo = fabs((double)x - v_lo), d_hi = fabs(v_hi - (double)x);
  if (d_lo < d_hi) return (uint16_t)(lo >> 16);
  if (d_hi < d_lo) return (uint16_t)((lo + 0x10000u) >> 16);
  return (uint16_t)(((lo >> 16) & 1u) ? (lo + 0x10000u) >> 16 : lo >> 16);
}

static mm_test_result test_bf16_ties_to_even(void) {
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x3F808000u)), 0x3F80);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x3F818000u)), 0x3F82);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x3F808001u)), 0x3F81);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x3F807FFFu)), 0x3F80);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0xBF808000u)), 0xBF80);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0xBF818000u)), 0xBF82);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x3FFF8000u)), 0x4000); /* carry into the exponent */
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x00008000u)), 0x0000); /* subnormal tie */
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x00018000u)), 0x0002);
  CHECK_EQ_INT(ref_bf16_encode(-0.0f), 0x8000);
  CHECK(ref_bf16_round(1.0f) == 1.0f);
  CHECK(ref_bf16_round(float_of(0x3F818000u)) == float_of(0x3F820000u));
  return MM_TEST_PASS;
}

static mm_test_result test_bf16_overflow_and_nan(void) {
  CHECK_EQ_INT(ref_bf16_encode(FLT_MAX), 0x7F80);
  CHECK_EQ_INT(ref_bf16_encode(-FLT_MAX), 0xFF80);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x7F7F7FFFu)), 0x7F7F);
  CHECK_EQ_INT(ref_bf16_encode(float_of(0x7F7F8000u)), 0x7F80); /* tie, odd below: up to inf */
  CHECK_EQ_INT(ref_bf16_encode(INFINITY), 0x7F80);
  CHECK_EQ_INT(ref_bf16_encode(-INFINITY), 0xFF80);
  CHECK(isinf(ref_bf16_decode(0x7F80)) && ref_bf16_decode(0x7F80) > 0);
  /* NaNs whose payload sits in the low half must not become inf. */
  const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7F80FFFFu};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; ++i) {
    const uint16_t v = ref_bf16_encode(float_of(nans[i]));
    CHECK_MSG(bf16_is_quiet_nan(v), "NaN 0x%08X encoded to 0x%04X", nans[i], v);
    CHECK(isnan(ref_bf16_decode(v)));
    CHECK(isnan(ref_bf16_round(float_of(nans[i]))));
  }
  return MM_TEST_PASS;
}

static mm_test_result test_bf16_decode_all_codes(void) {
  for (uint32_t v = 0; v < 0x10000u; ++v) {
    const int exponent = (int)((v >> 7) & 0xFF), mantissa = (int)(v & 0x7F);
    const float got = ref_bf16_decode((uint16_t)v);
    if (exponent == 0xFF && mantissa != 0) {
      CHECK_MSG(isnan(got), "0x%04X decoded to %g", v, got);
      continue;
    }
    double mag = exponent == 0xFF ? INFINITY
                 : exponent == 0  ? ldexp(mantissa / 128.0, -126)
                                  : ldexp(1.0 + mantissa / 128.0, exponent - 127);
    const double want = (v & 0x8000u) ? -mag : mag;
    CHECK_MSG((double)got == want && (signbit(got) != 0) == (signbit(want) != 0),
              "0x%04X decoded to %a, want %a", v, got, want);
  }
  return MM_TEST_PASS;
}

static mm_test_result test_bf16_random_vs_distance(void) {
  mm_rng rng = unit_rng(2);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t b = (uint32_t)mm_rng_next(&rng);
    if (i % 4 == 1) b = (b & 0xFFFF0000u) | 0x8000u; /* exact ties */
    if (i % 4 == 2) b = (b & 0x807FFFFFu) | (uint32_t)(100 + mm_rng_below(&rng, 56)) << 23; /* |x| near 1 */
    const float x = float_of(b);
    const uint16_t got = ref_bf16_encode(x);
    if (isnan(x)) {
      CHECK_MSG(bf16_is_quiet_nan(got), "NaN 0x%08X encoded to 0x%04X", b, got);
      continue;
    }
    const uint16_t want = bf16_by_distance(x);
    CHECK_MSG(got == want, "encode(0x%08X) = 0x%04X, by distance 0x%04X", b, got, want);
  }
  return MM_TEST_PASS;
}

const mm_test unit_suite_bf16[] = {
    {"bf16.ties_to_even", test_bf16_ties_to_even},
    {"bf16.overflow_and_nan", test_bf16_overflow_and_nan},
    {"bf16.decode_all_codes", test_bf16_decode_all_codes},
    {"bf16.random_vs_distance", test_bf16_random_vs_distance},
    {NULL, NULL},
};

/* ---- quantizer ----------------------------------------------------------- */

/* Checks one quantized group against the contract: sf from amax, every code
 * the brute-force nearest of a[i] / sf, and the dequantized values within
 * half an e4m3 step (relative 2^-4 for normal codes) of the input. */
static mm_test_result check_quantized_group(const float* a, int n, const uint8_t* q, float sf) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(a[i]));
  const float want_sf = fmaxf(amax, 1e-10f) / 448.0f;
  CHECK_MSG(sf == want_sf, "sf %a, want %a", sf, want_sf);
  for (int i = 0; i < n; ++i) {
    const uint8_t want = e4m3_brute_force(a[i] / sf);
    CHECK_MSG(q[i] == want, "q[%d] = 0x%02X for %a / %a, want 0x%02X", i, q[i], a[i], sf, want);
    const double back = (double)ref_e4m3_decode(q[i]) * sf;
    CHECK_MSG(!isnan(back) && fabs(ref_e4m3_decode(q[i])) <= 448.0f, "q[%d] = 0x%02X", i, q[i]);
    const double tolerance = fmax(fabs((double)a[i]) * 0x1p-4, 0x1p-10 * sf) * 1.0001;
    CHECK_MSG(fabs(back - a[i]) <= tolerance, "a[%d] = %g dequantized to %g", i, a[i], back);
  }
  return MM_TEST_PASS;
}

static mm_test_result test_quant_all_zero(void) {
  float a[128] = {0};
  uint8_t q[128];
  memset(q, 0xAB, sizeof q);
  float sf = -1.0f;
  ref_quantize_group(a, 128, q, &sf);
  CHECK(sf == 1e-10f / 448.0f);
  for (int i = 0; i < 128; ++i) CHECK_EQ_INT(q[i], 0);
  return MM_TEST_PASS;
}

static mm_test_result test_quant_tiny_amax(void) {
  mm_rng rng = unit_rng(3);
  float a[64];
  uint8_t q[64];
  float sf;
  /* amax below 1e-10: the floor sets the scale, codes stay small. */
  for (int i = 0; i < 64; ++i) a[i] = (float)(mm_rng_normal(&rng) * 1e-12);
  ref_quantize_group(a, 64, q, &sf);
  CHECK(sf == 1e-10f / 448.0f);
  for (int i = 0; i < 64; ++i) {
    CHECK_EQ_INT(q[i], e4m3_brute_force(a[i] / sf));
    CHECK(fabsf(ref_e4m3_decode(q[i])) <= 448.0f * 0.1f);
  }
  if (check_quantized_group(a, 64, q, sf) != MM_TEST_PASS) return MM_TEST_FAIL;
  /* amax just above the floor: the largest element maps to 448. */
  for (int i = 0; i < 64; ++i) a[i] = (float)(mm_rng_uniform(&rng) * 1e-10);
  a[17] = 3e-10f;
  ref_quantize_group(a, 64, q, &sf);
  CHECK(sf == 3e-10f / 448.0f);
  CHECK_EQ_INT(q[17], 0x7E);
  return check_quantized_group(a, 64, q, sf);
}

static mm_test_result test_quant_saturation(void) {
  mm_rng rng = unit_rng(4);
  for (int round = 0; round < 200; ++round) {
    float a[128];
    uint8_t q[128];
    float sf;
    const double spread = ldexp(1.0, (int)mm_rng_below(&rng, 60) - 30);
    for (int i = 0; i < 128; ++i) a[i] = (float)(mm_rng_normal(&rng) * spread);
    const int peak = (int)mm_rng_below(&rng, 128);
    a[peak] = (float)(spread * 8.0) * (round % 2 ? -1.0f : 1.0f);
    ref_quantize_group(a, 128, q, &sf);
    /* The peak lands on +-448 (a / (a / 448) rounds to 448 at most). */
    CHECK_MSG(q[peak] == (round % 2 ? 0xFE : 0x7E), "peak %g -> 0x%02X", a[peak], q[peak]);
    for (int i = 0; i < 128; ++i) CHECK(!e4m3_is_nan_code(q[i]));
    if (check_quantized_group(a, 128, q, sf) != MM_TEST_PASS) return MM_TEST_FAIL;
  }
  return MM_TEST_PASS;
}

static mm_test_result test_quant_sign_symmetry(void) {
  mm_rng rng = unit_rng(5);
  for (int round = 0; round < 200; ++round) {
    float a[128], neg[128];
    uint8_t q[128], q_neg[128];
    float sf, sf_neg;
    for (int i = 0; i < 128; ++i) {
      a[i] = (float)(mm_rng_normal(&rng) * 3.0);
      neg[i] = -a[i];
    }
    ref_quantize_group(a, 128, q, &sf);
    ref_quantize_group(neg, 128, q_neg, &sf_neg);
    CHECK(sf == sf_neg);
    for (int i = 0; i < 128; ++i) CHECK_MSG((q[i] ^ 0x80) == q_neg[i], "%g: 0x%02X vs 0x%02X", a[i], q[i], q_neg[i]);
  }
  return MM_TEST_PASS;
}

static mm_test_result quantize_random_groups(int n, uint64_t salt) {
  mm_rng rng = unit_rng(salt);
  for (int round = 0; round < 500; ++round) {
    float a[128];
    uint8_t q[128];
    float sf;
    const double spread = ldexp(1.0, (int)mm_rng_below(&rng, 40) - 20);
    for (int i = 0; i < n; ++i) a[i] = (float)(mm_rng_normal(&rng) * spread);
    if (round % 7 == 0) a[mm_rng_below(&rng, (uint64_t)n)] = 0.0f;
    ref_quantize_group(a, n, q, &sf);
    if (check_quantized_group(a, n, q, sf) != MM_TEST_PASS) return MM_TEST_FAIL;
  }
  return MM_TEST_PASS;
}

static mm_test_result test_quant_group_64(void) { return quantize_random_groups(64, 6); }
static mm_test_result test_quant_group_128(void) { return quantize_random_groups(128, 7); }

const mm_test unit_suite_quant[] = {
    {"quant.all_zero", test_quant_all_zero},
    {"quant.tiny_amax", test_quant_tiny_amax},
    {"quant.saturation", test_quant_saturation},
    {"quant.sign_symmetry", test_quant_sign_symmetry},
    {"quant.group_64", test_quant_group_64},
    {"quant.group_128", test_quant_group_128},
    {NULL, NULL},
};

/* ---- diff metric --------------------------------------------------------- */

static mm_test_result test_diff_values(void) {
  mm_rng rng = unit_rng(8);
  float a[257], b[257], zero[257] = {0};
  for (int i = 0; i < 257; ++i) {
    a[i] = (float)mm_rng_normal(&rng);
    b[i] = -a[i];
  }
  CHECK(ref_diff(a, a, 257) == 0.0);
  CHECK(ref_diff(zero, zero, 257) == 0.0);
  CHECK(ref_diff(a, b, 257) == 2.0);
  CHECK(fabs(ref_diff(a, zero, 257) - 1.0) < 1e-15);
  const float x[2] = {1.0f, 2.0f}, y[2] = {2.0f, 1.0f};
  CHECK(fabs(ref_diff(x, y, 2) - 0.2) < 1e-15); /* 1 - 2*4/10 */
  /* A small perturbation gives a small positive diff. */
  for (int i = 0; i < 257; ++i) b[i] = a[i] * (1.0f + 0.01f * (float)mm_rng_normal(&rng));
  const double d = ref_diff(a, b, 257);
  CHECK_MSG(d > 0.0 && d < 1e-3, "diff %g", d);
  a[100] = NAN;
  CHECK(isnan(ref_diff(a, b, 257)));
  CHECK(isnan(ref_diff(b, a, 257)));
  CHECK(ref_diff(a, b, 0) == 0.0);
  return MM_TEST_PASS;
}

static mm_test_result test_diff_bf16_values(void) {
  mm_rng rng = unit_rng(9);
  uint16_t a[300], b[300], zero[300];
  for (int i = 0; i < 300; ++i) {
    a[i] = ref_bf16_encode((float)mm_rng_normal(&rng));
    b[i] = (uint16_t)(a[i] ^ 0x8000u);
    zero[i] = (uint16_t)(i % 2 ? 0x8000u : 0u); /* +-0 */
  }
  CHECK(ref_diff_bf16(a, a, 300) == 0.0);
  CHECK(ref_diff_bf16(zero, zero, 300) == 0.0);
  CHECK(ref_diff_bf16(a, b, 300) == 2.0);
  b[7] = 0x7FC0;
  CHECK(isnan(ref_diff_bf16(a, b, 300)));
  return MM_TEST_PASS;
}

const mm_test unit_suite_diff[] = {
    {"diff.values", test_diff_values},
    {"diff.bf16_values", test_diff_bf16_values},
    {NULL, NULL},
};
