/* A grid barrier for persistent kernels, with the layer's deadline.
 *
 * Every CTA of the grid must be resident at once (a persistent kernel sized
 * to the machine, or a cooperative launch) and every CTA must call it the
 * same number of times; all threads of a CTA call it (it has CTA barriers).
 * It also orders memory: every write any thread of any CTA made before the
 * barrier is visible to every thread of every CTA after it (gpu scope).
 *
 * Protocol (a monotonic arrival count, reusable, no reset):
 *   thread 0 arrives with an acq_rel atomic add on the count and gets the
 *   value before its add, b. Its round is r = b / C (C = CTAs in the grid)
 *   and the round ends when the count reaches (r + 1) C: the arrival that
 *   makes it so (b + 1 = (r + 1) C) is the last and passes at once; the
 *   others spin (relaxed polls, one acquire) until the count is >= that.
 * - r is this CTA's round: the count is a multiple of C whenever no round
 *   is open (every CTA of every kernel that shares the state arrives the
 *   same number of times, and all run C CTAs: contract.h), and no CTA
 *   arrives at round r + 1 before round r ended for it.
 * - Nothing waits for the last arriver's reply: the waiters see the round
 *   end as soon as its add lands in L2 (the generation word this replaced
 *   cost every round a relaxed read before the add, and the last arriver's
 *   reset and release store after it: docs/PERF.md, nineteenth session).
 * - Ordering: the CTA barrier puts every thread's earlier writes before
 *   thread 0's arrival; the arrivals are release RMWs on one word, so each
 *   later value heads a release sequence that contains every earlier
 *   arrival: the waiter's acquire of a value >= (r + 1) C synchronizes with
 *   all C arrivals of round r (and the last arriver's acquire RMW read the
 *   others'); the closing CTA barrier hands that to every thread.
 *
 * A waiter that passes the deadline records MEGAMOE_ERR_TIMEOUT at
 * MM_SITE_GRID_BARRIER (peer -1, seen = CTAs arrived, want = CTAs in the
 * grid, detail = the round waited on, counted from the state's creation,
 * modulo 2^31)
 * and returns false, like every CTA that gives up: no trap, no hang. The
 * state is then inconsistent (a CTA is missing); the caller leaves, and the
 * timeout marks the layer dead (mm_record_error_waited, even in a forward
 * that had already failed).
 * Errors recorded in the status by other roles do not end the wait: after an
 * error, CTAs keep arriving at the grid barriers so they stay in step. */
#ifndef MEGAMOE_COMM_GRID_CUH
#define MEGAMOE_COMM_GRID_CUH

#include "comm/wait.cuh"

/* Diagnostic builds only (-DMM_GRID_SPIN_SLEEP_NS=N): thread 0 sleeps about
 * N ns between its polls of the arrival count. Under compute-sanitizer every
 * poll is instrumented; this tells whether the spinning CTAs slow the one CTA
 * they wait for (docs/RELIABILITY.md, racecheck on split). Off (0) by
 * default: a sleep adds its length to the barrier's latency. */
#ifndef MM_GRID_SPIN_SLEEP_NS
#define MM_GRID_SPIN_SLEEP_NS 0
#endif

/* Thread 0's wait until the count reaches `target` = (r + 1) x ctas, the
 * end of round r (both barrier forms below): 1 when it did (acquired), 0
 * when the abort flag was set or the deadline passed (recorded in
 * ctx.status as MEGAMOE_ERR_TIMEOUT at MM_SITE_GRID_BARRIER: peer -1,
 * detail = r mod 2^31, seen = CTAs arrived in round r (< ctas: a round that
 * ended by the last read passes), want = ctas). */
MM_DEVICE int mm_grid_spin_round(mm_grid_barrier_state* gb, uint64_t target, uint32_t ctas, const mm_wait_ctx& ctx) {
  const mm_deadline d = mm_deadline_start(ctx.timeout_ns);
  for (uint32_t spin = 1;; ++spin) {
    /* Relaxed polls, one acquire (comm/wait.cuh, mm_wait_counter_geq). */
    if (mm_ld_relaxed_gpu_u64(&gb->arrivals) >= target) {
      (void)mm_ld_acquire_gpu_u64(&gb->arrivals);
      return 1;
    }
    if (MM_GRID_SPIN_SLEEP_NS) __nanosleep(MM_GRID_SPIN_SLEEP_NS);
    if ((spin & 31u) == 0) {
      if (ctx.abort_flag && *ctx.abort_flag) return 0;
      if (mm_deadline_passed(d)) {
        /* One last read decides: a round that ended meanwhile passed (and
         * its count would give seen >= ctas); else seen < ctas holds. */
        const uint64_t now = mm_ld_acquire_gpu_u64(&gb->arrivals);
        if (now >= target) return 1;
        if (ctx.status) {
          const uint64_t round_start = target - ctas;
          /* The round modulo 2^31: detail is an int32 (a layer reaches 2^31
           * rounds after some 400 million forwards). */
          mm_record_error_waited(ctx.status, MEGAMOE_ERR_TIMEOUT, MM_SITE_GRID_BARRIER, -1,
                                 (int)((round_start / ctas) & 0x7fffffffu), now - round_start, ctas,
                                 mm_globaltimer_ns() - d.start_ns);
        }
        return 0;
      }
    }
  }
}

/* Thread 0's arrival: the count its round must reach, and whether this
 * arrival was the one that reached it. */
MM_DEVICE uint64_t mm_grid_arrive_thread(mm_grid_barrier_state* gb, uint32_t ctas, bool* last) {
  const uint64_t before = mm_atom_add_acq_rel_gpu_u64(&gb->arrivals, 1u);
  const uint64_t target = (before / ctas + 1) * ctas;
  *last = before + 1 == target;
  return target;
}

/* The grid barrier above. ctx: the status record (may be NULL: nothing is
 * recorded), the deadline, and an optional abort flag (another role gave up:
 * return false at once, nothing recorded); ctx.site is ignored. */
MM_DEVICE bool mm_grid_barrier(mm_grid_barrier_state* gb, const mm_wait_ctx& ctx) {
  __syncthreads(); /* every thread's earlier writes precede thread 0's arrival */
  int passed = 1; /* thread 0's answer; the other threads vote 1 */
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const uint32_t ctas = gridDim.x * gridDim.y * gridDim.z;
    bool last;
    const uint64_t target = mm_grid_arrive_thread(gb, ctas, &last);
    if (!last) passed = mm_grid_spin_round(gb, target, ctas, ctx);
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
 * mm_grid_arrive: every thread of the CTA. Returns the count that ends the
 * round (thread 0's; the other threads get 0) and sets *last in every
 * thread of the one CTA whose arrival completed the round: that CTA has
 * acquired every CTA's arrival (so their earlier writes). Every other CTA
 * must pass mm_grid_wait_round for the round before its next arrival (the
 * protocol's "no CTA arrives at round r + 1 before round r ended for it"). */
MM_DEVICE uint64_t mm_grid_arrive(mm_grid_barrier_state* gb, bool* last) {
  __syncthreads(); /* every thread's earlier writes precede thread 0's arrival */
  uint64_t target = 0;
  int completed = 0;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    bool was_last;
    target = mm_grid_arrive_thread(gb, gridDim.x * gridDim.y * gridDim.z, &was_last);
    completed = was_last;
  }
  /* bar.red orders memory as bar.sync does: it hands thread 0's acquire to the CTA. */
  *last = __syncthreads_or(completed) != 0;
  return target;
}

/* The waiting half, every thread of the CTA: thread 0 spins until the count
 * reaches `target` (mm_grid_arrive's; acquire), with mm_grid_barrier's
 * deadline, abort flag and timeout record. True when the round completed. */
MM_DEVICE bool mm_grid_wait_round(mm_grid_barrier_state* gb, uint64_t target, const mm_wait_ctx& ctx) {
  int passed = 1; /* thread 0's answer; the other threads vote 1 */
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
    passed = mm_grid_spin_round(gb, target, gridDim.x * gridDim.y * gridDim.z, ctx);
  return __syncthreads_and(passed) != 0;
}

#endif
