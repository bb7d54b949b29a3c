/* The reference layer: every rank's routed rows grouped by global expert,
 * each expert's weights decoded once, two block-scaled GEMMs with exact block
 * sums, SwiGLU, quantization and the slot-ordered combine (ref.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/errors.h"
#include "ref.h"
#include "ref_internal.h"

/* Rows of the GEMM micro-block. The gathered rows of an expert are padded to
 * a multiple of it with zeros, so the kernel has no remainder path. */
#define ROW_BLOCK 4
/* Columns of the micro-block (every column count here is a multiple of 128). */
#define COL_BLOCK 2
/* Target bytes of the weight columns one pass over the row blocks reuses. */
#define WEIGHT_TILE_BYTES (192 * 1024)

/* x86 with GCC or Clang: the block sums also come in an AVX2 build, picked at
 * run time. Both builds give the same bits (the sums are exact). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define REF_X86_DISPATCH 1
#define REF_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define REF_X86_DISPATCH 0
#define REF_ALWAYS_INLINE inline
#endif

typedef struct routed_row {
  int32_t rank;
  int32_t token;
  int32_t slot;
} routed_row;

/* The 4 x 2 exact block sums S[r][c] = sum_i a_r[i] * b_c[i] over len
 * elements (a multiple of lanes). Every product of two decoded e4m3 values
 * is exact and every partial sum stays exact in double (ref.h), so splitting
 * each sum over `lanes` independent accumulators (and fusing a multiply-add)
 * changes nothing, and lets the compiler keep them in vector registers.
 * lanes is a constant at each call site: 2 fills an SSE2 register, 4 an AVX2
 * one. */
#define MAX_LANES 4
static REF_ALWAYS_INLINE void block_sums_body(const double* a0, const double* a1, const double* a2,
                                              const double* a3, const double* b0, const double* b1,
                                              int len, double sums[ROW_BLOCK][COL_BLOCK], const int lanes) {
  double s00[MAX_LANES] = {0}, s01[MAX_LANES] = {0}, s10[MAX_LANES] = {0}, s11[MAX_LANES] = {0};
  double s20[MAX_LANES] = {0}, s21[MAX_LANES] = {0}, s30[MAX_LANES] = {0}, s31[MAX_LANES] = {0};
  for (int i = 0; i < len; i += lanes) {
    for (int l = 0; l < lanes; ++l) {
      const double w0 = b0[i + l], w1 = b1[i + l];
      s00[l] += a0[i + l] * w0;
      s01[l] += a0[i + l] * w1;
      s10[l] += a1[i + l] * w0;
      s11[l] += a1[i + l] * w1;
      s20[l] += a2[i + l] * w0;
      s21[l] += a2[i + l] * w1;
      s30[l] += a3[i + l] * w0;
      s31[l] += a3[i + l] * w1;
    }
  }
  for (int l = 1; l < lanes; ++l) {
    s00[0] += s00[l];
    s01[0] += s01[l];
    s10[0] += s10[l];
    s11[0] += s11[l];
    s20[0] += s20[l];
    s21[0] += s21[l];
    s30[0] += s30[l];
    s31[0] += s31[l];
  }
  sums[0][0] = s00[0];
  sums[0][1] = s01[0];
  sums[1][0] = s10[0];
  sums[1][1] = s11[0];
  sums[2][0] = s20[0];
  sums[2][1] = s21[0];
  sums[3][0] = s30[0];
  sums[3][1] = s31[0];
}

typedef void (*block_sums_fn)(const double*, const double*, const double*, const double*, const double*,
                              const double*, int, double[ROW_BLOCK][COL_BLOCK]);

static void block_sums_portable(const double* a0, const double* a1, const double* a2, const double* a3,
                                const double* b0, const double* b1, int len,
                                double sums[ROW_BLOCK][COL_BLOCK]) {
  block_sums_body(a0, a1, a2, a3, b0, b1, len, sums, 2);
}

#if REF_X86_DISPATCH
__attribute__((target("avx2,fma"))) static void block_sums_avx2(const double* a0, const double* a1,
                                                                const double* a2, const double* a3,
                                                                const double* b0, const double* b1, int len,
                                                                double sums[ROW_BLOCK][COL_BLOCK]) {
  block_sums_body(a0, a1, a2, a3, b0, b1, len, sums, 4);
}
#endif

static int allow_vector_path = 1;

int ref_set_vector_path(int allow) {
  const int previous = allow_vector_path;
  allow_vector_path = allow != 0;
  return previous;
}

int ref_vector_path_available(void) {
#if REF_X86_DISPATCH
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

static block_sums_fn pick_block_sums(void) {
#if REF_X86_DISPATCH
  if (allow_vector_path && ref_vector_path_available()) return block_sums_avx2;
#endif
  return block_sums_portable;
}

/* out[m, n] = (float)(sum over kb ascending of
 *   ((double)a_sf[m, kb] * (double)b_sf[n / 128, (kb * block) / 128]) * S(m, n, kb))
 * with S the exact sum over the block-wide K block kb.
 *   a     [rows, depth] decoded e4m3, rows a multiple of ROW_BLOCK
 *   a_sf  [rows, depth / block]
 *   b     [cols, depth] decoded e4m3 (K-major)
 *   b_sf  [cols / 128, depth / 128]
 *   out   [rows, cols] */
static void block_scaled_gemm(const double* a, const float* a_sf, int64_t rows, const double* b,
                              const float* b_sf, int64_t cols, int64_t depth, int block,
                              float* out) {
  const int64_t a_blocks = depth / block;
  const int64_t b_blocks = depth / 128;
  const block_sums_fn block_sums = pick_block_sums();
  /* Columns per tile: the tile's weights stay in cache while every row block
   * passes over them. */
  int64_t tile = WEIGHT_TILE_BYTES / (depth * (int64_t)sizeof(double));
  tile -= tile % COL_BLOCK;
  if (tile < COL_BLOCK) tile = COL_BLOCK;
  for (int64_t n0 = 0; n0 < cols; n0 += tile) {
    const int64_t n_end = n0 + tile < cols ? n0 + tile : cols;
    for (int64_t m = 0; m < rows; m += ROW_BLOCK) {
      const double* a_row[ROW_BLOCK];
      for (int r = 0; r < ROW_BLOCK; ++r) a_row[r] = a + (m + r) * depth;
      for (int64_t n = n0; n < n_end; n += COL_BLOCK) {
        const double* b_col0 = b + n * depth;
        const double* b_col1 = b_col0 + depth;
        const float* b_scales = b_sf + (n / 128) * b_blocks; /* both columns share a 128-row block */
        double acc[ROW_BLOCK][COL_BLOCK] = {{0}};
        for (int64_t kb = 0; kb < a_blocks; ++kb) {
          const int64_t k0 = kb * block;
          double sums[ROW_BLOCK][COL_BLOCK];
          block_sums(a_row[0] + k0, a_row[1] + k0, a_row[2] + k0, a_row[3] + k0, b_col0 + k0,
                     b_col1 + k0, block, sums);
          const double b_scale = (double)b_scales[k0 / 128];
          for (int r = 0; r < ROW_BLOCK; ++r) {
            const double scale = (double)a_sf[(m + r) * a_blocks + kb] * b_scale;
            for (int c = 0; c < COL_BLOCK; ++c) acc[r][c] += scale * sums[r][c];
          }
        }
        for (int r = 0; r < ROW_BLOCK; ++r)
          for (int c = 0; c < COL_BLOCK; ++c) out[(m + r) * cols + n + c] = (float)acc[r][c];
      }
    }
  }
}

static megamoe_status validate(const megamoe_config* cfg, int num_ranks, const ref_rank_data* ranks) {
  MM_TRY(megamoe_check_config(cfg, num_ranks));
  MM_CHECK_NULL(ranks, "ranks");
  const int64_t K = cfg->top_k;
  const int32_t E = cfg->num_experts;
  for (int r = 0; r < num_ranks; ++r) {
    const ref_rank_data* d = &ranks[r];
    const struct {
      const void* ptr;
      const char* name;
      int needed;
    } pointers[] = {
        {d->w1, "w1", 1},
        {d->w1_sf, "w1_sf", 1},
        {d->w2, "w2", 1},
        {d->w2_sf, "w2_sf", 1},
        {d->x, "x", d->num_tokens > 0},
        {d->x_sf, "x_sf", d->num_tokens > 0},
        {d->topk_idx, "topk_idx", d->num_tokens > 0},
        {d->topk_w, "topk_w", d->num_tokens > 0},
        {d->y, "y", d->num_tokens > 0},
    };
    if (d->num_tokens < 0 || d->num_tokens > cfg->max_tokens_per_rank)
      return mm_fail(MEGAMOE_ERR_TOO_MANY_TOKENS,
                     "ranks[%d].num_tokens = %lld: outside [0, max_tokens_per_rank = %lld]", r,
                     (long long)d->num_tokens, (long long)cfg->max_tokens_per_rank);
    for (size_t p = 0; p < sizeof pointers / sizeof pointers[0]; ++p)
      if (pointers[p].needed && pointers[p].ptr == NULL)
        return mm_fail(MEGAMOE_ERR_NULL_POINTER, "ranks[%d].%s is NULL (num_tokens = %lld)", r,
                       pointers[p].name, (long long)d->num_tokens);
    for (int64_t i = 0; i < d->num_tokens * K; ++i)
      if (d->topk_idx[i] < -1 || d->topk_idx[i] >= E)
        return mm_fail(MEGAMOE_ERR_BAD_TOPK_INDEX, "ranks[%d].topk_idx[%lld] = %d: outside [-1, %d)",
                       r, (long long)i, (int)d->topk_idx[i], (int)E);
  }
  return MEGAMOE_OK;
}

/* Everything one forward allocates. */
typedef struct layer_scratch {
  int64_t* expert_start;  /* [E + 1] first routed row of each global expert */
  routed_row* routed;     /* [routed rows] grouped by expert, (rank, token, slot) order */
  uint16_t** slot_out;    /* [R] -> [T, K, H] bf16 L2 output of every slot */
  float* combine_acc;     /* [H] */
  /* Per-expert pass, sized for the busiest expert (rows padded to ROW_BLOCK). */
  double* w1;     /* [2I, H] decoded */
  double* w2;     /* [H, I] decoded */
  double* x;      /* [rows, H] gathered and decoded; padding rows zero */
  float* x_sf;    /* [rows, H/128] */
  float* h;       /* [rows, 2I] L1 output */
  float* act;     /* [I] SwiGLU output of one row */
  uint8_t* q;     /* [I] its e4m3 codes */
  double* q_dec;  /* [rows, I] decoded codes; padding rows zero */
  float* q_sf;    /* [rows, I/G] */
  float* o;       /* [rows, H] L2 output */
} layer_scratch;

static void layer_scratch_free(layer_scratch* s, int num_ranks) {
  if (s->slot_out)
    for (int r = 0; r < num_ranks; ++r) free(s->slot_out[r]);
  free(s->slot_out);
  free(s->expert_start);
  free(s->routed);
  free(s->combine_acc);
  free(s->w1);
  free(s->w2);
  free(s->x);
  free(s->x_sf);
  free(s->h);
  free(s->act);
  free(s->q);
  free(s->q_dec);
  free(s->q_sf);
  free(s->o);
}

static size_t count_or_one(int64_t n) { return n > 0 ? (size_t)n : 1; }

static int64_t round_up_rows(int64_t rows) { return ((rows + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK); }

/* Groups the routed slots of every rank by global expert (counting sort, so
 * each expert sees its rows in rank, token, slot order). Returns the most
 * rows any expert gets, or -1 when an allocation failed. */
static int64_t route_by_expert(const megamoe_config* cfg, int num_ranks, const ref_rank_data* ranks,
                               layer_scratch* s) {
  const int32_t E = cfg->num_experts;
  const int64_t K = cfg->top_k;
  int64_t routed = 0;
  for (int r = 0; r < num_ranks; ++r) routed += ranks[r].num_tokens * K;
  s->expert_start = calloc((size_t)E + 1, sizeof(int64_t));
  s->routed = malloc(sizeof(routed_row) * count_or_one(routed));
  int64_t* fill = calloc((size_t)E, sizeof(int64_t));
  if (!s->expert_start || !s->routed || !fill) {
    free(fill);
    return -1;
  }
  for (int r = 0; r < num_ranks; ++r)
    for (int64_t i = 0; i < ranks[r].num_tokens * K; ++i)
      if (ranks[r].topk_idx[i] >= 0) s->expert_start[ranks[r].topk_idx[i] + 1]++;
  int64_t busiest = 0;
  for (int32_t e = 0; e < E; ++e) {
    if (s->expert_start[e + 1] > busiest) busiest = s->expert_start[e + 1];
    s->expert_start[e + 1] += s->expert_start[e];
  }
  for (int r = 0; r < num_ranks; ++r)
    for (int64_t t = 0; t < ranks[r].num_tokens; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ranks[r].topk_idx[t * K + k];
        if (e < 0) continue;
        routed_row* row = &s->routed[s->expert_start[e] + fill[e]++];
        row->rank = r;
        row->token = (int32_t)t;
        row->slot = (int32_t)k;
      }
  free(fill);
  return busiest;
}

static int layer_scratch_alloc(const megamoe_config* cfg, int num_ranks, const ref_rank_data* ranks,
                               int64_t busiest, layer_scratch* s) {
  const int64_t H = cfg->hidden, I = cfg->intermediate, G = cfg->quant_group, K = cfg->top_k;
  const size_t rows = count_or_one(round_up_rows(busiest));
  s->slot_out = calloc((size_t)num_ranks, sizeof(uint16_t*));
  if (!s->slot_out) return 0;
  for (int r = 0; r < num_ranks; ++r) {
    s->slot_out[r] = malloc(sizeof(uint16_t) * count_or_one(ranks[r].num_tokens * K * H));
    if (!s->slot_out[r]) return 0;
  }
  s->combine_acc = malloc(sizeof(float) * (size_t)H);
  s->w1 = malloc(sizeof(double) * (size_t)(2 * I * H));
  s->w2 = malloc(sizeof(double) * (size_t)(H * I));
  s->x = malloc(sizeof(double) * rows * (size_t)H);
  s->x_sf = malloc(sizeof(float) * rows * (size_t)(H / 128));
  s->h = malloc(sizeof(float) * rows * (size_t)(2 * I));
  s->act = malloc(sizeof(float) * (size_t)I);
  s->q = malloc((size_t)I);
  s->q_dec = malloc(sizeof(double) * rows * (size_t)I);
  s->q_sf = malloc(sizeof(float) * rows * (size_t)(I / G));
  s->o = malloc(sizeof(float) * rows * (size_t)H);
  return s->combine_acc && s->w1 && s->w2 && s->x && s->x_sf && s->h && s->act && s->q &&
         s->q_dec && s->q_sf && s->o;
}

static void decode_codes(const uint8_t* codes, size_t n, const double table[256], double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = table[codes[i]];
}

/* SwiGLU of one L1 output row times the routing weight (ref.h). */
static void swiglu_row(const megamoe_config* cfg, const float* h, float weight, float* act) {
  const int64_t I = cfg->intermediate;
  const float c = cfg->swiglu_clamp;
  for (int64_t j = 0; j < I; ++j) {
    float g = h[j], u = h[I + j];
    if (cfg->has_swiglu_clamp) {
      g = g > c ? c : g;
      u = u > c ? c : (u < -c ? -c : u);
    }
    const double gd = g;
    act[j] = (float)((gd / (1.0 + exp(-gd))) * (double)u * (double)weight);
  }
}

/* L1, SwiGLU, quantization and L2 of every row routed to global expert e;
 * writes each row's bf16 output into its slot of the source rank. */
static void run_expert(const megamoe_config* cfg, int num_ranks, const ref_rank_data* ranks,
                       const double e4m3_table[256], int32_t e, layer_scratch* s) {
  const int64_t H = cfg->hidden, I = cfg->intermediate, G = cfg->quant_group, K = cfg->top_k;
  const int64_t count = s->expert_start[e + 1] - s->expert_start[e];
  const int64_t padded = round_up_rows(count);
  const routed_row* list = s->routed + s->expert_start[e];
  const int32_t local_experts = cfg->num_experts / num_ranks;
  const ref_rank_data* owner = &ranks[e / local_experts];
  const int64_t local = e % local_experts;

  decode_codes(owner->w1 + local * 2 * I * H, (size_t)(2 * I * H), e4m3_table, s->w1);
  decode_codes(owner->w2 + local * H * I, (size_t)(H * I), e4m3_table, s->w2);
  const float* w1_sf = owner->w1_sf + local * (2 * I / 128) * (H / 128);
  const float* w2_sf = owner->w2_sf + local * (H / 128) * (I / 128);

  /* Padding rows are zero with zero scales; their outputs are ignored. */
  for (int64_t i = 0; i < padded; ++i) {
    double* x = s->x + i * H;
    float* x_sf = s->x_sf + i * (H / 128);
    if (i < count) {
      const ref_rank_data* src = &ranks[list[i].rank];
      decode_codes(src->x + list[i].token * H, (size_t)H, e4m3_table, x);
      memcpy(x_sf, src->x_sf + list[i].token * (H / 128), sizeof(float) * (size_t)(H / 128));
    } else {
      memset(x, 0, sizeof(double) * (size_t)H);
      memset(x_sf, 0, sizeof(float) * (size_t)(H / 128));
    }
  }

  block_scaled_gemm(s->x, s->x_sf, padded, s->w1, w1_sf, 2 * I, H, 128, s->h);

  for (int64_t i = 0; i < padded; ++i) {
    double* q_dec = s->q_dec + i * I;
    float* q_sf = s->q_sf + i * (I / G);
    if (i < count) {
      const float weight = ranks[list[i].rank].topk_w[list[i].token * K + list[i].slot];
      swiglu_row(cfg, s->h + i * 2 * I, weight, s->act);
      for (int64_t gb = 0; gb < I / G; ++gb)
        ref_quantize_group(s->act + gb * G, (int)G, s->q + gb * G, &q_sf[gb]);
      decode_codes(s->q, (size_t)I, e4m3_table, q_dec);
    } else {
      memset(q_dec, 0, sizeof(double) * (size_t)I);
      memset(q_sf, 0, sizeof(float) * (size_t)(I / G));
    }
  }

  block_scaled_gemm(s->q_dec, s->q_sf, padded, s->w2, w2_sf, H, I, (int)G, s->o);

  for (int64_t i = 0; i < count; ++i) {
    uint16_t* dst = s->slot_out[list[i].rank] + (list[i].token * K + list[i].slot) * H;
    const float* o = s->o + i * H;
    for (int64_t n = 0; n < H; ++n) dst[n] = ref_bf16_encode(o[n]);
  }
}

/* y[t] = bf16(sum of the unmasked slots in slot order, in float). */
static void combine_rank(const megamoe_config* cfg, const ref_rank_data* rank, const uint16_t* slot_out,
                         float* acc) {
  const int64_t H = cfg->hidden, K = cfg->top_k;
  for (int64_t t = 0; t < rank->num_tokens; ++t) {
    for (int64_t n = 0; n < H; ++n) acc[n] = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      if (rank->topk_idx[t * K + k] < 0) continue;
      const uint16_t* o = slot_out + (t * K + k) * H;
      for (int64_t n = 0; n < H; ++n) acc[n] += ref_bf16_decode(o[n]);
    }
    uint16_t* y = rank->y + t * H;
    for (int64_t n = 0; n < H; ++n) y[n] = ref_bf16_encode(acc[n]);
  }
}

megamoe_status ref_layer_forward(const megamoe_config* cfg, int num_ranks, const ref_rank_data* ranks) {
  MM_TRY(validate(cfg, num_ranks, ranks));
  double e4m3_table[256];
  for (int v = 0; v < 256; ++v) e4m3_table[v] = ref_e4m3_decode((uint8_t)v);

  layer_scratch s;
  memset(&s, 0, sizeof s);
  const int64_t busiest = route_by_expert(cfg, num_ranks, ranks, &s);
  if (busiest < 0 || !layer_scratch_alloc(cfg, num_ranks, ranks, busiest, &s)) {
    layer_scratch_free(&s, num_ranks);
    return mm_fail(MEGAMOE_ERR_OUT_OF_MEMORY,
                   "ref_layer_forward: scratch allocation failed (hidden %lld, intermediate %lld, "
                   "busiest expert %lld rows)",
                   (long long)cfg->hidden, (long long)cfg->intermediate, (long long)busiest);
  }
  for (int32_t e = 0; e < cfg->num_experts; ++e)
    if (s.expert_start[e + 1] > s.expert_start[e]) run_expert(cfg, num_ranks, ranks, e4m3_table, e, &s);
  for (int r = 0; r < num_ranks; ++r) combine_rank(cfg, &ranks[r], s.slot_out[r], s.combine_acc);
  layer_scratch_free(&s, num_ranks);
  return MEGAMOE_OK;
}
