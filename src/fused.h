/* The fused arm's schedule as plain C for both sides (docs/FUSED.md): the
 * task stream, the ring's slot arithmetic, the per-block counters and the
 * device's num_tokens_bound verdict. The kernel decodes its tasks with these
 * functions and the CPU tests (tests/unit/test_fused.c) simulate the same
 * functions, so what the tests prove about the order is what the kernel runs.
 *
 * Words (docs/FUSED.md section 2):
 *   virtual row   a row of the expert-major pool as the staged arm lays it out
 *                 (experts at multiples of MM_FUSED_BLOCK_ROWS, sources in rank
 *                 order); the fused arm never stores the whole pool;
 *   block         MM_FUSED_BLOCK_ROWS consecutive virtual rows (virtual block
 *                 b = virtual row / 128); one block is one ring slot's content;
 *   unit          up to MM_FUSED_UNIT_BLOCKS consecutive blocks of one expert
 *                 (an expert's rows cut at multiples of 1024);
 *   ring          ring_blocks slots; block b lives in slot b % ring_blocks, so
 *                 virtual row r lives at ring row r % (ring_blocks * 128).
 * Pure C11 (and CUDA): no allocation, no library call. */
#ifndef MEGAMOE_FUSED_H
#define MEGAMOE_FUSED_H

#include <stdint.h>

#include "contract.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MM_FUSED_BLOCK_ROWS 128 /* rows of a ring slot: the pool's expert alignment and the rows-ready block */
#define MM_FUSED_UNIT_BLOCKS 8  /* blocks of a unit */
#define MM_FUSED_UNIT_ROWS (MM_FUSED_UNIT_BLOCKS * MM_FUSED_BLOCK_ROWS)
/* The starting rule of issue 11 (the seed's): lag = clamp(round(0.45 units),
 * 8, 64) units, groups of 4 units; the ring holds 8 (lag + group) + 4 blocks.
 * The lag ladder (docs/FUSED.md section 9) may change the constants, never
 * the ring formula's shape: the proof of section 4 needs ring >= 8 (lag + group).
 * The minimum lag is load-bearing too: with claimed tasks and the deferred
 * L1_DONE publication, the CPU model (tests/unit/test_fused.c,
 * fused.ring_simulation) finds runs that never finish at lag 0 and 1, none
 * from 2 up; 8 keeps a margin. */
#define MM_FUSED_GROUP 4
#define MM_FUSED_LAG_MIN 8
#define MM_FUSED_LAG_MAX 64
#define MM_FUSED_LAG_PERCENT 45
#define MM_FUSED_RING_MARGIN 4

#if MM_FUSED_BLOCK_ROWS != MM_POOL_ROW_ALIGN || MM_FUSED_BLOCK_ROWS != MM_READY_BLOCK_ROWS
#error "a ring slot must be one pool block: experts start on slot boundaries and rows-ready counts whole slots"
#endif

/* ---- Per-block counters (workspace region MM_WS_BLOCK_COUNTERS) -----------
 * Three counters per virtual block, each counting rows (so the target does not
 * depend on which tile shape wrote them):
 *   PULLED    rows of the block pulled into its slot           target rows(b)
 *   L1_DONE   rows of the block written by L1 tiles             target rows(b) * L1 n-tiles
 *   L2_DONE   rows of the block whose L2 output has left the    target rows(b) * L2 n-tiles
 *             CTA (the copy warps' stores issued: nothing reads
 *             the slot, its row table or its weights after)
 * Indexed by virtual block, not by slot: a counter is used once per forward,
 * so no counter needs a generation. Two banks, bank = forward & 1: forward n
 * counts in bank n & 1 and zeroes bank (n + 1) & 1 (the one forward n - 1
 * used, finished before forward n started) anywhere in its run, so the next
 * forward finds its bank zero without a zeroing pass before its first wait
 * (create zeroes both). */
enum mm_fused_counter {
  MM_FUSED_PULLED = 0,
  MM_FUSED_L1_DONE = 1,
  MM_FUSED_L2_DONE = 2,
  MM_FUSED_COUNTERS = 3
};

MM_HOST_DEVICE int64_t mm_fused_counter_index(int32_t virtual_blocks, uint64_t forward, int kind, int64_t block) {
  return ((int64_t)(forward & 1u) * MM_FUSED_COUNTERS + kind) * (int64_t)virtual_blocks + block;
}

/* ---- The order of one call (chosen on the host, fused_plan.c) -------------- */
typedef struct mm_fused_order {
  int32_t single_wave; /* 1: every L1 task, then every L2 task; the ring is used as a plain pool */
  int32_t lag;         /* units between a unit's L1 and its L2 (lag order) */
  int32_t group;       /* units per group (lag order) */
  int32_t ring_blocks; /* the layout's ring */
  int32_t dynamic_claim; /* 1: each CTA claims its next task from a grid-wide counter, in stream order,
                            and reads it from the task list the grid decoded; 0: tasks blockIdx.x + k *
                            gridDim.x. Set per call (mm_fused_claim_for: 1 on the large tile pair) */
} mm_fused_order;

/* Units of one expert whose tiles share a segment: 2 (2048 rows: the
 * engine's m-group, MM_GEMM_GROUP_ROWS). Per unit, the fused kernel read a
 * 2-unit expert's weights twice at 8192 tokens per rank (ncu: 2.17-2.25 GB
 * from DRAM against the split kernels' 1.80; docs/PERF.md, fourteenth
 * session); a longer run would need its rows (8 MB of L1 input) to stay in
 * the L2 cache while every n-tile passes over them. */
#define MM_FUSED_SEGMENT_UNITS 2

/* The stream is a sequence of phases; phase j holds the L1 tasks of its L1
 * units, then the L2 tasks of its L2 units, in unit order by segment: a
 * segment is the phase's units of one expert inside one aligned run of
 * MM_FUSED_SEGMENT_UNITS units of that expert, and inside a segment the
 * m-tiles run fastest, then the n-tiles (consecutive CTAs share a weight
 * tile, and the expert's weights are read once per segment, not once per
 * unit).
 *   lag order:   L1 of unit u in phase u / group, L2 of unit u in phase
 *                (u + lag) / group;
 *   single wave: every L1 in phase 0, every L2 in phase 1. */
MM_HOST_DEVICE int64_t mm_fused_l1_phase(const mm_fused_order* o, int64_t unit) {
  return o->single_wave ? 0 : unit / o->group;
}
MM_HOST_DEVICE int64_t mm_fused_l2_phase(const mm_fused_order* o, int64_t unit) {
  return o->single_wave ? 1 : (unit + o->lag) / o->group;
}

MM_HOST_DEVICE int64_t mm_fused_clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Units [*lo, *hi) whose tasks of GEMM `gemm` (0: L1, 1: L2) are in phase j;
 * the units before *lo have theirs in earlier phases (so the phase starts
 * after their tasks). */
MM_HOST_DEVICE void mm_fused_phase_units(const mm_fused_order* o, int gemm, int64_t j, int64_t units, int64_t* lo,
                                         int64_t* hi) {
  if (o->single_wave) {
    if (gemm == 0) { /* every L1 in phase 0 */
      *lo = j == 0 ? 0 : units;
      *hi = units;
    } else { /* every L2 in phase 1 */
      *lo = j <= 1 ? 0 : units;
      *hi = j == 0 ? 0 : units;
    }
    return;
  }
  const int64_t first = j * o->group - (gemm ? o->lag : 0);
  *lo = mm_fused_clamp64(first, 0, units);
  *hi = mm_fused_clamp64(first + o->group, 0, units);
}

/* Phases of a stream of `units` units (the last L2's phase + 1). */
MM_HOST_DEVICE int64_t mm_fused_phases(const mm_fused_order* o, int64_t units) {
  return units == 0 ? 0 : mm_fused_l2_phase(o, units - 1) + 1;
}

/* ---- The stream of one forward ----------------------------------------------
 * Built from the pool layout (valid rows per local expert, known after the
 * dispatch barrier) and the call's order. The arrays are the caller's
 * (shared memory in the kernel, the heap in the tests), E_l + 1 entries each,
 * filled by mm_fused_stream_build. */
typedef struct mm_fused_stream {
  mm_fused_order order;
  int32_t experts;     /* E_l */
  int32_t bm[2];       /* tile rows of L1 and L2: 64, 128 or 256 */
  int32_t tiles_n[2];  /* n-tiles of L1 (2I / BN1) and of L2 (H / BN2) */
  const int32_t* rows; /* [E_l] valid rows of each local expert */
  int32_t* block_start;  /* [E_l + 1] first virtual block of each expert (exclusive prefix) */
  int32_t* unit_start;   /* [E_l + 1] first unit of each expert */
  int32_t* m_start[2];   /* [E_l + 1] first m-tile of each expert, per GEMM */
  int64_t units, blocks, tasks, phases;
} mm_fused_stream;

/* One task: a tile of one GEMM. */
typedef struct mm_fused_task {
  int32_t gemm;   /* 0: L1 (x rows -> SwiGLU fp8), 1: L2 (fp8 -> bf16 rows pushed to their source ranks) */
  int32_t expert; /* local expert */
  int64_t unit;   /* global unit index */
  int32_t m;      /* m-tile within the expert */
  int32_t n;      /* n-tile */
  int32_t row0;   /* first row within the expert: m * bm */
  int32_t rows;   /* valid rows of the tile, 1..bm */
  int64_t block0; /* virtual block of row0 (a tile of 256 rows also covers block0 + 1 when rows > 128) */
} mm_fused_task;

MM_HOST_DEVICE int64_t mm_fused_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The largest i in [0, n) with start[i] <= v (start ascending, start[0] <= v):
 * the expert whose range holds v, skipping experts with empty ranges. */
MM_HOST_DEVICE int32_t mm_fused_find(const int32_t* start, int32_t n, int64_t v) {
  int32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if ((int64_t)start[mid] <= v) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Arrays of a stream of `experts` experts: int32 words in the one buffer
 * mm_fused_stream_init carves (shared memory in the kernel). */
#define MM_FUSED_STREAM_WORDS(experts) (4 * ((experts) + 1))

MM_HOST_DEVICE int64_t mm_fused_stream_build(mm_fused_stream* s);

/* Sets up *s over `words` (MM_FUSED_STREAM_WORDS(experts) int32) for GEMM
 * tiles of bm[g] rows and tiles_n[g] n-tiles, without building it: the
 * prefixes are filled by mm_fused_stream_build (serially) or by the kernel's
 * CTA in parallel (device/fused/fused_stream.cuh), then
 * mm_fused_stream_finish sets the totals. */
MM_HOST_DEVICE void mm_fused_stream_setup(mm_fused_stream* s, mm_fused_order order, int32_t experts,
                                          const int32_t* rows, int32_t* words, int32_t bm0, int32_t bm1,
                                          int32_t tiles_n0, int32_t tiles_n1) {
  s->order = order;
  s->experts = experts;
  s->bm[0] = bm0;
  s->bm[1] = bm1;
  s->tiles_n[0] = tiles_n0;
  s->tiles_n[1] = tiles_n1;
  s->rows = rows;
  s->block_start = words;
  s->unit_start = words + (experts + 1);
  s->m_start[0] = words + 2 * (experts + 1);
  s->m_start[1] = words + 3 * (experts + 1);
}

/* Sets up *s (mm_fused_stream_setup) and builds it. Returns the task count. */
MM_HOST_DEVICE int64_t mm_fused_stream_init(mm_fused_stream* s, mm_fused_order order, int32_t experts,
                                            const int32_t* rows, int32_t* words, int32_t bm0, int32_t bm1,
                                            int32_t tiles_n0, int32_t tiles_n1) {
  mm_fused_stream_setup(s, order, experts, rows, words, bm0, bm1, tiles_n0, tiles_n1);
  return mm_fused_stream_build(s);
}

/* The totals of a stream whose prefixes are filled (entry [experts] of each
 * array holds the sum over every expert). Returns the task count. */
MM_HOST_DEVICE int64_t mm_fused_stream_finish(mm_fused_stream* s) {
  const int32_t E = s->experts;
  s->blocks = s->block_start[E];
  s->units = s->unit_start[E];
  s->tasks = (int64_t)s->m_start[0][E] * s->tiles_n[0] + (int64_t)s->m_start[1][E] * s->tiles_n[1];
  s->phases = mm_fused_phases(&s->order, s->units);
  return s->tasks;
}

/* Per-expert quantities of the prefixes: blocks, units, L1 m-tiles, L2 m-tiles. */
MM_HOST_DEVICE int64_t mm_fused_expert_blocks(int64_t rows) { return mm_fused_ceil_div(rows, MM_FUSED_BLOCK_ROWS); }
MM_HOST_DEVICE int64_t mm_fused_expert_units(int64_t rows) { return mm_fused_ceil_div(rows, MM_FUSED_UNIT_ROWS); }

/* Fills the prefixes and the totals; serial (the kernel's CTAs may build the
 * same arrays in parallel, they must equal these). Returns the task count. */
MM_HOST_DEVICE int64_t mm_fused_stream_build(mm_fused_stream* s) {
  int64_t blocks = 0, units = 0, m0 = 0, m1 = 0;
  for (int32_t e = 0; e < s->experts; ++e) {
    s->block_start[e] = (int32_t)blocks;
    s->unit_start[e] = (int32_t)units;
    s->m_start[0][e] = (int32_t)m0;
    s->m_start[1][e] = (int32_t)m1;
    const int64_t r = s->rows[e];
    blocks += mm_fused_expert_blocks(r);
    units += mm_fused_expert_units(r);
    m0 += mm_fused_ceil_div(r, s->bm[0]);
    m1 += mm_fused_ceil_div(r, s->bm[1]);
  }
  s->block_start[s->experts] = (int32_t)blocks;
  s->unit_start[s->experts] = (int32_t)units;
  s->m_start[0][s->experts] = (int32_t)m0;
  s->m_start[1][s->experts] = (int32_t)m1;
  return mm_fused_stream_finish(s);
}

/* M-tiles of GEMM `gemm` before unit u (u <= units): every unit of an
 * expert but its last is full. The GEMM's tasks before unit u are these
 * times its n-tiles, in any order of the segments. */
MM_HOST_DEVICE int64_t mm_fused_m_before(const mm_fused_stream* s, int gemm, int64_t u) {
  if (u >= s->units) return s->m_start[gemm][s->experts];
  const int32_t e = mm_fused_find(s->unit_start, s->experts, u);
  return s->m_start[gemm][e] + (u - s->unit_start[e]) * (MM_FUSED_UNIT_ROWS / s->bm[gemm]);
}
MM_HOST_DEVICE int64_t mm_fused_tasks_before(const mm_fused_stream* s, int gemm, int64_t u) {
  return mm_fused_m_before(s, gemm, u) * s->tiles_n[gemm];
}

/* Stream position of phase j's first task (j <= phases: the task count). */
MM_HOST_DEVICE int64_t mm_fused_phase_start(const mm_fused_stream* s, int64_t j) {
  int64_t lo1, hi1, lo2, hi2;
  mm_fused_phase_units(&s->order, 0, j, s->units, &lo1, &hi1);
  mm_fused_phase_units(&s->order, 1, j, s->units, &lo2, &hi2);
  return mm_fused_tasks_before(s, 0, lo1) + mm_fused_tasks_before(s, 1, lo2);
}

/* Task i of GEMM `gemm` (i < its task count) whose phase part holds the
 * m-tiles [m_lo, m_hi) (global m-tile numbers; tasks [m_lo, m_hi) x n-tiles
 * of the GEMM). Its segment: the part of the expert's aligned run of
 * MM_FUSED_SEGMENT_UNITS units inside [m_lo, m_hi). The segments partition
 * the part in m order, n-tiles x m-tiles each, so the m-tile i / n-tiles
 * lies in the task's segment (not necessarily the task's own m-tile). */
MM_HOST_DEVICE void mm_fused_gemm_task(const mm_fused_stream* s, int gemm, int64_t i, int64_t m_lo, int64_t m_hi,
                                       mm_fused_task* t) {
  const int32_t bm = s->bm[gemm], tn = s->tiles_n[gemm];
  const int64_t seg_m = (int64_t)(MM_FUSED_UNIT_ROWS / bm) * MM_FUSED_SEGMENT_UNITS; /* m-tiles of a full run */
  const int64_t m_in = i / tn;
  const int32_t e = mm_fused_find(s->m_start[gemm], s->experts, m_in);
  const int64_t e0 = s->m_start[gemm][e], e1 = s->m_start[gemm][e + 1];
  const int64_t run0 = e0 + (m_in - e0) / seg_m * seg_m; /* the run's first m-tile */
  const int64_t seg0 = run0 > m_lo ? run0 : m_lo;
  int64_t seg1 = run0 + seg_m < e1 ? run0 + seg_m : e1;
  if (seg1 > m_hi) seg1 = m_hi;
  const int64_t mt = seg1 - seg0, local = i - seg0 * tn;
  t->gemm = gemm;
  t->expert = e;
  t->n = (int32_t)(local / mt);
  t->m = (int32_t)(seg0 - e0 + local % mt);
  t->unit = s->unit_start[e] + t->m / (MM_FUSED_UNIT_ROWS / bm);
  t->row0 = t->m * bm;
  t->rows = s->rows[e] - t->row0 < bm ? s->rows[e] - t->row0 : bm;
  t->block0 = s->block_start[e] + t->row0 / MM_FUSED_BLOCK_ROWS;
}

/* Task t of the stream (t < tasks): the phase by binary search, then the
 * phase's L1 part or L2 part. A kernel walking its own tasks in increasing t
 * may keep a cursor instead; it must give the same tasks. */
MM_HOST_DEVICE void mm_fused_task_at(const mm_fused_stream* s, int64_t t, mm_fused_task* task) {
  if (s->order.single_wave) { /* every L1 task (phase 0), then every L2 task (phase 1): no search */
    const int64_t m1 = s->m_start[0][s->experts], l1_tasks = m1 * s->tiles_n[0];
    if (t < l1_tasks) mm_fused_gemm_task(s, 0, t, 0, m1, task);
    else mm_fused_gemm_task(s, 1, t - l1_tasks, 0, s->m_start[1][s->experts], task);
    return;
  }
  int64_t lo = 0, hi = s->phases - 1; /* the last phase whose start <= t (it holds t) */
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (mm_fused_phase_start(s, mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  int64_t lo1, hi1, lo2, hi2;
  mm_fused_phase_units(&s->order, 0, lo, s->units, &lo1, &hi1);
  mm_fused_phase_units(&s->order, 1, lo, s->units, &lo2, &hi2);
  const int64_t off = t - mm_fused_phase_start(s, lo);
  const int64_t m1_lo = mm_fused_m_before(s, 0, lo1), m1_hi = mm_fused_m_before(s, 0, hi1);
  const int64_t count1 = (m1_hi - m1_lo) * s->tiles_n[0];
  if (off < count1) {
    mm_fused_gemm_task(s, 0, m1_lo * s->tiles_n[0] + off, m1_lo, m1_hi, task);
  } else {
    const int64_t m2_lo = mm_fused_m_before(s, 1, lo2);
    mm_fused_gemm_task(s, 1, m2_lo * s->tiles_n[1] + off - count1, m2_lo, mm_fused_m_before(s, 1, hi2), task);
  }
}

/* A task in 8 bytes, for a CTA's list of its own tasks decoded ahead
 * (decoding one costs its producer thread microseconds): gemm in bit 63,
 * the local expert in bits 48-62, m in bits 22-47, n in bits 0-21. A task
 * whose fields do not fit packs to MM_FUSED_TASK_UNPACKED (decode it
 * again; so is read the one valid task with every field at its maximum,
 * which decodes right all the same); the rest of the task follows from the
 * stream. */
#define MM_FUSED_TASK_UNPACKED (~(uint64_t)0)
MM_HOST_DEVICE uint64_t mm_fused_task_pack(const mm_fused_task* t) {
  if (t->expert < 0 || t->expert >= (1 << 15) || t->m < 0 || t->m >= (1 << 26) || t->n < 0 || t->n >= (1 << 22))
    return MM_FUSED_TASK_UNPACKED;
  return ((uint64_t)(t->gemm != 0) << 63) | ((uint64_t)t->expert << 48) | ((uint64_t)t->m << 22) | (uint64_t)t->n;
}
MM_HOST_DEVICE void mm_fused_task_unpack(const mm_fused_stream* s, uint64_t w, mm_fused_task* t) {
  const int gemm = (int)(w >> 63);
  const int32_t e = (int32_t)((w >> 48) & 0x7fffu), m = (int32_t)((w >> 22) & 0x3ffffffu), bm = s->bm[gemm];
  t->gemm = gemm;
  t->expert = e;
  t->m = m;
  t->n = (int32_t)(w & 0x3fffffu);
  t->unit = s->unit_start[e] + m / (MM_FUSED_UNIT_ROWS / bm);
  t->row0 = m * bm;
  t->rows = s->rows[e] - t->row0 < bm ? s->rows[e] - t->row0 : bm;
  t->block0 = s->block_start[e] + t->row0 / MM_FUSED_BLOCK_ROWS;
}

/* Entries of the task list (workspace region MM_WS_TASK_LIST): an upper
 * bound of a stream's tasks over every tile pair the arm has, for a pool of
 * at most virtual_blocks blocks. A tile has >= 64 rows, so an expert of b
 * blocks has <= 2b m-tiles of either GEMM (a 256-row L2 tile: <= b), and
 * >= 128 columns, so <= ceil(2I / 128) L1 and ceil(H / 128) L2 n-tiles. A
 * stream above it anyway (a future tile) is still right: its producers
 * decode the tasks past the list themselves. */
MM_HOST_DEVICE int64_t mm_fused_task_list_entries(int64_t virtual_blocks, int64_t hidden, int64_t intermediate) {
  return 2 * virtual_blocks * (mm_fused_ceil_div(2 * intermediate, 128) + mm_fused_ceil_div(hidden, 128));
}

/* Valid rows of virtual block b (b < blocks). */
MM_HOST_DEVICE int32_t mm_fused_block_rows(const mm_fused_stream* s, int64_t b) {
  const int32_t e = mm_fused_find(s->block_start, s->experts, b);
  const int64_t left = s->rows[e] - (b - s->block_start[e]) * MM_FUSED_BLOCK_ROWS;
  return (int32_t)(left < MM_FUSED_BLOCK_ROWS ? left : MM_FUSED_BLOCK_ROWS);
}

/* The value counter `kind` of block b reaches once the block is complete. */
MM_HOST_DEVICE int64_t mm_fused_counter_target(const mm_fused_stream* s, int kind, int64_t b) {
  const int64_t rows = mm_fused_block_rows(s, b);
  return kind == MM_FUSED_PULLED ? rows : rows * s->tiles_n[kind == MM_FUSED_L1_DONE ? 0 : 1];
}

/* The ring slot guard: the block whose L2 must be done (L2_DONE complete)
 * before block b's rows may be pulled into its slot, or -1 when the slot is
 * fresh in this forward. One wait suffices: that block's own pull waited for
 * its predecessor, and its L2 cannot finish before its pull. */
MM_HOST_DEVICE int64_t mm_fused_slot_predecessor(const mm_fused_order* o, int64_t b) {
  return b >= o->ring_blocks ? b - o->ring_blocks : -1;
}

/* Ring row of virtual row r. */
MM_HOST_DEVICE int64_t mm_fused_ring_row(const mm_fused_order* o, int64_t r) {
  return r % ((int64_t)o->ring_blocks * MM_FUSED_BLOCK_ROWS);
}

/* ---- num_tokens_bound across ranks ----------------------------------------
 * Every rank writes (its T, its num_tokens_bound) into slot `rank` of every
 * rank's MM_SYM_CALL_TOKENS before the dispatch barrier; after it, every rank
 * judges the same table with this function, so every rank reaches the same
 * verdict and reports the same status (MEGAMOE_ERR_TOO_MANY_TOKENS, site
 * MM_SITE_TOKEN_BOUND), naming the same rank. A bound of 0 means T_max. */
typedef struct mm_call_tokens {
  int64_t num_tokens;
  int64_t bound;
} mm_call_tokens;

typedef struct mm_bound_verdict {
  int32_t rank;      /* the rank named: whose bound differs, or whose count is above the bound */
  int32_t differs;   /* 1: rank's bound differs from rank 0's; 0: rank's count is above the bound */
  int64_t value;     /* rank's bound (differs) or its count */
  int64_t bound;     /* rank 0's bound, as it applies (0 read as T_max) */
} mm_bound_verdict;

/* 1 (and *v) when the table breaks the contract: some bound differs from
 * rank 0's, or some count is above it; the first such rank, bounds first. */
MM_HOST_DEVICE int mm_fused_bound_violation(const mm_call_tokens* calls, int32_t num_ranks, int64_t max_tokens,
                                            mm_bound_verdict* v) {
  const int64_t b0 = calls[0].bound > 0 ? calls[0].bound : max_tokens;
  for (int32_t r = 0; r < num_ranks; ++r) {
    const int64_t b = calls[r].bound > 0 ? calls[r].bound : max_tokens;
    if (b != b0) {
      v->rank = r;
      v->differs = 1;
      v->value = b;
      v->bound = b0;
      return 1;
    }
  }
  for (int32_t r = 0; r < num_ranks; ++r)
    if (calls[r].num_tokens > b0) {
      v->rank = r;
      v->differs = 0;
      v->value = calls[r].num_tokens;
      v->bound = b0;
      return 1;
    }
  return 0;
}

#ifdef __cplusplus
}
#endif

#endif
