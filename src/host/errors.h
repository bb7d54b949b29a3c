/* Status and message plumbing of the host code. */
#ifndef MEGAMOE_ERRORS_H
#define MEGAMOE_ERRORS_H

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style message for megamoe_last_error() and returns status. */
megamoe_status mm_fail(megamoe_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clears the message (called on entry of every public call). */
void mm_clear_error(void);

/* Checked arithmetic on sizes: 0 on success, 1 on overflow. */
int mm_mul_u64(uint64_t a, uint64_t b, uint64_t* out);
int mm_add_u64(uint64_t a, uint64_t b, uint64_t* out);

/* A diagnostic knob from the environment: the integer in variable `name`
 * when it is set and within [lo, hi], else `fallback`. */
int mm_env_int(const char* name, int lo, int hi, int fallback);

#define MM_CHECK_NULL(ptr, name)                                                   \
  do {                                                                             \
    if ((ptr) == NULL) return mm_fail(MEGAMOE_ERR_NULL_POINTER, "%s is NULL", name); \
  } while (0)

#define MM_TRY(expr)                     \
  do {                                   \
    megamoe_status mm_try_st_ = (expr);  \
    if (mm_try_st_ != MEGAMOE_OK) return mm_try_st_; \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif
