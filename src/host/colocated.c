/* Co-located ranks' host collectives (colocated.h). */
#include "colocated.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "megamoe.h"

/* The group lives in memory shared by processes: its atomics must not
 * fall back on a lock inside one process's address space. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics are lock-free (shared between processes)");

/* The top bit of the arrival count: the group is broken. */
#define BROKEN_BIT ((uint64_t)1 << 63)

typedef struct slot_head {
  uint32_t tag;
  uint32_t bytes;
} slot_head;

struct mm_colocated {
  int num_ranks;
  /* Arrivals at the collectives, never reset: rank r's arrival at its k-th
   * collective (k from 0) is one of the first (k + 1) * num_ranks only once
   * every rank arrived at its k-th (a rank arrives at k + 1 only after it
   * saw the count reach (k + 1) * num_ranks), as the device's grid barrier
   * (comm/grid.cuh). BROKEN_BIT set: every later call fails, and no
   * arrival adds to the count any more. A waiter that gives up sets it only
   * by a compare-and-swap from a count below its round's end, so a round
   * that completed can no longer be broken and a broken one can no longer
   * complete: every rank gets one verdict per round. */
  _Atomic uint64_t arrived;
  uint64_t calls[MEGAMOE_MAX_RANKS]; /* collectives rank r has entered; only rank r touches its entry */
  /* Two banks by round parity: a rank writes round k + 2's slot only after
   * every rank arrived at round k + 1, i.e. after every rank finished
   * reading round k's slots (each reads before its next arrival). */
  slot_head head[2][MEGAMOE_MAX_RANKS];
  unsigned char slot[2][MEGAMOE_MAX_RANKS][MM_COLOCATED_SLOT_BYTES];
};

static mm_colocated* current_group;
static int current_rank;

mm_colocated* mm_colocated_current(int* rank) {
  if (rank) *rank = current_rank;
  return current_group;
}

void mm_colocated_set_current(mm_colocated* g, int rank) {
  current_group = g;
  current_rank = g ? rank : 0;
}

mm_colocated* mm_colocated_create(int num_ranks) {
  if (num_ranks < 1 || num_ranks > MEGAMOE_MAX_RANKS) return NULL;
  void* p = mmap(NULL, sizeof(mm_colocated), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  mm_colocated* g = (mm_colocated*)p; /* zero-filled by mmap */
  g->num_ranks = num_ranks;
  atomic_init(&g->arrived, 0);
  return g;
}

void mm_colocated_destroy(mm_colocated* g) {
  if (g) munmap(g, sizeof *g);
}

int mm_colocated_ranks(const mm_colocated* g) { return g ? g->num_ranks : 0; }

uint32_t mm_colocated_tag(const char* name) {
  uint32_t h = 2166136261u;
  for (const unsigned char* c = (const unsigned char*)(name ? name : ""); *c; ++c) h = (h ^ *c) * 16777619u;
  return h;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mm_colocated_allgather(mm_colocated* g, int rank, uint32_t tag, const void* mine, size_t bytes, void* all,
                           double timeout_s) {
  if (!g) return MM_COLOCATED_BAD_ARGS;
  if (rank < 0 || rank >= g->num_ranks || bytes > MM_COLOCATED_SLOT_BYTES || (bytes > 0 && (!mine || !all))) {
    atomic_fetch_or(&g->arrived, BROKEN_BIT); /* the others would wait for this rank's arrival */
    return MM_COLOCATED_BAD_ARGS;
  }
  if (atomic_load(&g->arrived) & BROKEN_BIT) return MM_COLOCATED_TIMEOUT;
  const uint64_t round = g->calls[rank]++;
  const int bank = (int)(round & 1u);
  g->head[bank][rank].tag = tag;
  g->head[bank][rank].bytes = (uint32_t)bytes;
  if (bytes > 0) memcpy(g->slot[bank][rank], mine, bytes);
  /* The arrival: the slot before it (seq_cst: a release), every other
   * rank's reads after it sees the count (an acquire). Never on a broken
   * group, so a break freezes the count: a round whose count reached its
   * end completed before any break. */
  uint64_t count = atomic_load(&g->arrived);
  do {
    if (count & BROKEN_BIT) return MM_COLOCATED_TIMEOUT;
  } while (!atomic_compare_exchange_weak(&g->arrived, &count, count + 1));
  const uint64_t target = (round + 1) * (uint64_t)g->num_ranks;
  const double deadline = now_s() + (timeout_s > 0 ? timeout_s : 0);
  for (;;) {
    uint64_t seen = atomic_load(&g->arrived);
    if ((seen & ~BROKEN_BIT) >= target) break; /* complete (a later round's break may be set: not ours) */
    if (seen & BROKEN_BIT) return MM_COLOCATED_TIMEOUT;
    /* Give up only while the round is still short: the swap fails if the
     * last arrival (or another breaker) came first, and the loop looks again. */
    if (now_s() > deadline && atomic_compare_exchange_strong(&g->arrived, &seen, seen | BROKEN_BIT))
      return MM_COLOCATED_TIMEOUT;
    const struct timespec nap = {0, 20000}; /* 20 us: the ranks are host threads of other processes */
    nanosleep(&nap, NULL);
  }
  /* Every rank reads the same heads, so every rank reaches the same verdict. */
  for (int r = 0; r < g->num_ranks; ++r)
    if (g->head[bank][r].tag != tag || g->head[bank][r].bytes != (uint32_t)bytes) {
      atomic_fetch_or(&g->arrived, BROKEN_BIT);
      return MM_COLOCATED_MISMATCH;
    }
  for (int r = 0; r < g->num_ranks && bytes > 0; ++r)
    memcpy((unsigned char*)all + (size_t)r * bytes, g->slot[bank][r], bytes);
  return MM_COLOCATED_OK;
}
