/* Checked command-line values (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double mm_cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mm_cli_is_help(const char* a) { return a && (!strcmp(a, "-h") || !strcmp(a, "--help")); }

const char* mm_cli_value(const char* cmd, int argc, char** argv, int* i) {
  const char* opt = argv[*i];
  if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) {
    fprintf(stderr, "%s: option %s needs a value\n", cmd, opt);
    return NULL;
  }
  *i += 1;
  return argv[*i];
}

/* Parses text[0, len) as a base-10 integer in [lo, hi]. */
static int parse_range(const char* cmd, const char* opt, const char* shown, const char* text, size_t len,
                       int64_t lo, int64_t hi, int64_t* out) {
  char buf[64];
  if (len == 0 || len >= sizeof buf) {
    fprintf(stderr, "%s: %s '%s': %s\n", cmd, opt, shown, len == 0 ? "empty value" : "not a whole number");
    return -1;
  }
  memcpy(buf, text, len);
  buf[len] = '\0';
  char* end = NULL;
  errno = 0;
  const long long v = strtoll(buf, &end, 10);
  if (end == buf || *end != '\0') {
    fprintf(stderr, "%s: %s '%s': '%s' is not a whole number\n", cmd, opt, shown, buf);
    return -1;
  }
  if (errno == ERANGE || v < lo || v > hi) {
    fprintf(stderr, "%s: %s %s: must be in [%" PRId64 ", %" PRId64 "]\n", cmd, opt, buf, lo, hi);
    return -1;
  }
  *out = (int64_t)v;
  return 0;
}

int mm_cli_int64(const char* cmd, const char* opt, const char* text, int64_t lo, int64_t hi, int64_t* out) {
  if (!text) return -1;
  return parse_range(cmd, opt, text, text, strlen(text), lo, hi, out);
}

int mm_cli_int(const char* cmd, const char* opt, const char* text, int lo, int hi, int* out) {
  int64_t v = 0;
  if (mm_cli_int64(cmd, opt, text, lo, hi, &v) != 0) return -1;
  *out = (int)v;
  return 0;
}

int mm_cli_choice(const char* cmd, const char* opt, const char* text, const char* const* names, const int* values,
                  int n, int* out) {
  if (!text) return -1;
  for (int k = 0; k < n; ++k)
    if (!strcmp(text, names[k])) {
      *out = values[k];
      return 0;
    }
  fprintf(stderr, "%s: %s %s: want ", cmd, opt, text);
  for (int k = 0; k < n; ++k) fprintf(stderr, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", names[k]);
  fprintf(stderr, "\n");
  return -1;
}

/* The item of a comma-separated list that starts at p: its length in *len;
 * returns where the next item starts, or NULL after the last. */
static const char* list_item(const char* p, size_t* len) {
  const char* comma = strchr(p, ',');
  *len = comma ? (size_t)(comma - p) : strlen(p);
  return comma ? comma + 1 : NULL;
}

int mm_cli_int64_list(const char* cmd, const char* opt, const char* text, int64_t lo, int64_t hi, int64_t* out,
                      int max, int* count) {
  if (!text) return -1;
  int n = 0;
  for (const char* p = text; p;) {
    size_t len;
    const char* next = list_item(p, &len);
    if (n == max) {
      fprintf(stderr, "%s: %s '%s': at most %d values\n", cmd, opt, text, max);
      return -1;
    }
    if (parse_range(cmd, opt, text, p, len, lo, hi, &out[n]) != 0) return -1;
    ++n;
    p = next;
  }
  *count = n;
  return 0;
}

int mm_cli_arm_list(const char* cmd, const char* opt, const char* text, megamoe_arm* arms, int* count) {
  if (!text) return -1;
  int n = 0;
  for (const char* p = text; p;) {
    size_t len;
    const char* next = list_item(p, &len);
    megamoe_arm arm = MEGAMOE_ARM_COUNT;
    for (int a = 0; a < MEGAMOE_ARM_COUNT; ++a) {
      const char* name = megamoe_arm_name((megamoe_arm)a);
      if (strlen(name) == len && !strncmp(p, name, len)) arm = (megamoe_arm)a;
    }
    if (arm == MEGAMOE_ARM_COUNT) {
      fprintf(stderr, "%s: %s '%s': unknown arm '%.*s' (staged, split, fused)\n", cmd, opt, text, (int)len, p);
      return -1;
    }
    for (int a = 0; a < n; ++a)
      if (arms[a] == arm) {
        fprintf(stderr, "%s: %s '%s': arm '%s' given twice\n", cmd, opt, text, megamoe_arm_name(arm));
        return -1;
      }
    arms[n++] = arm; /* at most MEGAMOE_ARM_COUNT: each arm once */
    p = next;
  }
  *count = n;
  return 0;
}

int mm_cli_pick_ranks(const char* cmd, int* ranks, int gpus) {
  if (gpus < 1) {
    fprintf(stderr, "%s: no GPU visible\n", cmd);
    return MM_EXIT_NO_GPU;
  }
  if (*ranks == 0) *ranks = gpus;
  if (*ranks > gpus) {
    fprintf(stderr, "%s: --ranks %d but %d GPU(s) visible\n", cmd, *ranks, gpus);
    return MM_EXIT_USAGE;
  }
  return MM_EXIT_OK;
}
