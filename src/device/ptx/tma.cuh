/* Tensor-memory-accelerator (bulk tensor copy) wrappers (PTX ISA
 * "cp.async.bulk.tensor", "prefetch.tensormap").
 *
 * Tensor maps are CUtensorMap values made on the host with
 * cuTensorMapEncodeTiled and passed to the kernel as
 * `const __grid_constant__ CUtensorMap` parameters; these wrappers take the
 * parameter's address. Loads complete on an mbarrier (complete_tx::bytes):
 * the barrier's phase must expect the box's full byte count, including any
 * out-of-bounds part of the box, which the copy engine fills with zeros. */
#ifndef MEGAMOE_PTX_TMA_CUH
#define MEGAMOE_PTX_TMA_CUH

#include <cuda.h> /* CUtensorMap (type only; the driver is not linked) */
#include <stdint.h>

#ifndef MM_PTX_DEVICE
#define MM_PTX_DEVICE __device__ __forceinline__
#endif

/* Pulls the tensor map into the constant cache ahead of the first copy. */
MM_PTX_DEVICE void mm_tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
}

/* 2D tile load: the box at element coordinates (c0 = innermost, c1) of map
 * into shared memory at smem_dst (shared-window address; 1024-byte aligned
 * for the 128-byte swizzle, 128-byte aligned otherwise), completing bytes on
 * the mbarrier at bar. The CTA's own shared::cta addresses are valid
 * shared::cluster addresses (a CTA launched without a cluster is a cluster
 * of one). */
MM_PTX_DEVICE void mm_tma_load_2d(uint32_t smem_dst, const CUtensorMap* map, uint32_t bar,
                                  int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_dst),
      "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

/* The same with an L2 cache policy (from mm_l2_policy_*). */
MM_PTX_DEVICE void mm_tma_load_2d_hint(uint32_t smem_dst, const CUtensorMap* map, uint32_t bar,
                                       int32_t c0, int32_t c1, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_dst),
      "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

/* 2D tile store (bulk-group completion): the box at element coordinates
 * (c0, c1) of map is written from shared memory at smem_src (shared-window
 * address, 1024-byte aligned for the 128-byte swizzle). Parts of the box
 * outside the tensor are not written. The writing threads' generic-proxy
 * stores to smem_src must be ordered before it with
 * fence.proxy.async.shared::cta and a barrier. Complete with
 * mm_bulk_commit_group + mm_bulk_wait_group(_read). */
MM_PTX_DEVICE void mm_tma_store_2d(const CUtensorMap* map, uint32_t smem_src, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"((uint64_t)map),
      "r"(smem_src), "r"(c0), "r"(c1)
      : "memory");
}

/* Closes the bulk async-group of the bulk stores issued since the last commit. */
MM_PTX_DEVICE void mm_bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

/* Waits until at most N bulk async-groups of this thread still read their
 * shared-memory source (the source may then be overwritten). */
template <int N>
MM_PTX_DEVICE void mm_bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

/* Waits until at most N bulk async-groups of this thread are pending (their
 * global writes done). */
template <int N>
MM_PTX_DEVICE void mm_bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

/* Asks L2 to fetch [src, src + bytes) of global memory (a hint: no data
 * comes back, nothing waits; src 16-byte aligned, bytes a multiple of 16). */
MM_PTX_DEVICE void mm_bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((uint64_t)src), "r"(bytes) : "memory");
}

/* L2 eviction policies for the cache hints above. */
MM_PTX_DEVICE uint64_t mm_l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

/* A 16-byte global store with an L2 cache policy (mm_l2_policy_*). */
MM_PTX_DEVICE void mm_st_global_v4_hint(void* dst, uint4 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w), "l"(policy)
               : "memory");
}

MM_PTX_DEVICE uint64_t mm_l2_policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

#endif
