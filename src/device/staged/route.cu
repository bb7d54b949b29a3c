/* Routing: count the slots of this rank's tokens per global expert, then
 * publish to each expert's rank the count and the (token, slot, weight) list
 * of its local experts, in (local expert, token, slot) order — the order the
 * pool rows take, which makes the whole layer deterministic. */
#include "comm/forward.cuh"
#include "staged/staged.h"
#include "view.cuh"

/* Block e counts the slots routed to global expert e. Block 0 starts the
 * forward (records the host's injected error, see comm/forward.cuh), then
 * validates every index and records MEGAMOE_ERR_BAD_TOPK_INDEX for the first
 * bad one. An empty forward has num_tokens = 0 and reads nothing. */
__global__ void __launch_bounds__(256) mm_route_count_kernel(mm_layer_view L, mm_forward_view F) {
  __shared__ int scratch[32];
  mm_device_status* st = mm_status(L);
  const int e = blockIdx.x;
  if (e == 0) {
    if (threadIdx.x == 0) mm_forward_start(st, F.injected_error);
    __syncthreads(); /* the injected error wins over a bad index */
  }
  const int64_t slots = (int64_t)F.num_tokens * L.top_k;
  int count = 0;
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) {
    const int32_t v = mm_topk_at(F, i);
    count += v == e;
    if (e == 0 && (v < -1 || v >= L.num_experts))
      mm_record_error(st, MEGAMOE_ERR_BAD_TOPK_INDEX, MM_SITE_ROUTE, -1, (int)i, (uint64_t)(int64_t)v, 0);
  }
  int total;
  mm_block_exclusive_scan(count, scratch, &total);
  if (threadIdx.x == 0) mm_ws<int32_t>(L, MM_WS_EXPERT_TOKENS)[e] = total;
}

/* Block e writes the entries of global expert e into rank d = e / E_l:
 * route_entries[me][base + j] with base = slots of the earlier local experts
 * of d, and route_counts[me][e % E_l]. Stable compaction: entries keep
 * (token, slot) order. After an error, publishes zero counts so no peer pulls
 * anything (the error itself travels with the barrier flag). */
__global__ void __launch_bounds__(256) mm_route_publish_kernel(mm_layer_view L, mm_forward_view F) {
  __shared__ int scratch[32];
  __shared__ int s_base;
  mm_device_status* st = mm_status(L);
  const int e = blockIdx.x;
  const int dest = e / L.local_experts, le = e % L.local_experts;
  const int32_t* counts = mm_ws<int32_t>(L, MM_WS_EXPERT_TOKENS);
  const bool failed = mm_failed(st);
  if (threadIdx.x == 0) {
    int base = 0;
    for (int j = dest * L.local_experts; j < e; ++j) base += counts[j];
    s_base = base;
    mm_sym<int32_t>(L, dest, MM_SYM_ROUTE_COUNTS)[L.rank * L.local_experts + le] =
        failed ? 0 : counts[e];
  }
  __syncthreads();
  if (failed) return;
  mm_route_entry* entries =
      mm_sym<mm_route_entry>(L, dest, MM_SYM_ROUTE_ENTRIES) + (int64_t)L.rank * L.max_tokens * L.top_k;
  const int64_t slots = (int64_t)F.num_tokens * L.top_k;
  int written = s_base;
  for (int64_t i0 = 0; i0 < slots; i0 += blockDim.x) {
    const int64_t i = i0 + threadIdx.x;
    const int match = i < slots && mm_topk_at(F, i) == e;
    int total;
    const int pos = mm_block_exclusive_scan(match, scratch, &total);
    if (match) {
      mm_route_entry entry;
      entry.token_slot = (int32_t)i;
      entry.weight = F.topk_w[i];
      entries[written + pos] = entry;
    }
    written += total;
  }
}

/* Expert-major pool layout from every source's counts: expert le's rows
 * start at pool_offset[le] (a multiple of MM_POOL_ROW_ALIGN), sources in
 * rank order inside it. Also the per-(source, expert) entry bases. One block
 * of 1024 threads, E_l <= 1024. After an error, an empty pool. */
__global__ void __launch_bounds__(1024) mm_pool_layout_kernel(mm_layer_view L) {
  __shared__ int scratch[32];
  mm_device_status* st = mm_status(L);
  const bool failed = mm_failed(st);
  const int le = threadIdx.x;
  const int El = L.local_experts, R = L.num_ranks;
  const int32_t* route_counts = mm_sym<int32_t>(L, L.rank, MM_SYM_ROUTE_COUNTS);
  int32_t* pool_offset = mm_ws<int32_t>(L, MM_WS_POOL_OFFSET);
  int32_t* pool_count = mm_ws<int32_t>(L, MM_WS_POOL_COUNT);
  int32_t* route_base = mm_ws<int32_t>(L, MM_WS_ROUTE_BASE);
  int32_t* src_start = mm_ws<int32_t>(L, MM_WS_POOL_SRC_START);

  int rows = 0;
  if (le < El && !failed)
    for (int s = 0; s < R; ++s) rows += route_counts[s * El + le];
  const int padded = (rows + MM_POOL_ROW_ALIGN - 1) / MM_POOL_ROW_ALIGN * MM_POOL_ROW_ALIGN;
  int total;
  const int offset = mm_block_exclusive_scan(le < El ? padded : 0, scratch, &total);
  /* The pool holds L.pool_rows rows (config pool_imbalance). When this
   * forward routes more here, nothing is computed: an empty pool keeps every
   * later kernel inside its buffers, and the error (naming the first expert
   * that does not fit) travels to the peers with the combine barrier. */
  const bool overflow = total > L.pool_rows;
  if (overflow && le < El && offset <= L.pool_rows && offset + padded > L.pool_rows)
    mm_record_error(st, MEGAMOE_ERR_TOO_MANY_TOKENS, MM_SITE_POOL, -1, L.rank * El + le, (uint64_t)total,
                    (uint64_t)L.pool_rows);
  if (le < El) {
    pool_offset[le] = overflow ? 0 : offset;
    pool_count[le] = overflow ? 0 : rows;
    int start = offset;
    for (int s = 0; s < R; ++s) {
      src_start[le * R + s] = start;
      start += failed ? 0 : route_counts[s * El + le];
    }
  }
  if (le == 0) pool_offset[El] = overflow ? 0 : total;
  /* Entry base of (source s, local expert le) inside s's list: prefix over le. */
  for (int s = 0; s < R; ++s) {
    const int c = (le < El && !failed) ? route_counts[s * El + le] : 0;
    int sum;
    const int base = mm_block_exclusive_scan(c, scratch, &sum);
    if (le < El) route_base[s * El + le] = base;
  }
}

extern "C" void mm_route_launch(const mm_layer_view* Lp, const mm_forward_view* Fp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  const mm_forward_view& F = *Fp;
  mm_route_count_kernel<<<L.num_experts, 256, 0, stream>>>(L, F);
  mm_route_publish_kernel<<<L.num_experts, 256, 0, stream>>>(L, F);
}

extern "C" void mm_pool_layout_launch(const mm_layer_view* Lp, cudaStream_t stream) {
  const mm_layer_view& L = *Lp;
  mm_pool_layout_kernel<<<1, 1024, 0, stream>>>(L);
}
