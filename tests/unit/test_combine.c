/* A CPU model of the early combine's arrival counters (docs/DESIGN.md
 * section 5, route_phases.cuh, gemm_epilogue.cuh mm_gemm_count_arrivals),
 * with the kernels' own formulas (contract.h: mm_combine_arrival_index,
 * mm_combine_row_columns, mm_combine_unit_target).
 *
 * A layer of R ranks runs a series of forwards. Per forward each rank draws
 * its T, its combine order (early or late: each rank decides alone) and its
 * L2 tile width (128 or 256: the tile follows the call's size, so ranks can
 * differ), and its top-k with masked slots and repeated experts. Routing
 * phase A: every early rank zeroes its counters of [0, T x units). Then, in
 * a random interleaving: every expert rank's L2 tiles (blocks of 128 pool
 * rows of one local expert x BN columns), each storing its rows and then
 * adding each row's columns to the source's counter when that source takes
 * the early order this forward (MM_SYM_COMBINE_ORDER); and every early
 * source's units, each polling its counter until it holds the target, then
 * reading its rows. What must hold:
 *   - a unit that passes its wait finds every live slot's columns of it
 *     stored (no row read before it landed);
 *   - every unit passes once all tiles ran (no deadlock);
 *   - at the forward's end each early unit's counter is exactly its target
 *     (nothing stale, nothing counted twice).
 * Planted bugs, each caught: no zeroing, a tile's full BN counted at the
 * last (partial) tile, the counter indexed by slot instead of token. And
 * counting the late sources' rows too (the option's first draft) must stay
 * correct: the early sources zero their counters first. */
#include <stdio.h>
#include <string.h>

#include "unit.h"

#define CM_RANKS 4
#define CM_TMAX 40
#define CM_K 6
#define CM_UNITS 4  /* H <= 2048 */
#define CM_EL 4     /* local experts per rank, at most */
#define CM_EVENTS (CM_RANKS * CM_EL * (CM_RANKS * CM_TMAX * CM_K / 128 + 1) * (2048 / 128) + CM_RANKS * CM_TMAX * CM_UNITS)

typedef enum {
  CM_BUG_NONE,
  CM_BUG_NO_ZEROING,
  CM_BUG_FULL_TILE_COLUMNS,
  CM_BUG_SLOT_INDEX,
  CM_BUG_COUNT_LATE, /* not a bug of the protocol: the copy warps counting every source (the option's first draft) */
  CM_BUGS
} cm_bug;
static const char* const cm_bug_names[CM_BUGS] = {"none", "no zeroing", "full BN at the last tile", "indexed by slot",
                                                  "late sources counted too (allowed)"};

typedef struct cm_layer {
  int R, H, K, El, T_max;
  /* Counters per source rank, sized for the slot-indexed bug's range. */
  int32_t counter[CM_RANKS][CM_TMAX * CM_K * CM_UNITS];
} cm_layer;

typedef struct cm_forward {
  int T[CM_RANKS], early[CM_RANKS], bn[CM_RANKS];
  int topk[CM_RANKS][CM_TMAX][CM_K]; /* global expert, -1 masked */
  /* Columns of unit u stored for (source, token, slot). */
  int32_t landed[CM_RANKS][CM_TMAX][CM_K][CM_UNITS];
} cm_forward;

/* A pool row: (source, token, slot), grouped by local expert on the expert rank. */
typedef struct cm_row {
  int src, t, k;
} cm_row;

typedef struct cm_event {
  int kind; /* 0: an L2 tile, 1: a unit's poll */
  int rank; /* the tile's expert rank, or the unit's source rank */
  int a, b; /* tile: first row index in rows[rank], row count; unit: token, unit */
  int n0;   /* tile's first column */
} cm_event;

static int cm_units(const cm_layer* L) { return mm_combine_units(L->H); }

static int64_t cm_index(const cm_layer* L, cm_bug bug, int t, int k, int n0) {
  const int32_t slot = t * L->K + k;
  if (bug == CM_BUG_SLOT_INDEX) return (int64_t)slot * cm_units(L) + n0 / MM_COMBINE_UNIT_COLS;
  return mm_combine_arrival_index(slot, L->K, L->H, n0);
}

static int cm_live(const cm_forward* f, int s, int t, int K) {
  int n = 0;
  for (int k = 0; k < K; ++k) n += f->topk[s][t][k] >= 0;
  return n;
}

/* One forward; returns NULL when every rule held, else why not. */
static const char* cm_run_forward(cm_layer* L, cm_forward* f, cm_bug bug, mm_rng* g, char* why, size_t n) {
  static cm_row rows[CM_RANKS][CM_RANKS * CM_TMAX * CM_K];
  static cm_event ev[CM_EVENTS];
  const int units = cm_units(L);
  int nrows[CM_RANKS] = {0};
  int nev = 0;
  /* A: zeroing by every early source. */
  for (int s = 0; s < L->R; ++s)
    if (f->early[s] && bug != CM_BUG_NO_ZEROING)
      for (int i = 0; i < f->T[s] * units; ++i) L->counter[s][i] = 0;
  memset(f->landed, 0, sizeof f->landed);
  /* The expert ranks' pools and tiles (after barrier 0). */
  for (int e = 0; e < L->R; ++e)
    for (int le = 0; le < L->El; ++le) {
      const int expert = e * L->El + le, first = nrows[e];
      for (int s = 0; s < L->R; ++s)
        for (int t = 0; t < f->T[s]; ++t)
          for (int k = 0; k < L->K; ++k)
            if (f->topk[s][t][k] == expert) rows[e][nrows[e]++] = (cm_row){s, t, k};
      for (int r0 = first; r0 < nrows[e]; r0 += 128)
        for (int n0 = 0; n0 < L->H; n0 += f->bn[e]) {
          const int cnt = nrows[e] - r0 < 128 ? nrows[e] - r0 : 128;
          ev[nev++] = (cm_event){0, e, r0, cnt, n0};
        }
    }
  for (int s = 0; s < L->R; ++s)
    if (f->early[s])
      for (int t = 0; t < f->T[s]; ++t)
        for (int u = 0; u < units; ++u) ev[nev++] = (cm_event){1, s, t, u, 0};
  /* Random interleaving: a tile runs once; a unit polls until it passes. */
  int tiles_left = 0;
  for (int i = 0; i < nev; ++i) tiles_left += ev[i].kind == 0;
  int stalled = 0; /* polls in a row that did not pass */
  while (nev > 0) {
    const int i = (int)mm_rng_below(g, (uint64_t)nev);
    cm_event* x = &ev[i];
    int done = 1;
    if (x->kind == 0) {
      const int cols = mm_combine_row_columns(L->H, x->n0, f->bn[x->rank]);
      const int added = bug == CM_BUG_FULL_TILE_COLUMNS ? f->bn[x->rank] : cols;
      for (int r = x->a; r < x->a + x->b; ++r) {
        const cm_row* w = &rows[x->rank][r];
        f->landed[w->src][w->t][w->k][x->n0 / MM_COMBINE_UNIT_COLS] += cols; /* the stores, */
        if (!f->early[w->src] && bug != CM_BUG_COUNT_LATE) continue;         /* counted for early sources, */
        const int64_t c = cm_index(L, bug, w->t, w->k, x->n0);                 /* then the add */
        if (c < 0 || c >= (int64_t)f->T[w->src] * units) {
          snprintf(why, n, "a row of token %d slot %d counted at %lld, outside the source's %d x %d counters", w->t,
                   w->k, (long long)c, f->T[w->src], units);
          return why;
        }
        L->counter[w->src][c] += added;
      }
      tiles_left--;
      stalled = 0;
    } else {
      const int s = x->rank, t = x->a, u = x->b;
      const int32_t target = mm_combine_unit_target(cm_live(f, s, t, L->K), L->H, u);
      if (L->counter[s][t * units + u] >= target) {
        const int want = mm_combine_unit_target(1, L->H, u);
        for (int k = 0; k < L->K; ++k)
          if (f->topk[s][t][k] >= 0 && f->landed[s][t][k][u] != want) {
            snprintf(why, n, "rank %d token %d unit %d passed its wait (counter %d, target %d) with slot %d's %d of %d columns stored",
                     s, t, u, L->counter[s][t * units + u], target, k, f->landed[s][t][k][u], want);
            return why;
          }
      } else {
        done = 0;
        if (tiles_left == 0 && ++stalled > 64 * nev) {
          snprintf(why, n, "rank %d token %d unit %d never passed (counter %d, target %d) after every tile ran", s, t, u,
                   L->counter[s][t * units + u], target);
          return why;
        }
      }
    }
    if (done) ev[i] = ev[--nev];
  }
  /* The forward's end: every early unit's counter exactly at its target. */
  for (int s = 0; s < L->R; ++s)
    if (f->early[s])
      for (int t = 0; t < f->T[s]; ++t)
        for (int u = 0; u < units; ++u) {
          const int32_t target = mm_combine_unit_target(cm_live(f, s, t, L->K), L->H, u);
          if (L->counter[s][t * units + u] != target) {
            snprintf(why, n, "rank %d token %d unit %d ended at %d, target %d", s, t, u, L->counter[s][t * units + u],
                     target);
            return why;
          }
        }
  return NULL;
}

static void cm_draw_forward(const cm_layer* L, cm_forward* f, mm_rng* g) {
  const int E = L->R * L->El;
  const int pattern = (int)mm_rng_below(g, 4); /* 0 uniform, 1 masked 30 %, 2 repeats, 3 one expert */
  for (int s = 0; s < L->R; ++s) {
    f->T[s] = mm_rng_below(g, 5) == 0 ? 0 : 1 + (int)mm_rng_below(g, (uint64_t)L->T_max);
    f->early[s] = (int)mm_rng_below(g, 2);
    f->bn[s] = mm_rng_below(g, 2) ? 256 : 128;
    for (int t = 0; t < CM_TMAX; ++t)
      for (int k = 0; k < CM_K; ++k) {
        int e = (int)mm_rng_below(g, (uint64_t)E);
        if (pattern == 1 && mm_rng_below(g, 10) < 3) e = -1;
        if (pattern == 2 && k > 0 && mm_rng_below(g, 2)) e = f->topk[s][t][k - 1];
        if (pattern == 3) e = E - 1;
        f->topk[s][t][k] = k < L->K ? e : -1;
      }
  }
}

/* Layers of random shape, 6 forwards each; the real rule must hold in all,
 * each planted bug must be caught in some. */
static mm_test_result t_combine_model(void) {
  mm_rng g = unit_rng(0xc0b1);
  static cm_layer L;
  static cm_forward f;
  char why[256];
  int caught[CM_BUGS] = {0}, runs = 0;
  for (int i = 0; i < 200; ++i) {
    const int R = 1 + (int)mm_rng_below(&g, CM_RANKS);
    const int H = 128 * (1 + (int)mm_rng_below(&g, 16)); /* 128 .. 2048: partial units and tiles */
    const int K = 1 + (int)mm_rng_below(&g, CM_K);
    const int El = 1 + (int)mm_rng_below(&g, CM_EL);
    if (K > R * El) continue;
    const uint64_t layer_seed = mm_rng_next(&g);
    for (int bug = 0; bug < CM_BUGS; ++bug) {
      memset(&L, 0, sizeof L);
      L.R = R, L.H = H, L.K = K, L.El = El, L.T_max = CM_TMAX;
      mm_rng lg = {layer_seed};
      const char* failed = NULL;
      for (int fw = 0; fw < 6 && !failed; ++fw) {
        cm_draw_forward(&L, &f, &lg);
        failed = cm_run_forward(&L, &f, (cm_bug)bug, &lg, why, sizeof why);
      }
      if (bug == CM_BUG_NONE || bug == CM_BUG_COUNT_LATE) {
        CHECK_MSG(!failed, "layer %d (R %d, H %d, K %d, E_l %d), %s: %s", i, R, H, K, El,
                  bug == CM_BUG_NONE ? "the protocol" : cm_bug_names[bug], failed);
        runs += bug == CM_BUG_NONE;
      } else {
        caught[bug] += failed != NULL;
      }
    }
  }
  printf("    %d layers x 6 forwards clean; planted bugs caught in:", runs);
  for (int b = 1; b < CM_BUG_COUNT_LATE; ++b) printf(" %s %d,", cm_bug_names[b], caught[b]);
  printf(" of %d; counting the late sources too: clean\n", runs);
  CHECK(runs >= 100);
  for (int b = 1; b < CM_BUG_COUNT_LATE; ++b) CHECK_MSG(caught[b] > runs / 4, "bug '%s' caught in %d of %d", cm_bug_names[b], caught[b], runs);
  return MM_TEST_PASS;
}

const mm_test unit_suite_combine[] = {
    {"combine.early_order_model", t_combine_model},
    {NULL, NULL},
};
