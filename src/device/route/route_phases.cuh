/* The routing phases of the persistent arms (split kernel 1, the fused
 * kernel): every CTA of a cooperative grid of one CTA per SM runs
 *
 *   A  start the forward (CTA 0); validate the top-k ids and count this
 *      rank's slots per expert (CTA-strided); clear the arm's counters
 *                                                                grid barrier
 *   B  publish each expert's routed list to its rank; the fused arm's CTA 0
 *      also writes (T, bound) of this call into slot `rank` of every rank's
 *      call table (MM_SYM_CALL_TOKENS)                            grid barrier
 *      (Up to 32 x MM_ROUTE_BATCH x warps slots, 12288 with 12 warps:
 *      mm_route_one_scan, B runs inside A: each CTA scans every slot itself
 *      instead of reading the counts, one barrier less.)
 *   C  CTA 0: all-rank barrier 0 (routing published); the fused arm's
 *      num_tokens_bound verdict on the call table; the pool layout
 *                                                                grid barrier
 *
 * The call table is written in phase B like the route counts and read after
 * barrier 0 like them, so DESIGN.md section 5's argument covers it: a peer
 * writes forward n + 1's entry only after barrier 1 of forward n, which this
 * rank signals after its phase C of forward n. */
#ifndef MEGAMOE_ROUTE_PHASES_CUH
#define MEGAMOE_ROUTE_PHASES_CUH

#include "comm/barrier.cuh"
#include "comm/forward.cuh"
#include "comm/grid.cuh"
#include "comm/wait.cuh"
#include "fused.h"
#include "route/route.cuh"
#include "timeline.cuh"
#include "view.cuh"

/* The grid barriers of the persistent arms wait twice the layer's deadline:
 * CTA 0 may spend a whole deadline in an all-rank barrier while the other
 * CTAs wait for it, and the peer that did not arrive (not the grid barrier)
 * must be what is recorded. */
MM_DEVICE mm_wait_ctx mm_persistent_grid_ctx(const mm_layer_view& L) {
  mm_wait_ctx c;
  c.status = mm_status(L);
  c.timeout_ns = 2 * L.timeout_ns;
  c.site = MM_SITE_GRID_BARRIER;
  c.abort_flag = nullptr;
  return c;
}

/* What an arm adds to the routing phases. */
typedef struct mm_route_hooks {
  int32_t* clear;        /* [clear_count] int32 zeroed in phase A, CTA-strided, or NULL: the split arm's
                            rows-ready counters, the fused arm's counter bank of the NEXT forward */
  int32_t clear_count;
  int32_t capacity;      /* virtual rows the pool layout may take (mm_pool_layout_cta_cap) */
  int32_t capacity_site; /* MM_SITE_POOL (split) or MM_SITE_RING (fused) */
  int32_t has_call;      /* fused arm: publish `call` in phase B, judge every rank's in phase C */
  mm_call_tokens call;   /* this rank's (num_tokens, num_tokens_bound) as passed (bound 0: T_max) */
} mm_route_hooks;

/* The fused arm's num_tokens_bound verdict (fused.h, docs/FUSED.md section
 * 9), by one thread of CTA 0 after barrier 0: every rank judges the same
 * table, so every rank records the same status naming the same rank. Skipped
 * when the forward already failed (a peer's host rejection arrives in
 * barrier 0's flags, and the ranks report PEER_FAILED as for any error). */
MM_DEVICE void mm_fused_judge_bound(const mm_layer_view& L, mm_device_status* st) {
  if (mm_failed(st)) return;
  /* Written by the peers before their barrier-0 release, which warp 0
   * acquired before the CTA barrier the caller passed. */
  const mm_call_tokens* table = mm_sym<mm_call_tokens>(L, L.rank, MM_SYM_CALL_TOKENS);
  mm_bound_verdict v;
  if (mm_fused_bound_violation(table, L.num_ranks, L.max_tokens, &v))
    mm_record_error(st, MEGAMOE_ERR_TOO_MANY_TOKENS, MM_SITE_TOKEN_BOUND, v.rank, v.differs, (uint64_t)v.value,
                    (uint64_t)v.bound);
}

/* 16-byte loads each thread of phase A's copy issues before its first
 * store: phase A is bound by the copy (39 us for 8192 x 4096 bytes on an
 * H100 with one load in flight, ~1.9 TB/s read + write; 30.5 us with four:
 * docs/PERF.md, thirty-fifth and thirty-seventh sessions). */
#ifndef MM_ROUTE_COPY_BATCH /* overridable for an A/B against one load in flight (1) */
#define MM_ROUTE_COPY_BATCH 4
#endif

/* Phase B takes each warp's count of its chunk from phase A (the same CTA
 * counted the same expert over the same chunks, and shared memory outlives
 * the grid barrier) instead of scanning the chunk again before writing its
 * entries: one scan of the T*K slots less per expert (phase B 25.4 -> 20.6
 * us at 8192 tokens on an H100; docs/PERF.md, thirty-seventh session). The
 * counts live in the scratch from int 64 on (the scans use its first 32),
 * MM_ROUTE_KEEP_MAX at most (experts per CTA x warps); past that, phase B
 * scans again. */
#ifndef MM_ROUTE_KEEP_MAX /* a test build with 0 forces phase B's second scan */
#define MM_ROUTE_KEEP_MAX 1024
#endif

/* The kept counts of this CTA's k-th expert, or NULL: phase B scans again.
 * CTA-uniform; computed again in each phase (a value live across the
 * phases moved ptxas's spills into the fused math loop). */
MM_DEVICE int* mm_route_kept(const mm_layer_view& L, int* scratch, int k) {
  const int warps = (int)blockDim.x >> 5;
  if ((L.num_experts + (int)gridDim.x - 1) / (int)gridDim.x * warps > MM_ROUTE_KEEP_MAX) return nullptr;
  return scratch + 64 + k * warps;
}

/* Phase A's copy of n bytes from src to dst over every thread of the grid:
 * 16 bytes at a time where both ends allow it (the staging region always
 * does; x has no alignment requirement). */
MM_DEVICE void mm_grid_copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n) {
  const int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
    const int64_t vecs = n / 16;
    int64_t i = i0;
    for (; i + (MM_ROUTE_COPY_BATCH - 1) * stride < vecs; i += MM_ROUTE_COPY_BATCH * stride) {
      uint4 v[MM_ROUTE_COPY_BATCH];
#pragma unroll
      for (int b = 0; b < MM_ROUTE_COPY_BATCH; ++b) v[b] = __ldg(reinterpret_cast<const uint4*>(src) + i + b * stride);
#pragma unroll
      for (int b = 0; b < MM_ROUTE_COPY_BATCH; ++b) reinterpret_cast<uint4*>(dst)[i + b * stride] = v[b];
    }
    for (; i < vecs; i += stride)
      reinterpret_cast<uint4*>(dst)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
    for (int64_t j = vecs * 16 + i0; j < n; j += stride) dst[j] = src[j];
  } else {
    for (int64_t i = i0; i < n; i += stride) dst[i] = src[i];
  }
}

/* What phase B publishes besides the routed lists, by CTA 0: the fused
 * arm's call table entry, and this call's combine order for the expert
 * ranks' copy warps. Both are read after barrier 0, like the route counts,
 * and rewritten in forward n + 1 only after barrier 1 of n, which the
 * readers pass after their last read. */
MM_DEVICE void mm_route_publish_call(const mm_layer_view& L, const mm_forward_view& F, const mm_route_hooks& h) {
  if (blockIdx.x != 0 || (int)threadIdx.x >= L.num_ranks) return;
  if (h.has_call) mm_sym<mm_call_tokens>(L, (int)threadIdx.x, MM_SYM_CALL_TOKENS)[L.rank] = h.call;
  if (MM_EARLY_COMBINE) mm_sym<int32_t>(L, (int)threadIdx.x, MM_SYM_COMBINE_ORDER)[L.rank] = F.early_combine != 0;
}

/* Phases A-C, all threads of every CTA. False when a grid barrier gave up
 * (deadline): the caller skips to the end of the forward. scratch:
 * 64 + MM_ROUTE_KEEP_MAX ints of shared memory (the scans' 33, then the
 * kept counts; both callers pass their pipeline's stage memory, tens of
 * KB, and assert its size). */
MM_DEVICE bool mm_route_phases(const mm_layer_view& L, const mm_forward_view& F, const mm_route_hooks& h,
                               int* scratch) {
  mm_device_status* st = mm_status(L);
  mm_grid_barrier_state* gb = mm_ws<mm_grid_barrier_state>(L, MM_WS_GRID_BARRIER);
  const mm_wait_ctx gctx = mm_persistent_grid_ctx(L);
  const int nthreads = blockDim.x;
  /* A: start (one thread, before anything reads this forward's errors: the
   * others read them only after the first grid barrier; the one-scan path
   * reads only `dead`, which mm_forward_start never writes), validation,
   * counts, counters. */
  if (blockIdx.x == 0 && threadIdx.x == 0) mm_forward_start(st, F.injected_error);
  if (threadIdx.x == 0) {
    mm_tl_stamp(L, MM_TL_K1_START);
    /* This CTA's durations back to 0: its roles (and the split arm's kernel
     * 2, launched after this kernel) add only after the grid barriers below. */
    mm_tl_zero_durations(L);
    mm_tl_clock_start(L);
  }
  const int64_t slots = (int64_t)F.num_tokens * L.top_k;
  for (int64_t i = (int64_t)blockIdx.x * nthreads + threadIdx.x; i < slots; i += (int64_t)gridDim.x * nthreads)
    mm_route_validate(L, F, i, i + 1);
  /* Up to one batch per warp (mm_route_one_scan): phases A and B in one
   * (every CTA reads all slots in one round trip and publishes its experts
   * at once; one grid barrier less).
   * `failed` is then what the status record holds after phase A's barrier:
   * the host's injected error, a dead layer, or a bad index (which every
   * CTA's scan sees, and the validation above records). */
  const bool one_scan = mm_route_one_scan(F, L.top_k);
  if (one_scan) {
    const bool failed = F.injected_error != 0 || mm_dead(st);
    for (int e = blockIdx.x; e < L.num_experts; e += gridDim.x)
      mm_route_publish_expert_scanned(L, F, e, failed, scratch);
    mm_route_publish_call(L, F, h);
  } else {
    for (int e = blockIdx.x, k = 0; e < L.num_experts; e += gridDim.x, ++k)
      mm_route_count_expert(L, F, e, scratch, mm_route_kept(L, scratch, k));
  }
  for (int i = blockIdx.x * nthreads + threadIdx.x; i < h.clear_count; i += gridDim.x * nthreads) h.clear[i] = 0;
  /* The early combine's arrival counters of this call's tokens: the expert
   * ranks add to them only after barrier 0, whose release (after the grid
   * barriers below) is cumulative over these stores. */
  if (MM_EARLY_COMBINE && F.early_combine) {
    int32_t* arrived = mm_sym<int32_t>(L, L.rank, MM_SYM_COMBINE_ARRIVED);
    const int64_t n = (int64_t)F.num_tokens * mm_combine_units(L.hidden);
    for (int64_t i = (int64_t)blockIdx.x * nthreads + threadIdx.x; i < n; i += (int64_t)gridDim.x * nthreads)
      arrived[i] = 0;
  }
  /* The caller's tokens into this rank's staging region: before the grid
   * barriers and CTA 0's release of barrier 0, so a peer that pulls after
   * acquiring barrier 0 reads them (the route counts' chain, DESIGN.md
   * section 4). */
  if (F.x) mm_grid_copy_bytes(mm_sym<uint8_t>(L, L.rank, MM_SYM_INPUT_X), F.x, (int64_t)F.num_tokens * L.hidden);
  if (F.x_sf)
    mm_grid_copy_bytes(mm_sym<uint8_t>(L, L.rank, MM_SYM_INPUT_X_SF), reinterpret_cast<const uint8_t*>(F.x_sf),
                       (int64_t)F.num_tokens * (L.hidden / 128) * 4);
  if (!mm_grid_barrier(gb, gctx)) return false;
  if (threadIdx.x == 0) mm_tl_stamp(L, MM_TL_COUNTED);
  if (!one_scan) {
    /* B: publish (every CTA sees the same `failed`: the errors of phase A
     * precede the grid barrier). */
    const bool failed = mm_failed(st);
    for (int e = blockIdx.x, k = 0; e < L.num_experts; e += gridDim.x, ++k)
      mm_route_publish_expert(L, F, e, failed, scratch, mm_route_kept(L, scratch, k));
    mm_route_publish_call(L, F, h);
    if (!mm_grid_barrier(gb, gctx)) return false;
  }
  if (threadIdx.x == 0) mm_tl_stamp(L, MM_TL_PUBLISHED); /* = COUNTED in one-scan calls */
  /* C: the routing of every rank is published here once barrier 0 passes. */
  if (blockIdx.x == 0) {
    if (threadIdx.x < 32)
      mm_barrier_thread(L, st, mm_barrier_value(mm_forward_number(st), 0), MM_SITE_BARRIER_DISPATCH);
    __syncthreads();
    if (threadIdx.x == 0) mm_tl_stamp(L, MM_TL_BARRIER0);
    if (h.has_call) {
      /* The verdict is recorded before the layout reads `failed`: a bound
       * that lies lays out an empty pool (no pull, no task). */
      if (threadIdx.x == 0) mm_fused_judge_bound(L, st);
      __syncthreads();
    }
    mm_pool_layout_cta_cap(L, scratch, h.capacity, h.capacity_site);
    if (threadIdx.x == 0) mm_tl_stamp(L, MM_TL_LAYOUT);
  }
  /* The scratch is the pipeline's stage memory, which TMA (the async proxy)
   * writes next: this thread's ordinary accesses to it come first. */
  mm_fence_proxy_async_smem();
  if (!mm_grid_barrier(gb, gctx)) return false;
  if (threadIdx.x == 0) mm_tl_stamp(L, MM_TL_LAID_OUT);
  return true;
}

/* Phase E of the persistent arms' last kernel (split kernel 2, the fused
 * kernel), every thread of every CTA, after its combine stores, then the end
 * of the forward. Two orders, chosen per call (mm_forward_view.early_combine):
 *
 *  late:  grid barrier; CTA 0's all-rank barrier 1; grid barrier (after it
 *         every peer's rows for this rank's tokens have landed); this CTA's
 *         share of the reduction into y.
 *  early: each CTA arrives at a grid round without waiting; the CTA that
 *         completes it runs barrier 1 (warp 0) while every warp reduces its
 *         units as their rows land (arrival counters), into the combine
 *         buffer; the round's end, a grid barrier (every CTA's reductions
 *         and barrier 1's verdict are then seen by all), and, if the forward
 *         has not failed, the copy of the reduced rows into y. The barrier's
 *         latency and the reduction overlap; y is still written only by a
 *         forward that succeeded (megamoe.h).
 * `warp` of the CTA's `warps`: the calling warp's share of the units. */
MM_DEVICE void mm_persistent_combine_tail(const mm_layer_view& L, const mm_forward_view& F, int warp, int warps) {
  mm_device_status* st = mm_status(L);
  const int tid = threadIdx.x;
  /* Every thread's combine stores (to peers over NVLink) before the grid
   * arrival; the release of barrier 1 is then cumulative over them. The PTX
   * model does not need this fence: the grid barrier's gpu-scope arrival
   * orders the stores before CTA 0's system-scope release, as it orders the
   * routing's stores to peers before barrier 0, which has no fence of its
   * own. It stays (acq_rel) until EP2 runs have confirmed the
   * model's cumulativity over NVLink stores; then drop it (docs/PERF.md,
   * nineteenth session). */
  mm_fence_acq_rel_sys();
  mm_grid_barrier_state* gb = mm_ws<mm_grid_barrier_state>(L, MM_WS_GRID_BARRIER);
  const mm_wait_ctx gctx = mm_persistent_grid_ctx(L);
  const bool early = MM_EARLY_COMBINE && F.early_combine != 0;
  bool ok = true, last = false;
  uint64_t round_end = 0; /* the early order's round: the count that ends it */
  if (!early) {
    ok = mm_grid_barrier(gb, gctx);
    if (tid == 0) mm_tl_stamp(L, MM_TL_PUSHED);
    if (ok && blockIdx.x == 0 && tid < 32)
      mm_barrier_thread(L, st, mm_barrier_value(mm_forward_number(st), 1), MM_SITE_BARRIER_COMBINE);
    /* After barrier 1 every peer's rows for this rank's tokens have landed. */
    if (ok) ok = mm_grid_barrier(gb, gctx);
    if (tid == 0) mm_tl_stamp(L, MM_TL_COMBINED);
  } else {
    round_end = mm_grid_arrive(gb, &last);
    if (tid == 0) mm_tl_stamp(L, MM_TL_PUSHED);
    /* The completing CTA has acquired every CTA's arrival: the whole rank's
     * pushes and pulls precede its barrier-1 release. */
    if (last && tid < 32) {
      mm_barrier_thread(L, st, mm_barrier_value(mm_forward_number(st), 1), MM_SITE_BARRIER_COMBINE);
      __syncwarp();
    }
  }
  /* One call site (the fused kernel's tail is compiled under its roles'
   * register pressure). Early: a forward that already failed reduces
   * nothing (its rows may never come); a failure while reducing ends the
   * waits. mm_reduce_tokens is a warp collective (ballot, shuffles), and in
   * the early order barrier 1 may record an error while the lanes read
   * `failed`: one vote gives every lane of the warp the same answer (`ok`
   * is the CTA's, uniform). */
  if (ok && !__any_sync(0xffffffffu, mm_failed(st))) (void)mm_reduce_tokens(L, F, warp, warps, early);
  if (early) {
    ok = last || mm_grid_wait_round(gb, round_end, gctx);
    if (ok) ok = mm_grid_barrier(gb, gctx);
    if (tid == 0) mm_tl_stamp(L, MM_TL_COMBINED); /* every CTA, as in the late order (no stale stamps) */
    /* Every CTA's reductions and barrier 1 are behind the grid barrier:
     * every CTA takes the same decision here. */
    if (ok && !mm_failed(st)) mm_copy_reduced(L, F, warp, warps);
  }
  if (L.timeline) {
    __syncthreads(); /* every warp's reductions, then the stamp */
    if (tid == 0) mm_tl_stamp(L, MM_TL_REDUCED);
  }
  /* Every CTA, whatever happened: the forward's end (its arrival count must
   * see every CTA once, or the next forward's number would move early). */
  mm_forward_end(L);
}

#endif
