/* The per-forward protocol every arm follows on the device (the staged arm
 * in route.cu and combine.cu; the split and fused arms the same way):
 *
 *  - start: ONE thread of the forward's first kernel, before anything of the
 *    forward can read the status record, calls mm_forward_start. It records
 *    the error the host injected into an empty forward (megamoe_forward
 *    rejected its arguments) and, on a dead layer, MEGAMOE_ERR_LAYER_FAILED.
 *    From then on the forward's barriers carry the code to the peers.
 *  - end: EVERY CTA of the forward's last kernel calls mm_forward_end after
 *    its last read of the status record or of the forward number (all
 *    threads of the CTA must reach it: it has a CTA barrier). The last CTA
 *    to arrive writes the error word (0 or this forward's status) and
 *    advances the forward number, so the number is stable while any kernel
 *    of the forward runs and no kernel needs a separate launch for it.
 *
 * Both run on the forward's stream in order, so the next forward's first
 * kernel sees the advanced number (kernel boundaries order global memory). */
#ifndef MEGAMOE_COMM_FORWARD_CUH
#define MEGAMOE_COMM_FORWARD_CUH

#include "comm/wait.cuh"
#include "common.cuh"
#include "view.cuh"

MM_DEVICE void mm_forward_start(mm_device_status* st, int injected_error) {
  if (injected_error != 0) mm_record_error(st, injected_error, MM_SITE_HOST, -1, 0, 0, 0);
  if (mm_dead(st)) mm_record_error(st, MEGAMOE_ERR_LAYER_FAILED, MM_SITE_NONE, -1, 0, 0, 0);
}

/* Called by every thread of every CTA of the forward's last kernel. */
MM_DEVICE void mm_forward_end(const mm_layer_view& L) {
  __syncthreads(); /* the whole CTA is past its reads of the record */
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    mm_device_status* st = mm_status(L);
    const unsigned int ctas = gridDim.x * gridDim.y * gridDim.z;
    /* The arrival releases this CTA's reads (and writes) and, for the last
     * arriver, acquires every CTA's: the update below is ordered after them. */
    if (mm_atom_add_acq_rel_gpu_u32(&st->end_arrivals, 1u) == ctas - 1) {
      const uint64_t next = mm_forward_number(st) + 1;
      *(volatile int32_t*)&st->word = mm_error_code(st);
      *(volatile uint32_t*)&st->end_arrivals = 0u;
      *mm_ws<volatile uint64_t>(L, MM_WS_EPOCH) = next;
      *(volatile uint64_t*)&st->forward = next;
      __threadfence();
    }
  }
}

#endif
