/* Host-side argument checks beyond megamoe_check_config (src/host/config.c).
 * Pure host C: no CUDA or NCCL calls, so the CPU tests fuzz them. */
#ifndef MEGAMOE_HOST_CONFIG_H
#define MEGAMOE_HOST_CONFIG_H

#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The arguments of one forward against the layer's config: MEGAMOE_OK, or
 * the status with megamoe_last_error naming the argument (the checks of
 * megamoe_forward that do not depend on the layer's state). */
megamoe_status mm_check_forward_args(const megamoe_config* config, const megamoe_forward_args* args);

/* num_tokens_bound of a call with num_tokens tokens: 0 or in [num_tokens,
 * T_max], else MEGAMOE_ERR_TOO_MANY_TOKENS naming args->num_tokens_bound (a
 * bound below the rank's own count, or above the layer's capacity). */
megamoe_status mm_check_token_bound(const megamoe_config* config, int64_t num_tokens, int64_t bound);

/* ---- Same config on every rank ----------------------------------------------
 * megamoe_create allgathers one print per rank before anything else, so a
 * rank with another config (or with arguments it rejected) is found on
 * every rank instead of leaving the others in a collective that never
 * completes. A print holds every field of the config as 64-bit words (the
 * floating-point ones as their bits) and the rank's own argument status. */
enum {
  MM_PRINT_STATUS = 0,  /* this rank's argument status (megamoe_status), 0 when they passed */
  MM_PRINT_VERSION,     /* MEGAMOE_VERSION of the library the rank loaded */
  MM_PRINT_HIDDEN,
  MM_PRINT_INTERMEDIATE,
  MM_PRINT_EXPERTS,
  MM_PRINT_TOP_K,
  MM_PRINT_MAX_TOKENS,
  MM_PRINT_QUANT_GROUP,
  MM_PRINT_HAS_CLAMP,
  MM_PRINT_CLAMP,       /* double bits of the clamp; 0 when the clamp is off (its value is unused then) */
  MM_PRINT_ARM,
  MM_PRINT_TIMEOUT,     /* double bits of the deadline in effect (<= 0 means the default) */
  MM_PRINT_IMBALANCE,   /* double bits */
  MM_PRINT_FIELDS
};

typedef struct mm_config_print {
  int64_t field[MM_PRINT_FIELDS];
} mm_config_print;

/* This rank's print: config may be NULL when status (the rank's own
 * argument status) is not MEGAMOE_OK. */
void mm_config_print_make(const megamoe_config* config, megamoe_status status, mm_config_print* print);

/* Judges every rank's print (prints[0 .. num_ranks)) on rank `rank`:
 * MEGAMOE_OK when every rank passed its arguments and every config is the
 * same; MEGAMOE_ERR_PEER_FAILED naming the lowest other rank that rejected
 * its arguments (and its status); else MEGAMOE_ERR_BAD_ARGUMENT naming the
 * first field (in megamoe_config's order) that differs, with the value on
 * the lowest rank and on the first rank that differs from it. This rank's
 * own rejection is the caller's to report (it is never judged here). */
megamoe_status mm_config_prints_compare(const mm_config_print* prints, int num_ranks, int rank);

/* The config field a print index stands for ("hidden", ...; "status" and
 * "library version" for the first two). */
const char* mm_config_print_name(int field);

#ifdef __cplusplus
}
#endif

#endif
