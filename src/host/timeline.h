/* The persistent arms' in-kernel timeline, a diagnostic (contract.h,
 * mm_timeline_event): a split or fused layer created with MEGAMOE_TIMELINE=1
 * in the environment has every CTA of its kernels stamp %globaltimer at each
 * event (and the fused arm sum its waits);
 * each forward overwrites the stamps. The layer benchmark prints them
 * (where the time of a forward goes, per role). Not part of the public API.
 *
 * MEGAMOE_TIMELINE=mapped puts the stamps in mapped pinned host memory
 * instead (the kernels store them with system scope), so the host can read
 * them while a kernel still runs: with MEGAMOE_TIMELINE_WATCH=S (seconds) as
 * well, a thread of the layer prints to stderr where each CTA stands (its
 * latest stamp) every S seconds when that changed (and every
 * MM_TL_WATCH_REPEAT samples when not), with the seconds since create:
 * "megamoe: timeline watch (rank R, T s[, unchanged]): <groups>". For a kernel that never
 * ends, e.g. under a sanitizer, where no CUDA call returns until it does. */
#ifndef MEGAMOE_TIMELINE_H
#define MEGAMOE_TIMELINE_H

#include <stddef.h>
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

/* The name of event e as the benchmark prints it; NULL for the raw clock
 * readings and out of range. */
const char* mm_timeline_event_name(int e);

/* One line on the CTAs of a timeline snapshot tl[ctas][MM_TL_EVENTS] (at
 * most MM_TL_MAX_CTAS are read): the CTAs grouped by their latest stamp (the
 * event; "never stamped" last), in event order, with their CTA ids where a
 * group has at most MM_TL_WATCH_NAMED (and for a group of at most MM_TL_WATCH_DETAIL, each
 * CTA's last MM_TL_WATCH_RECENT stamps of its current forward in time
 * order), and with_ages: each group's range of ages before the newest stamp.
 * Returns the length written (at most cap - 1; cut short to fit). Pure: the
 * watch's text, unit-tested. */
#define MM_TL_WATCH_NAMED 16
#define MM_TL_WATCH_DETAIL 2
#define MM_TL_WATCH_RECENT 4
#define MM_TL_WATCH_LINE 4096
size_t mm_timeline_watch_summary(const uint64_t* tl, int ctas, int with_ages, char* out, size_t cap);

/* The watch thread over mapped stamps (MEGAMOE_TIMELINE_WATCH): NULL when
 * the arguments are out of range (the period in [MM_TL_WATCH_MIN_S,
 * MM_TL_WATCH_MAX_S] seconds) or the thread could not start. Stop joins it
 * (NULL: nothing). */
#define MM_TL_WATCH_MIN_S 0.001
#define MM_TL_WATCH_REPEAT 10 /* an unchanged line is printed again after this many samples */
#define MM_TL_WATCH_MAX_S 86400.0
typedef struct mm_timeline_watch mm_timeline_watch;
mm_timeline_watch* mm_timeline_watch_start(const volatile uint64_t* tl, int ctas, int rank, double period_s);
void mm_timeline_watch_stop(mm_timeline_watch* w);

#endif
