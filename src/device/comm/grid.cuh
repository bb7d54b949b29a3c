/* A grid barrier for persistent kernels, with the layer's deadline.
 *
 * Every CTA of the grid must be resident at once (a persistent kernel sized
 * to the machine, or a cooperative launch) and every CTA must call it the
 * same number of times; all threads of a CTA call it (it has CTA barriers).
 * It also orders memory: every write any thread of any CTA made before the
 * barrier is visible to every thread of every CTA after it (gpu scope).
 *
 * Protocol (generation based, reusable, no reset race):
 *   thread 0 reads the generation g, then arrives with an acq_rel atomic add.
 *   The last arriver stores arrived = 0 and then releases generation g + 1;
 *   the others spin (acquire) until the generation differs from g.
 * - g is current when read: the generation only moves once every CTA has
 *   arrived, this one included, and this CTA saw (or made) the previous move.
 * - The reset cannot race with the next round: a CTA arrives at round g + 1
 *   only after acquiring generation g + 1, which the last arriver released
 *   after its store of 0 (and the last arriver itself stored 0 first).
 * - Ordering: the CTA barrier puts every thread's earlier writes before
 *   thread 0's arrival; each arrival (acq_rel RMW on one word) reads from the
 *   previous one, so the last arriver has acquired all of them, and its
 *   release of the generation is cumulative; the waiters' acquire followed
 *   by the closing CTA barrier hands that to all their threads.
 *
 * A waiter that passes the deadline records MEGAMOE_ERR_TIMEOUT at
 * MM_SITE_GRID_BARRIER (peer -1, seen = CTAs arrived, want = CTAs in the
 * grid, detail = the generation waited on) and returns false, like every CTA
 * that gives up: no trap, no hang. The state is then inconsistent (a CTA is
 * missing); the caller leaves, and a layer that saw it is dead (timeout).
 * Errors recorded in the status by other roles do not end the wait: after an
 * error, CTAs keep arriving at the grid barriers so they stay in step. */
#ifndef MEGAMOE_COMM_GRID_CUH
#define MEGAMOE_COMM_GRID_CUH

#include "comm/wait.cuh"

/* Thread 0's wait for the round after generation `gen` (both barrier forms
 * below): 1 when the generation moved (acquired), 0 when the abort flag was
 * set or the deadline passed (recorded in ctx.status as MEGAMOE_ERR_TIMEOUT
 * at MM_SITE_GRID_BARRIER: peer -1, detail = gen, seen = CTAs arrived, want
 * = ctas). */
MM_DEVICE int mm_grid_spin_round(mm_grid_barrier_state* gb, uint32_t gen, uint32_t ctas, const mm_wait_ctx& ctx) {
  const mm_deadline d = mm_deadline_start(ctx.timeout_ns);
  for (uint32_t spin = 1;; ++spin) {
    /* Relaxed polls, one acquire (comm/wait.cuh, mm_wait_counter_geq). */
    if (mm_ld_relaxed_gpu_u32(&gb->generation) != gen) {
      (void)mm_ld_acquire_gpu_u32(&gb->generation);
      return 1;
    }
    if ((spin & 31u) == 0) {
      if (ctx.abort_flag && *ctx.abort_flag) return 0;
      if (mm_deadline_passed(d)) {
        if (ctx.status)
          mm_record_error_waited(ctx.status, MEGAMOE_ERR_TIMEOUT, MM_SITE_GRID_BARRIER, -1, (int)gen,
                                 mm_ld_relaxed_gpu_u32(&gb->arrived), ctas, mm_globaltimer_ns() - d.start_ns);
        return 0;
      }
    }
  }
}

/* The grid barrier above. ctx: the status record (may be NULL: nothing is
 * recorded), the deadline, and an optional abort flag (another role gave up:
 * return false at once, nothing recorded); ctx.site is ignored. */
MM_DEVICE bool mm_grid_barrier(mm_grid_barrier_state* gb, const mm_wait_ctx& ctx) {
  __syncthreads(); /* every thread's earlier writes precede thread 0's arrival */
  int passed = 1; /* thread 0's answer; the other threads vote 1 */
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const uint32_t ctas = gridDim.x * gridDim.y * gridDim.z;
    const uint32_t gen = mm_ld_relaxed_gpu_u32(&gb->generation);
    const uint32_t before = mm_atom_add_acq_rel_gpu_u32(&gb->arrived, 1u);
    if (before + 1 == ctas) {
      mm_st_relaxed_gpu_u32(&gb->arrived, 0u);
      mm_st_release_gpu_u32(&gb->generation, gen + 1);
    } else {
      passed = mm_grid_spin_round(gb, gen, ctas, ctx);
    }
  }
  /* A CTA barrier that also hands thread 0's answer to every thread (bar.red
   * orders memory as bar.sync does): it hands thread 0's acquire to the CTA.
   * No shared word carries the answer, so nothing is reused across calls. */
  return __syncthreads_and(passed) != 0;
}

/* The grid barrier in two halves, for a CTA that has work to do between
 * its arrival and the round's end (the early combine, route_phases.cuh).
 * The same protocol and ordering as mm_grid_barrier.
 *
 * mm_grid_arrive: every thread of the CTA. Returns the round's generation
 * (thread 0's; the other threads get 0) and sets *last in every thread of
 * the one CTA whose arrival completed the round: that CTA has acquired
 * every CTA's arrival (so their earlier writes) and has already moved the
 * generation. Every other CTA must pass mm_grid_wait_round for the round
 * before its next arrival (the protocol's "this CTA saw the previous
 * move"). */
MM_DEVICE uint32_t mm_grid_arrive(mm_grid_barrier_state* gb, bool* last) {
  __syncthreads(); /* every thread's earlier writes precede thread 0's arrival */
  uint32_t gen = 0;
  int completed = 0;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const uint32_t ctas = gridDim.x * gridDim.y * gridDim.z;
    gen = mm_ld_relaxed_gpu_u32(&gb->generation);
    const uint32_t before = mm_atom_add_acq_rel_gpu_u32(&gb->arrived, 1u);
    if (before + 1 == ctas) {
      mm_st_relaxed_gpu_u32(&gb->arrived, 0u);
      mm_st_release_gpu_u32(&gb->generation, gen + 1);
      completed = 1;
    }
  }
  /* bar.red orders memory as bar.sync does: it hands thread 0's acquire to the CTA. */
  *last = __syncthreads_or(completed) != 0;
  return gen;
}

/* The waiting half, every thread of the CTA: thread 0 spins until the
 * generation moved past `gen` (acquire), with mm_grid_barrier's deadline,
 * abort flag and timeout record. True when the round completed. */
MM_DEVICE bool mm_grid_wait_round(mm_grid_barrier_state* gb, uint32_t gen, const mm_wait_ctx& ctx) {
  int passed = 1; /* thread 0's answer; the other threads vote 1 */
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
    passed = mm_grid_spin_round(gb, gen, gridDim.x * gridDim.y * gridDim.z, ctx);
  return __syncthreads_and(passed) != 0;
}

#endif
