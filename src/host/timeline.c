/* The timeline's host side beyond the copy (timeline.h): the event names,
 * and the watch that prints where each CTA stands while a forward runs, for a
 * kernel that never ends (a hang under a tool, a CTA that never arrives). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timeline.h"

const char* mm_timeline_event_name(int e) {
  static const char* const names[] = {
      "k1 start", "counted", "published", "barrier 0 (CTA 0)", "layout (CTA 0)", "laid out", "stream built",
      "tasks decoded", "roles start", "pull end", "L1 first load", "L1 first tile issued", "L1 last tile issued",
      "L1 math end", "k2 start / 1st L2", "k2 producer regs", "k2 math regs", "k2 1st L2 main done", "L2 math end",
      "pushed", "combined (barrier 1)", "reduced",
      "[sum] wait pulled", "[sum] wait L1 done", "[sum] wait ring slot", "[sum] copy wait pull",
      "[sum] math: next task", "[sum] math: L1 main", "[sum] math: L1 epilogue", "[sum] math: L2 main",
      "[sum] math: L2 staging", "[sum] math: task vote", "[sum] math: L1 publish", "[sum] math: publish at L2",
      "[sum] producer: publish", "[sum] producer: loads", "[sum] math: L1 data waits", "[sum] math: L2 data waits",
      NULL, NULL, NULL /* the raw clock readings behind the next */, "SM MHz, k1 to math end"};
  _Static_assert(sizeof names / sizeof names[0] == MM_TL_EVENTS, "a name per timeline event (contract.h)");
  return e >= 0 && e < MM_TL_EVENTS ? names[e] : NULL;
}

/* snprintf that appends at *len and never runs past cap (a full buffer
 * keeps its terminator; the rest is dropped). */
static void append(char* out, size_t cap, size_t* len, const char* fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(out + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* Each CTA's latest stamp: which event (-1: none) and when (0: none). A tie
 * (%globaltimer ticks in about 1 us) goes to the later event: the events are
 * numbered in program order. */
static void latest_stamps(const uint64_t* tl, int ctas, int* event, uint64_t* ns) {
  for (int c = 0; c < ctas; ++c) {
    const uint64_t* e = tl + (size_t)c * MM_TL_EVENTS;
    event[c] = -1;
    ns[c] = 0;
    for (int k = 0; k < MM_TL_FIRST_DURATION; ++k)
      if (e[k] != 0 && e[k] >= ns[c]) ns[c] = e[k], event[c] = k;
  }
}

/* A CTA's last MM_TL_WATCH_RECENT stamps of its current forward (at or
 * after its 'k1 start'), oldest first: ": ... 'a' < 'b' = 'c'" ('=': the
 * same %globaltimer reading, which ticks about once a microsecond; listed
 * in event order). The latest alone cannot tell events of two roles apart
 * (the register hand-off's producer and math stamps land within a
 * microsecond, either first); their order, and which of them is missing,
 * can. */
static size_t append_recent(char* out, size_t cap, size_t len, const uint64_t* e) {
  int pick[MM_TL_WATCH_RECENT + 1]; /* one more: whether older ones were left out */
  int n = 0;
  uint64_t below = UINT64_MAX; /* the next pick is the latest stamp older than this */
  int below_event = MM_TL_FIRST_DURATION;
  while (n <= MM_TL_WATCH_RECENT) {
    int best = -1;
    for (int k = 0; k < MM_TL_FIRST_DURATION; ++k) {
      if (e[k] == 0 || e[k] < e[MM_TL_K1_START]) continue; /* never, or a stale one of an earlier forward */
      /* strictly before (time, event) of the last pick; ties go to the later event, as latest_stamps */
      if (e[k] > below || (e[k] == below && k >= below_event)) continue;
      if (best < 0 || e[k] > e[best] || (e[k] == e[best] && k > best)) best = k;
    }
    if (best < 0) break;
    pick[n++] = best;
    below = e[best];
    below_event = best;
  }
  const int more = n > MM_TL_WATCH_RECENT;
  if (more) n = MM_TL_WATCH_RECENT;
  append(out, cap, &len, ":%s", more ? " ..." : "");
  for (int i = n - 1; i >= 0; --i)
    append(out, cap, &len, "%s'%s'", i == n - 1 ? " " : e[pick[i]] == e[pick[i + 1]] ? " = " : " < ",
           mm_timeline_event_name(pick[i]));
  return len;
}

size_t mm_timeline_watch_summary(const uint64_t* tl, int ctas, int with_ages, char* out, size_t cap) {
  size_t len = 0;
  if (cap == 0) return 0;
  out[0] = '\0';
  if (ctas > MM_TL_MAX_CTAS) ctas = MM_TL_MAX_CTAS;
  int event[MM_TL_MAX_CTAS];
  uint64_t ns[MM_TL_MAX_CTAS];
  latest_stamps(tl, ctas, event, ns);
  uint64_t newest = 0;
  for (int c = 0; c < ctas; ++c)
    if (ns[c] > newest) newest = ns[c];
  if (newest == 0) {
    append(out, cap, &len, "no CTA stamped yet");
    return len;
  }
  /* Groups by latest event, in event order; "none" (never stamped) last. */
  for (int g = 0; g <= MM_TL_FIRST_DURATION; ++g) {
    const int want = g < MM_TL_FIRST_DURATION ? g : -1;
    int n = 0;
    uint64_t age_lo = UINT64_MAX, age_hi = 0;
    for (int c = 0; c < ctas; ++c) {
      if (event[c] != want) continue;
      ++n;
      const uint64_t age = newest - ns[c];
      if (age < age_lo) age_lo = age;
      if (age > age_hi) age_hi = age;
    }
    if (n == 0) continue;
    append(out, cap, &len, "%s%d CTA%s at '%s'", len ? "; " : "", n, n == 1 ? "" : "s",
           want < 0 ? "never stamped" : mm_timeline_event_name(want));
    if (with_ages && want >= 0)
      append(out, cap, &len, " (%.1f-%.1f s before the newest stamp)", age_lo * 1e-9, age_hi * 1e-9);
    /* A small group is the interesting one (the CTAs the rest wait for): name them. */
    if (n <= MM_TL_WATCH_NAMED) {
      const char* sep = " [";
      for (int c = 0; c < ctas; ++c)
        if (event[c] == want) {
          const int detail = n <= MM_TL_WATCH_DETAIL && want >= 0;
          append(out, cap, &len, "%s%d", sep, c), sep = detail ? " | " : " ";
          if (detail) len = append_recent(out, cap, len, tl + (size_t)c * MM_TL_EVENTS);
        }
      append(out, cap, &len, "]");
    }
  }
  return len;
}

struct mm_timeline_watch {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int stop;
  const volatile uint64_t* tl; /* mapped host memory the kernels write */
  int ctas, rank;
  double period_s;
};

static void* watch_main(void* arg) {
  mm_timeline_watch* w = (mm_timeline_watch*)arg;
  const size_t n = (size_t)w->ctas * MM_TL_EVENTS;
  uint64_t* snap = malloc(sizeof(uint64_t) * n);
  char* key = malloc(MM_TL_WATCH_LINE);
  char* last = calloc(1, MM_TL_WATCH_LINE);
  char* line = malloc(MM_TL_WATCH_LINE);
  if (!snap || !key || !last || !line) {
    fprintf(stderr, "megamoe: timeline watch (rank %d): out of host memory, not watching\n", w->rank);
    free(snap), free(key), free(last), free(line);
    return NULL;
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int unchanged = 0;
  pthread_mutex_lock(&w->lock);
  const time_t whole_s = (time_t)w->period_s; /* the period is in [MIN, MAX]: no overflow */
  const long part_ns = (long)((w->period_s - (double)whole_s) * 1e9);
  while (!w->stop) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until); /* the condition's clock (mm_timeline_watch_start) */
    until.tv_sec += whole_s;
    until.tv_nsec += part_ns;
    if (until.tv_nsec >= 1000000000l) until.tv_sec += 1, until.tv_nsec -= 1000000000l;
    int rc = 0;
    while (!w->stop && rc == 0) rc = pthread_cond_timedwait(&w->wake, &w->lock, &until);
    if (rc != 0 && rc != ETIMEDOUT) {
      fprintf(stderr, "megamoe: timeline watch (rank %d): pthread_cond_timedwait: error %d, not watching\n", w->rank, rc);
      break;
    }
    if (w->stop) break;
    /* Volatile reads of what the kernels store with system scope
     * (device/timeline.cuh): a snapshot, not an atomic one. */
    for (size_t i = 0; i < n; ++i) snap[i] = w->tl[i];
    mm_timeline_watch_summary(snap, w->ctas, 0, key, MM_TL_WATCH_LINE);
    /* Printed when the grouping changed, and again after MM_TL_WATCH_REPEAT
     * samples without a change (so a hang prints rarely, and a silent watch is
     * not mistaken for a dead one); with the seconds since the watch started. */
    const int changed = strcmp(key, last) != 0;
    unchanged = changed ? 0 : unchanged + 1;
    if (changed || unchanged % MM_TL_WATCH_REPEAT == 0) {
      mm_timeline_watch_summary(snap, w->ctas, 1, line, MM_TL_WATCH_LINE);
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      const double t = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
      fprintf(stderr, "megamoe: timeline watch (rank %d, %.1f s%s): %s\n", w->rank, t, changed ? "" : ", unchanged",
              line);
      fflush(stderr);
      memcpy(last, key, MM_TL_WATCH_LINE);
    }
  }
  pthread_mutex_unlock(&w->lock);
  free(snap), free(key), free(last), free(line);
  return NULL;
}

mm_timeline_watch* mm_timeline_watch_start(const volatile uint64_t* tl, int ctas, int rank, double period_s) {
  if (!tl || ctas < 1 || ctas > MM_TL_MAX_CTAS || !isfinite(period_s) || period_s < MM_TL_WATCH_MIN_S ||
      period_s > MM_TL_WATCH_MAX_S)
    return NULL;
  mm_timeline_watch* w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->tl = tl, w->ctas = ctas, w->rank = rank, w->period_s = period_s;
  if (pthread_mutex_init(&w->lock, NULL) != 0) {
    free(w);
    return NULL;
  }
  /* The period on the monotonic clock: a change of the wall clock does not stretch it. */
  pthread_condattr_t attr;
  int ok = pthread_condattr_init(&attr) == 0;
  if (ok) {
    ok = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&w->wake, &attr) == 0;
    pthread_condattr_destroy(&attr);
  }
  if (!ok) {
    pthread_mutex_destroy(&w->lock);
    free(w);
    return NULL;
  }
  if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    free(w);
    return NULL;
  }
  return w;
}

void mm_timeline_watch_stop(mm_timeline_watch* w) {
  if (!w) return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  pthread_cond_destroy(&w->wake);
  pthread_mutex_destroy(&w->lock);
  free(w);
}
