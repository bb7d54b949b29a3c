/* Checked command-line values for the megamoe tool and its benchmarks (and
 * its clock).
 *
 * Every function that reads a value prints one line on stderr naming the
 * command, the option and what is wrong ("bench: --rounds 0: must be in
 * [1, 100]") and returns -1 when the value is missing, not a whole number or
 * out of range; 0 on success. Integers are read with strtoll: the whole text
 * must be the number (no trailing characters), in base 10. */
#ifndef MEGAMOE_BENCH_CLI_H
#define MEGAMOE_BENCH_CLI_H

#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Process exit codes of the tool (documented in its usage and the README). */
enum {
  MM_EXIT_OK = 0,
  MM_EXIT_FAILED = 1, /* the run failed (the message says where) */
  MM_EXIT_USAGE = 2,  /* bad command line: unknown command or option, bad value */
  MM_EXIT_NO_GPU = 4  /* the command needs a GPU and none is visible */
};

/* Seconds on a monotonic clock (timings, progress lines). */
double mm_cli_now_s(void);

/* 1 when a is "-h" or "--help". */
int mm_cli_is_help(const char* a);

/* The value of the option argv[*i]: argv[*i + 1], advancing *i past it. NULL
 * (after "<cmd>: option <opt> needs a value") when there is none or when the
 * next word is itself an option ("--..."). */
const char* mm_cli_value(const char* cmd, int argc, char** argv, int* i);

int mm_cli_int64(const char* cmd, const char* opt, const char* text, int64_t lo, int64_t hi, int64_t* out);
int mm_cli_int(const char* cmd, const char* opt, const char* text, int lo, int hi, int* out);

/* One of n named values: *out = values[k] where text is names[k]. -1 for a
 * NULL text (mm_cli_value has said why) or, after "<cmd>: <opt> <text>: want
 * a, b or c", an unknown name. */
int mm_cli_choice(const char* cmd, const char* opt, const char* text, const char* const* names, const int* values,
                  int n, int* out);

/* A comma-separated list of 1..max integers, each in [lo, hi]; no empty items. */
int mm_cli_int64_list(const char* cmd, const char* opt, const char* text, int64_t lo, int64_t hi, int64_t* out,
                      int max, int* count);

/* A comma-separated list of arm names (staged, split, fused), each at most
 * once, into arms[0 .. *count) (room for MEGAMOE_ARM_COUNT). */
int mm_cli_arm_list(const char* cmd, const char* opt, const char* text, megamoe_arm* arms, int* count);

/* --ranks against the visible GPUs: 0 becomes every GPU. MM_EXIT_OK, or the
 * exit code after a line on stderr (MM_EXIT_NO_GPU: none visible;
 * MM_EXIT_USAGE: more ranks than GPUs). */
int mm_cli_pick_ranks(const char* cmd, int* ranks, int gpus);

#ifdef __cplusplus
}
#endif

#endif
