/* The pure-host part of the GPU argument fuzz (tests/gpu/test_fuzz.c): the
 * random plan of a call, the inputs and arguments it makes, what each row
 * must be, and the checks. The CPU tests plant the bug each check is for
 * and run whole plans on the reference (tests/unit/test_fuzz_checks.c).
 *
 * The fuzz keeps y inside a larger buffer: FZ_GUARD_BYTES of guard bytes
 * before it, its T_max rows, FZ_GUARD_BYTES after. Before a call the guards
 * hold FZ_GUARD_FILL and every bf16 of y FZ_Y_POISON; after it nothing
 * outside the rows the call owns may differ, and (a call that succeeded)
 * no element of those rows may still hold the poison. */
#ifndef MEGAMOE_TEST_FUZZ_CHECK_H
#define MEGAMOE_TEST_FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "../harness.h"
#include "megamoe.h"

#define FZ_GUARD_BYTES 4096
#define FZ_GUARD_FILL 0xA5u
/* A bf16 NaN with a payload: the kernels write the canonical NaN 0x7FFF, so
 * an element still holding this was not written. */
#define FZ_Y_POISON 0xFFA5u

/* What one row of y must be after a call that succeeded. */
typedef enum fz_row_kind {
  FZ_ROW_SAME = 0,  /* bitwise the clean run's row (nothing of this token changed) */
  FZ_ROW_NAN,       /* every element NaN (a NaN in the token's x, x_sf or a live slot's weight) */
  FZ_ROW_NAN_BLOCK, /* the 128 columns of `block` non-finite, every other column bitwise the clean row */
  FZ_ROW_REF        /* as the reference row: the same elements NaN / +Inf / -Inf, the finite ones within the
                     * per-token checker's bounds (ref/ref_check.h) */
} fz_row_kind;

typedef struct fz_row_expect {
  fz_row_kind kind;
  int block;    /* FZ_ROW_NAN_BLOCK: the 128-column block */
  int may_flip; /* FZ_ROW_REF behind an Inf scale under the clamp: the whole row may be NaN on one side and
                 * finite on the other (0 x Inf decided by an fp32 partial sum; fuzz_check.c, judge_ref_row) */
} fz_row_expect;

/* Non-finite values the fuzz plants in one token's inputs. */
typedef enum fz_poison {
  FZ_POISON_X_SF_NAN = 0, /* one of the token's x_sf blocks */
  FZ_POISON_X_SF_INF,     /* the same, +-Inf */
  FZ_POISON_X_NAN,        /* one byte of x: the e4m3 NaN code 0x7F */
  FZ_POISON_W_NAN,        /* one slot's routing weight (live or masked) */
  FZ_POISON_W_INF,
  FZ_POISON_COUNT
} fz_poison;

extern const char* const fz_poison_name[FZ_POISON_COUNT];

/* Plants poison p into token t of one rank's host inputs (x [T, H] e4m3,
 * x_sf [T, H/128], idx / w [T, K]); where picks the block, byte or slot,
 * negative the sign of an Inf. Returns what the token's row must be
 * (megamoe.h, "Non-finite inputs"): NaN in every element for a NaN in x,
 * x_sf or a live slot's weight, and for an Inf routing weight; an Inf x_sf
 * NaN too without the SwiGLU clamp (with it the clamp acts on the Inf like
 * on any large value: judged against the reference); a token with no live
 * slot, or a masked slot's weight, leaves the row as it was. */
fz_row_expect fz_poison_token(fz_poison p, int64_t t, uint64_t where, int negative, int has_clamp, uint8_t* x,
                              float* x_sf, const int32_t* idx, float* w, int64_t H, int64_t K);

/* A non-finite weight scale of global expert `expert` (W1's: every row of
 * a token with a live slot there is NaN, unless an Inf meets the clamp;
 * W2's at output block `block`: that block's columns non-finite, the rest
 * unchanged); other tokens unchanged. */
fz_row_expect fz_weight_poison_expect(int is_w2, int block, int is_inf, int has_clamp, int expert,
                                      const int32_t* idx_row, int64_t K);

/* Fills a host image of the guarded buffer: total bytes, y at y_offset with
 * y_bytes of rows (poisoned), guard bytes everywhere else. */
void fz_fill_image(uint8_t* image, size_t total, size_t y_offset, size_t y_bytes);

/* The first byte outside [lo, hi) where after differs from before; -1 when
 * none does. */
int64_t fz_changed_outside(const uint8_t* before, const uint8_t* after, size_t n, size_t lo, size_t hi);

/* Judges rows [0, T) of y (bf16 bits, [T, H]) against what each must be:
 * every element written (not FZ_Y_POISON), then its kind. clean [T, H] is
 * the clean run's output; ref [T, H] the reference rows (read only for
 * FZ_ROW_REF rows; may be NULL when there are none); idx [T, K] int32 the
 * slots (for the checker's masked tokens). Returns -1 when every row
 * passes, else the first failing token with the reason in why. */
int64_t fz_judge_rows(const uint16_t* y, const uint16_t* clean, const uint16_t* ref, const int32_t* idx, int64_t K,
                      int64_t T, int64_t H, const fz_row_expect* expect, char* why, size_t why_size);

/* 1 when the bf16 bits are a NaN / not finite. */
static inline int fz_bf16_nan(uint16_t v) { return (v & 0x7FFFu) > 0x7F80u; }
static inline int fz_bf16_nonfinite(uint16_t v) { return (v & 0x7F80u) == 0x7F80u; }

/* ---- one call's plan ------------------------------------------------------------ */

/* The errors one rank may carry in a call. */
typedef enum fz_error {
  FZ_INDEX_HIGH = 0,
  FZ_INDEX_LOW,
  FZ_INDEX_WIDE,
  FZ_T_ABOVE,
  FZ_T_NEGATIVE,
  FZ_BOUND_BELOW,
  FZ_BOUND_ABOVE,
  FZ_NULL_X,
  FZ_NULL_X_SF,
  FZ_NULL_IDX,
  FZ_NULL_W,
  FZ_NULL_Y,
  FZ_NULL_ARGS,
  FZ_MISALIGNED_Y,
  FZ_MISALIGNED_IDX,
  FZ_MISALIGNED_W,
  FZ_MISALIGNED_X_SF,
  FZ_BAD_INDEX_TYPE,
  FZ_ERROR_COUNT
} fz_error;

typedef struct fz_error_info {
  const char* name;
  megamoe_status status;
  int host;         /* found by megamoe_forward (else by the device, reported at sync) */
  const char* text; /* what the bad rank's message names ("" for a bad index: its element is checked) */
} fz_error_info;

extern const fz_error_info fz_errors[FZ_ERROR_COUNT];

#define FZ_MAX_POISONS 3

/* One rank's part of a call. */
typedef struct fz_rank_plan {
  int64_t T, bound; /* bound: the same on every rank, >= every rank's T (or 0) */
  int x_offset;    /* x passed this many bytes past an aligned address (any is allowed) */
  int null_unused; /* T = 0: every token pointer NULL (allowed) */
  int npoison;     /* on distinct tokens */
  struct {
    int64_t t;
    fz_poison kind;
    uint64_t where;
    int negative;
  } poison[FZ_MAX_POISONS];
  int64_t dup_t; /* >= 0: slot 1 of this token takes slot 0's expert */
  int error;     /* -1, or the fz_error this rank carries */
  int64_t err_t; /* a bad index: its token and slot; the bad value (or count, bound, type) */
  int err_k;
  int64_t err_value;
} fz_rank_plan;

typedef struct fz_plan {
  int bad_rank; /* -1: no error in this call */
  fz_rank_plan rank[MEGAMOE_MAX_RANKS];
} fz_plan;

/* Draws a call for R ranks: every rank draws the same plan from the same
 * generator. About a third of the calls carry one error on one rank. */
void fz_draw(mm_rng* g, int R, int64_t Tmax, int K, int E, int idx64, fz_plan* p);

/* Every rank's T_max tokens as built, nothing changed. */
void fz_clean_plan(int R, int64_t Tmax, fz_plan* p);

/* One rank's inputs of a call (host, T_max tokens): the built ones with the
 * plan's changes, the indices as passed (int32 or int64), and what each of
 * the T rows must be. */
typedef struct fz_inputs {
  uint8_t* x;        /* [T_max, H] */
  float* x_sf;       /* [T_max, H/128] */
  int32_t* idx;      /* [T_max, K] (an index past 32 bits as INT32_MIN) */
  float* w;          /* [T_max, K] */
  uint8_t* idx_wire; /* [T_max, K] int32 or int64, as passed */
  fz_row_expect* expect; /* [T_max] */
  /* Counts over the calls made (for the closing line). */
  int nan_rows, dups, poisons[FZ_POISON_COUNT];
} fz_inputs;

void fz_make_inputs(const fz_rank_plan* q, const uint8_t* x, const float* x_sf, const int32_t* idx, const float* w,
                    int64_t Tmax, int64_t H, int64_t K, int has_clamp, int idx64, fz_inputs* out);

/* The arguments of one rank's call, from the buffers its inputs are in (x
 * at x + q->x_offset), with the plan's error applied. */
megamoe_forward_args fz_make_args(const fz_rank_plan* q, const uint8_t* x, const void* x_sf, const void* idx,
                                  const void* w, void* y, int idx64);

#endif
