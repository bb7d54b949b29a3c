/* All-rank barrier over NVLink with a deadline.
 *
 * Rank r signals peer p by storing mm_flag_word(value, error) into slot
 * [value & 1][r] of p's flag array with st.release.sys: everything this rank
 * wrote before (in this or earlier kernels on the stream, to local or peer
 * memory) is visible to p once p's ld.acquire.sys sees the value. Values only
 * grow, so a waiter compares with >= and nothing is ever reset; the two banks
 * (contract.h) make the error bits a waiter reads exactly those of the
 * barrier it waits for. A peer that carries an error code makes this rank
 * record MEGAMOE_ERR_PEER_FAILED (naming the peer and its code); a peer that
 * does not arrive by the deadline makes it record MEGAMOE_ERR_TIMEOUT (after
 * which the ranks are out of step and the layer is dead for good). */
#ifndef MEGAMOE_COMM_BARRIER_CUH
#define MEGAMOE_COMM_BARRIER_CUH

#include "common.cuh"
#include "view.cuh"

MM_DEVICE uint64_t* mm_flag_slot(const mm_layer_view& L, int owner, int bank, int writer) {
  return reinterpret_cast<uint64_t*>(L.peer_sym[owner] + L.offset[MM_SYM_FLAGS]) + bank * MM_MAX_RANKS +
         writer;
}

/* Spins until *flag carries a sequence >= value or the deadline passes.
 * Returns the last word seen; sets *waited_ns, and *timed_out on a timeout. */
MM_DEVICE uint64_t mm_wait_flag(const uint64_t* flag, uint64_t value, uint64_t timeout_ns, int* timed_out,
                                uint64_t* waited_ns) {
  const uint64_t start = mm_globaltimer_ns();
  uint64_t seen;
  *timed_out = 0;
  *waited_ns = 0;
  for (uint32_t spins = 0;; ++spins) {
    /* Relaxed polls, one acquire (comm/wait.cuh, mm_wait_counter_geq; a
     * flag's sequence only grows). */
    seen = mm_ld_relaxed_sys_u64(flag);
    if (mm_flag_arrived(seen, value)) {
      (void)mm_ld_acquire_sys_u64(flag); /* the word seen is returned (its error bits) */
      break;
    }
    if ((spins & 63) == 63) {
      const uint64_t waited = mm_globaltimer_ns() - start;
      if (waited > timeout_ns) {
        *timed_out = 1;
        *waited_ns = waited;
        break;
      }
    }
  }
  return seen;
}

/* Run by threads 0 .. num_ranks-1 of one block (thread p talks to peer p);
 * the caller follows with __syncthreads() if other threads depend on it.
 * value: mm_barrier_value(forward, index). */
MM_DEVICE void mm_barrier_thread(const mm_layer_view& L, mm_device_status* st, uint64_t value,
                                 int site) {
  const int p = threadIdx.x;
  if (p >= L.num_ranks) return;
  /* After a timeout the ranks are out of step: waiting again would only add
   * another full deadline. Every other error keeps the ranks in lockstep. */
  if (mm_dead(st)) return;
  const int code = mm_error_code(st);
  const int bank = (int)(value & 1);
  /* The flag's st.release.sys is the fence: it releases at system scope,
   * cumulatively, this thread's writes and every write ordered before it
   * (the callers' CTA and grid barriers; earlier kernels of the stream are
   * complete). An SC fence in front (__threadfence_system) added only
   * sequential consistency, which this message passing does not need, for
   * ~0.6 us per barrier (docs/PERF.md, nineteenth session). */
  mm_st_release_sys_u64(mm_flag_slot(L, p, bank, L.rank), mm_flag_word(value, code));
  int timed_out = 0;
  uint64_t waited_ns = 0;
  const uint64_t seen = mm_wait_flag(mm_flag_slot(L, L.rank, bank, p), value, L.timeout_ns, &timed_out,
                                     &waited_ns);
  if (timed_out) {
    /* For the message, as barrier numbers: the last barrier the peer reached
     * (the later of its two banks) and the one waited for. */
    const uint64_t other = mm_ld_acquire_sys_u64(mm_flag_slot(L, L.rank, bank ^ 1, p));
    const uint64_t last = max(seen >> MM_FLAG_SEQ_SHIFT, other >> MM_FLAG_SEQ_SHIFT);
    mm_record_error_waited(st, MEGAMOE_ERR_TIMEOUT, site, p, 0, last, value, waited_ns);
  } else if (p != L.rank && mm_flag_error(seen) != 0) {
    mm_record_error(st, MEGAMOE_ERR_PEER_FAILED, site, p, mm_flag_error(seen), seen >> MM_FLAG_SEQ_SHIFT,
                    value);
  }
}

#endif
