/* Routing, pool layout, dispatch pull and the combine reduction as device
 * functions: the staged arm calls them from its kernels (one CTA per item),
 * the split arm from its persistent kernels (CTA-strided). One
 * implementation, so the arms build the same pool in the same order and stay
 * bitwise equal.
 *
 * The order that makes the layer deterministic: a source rank publishes, per
 * global expert, its routed (token, slot) pairs in (token, slot) order; the
 * expert rank's pool holds each local expert's rows at a multiple of
 * MM_POOL_ROW_ALIGN, sources in rank order, each source's rows in its
 * published order. */
#ifndef MEGAMOE_ROUTE_CUH
#define MEGAMOE_ROUTE_CUH

#include "comm/wait.cuh"
#include "common.cuh"
#include "ptx/tma.cuh"
#include "view.cuh"

/* Items [lo, hi) of this CTA's thread when `n` items are cut in blockDim.x
 * contiguous chunks. */
MM_DEVICE void mm_cta_chunk(int64_t n, int64_t* lo, int64_t* hi) {
  const int64_t chunk = (n + blockDim.x - 1) / blockDim.x;
  *lo = min(n, (int64_t)threadIdx.x * chunk);
  *hi = min(n, *lo + chunk);
}

/* Slots [lo, hi) of warp `warp` of `warps` when `n` slots are cut in
 * contiguous chunks of whole 32-slot steps: a warp then reads its chunk 32
 * consecutive slots at a time (coalesced) and keeps the slots' order. */
MM_DEVICE void mm_warp_chunk(int64_t n, int warp, int warps, int64_t* lo, int64_t* hi) {
  const int64_t steps = (n + 31) / 32;
  const int64_t per = (steps + warps - 1) / warps;
  *lo = min(n, (int64_t)warp * per * 32);
  *hi = min(n, *lo + per * 32);
}

/* Slots are read MM_ROUTE_BATCH 32-slot steps at a time, every load of a batch
 * issued before the first is used: a warp's scan is latency-bound, not
 * bandwidth-bound (one CTA reads the T*K ids of its expert from L2). 32
 * (16 before the thirty-seventh session) takes the one-scan path
 * (mm_route_one_scan) up to 12288 slots with 12 warps, 2048 tokens at
 * top-6: published 23.7 -> 20.9 us there on an H100 (docs/PERF.md); the
 * staged arm's route kernels need 127 and 128 registers for it (63 with 16). */
#ifndef MM_ROUTE_BATCH /* overridable for an A/B against the depth before (16) */
#define MM_ROUTE_BATCH 32
#endif

/* The expert ids of the batch of steps at `step0` ([.., hi); -1 past hi). */
MM_DEVICE void mm_route_load_batch(const mm_forward_view& F, int64_t step0, int64_t hi,
                                   int32_t (&v)[MM_ROUTE_BATCH]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int b = 0; b < MM_ROUTE_BATCH; ++b) {
    const int64_t i = step0 + 32 * b + lane;
    v[b] = i < hi ? mm_topk_at(F, i) : -1;
  }
}

/* Slots of [lo, hi) routed to expert e (the whole warp gets the count). */
MM_DEVICE int mm_route_warp_count(const mm_forward_view& F, int64_t lo, int64_t hi, int e) {
  int count = 0;
  for (int64_t step0 = lo; step0 < hi; step0 += 32 * MM_ROUTE_BATCH) {
    int32_t v[MM_ROUTE_BATCH];
    mm_route_load_batch(F, step0, hi, v);
#pragma unroll
    for (int b = 0; b < MM_ROUTE_BATCH; ++b) count += __popc(__ballot_sync(0xffffffffu, v[b] == e));
  }
  return count;
}

/* Validates top-k slots [lo, hi): records MEGAMOE_ERR_BAD_TOPK_INDEX for an
 * index outside [-1, E). Any threads. */
MM_DEVICE void mm_route_validate(const mm_layer_view& L, const mm_forward_view& F, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const int32_t v = mm_topk_at(F, i);
    if (v < -1 || v >= L.num_experts)
      mm_record_error(mm_status(L), MEGAMOE_ERR_BAD_TOPK_INDEX, MM_SITE_ROUTE, -1, (int)i, (uint64_t)(int64_t)v, 0);
  }
}

/* The calling CTA counts the slots routed to global expert e and writes the
 * count to MM_WS_EXPERT_TOKENS[e]. All threads; scratch: 32 ints of shared
 * memory. keep (or NULL): each warp's count of its chunk, at keep[warp], for
 * the same CTA's mm_route_publish_expert of e (the persistent arms' phase B,
 * after a grid barrier: shared memory outlives it). */
MM_DEVICE void mm_route_count_expert(const mm_layer_view& L, const mm_forward_view& F, int e, int* scratch,
                                     int* keep = nullptr) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int64_t lo, hi;
  mm_warp_chunk((int64_t)F.num_tokens * L.top_k, warp, warps, &lo, &hi);
  const int count = mm_route_warp_count(F, lo, hi, e);
  if (keep && (threadIdx.x & 31) == 0) keep[warp] = count;
  int total;
  mm_block_exclusive_scan((threadIdx.x & 31) == 0 ? count : 0, scratch, &total);
  if (threadIdx.x == 0) mm_ws<int32_t>(L, MM_WS_EXPERT_TOKENS)[e] = total;
}

/* The calling CTA publishes expert e into its rank d = e / E_l: the count at
 * route_counts[me][e % E_l] and the entries at route_entries[me][base + j]
 * (base: the slots of d's earlier local experts), in (token, slot) order.
 * After an error of this forward (`failed`) it publishes a zero count, so no
 * peer pulls anything (the error travels with the barrier flag). Each warp
 * takes a contiguous chunk of the slots (mm_warp_chunk) and reads it 32
 * slots at a step, writing each match at its warp's prefix plus the matches
 * of lower lanes, so consecutive entries are written by consecutive lanes.
 * warp_count: the calling warp's matches in its chunk (every lane). All
 * threads; scratch: 32 ints. */
MM_DEVICE void mm_route_publish_at(const mm_layer_view& L, const mm_forward_view& F, int e, int base,
                                   int warp_count, bool failed, int* scratch) {
  const int dest = e / L.local_experts, le = e % L.local_experts;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int total;
  int pos = base + mm_block_exclusive_scan(lane == 0 ? warp_count : 0, scratch, &total);
  if (threadIdx.x == 0)
    mm_sym<int32_t>(L, dest, MM_SYM_ROUTE_COUNTS)[L.rank * L.local_experts + le] = failed ? 0 : total;
  if (failed) return;
  mm_route_entry* entries =
      mm_sym<mm_route_entry>(L, dest, MM_SYM_ROUTE_ENTRIES) + (int64_t)L.rank * L.max_tokens * L.top_k;
  int64_t lo, hi;
  mm_warp_chunk((int64_t)F.num_tokens * L.top_k, warp, warps, &lo, &hi);
  pos = __shfl_sync(0xffffffffu, pos, 0);
  const int end = pos + warp_count; /* warp-uniform: the loop stops after the warp's last match */
  const uint32_t lower = (1u << lane) - 1u;
  for (int64_t step0 = lo; step0 < hi && pos < end; step0 += 32 * MM_ROUTE_BATCH) {
    int32_t v[MM_ROUTE_BATCH];
    float w[MM_ROUTE_BATCH];
    mm_route_load_batch(F, step0, hi, v);
#pragma unroll
    for (int b = 0; b < MM_ROUTE_BATCH; ++b) w[b] = v[b] == e ? F.topk_w[step0 + 32 * b + lane] : 0.f;
#pragma unroll
    for (int b = 0; b < MM_ROUTE_BATCH; ++b) {
      const uint32_t hits = __ballot_sync(0xffffffffu, v[b] == e);
      if (hits >> lane & 1) {
        mm_route_entry entry;
        entry.token_slot = (int32_t)(step0 + 32 * b + lane);
        entry.weight = w[b];
        entries[pos + __popc(hits & lower)] = entry;
      }
      pos += __popc(hits);
    }
  }
}

/* Expert e published from the counts of the count pass (MM_WS_EXPERT_TOKENS,
 * written by every CTA before a grid barrier or kernel boundary). kept (or
 * NULL): this CTA's per-warp counts of e from that pass (its keep), read
 * instead of scanning the warp's chunk a second time. */
MM_DEVICE void mm_route_publish_expert(const mm_layer_view& L, const mm_forward_view& F, int e, bool failed,
                                       int* scratch, const int* kept = nullptr) {
  const int dest = e / L.local_experts;
  const int32_t* counts = mm_ws<int32_t>(L, MM_WS_EXPERT_TOKENS);
  /* base: the slots of dest's local experts before e (all threads add). */
  int before = 0;
  for (int j = dest * L.local_experts + (int)threadIdx.x; j < e; j += blockDim.x) before += counts[j];
  int base;
  mm_block_exclusive_scan(before, scratch, &base);
  int64_t lo, hi;
  mm_warp_chunk((int64_t)F.num_tokens * L.top_k, threadIdx.x >> 5, blockDim.x >> 5, &lo, &hi);
  const int warp_count = kept ? kept[threadIdx.x >> 5] : mm_route_warp_count(F, lo, hi, e);
  mm_route_publish_at(L, F, e, base, warp_count, failed, scratch);
}

/* Whether one CTA reads all T*K slots in one batch per warp (a single round
 * trip): then each CTA finds its experts' bases itself
 * (mm_route_publish_expert_scanned) and the routing needs no count pass. */
MM_DEVICE bool mm_route_one_scan(const mm_forward_view& F, int top_k) {
  return (int64_t)F.num_tokens * top_k <= (int64_t)32 * MM_ROUTE_BATCH * (blockDim.x >> 5);
}

/* Expert e published without the count pass: the calling CTA scans every
 * slot itself, counting in one read the slots of dest's local experts before
 * e (the base), e's own (the entries) and any index the validation rejects
 * (mm_route_validate, which records the error: then `failed` holds here as
 * the status record would say after the count pass's grid barrier, and the
 * count published is 0). The same counts, so the same pool, as
 * mm_route_publish_expert. All threads; scratch: 32 ints. */
MM_DEVICE void mm_route_publish_expert_scanned(const mm_layer_view& L, const mm_forward_view& F, int e,
                                               bool failed, int* scratch) {
  const int first = e / L.local_experts * L.local_experts;
  int64_t lo, hi;
  mm_warp_chunk((int64_t)F.num_tokens * L.top_k, threadIdx.x >> 5, blockDim.x >> 5, &lo, &hi);
  int before = 0, count = 0, bad = 0;
  for (int64_t step0 = lo; step0 < hi; step0 += 32 * MM_ROUTE_BATCH) {
    int32_t v[MM_ROUTE_BATCH];
    mm_route_load_batch(F, step0, hi, v); /* -1 past hi: neither counted nor bad */
#pragma unroll
    for (int b = 0; b < MM_ROUTE_BATCH; ++b) {
      before += __popc(__ballot_sync(0xffffffffu, v[b] >= first && v[b] < e));
      count += __popc(__ballot_sync(0xffffffffu, v[b] == e));
      bad |= v[b] < -1 || v[b] >= L.num_experts;
    }
  }
  failed = __syncthreads_or(bad) != 0 || failed;
  int base;
  mm_block_exclusive_scan((threadIdx.x & 31) == 0 ? before : 0, scratch, &base);
  mm_route_publish_at(L, F, e, base, count, failed, scratch);
}

/* The too-many-tokens record of the layout, by the expert whose padded
 * range [offset, offset + padded) crosses the capacity (its details: see
 * mm_pool_layout_cta_cap). */
MM_DEVICE void mm_pool_layout_overflow(const mm_layer_view& L, mm_device_status* st, int le, int offset,
                                       int padded, int total, int capacity, int site) {
  if (offset > capacity || offset + padded <= capacity) return;
  if (site == MM_SITE_POOL)
    mm_record_error(st, MEGAMOE_ERR_TOO_MANY_TOKENS, site, -1, L.rank * L.local_experts + le, (uint64_t)total,
                    (uint64_t)capacity);
  else
    mm_record_error(st, MEGAMOE_ERR_TOO_MANY_TOKENS, site, -1, L.rank * L.local_experts + le,
                    (uint64_t)(total / MM_POOL_ROW_ALIGN), (uint64_t)(capacity / MM_POOL_ROW_ALIGN));
}

/* mm_pool_layout_cta_cap where E_l <= 32, by warp 0 alone (lane = local
 * expert): the same values from warp shuffles, every count loaded once
 * beside the status word, no CTA barrier on the calling CTA's path. */
MM_DEVICE void mm_pool_layout_warp(const mm_layer_view& L, int capacity, int site) {
  if (threadIdx.x >= 32) return;
  mm_device_status* st = mm_status(L);
  const int El = L.local_experts, R = L.num_ranks, le = threadIdx.x;
  const bool mine = le < El;
  const int32_t* route_counts = mm_sym<int32_t>(L, L.rank, MM_SYM_ROUTE_COUNTS);
  int count[MM_MAX_RANKS];
#pragma unroll
  for (int s = 0; s < MM_MAX_RANKS; ++s) count[s] = mine && s < R ? route_counts[s * El + le] : 0;
  const bool failed = mm_failed(st);
  int rows = 0;
#pragma unroll
  for (int s = 0; s < MM_MAX_RANKS; ++s) {
    if (failed) count[s] = 0;
    rows += count[s];
  }
  const int padded = (rows + MM_POOL_ROW_ALIGN - 1) / MM_POOL_ROW_ALIGN * MM_POOL_ROW_ALIGN;
  int total;
  const int offset = mm_warp_exclusive_scan(padded, &total);
  const bool overflow = total > capacity;
  if (overflow && mine) mm_pool_layout_overflow(L, st, le, offset, padded, total, capacity, site);
  int32_t* src_start = mm_ws<int32_t>(L, MM_WS_POOL_SRC_START);
  int32_t* route_base = mm_ws<int32_t>(L, MM_WS_ROUTE_BASE);
  if (mine) {
    mm_ws<int32_t>(L, MM_WS_POOL_OFFSET)[le] = overflow ? 0 : offset;
    mm_ws<int32_t>(L, MM_WS_POOL_COUNT)[le] = overflow ? 0 : rows;
  }
  if (le == 0) mm_ws<int32_t>(L, MM_WS_POOL_OFFSET)[El] = overflow ? 0 : total;
  int start = offset;
#pragma unroll
  for (int s = 0; s < MM_MAX_RANKS; ++s) {
    if (s >= R) break;
    const int base = mm_warp_exclusive_scan(count[s], NULL); /* entry base of (s, le) in s's list */
    if (mine) {
      src_start[le * R + s] = start;
      route_base[s * El + le] = base;
    }
    start += count[s];
  }
}

/* Pool layout from every source's published counts, by ONE CTA (any
 * blockDim, multiple of 32; E_l up to MEGAMOE_MAX_LOCAL_EXPERTS): expert le's
 * rows start at pool_offset[le] (a multiple of MM_POOL_ROW_ALIGN), sources in
 * rank order inside it (pool_src_start), and the per-(source, expert) entry
 * bases (route_base). After an error of this forward, an empty pool. A pool
 * that does not fit `capacity` rows records MEGAMOE_ERR_TOO_MANY_TOKENS at
 * `site` and leaves an empty pool: nothing is written past it. Site
 * MM_SITE_POOL (the staged and split arms' pool, capacity L.pool_rows, config
 * pool_imbalance): detail the first expert that does not fit, seen / want
 * the rows. Site MM_SITE_RING (the fused arm, whose pool is virtual: capacity
 * the ring in the single-wave order, the per-block counters in the lag
 * order): seen / want in 128-row blocks. Where E_l <= 32, warp 0 alone
 * (mm_pool_layout_warp: 4.1 -> 2.6 us at decode, docs/PERF.md eighteenth
 * session); else each thread takes a contiguous chunk of experts.
 * scratch: 32 ints. */
MM_DEVICE void mm_pool_layout_cta_cap(const mm_layer_view& L, int* scratch, int capacity, int site) {
  if (L.local_experts <= 32) {
    mm_pool_layout_warp(L, capacity, site);
    return;
  }
  mm_device_status* st = mm_status(L);
  const bool failed = mm_failed(st);
  const int El = L.local_experts, R = L.num_ranks;
  const int32_t* route_counts = mm_sym<int32_t>(L, L.rank, MM_SYM_ROUTE_COUNTS);
  int32_t* pool_offset = mm_ws<int32_t>(L, MM_WS_POOL_OFFSET);
  int32_t* pool_count = mm_ws<int32_t>(L, MM_WS_POOL_COUNT);
  int32_t* route_base = mm_ws<int32_t>(L, MM_WS_ROUTE_BASE);
  int32_t* src_start = mm_ws<int32_t>(L, MM_WS_POOL_SRC_START);
  int64_t lo, hi;
  mm_cta_chunk(El, &lo, &hi);

  /* Padded rows of this thread's experts, then their offsets. */
  int padded_sum = 0;
  for (int64_t le = lo; le < hi; ++le) {
    /* The counts are read beside the status word, not after it: one round
     * trip to L2 on this CTA's critical path instead of two. */
    int rows = 0;
    for (int s = 0; s < R; ++s) rows += route_counts[s * El + le];
    if (failed) rows = 0;
    padded_sum += (rows + MM_POOL_ROW_ALIGN - 1) / MM_POOL_ROW_ALIGN * MM_POOL_ROW_ALIGN;
  }
  int total;
  int offset = mm_block_exclusive_scan(padded_sum, scratch, &total);
  const bool overflow = total > capacity;
  for (int64_t le = lo; le < hi; ++le) {
    int rows = 0;
    if (!failed)
      for (int s = 0; s < R; ++s) rows += route_counts[s * El + le];
    const int padded = (rows + MM_POOL_ROW_ALIGN - 1) / MM_POOL_ROW_ALIGN * MM_POOL_ROW_ALIGN;
    if (overflow) mm_pool_layout_overflow(L, st, (int)le, offset, padded, total, capacity, site);
    pool_offset[le] = overflow ? 0 : offset;
    pool_count[le] = overflow ? 0 : rows;
    int start = offset;
    for (int s = 0; s < R; ++s) {
      src_start[le * R + s] = start;
      start += failed ? 0 : route_counts[s * El + le];
    }
    offset += padded;
  }
  if (threadIdx.x == 0) pool_offset[El] = overflow ? 0 : total;
  /* Entry base of (source s, local expert le) inside s's list: prefix over le. */
  for (int s = 0; s < R; ++s) {
    int sum = 0;
    for (int64_t le = lo; le < hi; ++le) sum += failed ? 0 : route_counts[s * El + le];
    int all;
    int base = mm_block_exclusive_scan(sum, scratch, &all);
    for (int64_t le = lo; le < hi; ++le) {
      route_base[s * El + le] = base;
      base += failed ? 0 : route_counts[s * El + le];
    }
  }
}

/* The staged and split arms' pool layout: capacity L.pool_rows. */
MM_DEVICE void mm_pool_layout_cta(const mm_layer_view& L, int* scratch) {
  mm_pool_layout_cta_cap(L, scratch, L.pool_rows, MM_SITE_POOL);
}

/* Where pool row r, the j-th valid row of local expert le (j <
 * pool_count[le]), comes from: its source rank's x row and scales, and what
 * the pool keeps of it (the row's metadata and routing weight): a function
 * of (r, le) alone, so lanes that ask for one row agree. */
struct mm_pull_src {
  const uint8_t* x;
  const float* sf;
  mm_pool_row row;
  float weight;
};
MM_DEVICE mm_pull_src mm_pull_source(const mm_layer_view& L, int r, int le) {
  const int El = L.local_experts, R = L.num_ranks, K = L.top_k;
  const int32_t* route_base = mm_ws<int32_t>(L, MM_WS_ROUTE_BASE);
  const int32_t* src_start = mm_ws<int32_t>(L, MM_WS_POOL_SRC_START);
  int src = R - 1; /* last source whose rows start at or before r */
  while (src > 0 && src_start[le * R + src] > r) --src;
  const int j = r - src_start[le * R + src];
  const mm_route_entry entry = mm_sym<mm_route_entry>(L, L.rank, MM_SYM_ROUTE_ENTRIES)
      [(int64_t)src * L.max_tokens * K + route_base[src * El + le] + j];
  const int t = entry.token_slot / K;
  mm_pull_src s;
  s.x = mm_sym<uint8_t>(L, src, MM_SYM_INPUT_X) + (int64_t)t * L.hidden;
  s.sf = mm_sym<float>(L, src, MM_SYM_INPUT_X_SF) + (int64_t)t * (L.hidden / MM_SCALE_BLOCK);
  s.row = mm_pool_row{src, entry.token_slot};
  s.weight = entry.weight;
  return s;
}

/* One warp copies the row s into row dst of the pool regions (pool_x,
 * pool_x_sf with row stride sf_stride, pool_rows, pool_weight), over NVLink
 * for a peer's row. The first 32 scales are loaded before the x row, so
 * their latency hides under its copy. */
MM_DEVICE void mm_pull_copy(const mm_layer_view& L, const mm_pull_src& s, int64_t dst, int64_t sf_stride) {
  const int lane = threadIdx.x & 31;
  const int H = L.hidden, sf_cols = H / MM_SCALE_BLOCK;
  float* pool_x_sf = mm_ws<float>(L, MM_WS_POOL_X_SF);
  const float sf0 = lane < sf_cols ? s.sf[lane] : 0.f;
  mm_warp_copy16(mm_ws<uint8_t>(L, MM_WS_POOL_X) + dst * H, s.x, H);
  if (lane < sf_cols) pool_x_sf[(int64_t)lane * sf_stride + dst] = sf0;
  for (int i = lane + 32; i < sf_cols; i += 32) pool_x_sf[(int64_t)i * sf_stride + dst] = s.sf[i];
  if (lane == 0) {
    mm_ws<mm_pool_row>(L, MM_WS_POOL_ROWS)[dst] = s.row;
    mm_ws<float>(L, MM_WS_POOL_WEIGHT)[dst] = s.weight;
  }
}

/* Pool row r by one warp into row dst of the pool regions. The staged and
 * split arms store row r at r (stride L.pool_rows); the fused arm at its
 * ring row (stride: the ring's rows), r staying the virtual row that names
 * the entry. */
MM_DEVICE void mm_pull_row_to(const mm_layer_view& L, int r, int le, int64_t dst, int64_t sf_stride) {
  mm_pull_copy(L, mm_pull_source(L, r, le), dst, sf_stride);
}

/* Rows r0 .. r0 + n - 1 (n <= 32, all of local expert le) by one warp into
 * rows dst0 .. dst0 + n - 1: the same stores as n calls of mm_pull_row_to,
 * but the n lookups run at once (lane i finds row r0 + i, and asks L2 for
 * its x row when it is this rank's own), so a row's copy no longer waits
 * behind its own chain of dependent loads (docs/PERF.md, tenth session). */
MM_DEVICE void mm_pull_rows_to(const mm_layer_view& L, int r0, int n, int le, int64_t dst0, int64_t sf_stride) {
  const int lane = threadIdx.x & 31;
  mm_pull_src mine = {};
  if (lane < n) {
    mine = mm_pull_source(L, r0 + lane, le);
    if (mine.row.src_rank == L.rank) mm_bulk_prefetch_l2(mine.x, (uint32_t)L.hidden);
  }
  for (int i = 0; i < n; ++i) {
    mm_pull_src s;
    s.x = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(mine.x), i));
    s.sf = reinterpret_cast<const float*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(mine.sf), i));
    s.row.src_rank = __shfl_sync(0xffffffffu, mine.row.src_rank, i);
    s.row.token_slot = __shfl_sync(0xffffffffu, mine.row.token_slot, i);
    s.weight = __shfl_sync(0xffffffffu, mine.weight, i);
    mm_pull_copy(L, s, dst0 + i, sf_stride);
  }
}

MM_DEVICE void mm_pull_row(const mm_layer_view& L, int r, int le) { mm_pull_row_to(L, r, le, r, L.pool_rows); }

/* A warp's pulled rows published to the GEMM producer that TMA-loads them:
 * every lane's stores ordered before the async proxy's reads (the fence),
 * the warp barrier orders them before lane 0's one release of n rows to
 * *counter. The split pull, the fused prologue and the fused pull. */
MM_DEVICE void mm_pull_publish(int32_t* counter, int n) {
  mm_fence_proxy_async_global();
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mm_red_release_gpu_add_s32(counter, n);
}

/* The local expert whose pool range holds row r (pool_offset: E_l + 1
 * ascending offsets, in shared or global memory). */
MM_DEVICE int mm_pool_expert_of(const int32_t* pool_offset, int El, int r) {
  int lo = 0, hi = El - 1; /* last expert whose range starts at or before r */
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (pool_offset[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Combine buffer row of (token t, slot k): [T_max * K][H], token-major, so a
 * token's K rows are contiguous and an expert row lands at its token_slot. */
MM_DEVICE const uint16_t* mm_combine_row(const mm_layer_view& L, int64_t token_slot) {
  return mm_sym<uint16_t>(L, L.rank, MM_SYM_COMBINE) + token_slot * L.hidden;
}

/* The combine's reduction: y[t] = bf16(sum over unmasked k, in order
 * k = 0..K-1, of fp32(combine[t][k])). The work is cut into units of
 * (token, MM_COMBINE_UNIT_COLS columns): each lane sums 8 columns (16
 * bytes) at two 256-column steps, so 2K loads per lane are in flight and one
 * unit is one round trip to memory. Units go to the grid's warps CTA-fastest
 * (unit u to warp u mod (grid x warps), CTA u mod grid), so a handful of
 * tokens (decode) spreads over every SM instead of queueing ~H/512 dependent
 * round trips on one warp (17 us at 64 tokens, docs/PERF.md eleventh
 * session). Per element the sum and its order are the same in every path
 * below, so every arm's y is bitwise the staged arm's.
 * `warp`, `warps`: the calling warp's index among the CTA's participating
 * warps. */
#define MM_REDUCE_STEPS 2
static_assert(MM_COMBINE_UNIT_COLS == 32 * 8 * MM_REDUCE_STEPS, "a unit is one 16-byte load per lane and step");

/* Bit k: slot k of token t is routed (not masked). The whole warp: lane k
 * loads slot k (K <= MEGAMOE_MAX_TOP_K <= 32), so the mask costs one round
 * trip to memory, not K dependent ones (the ids are evicted from L2 by the
 * weight stream by the time the tail reads them). */
MM_DEVICE uint32_t mm_token_live_slots(const mm_forward_view& F, int64_t t, int K) {
  const int lane = threadIdx.x & 31;
  return __ballot_sync(0xffffffffu, lane < K && mm_topk_at(F, t * K + lane) >= 0);
}

/* One unit (token t, columns from c0 = unit_col0 + lane * 8, two 256-column
 * steps) summed from t's live combine rows and written as bf16 to out_row
 * (y's row t, or the combine buffer's row t * K when staged early: every
 * load of the unit precedes its stores, so the unit may overwrite the slot-0
 * row it reads). */
MM_DEVICE void mm_reduce_unit(const mm_layer_view& L, int64_t t, int c0, uint32_t live, uint16_t* out_row) {
  const int H = L.hidden, K = L.top_k;
  constexpr int kSteps = MM_REDUCE_STEPS, kGroup = 8;
  const uint16_t* rows = mm_combine_row(L, t * K);
  float acc[kSteps][8];
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[s][i] = 0.f;
  /* Slots in groups of kGroup (registers), in order: the sum order is k = 0..K-1. */
  for (int k0 = 0; k0 < K; k0 += kGroup) {
    uint4 v[kSteps][kGroup];
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int j = 0; j < kGroup; ++j)
        if (k0 + j < K && (live >> (k0 + j) & 1) && c0 + s * 256 < H)
          v[s][j] = *reinterpret_cast<const uint4*>(rows + (int64_t)(k0 + j) * H + c0 + s * 256);
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (k0 + j >= K || !(live >> (k0 + j) & 1)) continue;
        const uint16_t* b = reinterpret_cast<const uint16_t*>(&v[s][j]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[s][i] += mm_bf16_to_float(b[i]);
      }
  }
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (c0 + s * 256 >= H) continue;
    uint4 o;
    uint16_t* ob = reinterpret_cast<uint16_t*>(&o);
#pragma unroll
    for (int i = 0; i < 8; ++i) ob[i] = mm_float_to_bf16(acc[s][i]);
    *reinterpret_cast<uint4*>(out_row + c0 + s * 256) = o;
  }
}

/* Every unit of the calling warp.
 *  early == false: into y, once all rows have landed (after barrier 1, or the
 *    staged arm's combine kernel); always true.
 *  early == true: the early combine's first pass (route_phases.cuh): each
 *    unit as soon as its rows have landed, into the combine buffer's row
 *    t * K (this rank's own memory: y is written only once the forward is
 *    known to have succeeded, mm_copy_reduced). A unit's rows have all
 *    landed when its arrival counter (MM_SYM_COMBINE_ARRIVED, zeroed in
 *    routing phase A) holds live slots x the unit's columns: each expert
 *    rank's copy warps add a row's columns after storing it, with
 *    system-scope release order (gemm_epilogue.cuh, mm_gemm_count_arrivals).
 *    Lane 0 acquires at system scope; the warp barrier orders that before
 *    every lane's loads. False when a wait gave up (deadline, or an error of
 *    this forward): the warp leaves.
 * One call site of mm_reduce_unit for both (the fused kernel's tail is
 * compiled under its roles' register pressure: two copies spilled more). */
MM_DEVICE bool mm_reduce_tokens(const mm_layer_view& L, const mm_forward_view& F, int warp, int warps,
                                bool early = false) {
  const int lane = threadIdx.x & 31;
  const int H = L.hidden, K = L.top_k;
  const int chunks = mm_combine_units(L.hidden);
  const int64_t units = (int64_t)F.num_tokens * chunks;
  const int64_t stride = (int64_t)gridDim.x * warps;
  const int32_t* arrived = mm_sym<int32_t>(L, L.rank, MM_SYM_COMBINE_ARRIVED);
  uint16_t* out = early ? mm_sym<uint16_t>(L, L.rank, MM_SYM_COMBINE) : F.y;
  const int64_t out_stride = early ? (int64_t)K * H : H;
  for (int64_t u = (int64_t)warp * gridDim.x + blockIdx.x; u < units; u += stride) {
    const int64_t t = u / chunks;
    const int col0 = (int)(u - t * chunks) * MM_COMBINE_UNIT_COLS;
    const uint32_t live = mm_token_live_slots(F, t, K);
    if (early) {
      int landed = 1;
      if (lane == 0) {
        /* Twice the deadline, like the grid barriers: these waits start
         * before barrier 1 does, and a silent peer must be reported by
         * barrier 1 (naming the peer), whose error then ends them. */
        mm_wait_ctx ctx;
        ctx.status = mm_status(L);
        ctx.timeout_ns = 2 * L.timeout_ns;
        ctx.site = MM_SITE_COMBINE_ARRIVED;
        ctx.abort_flag = nullptr;
        const int32_t target = mm_combine_unit_target(__popc(live), H, col0 / MM_COMBINE_UNIT_COLS);
        landed = mm_wait_counter_geq<true>(arrived + u, target, ctx, (int)u);
      }
      __syncwarp(); /* lane 0's acquire before every lane's loads */
      if (!__shfl_sync(0xffffffffu, landed, 0)) return false;
    }
    mm_reduce_unit(L, t, col0 + lane * 8, live, out + t * out_stride);
  }
  return true;
}

/* The early combine's second pass: every unit of the calling warp (the same
 * units as its first pass, so its own stores) from the combine buffer's row
 * t * K to y. */
MM_DEVICE void mm_copy_reduced(const mm_layer_view& L, const mm_forward_view& F, int warp, int warps) {
  const int lane = threadIdx.x & 31;
  const int H = L.hidden, K = L.top_k;
  const int chunks = mm_combine_units(L.hidden);
  const int64_t units = (int64_t)F.num_tokens * chunks;
  const int64_t stride = (int64_t)gridDim.x * warps;
  const uint16_t* staged = mm_sym<uint16_t>(L, L.rank, MM_SYM_COMBINE);
  for (int64_t u = (int64_t)warp * gridDim.x + blockIdx.x; u < units; u += stride) {
    const int64_t t = u / chunks;
    const int c0 = (int)(u - t * chunks) * MM_COMBINE_UNIT_COLS + lane * 8;
#pragma unroll
    for (int s = 0; s < MM_REDUCE_STEPS; ++s)
      if (c0 + s * 256 < H)
        *reinterpret_cast<uint4*>(F.y + t * H + c0 + s * 256) =
            *reinterpret_cast<const uint4*>(staged + t * K * H + c0 + s * 256);
  }
}

#endif
