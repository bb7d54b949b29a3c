/* Shared declarations of the CPU unit test runner. */
#ifndef MEGAMOE_UNIT_H
#define MEGAMOE_UNIT_H

#include <stdint.h>

#include "../harness.h"
#include "contract.h"

/* Base seed of this run (main.c prints it; MEGAMOE_TEST_SEED replays one). */
extern uint64_t unit_seed;

/* A generator for one test: the run's seed mixed with a per-test salt, so
 * tests do not share streams and a failure replays from the printed seed. */
static inline mm_rng unit_rng(uint64_t salt) {
  mm_rng r = {unit_seed ^ (salt * 0xd1342543de82ef95ull)};
  return r;
}

/* A device error report as a kernel records it (contract.h), for the
 * message tests. */
static inline mm_error_report unit_report(uint64_t forward, int code, int where, int peer, int detail, uint64_t seen,
                                          uint64_t want) {
  mm_error_report r;
  memset(&r, 0, sizeof r);
  r.key = (forward << MM_STATUS_KEY_SHIFT) | (uint64_t)code;
  r.forward = forward;
  r.code = code;
  r.where = where;
  r.peer = peer;
  r.detail = detail;
  r.seen = seen;
  r.want = want;
  return r;
}

/* The last error message (megamoe_last_error) names what it should. */
#define CHECK_MESSAGE_HAS(text)                                                         \
  CHECK_MSG(strstr(megamoe_last_error(), (text)) != NULL, "message \"%s\" lacks \"%s\"", \
            megamoe_last_error(), (text))

extern const mm_test unit_suite_e4m3[];
extern const mm_test unit_suite_bf16[];
extern const mm_test unit_suite_quant[];
extern const mm_test unit_suite_diff[];
extern const mm_test unit_suite_ref_layer[];
extern const mm_test unit_suite_ref_check[];
extern const mm_test unit_suite_config[];
extern const mm_test unit_suite_layout[];
extern const mm_test unit_suite_procs[];
extern const mm_test unit_suite_colocated[];
extern const mm_test unit_suite_comm[];
extern const mm_test unit_suite_cli[];
extern const mm_test unit_suite_errors[];
extern const mm_test unit_suite_fuzz[];
extern const mm_test unit_suite_soak[];
extern const mm_test unit_suite_clocks[];
extern const mm_test unit_suite_fuzz_checks[];
extern const mm_test unit_suite_fault_judge[];
extern const mm_test unit_suite_fused[];
extern const mm_test unit_suite_fused_kernel[];
extern const mm_test unit_suite_combine[];

#endif
