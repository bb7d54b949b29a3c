/* All-rank barrier over NVLink with a deadline.
 *
 * Rank r signals peer p by storing (value << 8 | error) into slot r of p's
 * flag array with st.release.sys: everything this rank wrote before (in this
 * or earlier kernels on the stream, to local or peer memory) is visible to p
 * once p's ld.acquire.sys sees the value. Values only grow, so a waiter
 * compares with >= and nothing is ever reset. A peer that carries an error
 * code makes this rank record MEGAMOE_ERR_PEER_FAILED; a peer that does not
 * arrive by the deadline makes it record MEGAMOE_ERR_TIMEOUT (after which the
 * ranks are out of step and the layer is failed for good). */
#ifndef MEGAMOE_COMM_BARRIER_CUH
#define MEGAMOE_COMM_BARRIER_CUH

#include "common.cuh"
#include "view.cuh"

MM_DEVICE uint64_t* mm_flag_slot(const mm_layer_view& L, int owner, int writer) {
  return reinterpret_cast<uint64_t*>(L.peer_sym[owner] + L.offset[MM_SYM_FLAGS]) + writer;
}

/* Spins until *flag carries a sequence >= value or the deadline passes.
 * Returns the last value seen; sets *timed_out. */
MM_DEVICE uint64_t mm_wait_flag(const uint64_t* flag, uint64_t value, uint64_t timeout_ns,
                                int* timed_out) {
  const uint64_t start = mm_globaltimer_ns();
  uint64_t seen;
  *timed_out = 0;
  for (uint32_t spins = 0;; ++spins) {
    seen = mm_ld_acquire_sys_u64(flag);
    if ((seen >> MM_FLAG_SEQ_SHIFT) >= value) break;
    if ((spins & 63) == 63 && mm_globaltimer_ns() - start > timeout_ns) {
      *timed_out = 1;
      break;
    }
  }
  return seen;
}

/* Run by threads 0 .. num_ranks-1 of one block (thread p talks to peer p);
 * the caller follows with __syncthreads() if other threads depend on it. */
MM_DEVICE void mm_barrier_thread(const mm_layer_view& L, mm_device_status* st, uint64_t value,
                                 int site) {
  const int p = threadIdx.x;
  if (p >= L.num_ranks) return;
  const int code = *(volatile int32_t*)&st->code;
  /* After a timeout the ranks are out of step: waiting again would only add
   * another full deadline. Other errors keep the ranks in lockstep. */
  if (code == MEGAMOE_ERR_TIMEOUT) return;
  __threadfence_system();
  mm_st_release_sys_u64(mm_flag_slot(L, p, L.rank),
                        (value << MM_FLAG_SEQ_SHIFT) | ((uint64_t)code & MM_FLAG_ERR_MASK));
  int timed_out = 0;
  const uint64_t seen = mm_wait_flag(mm_flag_slot(L, L.rank, p), value, L.timeout_ns, &timed_out);
  if (timed_out) {
    mm_record_error(st, MEGAMOE_ERR_TIMEOUT, site, p, 0, seen, value << MM_FLAG_SEQ_SHIFT);
  } else if ((seen >> MM_FLAG_SEQ_SHIFT) == value && (seen & MM_FLAG_ERR_MASK) != 0) {
    mm_record_error(st, MEGAMOE_ERR_PEER_FAILED, site, p, (int)(seen & MM_FLAG_ERR_MASK), seen,
                    value << MM_FLAG_SEQ_SHIFT);
  }
}

#endif
