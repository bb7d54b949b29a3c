/* GPU tests of the grouped FP8 GEMM engines (issue 4): the wgmma engine
 * against a CPU reference in double (small shapes, every tile shape, every
 * output, both A-scale and B-scale blocks), against the simple engine and
 * against cuBLASLt block-scaled FP8 (large shapes).
 *
 * Bounds (diff is DESIGN.md's metric, 1 - 2 sum(ab) / sum(a^2 + b^2)):
 *   fp32 / bf16 output vs double:  diff < 1e-5, and per element
 *     |gpu - ref| <= 1e-2 rms(ref) + rel |ref| (rel 1e-3 fp32, 2^-7 bf16).
 *     The GPU accumulates each 128-K (or 64-K) block in the tensor cores
 *     (fp32 accumulators, ~14 significant bits inside a block) and promotes
 *     per block in fp32, so the element error is ~1e-4 of the block sums'
 *     magnitude, which run up to ~10x the output's rms: errors up to 1.3e-3
 *     rms were seen on the H200 (one element in a 512-K problem), hence
 *     1e-2 rms per element; the diff stays ~1e-8. bf16 rounding adds a relative
 *     error up to 2^-9 (diff ~1e-6). 1e-5 leaves a margin of 10x over bf16
 *     rounding and catches any wrong tile, row or scale (those give diff >
 *     1e-3); the per-element bound catches single wrong elements.
 *   SwiGLU fp8 vs double: per group sf within 1e-3 relative of the double
 *     max(amax, 1e-10) / 448 (the fp32 GEMM moves amax by ~1e-5), and the
 *     group's largest |q| is exactly 448 (q = e4m3(a / sf) of the amax
 *     element); every q * sf within 2^-3 |a| + 2^-9 sf + da of a (one e4m3
 *     ulp: half an ulp of rounding plus a flip at a tie; 2^-9 sf is the
 *     subnormal step; da carries the accumulation error of g and u into a:
 *     da = w (|silu'(g) u| + |silu(g)|) kAccumTol rms(h), which dominates
 *     for the small a of a group); at most 5% + 2 codes differ from the
 *     reference's own quantization; diff of the dequantized values < 2e-3
 *     (e4m3 rounding alone gives ~4e-4).
 *   Engine vs engine (simple, cuBLASLt): diff < 1e-5 (fp32 / bf16), and for
 *     SwiGLU dequantized diff < 1e-3 and sf within 1e-3.
 * Outputs are poisoned with 0xFF bytes before every run; every valid element
 * must be written and every other byte (padding rows, rows outside every
 * expert) must keep the poison. Inputs are fresh random values (never zeros):
 * padding rows of A and their scales hold random bytes, NaN patterns
 * included, which must not leak into valid rows. */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/gemm_cublaslt.cuh"
#include "comm/wait.cuh"
#include "gemm/gemm.h"
#include "gpu_suites.h"

extern "C" {
#include "host/errors.h"
}

namespace {

/* ---- small host helpers ----------------------------------------------------- */

uint64_t test_seed() {
  const char* s = getenv("MEGAMOE_TEST_SEED");
  return s ? strtoull(s, NULL, 0) : 0x5eed0004ull;
}

float e4m3_decode(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return NAN;
  const float f = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
  return s ? -f : f;
}

uint8_t e4m3_encode(float x) { return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }

float bf16_decode(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

double uniform(mm_rng* r, double lo, double hi) { return lo + (hi - lo) * mm_rng_uniform(r); }

/* Fills n bytes with e4m3 codes of normal samples: a table of 256 fresh
 * normal draws indexed by random bytes (fast enough for 100 MB weights). */
void fill_fp8_normal(uint8_t* dst, int64_t n, mm_rng* r) {
  uint8_t table[256];
  for (int i = 0; i < 256; ++i) table[i] = e4m3_encode((float)mm_rng_normal(r));
  int64_t i = 0;
  while (i < n) {
    uint64_t bits = mm_rng_next(r);
    for (int j = 0; j < 8 && i < n; ++j, ++i, bits >>= 8) dst[i] = table[bits & 255];
  }
}

/* Random scale 2^u, u uniform in [lo, hi]. */
float rand_scale(mm_rng* r, double lo_exp, double hi_exp) { return (float)exp2(uniform(r, lo_exp, hi_exp)); }

struct diff_acc {
  double ab, aa, bb;
};
void diff_add(diff_acc* d, double a, double b) {
  d->ab += a * b;
  d->aa += a * a;
  d->bb += b * b;
}
double diff_value(const diff_acc* d) {
  const double den = d->aa + d->bb;
  if (den == 0) return 0;
  return 1.0 - 2.0 * d->ab / den;
}

/* ---- problems --------------------------------------------------------------- */

struct problem_desc {
  int num_experts;
  const int* counts;  /* valid rows per expert */
  const int* spare;   /* extra 128-row blocks after each expert's rows (NULL: none) */
  int tail_rows;      /* pool rows after the last expert (multiple of 128) */
  int n, k;
  int a_sf_block, b_sf_block_n;
  double sa_lo, sa_hi, sb_lo, sb_hi; /* log2 ranges of the scales */
};

/* Host and device copies of one problem's inputs. */
struct problem {
  problem_desc desc;
  int rows_cap;
  int* offset;       /* [E + 1] */
  int* count;        /* [E] */
  uint8_t* a;        /* [rows_cap, k] */
  float* a_sf;       /* [k / a_sf_block][rows_cap] */
  uint8_t* b;        /* [E, n, k] */
  float* b_sf;       /* [E][n / bsn][k / 128] */
  float* row_weight; /* [rows_cap] */
  int* d_offset;
  int* d_count;
  uint8_t* d_a;
  float* d_a_sf;
  uint8_t* d_b;
  float* d_b_sf;
  float* d_row_weight;
  mm_gemm_problem gp;
};

void problem_free(problem* p) {
  free(p->offset);
  free(p->count);
  free(p->a);
  free(p->a_sf);
  free(p->b);
  free(p->b_sf);
  free(p->row_weight);
  cudaFree(p->d_offset);
  cudaFree(p->d_count);
  cudaFree(p->d_a);
  cudaFree(p->d_a_sf);
  cudaFree(p->d_b);
  cudaFree(p->d_b_sf);
  cudaFree(p->d_row_weight);
  memset(p, 0, sizeof *p);
}

/* Expert of pool row r, or -1 when r is not a valid row. */
int row_expert(const problem* p, int r) {
  for (int e = 0; e < p->desc.num_experts; ++e)
    if (r >= p->offset[e] && r < p->offset[e] + p->count[e]) return e;
  return -1;
}

mm_test_result problem_make(problem* p, const problem_desc* d, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->desc = *d;
  const int E = d->num_experts;
  mm_rng rng = {seed};
  p->offset = (int*)malloc(sizeof(int) * (E + 1));
  p->count = (int*)malloc(sizeof(int) * (E > 0 ? E : 1));
  int row = 0;
  for (int e = 0; e < E; ++e) {
    p->offset[e] = row;
    p->count[e] = d->counts[e];
    row += (d->counts[e] + 127) / 128 * 128 + (d->spare ? d->spare[e] * 128 : 0);
  }
  p->offset[E] = row;
  p->rows_cap = row + d->tail_rows;
  if (p->rows_cap == 0) p->rows_cap = 128;
  const int64_t R = p->rows_cap, n = d->n, k = d->k;
  p->a = (uint8_t*)malloc(R * k);
  p->a_sf = (float*)malloc(sizeof(float) * (k / d->a_sf_block) * R);
  p->b = (uint8_t*)malloc((int64_t)E * n * k);
  p->b_sf = (float*)malloc(sizeof(float) * E * (n / d->b_sf_block_n) * (k / 128));
  p->row_weight = (float*)malloc(sizeof(float) * R);
  for (int64_t r = 0; r < R; ++r) {
    const int valid = row_expert(p, (int)r) >= 0;
    if (valid) {
      fill_fp8_normal(p->a + r * k, k, &rng);
    } else {
      for (int64_t i = 0; i < k; ++i) p->a[r * k + i] = (uint8_t)mm_rng_next(&rng); /* NaN codes included */
    }
    p->row_weight[r] = valid ? (float)uniform(&rng, 0.1, 1.0) : NAN;
    for (int64_t j = 0; j < k / d->a_sf_block; ++j) {
      float s = rand_scale(&rng, d->sa_lo, d->sa_hi);
      if (!valid) {
        uint32_t u = (uint32_t)mm_rng_next(&rng);
        memcpy(&s, &u, 4); /* anything, NaN and inf included */
      }
      p->a_sf[j * R + r] = s;
    }
  }
  fill_fp8_normal(p->b, (int64_t)E * n * k, &rng);
  for (int64_t i = 0; i < (int64_t)E * (n / d->b_sf_block_n) * (k / 128); ++i)
    p->b_sf[i] = rand_scale(&rng, d->sb_lo, d->sb_hi);

  CUDA_OK(cudaMalloc((void**)&p->d_offset, sizeof(int) * (E + 1)));
  CUDA_OK(cudaMalloc((void**)&p->d_count, sizeof(int) * (E > 0 ? E : 1)));
  CUDA_OK(cudaMalloc((void**)&p->d_a, R * k));
  CUDA_OK(cudaMalloc((void**)&p->d_a_sf, sizeof(float) * (k / d->a_sf_block) * R));
  CUDA_OK(cudaMalloc((void**)&p->d_b, (int64_t)E * n * k));
  CUDA_OK(cudaMalloc((void**)&p->d_b_sf, sizeof(float) * E * (n / d->b_sf_block_n) * (k / 128)));
  CUDA_OK(cudaMalloc((void**)&p->d_row_weight, sizeof(float) * R));
  CUDA_OK(cudaMemcpy(p->d_offset, p->offset, sizeof(int) * (E + 1), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(p->d_count, p->count, sizeof(int) * E, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(p->d_a, p->a, R * k, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(p->d_a_sf, p->a_sf, sizeof(float) * (k / d->a_sf_block) * R, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(p->d_b, p->b, (int64_t)E * n * k, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(p->d_b_sf, p->b_sf, sizeof(float) * E * (n / d->b_sf_block_n) * (k / 128),
                     cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(p->d_row_weight, p->row_weight, sizeof(float) * R, cudaMemcpyHostToDevice));

  p->gp = mm_gemm_problem_make(p->d_a, p->d_a_sf, d->a_sf_block, p->d_b, p->d_b_sf, d->b_sf_block_n, p->d_offset,
                               p->d_count, E, p->rows_cap, d->n, d->k);
  return MM_TEST_PASS;
}

/* CPU reference in double: h[r][c] for every valid row (other rows 0). */
double* reference_h(const problem* p) {
  const int64_t R = p->rows_cap, n = p->desc.n, k = p->desc.k;
  const int bsn = p->desc.b_sf_block_n, asb = p->desc.a_sf_block;
  double* h = (double*)calloc(R * n, sizeof(double));
  float* bdec = (float*)malloc(sizeof(float) * n * k);
  float* adec = (float*)malloc(sizeof(float) * k);
  for (int e = 0; e < p->desc.num_experts; ++e) {
    if (p->count[e] == 0) continue;
    for (int64_t i = 0; i < n * k; ++i) bdec[i] = e4m3_decode(p->b[(int64_t)e * n * k + i]);
    for (int r = p->offset[e]; r < p->offset[e] + p->count[e]; ++r) {
      for (int64_t i = 0; i < k; ++i) adec[i] = e4m3_decode(p->a[r * k + i]);
      for (int64_t c = 0; c < n; ++c) {
        const float* bc = bdec + c * k;
        double acc = 0;
        for (int64_t k0 = 0; k0 < k; k0 += 64) { /* 64-wide steps lie inside both scale blocks */
          double s = 0;
          for (int i = 0; i < 64; ++i) s += (double)adec[k0 + i] * (double)bc[k0 + i];
          const double sa = p->a_sf[(k0 / asb) * R + r];
          const double sb = p->b_sf[((int64_t)e * (n / bsn) + c / bsn) * (k / 128) + k0 / 128];
          acc += sa * sb * s;
        }
        h[r * n + c] = acc;
      }
    }
  }
  free(bdec);
  free(adec);
  return h;
}

/* SwiGLU reference of one pool row: a[j], j < n / 2. */
void reference_swiglu_row(const problem* p, const double* h_row, int row, int has_clamp, double clamp, double* a) {
  const int inter = p->desc.n / 2;
  for (int j = 0; j < inter; ++j) {
    const int gc = (j / 64) * 128 + j % 64;
    double g = h_row[gc], u = h_row[gc + 64];
    if (has_clamp) {
      g = fmin(g, clamp);
      u = fmin(fmax(u, -clamp), clamp);
    }
    a[j] = g / (1.0 + exp(-g)) * u * (double)p->row_weight[row];
  }
}

/* ---- checks ----------------------------------------------------------------- */

/* Per-element error of the fp32 accumulation, relative to the output's rms
 * (see the top of the file). */
static const double kAccumTol = 1e-2;

/* Checks a fp32 / bf16 output [rows_cap, n] against a double reference.
 * elem_bytes 4: fp32, 2: bf16. */
mm_test_result check_dense(const problem* p, const void* host_out, int elem_bytes, const double* ref,
                           double diff_bound, double rel, const char* what) {
  const int64_t R = p->rows_cap, n = p->desc.n;
  double rms = 0;
  int64_t nvalid = 0;
  for (int64_t r = 0; r < R; ++r)
    if (row_expert(p, (int)r) >= 0)
      for (int64_t c = 0; c < n; ++c) {
        rms += ref[r * n + c] * ref[r * n + c];
        nvalid++;
      }
  rms = nvalid ? sqrt(rms / nvalid) : 0;
  diff_acc dacc = {0, 0, 0};
  int64_t bad = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int valid = row_expert(p, (int)r) >= 0;
    const uint8_t* bytes = (const uint8_t*)host_out + r * n * elem_bytes;
    for (int64_t c = 0; c < n; ++c) {
      if (!valid) {
        for (int b = 0; b < elem_bytes; ++b)
          if (bytes[c * elem_bytes + b] != 0xFF) {
            if (bad++ < 5)
              fprintf(stderr, "    %s: row %lld (not valid) col %lld was written\n", what, (long long)r, (long long)c);
          }
        continue;
      }
      double g;
      uint32_t raw;
      if (elem_bytes == 4) {
        memcpy(&raw, bytes + c * 4, 4);
        float f;
        memcpy(&f, &raw, 4);
        g = f;
      } else {
        uint16_t v;
        memcpy(&v, bytes + c * 2, 2);
        raw = v == 0xFFFF ? 0xFFFFFFFFu : 0;
        g = bf16_decode(v);
      }
      if (raw == 0xFFFFFFFFu || !isfinite(g)) {
        if (bad++ < 5)
          fprintf(stderr, "    %s: row %lld col %lld not written (or not finite)\n", what, (long long)r, (long long)c);
        continue;
      }
      const double x = ref[r * n + c];
      diff_add(&dacc, g, x);
      if (fabs(g - x) > kAccumTol * rms + rel * fabs(x)) {
        if (bad++ < 5)
          fprintf(stderr, "    %s: row %lld col %lld: got %.9g want %.9g (rms %.3g)\n", what, (long long)r,
                  (long long)c, g, x, rms);
      }
    }
  }
  const double dv = diff_value(&dacc);
  CHECK_MSG(bad == 0, "%s: %lld bad elements", what, (long long)bad);
  CHECK_MSG(dv < diff_bound && dv == dv, "%s: diff %.3g >= %.3g", what, dv, diff_bound);
  return MM_TEST_PASS;
}

/* Checks the SwiGLU output (fp8 [rows_cap, n/2], sf [n/2/G][rows_cap]). */
mm_test_result check_swiglu(const problem* p, const uint8_t* q, const float* sf, const double* h, int group,
                            int has_clamp, double clamp, const char* what) {
  const int64_t R = p->rows_cap, n = p->desc.n, inter = n / 2, ngroups = inter / group;
  double* a = (double*)malloc(sizeof(double) * inter);
  double* da = (double*)malloc(sizeof(double) * inter);
  diff_acc dacc = {0, 0, 0};
  int64_t bad = 0, mism = 0, total = 0;
  double rms_h = 0;
  int64_t nh = 0;
  for (int64_t r = 0; r < R; ++r)
    if (row_expert(p, (int)r) >= 0)
      for (int64_t c = 0; c < n; ++c, ++nh) rms_h += h[r * n + c] * h[r * n + c];
  rms_h = nh ? sqrt(rms_h / nh) : 0;
  for (int64_t r = 0; r < R; ++r) {
    const int valid = row_expert(p, (int)r) >= 0;
    if (!valid) {
      for (int64_t j = 0; j < inter; ++j)
        if (q[r * inter + j] != 0xFF && bad++ < 5)
          fprintf(stderr, "    %s: row %lld (not valid) col %lld was written\n", what, (long long)r, (long long)j);
      for (int64_t g = 0; g < ngroups; ++g) {
        uint32_t u;
        memcpy(&u, &sf[g * R + r], 4);
        if (u != 0xFFFFFFFFu && bad++ < 5)
          fprintf(stderr, "    %s: sf of row %lld (not valid) group %lld was written\n", what, (long long)r,
                  (long long)g);
      }
      continue;
    }
    reference_swiglu_row(p, h + r * n, (int)r, has_clamp, clamp, a);
    for (int64_t j = 0; j < inter; ++j) { /* how far g and u's accumulation error moves a */
      const int64_t gc = (j / 64) * 128 + j % 64;
      const double g = h[r * n + gc], u = h[r * n + gc + 64], sig = 1.0 / (1.0 + exp(-g));
      const double dsilu = sig * (1.0 + g * (1.0 - sig));
      da[j] = fabs((double)p->row_weight[r]) * (fabs(dsilu * u) + fabs(g * sig)) * kAccumTol * rms_h;
    }
    for (int64_t g = 0; g < ngroups; ++g) {
      double amax = 0;
      for (int j = 0; j < group; ++j) amax = fmax(amax, fabs(a[g * group + j]));
      const double sf_ref = fmax(amax, 1e-10) / 448.0;
      const float s = sf[g * R + r];
      uint32_t su;
      memcpy(&su, &s, 4);
      if (su == 0xFFFFFFFFu || !(fabs(s / sf_ref - 1.0) <= 1e-3)) {
        if (bad++ < 5)
          fprintf(stderr, "    %s: row %lld group %lld: sf %.9g want %.9g\n", what, (long long)r, (long long)g, s,
                  sf_ref);
        continue;
      }
      float qmax = 0;
      for (int j = 0; j < group; ++j) {
        const int64_t col = g * group + j;
        const uint8_t byte = q[r * inter + col];
        const double deq = (double)e4m3_decode(byte) * (double)s;
        const double want = a[col];
        qmax = fmaxf(qmax, fabsf(e4m3_decode(byte)));
        total++;
        if (byte != e4m3_encode((float)(want / sf_ref))) mism++;
        if (!(fabs(deq - want) <= 0.125 * fabs(want) + ldexp((double)s, -9) + 1.125 * da[col])) {
          if (bad++ < 5)
            fprintf(stderr, "    %s: row %lld col %lld: q 0x%02x * sf = %.9g want %.9g\n", what, (long long)r,
                    (long long)col, byte, deq, want);
        }
        diff_add(&dacc, deq, want);
      }
      if (amax >= 1e-9 && qmax != 448.0f) {
        if (bad++ < 5)
          fprintf(stderr, "    %s: row %lld group %lld: max |q| %.9g, want exactly 448\n", what, (long long)r,
                  (long long)g, qmax);
      }
    }
  }
  free(a);
  free(da);
  const double dv = diff_value(&dacc);
  CHECK_MSG(bad == 0, "%s: %lld bad values", what, (long long)bad);
  CHECK_MSG(mism <= total / 20 + 2, "%s: %lld of %lld fp8 codes differ from the reference's quantization", what,
            (long long)mism, (long long)total);
  CHECK_MSG(dv < 2e-3 && dv == dv, "%s: diff %.3g", what, dv);
  return MM_TEST_PASS;
}

/* ---- running one engine ------------------------------------------------------- */

typedef megamoe_status (*engine_fn)(const mm_gemm_problem*, mm_gemm_output, void*, const mm_swiglu_epilogue*,
                                    mm_gemm_tile, cudaStream_t);

/* The problem with its output fields set (d for dense, sw for SwiGLU). */
mm_gemm_problem with_output(const mm_gemm_problem* p, mm_gemm_output out, void* d, const mm_swiglu_epilogue* sw) {
  mm_gemm_problem g = *p;
  g.out_kind = out;
  g.d = d;
  if (sw) g.swiglu = *sw;
  return g;
}

megamoe_status run_wgmma(const mm_gemm_problem* p, mm_gemm_output out, void* d, const mm_swiglu_epilogue* sw,
                         mm_gemm_tile tile, cudaStream_t s) {
  const mm_gemm_problem g = with_output(p, out, d, sw);
  return mm_gemm_wgmma(&g, tile, s);
}

megamoe_status run_simple(const mm_gemm_problem* p, mm_gemm_output out, void* d, const mm_swiglu_epilogue* sw,
                          mm_gemm_tile tile, cudaStream_t s) {
  (void)tile;
  const mm_gemm_problem g = with_output(p, out, d, sw);
  return mm_gemm_simple(&g, s);
}

/* Output buffers of one run, poisoned, and their host copies. */
struct outputs {
  void* d;        /* fp32 / bf16 [rows_cap, n] */
  uint8_t* q;     /* [rows_cap, n/2] */
  float* sf;      /* [n/2/64][rows_cap] (large enough for both groups) */
  void* h_d;
  uint8_t* h_q;
  float* h_sf;
};

mm_test_result outputs_alloc(outputs* o, const problem* p) {
  memset(o, 0, sizeof *o);
  const int64_t R = p->rows_cap, n = p->desc.n;
  CUDA_OK(cudaMalloc(&o->d, R * n * 4));
  CUDA_OK(cudaMalloc((void**)&o->q, R * n / 2));
  CUDA_OK(cudaMalloc((void**)&o->sf, sizeof(float) * (n / 2 / 64) * R));
  o->h_d = malloc(R * n * 4);
  o->h_q = (uint8_t*)malloc(R * n / 2);
  o->h_sf = (float*)malloc(sizeof(float) * (n / 2 / 64) * R);
  return MM_TEST_PASS;
}

void outputs_free(outputs* o) {
  cudaFree(o->d);
  cudaFree(o->q);
  cudaFree(o->sf);
  free(o->h_d);
  free(o->h_q);
  free(o->h_sf);
  memset(o, 0, sizeof *o);
}

/* Poisons, runs, synchronizes and copies back. */
mm_test_result run_engine(engine_fn fn, const problem* p, mm_gemm_output out, mm_gemm_tile tile, int group,
                          int has_clamp, float clamp, outputs* o) {
  const int64_t R = p->rows_cap, n = p->desc.n;
  CUDA_OK(cudaMemset(o->d, 0xFF, R * n * 4));
  CUDA_OK(cudaMemset(o->q, 0xFF, R * n / 2));
  CUDA_OK(cudaMemset(o->sf, 0xFF, sizeof(float) * (n / 2 / 64) * R));
  mm_swiglu_epilogue sw;
  memset(&sw, 0, sizeof sw); /* every field, the diagnostic ones included */
  sw.row_weight = p->d_row_weight;
  sw.group = group;
  sw.has_clamp = has_clamp;
  sw.clamp = clamp;
  sw.out = o->q;
  sw.out_sf = o->sf;
  CHECK_OK(fn(&p->gp, out, o->d, out == MM_GEMM_OUT_SWIGLU_FP8 ? &sw : NULL, tile, 0));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(o->h_d, o->d, R * n * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(o->h_q, o->q, R * n / 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(o->h_sf, o->sf, sizeof(float) * (n / 2 / 64) * R, cudaMemcpyDeviceToHost));
  return MM_TEST_PASS;
}

#define TRY_TEST(expr)                     \
  do {                                     \
    mm_test_result r_ = (expr);            \
    if (r_ != MM_TEST_PASS) return r_;     \
  } while (0)

/* Every tile with every output it has (the diagnostic one-partial tile: bf16). */
const mm_gemm_tile kTiles[] = {MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128, MM_GEMM_TILE_128x128,
                               MM_GEMM_TILE_64x256};
const int kNumTiles = (int)(sizeof kTiles / sizeof kTiles[0]);

/* The small problem of the CPU tests: empty experts, one row, partial
 * tiles of every height, a full 256-row expert, gaps between experts and
 * pool rows outside every expert. */
const int kSmallCounts[] = {200, 0, 1, 64, 129, 256, 77};
const int kSmallSpare[] = {0, 1, 0, 1, 0, 0, 2};

problem_desc small_desc(int a_sf_block, int b_sf_block_n, int k, bool big_scales) {
  problem_desc d;
  d.num_experts = 7;
  d.counts = kSmallCounts;
  d.spare = kSmallSpare;
  d.tail_rows = 128;
  d.n = 512;
  d.k = k;
  d.a_sf_block = a_sf_block;
  d.b_sf_block_n = b_sf_block_n;
  /* Small scales for the plain GEMM (the brief's [2^-10, 2^-6]); scales that
   * put h near 1 for SwiGLU, where silu's curvature and the clamp matter. */
  d.sa_lo = big_scales ? -3 : -10;
  d.sa_hi = big_scales ? -2 : -6;
  d.sb_lo = big_scales ? -4 : -10;
  d.sb_hi = big_scales ? -3 : -6;
  return d;
}

/* Every (a_sf_block, b_sf_block_n) combination; k 512 (4 K blocks: the ring
 * wraps across tiles) and one with k 1024 (8 K blocks: it wraps inside a tile). */
struct combo {
  int a_sf_block, b_sf_block_n, k;
};
const combo kCombos[] = {{128, 128, 512}, {64, 128, 512}, {128, 64, 512}, {64, 64, 1024}};
const int kNumCombos = 4;

/* ---- tests --------------------------------------------------------------------- */

mm_test_result dense_vs_cpu(mm_gemm_output out) {
  const uint64_t seed = test_seed();
  for (int ci = 0; ci < kNumCombos; ++ci) {
    const combo c = kCombos[ci];
    problem_desc d = small_desc(c.a_sf_block, c.b_sf_block_n, c.k, false);
    problem p;
    TRY_TEST(problem_make(&p, &d, seed + ci));
    double* h = reference_h(&p);
    outputs o;
    TRY_TEST(outputs_alloc(&o, &p));
    mm_test_result res = MM_TEST_PASS;
    /* Every tile runs the same m64n128k32 chains and the same promotion
     * order, so every tile's output must be bitwise the first tile's. */
    const int64_t out_bytes = (int64_t)p.rows_cap * d.n * (out == MM_GEMM_OUT_F32 ? 4 : 2);
    uint8_t* first = (uint8_t*)malloc(out_bytes);
    const int num_tiles = out == MM_GEMM_OUT_BF16 ? kNumTiles + 1 : kNumTiles;
    for (int t = 0; t < num_tiles && res == MM_TEST_PASS; ++t) {
      const mm_gemm_tile tile = t < kNumTiles ? kTiles[t] : MM_GEMM_TILE_128x128_1P;
      char what[160];
      snprintf(what, sizeof what, "%s tile %s a_sf_block %d b_sf_block_n %d k %d seed %llu",
               out == MM_GEMM_OUT_F32 ? "f32" : "bf16", mm_gemm_tile_name(tile), c.a_sf_block, c.b_sf_block_n,
               c.k, (unsigned long long)(seed + ci));
      res = run_engine(run_wgmma, &p, out, tile, 128, 0, 0.f, &o);
      if (res == MM_TEST_PASS)
        res = check_dense(&p, o.h_d, out == MM_GEMM_OUT_F32 ? 4 : 2, h, 1e-5,
                          out == MM_GEMM_OUT_F32 ? 1e-3 : ldexp(1.0, -7), what);
      if (res == MM_TEST_PASS) {
        if (t == 0) {
          memcpy(first, o.h_d, out_bytes);
        } else if (memcmp(first, o.h_d, out_bytes) != 0) {
          fprintf(stderr, "    tile %s differs bitwise from tile %s\n", mm_gemm_tile_name(tile),
                  mm_gemm_tile_name(kTiles[0]));
          res = MM_TEST_FAIL;
        }
      }
      if (res != MM_TEST_PASS) fprintf(stderr, "    (%s)\n", what);
    }
    free(first);
    /* The default tile choice too. */
    if (res == MM_TEST_PASS) {
      res = run_engine(run_wgmma, &p, out, MM_GEMM_TILE_AUTO, 128, 0, 0.f, &o);
      if (res == MM_TEST_PASS)
        res = check_dense(&p, o.h_d, out == MM_GEMM_OUT_F32 ? 4 : 2, h, 1e-5,
                          out == MM_GEMM_OUT_F32 ? 1e-3 : ldexp(1.0, -7), "auto tile");
    }
    outputs_free(&o);
    free(h);
    problem_free(&p);
    if (res != MM_TEST_PASS) return res;
  }
  return MM_TEST_PASS;
}

mm_test_result test_f32_vs_cpu(void) { return dense_vs_cpu(MM_GEMM_OUT_F32); }
mm_test_result test_bf16_vs_cpu(void) { return dense_vs_cpu(MM_GEMM_OUT_BF16); }

mm_test_result test_swiglu_vs_cpu(void) {
  const uint64_t seed = test_seed() + 100;
  for (int ci = 0; ci < kNumCombos; ++ci) {
    const combo c = kCombos[ci];
    problem_desc d = small_desc(c.a_sf_block, c.b_sf_block_n, c.k, true);
    problem p;
    TRY_TEST(problem_make(&p, &d, seed + ci));
    double* h = reference_h(&p);
    outputs o;
    TRY_TEST(outputs_alloc(&o, &p));
    mm_test_result res = MM_TEST_PASS;
    /* (tile, group, clamp) runs: group 64 on every tile, group 128 on 128x256. */
    struct run_cfg {
      mm_gemm_tile tile;
      int group;
      int has_clamp;
    } runs[] = {{MM_GEMM_TILE_128x256, 128, 0}, {MM_GEMM_TILE_128x256, 128, 1}, {MM_GEMM_TILE_128x256, 64, 0},
                {MM_GEMM_TILE_256x128, 64, 1},  {MM_GEMM_TILE_128x128, 64, 0},  {MM_GEMM_TILE_64x256, 64, 1},
                {MM_GEMM_TILE_64x256, 64, 0},   {MM_GEMM_TILE_64x256, 128, 0},  {MM_GEMM_TILE_64x256, 128, 1},
                {MM_GEMM_TILE_AUTO, 128, 1}};
    const float clamp = 0.5f;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0] && res == MM_TEST_PASS; ++i) {
      char what[200];
      snprintf(what, sizeof what, "swiglu tile %s group %d clamp %d a_sf_block %d b_sf_block_n %d k %d seed %llu",
               mm_gemm_tile_name(runs[i].tile), runs[i].group, runs[i].has_clamp, c.a_sf_block, c.b_sf_block_n, c.k,
               (unsigned long long)(seed + ci));
      res = run_engine(run_wgmma, &p, MM_GEMM_OUT_SWIGLU_FP8, runs[i].tile, runs[i].group, runs[i].has_clamp, clamp,
                       &o);
      if (res == MM_TEST_PASS)
        res = check_swiglu(&p, o.h_q, o.h_sf, h, runs[i].group, runs[i].has_clamp, clamp, what);
      if (res != MM_TEST_PASS) fprintf(stderr, "    (%s)\n", what);
    }
    outputs_free(&o);
    free(h);
    problem_free(&p);
    if (res != MM_TEST_PASS) return res;
  }
  return MM_TEST_PASS;
}

/* Every expert empty, and a single expert holding one row. Nothing but that
 * row may be written. */
mm_test_result test_empty_and_one_row(void) {
  const int zeros[] = {0, 0, 0};
  const int one[] = {1};
  for (int which = 0; which < 2; ++which) {
    problem_desc d = small_desc(128, 128, 256, true);
    d.num_experts = which == 0 ? 3 : 1;
    d.counts = which == 0 ? zeros : one;
    d.spare = NULL;
    d.tail_rows = 256;
    problem p;
    TRY_TEST(problem_make(&p, &d, test_seed() + 200 + which));
    double* h = reference_h(&p);
    outputs o;
    TRY_TEST(outputs_alloc(&o, &p));
    mm_test_result res = MM_TEST_PASS;
    for (int t = 0; t < kNumTiles && res == MM_TEST_PASS; ++t) {
      res = run_engine(run_wgmma, &p, MM_GEMM_OUT_F32, kTiles[t], 128, 0, 0.f, &o);
      if (res == MM_TEST_PASS) res = check_dense(&p, o.h_d, 4, h, 1e-5, 1e-3, which ? "one row f32" : "empty f32");
      if (res == MM_TEST_PASS) res = run_engine(run_wgmma, &p, MM_GEMM_OUT_SWIGLU_FP8, kTiles[t], 64, 0, 0.f, &o);
      if (res == MM_TEST_PASS) res = check_swiglu(&p, o.h_q, o.h_sf, h, 64, 0, 0.0, which ? "one row swiglu" : "empty swiglu");
      if (res != MM_TEST_PASS) fprintf(stderr, "    (tile %s)\n", mm_gemm_tile_name(kTiles[t]));
    }
    outputs_free(&o);
    free(h);
    problem_free(&p);
    if (res != MM_TEST_PASS) return res;
  }
  return MM_TEST_PASS;
}

/* Host-side checks reject bad problems with the right status. */
mm_test_result test_check_rejects(void) {
  problem_desc d = small_desc(128, 128, 256, true);
  const int counts[] = {5};
  d.num_experts = 1;
  d.counts = counts;
  d.spare = NULL;
  d.tail_rows = 0;
  problem p;
  TRY_TEST(problem_make(&p, &d, test_seed() + 300));
  outputs o;
  TRY_TEST(outputs_alloc(&o, &p));
  mm_swiglu_epilogue sw = {p.d_row_weight, 128, 0, 0.f, o.q, o.sf};
  mm_test_result res = MM_TEST_PASS;
#define EXPECT(expr, want)                                                                 \
  do {                                                                                     \
    megamoe_status st_ = (expr);                                                           \
    if (st_ != (want)) {                                                                   \
      fprintf(stderr, "    %s returned %s, want %s\n", #expr, megamoe_status_string(st_),  \
              megamoe_status_string(want));                                                \
      res = MM_TEST_FAIL;                                                                  \
    }                                                                                      \
  } while (0)
  mm_gemm_problem g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  EXPECT(mm_gemm_check(&g), MEGAMOE_OK);
  EXPECT(mm_gemm_check(NULL), MEGAMOE_ERR_NULL_POINTER);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, NULL, NULL);
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_NULL_POINTER);
  g = with_output(&p.gp, MM_GEMM_OUT_SWIGLU_FP8, NULL, NULL);
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_NULL_POINTER);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  g.k = 200;
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_SHAPE);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  g.a_sf_block = 32;
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_ARGUMENT);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  g.rows_cap = 100;
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_ARGUMENT);
  g = with_output(&p.gp, MM_GEMM_OUT_BF16, (uint8_t*)o.d + 8, NULL);
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_ARGUMENT); /* TMA stores need 16-byte alignment */
  g = with_output(&p.gp, MM_GEMM_OUT_BF16_SCATTER, NULL, NULL);
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_NULL_POINTER); /* no row table */
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  g.out_kind = 9;
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_ARGUMENT);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  g.timeout_ns = 0;
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_ARGUMENT);
  sw.group = 96;
  g = with_output(&p.gp, MM_GEMM_OUT_SWIGLU_FP8, NULL, &sw);
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_QUANT_GROUP);
  sw.group = 128;
  sw.has_clamp = 1;
  sw.clamp = -1.f;
  g = with_output(&p.gp, MM_GEMM_OUT_SWIGLU_FP8, NULL, &sw);
  EXPECT(mm_gemm_check(&g), MEGAMOE_ERR_BAD_CLAMP);
  sw.has_clamp = 0;
  g = with_output(&p.gp, MM_GEMM_OUT_SWIGLU_FP8, NULL, &sw);
  EXPECT(mm_gemm_wgmma(&g, MM_GEMM_TILE_128x128, 0), MEGAMOE_ERR_BAD_ARGUMENT); /* group 128 on a 64-column wave */
  EXPECT(mm_gemm_wgmma(&g, MM_GEMM_TILE_128x128_1P, 0), MEGAMOE_ERR_BAD_ARGUMENT); /* no SwiGLU on the diagnostic tile */
  EXPECT(mm_gemm_tile_check(MM_GEMM_TILE_128x256, MM_GEMM_OUT_BF16, 64, 128, MM_GEMM_MAX_EXPERTS, NULL), MEGAMOE_OK);
  EXPECT(mm_gemm_tile_check(MM_GEMM_TILE_128x256, MM_GEMM_OUT_BF16, 64, 128, MM_GEMM_MAX_EXPERTS + 1, NULL),
         MEGAMOE_ERR_BAD_EXPERTS);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  g.a = p.d_a + 1;
  EXPECT(mm_gemm_wgmma(&g, MM_GEMM_TILE_128x256, 0), MEGAMOE_ERR_BAD_ARGUMENT);
  g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
  EXPECT(mm_gemm_simple(&g, 0), MEGAMOE_OK);
  g.expert_a_offset = p.d_offset;
  EXPECT(mm_gemm_simple(&g, 0), MEGAMOE_ERR_NOT_IMPLEMENTED); /* the oracle has no hooks */
  CUDA_OK(cudaDeviceSynchronize());
#undef EXPECT
  outputs_free(&o);
  problem_free(&p);
  return res;
}

/* Large shapes against the simple engine: every output, default tiles and
 * 256x128. */
mm_test_result test_vs_simple_large(void) {
  const int counts[] = {700, 0, 1, 1536, 333, 128, 1000, 64};
  problem_desc d;
  d.num_experts = 8;
  d.counts = counts;
  d.spare = NULL;
  d.tail_rows = 256;
  d.n = 2048;
  d.k = 2048;
  d.a_sf_block = 128;
  d.b_sf_block_n = 64;
  d.sa_lo = -6;
  d.sa_hi = -5;
  d.sb_lo = -6;
  d.sb_hi = -5;
  problem p;
  TRY_TEST(problem_make(&p, &d, test_seed() + 400));
  outputs o1, o2;
  TRY_TEST(outputs_alloc(&o1, &p));
  TRY_TEST(outputs_alloc(&o2, &p));
  const int64_t R = p.rows_cap, n = d.n, inter = n / 2;
  mm_test_result res = MM_TEST_PASS;
  const mm_gemm_output outs[] = {MM_GEMM_OUT_F32, MM_GEMM_OUT_BF16, MM_GEMM_OUT_SWIGLU_FP8};
  const mm_gemm_tile tiles[] = {MM_GEMM_TILE_AUTO, MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128, MM_GEMM_TILE_128x128,
                                MM_GEMM_TILE_64x256};
  const int num_tiles = (int)(sizeof tiles / sizeof tiles[0]);
  for (int oi = 0; oi < 3 && res == MM_TEST_PASS; ++oi)
    for (int ti = 0; ti < num_tiles && res == MM_TEST_PASS; ++ti) {
      const mm_gemm_output out = outs[oi];
      /* Group 128 where the tile allows it (AUTO picks 128x256 for it). */
      const int group = (tiles[ti] == MM_GEMM_TILE_AUTO || tiles[ti] == MM_GEMM_TILE_128x256 ||
                         tiles[ti] == MM_GEMM_TILE_64x256)
                            ? 128
                            : 64;
      res = run_engine(run_simple, &p, out, MM_GEMM_TILE_AUTO, group, 1, 0.05f, &o1);
      if (res == MM_TEST_PASS) res = run_engine(run_wgmma, &p, out, tiles[ti], group, 1, 0.05f, &o2);
      if (res != MM_TEST_PASS) break;
      diff_acc dacc = {0, 0, 0};
      int64_t bad = 0;
      double sf_err = 0;
      for (int64_t r = 0; r < R; ++r) {
        const int valid = row_expert(&p, (int)r) >= 0;
        if (out == MM_GEMM_OUT_SWIGLU_FP8) {
          for (int64_t j = 0; j < inter; ++j) {
            const uint8_t q1 = o1.h_q[r * inter + j], q2 = o2.h_q[r * inter + j];
            if (!valid) {
              bad += q2 != 0xFF;
              continue;
            }
            const float s1 = o1.h_sf[(j / group) * R + r], s2 = o2.h_sf[(j / group) * R + r];
            sf_err = fmax(sf_err, fabs((double)s2 / s1 - 1.0));
            if (!(sf_err <= 1e-3)) bad++;
            diff_add(&dacc, (double)e4m3_decode(q1) * s1, (double)e4m3_decode(q2) * s2);
          }
        } else {
          for (int64_t c = 0; c < n; ++c) {
            double v1, v2;
            if (out == MM_GEMM_OUT_F32) {
              v1 = ((const float*)o1.h_d)[r * n + c];
              v2 = ((const float*)o2.h_d)[r * n + c];
              if (!valid) {
                uint32_t u;
                memcpy(&u, (const float*)o2.h_d + r * n + c, 4);
                bad += u != 0xFFFFFFFFu;
                continue;
              }
            } else {
              const uint16_t u2 = ((const uint16_t*)o2.h_d)[r * n + c];
              v1 = bf16_decode(((const uint16_t*)o1.h_d)[r * n + c]);
              v2 = bf16_decode(u2);
              if (!valid) {
                bad += u2 != 0xFFFF;
                continue;
              }
            }
            if (!isfinite(v2)) bad++;
            diff_add(&dacc, v1, v2);
          }
        }
      }
      const double dv = diff_value(&dacc);
      const double bound = out == MM_GEMM_OUT_SWIGLU_FP8 ? 1e-3 : 1e-5;
      if (bad || !(dv < bound)) {
        fprintf(stderr, "    vs simple: output %d tile %s: %lld bad, diff %.3g (bound %.1g), sf err %.3g\n", (int)out,
                mm_gemm_tile_name(tiles[ti]), (long long)bad, dv, bound, sf_err);
        res = MM_TEST_FAIL;
      }
    }
  outputs_free(&o1);
  outputs_free(&o2);
  problem_free(&p);
  return res;
}

/* Large shapes against cuBLASLt block-scaled FP8 (bf16 output), one
 * cuBLASLt matmul per expert. Expert row counts are multiples of 16
 * (cuBLASLt asks for multiples of 4 with these scale modes). */
mm_test_result test_vs_cublaslt_large(void) {
  const int counts[] = {512, 1024, 0, 2048, 144, 16, 640, 1200};
  problem_desc d;
  d.num_experts = 8;
  d.counts = counts;
  d.spare = NULL;
  d.tail_rows = 128;
  d.n = 4096;
  d.k = 4096;
  d.a_sf_block = 128;
  d.b_sf_block_n = 128;
  d.sa_lo = -10;
  d.sa_hi = -6;
  d.sb_lo = -10;
  d.sb_hi = -6;
  problem p;
  TRY_TEST(problem_make(&p, &d, test_seed() + 500));
  const int64_t R = p.rows_cap, n = d.n, k = d.k, L = k / 128;
  mm_lt lt;
  if (mm_lt_init(&lt)) {
    fprintf(stderr, "    cuBLASLt init: %s\n", lt.error);
    problem_free(&p);
    return MM_TEST_FAIL;
  }
  uint16_t *d_lt = NULL, *d_ours = NULL;
  float* d_asf_packed = NULL;
  CUDA_OK(cudaMalloc((void**)&d_lt, R * n * 2));
  CUDA_OK(cudaMalloc((void**)&d_ours, R * n * 2));
  CUDA_OK(cudaMalloc((void**)&d_asf_packed, sizeof(float) * L * R));
  CUDA_OK(cudaMemset(d_lt, 0, R * n * 2));
  mm_test_result res = MM_TEST_PASS;
  for (int e = 0; e < d.num_experts && res == MM_TEST_PASS; ++e) {
    const int c = p.count[e];
    if (c == 0) continue;
    float* packed = d_asf_packed + (int64_t)p.offset[e] * L; /* [L][c] */
    CUDA_OK(cudaMemcpy2D(packed, sizeof(float) * c, p.d_a_sf + p.offset[e], sizeof(float) * R, sizeof(float) * c, L,
                         cudaMemcpyDeviceToDevice));
    if (mm_lt_matmul(&lt, c, (int)n, (int)k, p.d_a + (int64_t)p.offset[e] * k, packed,
                     p.d_b + (int64_t)e * n * k, p.d_b_sf + (int64_t)e * (n / 128) * L,
                     d_lt + (int64_t)p.offset[e] * n, 0)) {
      fprintf(stderr, "    cuBLASLt expert %d: %s\n", e, lt.error);
      res = MM_TEST_FAIL;
    }
  }
  const mm_gemm_tile tiles[] = {MM_GEMM_TILE_AUTO,    MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128,
                                MM_GEMM_TILE_128x128, MM_GEMM_TILE_64x256,  MM_GEMM_TILE_128x128_1P};
  const int num_tiles = (int)(sizeof tiles / sizeof tiles[0]);
  uint16_t* h_lt = (uint16_t*)malloc(R * n * 2);
  uint16_t* h_ours = (uint16_t*)malloc(R * n * 2);
  if (res == MM_TEST_PASS) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h_lt, d_lt, R * n * 2, cudaMemcpyDeviceToHost));
  }
  for (int ti = 0; ti < num_tiles && res == MM_TEST_PASS; ++ti) {
    CUDA_OK(cudaMemset(d_ours, 0xFF, R * n * 2));
    CHECK_OK(run_wgmma(&p.gp, MM_GEMM_OUT_BF16, d_ours, NULL, tiles[ti], 0));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h_ours, d_ours, R * n * 2, cudaMemcpyDeviceToHost));
    diff_acc dacc = {0, 0, 0};
    int64_t bad = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int valid = row_expert(&p, (int)r) >= 0;
      for (int64_t c = 0; c < n; ++c) {
        const uint16_t u = h_ours[r * n + c];
        if (!valid) {
          bad += u != 0xFFFF;
          continue;
        }
        const double v = bf16_decode(u);
        if (!isfinite(v)) bad++;
        /* cuBLASLt writes each expert's block transposed ([n][count]). */
        const int e = row_expert(&p, (int)r);
        const int64_t lt_index = (int64_t)p.offset[e] * n + c * p.count[e] + (r - p.offset[e]);
        diff_add(&dacc, v, bf16_decode(h_lt[lt_index]));
      }
    }
    const double dv = diff_value(&dacc);
    if (bad || !(dv < 1e-5)) {
      fprintf(stderr, "    vs cuBLASLt: tile %s: %lld bad, diff %.3g\n", mm_gemm_tile_name(tiles[ti]), (long long)bad,
              dv);
      res = MM_TEST_FAIL;
    }
  }
  free(h_lt);
  free(h_ours);
  cudaFree(d_lt);
  cudaFree(d_ours);
  cudaFree(d_asf_packed);
  mm_lt_destroy(&lt);
  problem_free(&p);
  return res;
}

/* ---- the hooks the arms use ---------------------------------------------------- */

/* The L1 epilogue's per-128 quantization is the same whether one warpgroup
 * holds the group's 128 a-columns (128x256) or the two warpgroups of the
 * column-split 64x256 tile share it through shared memory: bitwise. */
mm_test_result test_swiglu_g128_across_warpgroups(void) {
  const uint64_t seed = test_seed() + 150;
  mm_test_result res = MM_TEST_PASS;
  for (int ci = 0; ci < kNumCombos && res == MM_TEST_PASS; ++ci) {
    const combo c = kCombos[ci];
    problem_desc d = small_desc(c.a_sf_block, c.b_sf_block_n, c.k, true);
    problem p;
    TRY_TEST(problem_make(&p, &d, seed + ci));
    outputs o1, o2;
    TRY_TEST(outputs_alloc(&o1, &p));
    TRY_TEST(outputs_alloc(&o2, &p));
    const int64_t R = p.rows_cap, n = d.n;
    for (int clamp = 0; clamp < 2 && res == MM_TEST_PASS; ++clamp) {
      res = run_engine(run_wgmma, &p, MM_GEMM_OUT_SWIGLU_FP8, MM_GEMM_TILE_128x256, 128, clamp, 0.5f, &o1);
      if (res == MM_TEST_PASS)
        res = run_engine(run_wgmma, &p, MM_GEMM_OUT_SWIGLU_FP8, MM_GEMM_TILE_64x256, 128, clamp, 0.5f, &o2);
      if (res == MM_TEST_PASS &&
          (memcmp(o1.h_q, o2.h_q, R * n / 2) != 0 || memcmp(o1.h_sf, o2.h_sf, sizeof(float) * (n / 2 / 64) * R) != 0)) {
        fprintf(stderr, "    swiglu G 128: 64x256 differs bitwise from 128x256 (a_sf_block %d, clamp %d)\n",
                c.a_sf_block, clamp);
        res = MM_TEST_FAIL;
      }
    }
    outputs_free(&o1);
    outputs_free(&o2);
    problem_free(&p);
  }
  return res;
}

/* A rows at expert_a_offset[e] (a ring slot is not the pool row): the A
 * blocks of the experts are stored in reverse expert order; every tile's
 * output (at the pool rows) is bitwise the plain layout's. */
mm_test_result test_a_offset(void) {
  problem_desc d = small_desc(128, 64, 512, false);
  problem p;
  TRY_TEST(problem_make(&p, &d, test_seed() + 600));
  const int E = d.num_experts;
  const int64_t R = p.rows_cap, k = d.k, L = k / 128;
  int* a_off = (int*)malloc(sizeof(int) * E);
  int pos = 0;
  for (int e = E - 1; e >= 0; --e) {
    a_off[e] = pos;
    pos += p.offset[e + 1] - p.offset[e];
  }
  uint8_t* a_perm = (uint8_t*)malloc(R * k);
  float* sf_perm = (float*)malloc(sizeof(float) * L * R);
  for (int64_t i = 0; i < R * k; ++i) a_perm[i] = (uint8_t)(i * 37); /* rows no expert owns: anything */
  for (int64_t i = 0; i < L * R; ++i) sf_perm[i] = 1e30f;
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < p.offset[e + 1] - p.offset[e]; ++r) {
      memcpy(a_perm + (int64_t)(a_off[e] + r) * k, p.a + (int64_t)(p.offset[e] + r) * k, k);
      for (int64_t j = 0; j < L; ++j) sf_perm[j * R + a_off[e] + r] = p.a_sf[j * R + p.offset[e] + r];
    }
  uint8_t* d_a = NULL;
  float* d_sf = NULL;
  int* d_aoff = NULL;
  CUDA_OK(cudaMalloc((void**)&d_a, R * k));
  CUDA_OK(cudaMalloc((void**)&d_sf, sizeof(float) * L * R));
  CUDA_OK(cudaMalloc((void**)&d_aoff, sizeof(int) * E));
  CUDA_OK(cudaMemcpy(d_a, a_perm, R * k, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_sf, sf_perm, sizeof(float) * L * R, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_aoff, a_off, sizeof(int) * E, cudaMemcpyHostToDevice));
  problem q = p; /* shares the device buffers of p; only gp differs */
  q.gp.a = d_a;
  q.gp.a_sf = d_sf;
  q.gp.expert_a_offset = d_aoff;
  outputs o1, o2;
  TRY_TEST(outputs_alloc(&o1, &p));
  TRY_TEST(outputs_alloc(&o2, &p));
  mm_test_result res = MM_TEST_PASS;
  for (int t = 0; t < kNumTiles && res == MM_TEST_PASS; ++t) {
    res = run_engine(run_wgmma, &p, MM_GEMM_OUT_F32, kTiles[t], 128, 0, 0.f, &o1);
    if (res == MM_TEST_PASS) res = run_engine(run_wgmma, &q, MM_GEMM_OUT_F32, kTiles[t], 128, 0, 0.f, &o2);
    if (res == MM_TEST_PASS && memcmp(o1.h_d, o2.h_d, R * d.n * 4) != 0) {
      fprintf(stderr, "    tile %s: output with expert_a_offset differs from the plain layout\n",
              mm_gemm_tile_name(kTiles[t]));
      res = MM_TEST_FAIL;
    }
  }
  outputs_free(&o1);
  outputs_free(&o2);
  cudaFree(d_a);
  cudaFree(d_sf);
  cudaFree(d_aoff);
  free(a_off);
  free(a_perm);
  free(sf_perm);
  problem_free(&p);
  return res;
}

/* The scatter epilogue against a host scatter of the bf16 output: valid rows
 * go to (rank r % 2, a distinct token slot); every 5th valid row and every
 * padding row has src_rank -1 and must not be written anywhere. */
mm_test_result test_scatter(void) {
  problem_desc d = small_desc(64, 128, 512, false);
  problem p;
  TRY_TEST(problem_make(&p, &d, test_seed() + 700));
  const int64_t R = p.rows_cap, n = d.n;
  mm_pool_row* rows = (mm_pool_row*)malloc(sizeof(mm_pool_row) * R);
  int64_t slots = 0;
  for (int64_t r = 0; r < R; ++r) {
    const bool valid = row_expert(&p, (int)r) >= 0;
    rows[r].src_rank = valid && (r % 5 != 0) ? (int)(r % 2) : -1;
    rows[r].token_slot = -1;
  }
  /* Distinct slots per destination, in a scrambled order. */
  for (int rank = 0; rank < 2; ++rank) {
    int64_t next = 0;
    for (int64_t i = 0; i < R; ++i) {
      const int64_t r = (i * 7919) % R;
      if (rows[r].src_rank == rank) rows[r].token_slot = (int)next++;
    }
    slots = next > slots ? next : slots;
  }
  mm_pool_row* d_rows = NULL;
  uint16_t* d_dst[2] = {NULL, NULL};
  CUDA_OK(cudaMalloc((void**)&d_rows, sizeof(mm_pool_row) * R));
  CUDA_OK(cudaMemcpy(d_rows, rows, sizeof(mm_pool_row) * R, cudaMemcpyHostToDevice));
  const int64_t dst_elems = (slots + 1) * n;
  for (int i = 0; i < 2; ++i) CUDA_OK(cudaMalloc((void**)&d_dst[i], dst_elems * 2));
  uint16_t* h_dst = (uint16_t*)malloc(dst_elems * 2);
  uint16_t* want = (uint16_t*)malloc(dst_elems * 2);
  outputs o;
  TRY_TEST(outputs_alloc(&o, &p));
  mm_test_result res = run_engine(run_wgmma, &p, MM_GEMM_OUT_BF16, MM_GEMM_TILE_128x256, 128, 0, 0.f, &o);
  const uint16_t* dense = (const uint16_t*)o.h_d;
  for (int t = 0; t < kNumTiles && res == MM_TEST_PASS; ++t) {
    for (int i = 0; i < 2; ++i) CUDA_OK(cudaMemset(d_dst[i], 0xFF, dst_elems * 2));
    mm_gemm_problem g = p.gp;
    g.out_kind = MM_GEMM_OUT_BF16_SCATTER;
    g.scatter.rows = d_rows;
    g.scatter.dst_base[0] = (uint8_t*)d_dst[0];
    g.scatter.dst_base[1] = (uint8_t*)d_dst[1];
    CHECK_OK(mm_gemm_wgmma(&g, kTiles[t], 0));
    CUDA_OK(cudaDeviceSynchronize());
    for (int rank = 0; rank < 2 && res == MM_TEST_PASS; ++rank) {
      for (int64_t i = 0; i < dst_elems; ++i) want[i] = 0xFFFF;
      for (int64_t r = 0; r < R; ++r)
        if (rows[r].src_rank == rank) memcpy(want + (int64_t)rows[r].token_slot * n, dense + r * n, n * 2);
      CUDA_OK(cudaMemcpy(h_dst, d_dst[rank], dst_elems * 2, cudaMemcpyDeviceToHost));
      if (memcmp(h_dst, want, dst_elems * 2) != 0) {
        int64_t first = 0;
        while (h_dst[first] == want[first]) ++first;
        fprintf(stderr, "    scatter tile %s rank %d: element %lld (slot %lld) is 0x%04x, want 0x%04x\n",
                mm_gemm_tile_name(kTiles[t]), rank, (long long)first, (long long)(first / n), h_dst[first],
                want[first]);
        res = MM_TEST_FAIL;
      }
    }
  }
  outputs_free(&o);
  cudaFree(d_rows);
  cudaFree(d_dst[0]);
  cudaFree(d_dst[1]);
  free(h_dst);
  free(want);
  free(rows);
  problem_free(&p);
  return res;
}

/* Writer of the rows-ready test: after `delay_ns`, copies A and its scales
 * one 128-row block at a time (last block first) from the final buffers into
 * the ones the GEMM reads, then publishes the block's row count: the stores,
 * a CTA barrier, fence.proxy.async.global (TMA reads these rows next), and a
 * release add. */
__global__ void rows_writer_kernel(const uint8_t* a_src, const float* sf_src, uint8_t* a_dst, float* sf_dst,
                                   int64_t rows_cap, int k, const int* block_rows, int blocks, int32_t* counters,
                                   uint64_t delay_ns) {
  const uint64_t t0 = mm_globaltimer_ns();
  while (mm_globaltimer_ns() - t0 < delay_ns) {
  }
  const int L = k / 128;
  for (int b = blocks - 1; b >= 0; --b) {
    const int64_t r0 = (int64_t)b * 128;
    for (int64_t i = threadIdx.x; i < 128 * (int64_t)k / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(a_dst + r0 * k)[i] = reinterpret_cast<const uint4*>(a_src + r0 * k)[i];
    for (int64_t i = threadIdx.x; i < 128 * (int64_t)L; i += blockDim.x) {
      const int64_t j = i / 128, r = r0 + i % 128;
      sf_dst[j * rows_cap + r] = sf_src[j * rows_cap + r];
    }
    __syncthreads();
    if (threadIdx.x == 0 && block_rows[b] > 0) {
      mm_fence_proxy_async_global();
      mm_red_release_gpu_add_s32(counters + b, block_rows[b]);
    }
    __syncthreads();
  }
}

/* Rows that arrive while the GEMM runs: the GEMM starts on garbage A rows
 * with zero counters; a writer on another stream (another SM: the GEMM's
 * grid is a few CTAs) fills them after 200 us. The output must be bitwise the
 * output of a run on the final rows. Then the deadline: counters that never
 * reach their target end in MEGAMOE_ERR_TIMEOUT at the rows-ready site, the
 * kernel returns, nothing is written; and an error already recorded (a peer
 * failed) makes the waits give up at once without a timeout of their own. */
mm_test_result test_rows_ready(void) {
  const int counts[] = {128, 77, 200, 1};
  problem_desc d = small_desc(128, 128, 512, false);
  d.num_experts = 4;
  d.counts = counts;
  d.spare = NULL;
  d.tail_rows = 128;
  d.n = 256;
  problem p;
  TRY_TEST(problem_make(&p, &d, test_seed() + 800));
  const int64_t R = p.rows_cap, k = d.k, L = k / 128;
  const int blocks = (int)(R / 128);
  int* block_rows = (int*)calloc(blocks, sizeof(int));
  for (int e = 0; e < d.num_experts; ++e)
    for (int r = 0; r < p.count[e]; ++r) block_rows[(p.offset[e] + r) / 128]++;
  int* d_block_rows = NULL;
  int32_t* d_counters = NULL;
  uint8_t* d_a = NULL;
  float* d_sf = NULL;
  mm_device_status* d_status = NULL;
  CUDA_OK(cudaMalloc((void**)&d_block_rows, sizeof(int) * blocks));
  CUDA_OK(cudaMemcpy(d_block_rows, block_rows, sizeof(int) * blocks, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc((void**)&d_counters, sizeof(int32_t) * blocks));
  CUDA_OK(cudaMalloc((void**)&d_a, R * k));
  CUDA_OK(cudaMalloc((void**)&d_sf, sizeof(float) * L * R));
  CUDA_OK(cudaMalloc((void**)&d_status, sizeof(mm_device_status)));
  /* Load the writer now: with lazy module loading, its first launch would
   * wait for the running GEMM, which waits for the writer. */
  cudaFuncAttributes fa;
  CUDA_OK(cudaFuncGetAttributes(&fa, rows_writer_kernel));
  cudaStream_t s_gemm, s_writer;
  CUDA_OK(cudaStreamCreateWithFlags(&s_gemm, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s_writer, cudaStreamNonBlocking));
  outputs o_ref, o;
  TRY_TEST(outputs_alloc(&o_ref, &p));
  TRY_TEST(outputs_alloc(&o, &p));
  mm_test_result res = MM_TEST_PASS;
  const int64_t out_bytes = R * d.n * 4;
  const mm_gemm_tile tiles[] = {MM_GEMM_TILE_128x256, MM_GEMM_TILE_256x128, MM_GEMM_TILE_128x128, MM_GEMM_TILE_64x256};
  for (int t = 0; t < 4 && res == MM_TEST_PASS; ++t) {
    res = run_engine(run_wgmma, &p, MM_GEMM_OUT_F32, tiles[t], 128, 0, 0.f, &o_ref);
    if (res != MM_TEST_PASS) break;
    /* Garbage rows (NaN codes included) and zero counters, then the race. */
    CUDA_OK(cudaMemset(d_a, 0x7F, R * k));
    CUDA_OK(cudaMemset(d_sf, 0xFF, sizeof(float) * L * R));
    CUDA_OK(cudaMemset(d_counters, 0, sizeof(int32_t) * blocks));
    /* The status record of forward 1 of a layer, no error yet. */
    mm_device_status fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.forward = 1;
    CUDA_OK(cudaMemcpy(d_status, &fresh, sizeof fresh, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(o.d, 0xFF, out_bytes));
    CUDA_OK(cudaDeviceSynchronize());
    mm_gemm_problem g = with_output(&p.gp, MM_GEMM_OUT_F32, o.d, NULL);
    g.a = d_a;
    g.a_sf = d_sf;
    g.ready.counters = d_counters;
    g.ready.base = 0;
    g.ready.per_row = 1;
    g.status = d_status;
    g.timeout_ns = 10000000000ull;
    CHECK_OK(mm_gemm_wgmma(&g, tiles[t], s_gemm));
    rows_writer_kernel<<<1, 256, 0, s_writer>>>(p.d_a, p.d_a_sf, d_a, d_sf, R, (int)k, d_block_rows, blocks,
                                                d_counters, 200000);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    mm_device_status st;
    CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(o.h_d, o.d, out_bytes, cudaMemcpyDeviceToHost));
    if (st.code != 0 || memcmp(o.h_d, o_ref.h_d, out_bytes) != 0) {
      fprintf(stderr, "    rows-ready tile %s: status %d, output %s the run on final rows\n",
              mm_gemm_tile_name(tiles[t]), st.code, memcmp(o.h_d, o_ref.h_d, out_bytes) ? "differs from" : "equals");
      res = MM_TEST_FAIL;
    }
    /* The deadline fires: the counters stay at zero. */
    for (int preset = 0; preset < 2 && res == MM_TEST_PASS; ++preset) {
      mm_device_status init = fresh;
      if (preset) { /* forward 1 already failed: a peer reported an error */
        init.code = MEGAMOE_ERR_PEER_FAILED;
        init.epoch = 1;
        init.key = (1ull << MM_STATUS_KEY_SHIFT) | MEGAMOE_ERR_PEER_FAILED;
      }
      CUDA_OK(cudaMemset(d_counters, 0, sizeof(int32_t) * blocks));
      CUDA_OK(cudaMemcpy(d_status, &init, sizeof init, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(o.d, 0xFF, out_bytes));
      g.timeout_ns = 20000000ull; /* 20 ms */
      CHECK_OK(mm_gemm_wgmma(&g, tiles[t], s_gemm));
      CUDA_OK(cudaStreamSynchronize(s_gemm));
      CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(o.h_d, o.d, out_bytes, cudaMemcpyDeviceToHost));
      int64_t written = 0;
      for (int64_t i = 0; i < out_bytes / 4; ++i) written += ((const uint32_t*)o.h_d)[i] != 0xFFFFFFFFu;
      const int want_code = preset ? MEGAMOE_ERR_PEER_FAILED : MEGAMOE_ERR_TIMEOUT;
      const int want_site = preset ? 0 : MM_SITE_GEMM_ROWS_READY;
      if (st.code != want_code || st.where != want_site || written) {
        fprintf(stderr, "    rows-ready deadline tile %s preset %d: status %d at site %d (want %d at %d), %lld elements written\n",
                mm_gemm_tile_name(tiles[t]), preset, st.code, st.where, want_code, want_site, (long long)written);
        res = MM_TEST_FAIL;
      }
    }
  }
  outputs_free(&o_ref);
  outputs_free(&o);
  cudaStreamDestroy(s_gemm);
  cudaStreamDestroy(s_writer);
  cudaFree(d_block_rows);
  cudaFree(d_counters);
  cudaFree(d_a);
  cudaFree(d_sf);
  cudaFree(d_status);
  free(block_rows);
  problem_free(&p);
  return res;
}

/* ---- The quantization's division by a per-row reciprocal ---------------
 * The split arm's L1 epilogue computes e4m3(a / sf) as
 * mm_quant_e4m3x2(a, sf, __frcp_rn(sf)) (common.cuh); the staged arm divides.
 * Bitwise equality of the arms rests on the codes being equal for every a
 * with |a| <= amax: 2^24 draws per launch of amax (any finite positive
 * float, and an infinite one) and a (= amax, in [amax/2, amax), or any float
 * below amax; signs, zeros, subnormals and NaN included; the codes compared as
 * bits, so a NaN must give the division's NaN code). As a control, the
 * uncorrected product a * rcp must differ somewhere on the same draws (else
 * the draws could not see a wrong correction). */
__device__ uint32_t quant_draw_bits(uint64_t i, uint32_t salt) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + salt;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)(z ^ (z >> 31));
}

__global__ void quant_div_kernel(uint64_t n, unsigned long long* mismatches, unsigned long long* control) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t x = quant_draw_bits(i, 1), y = quant_draw_bits(i, 2);
    float amax = __uint_as_float(x & 0x7f7fffffu);
    if ((i & 1023) == 7) amax = __int_as_float(0x7f800000); /* an infinite amax: the division path */
    if (!(amax > 0.f)) amax = 1.0f;
    float a;
    switch (y & 3) {
      case 0: a = amax; break;
      case 1: a = amax * __uint_as_float(0x3f000000u | (x >> 9)); break; /* [amax/2, amax) */
      case 2: /* zero, subnormal, or NaN (a NaN element is not in the amax: fmaxf skips it) */
        a = (y & 0x30u) == 0x30u ? __int_as_float(0x7fc00000) : (y & 4) ? 0.f : __uint_as_float(y & 0x007fffffu);
        break;
      default: a = fminf(__uint_as_float((x >> 1) & 0x7f7fffffu), amax); break;
    }
    if (y >> 31) a = -a;
    const float b = (y & 8) ? -a * 0.75f : a; /* the pair's second value */
    const float sf = mm_group_scale(amax), rcp = __frcp_rn(sf);
    const uint16_t want = mm_float2_to_e4m3x2(a / sf, b / sf);
    if (mm_quant_e4m3x2(a, b, sf, rcp) != want) atomicAdd(mismatches, 1ull);
    if (isfinite(sf) && mm_float2_to_e4m3x2(__fmul_rn(a, rcp), __fmul_rn(b, rcp)) != want) atomicAdd(control, 1ull);
  }
}

mm_test_result test_quant_div(void) {
  unsigned long long* d = NULL;
  unsigned long long h[2] = {0, 0};
  CUDA_OK(cudaMalloc(&d, sizeof h));
  CUDA_OK(cudaMemset(d, 0, sizeof h));
  const uint64_t n = 1ull << 26;
  quant_div_kernel<<<1024, 256>>>(n, d, d + 1);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(d);
  printf("    quant_div: %llu draws, %llu codes differ from the division; control (no correction) %llu differ\n",
         (unsigned long long)n, h[0], h[1]);
  return h[0] == 0 && h[1] > 0 ? MM_TEST_PASS : MM_TEST_FAIL;
}

}  // namespace

extern "C" const mm_test mm_gemm_gpu_tests[] = {
    {"gemm_wgmma_check_rejects", test_check_rejects},
    {"gemm_wgmma_f32_vs_cpu", test_f32_vs_cpu},
    {"gemm_wgmma_bf16_vs_cpu", test_bf16_vs_cpu},
    {"gemm_wgmma_swiglu_vs_cpu", test_swiglu_vs_cpu},
    {"gemm_wgmma_empty_and_one_row", test_empty_and_one_row},
    {"gemm_wgmma_vs_simple_large", test_vs_simple_large},
    {"gemm_wgmma_vs_cublaslt_large", test_vs_cublaslt_large},
    {"gemm_wgmma_swiglu_g128_across_warpgroups", test_swiglu_g128_across_warpgroups},
    {"gemm_wgmma_a_offset", test_a_offset},
    {"gemm_wgmma_scatter", test_scatter},
    {"gemm_wgmma_rows_ready", test_rows_ready},
    {"gemm_quant_div", test_quant_div},
    {NULL, NULL},
};
