/* The bench's clock sampler (bench/bench_clocks.c) without a GPU: how
 * samples merge, how a record reads, and that a machine without NVML (or a
 * GPU NVML does not know) gets no sampler and a reason, not a crash. And the
 * in-kernel timeline's SM clock from its raw readings (contract.h). */
#include <string.h>

#include "bench_clocks.h"
#include "contract.h"
#include "unit.h"

static mm_clock_stats one_sample(double sm, double mem, double watts, unsigned temp, unsigned long long why) {
  mm_clock_stats s = mm_clock_stats_empty();
  s.samples = 1;
  s.sm_mhz_sum = s.sm_mhz_min = s.sm_mhz_max = sm;
  s.mem_mhz_sum = mem;
  s.power_w_sum = watts;
  s.temp_c_max = temp;
  s.reasons = why;
  return s;
}

static mm_test_result test_clock_stats_merge(void) {
  mm_clock_stats a = mm_clock_stats_empty(), b = mm_clock_stats_empty();
  mm_clock_stats_merge(&a, &b); /* empty into empty: still empty */
  CHECK_EQ_INT(a.samples, 0);
  const mm_clock_stats s1 = one_sample(1980, 2619, 500, 55, 0x1ull);
  const mm_clock_stats s2 = one_sample(1650, 2619, 700, 63, 0x4ull);
  mm_clock_stats_merge(&a, &s1);
  mm_clock_stats_merge(&a, &s2);
  mm_clock_stats_merge(&a, &b); /* an empty window changes nothing */
  CHECK_EQ_INT(a.samples, 2);
  CHECK(a.sm_mhz_min == 1650 && a.sm_mhz_max == 1980);
  CHECK(a.sm_mhz_sum == 3630 && a.power_w_sum == 1200);
  CHECK_EQ_INT(a.temp_c_max, 63);
  CHECK_EQ_INT(a.reasons, 0x5ull);
  /* A lower minimum arriving later, through a merged window of two. */
  mm_clock_stats w = mm_clock_stats_empty();
  const mm_clock_stats s3 = one_sample(1400, 2619, 690, 60, 0x20ull);
  mm_clock_stats_merge(&w, &s3);
  mm_clock_stats_merge(&w, &s1);
  mm_clock_stats_merge(&a, &w);
  CHECK_EQ_INT(a.samples, 4);
  CHECK(a.sm_mhz_min == 1400 && a.sm_mhz_max == 1980);
  CHECK_EQ_INT(a.reasons, 0x25ull);
  return MM_TEST_PASS;
}

static mm_test_result test_clock_stats_format(void) {
  char line[320];
  mm_clock_stats a = mm_clock_stats_empty();
  mm_clock_stats_format(&a, line, (int)sizeof line);
  CHECK_HAS(line, "no samples");
  const mm_clock_stats s1 = one_sample(1980, 2619, 500, 55, 0x1ull); /* idle: not a clock-lowering event */
  const mm_clock_stats s2 = one_sample(1600, 2619, 700, 63, 0x4ull | 0x20ull);
  mm_clock_stats_merge(&a, &s1);
  mm_clock_stats_format(&a, line, (int)sizeof line);
  CHECK_HAS(line, "SM 1980 MHz mean (1980-1980)");
  CHECK_HAS(line, "clock events: none");
  mm_clock_stats_merge(&a, &s2);
  mm_clock_stats_format(&a, line, (int)sizeof line);
  CHECK_HAS(line, "SM 1790 MHz mean (1600-1980)");
  CHECK_HAS(line, "memory 2619 MHz, 600 W (NVML avg), 63 C max");
  CHECK_HAS(line, "clock events: sw power cap, sw thermal");
  /* A short buffer is cut, never overrun. */
  char small[8];
  memset(small, 'x', sizeof small);
  mm_clock_stats_format(&a, small, 5);
  CHECK_EQ_INT(strlen(small), 4);
  CHECK_EQ_INT(small[7], 'x');
  return MM_TEST_PASS;
}

/* No GPU here: NVML is absent (or, on a GPU machine, this bus id does not
 * exist). Either way no sampler and a reason. */
static mm_test_result test_clocks_start_without_gpu(void) {
  const char* why = NULL;
  mm_clock_sampler* s = mm_clocks_start("0000:FF:1F.7", 5, &why);
  if (s) {
    mm_clocks_stop(s);
    CHECK_MSG(0, "a sampler started for a bus id that does not exist");
  }
  CHECK(why != NULL && why[0] != '\0');
  printf("    no sampler: %s\n", why);
  mm_clocks_stop(NULL); /* accepted */
  return MM_TEST_PASS;
}

/* mm_timeline_sm_khz: cycles over nanoseconds in kHz, 0 where a reading is
 * missing or the counter went backwards (a CTA moved to another SM). */
static mm_test_result test_timeline_sm_khz(void) {
  uint64_t e[MM_TL_EVENTS];
  memset(e, 0, sizeof e);
  e[MM_TL_K1_START] = 5000000000ull;                 /* ns */
  e[MM_TL_CLK_START] = 123456789ull;                 /* cycles */
  e[MM_TL_CLK_END_NS] = e[MM_TL_K1_START] + 500000;  /* 500 us later */
  e[MM_TL_CLK_END] = e[MM_TL_CLK_START] + 850000;  /* 850 000 cycles: 1700 MHz */
  CHECK_EQ_INT(mm_timeline_sm_khz(e), 1700000);
  e[MM_TL_CLK_END] = e[MM_TL_CLK_START] + 990000;    /* 1980 MHz */
  CHECK_EQ_INT(mm_timeline_sm_khz(e), 1980000);
  uint64_t f[MM_TL_EVENTS];
  const int raw[] = {MM_TL_K1_START, MM_TL_CLK_START, MM_TL_CLK_END, MM_TL_CLK_END_NS};
  for (int i = 0; i < 4; ++i) { /* any reading missing */
    memcpy(f, e, sizeof f);
    f[raw[i]] = 0;
    CHECK_EQ_INT(mm_timeline_sm_khz(f), 0);
  }
  memcpy(f, e, sizeof f);
  f[MM_TL_CLK_END] = f[MM_TL_CLK_START] - 1; /* backwards: another SM's counter */
  CHECK_EQ_INT(mm_timeline_sm_khz(f), 0);
  memcpy(f, e, sizeof f);
  f[MM_TL_CLK_END_NS] = f[MM_TL_K1_START]; /* no time passed */
  CHECK_EQ_INT(mm_timeline_sm_khz(f), 0);
  /* Hours of cycles do not overflow: 3.6e12 cycles (one hour at 1 GHz). */
  e[MM_TL_CLK_END] = e[MM_TL_CLK_START] + 3600000000000ull;
  e[MM_TL_CLK_END_NS] = e[MM_TL_K1_START] + 3600000000000ull;
  CHECK_EQ_INT(mm_timeline_sm_khz(e), 1000000);
  return MM_TEST_PASS;
}

const mm_test unit_suite_clocks[] = {
    {"timeline_sm_khz", test_timeline_sm_khz},
    {"clocks_stats_merge", test_clock_stats_merge},
    {"clocks_stats_format", test_clock_stats_format},
    {"clocks_start_without_gpu", test_clocks_start_without_gpu},
    {NULL, NULL},
};
