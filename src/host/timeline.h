/* The persistent arms' in-kernel timeline, a diagnostic (contract.h,
 * mm_timeline_event): a split or fused layer created with MEGAMOE_TIMELINE=1
 * in the environment has every CTA of its kernels stamp %globaltimer at each
 * event (and the fused arm sum its waits);
 * each forward overwrites the stamps. The layer benchmark prints them
 * (where the time of a forward goes, per role). Not part of the public API. */
#ifndef MEGAMOE_TIMELINE_H
#define MEGAMOE_TIMELINE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "contract.h"
#include "megamoe.h"

/* Copies the last forward's stamps: host [ctas][MM_TL_EVENTS] (ns; 0 = the
 * CTA did not reach the event), *ctas the number of CTAs (<= max_ctas), with
 * each CTA's MM_TL_SM_KHZ computed from its clock readings. Synchronous; call
 * once the forward's stream work has completed (megamoe_sync, or an event
 * recorded after the forward and synchronized). */
megamoe_status mm_layer_timeline(const megamoe_layer* layer, uint64_t* host, int max_ctas, int* ctas);

/* Zeroes the stamps on `stream` (before a forward whose timeline is read:
 * an event a CTA does not reach in that forward, e.g. one stamped only in
 * some calls, would otherwise keep an earlier forward's stamp). */
megamoe_status mm_layer_timeline_clear(const megamoe_layer* layer, cudaStream_t stream);

#endif
