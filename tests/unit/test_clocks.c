/* The bench's clock sampler (bench/bench_clocks.c) without a GPU: how
 * samples merge, how a record reads, and that a machine without NVML (or a
 * GPU NVML does not know) gets no sampler and a reason, not a crash. And the
 * in-kernel timeline's SM clock from its raw readings (contract.h), and the
 * timeline watch's line and thread (host/timeline.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clocks.h"
#include "contract.h"
#include "host/timeline.h"
#include "stderr_capture.h"
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

/* A hang as the watch sees it: 5 CTAs, four at the 'counted' barrier of the
 * second forward, CTA 2 still at the first forward's 'reduced', CTA 4 never
 * stamped. Stale stamps of later events (CTA 0's 'reduced' of the first
 * forward) must not count: the latest stamp in time decides. */
static void hang_snapshot(uint64_t* tl) {
  memset(tl, 0, sizeof(uint64_t) * 5 * MM_TL_EVENTS);
  const uint64_t s = 1000000000000ull; /* the first forward's start, ns */
  for (int c = 0; c < 4; ++c) {
    uint64_t* e = tl + (size_t)c * MM_TL_EVENTS;
    e[MM_TL_K1_START] = s + 10;
    e[MM_TL_COUNTED] = s + 20;
    e[MM_TL_REDUCED] = s + 1000000000ull;     /* 1 s later: the first forward's end */
    e[MM_TL_WAIT_PULLED] = s + 9000000000ull; /* a duration: never a stamp */
    if (c == 2) continue;                     /* CTA 2 did not start the second forward */
    e[MM_TL_K1_START] = s + 3000000000ull;
    e[MM_TL_COUNTED] = s + 3000000000ull + 100000000ull * (uint64_t)(c + 1); /* 3.1-3.4 s */
  }
}

static mm_test_result test_timeline_watch_summary(void) {
  uint64_t tl[5 * MM_TL_EVENTS];
  char line[MM_TL_WATCH_LINE];
  hang_snapshot(tl);
  mm_timeline_watch_summary(tl, 5, 0, line, sizeof line);
  CHECK_MSG(strcmp(line, "3 CTAs at 'counted' [0 1 3]; 1 CTA at 'reduced' [2: 'k1 start' < 'counted' < 'reduced']; "
                        "1 CTA at 'never stamped' [4]") == 0,
            "got \"%s\"", line);
  mm_timeline_watch_summary(tl, 5, 1, line, sizeof line);
  CHECK_HAS(line, "3 CTAs at 'counted' (0.0-0.3 s before the newest stamp) [0 1 3]");
  CHECK_HAS(line, "1 CTA at 'reduced' (2.4-2.4 s before the newest stamp) [2: 'k1 start' < 'counted' < 'reduced']");
  CHECK_LACKS(line, "never stamped' (");
  /* Nothing stamped; and a buffer too small is cut, terminated, not overrun. */
  memset(tl, 0, sizeof tl);
  mm_timeline_watch_summary(tl, 5, 1, line, sizeof line);
  CHECK_MSG(strcmp(line, "no CTA stamped yet") == 0, "got \"%s\"", line);
  hang_snapshot(tl);
  char small[12];
  memset(small, 'x', sizeof small);
  const size_t n = mm_timeline_watch_summary(tl, 5, 1, small, 8);
  CHECK_EQ_INT((int)n, 7);
  CHECK(small[7] == '\0' && small[8] == 'x');
  /* The split arm's register hand-off as the racecheck hangs left it: 131
   * CTAs at the end of their L2 mainloops, one whose latest stamp is the
   * producer's. Its recent stamps tell whether the math side's stamp came
   * first (listed) or never came (absent): stale stamps of the previous
   * forward (before its 'k1 start') are not listed, older ones are cut. */
  {
    static uint64_t hand[132 * MM_TL_EVENTS];
    memset(hand, 0, sizeof hand);
    const uint64_t s0 = 5000000000000ull, s1 = s0 + 1000000000ull; /* two forwards' starts */
    for (int c = 0; c < 132; ++c) {
      uint64_t* e = hand + (size_t)c * MM_TL_EVENTS;
      e[MM_TL_K2_FIRST_MAIN] = s0 + 500; /* the first forward's */
      e[MM_TL_K1_START] = s1;
      e[MM_TL_COUNTED] = s1 + 10;
      e[MM_TL_L1_MATH_END] = s1 + 20;
      e[MM_TL_K2_START] = s1 + 30;
      e[MM_TL_K2_MATH_REGS] = s1 + 31;
      e[MM_TL_K2_PRODUCER_REGS] = s1 + 32;
      if (c != 42) e[MM_TL_K2_FIRST_MAIN] = s1 + 50, e[MM_TL_L2_MATH_END] = s1 + 90;
    }
    mm_timeline_watch_summary(hand, 132, 0, line, sizeof line);
    CHECK_MSG(strcmp(line, "1 CTA at 'k2 producer regs' [42: ... 'L1 math end' < 'k2 start / 1st L2' < 'k2 math regs' "
                           "< 'k2 producer regs']; 131 CTAs at 'L2 math end'") == 0,
              "got \"%s\"", line);
    hand[42 * MM_TL_EVENTS + MM_TL_K2_MATH_REGS] = 0; /* the math side never past its setmaxnreg.inc */
    mm_timeline_watch_summary(hand, 132, 0, line, sizeof line);
    CHECK_MSG(strcmp(line, "1 CTA at 'k2 producer regs' [42: ... 'counted' < 'L1 math end' < 'k2 start / 1st L2' < "
                           "'k2 producer regs']; 131 CTAs at 'L2 math end'") == 0,
              "got \"%s\"", line);
    /* Two CTAs in the group, each with its own stamps, told apart by '|'; CTA 7's two hand-off
     * stamps in one %globaltimer tick: '=' (listed in event order), not '<'. */
    {
      uint64_t* e7 = hand + (size_t)7 * MM_TL_EVENTS;
      e7[MM_TL_K2_FIRST_MAIN] = e7[MM_TL_L2_MATH_END] = 0;
      e7[MM_TL_K2_PRODUCER_REGS] = e7[MM_TL_K2_MATH_REGS];
      mm_timeline_watch_summary(hand, 132, 0, line, sizeof line);
      CHECK_MSG(strcmp(line, "1 CTA at 'k2 producer regs' [42: ... 'counted' < 'L1 math end' < 'k2 start / 1st L2' "
                             "< 'k2 producer regs']; 1 CTA at 'k2 math regs' [7: ... 'L1 math end' < 'k2 start / 1st "
                             "L2' < 'k2 producer regs' = 'k2 math regs']; 130 CTAs at 'L2 math end'") == 0,
                "got \"%s\"", line);
      e7[MM_TL_K2_PRODUCER_REGS] = e7[MM_TL_K2_MATH_REGS] + 1; /* a microsecond apart: 7 and 42 in one group */
      mm_timeline_watch_summary(hand, 132, 0, line, sizeof line);
      CHECK_MSG(strcmp(line, "2 CTAs at 'k2 producer regs' [7: ... 'L1 math end' < 'k2 start / 1st L2' < 'k2 math "
                             "regs' < 'k2 producer regs' | 42: ... 'counted' < 'L1 math end' < 'k2 start / 1st L2' < "
                             "'k2 producer regs']; 130 CTAs at 'L2 math end'") == 0,
                "got \"%s\"", line);
      e7[MM_TL_K2_FIRST_MAIN] = s1 + 50, e7[MM_TL_L2_MATH_END] = s1 + 90;
    }
    /* Fewer stamps this forward: all of them, and not the stale 'k2 1st L2 main done' before them. */
    hand[42 * MM_TL_EVENTS + MM_TL_COUNTED] = hand[42 * MM_TL_EVENTS + MM_TL_L1_MATH_END] = 0;
    mm_timeline_watch_summary(hand, 132, 0, line, sizeof line);
    CHECK_MSG(strcmp(line, "1 CTA at 'k2 producer regs' [42: 'k1 start' < 'k2 start / 1st L2' < 'k2 producer regs']; "
                           "131 CTAs at 'L2 math end'") == 0,
              "got \"%s\"", line);
  }
  /* More than MM_TL_WATCH_NAMED CTAs in a group: counted, not listed. */
  uint64_t many[20 * MM_TL_EVENTS];
  memset(many, 0, sizeof many);
  for (int c = 0; c < 20; ++c) many[(size_t)c * MM_TL_EVENTS + MM_TL_K1_START] = 5 + (uint64_t)c;
  mm_timeline_watch_summary(many, 20, 0, line, sizeof line);
  CHECK_MSG(strcmp(line, "20 CTAs at 'k1 start'") == 0, "got \"%s\"", line);
  return MM_TEST_PASS;
}

/* The watch thread prints the line to stderr within its period, once per
 * change and again every MM_TL_WATCH_REPEAT unchanged samples, and stops
 * (joined); bad arguments start nothing. */
static mm_test_result test_timeline_watch_thread(void) {
  uint64_t tl[5 * MM_TL_EVENTS];
  hang_snapshot(tl);
  CHECK(mm_timeline_watch_start(NULL, 5, 0, 1.0) == NULL);
  CHECK(mm_timeline_watch_start(tl, 0, 0, 1.0) == NULL);
  CHECK(mm_timeline_watch_start(tl, MM_TL_MAX_CTAS + 1, 0, 1.0) == NULL);
  CHECK(mm_timeline_watch_start(tl, 5, 0, 0.0) == NULL);
  CHECK(mm_timeline_watch_start(tl, 5, 0, MM_TL_WATCH_MIN_S / 2) == NULL);  /* a busy loop */
  CHECK(mm_timeline_watch_start(tl, 5, 0, 1e10) == NULL);                  /* past the time math */
  CHECK(mm_timeline_watch_start(tl, 5, 0, 1.0 / 0.0) == NULL);
  /* The largest period accepted starts and stops at once (stop wakes the wait). */
  mm_timeline_watch* longest = mm_timeline_watch_start(tl, 5, 0, MM_TL_WATCH_MAX_S);
  CHECK(longest != NULL);
  mm_timeline_watch_stop(longest);
  mm_timeline_watch_stop(NULL);
  mm_stderr_capture cap;
  CHECK(mm_stderr_capture_begin(&cap) == 0);
  mm_timeline_watch* w = mm_timeline_watch_start(tl, 5, 3, 0.01);
  const struct timespec nap = {0, 300 * 1000 * 1000};
  nanosleep(&nap, NULL); /* many periods, one grouping */
  /* CTA 4 starts (a volatile store: the watch thread reads the array meanwhile, as the host
   * reads what the kernels store). */
  ((volatile uint64_t*)tl)[(size_t)4 * MM_TL_EVENTS + MM_TL_K1_START] = 1000000000000ull + 3500000000ull;
  nanosleep(&nap, NULL);
  mm_timeline_watch_stop(w);
  char* text = mm_stderr_capture_end(&cap, 0); /* freed on success only: a failed test may leak it */
  CHECK(w != NULL);
  CHECK(text != NULL && text[0] != '\0');
  /* Every line: "megamoe: timeline watch (rank 3, T s[, unchanged]): ...". Two changes (the
   * first sample, CTA 4's start), each printed once; in between, the unchanged grouping printed
   * again every MM_TL_WATCH_REPEAT samples (300 ms is about 30 samples of 10 ms). */
  int changes = 0, repeats = 0, before_start = 0, after_start = 0;
  for (char* p = text; *p;) {
    char* end = strchr(p, '\n');
    CHECK_MSG(end != NULL, "a line without its newline: \"%s\"", p);
    *end = '\0';
    CHECK_MSG(strncmp(p, "megamoe: timeline watch (rank 3, ", 33) == 0, "line \"%s\"", p);
    if (strstr(p, " s, unchanged): ")) ++repeats;
    else ++changes;
    if (strstr(p, " s): 3 CTAs at 'counted'") || strstr(p, " s, unchanged): 3 CTAs at 'counted'")) {
      ++before_start;
      CHECK_HAS(p, "; 1 CTA at 'never stamped' [4]");
    }
    if (strstr(p, "): 1 CTA at 'k1 start' (0.0-0.0 s before the newest stamp) [4: 'k1 start']; 3 CTAs at 'counted'"))
      ++after_start;
    p = end + 1;
  }
  CHECK_EQ_INT(changes, 2);
  CHECK(repeats >= 1);
  CHECK(before_start >= 1 && after_start >= 1 && before_start + after_start == changes + repeats);
  free(text);
  return MM_TEST_PASS;
}

const mm_test unit_suite_clocks[] = {
    {"timeline_sm_khz", test_timeline_sm_khz},
    {"timeline_watch_summary", test_timeline_watch_summary},
    {"timeline_watch_thread", test_timeline_watch_thread},
    {"clocks_stats_merge", test_clock_stats_merge},
    {"clocks_stats_format", test_clock_stats_format},
    {"clocks_start_without_gpu", test_clocks_start_without_gpu},
    {NULL, NULL},
};
