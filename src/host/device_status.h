/* Device error reports (contract.h mm_error_report) in words: what
 * megamoe_sync tells the user. Pure host C. */
#ifndef MEGAMOE_DEVICE_STATUS_H
#define MEGAMOE_DEVICE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "contract.h"
#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the description needs to know about the layer. */
typedef struct mm_status_context {
  int rank;
  int num_experts, local_experts, top_k;
  double timeout_s;
  double pool_imbalance;
  int64_t pool_rows;
  uint32_t failed_forwards;  /* forwards that failed since the last sync */
  const char* host_message;  /* megamoe_forward's message of a rejected forward, or NULL */
} mm_status_context;

/* Human name of a wait site ("the dispatch barrier"). Never NULL. */
const char* mm_site_name(int site);

/* Writes the description of report r into out (n bytes, always terminated)
 * and returns the status to report (MEGAMOE_ERR_INTERNAL for a code that is
 * not a megamoe_status). r->key must be non-zero. */
megamoe_status mm_describe_device_error(const mm_error_report* r, const mm_status_context* ctx, char* out,
                                        size_t n);

#ifdef __cplusplus
}
#endif

#endif
