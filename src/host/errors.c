/* Status strings and the per-thread last-error message. */
#include "errors.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>

static _Thread_local char mm_error_message[512];

megamoe_status mm_fail(megamoe_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(mm_error_message, sizeof mm_error_message, fmt, ap);
  va_end(ap);
  return status;
}

void mm_clear_error(void) { mm_error_message[0] = '\0'; }

const char* megamoe_last_error(void) { return mm_error_message; }

int mm_mul_u64(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

int mm_add_u64(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

const char* megamoe_status_string(megamoe_status status) {
  switch (status) {
    case MEGAMOE_OK: return "MEGAMOE_OK: success";
    case MEGAMOE_ERR_NULL_POINTER: return "MEGAMOE_ERR_NULL_POINTER: a required pointer is NULL";
    case MEGAMOE_ERR_BAD_SHAPE: return "MEGAMOE_ERR_BAD_SHAPE: hidden or intermediate size not supported";
    case MEGAMOE_ERR_BAD_EXPERTS: return "MEGAMOE_ERR_BAD_EXPERTS: expert count not supported for this rank count";
    case MEGAMOE_ERR_BAD_TOP_K: return "MEGAMOE_ERR_BAD_TOP_K: top-k out of range";
    case MEGAMOE_ERR_BAD_MAX_TOKENS: return "MEGAMOE_ERR_BAD_MAX_TOKENS: max tokens per rank must be positive";
    case MEGAMOE_ERR_BAD_QUANT_GROUP: return "MEGAMOE_ERR_BAD_QUANT_GROUP: quantization group must be 64 or 128";
    case MEGAMOE_ERR_BAD_CLAMP: return "MEGAMOE_ERR_BAD_CLAMP: SwiGLU clamp must be positive and finite";
    case MEGAMOE_ERR_BAD_ARM: return "MEGAMOE_ERR_BAD_ARM: unknown arm";
    case MEGAMOE_ERR_BAD_RANKS: return "MEGAMOE_ERR_BAD_RANKS: rank count or rank out of range";
    case MEGAMOE_ERR_SIZE_OVERFLOW: return "MEGAMOE_ERR_SIZE_OVERFLOW: a buffer size overflows 64 bits";
    case MEGAMOE_ERR_TOO_MANY_TOKENS: return "MEGAMOE_ERR_TOO_MANY_TOKENS: token count above the layer's maximum or the bound";
    case MEGAMOE_ERR_BAD_TOPK_INDEX: return "MEGAMOE_ERR_BAD_TOPK_INDEX: a top-k index is outside [-1, E)";
    case MEGAMOE_ERR_BAD_ARGUMENT: return "MEGAMOE_ERR_BAD_ARGUMENT: an argument is out of its domain";
    case MEGAMOE_ERR_CUDA: return "MEGAMOE_ERR_CUDA: a CUDA call failed";
    case MEGAMOE_ERR_NCCL: return "MEGAMOE_ERR_NCCL: an NCCL call failed";
    case MEGAMOE_ERR_OUT_OF_MEMORY: return "MEGAMOE_ERR_OUT_OF_MEMORY: an allocation failed";
    case MEGAMOE_ERR_NO_PEER_ACCESS: return "MEGAMOE_ERR_NO_PEER_ACCESS: the ranks do not share one NVLink domain";
    case MEGAMOE_ERR_TIMEOUT: return "MEGAMOE_ERR_TIMEOUT: a peer stopped answering";
    case MEGAMOE_ERR_PEER_FAILED: return "MEGAMOE_ERR_PEER_FAILED: a peer reported an error in this forward";
    case MEGAMOE_ERR_LAYER_FAILED: return "MEGAMOE_ERR_LAYER_FAILED: the layer failed earlier and must be destroyed";
    case MEGAMOE_ERR_NO_DEVICE: return "MEGAMOE_ERR_NO_DEVICE: no CUDA device";
    case MEGAMOE_ERR_UNSUPPORTED_DEVICE: return "MEGAMOE_ERR_UNSUPPORTED_DEVICE: not a Hopper (sm_90) GPU";
    case MEGAMOE_ERR_NOT_IMPLEMENTED: return "MEGAMOE_ERR_NOT_IMPLEMENTED: not implemented yet";
    case MEGAMOE_ERR_WEIGHTS_NOT_READY: return "MEGAMOE_ERR_WEIGHTS_NOT_READY: megamoe_prepare_weights has not run";
    case MEGAMOE_ERR_INTERNAL: return "MEGAMOE_ERR_INTERNAL: internal error";
    case MEGAMOE_ERR_DEVICE_CHECK: return "MEGAMOE_ERR_DEVICE_CHECK: a device-side check failed";
    case MEGAMOE_STATUS_COUNT: break;
  }
  return "MEGAMOE_ERR_UNKNOWN: unknown status";
}

int mm_env_int(const char* name, int lo, int hi, int fallback) {
  const char* e = getenv(name);
  if (!e || !*e) return fallback;
  char* end = NULL;
  const long v = strtol(e, &end, 10);
  return *end == 0 && v >= lo && v <= hi ? (int)v : fallback;
}
