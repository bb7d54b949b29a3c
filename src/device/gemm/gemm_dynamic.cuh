/* Dynamic tile scheduling for the persistent arms' GEMMs: the CTA's producer
 * thread claims tiles from a grid-wide counter (atomicAdd) instead of taking
 * tiles blockIdx.x, blockIdx.x + gridDim.x, ...; a CTA that runs fast takes
 * more tiles, so the GEMM's tail is at most one tile long instead of the
 * spread between the fastest and the slowest SM (40-110 us measured at 8192
 * tokens per rank with the static order: docs/PERF.md, split arm v2).
 *
 * The claimed ids travel to the other roles through a ring of
 * MM_GEMM_TILE_RING ids in shared memory (gemm_cfg.cuh, control block):
 *   producer: wait tile_empty[s] (every reader done with the id there),
 *             write the id, arrive tile_full[s] (release);
 *   readers:  every math warp and, in the L2 kernel, every copy warp: wait
 *             tile_full[s] (acquire), read, lane 0 arrives tile_empty[s].
 * Id -1 ends the sequence (no tile left). The producer claims and publishes
 * the next id before it issues the current tile's loads, so a reader finds
 * its next id waiting. Ids one CTA claims only grow, so the scheduler's
 * cursor (sched.seek) still only moves forward.
 *
 * The counter is zeroed by the arm before the grid barrier that precedes the
 * GEMM (kernel 1's phase A for both GEMMs of the split arm). Every wait has
 * the pipeline's deadline and gives up on the abort word (mm_gemm_wait). */
#ifndef MEGAMOE_GEMM_DYNAMIC_CUH
#define MEGAMOE_GEMM_DYNAMIC_CUH

#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_kernel.cuh"

/* The ring's protocol for any entry type (slots: MM_GEMM_TILE_RING entries
 * in shared memory; the tile ids here, the fused arm's decoded tasks).
 * Producer side: publishes v as the j-th entry. False when it gave up. */
template <class T>
MM_DEVICE bool mm_gemm_ring_publish(const mm_gemm_smem& sm, const mm_gemm_problem& p, uint32_t j, T* slots,
                                    const T& v) {
  const uint32_t s = j % MM_GEMM_TILE_RING, parity = (j / MM_GEMM_TILE_RING) & 1u;
  if (!mm_gemm_wait(sm, sm.tile_empty + 8 * s, parity ^ 1u, p)) return false;
  slots[s] = v;
  mm_mbar_arrive(sm.tile_full + 8 * s);
  return true;
}

/* Reader side, every thread of a reading warp: the j-th entry into *out
 * (untouched when the wait gave up). False when it gave up in any lane: one
 * answer per warp, since each lane waits on its own and a partial give-up
 * would split the warp before the aligned barriers that follow. */
template <class T>
MM_DEVICE bool mm_gemm_ring_read(const mm_gemm_smem& sm, const mm_gemm_problem& p, uint32_t j, const T* slots,
                                 T* out) {
  const uint32_t s = j % MM_GEMM_TILE_RING, parity = (j / MM_GEMM_TILE_RING) & 1u;
  const bool ok = __all_sync(0xffffffffu, mm_gemm_wait(sm, sm.tile_full + 8 * s, parity, p));
  if (ok) *out = slots[s];
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mm_mbar_arrive(sm.tile_empty + 8 * s);
  return ok;
}

/* The tile ids: t as the j-th id; the j-th id into *t (-1 when it gave up). */
MM_DEVICE bool mm_gemm_publish_tile_id(const mm_gemm_smem& sm, const mm_gemm_problem& p, uint32_t j, int t) {
  return mm_gemm_ring_publish(sm, p, j, const_cast<int32_t*>(sm.tile_ids), (int32_t)t);
}
MM_DEVICE bool mm_gemm_read_tile_id(const mm_gemm_smem& sm, const mm_gemm_problem& p, uint32_t j, int* t) {
  *t = -1;
  return mm_gemm_ring_read(sm, p, j, const_cast<const int32_t*>(sm.tile_ids), t);
}

/* The producer thread: claims, publishes, loads, until no tile is left or a
 * wait gives up. first_issued: as mm_gemm_producer_loop. */
template <class Cfg, class Sched>
MM_DEVICE void mm_gemm_producer_loop_dynamic(const mm_gemm_smem& sm, const Sched& sched, int32_t* counter,
                                             const CUtensorMap* tm_a, const CUtensorMap* tm_b,
                                             const CUtensorMap* tm_sfa, const mm_gemm_problem& p,
                                             uint64_t* first_issued = nullptr) {
  mm_gemm_pipe pipe = {0u, 0u};
  typename Sched::iter it = sched.begin();
  const int total = sched.total();
  int next = atomicAdd(counter, 1);
  if (!mm_gemm_publish_tile_id(sm, p, 0, next < total ? next : -1)) return;
  for (uint32_t j = 0; next < total; ++j) {
    const int t = next;
    next = atomicAdd(counter, 1);
    if (!mm_gemm_publish_tile_id(sm, p, j + 1, next < total ? next : -1)) return;
    mm_gemm_tile_info ti;
    sched.template seek<Cfg>(it, t, ti);
    if (!mm_gemm_produce_tile<Cfg>(sm, pipe, tm_a, tm_b, tm_sfa, p, ti)) return;
    if (first_issued) {
      mm_tl_store(first_issued, mm_globaltimer_ns());
      first_issued = nullptr;
    }
  }
}

/* The math warpgroups' loop over the claimed tiles (as mm_gemm_math_loop:
 * store(ti, acc, last) with last = false, abandon() when a vote fails). Its
 * one-partial tiles probe the next stage early (mm_gemm_consume_tile_1p's
 * kEarlyProbe: measured faster in the split arm's kernels, the users of this
 * loop; the fused kernel asks for it in its own loop). */
template <class Cfg, class Sched, class Store, class Abandon>
MM_DEVICE void mm_gemm_math_loop_dynamic(const mm_gemm_smem& sm, const Sched& sched, const mm_gemm_problem& p,
                                         int wg, Store&& store, Abandon&& abandon) {
  mm_gemm_pipe pipe = {0u, 0u};
  typename Sched::iter it = sched.begin();
  for (uint32_t j = 0;; ++j) {
    int t;
    const bool got = mm_gemm_read_tile_id(sm, p, j, &t);
    /* One decision for the 256 math threads (a wait that gave up in some). */
    if (!mm_gemm_math_vote_ok(sm, got)) {
      abandon();
      return;
    }
    if (t < 0) return;
    mm_gemm_tile_info ti;
    sched.template seek<Cfg>(it, t, ti);
    float acc[Cfg::kWaves][64];
    const bool mine = mm_gemm_consume_tile<Cfg, true>(sm, pipe, p, ti, wg, acc);
    if (!mm_gemm_math_vote_ok(sm, mine)) {
      abandon();
      return;
    }
    store(ti, acc, false);
  }
}

/* The copy warps' tiles in the dynamic order: mm_gemm_copy_loop's next_tile. */
template <class Cfg, class Sched>
struct mm_gemm_copy_next_dynamic {
  const mm_gemm_smem& sm;
  const Sched& sched;
  const mm_gemm_problem& p;
  typename Sched::iter it;
  uint32_t j;
  MM_DEVICE mm_gemm_copy_next_dynamic(const mm_gemm_smem& sm_, const Sched& sched_, const mm_gemm_problem& p_)
      : sm(sm_), sched(sched_), p(p_), it(sched_.begin()), j(0) {}
  /* 1: a tile in ti; 0: none left; -1: a wait gave up. */
  MM_DEVICE int operator()(mm_gemm_tile_info& ti) {
    int t;
    if (!mm_gemm_read_tile_id(sm, p, j++, &t)) return -1;
    if (t < 0) return 0;
    sched.template seek<Cfg>(it, t, ti);
    return 1;
  }
};

#endif
