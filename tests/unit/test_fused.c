/* The fused arm's schedule on the CPU (docs/FUSED.md; issue 11): the ring's
 * size and the per-call order (src/host/fused_plan.c), the task stream the
 * kernel will decode (src/fused.h), and the claim the ring rests on: in the
 * stream's order, every block written into a ring slot is read by its L2
 * tiles before the slot is written again, with the slot guard the only wait
 * that enforces it, and no wait ever points forward in the stream (so the
 * static round-robin of tasks over CTAs cannot deadlock).
 *
 * Three checks of that claim, each over many shapes and skewed routings:
 *   - static: block by block, the last L2 task of the slot's previous block
 *     comes before the first L1 task of the next (the guard points back), and
 *     the live set (blocks between their first L1 and last L2) stays within
 *     8 (lag + group) blocks, under the ring;
 *   - dynamic: CTAs and pull warps run the stream in random interleavings,
 *     each waiting exactly where the kernel will wait, with the kernel's
 *     deferred L1_DONE publication and its claimed tasks too; a shadow owner
 *     per slot fails the run when a slot is overwritten while its block still
 *     has a reader, and a state where nobody can move is a deadlock;
 *   - both can fail: a ring one block short of 8 (lag + group) breaks the
 *     static check on an adversarial shape, the simulation without its slot
 *     guard overwrites live slots, and the deferral without its publication
 *     before an L2 task deadlocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fused.h"
#include "host/config.h"
#include "host/device_status.h"
#include "host/fused_plan.h"
#include "host/layout.h"
#include "megamoe.h"
#include "unit.h"

/* ---- Streams over caller-owned arrays -------------------------------------- */
typedef struct test_stream {
  mm_fused_stream s;
  int32_t* mem;
} test_stream;

static void stream_make(test_stream* t, mm_fused_order order, int32_t experts, const int32_t* rows, int bm0,
                        int bm1, int tn0, int tn1) {
  t->mem = (int32_t*)malloc(sizeof(int32_t) * MM_FUSED_STREAM_WORDS(experts));
  memset(&t->s, 0, sizeof t->s);
  mm_fused_stream_init(&t->s, order, experts, rows, t->mem, bm0, bm1, tn0, tn1);
}

static void stream_free(test_stream* t) { free(t->mem); }

/* The order as docs/FUSED.md section 2 states it, written apart from
 * src/fused.h: phases; in each, the L1 tasks of its units, then the L2
 * tasks of its units; units in order, gathered in segments (the phase's
 * units of one expert whose index in the expert divided by
 * MM_FUSED_SEGMENT_UNITS is the same); inside a segment, for each n-tile the
 * segment's m-tiles. Fills out[] (capacity cap) and returns the task count. */
static int64_t model_phase(const mm_fused_order* o, int gemm, int64_t u) {
  if (o->single_wave) return gemm;
  return gemm == 0 ? u / o->group : (u + o->lag) / o->group;
}

_Static_assert(MM_FUSED_SEGMENT_UNITS * (MM_FUSED_UNIT_ROWS / 64) <= 64, "the model's segment buffer (ms[])");

static int64_t model_enumerate(const mm_fused_stream* s, mm_fused_task* out, int64_t cap) {
  int64_t units = 0, last_phase = -1;
  for (int32_t e = 0; e < s->experts; ++e) units += (s->rows[e] + MM_FUSED_UNIT_ROWS - 1) / MM_FUSED_UNIT_ROWS;
  if (units) last_phase = model_phase(&s->order, 1, units - 1);
  int64_t n = 0;
  for (int64_t j = 0; j <= last_phase; ++j)
    for (int gemm = 0; gemm < 2; ++gemm) {
      int64_t u0 = 0, block = 0; /* the expert's first unit and block */
      for (int32_t e = 0; e < s->experts; ++e) {
        const int32_t eu = (s->rows[e] + MM_FUSED_UNIT_ROWS - 1) / MM_FUSED_UNIT_ROWS;
        const int32_t bm = s->bm[gemm];
        for (int32_t run = 0; run * MM_FUSED_SEGMENT_UNITS < eu; ++run) {
          /* The segment: the run's units in phase j, their m-tiles in order. */
          int32_t ms[64], nm = 0;
          for (int32_t q = run * MM_FUSED_SEGMENT_UNITS; q < eu && q < (run + 1) * MM_FUSED_SEGMENT_UNITS; ++q) {
            if (model_phase(&s->order, gemm, u0 + q) != j) continue;
            for (int32_t m = q * (MM_FUSED_UNIT_ROWS / bm); m * bm < s->rows[e] && m < (q + 1) * (MM_FUSED_UNIT_ROWS / bm);
                 ++m)
              ms[nm++] = m;
          }
          for (int32_t nt = 0; nt < s->tiles_n[gemm]; ++nt)
            for (int32_t i = 0; i < nm; ++i, ++n) {
              if (n >= cap) continue;
              mm_fused_task* t = &out[n];
              t->gemm = gemm;
              t->expert = e;
              t->m = ms[i];
              t->unit = u0 + t->m / (MM_FUSED_UNIT_ROWS / bm);
              t->n = nt;
              t->row0 = t->m * bm;
              t->rows = s->rows[e] - t->row0 < bm ? s->rows[e] - t->row0 : bm;
              t->block0 = block + t->row0 / MM_FUSED_BLOCK_ROWS;
            }
        }
        u0 += eu;
        block += (s->rows[e] + MM_FUSED_BLOCK_ROWS - 1) / MM_FUSED_BLOCK_ROWS;
      }
    }
  return n;
}

/* Every task of the stream, in stream order, decoded by mm_fused_task_at
 * (the caller frees it). */
static mm_fused_task* decode_all(const mm_fused_stream* s) {
  mm_fused_task* tasks = (mm_fused_task*)malloc(sizeof(mm_fused_task) * (size_t)(s->tasks + 1));
  for (int64_t t = 0; t < s->tasks; ++t) mm_fused_task_at(s, t, &tasks[t]);
  return tasks;
}

/* Virtual blocks a task covers: [block0, last]. */
static int64_t task_last_block(const mm_fused_task* t) {
  return t->block0 + (t->row0 % MM_FUSED_BLOCK_ROWS + t->rows - 1) / MM_FUSED_BLOCK_ROWS;
}

/* ---- Routings --------------------------------------------------------------
 * Rows per local expert of one forward: N rows (what the ranks routed here)
 * spread over E_l experts by one of several skews. */
enum { SKEW_EVEN, SKEW_ZIPF, SKEW_ONE, SKEW_HOLES, SKEW_RANDOM, SKEW_KINDS };
static const char* const kSkewNames[SKEW_KINDS] = {"even", "zipf", "one expert", "holes", "random"};

static void draw_rows(mm_rng* g, int skew, int64_t N, int32_t El, int32_t* rows) {
  memset(rows, 0, sizeof(int32_t) * (size_t)El);
  if (N <= 0) return;
  double w[1024], total = 0;
  for (int32_t e = 0; e < El; ++e) {
    switch (skew) {
      case SKEW_EVEN: w[e] = 1.0; break;
      case SKEW_ZIPF: w[e] = 1.0 / (double)((e * 7 + 3) % El + 1); break;
      case SKEW_ONE: w[e] = e == El / 2 ? 1.0 : 0.0; break;
      case SKEW_HOLES: w[e] = mm_rng_below(g, 3) ? 0.0 : 1.0; break;
      default: w[e] = mm_rng_uniform(g); break;
    }
    total += w[e];
  }
  if (total == 0) w[0] = total = 1.0;
  int64_t left = N;
  for (int32_t e = 0; e < El && left > 0; ++e) {
    int64_t r = (int64_t)((double)N * w[e] / total);
    if (r > left) r = left;
    rows[e] = (int32_t)r;
    left -= r;
  }
  while (left-- > 0) rows[mm_rng_below(g, (uint64_t)El)]++; /* the remainder anywhere: ragged last blocks */
}

/* ---- The static check ---------------------------------------------------------
 * Walks the decoded stream. Per block: the first and last
 * position of its L1 tasks and of its L2 tasks. Then: every block's L1 ends
 * before its L2 starts; the guard's block (the slot's previous occupant) ends
 * its L2 before the block's first L1; the live set stays within live_limit
 * blocks; a single-wave stream fits the ring. why: the first broken rule. */
static int static_check(const mm_fused_stream* s, const mm_fused_task* tasks, int64_t live_limit, char* why,
                        size_t n) {
  const int64_t B = s->blocks;
  int64_t* pos = (int64_t*)malloc(sizeof(int64_t) * 4 * (size_t)(B ? B : 1));
  int64_t* delta = (int64_t*)calloc((size_t)s->tasks + 2, sizeof(int64_t));
  int ok = 1;
  for (int64_t b = 0; b < B; ++b) pos[4 * b] = pos[4 * b + 2] = INT64_MAX, pos[4 * b + 1] = pos[4 * b + 3] = -1;
  for (int64_t t = 0; t < s->tasks; ++t) {
    const mm_fused_task* k = &tasks[t];
    for (int64_t b = k->block0; b <= task_last_block(k); ++b) {
      int64_t* p = &pos[4 * b + 2 * k->gemm];
      if (t < p[0]) p[0] = t;
      p[1] = t;
    }
  }
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t* p = &pos[4 * b];
    if (p[1] < 0 || p[3] < 0) ok = 0, snprintf(why, n, "block %lld has no L1 or no L2 task", (long long)b);
    else if (p[1] >= p[2])
      ok = 0, snprintf(why, n, "block %lld: last L1 at %lld, first L2 at %lld", (long long)b, (long long)p[1],
                       (long long)p[2]);
    const int64_t pred = mm_fused_slot_predecessor(&s->order, b);
    if (ok && !s->order.single_wave && pred >= 0 && pos[4 * pred + 3] >= p[0])
      ok = 0, snprintf(why, n, "block %lld (slot %lld): first L1 at %lld, but block %lld's last L2 is at %lld",
                       (long long)b, (long long)(b % s->order.ring_blocks), (long long)p[0], (long long)pred,
                       (long long)pos[4 * pred + 3]);
    if (ok) delta[p[0]]++, delta[p[3] + 1]--;
  }
  int64_t live = 0, most = 0;
  for (int64_t t = 0; ok && t <= s->tasks; ++t) {
    live += delta[t];
    if (live > most) most = live;
  }
  if (ok && most > live_limit)
    ok = 0, snprintf(why, n, "%lld blocks live at once, above %lld", (long long)most, (long long)live_limit);
  if (ok && s->order.single_wave && B > s->order.ring_blocks)
    ok = 0, snprintf(why, n, "single wave of %lld blocks in a ring of %d", (long long)B, s->order.ring_blocks);
  free(pos);
  free(delta);
  return ok;
}

/* ---- The dynamic check ----------------------------------------------------------
 * `ctas` CTAs take tasks in stream order: t = c, c + ctas, ... (the static
 * round-robin), or, with `claim`, each CTA's next task from one counter, claimed
 * when it starts its current one (the kernel's producer claims one task ahead:
 * fused_kernel.cuh, mm_fused_produce). `pulls` pull warps take virtual rows
 * w, w + pulls, ... in order, skipping padding rows. Each waits where the kernel
 * waits:
 *   pull of a row of block b:  L2_DONE of mm_fused_slot_predecessor(b) complete
 *   L1 task:                   PULLED of each block it covers complete
 *   L2 task:                   L1_DONE of each block it covers complete
 * and counts rows into the counters when it runs (a pull warp runs a burst of
 * up to 16 of its rows, stopping at one that must wait). Every step runs a
 * ready agent chosen at random. A shadow owner per slot checks what the guard
 * must guarantee. guard = 0 plants the bug of a missing slot guard.
 *
 * When an L1 tile's L1_DONE counts (`publish`):
 *   SIM_PUBLISH_NOW       when the tile runs (the stream's own claim: no wait
 *                         points forward);
 *   SIM_PUBLISH_DEFERRED  the kernel's rule (mm_fused_math, mm_fused_l1_pending):
 *                         the tile stays pending until the CTA's next L1 tile
 *                         has run, and the CTA publishes it first, before
 *                         anything else, when it reaches an L2 task, the end of
 *                         its tasks, or an L1 task whose block is a ring's length
 *                         ahead of the pending one (block0 + 1 >= pending + ring);
 *                         publishing waits for nothing;
 *   SIM_PUBLISH_PAIRS     a design, not the kernel: up to two pending, both
 *                         published after the L1 tile that finds two, with the
 *                         same three rules against the older (built as a kernel
 *                         option in the sixteenth session, measured slower in the
 *                         seventeenth and removed: docs/PERF.md); kept as the
 *                         checked rule for a later pairs design;
 *   SIM_PUBLISH_NO_L2_RULE  the kernel's rule without the publication before an
 *                         L2 task: a planted bug (the L2 tile may need the CTA's
 *                         own pending tile);
 *   SIM_PUBLISH_NO_RING_RULE  the kernel's rule without the ring-distance one: a
 *                         planted bug (with claimed tasks, the next L1 tile's pull
 *                         can wait, through the slot guard and L2 tiles, on the
 *                         pending tile);
 *   SIM_PUBLISH_BY_COPY   a design, not the kernel: the deferral's points and
 *                         rules, but a publication only hands the tile to the
 *                         CTA's copy agent (after waiting until the copy agent
 *                         took the previous hand-off), which releases L1_DONE
 *                         when it reaches that L1 task in the CTA's order (built
 *                         as a kernel option in the twenty-fifth session, no
 *                         gain on an H100, removed: docs/PERF.md);
 *   SIM_PUBLISH_BY_COPY_NO_L2_RULE  the same without the hand-off before an L2
 *                         task: a planted bug.
 *
 * `copies` models each CTA's copy warps as an agent of their own (implied by
 * the BY_COPY modes): they walk the CTA's tasks in the order it ran them, an
 * L2 task once the CTA staged it (its rows acquired: PULLED complete), which
 * is when L2_DONE counts (without `copies`, L2_DONE counts when the tile
 * runs). The CTA then also waits where the kernel's math and producer wait
 * on them: a task's step needs every L2 tile it staged before to be copied
 * out (copy_empty, the staging area), and its k-th task needs the copy agent
 * to have read its task k - MM_GEMM_TILE_RING (the task ring's slots). */
enum {
  SIM_PUBLISH_NOW,
  SIM_PUBLISH_DEFERRED,
  SIM_PUBLISH_PAIRS,
  SIM_PUBLISH_NO_L2_RULE,
  SIM_PUBLISH_NO_RING_RULE,
  SIM_PUBLISH_BY_COPY,
  SIM_PUBLISH_BY_COPY_NO_L2_RULE
};
#define SIM_AGENTS 64
#define SIM_TASK_RING 4 /* MM_GEMM_TILE_RING (gemm_cfg.cuh, a device header) */

typedef struct sim_result {
  int ok;
  char why[256];
} sim_result;

typedef struct sim {
  const mm_fused_stream* s;
  const mm_fused_task* tasks;
  int ctas, pulls, guard, publish, claim;
  int64_t* count[MM_FUSED_COUNTERS];
  int64_t* owner;          /* [ring] the block a slot holds, -1: none yet */
  int64_t next[SIM_AGENTS]; /* per agent: CTAs' current task, pull warps' next virtual row */
  int64_t claimed[SIM_AGENTS]; /* with claim: the CTA's task after the current one */
  int64_t claim_counter;
  int64_t pend[SIM_AGENTS][2]; /* a CTA's pending L1 tasks (unpublished L1_DONE), oldest first */
  int npend[SIM_AGENTS];
  /* copies: per CTA the tasks it ran, in order; its copy agent's cursor there;
   * L2 tiles staged and copied; L1 tiles handed and released (BY_COPY) */
  int copies;
  int64_t* ran[SIM_AGENTS];
  int64_t nran[SIM_AGENTS], cursor[SIM_AGENTS], staged[SIM_AGENTS], copied[SIM_AGENTS];
  int64_t handed[SIM_AGENTS], released[SIM_AGENTS];
  sim_result res;
} sim;

static int sim_by_copy(const sim* m) {
  return m->publish == SIM_PUBLISH_BY_COPY || m->publish == SIM_PUBLISH_BY_COPY_NO_L2_RULE;
}

static int sim_complete(const sim* m, int kind, int64_t b) {
  return m->count[kind][b] == mm_fused_counter_target(m->s, kind, b);
}

/* Task k's rows, block by block, into counter `kind`. */
static void sim_count(sim* m, const mm_fused_task* k, int kind) {
  const int64_t t0 = k->block0 * MM_FUSED_BLOCK_ROWS + k->row0 % MM_FUSED_BLOCK_ROWS, t1 = t0 + k->rows;
  for (int64_t b = k->block0; b <= task_last_block(k); ++b) {
    const int64_t lo = b * MM_FUSED_BLOCK_ROWS, hi = lo + MM_FUSED_BLOCK_ROWS; /* the tile's rows in block b */
    m->count[kind][b] += (t1 < hi ? t1 : hi) - (t0 > lo ? t0 : lo);
  }
}

/* The next row of pull warp a that is not padding (or past the end). */
static int64_t sim_pull_row(sim* m, int a) {
  const int64_t end = m->s->blocks * MM_FUSED_BLOCK_ROWS;
  int64_t* r = &m->next[a];
  while (*r < end && *r % MM_FUSED_BLOCK_ROWS >= mm_fused_block_rows(m->s, *r / MM_FUSED_BLOCK_ROWS)) *r += m->pulls;
  return *r < end ? *r : -1;
}

/* Whether CTA a publishes its pending L1 tiles before its current task (or
 * at the end of its tasks): the deferral's three rules. */
static int sim_publishes_first(const sim* m, int a) {
  if (m->publish == SIM_PUBLISH_NOW || m->npend[a] == 0) return 0;
  if (m->next[a] >= m->s->tasks) return 1;
  const mm_fused_task* k = &m->tasks[m->next[a]];
  if (k->gemm == 1) return m->publish != SIM_PUBLISH_NO_L2_RULE && m->publish != SIM_PUBLISH_BY_COPY_NO_L2_RULE;
  return m->publish != SIM_PUBLISH_NO_RING_RULE &&
         k->block0 + 1 >= m->tasks[m->pend[a][0]].block0 + m->s->order.ring_blocks;
}

/* BY_COPY: a hand-off waits until the copy agent took the previous one;
 * the other modes' publications wait for nothing. */
static int sim_can_publish(const sim* m, int a) {
  return !sim_by_copy(m) || m->npend[a] == 0 || m->released[a] == m->handed[a];
}

static void sim_fail(sim* m, const char* fmt, long long a, long long b, long long c, long long d) {
  m->res.ok = 0;
  snprintf(m->res.why, sizeof m->res.why, fmt, a, b, c, d);
}

static void sim_publish(sim* m, int a) {
  if (sim_by_copy(m)) {
    m->handed[a] += m->npend[a]; /* the copy agent counts L1_DONE */
    /* The kernel's hand-off barrier held one tile: a second one before the
     * copy agent took the first would have run its phase two ahead. */
    if (m->handed[a] - m->released[a] > 1)
      sim_fail(m, "CTA %lld handed L1 tile %lld while %lld were not yet taken (%lld tasks run)", a, m->handed[a],
               m->handed[a] - m->released[a] - 1, m->nran[a]);
  } else
    for (int i = 0; i < m->npend[a]; ++i) sim_count(m, &m->tasks[m->pend[a][i]], MM_FUSED_L1_DONE);
  m->npend[a] = 0;
}

/* The copy agent of CTA c (copies): its next task, 1 when it can take it,
 * 0 when it waits, -1 when the CTA's tasks are all done and copied. */
static int sim_copy_ready(const sim* m, int c) {
  if (m->cursor[c] == m->nran[c]) return m->next[c] >= m->s->tasks && m->npend[c] == 0 ? -1 : 0;
  const mm_fused_task* k = &m->tasks[m->ran[c][m->cursor[c]]];
  if (k->gemm == 1) {
    for (int64_t b = k->block0; b <= task_last_block(k); ++b)
      if (!sim_complete(m, MM_FUSED_PULLED, b)) return 0; /* the row tables' writers */
    return 1;
  }
  /* An L1 task: skipped, or (BY_COPY) released once handed. The CTA's L1
   * tiles are handed in the order it ran them, which this walk follows. */
  return !sim_by_copy(m) || m->released[c] < m->handed[c];
}

/* 1: agent a can move now; 0: it waits; -1: it is done. Agents: the CTAs,
 * the pull warps, then (copies) one copy agent per CTA. */
static int sim_ready(sim* m, int a) {
  if (a < m->ctas) {
    if (sim_publishes_first(m, a)) return sim_can_publish(m, a);
    if (m->next[a] >= m->s->tasks) return -1;
    /* The task ring: the producer writes the CTA's k-th task over its
     * (k - ring)-th, which the copy agent must have read: it has read every
     * task up to the one it works on. */
    if (m->copies && m->nran[a] - m->cursor[a] > SIM_TASK_RING) return 0;
    const mm_fused_task* k = &m->tasks[m->next[a]];
    /* copy_empty: an L2 tile's staging waits until the last one was copied
     * out. A staged L1 epilogue waits for that too, after the hand-off of
     * the CTA's pending tile; not modelled, because it cannot block: the L2
     * tiles it waits for ran before that pending tile, and the copy agent
     * reaches them with the hand-offs made before them. */
    if (m->copies && k->gemm == 1 && m->copied[a] < m->staged[a]) return 0;
    if (k->gemm == 0 && !sim_can_publish(m, a)) return 0; /* the hand-off after its mainloop */
    const int need = k->gemm == 0 ? MM_FUSED_PULLED : MM_FUSED_L1_DONE;
    for (int64_t b = k->block0; b <= task_last_block(k); ++b)
      if (!sim_complete(m, need, b)) return 0;
    return 1;
  }
  if (a >= m->ctas + m->pulls) return sim_copy_ready(m, a - m->ctas - m->pulls);
  const int64_t r = sim_pull_row(m, a);
  if (r < 0) return -1;
  const int64_t pred = mm_fused_slot_predecessor(&m->s->order, r / MM_FUSED_BLOCK_ROWS);
  return !m->guard || pred < 0 || sim_complete(m, MM_FUSED_L2_DONE, pred);
}

/* Runs agent a (ready) one step. */
static void sim_step(sim* m, int a) {
  const int32_t ring = m->s->order.ring_blocks;
  if (a >= m->ctas + m->pulls) {
    const int c = a - m->ctas - m->pulls;
    const mm_fused_task* k = &m->tasks[m->ran[c][m->cursor[c]++]];
    if (k->gemm == 1) {
      sim_count(m, k, MM_FUSED_L2_DONE);
      m->copied[c]++;
    } else if (sim_by_copy(m)) {
      sim_count(m, k, MM_FUSED_L1_DONE);
      m->released[c]++;
    }
    return;
  }
  if (a >= m->ctas) {
    for (int burst = 0; burst < 16 && m->res.ok && sim_ready(m, a) == 1; ++burst) {
      const int64_t b = sim_pull_row(m, a) / MM_FUSED_BLOCK_ROWS, slot = b % ring, old = m->owner[slot];
      if (old != b && old >= 0 && !sim_complete(m, MM_FUSED_L2_DONE, old))
        sim_fail(m, "block %lld's pull overwrote slot %lld while block %lld still had L2 readers (%lld rows done)", b,
                 slot, old, m->count[MM_FUSED_L2_DONE][old]);
      m->owner[slot] = b;
      m->count[MM_FUSED_PULLED][b]++;
      m->next[a] += m->pulls;
    }
    return;
  }
  if (sim_publishes_first(m, a)) {
    sim_publish(m, a);
    return;
  }
  const int64_t t = m->next[a];
  const mm_fused_task* k = &m->tasks[t];
  for (int64_t b = k->block0; b <= task_last_block(k); ++b)
    if (m->owner[b % ring] != b)
      sim_fail(m, "an L%lld tile read slot %lld for block %lld, which holds block %lld", k->gemm + 1, b % ring, b,
               m->owner[b % ring]);
  if (m->copies) m->ran[a][m->nran[a]++] = t;
  if (k->gemm == 1) {
    if (m->copies) m->staged[a]++; /* its copy agent counts L2_DONE */
    else sim_count(m, k, MM_FUSED_L2_DONE);
  } else if (m->publish == SIM_PUBLISH_NOW) {
    sim_count(m, k, MM_FUSED_L1_DONE);
  } else {
    /* After this tile's mainloop: the pending ones (SIM_PUBLISH_PAIRS: once
     * there are two), then this one pending. */
    if (m->publish != SIM_PUBLISH_PAIRS || m->npend[a] == 2) sim_publish(m, a);
    m->pend[a][m->npend[a]++] = t;
  }
  if (m->claim) {
    m->next[a] = m->claimed[a];
    m->claimed[a] = m->claim_counter++;
  } else {
    m->next[a] += m->ctas;
  }
}

static sim_result simulate(const mm_fused_stream* s, const mm_fused_task* tasks, int ctas, int pulls, int guard,
                           int publish, int claim, int copies, mm_rng* g) {
  sim m;
  memset(&m, 0, sizeof m);
  m.s = s;
  m.tasks = tasks;
  m.ctas = ctas;
  m.pulls = pulls;
  m.guard = guard;
  m.publish = publish;
  m.claim = claim;
  m.copies = copies || sim_by_copy(&m);
  m.res.ok = 1;
  if (m.copies)
    for (int c = 0; c < ctas; ++c) m.ran[c] = (int64_t*)malloc(sizeof(int64_t) * (size_t)(s->tasks + 1));
  const int64_t B = s->blocks ? s->blocks : 1;
  for (int k = 0; k < MM_FUSED_COUNTERS; ++k) m.count[k] = (int64_t*)calloc((size_t)B, sizeof(int64_t));
  m.owner = (int64_t*)malloc(sizeof(int64_t) * (size_t)s->order.ring_blocks);
  for (int32_t i = 0; i < s->order.ring_blocks; ++i) m.owner[i] = -1;
  const int agents = ctas + pulls + (m.copies ? ctas : 0);
  for (int a = 0; a < ctas + pulls; ++a) m.next[a] = a < ctas ? a : a - ctas;
  /* The claim: every CTA's first task, then (one ahead) its second. */
  m.claim_counter = ctas;
  for (int a = 0; a < ctas; ++a) m.claimed[a] = m.claim_counter++;
  while (m.res.ok) {
    /* A random agent that can move: scan from a random start. */
    const int first = (int)mm_rng_below(g, (uint64_t)agents);
    int moved = 0, busy = 0;
    for (int i = 0; i < agents && !moved; ++i) {
      const int a = (first + i) % agents, r = sim_ready(&m, a);
      busy |= r >= 0;
      if (r == 1) sim_step(&m, a), moved = 1;
    }
    if (!busy) break;
    if (!moved)
      sim_fail(&m, "deadlock: none of %lld CTAs, their copy agents (if modelled) and %lld pull warps can move (%lld tasks, %lld blocks)",
               ctas, pulls, s->tasks, s->blocks);
  }
  for (int64_t b = 0; b < s->blocks && m.res.ok; ++b)
    for (int kind = 0; kind < MM_FUSED_COUNTERS && m.res.ok; ++kind)
      if (!sim_complete(&m, kind, b))
        sim_fail(&m, "block %lld counter %lld ended at %lld, target %lld", b, kind, m.count[kind][b],
                 mm_fused_counter_target(s, kind, b));
  for (int k = 0; k < MM_FUSED_COUNTERS; ++k) free(m.count[k]);
  free(m.owner);
  for (int c = 0; c < ctas; ++c) free(m.ran[c]);
  return m.res;
}

/* ---- Tests ----------------------------------------------------------------- */

/* The numbers docs/FUSED.md section 6 quotes. */
static mm_test_result t_ring_numbers(void) {
  megamoe_config flash = megamoe_config_make(4096, 2048, 256, 6, 8192);
  flash.arm = MEGAMOE_ARM_FUSED;
  CHECK_EQ_INT(mm_fused_units_estimate(&flash, 8, 8192), 64); /* 1536 rows per expert: 2 units each */
  mm_fused_ring ring;
  CHECK_OK(mm_fused_ring_make(&flash, 8, &ring));
  CHECK_EQ_INT(ring.lag, 29);
  CHECK_EQ_INT(ring.group, 4);
  CHECK_EQ_INT(ring.blocks, 8 * (29 + 4) + 4);
  CHECK_EQ_INT(ring.clamped, 0);
  CHECK_EQ_INT(ring.virtual_blocks, (8 * 8192 * 6 + 127 * 32) / 128);
  mm_layout l;
  CHECK_OK(mm_layout_compute(&flash, 8, &l));
  CHECK_EQ_INT(l.pool_rows, 268 * 128);
  CHECK_MSG(l.symmetric_bytes + l.workspace_bytes <= 700ull << 20, "flash EP8 fused: %.1f MiB",
            (l.symmetric_bytes + l.workspace_bytes) / 1048576.0);
  printf("    flash EP8, T_max 8192: ring %d blocks (lag %d, group %d), symmetric %.1f + workspace %.1f = %.1f MiB\n",
         ring.blocks, ring.lag, ring.group, l.symmetric_bytes / 1048576.0, l.workspace_bytes / 1048576.0,
         (l.symmetric_bytes + l.workspace_bytes) / 1048576.0);
  /* pro: 1024 rows per expert, one unit each, 48 units, lag 22 */
  megamoe_config pro = megamoe_config_make(7168, 3072, 384, 6, 8192);
  pro.arm = MEGAMOE_ARM_FUSED;
  CHECK_OK(mm_fused_ring_make(&pro, 8, &ring));
  CHECK_EQ_INT(ring.lag, 22);
  CHECK_EQ_INT(ring.blocks, 8 * 26 + 4);
  /* A small T_max: the worst case fits under the lag ring: clamped, never wraps. */
  flash.max_tokens_per_rank = 64;
  CHECK_OK(mm_fused_ring_make(&flash, 8, &ring));
  CHECK_EQ_INT(ring.clamped, 1);
  CHECK_EQ_INT(ring.blocks, (8 * 64 * 6 + 127 * 32) / 128);
  CHECK_EQ_INT(ring.blocks, ring.virtual_blocks);
  /* The rule: round(0.45 units), halves up, clamped to [8, 64]. */
  const int64_t units[] = {0, 17, 18, 19, 30, 64, 142, 143, 1000};
  const int32_t lags[] = {8, 8, 8, 9, 14, 29, 64, 64, 64};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; ++i) CHECK_EQ_INT(mm_fused_lag_rule(MM_FUSED_LAG_PERCENT, units[i]), lags[i]);
  return MM_TEST_PASS;
}

/* The worst-case blocks bound every routing whose ranks stay within the
 * tokens, and a ragged routing reaches it (it is not loose). */
static mm_test_result t_worst_blocks(void) {
  mm_rng g = unit_rng(0xb10c);
  int32_t rows[1024];
  for (int i = 0; i < 4000; ++i) {
    const int R = 1 + (int)mm_rng_below(&g, 8), El = 1 + (int)mm_rng_below(&g, 64), K = 1 + (int)mm_rng_below(&g, 8);
    megamoe_config c = megamoe_config_make(512, 512, R * El, K < R * El ? K : R * El, 4096);
    const int64_t tokens = (int64_t)mm_rng_below(&g, 3000);
    const int64_t worst = mm_fused_worst_blocks(&c, R, tokens);
    const int64_t N = (int64_t)R * tokens * c.top_k;
    const int64_t routed = mm_rng_below(&g, 4) ? (int64_t)mm_rng_below(&g, (uint64_t)N + 1) : N;
    draw_rows(&g, (int)mm_rng_below(&g, SKEW_KINDS), routed, El, rows);
    int64_t blocks = 0;
    for (int e = 0; e < El; ++e) blocks += (rows[e] + 127) / 128;
    CHECK_MSG(blocks <= worst, "R %d E_l %d K %d tokens %lld: %lld blocks above the bound %lld", R, El, c.top_k,
              (long long)tokens, (long long)blocks, (long long)worst);
    /* ragged: 1 + 128 a rows per expert reaches the bound when N - E_l is a multiple of 128 */
    if (N >= El && (N - El) % 128 == 0) {
      int64_t reached = 0;
      for (int e = 0; e < El; ++e) reached += 1 + (e == 0 ? (N - El) / 128 : 0);
      CHECK_EQ_INT(reached, worst);
    }
  }
  return MM_TEST_PASS;
}

/* MEGAMOE_FUSED_LAG_PERCENT is read once, when the ring is made: the ring is
 * sized for it and every call's order keeps it (set 70 %, make the ring,
 * unset it: 2048 tokens still lag round(0.7 x 32 units) = 22, not 14). */
static mm_test_result t_lag_percent_at_create(void) {
  megamoe_config c = megamoe_config_make(4096, 2048, 256, 6, 8192);
  c.arm = MEGAMOE_ARM_FUSED;
  CHECK(setenv("MEGAMOE_FUSED_LAG_PERCENT", "70", 1) == 0);
  mm_fused_ring ring;
  const megamoe_status st = mm_fused_ring_make(&c, 8, &ring);
  CHECK(unsetenv("MEGAMOE_FUSED_LAG_PERCENT") == 0);
  CHECK_OK(st);
  CHECK_EQ_INT(ring.lag_percent, 70);
  CHECK_EQ_INT(ring.lag, 45); /* round(0.7 x 64 units) */
  mm_fused_order o;
  CHECK_OK(mm_fused_call_order(&ring, &c, 8, 2048, 2048, &o));
  CHECK_EQ_INT(o.lag, 22);
  CHECK_OK(mm_fused_ring_make(&c, 8, &ring));
  CHECK_EQ_INT(ring.lag_percent, MM_FUSED_LAG_PERCENT);
  CHECK_OK(mm_fused_call_order(&ring, &c, 8, 2048, 2048, &o));
  CHECK_EQ_INT(o.lag, 14);
  return MM_TEST_PASS;
}

/* MEGAMOE_FUSED_RING_PERCENT grows the ring without changing any call's
 * order: flash EP8 at T_max 8192 keeps lag 29 in a ring of 3 x 268 blocks,
 * the same single-wave limit, and the layout's pool is the grown ring; with
 * MEGAMOE_FUSED_RING_ORDER=1 the calls take the grown ring's orders. */
static mm_test_result t_ring_percent_at_create(void) {
  megamoe_config c = megamoe_config_make(4096, 2048, 256, 6, 8192);
  c.arm = MEGAMOE_ARM_FUSED;
  mm_fused_ring base, grown;
  CHECK_OK(mm_fused_ring_make(&c, 8, &base));
  CHECK_EQ_INT(base.extra_blocks, 0);
  CHECK(setenv("MEGAMOE_FUSED_RING_PERCENT", "300", 1) == 0);
  megamoe_status st = mm_fused_ring_make(&c, 8, &grown);
  mm_layout l;
  const megamoe_status st_layout = mm_layout_compute(&c, 8, &l);
  CHECK(unsetenv("MEGAMOE_FUSED_RING_PERCENT") == 0);
  CHECK_OK(st);
  CHECK_OK(st_layout);
  CHECK_EQ_INT(grown.blocks, 3 * 268);
  CHECK_EQ_INT(grown.extra_blocks, 2 * 268);
  CHECK_EQ_INT(l.pool_rows, 3 * 268 * 128);
  CHECK_EQ_INT(mm_fused_single_wave_limit(&grown, &c, 8), mm_fused_single_wave_limit(&base, &c, 8));
  const int64_t tokens[] = {64, 512, 2048, 8192};
  for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; ++i) {
    mm_fused_order a, b;
    CHECK_OK(mm_fused_call_order(&base, &c, 8, tokens[i], tokens[i], &a));
    CHECK_OK(mm_fused_call_order(&grown, &c, 8, tokens[i], tokens[i], &b));
    CHECK(a.single_wave == b.single_wave && a.lag == b.lag && a.group == b.group);
    CHECK_EQ_INT(b.ring_blocks, 3 * 268);
  }
  /* At most the worst case: the ring then never wraps. */
  CHECK(setenv("MEGAMOE_FUSED_RING_PERCENT", "10000", 1) == 0);
  st = mm_fused_ring_make(&c, 8, &grown);
  CHECK(unsetenv("MEGAMOE_FUSED_RING_PERCENT") == 0);
  CHECK_OK(st);
  CHECK_EQ_INT(grown.blocks, grown.virtual_blocks);
  mm_fused_order o;
  CHECK_OK(mm_fused_call_order(&grown, &c, 8, 8192, 0, &o));
  CHECK(!o.single_wave && o.lag == 29);
  /* MEGAMOE_FUSED_RING_ORDER=1: the same ring, the grown ring's orders (the
   * whole forward's ring: single wave at T_max); alone it changes nothing. */
  CHECK(setenv("MEGAMOE_FUSED_RING_ORDER", "1", 1) == 0);
  mm_fused_ring alone;
  const megamoe_status st_alone = mm_fused_ring_make(&c, 8, &alone);
  CHECK(setenv("MEGAMOE_FUSED_RING_PERCENT", "10000", 1) == 0);
  st = mm_fused_ring_make(&c, 8, &grown);
  CHECK(unsetenv("MEGAMOE_FUSED_RING_PERCENT") == 0);
  CHECK(unsetenv("MEGAMOE_FUSED_RING_ORDER") == 0);
  CHECK_OK(st_alone);
  CHECK_OK(st);
  CHECK(alone.blocks == base.blocks && !alone.grown_order && alone.extra_blocks == 0);
  CHECK(grown.grown_order && grown.extra_blocks == 0 && grown.blocks == grown.virtual_blocks);
  CHECK_OK(mm_fused_call_order(&grown, &c, 8, 8192, 0, &o));
  CHECK(o.single_wave && o.lag == 0 && o.ring_blocks == grown.virtual_blocks);
  CHECK_EQ_INT(mm_fused_single_wave_limit(&grown, &c, 8), 8192);
  return MM_TEST_PASS;
}

/* The dynamic claim's rule: read at create, then per call by the L1 tile. */
static mm_test_result t_claim_rule(void) {
  megamoe_config c = megamoe_config_make(4096, 2048, 256, 6, 8192);
  c.arm = MEGAMOE_ARM_FUSED;
  mm_fused_ring ring;
  CHECK_OK(mm_fused_ring_make(&c, 8, &ring));
  CHECK_EQ_INT(ring.dynamic_claim, MM_FUSED_CLAIM_AUTO);
  CHECK_EQ_INT(mm_fused_claim_for(&ring, 128), 1); /* the large pair */
  CHECK_EQ_INT(mm_fused_claim_for(&ring, 64), 0);  /* the decode pair */
  const char* forced[2] = {"0", "1"};
  for (int v = 0; v < 2; ++v) {
    CHECK(setenv("MEGAMOE_FUSED_DYNAMIC", forced[v], 1) == 0);
    const megamoe_status st = mm_fused_ring_make(&c, 8, &ring);
    CHECK(unsetenv("MEGAMOE_FUSED_DYNAMIC") == 0);
    CHECK_OK(st);
    CHECK_EQ_INT(mm_fused_claim_for(&ring, 128), v);
    CHECK_EQ_INT(mm_fused_claim_for(&ring, 64), v);
  }
  return MM_TEST_PASS;
}

/* The per-call order and the host's rejection of a bound. */
static mm_test_result t_call_order(void) {
  megamoe_config c = megamoe_config_make(4096, 2048, 256, 6, 8192);
  c.arm = MEGAMOE_ARM_FUSED;
  mm_fused_ring ring;
  CHECK_OK(mm_fused_ring_make(&c, 8, &ring));
  mm_fused_order o;
  /* Above capacity and below the rank's own count: rejected, naming num_tokens_bound. */
  CHECK_STATUS(mm_fused_call_order(&ring, &c, 8, 100, 8193, &o), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_MESSAGE_HAS("num_tokens_bound = 8193");
  CHECK_MESSAGE_HAS("max_tokens_per_rank = 8192");
  CHECK_STATUS(mm_fused_call_order(&ring, &c, 8, 100, 99, &o), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_MESSAGE_HAS("num_tokens_bound = 99");
  CHECK_MESSAGE_HAS("num_tokens = 100");
  CHECK_STATUS(mm_fused_call_order(&ring, &c, 8, 100, -1, &o), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_MESSAGE_HAS("num_tokens_bound");
  /* The forward's own check says the same (one rule, two callers). */
  megamoe_forward_args a;
  memset(&a, 0, sizeof a);
  a.num_tokens = 0;
  a.num_tokens_bound = 8193;
  CHECK_STATUS(mm_check_forward_args(&c, &a), MEGAMOE_ERR_TOO_MANY_TOKENS);
  CHECK_MESSAGE_HAS("num_tokens_bound = 8193");
  /* 0 means T_max: the ring's own lag order. */
  CHECK_OK(mm_fused_call_order(&ring, &c, 8, 8192, 0, &o));
  CHECK(!o.single_wave && o.lag == ring.lag && o.group == 4 && o.ring_blocks == ring.blocks);
  /* 2048 tokens: 384 rows per expert, one unit each: 32 units, lag 14 (under the ring's 29). */
  CHECK_OK(mm_fused_call_order(&ring, &c, 8, 2048, 2048, &o));
  CHECK(!o.single_wave && o.lag == 14);
  /* Decode: the worst case fits the ring, single wave. */
  const int64_t limit = mm_fused_single_wave_limit(&ring, &c, 8);
  CHECK(mm_fused_worst_blocks(&c, 8, limit) <= ring.blocks && mm_fused_worst_blocks(&c, 8, limit + 1) > ring.blocks);
  CHECK_OK(mm_fused_call_order(&ring, &c, 8, 64, limit, &o));
  CHECK(o.single_wave);
  CHECK_OK(mm_fused_call_order(&ring, &c, 8, 64, limit + 1, &o));
  CHECK(!o.single_wave && o.lag >= MM_FUSED_LAG_MIN);
  /* The host asserts the live set against the ring: a ring that is not the
   * layout's (here one unit short of lag 29) is refused, not run. */
  mm_fused_ring short_ring = ring;
  short_ring.blocks = 8 * (29 + 4) - 8;
  short_ring.lag = 29;
  short_ring.clamped = 0;
  CHECK_STATUS(mm_fused_call_order(&short_ring, &c, 8, 8192, 8192, &o), MEGAMOE_ERR_INTERNAL);
  CHECK_MESSAGE_HAS("below the live set");
  /* No bound lags longer than the ring it runs in. */
  for (int64_t t = 1; t <= 8192; t += 37) {
    CHECK_OK(mm_fused_call_order(&ring, &c, 8, t, t, &o));
    CHECK(o.single_wave || o.lag <= ring.lag);
  }
  return MM_TEST_PASS;
}

static int task_same(const mm_fused_task* a, const mm_fused_task* b) {
  return a->gemm == b->gemm && a->expert == b->expert && a->unit == b->unit && a->m == b->m && a->n == b->n &&
         a->row0 == b->row0 && a->rows == b->rows && a->block0 == b->block0;
}

/* mm_fused_task_at walks the stream of the model, task by task. */
static mm_test_result t_stream_decode(void) {
  mm_rng g = unit_rng(0x5eed);
  int32_t rows[64];
  const int bms[3] = {64, 128, 256};
  int64_t checked = 0;
  for (int i = 0; i < 600; ++i) {
    const int32_t El = 1 + (int32_t)mm_rng_below(&g, 40);
    draw_rows(&g, (int)mm_rng_below(&g, SKEW_KINDS), (int64_t)mm_rng_below(&g, 40000), El, rows);
    mm_fused_order o = {(int32_t)(mm_rng_below(&g, 4) == 0), 1 + (int32_t)mm_rng_below(&g, 20),
                        1 + (int32_t)mm_rng_below(&g, 6), 1000, 0};
    test_stream t;
    stream_make(&t, o, El, rows, bms[mm_rng_below(&g, 3)], bms[mm_rng_below(&g, 3)], 1 + (int)mm_rng_below(&g, 4),
                1 + (int)mm_rng_below(&g, 4));
    /* The task list holds the stream: its bound, at the narrowest tiles
     * (128 columns) these n-tile counts allow, over the stream's blocks. */
    CHECK_MSG(t.s.tasks <= mm_fused_task_list_entries(t.s.blocks, 128 * (int64_t)t.s.tiles_n[1],
                                                      64 * (int64_t)t.s.tiles_n[0]),
              "case %d: %lld tasks above the task list's %lld entries", i, (long long)t.s.tasks,
              (long long)mm_fused_task_list_entries(t.s.blocks, 128 * (int64_t)t.s.tiles_n[1],
                                                    64 * (int64_t)t.s.tiles_n[0]));
    mm_fused_task* want = (mm_fused_task*)malloc(sizeof(mm_fused_task) * (size_t)(t.s.tasks + 1));
    const int64_t n = model_enumerate(&t.s, want, t.s.tasks + 1);
    int ok = n == t.s.tasks;
    int64_t bad = -1;
    /* The phases' starts never decrease, and the start of the phase past
     * the last (j = phases) is the task count, in either order. */
    for (int64_t j = 0; ok && j <= t.s.phases; ++j)
      if ((j > 0 && mm_fused_phase_start(&t.s, j) < mm_fused_phase_start(&t.s, j - 1)) ||
          (j == t.s.phases && mm_fused_phase_start(&t.s, j) != t.s.tasks))
        ok = 0, bad = -2 - j;
    for (int64_t k = 0; ok && k < n; ++k) {
      mm_fused_task got;
      mm_fused_task_at(&t.s, k, &got);
      const mm_fused_task* w = &want[k];
      if (!task_same(&got, w)) ok = 0, bad = k;
      /* The 8-byte form the kernel's producer reads back gives the same task. */
      mm_fused_task back;
      memset(&back, 0xff, sizeof back);
      const uint64_t packed = mm_fused_task_pack(&got);
      if (packed == MM_FUSED_TASK_UNPACKED) ok = 0, bad = k;
      else mm_fused_task_unpack(&t.s, packed, &back);
      if (!task_same(&back, w)) ok = 0, bad = k;
    }
    free(want);
    stream_free(&t);
    CHECK_MSG(ok, "case %d (E_l %d, lag %d, group %d, single %d): %lld tasks decoded, the model has %lld; first "
              "difference at %lld (-2 - j: phase j's start)", i, El, o.lag,
              o.group, o.single_wave, (long long)t.s.tasks, (long long)n, (long long)bad);
    checked += n;
  }
  /* Fields beyond the packed widths are left to decode again. */
  mm_fused_task big = {1, 3, 0, 1 << 26, 0, 0, 1, 0};
  CHECK(mm_fused_task_pack(&big) == MM_FUSED_TASK_UNPACKED);
  big.m = 5, big.n = 1 << 22;
  CHECK(mm_fused_task_pack(&big) == MM_FUSED_TASK_UNPACKED);
  big.n = 7, big.expert = 1 << 15;
  CHECK(mm_fused_task_pack(&big) == MM_FUSED_TASK_UNPACKED);
  big.expert = 3;
  CHECK(mm_fused_task_pack(&big) != MM_FUSED_TASK_UNPACKED);
  printf("    %lld tasks decoded as the model orders them, each the same through its 8-byte form\n",
         (long long)checked);
  return MM_TEST_PASS;
}

/* The live set and the guard's direction over configs, bounds and skewed
 * routings, with the ring and order the host computes. */
static mm_test_result t_ring_static(void) {
  mm_rng g = unit_rng(0x1a9);
  int32_t rows[1024];
  int cases = 0, wrapped = 0, single = 0;
  int by_skew[SKEW_KINDS] = {0};
  for (int i = 0; i < 400; ++i) {
    const int R = 1 + (int)mm_rng_below(&g, 8), El = 1 + (int)mm_rng_below(&g, 48);
    const int K = 1 + (int)mm_rng_below(&g, 8);
    megamoe_config c = megamoe_config_make(128 * (1 + (int64_t)mm_rng_below(&g, 4)), 256, R * El,
                                           K < R * El ? K : R * El, 1 + (int64_t)mm_rng_below(&g, 4096));
    c.arm = MEGAMOE_ARM_FUSED;
    mm_fused_ring ring;
    CHECK_OK(mm_fused_ring_make(&c, R, &ring));
    const int64_t T = c.max_tokens_per_rank;
    const int64_t bound = mm_rng_below(&g, 3) == 0 ? 0 : 1 + (int64_t)mm_rng_below(&g, (uint64_t)T);
    const int64_t cap = bound ? bound : T;
    /* rows routed here: every rank within the bound, all of them here at worst */
    int64_t N = 0;
    for (int r = 0; r < R; ++r) N += (int64_t)mm_rng_below(&g, (uint64_t)cap + 1) * c.top_k;
    if (mm_rng_below(&g, 4) == 0) N = (int64_t)R * cap * c.top_k;
    const int skew = (int)mm_rng_below(&g, SKEW_KINDS);
    draw_rows(&g, skew, N, El, rows);
    mm_fused_order o;
    CHECK_OK(mm_fused_call_order(&ring, &c, R, 0, bound, &o));
    test_stream t;
    stream_make(&t, o, El, rows, 64, 256, 1 + (int)mm_rng_below(&g, 2), 1 + (int)mm_rng_below(&g, 2));
    char why[256] = "";
    mm_fused_task* tasks = decode_all(&t.s);
    const int64_t live = o.single_wave ? o.ring_blocks : (int64_t)MM_FUSED_UNIT_BLOCKS * (o.lag + o.group);
    const int ok = static_check(&t.s, tasks, live, why, sizeof why);
    free(tasks);
    CHECK_MSG(ok, "case %d (R %d E_l %d K %d T_max %lld bound %lld, %s routing, %lld blocks, ring %d, lag %d, "
              "single %d): %s", i, R, El, c.top_k, (long long)T, (long long)bound, kSkewNames[skew],
              (long long)t.s.blocks, o.ring_blocks, o.lag, o.single_wave, why);
    CHECK(o.single_wave || o.ring_blocks >= MM_FUSED_UNIT_BLOCKS * (o.lag + o.group) + MM_FUSED_RING_MARGIN);
    wrapped += !o.single_wave && t.s.blocks > o.ring_blocks;
    single += o.single_wave;
    by_skew[skew]++;
    cases++;
    stream_free(&t);
  }
  printf("    %d cases: %d wrap the ring, %d single-wave\n", cases, wrapped, single);
  CHECK(wrapped > cases / 10 && single > cases / 10); /* the draws reach both orders and the wrap */
  return MM_TEST_PASS;
}

/* The flash shape itself, the 8192-token lag order over skewed routings,
 * with the large regime's tiles (128x256 L1, 128x256 L2; both G), with
 * 128x256 L1 and 256x128 L2 (where H is not a multiple of 256) and, as
 * extra coverage of the stream's geometry, with the decode pair's (64x256
 * L1 and L2). */
static mm_test_result t_ring_static_flash(void) {
  mm_rng g = unit_rng(0xf1a5);
  megamoe_config c = megamoe_config_make(4096, 2048, 256, 6, 8192);
  c.arm = MEGAMOE_ARM_FUSED;
  mm_fused_ring ring;
  CHECK_OK(mm_fused_ring_make(&c, 8, &ring));
  int32_t rows[32];
  static const struct {
    int l1_rows, l1_cols, l2_rows, l2_cols;
  } pairs[] = {{128, 256, 128, 256}, {128, 256, 256, 128}, {64, 256, 64, 256}};
  for (int skew = 0; skew < 3 * SKEW_KINDS; ++skew) {
    const int l1_rows = pairs[skew / SKEW_KINDS].l1_rows, l1_cols = pairs[skew / SKEW_KINDS].l1_cols;
    const int l2_rows = pairs[skew / SKEW_KINDS].l2_rows, l2_cols = pairs[skew / SKEW_KINDS].l2_cols;
    mm_fused_order o;
    CHECK_OK(mm_fused_call_order(&ring, &c, 8, 8192, 8192, &o));
    draw_rows(&g, skew % SKEW_KINDS, 8192 * 6 * (skew % SKEW_KINDS == SKEW_ONE ? 8 : 1), 32, rows);
    test_stream t;
    stream_make(&t, o, 32, rows, l1_rows, l2_rows, 2 * 2048 / l1_cols, 4096 / l2_cols);
    char why[256] = "";
    mm_fused_task* tasks = decode_all(&t.s);
    const int ok = static_check(&t.s, tasks, (int64_t)MM_FUSED_UNIT_BLOCKS * (o.lag + o.group), why, sizeof why);
    free(tasks);
    stream_free(&t);
    CHECK_MSG(ok, "flash, L1 %dx%d / L2 %dx%d, %s routing: %s", l1_rows, l1_cols, l2_rows, l2_cols,
              kSkewNames[skew % SKEW_KINDS], why);
  }
  return MM_TEST_PASS;
}

/* The static check can fail: with full units (8 blocks each) and group 4,
 * a ring of 8 (lag + group) - 1 blocks lets a block's pull wait for an L2
 * task later in the stream. */
static mm_test_result t_ring_short_by_one_fails(void) {
  int32_t rows[64];
  for (int e = 0; e < 64; ++e) rows[e] = MM_FUSED_UNIT_ROWS;
  int failed = 0;
  for (int32_t lag = 1; lag <= 12; ++lag) {
    mm_fused_order o = {0, lag, 4, MM_FUSED_UNIT_BLOCKS * (lag + 4), 0};
    test_stream t;
    stream_make(&t, o, 64, rows, 128, 128, 1, 1);
    char why[256] = "";
    mm_fused_task* tasks = decode_all(&t.s);
    const int exact = static_check(&t.s, tasks, MM_FUSED_UNIT_BLOCKS * (lag + 4), why, sizeof why);
    t.s.order.ring_blocks -= 1;
    failed += !static_check(&t.s, tasks, INT64_MAX, why, sizeof why);
    free(tasks);
    stream_free(&t);
    CHECK_MSG(exact, "lag %d, ring %d: %s", lag, o.ring_blocks, why);
  }
  CHECK_MSG(failed == 12, "a ring one block short failed the check for %d of 12 lags", failed);
  return MM_TEST_PASS;
}

/* Random interleavings of CTAs and pull warps: no deadlock, no slot
 * overwritten under a reader, under the stream's own order and under the
 * kernel's deferred L1_DONE publication (round-robin and claimed tasks); and
 * the planted bugs caught: no slot guard, and the deferral without its
 * publication before an L2 task. SIM_PUBLISH_PAIRS, the design that
 * publishes every other L1 tile, must be clean in the kernel's range too. */
static mm_test_result t_ring_simulation(void) {
  mm_rng g = unit_rng(0x51b);
  int32_t rows[64];
  int runs = 0, caught = 0, planted = 0, no_l2_caught = 0, no_l2_planted = 0, no_ring_caught = 0, no_ring_planted = 0;
  int by_copy_no_l2_caught = 0, nmodes = 0;
  int single = 0, pairs_dead[2] = {0, 0}, pairs_small = 0, pairs_min_lag = 1 << 30, claimed_small = 0, claimed_small_dead = 0;
  for (int i = 0; i < 160; ++i) {
    const int32_t El = 1 + (int32_t)mm_rng_below(&g, 24);
    /* Half the cases in the kernel's range (lag >= MM_FUSED_LAG_MIN, group
     * MM_FUSED_GROUP: mm_fused_lag_rule), half below it. */
    const int ranged = (int)mm_rng_below(&g, 2);
    const int32_t lag = ranged ? MM_FUSED_LAG_MIN + (int32_t)mm_rng_below(&g, 9) : (int32_t)mm_rng_below(&g, 10);
    const int32_t group = ranged ? MM_FUSED_GROUP : 1 + (int32_t)mm_rng_below(&g, 4);
    const int skew = (int)mm_rng_below(&g, SKEW_KINDS);
    /* One case in four the single wave (the ring a plain pool the forward fits). */
    const int wave = mm_rng_below(&g, 4) == 0;
    mm_fused_order o = {wave, lag, group, MM_FUSED_UNIT_BLOCKS * (lag + group) + (int32_t)mm_rng_below(&g, 5), 0};
    int64_t n = (int64_t)o.ring_blocks * MM_FUSED_BLOCK_ROWS * (1 + (int64_t)mm_rng_below(&g, 3)) +
                (int64_t)mm_rng_below(&g, 3000);
    if (wave) o.ring_blocks = 1024, n = (int64_t)mm_rng_below(&g, 20000); /* <= 20000 / 128 + 24 blocks */
    draw_rows(&g, skew, n, El, rows);
    test_stream t;
    stream_make(&t, o, El, rows, (int)(64 << mm_rng_below(&g, 3)), (int)(64 << mm_rng_below(&g, 3)),
                1 + (int)mm_rng_below(&g, 2), 1 + (int)mm_rng_below(&g, 3));
    const int ctas = 1 + (int)mm_rng_below(&g, 16), pulls = 1 + (int)mm_rng_below(&g, 12);
    mm_fused_task* tasks = decode_all(&t.s);
    static const struct {
      int publish, claim, copies;
      const char* name;
    } modes[] = {{SIM_PUBLISH_NOW, 0, 0, "published at once"},
                 {SIM_PUBLISH_DEFERRED, 0, 0, "the kernel's deferral, round-robin"},
                 {SIM_PUBLISH_DEFERRED, 1, 0, "the kernel's deferral, claimed"},
                 {SIM_PUBLISH_DEFERRED, 0, 1, "the kernel's deferral with copy agents, round-robin"},
                 {SIM_PUBLISH_DEFERRED, 1, 1, "the kernel's deferral with copy agents, claimed"},
                 {SIM_PUBLISH_BY_COPY, 0, 1, "released by the copy agent, round-robin"},
                 {SIM_PUBLISH_BY_COPY, 1, 1, "released by the copy agent, claimed"}};
    nmodes = (int)(sizeof modes / sizeof modes[0]);
    for (int mo = 0; mo < nmodes; ++mo) {
      const sim_result r =
          simulate(&t.s, tasks, ctas, pulls, 1, modes[mo].publish, modes[mo].claim, modes[mo].copies, &g);
      /* The claim with the deferral is live in the kernel's range of lags;
       * below it the model finds runs that do not finish (lag 0 and 1 seen):
       * counted, and MM_FUSED_LAG_MIN is load-bearing for the claim. */
      if (modes[mo].claim && !wave && lag < MM_FUSED_LAG_MIN) {
        claimed_small += 1;
        claimed_small_dead += !r.ok;
        continue;
      }
      if (!r.ok) free(tasks), stream_free(&t);
      CHECK_MSG(r.ok, "case %d, %s (E_l %d, %s routing, %s, %lld blocks, ring %d, lag %d, group %d, %d CTAs, "
                "%d pull warps): %s", i, modes[mo].name, El, kSkewNames[skew], wave ? "single wave" : "lag order",
                (long long)t.s.blocks, o.ring_blocks, lag, group, ctas, pulls, r.why);
    }
    /* The two-tile deferral (SIM_PUBLISH_PAIRS, a design): clean in
     * the kernel's range of lags (asserted); below it, deadlocks counted and
     * the smallest lag seen. */
    for (int claim = 0; claim < 2; ++claim) {
      const sim_result r = simulate(&t.s, tasks, ctas, pulls, 1, SIM_PUBLISH_PAIRS, claim, 0, &g);
      const int dead = !r.ok;
      if (wave || lag >= MM_FUSED_LAG_MIN) {
        if (dead) free(tasks), stream_free(&t);
        CHECK_MSG(!dead, "case %d, the two-tile deferral, %s, in the kernel's range (lag %d, group %d, %s): %s", i,
                  claim ? "claimed" : "round-robin", lag, group, wave ? "single wave" : "lag order", r.why);
        continue;
      }
      pairs_small += claim == 0;
      pairs_dead[claim] += dead;
      if (dead && lag < pairs_min_lag) pairs_min_lag = lag;
    }
    runs++;
    single += wave;
    if (t.s.blocks > o.ring_blocks) { /* the same run without the guard must be caught */
      planted++;
      caught += !simulate(&t.s, tasks, ctas, pulls, 0, SIM_PUBLISH_NOW, 0, 0, &g).ok;
    }
    /* The deferral without its L2 rule: caught where an L2 task can need its
     * own CTA's pending tile (one CTA: always, once there is an L1 tile). */
    if (!wave && t.s.blocks > o.ring_blocks) {
      no_ring_planted++;
      no_ring_caught += !simulate(&t.s, tasks, ctas, pulls, 1, SIM_PUBLISH_NO_RING_RULE, 1, 0, &g).ok;
    }
    if (t.s.tasks > 0) {
      no_l2_planted++;
      no_l2_caught += !simulate(&t.s, tasks, 1, pulls, 1, SIM_PUBLISH_NO_L2_RULE, 0, 0, &g).ok;
      by_copy_no_l2_caught += !simulate(&t.s, tasks, 1, pulls, 1, SIM_PUBLISH_BY_COPY_NO_L2_RULE, 0, 1, &g).ok;
    }
    free(tasks);
    stream_free(&t);
  }
  printf("    the deferral's modes with claimed tasks below lag %d: %d of %d runs failed\n", MM_FUSED_LAG_MIN,
         claimed_small_dead, claimed_small);
  printf("    the two-tile deferral below lag %d (clean above, asserted): %d round-robin and %d claimed runs of %d "
         "failed%s",
         MM_FUSED_LAG_MIN,
         pairs_dead[0], pairs_dead[1], pairs_small, pairs_dead[0] + pairs_dead[1] ? ", the smallest lag among them " : "\n");
  if (pairs_dead[0] + pairs_dead[1]) printf("%d\n", pairs_min_lag);
  printf("    %d simulated forwards (%d single wave) clean in %d modes each (claimed: lag >= MM_FUSED_LAG_MIN or the single wave); without the slot guard %d of %d "
         "caught; the deferral without its L2 rule %d of %d caught (released by the copy agent: %d), without its ring rule (claimed) %d of %d\n",
         runs, single, nmodes, caught, planted, no_l2_caught, no_l2_planted, by_copy_no_l2_caught, no_ring_caught, no_ring_planted);
  CHECK(planted > runs / 3 && caught > planted / 2);
  CHECK_MSG(no_l2_caught == no_l2_planted, "the deferral without its L2 rule: %d of %d caught", no_l2_caught,
            no_l2_planted);
  CHECK_MSG(by_copy_no_l2_caught == no_l2_planted, "the copy agent's release without the L2 rule: %d of %d caught",
            by_copy_no_l2_caught, no_l2_planted);
  return MM_TEST_PASS;
}

/* Single-wave calls within their bound never wrap; the device's verdict on
 * bounds across ranks; the messages every rank prints. */
static mm_test_result t_bound_verdict(void) {
  const int64_t Tmax = 8192;
  mm_call_tokens calls[8];
  mm_bound_verdict v;
  for (int r = 0; r < 8; ++r) calls[r] = (mm_call_tokens){64 + r, 128};
  CHECK_EQ_INT(mm_fused_bound_violation(calls, 8, Tmax, &v), 0);
  for (int r = 0; r < 8; ++r) calls[r].bound = r % 2 ? 0 : Tmax; /* 0 is T_max */
  CHECK_EQ_INT(mm_fused_bound_violation(calls, 8, Tmax, &v), 0);
  calls[5].bound = 128; /* differs */
  CHECK_EQ_INT(mm_fused_bound_violation(calls, 8, Tmax, &v), 1);
  CHECK(v.rank == 5 && v.differs && v.value == 128 && v.bound == Tmax);
  for (int r = 0; r < 8; ++r) calls[r] = (mm_call_tokens){64 - r, 64};
  CHECK_EQ_INT(mm_fused_bound_violation(calls, 8, Tmax, &v), 0);
  calls[3].num_tokens = 65; /* a peer above the bound every rank passed */
  calls[6].num_tokens = 99;
  CHECK_EQ_INT(mm_fused_bound_violation(calls, 8, Tmax, &v), 1);
  CHECK(v.rank == 3 && !v.differs && v.value == 65 && v.bound == 64);
  /* What megamoe_sync says on each rank: the same words after "rank r, forward f: ". */
  char first[1024] = "";
  for (int me = 0; me < 8; ++me) {
    mm_error_report rep = unit_report(5, MEGAMOE_ERR_TOO_MANY_TOKENS, MM_SITE_TOKEN_BOUND, v.rank, v.differs,
                                      (uint64_t)v.value, (uint64_t)v.bound);
    mm_status_context ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.rank = me;
    char m[1024];
    CHECK_EQ_INT(mm_describe_device_error(&rep, &ctx, m, sizeof m), MEGAMOE_ERR_TOO_MANY_TOKENS);
    CHECK_MSG(strstr(m, "num_tokens_bound = 64 is below rank 3's num_tokens = 65") && strstr(m, "Every rank"), "%s", m);
    const char* body = strstr(m, ": ");
    if (me == 0) snprintf(first, sizeof first, "%s", body);
    CHECK_MSG(strcmp(body, first) == 0, "rank %d says \"%s\", rank 0 \"%s\"", me, body, first);
    rep.detail = 1;
    rep.peer = 5;
    rep.seen = 128;
    rep.want = 8192;
    mm_describe_device_error(&rep, &ctx, m, sizeof m);
    CHECK_MSG(strstr(m, "num_tokens_bound differs across ranks: 128 on rank 5, 8192 on rank 0"), "%s", m);
  }
  /* The ring overrun (a single-wave forward whose blocks do not fit). */
  const mm_error_report rep = unit_report(2, MEGAMOE_ERR_TOO_MANY_TOKENS, MM_SITE_RING, -1, 0, 300, 268);
  mm_status_context ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.rank = 1;
  char m[1024];
  mm_describe_device_error(&rep, &ctx, m, sizeof m);
  CHECK_MSG(strstr(m, "holds 268 blocks") && strstr(m, "needs 300") && strstr(m, "num_tokens_bound"), "%s", m);
  return MM_TEST_PASS;
}

/* The layout's fused regions: the ring replaces the pool, the counters and
 * the call table exist for the fused arm only. */
static mm_test_result t_fused_layout(void) {
  megamoe_config c = megamoe_config_make(1024, 512, 64, 6, 4096);
  for (int arm = 0; arm < MEGAMOE_ARM_COUNT; ++arm) {
    c.arm = (megamoe_arm)arm;
    mm_layout l;
    CHECK_OK(mm_layout_compute(&c, 4, &l));
    const int fused = arm == MEGAMOE_ARM_FUSED;
    CHECK_EQ_INT(l.regions[MM_SYM_CALL_TOKENS].bytes, fused ? 4 * sizeof(mm_call_tokens) : 0);
    CHECK_EQ_INT(l.regions[MM_WS_BLOCK_COUNTERS].bytes,
                 fused ? (uint64_t)MM_FLAG_BANKS * MM_FUSED_COUNTERS * 4 * (uint64_t)l.ring.virtual_blocks : 0);
    CHECK_EQ_INT(l.regions[MM_WS_READY].bytes, arm == MEGAMOE_ARM_SPLIT ? (uint64_t)l.pool_rows / 128 * 4 : 0);
    CHECK_EQ_INT(l.regions[MM_WS_TASK_LIST].bytes,
                 fused ? 8 * (uint64_t)mm_fused_task_list_entries(l.ring.virtual_blocks, c.hidden, c.intermediate) : 0);
    CHECK_EQ_INT(l.ring.blocks != 0, fused);
    if (fused) {
      CHECK_EQ_INT(l.pool_rows, (int64_t)l.ring.blocks * MM_FUSED_BLOCK_ROWS);
      CHECK_EQ_INT(l.regions[MM_WS_POOL_X].bytes, (uint64_t)l.pool_rows * 1024);
      /* Every counter of both banks inside the region; consecutive forwards use disjoint banks. */
      const int32_t vb = l.ring.virtual_blocks;
      const int64_t words = (int64_t)(l.regions[MM_WS_BLOCK_COUNTERS].bytes / 4);
      for (uint64_t fwd = 1; fwd <= 2; ++fwd)
        for (int kind = 0; kind < MM_FUSED_COUNTERS; ++kind) {
          const int64_t first = mm_fused_counter_index(vb, fwd, kind, 0), last = mm_fused_counter_index(vb, fwd, kind, vb - 1);
          CHECK(first >= 0 && last < words && last - first == vb - 1);
          const int64_t other = mm_fused_counter_index(vb, fwd + 1, kind, 0);
          CHECK(other >= words / 2 ? first < words / 2 : first >= words / 2);
        }
    }
  }
  /* pool_imbalance sizes the staged and split pools, not the ring. */
  c.arm = MEGAMOE_ARM_FUSED;
  mm_layout a, b;
  CHECK_OK(mm_layout_compute(&c, 4, &a));
  c.pool_imbalance = 1.0;
  CHECK_OK(mm_layout_compute(&c, 4, &b));
  CHECK_EQ_INT(a.pool_rows, b.pool_rows);
  CHECK_EQ_INT(a.workspace_bytes, b.workspace_bytes);
  return MM_TEST_PASS;
}

const mm_test unit_suite_fused[] = {
    {"fused.ring_numbers", t_ring_numbers},
    {"fused.worst_blocks_bound_any_routing", t_worst_blocks},
    {"fused.call_order_and_bound_rejection", t_call_order},
    {"fused.lag_percent_read_at_create", t_lag_percent_at_create},
    {"fused.claim_rule_read_at_create", t_claim_rule},
    {"fused.ring_percent_and_ring_order", t_ring_percent_at_create},
    {"fused.stream_decode_matches_the_order", t_stream_decode},
    {"fused.ring_static_live_set_and_guard", t_ring_static},
    {"fused.ring_static_flash_tiles", t_ring_static_flash},
    {"fused.ring_short_by_one_fails", t_ring_short_by_one_fails},
    {"fused.ring_simulation", t_ring_simulation},
    {"fused.bound_verdict_on_every_rank", t_bound_verdict},
    {"fused.layout_regions", t_fused_layout},
    {NULL, NULL},
};
