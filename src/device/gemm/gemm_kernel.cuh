/* The whole persistent GEMM kernel of the engine: scheduler, producer, two
 * math warpgroups, one epilogue per output kind. It is also the template of
 * how an arm's own kernel combines the pieces (gemm_cfg.cuh, the scheduler,
 * gemm_mainloop.cuh, gemm_epilogue.cuh).
 *
 * Instantiations live one file per tile (gemm_tile_*.cu, so they compile in
 * parallel); each exports a lookup that gives the launcher (gemm_wgmma.cu)
 * the kernel and its shared-memory layout. */
#ifndef MEGAMOE_GEMM_KERNEL_CUH
#define MEGAMOE_GEMM_KERNEL_CUH

#include <cuda.h>

#include "gemm/gemm.h"
#include "gemm/gemm_cfg.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "ptx/sync.cuh"
#include "sched/sched_grouped.cuh"

/* The CTA's setup, every thread: thread 256 (the producer warpgroup's first)
 * pulls the tensor maps into the constant cache (tm_d may be NULL) and
 * initializes the pipeline barriers, every thread helps build the
 * scheduler's arrays, then a CTA barrier makes both visible. */
template <class Cfg, class Sched>
MM_DEVICE void mm_gemm_cta_setup(const mm_gemm_smem& sm, Sched& sched, const mm_gemm_problem& p,
                                 const CUtensorMap* tm_a, const CUtensorMap* tm_b, const CUtensorMap* tm_sfa,
                                 const CUtensorMap* tm_d, int tile_ring_readers = 8) {
  if (threadIdx.x == 256) {
    mm_tma_prefetch_map(tm_a);
    mm_tma_prefetch_map(tm_b);
    mm_tma_prefetch_map(tm_sfa);
    if (tm_d) mm_tma_prefetch_map(tm_d);
    mm_gemm_init_barriers(sm, MM_GEMM_COPY_THREADS, tile_ring_readers);
  }
  sched.build(sm.sched, p, Cfg::BM, Cfg::BN, threadIdx.x, MM_GEMM_THREADS);
  __syncthreads();
}

/* The producer thread's loop: every tile of this CTA in the scheduler's
 * order, until one gives up (the abort word is then set). first_issued
 * (diagnostic timeline, or NULL): %globaltimer once the first tile's loads
 * are issued. */
template <class Cfg, class Sched>
MM_DEVICE void mm_gemm_producer_loop(const mm_gemm_smem& sm, const Sched& sched, const CUtensorMap* tm_a,
                                     const CUtensorMap* tm_b, const CUtensorMap* tm_sfa, const mm_gemm_problem& p,
                                     uint64_t* first_issued = nullptr) {
  mm_gemm_pipe pipe = {0u, 0u};
  mm_gemm_tile_info ti;
  typename Sched::iter it = sched.begin();
  while (sched.template next<Cfg>(it, ti)) {
    if (!mm_gemm_produce_tile<Cfg>(sm, pipe, tm_a, tm_b, tm_sfa, p, ti)) break;
    if (first_issued) {
      mm_tl_store(first_issued, mm_globaltimer_ns());
      first_issued = nullptr;
    }
  }
}

/* The math warpgroups' loop: per tile the mainloop, the vote, then
 * store(ti, acc, last_tile); when the vote says the pipeline was abandoned,
 * abandon() and leave. Every math thread runs it. */
template <class Cfg, class Sched, class Store, class Abandon>
MM_DEVICE void mm_gemm_math_loop(const mm_gemm_smem& sm, const Sched& sched, const mm_gemm_problem& p, int wg,
                                 Store&& store, Abandon&& abandon) {
  mm_gemm_pipe pipe = {0u, 0u};
  mm_gemm_tile_info ti;
  typename Sched::iter it = sched.begin();
  while (sched.template next<Cfg>(it, ti)) {
    float acc[Cfg::kWaves][64];
    const bool mine = mm_gemm_consume_tile<Cfg>(sm, pipe, p, ti, wg, acc);
    if (!mm_gemm_math_vote_ok(sm, mine)) {
      abandon();
      break;
    }
    store(ti, acc, !sched.has_next(it));
  }
}

template <class Cfg, class Sched, int kOut>
__global__ void __launch_bounds__(MM_GEMM_THREADS, 1)
    mm_gemm_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                   const __grid_constant__ CUtensorMap tm_sfa, const __grid_constant__ CUtensorMap tm_d,
                   const mm_gemm_problem p, const mm_gemm_layout lay) {
  static_assert(Cfg::kStaging == (kOut == MM_GEMM_OUT_BF16 || kOut == MM_GEMM_OUT_BF16_SCATTER), "staging area");
  extern __shared__ uint8_t mm_gemm_smem_raw[];
  const mm_gemm_smem sm = mm_gemm_smem_carve(mm_gemm_smem_raw, lay);
  const int tid = threadIdx.x;
  const int warp = (int)mm_warp_uniform((uint32_t)(tid >> 5)); /* the role branches below: warp-uniform */
  const int lane = tid & 31;

  Sched sched;
  /* Stores through tm_d: bf16 out, and the SwiGLU codes of a tile with the staging area. */
  constexpr bool kTmaOut = kOut == MM_GEMM_OUT_BF16 || (kOut == MM_GEMM_OUT_SWIGLU_FP8 && Cfg::kSwStage);
  mm_gemm_cta_setup<Cfg>(sm, sched, p, &tm_a, &tm_b, &tm_sfa, kTmaOut ? &tm_d : nullptr);

  if (warp >= 8) {
    /* Producer warpgroup: one thread issues everything. */
    mm_setmaxnreg_dec<MM_GEMM_PRODUCER_REGS>();
#if MM_GEMM_PART_TIMER
    if (tid == 256) mm_gemm_part_count_launch();
#endif
    if (warp == 8 && lane == 0) mm_gemm_producer_loop<Cfg>(sm, sched, &tm_a, &tm_b, &tm_sfa, p);
  } else {
    /* Math warpgroups. */
    mm_setmaxnreg_inc<MM_GEMM_MATH_REGS>();
    const int wg = warp >> 2;
#if MM_GEMM_PART_TIMER
    mm_gemm_part_begin();
#endif
    mm_gemm_math_loop<Cfg>(
        sm, sched, p, wg,
        [&](const mm_gemm_tile_info& ti, float (&acc)[Cfg::kWaves][64], bool last) {
#if MM_GEMM_PART_TIMER
          mm_gemm_part_epilogue_start();
#endif
          if constexpr (kOut == MM_GEMM_OUT_F32) {
            mm_gemm_epilogue_store<Cfg, false>(p, ti, wg, acc);
          } else if constexpr (kOut == MM_GEMM_OUT_BF16) {
            if (ti.rows == Cfg::BM) mm_gemm_epilogue_tma_store<Cfg>(sm, &tm_d, ti, wg, acc);
            else mm_gemm_epilogue_store<Cfg, true>(p, ti, wg, acc);
            /* The staging area must stay valid until the last stores have
             * read it (the CTA's shared memory goes away at exit). Waited
             * inside the loop: code after the loop makes ptxas cap the math
             * registers. */
            if (tid == 0 && last) mm_bulk_wait_group<0>();
          } else if constexpr (kOut == MM_GEMM_OUT_SWIGLU_FP8) {
            mm_gemm_epilogue_swiglu<Cfg>(sm, p, ti, wg, acc, &tm_d);
            if (tid == 0 && last) mm_bulk_wait_group<0>(); /* as the bf16 case */
          } else {
            mm_gemm_epilogue_scatter<Cfg>(sm, p, ti, wg, acc);
          }
#if MM_GEMM_PART_TIMER
          mm_gemm_part_epilogue_end(last);
#endif
        },
        [&]() {
          /* Pipeline abandoned: no store of this thread may still read shared memory. */
          if (kTmaOut && tid == 0) mm_bulk_wait_group<0>();
        });
  }
}

/* What the launcher needs of one instantiation. */
struct mm_gemm_kernel_ref {
  const void* fn;
  mm_gemm_layout layout;
};

template <int BM, int BN, bool kSplitN, bool kTwoParts, int kPromo, int kOut, bool kNoScale>
mm_gemm_kernel_ref mm_gemm_kernel_get(int num_experts, int max_stages) {
  using Cfg = mm_gemm_cfg<BM, BN, kSplitN, kTwoParts, kPromo,
                          kOut == MM_GEMM_OUT_BF16 || kOut == MM_GEMM_OUT_BF16_SCATTER, kNoScale,
                          kOut == MM_GEMM_OUT_SWIGLU_FP8 && BN == 256>;
  mm_gemm_kernel_ref r;
  r.fn = reinterpret_cast<const void*>(&mm_gemm_kernel<Cfg, mm_sched_grouped, kOut>);
  r.layout = mm_gemm_layout_for<Cfg>(mm_sched_grouped::smem_bytes(num_experts), (uint32_t)max_stages);
  return r;
}

/* One tile's lookup: out kinds whose bit is set in kOutMask are instantiated
 * for both A-scale blocks (kPromo 1: a_sf_block 128; 2: 64). Returns fn =
 * NULL for an output the tile does not have. */
template <int BM, int BN, bool kSplitN, bool kTwoParts, unsigned kOutMask, bool kNoScale = false>
mm_gemm_kernel_ref mm_gemm_tile_lookup(int a_sf_block, int out_kind, int num_experts, int max_stages) {
  mm_gemm_kernel_ref none = {nullptr, {}};
  const bool p2 = a_sf_block == 64;
#define MM_GEMM_CASE(kind)                                                                           \
  if (out_kind == kind) {                                                                            \
    if constexpr ((kOutMask >> kind) & 1u)                                                           \
      return p2 ? mm_gemm_kernel_get<BM, BN, kSplitN, kTwoParts, 2, kind, kNoScale>(num_experts, max_stages) \
                : mm_gemm_kernel_get<BM, BN, kSplitN, kTwoParts, 1, kind, kNoScale>(num_experts, max_stages); \
    return none;                                                                                     \
  }
  MM_GEMM_CASE(MM_GEMM_OUT_F32)
  MM_GEMM_CASE(MM_GEMM_OUT_BF16)
  MM_GEMM_CASE(MM_GEMM_OUT_SWIGLU_FP8)
  MM_GEMM_CASE(MM_GEMM_OUT_BF16_SCATTER)
#undef MM_GEMM_CASE
  return none;
}

/* Lookups exported by the tile files (gemm_tile_*.cu). */
typedef mm_gemm_kernel_ref (*mm_gemm_lookup_fn)(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_128x256(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_256x128(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_128x128(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_64x256(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_128x128_1p(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_256x128_noscale(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_128x128_noscale(int a_sf_block, int out_kind, int num_experts, int max_stages);
mm_gemm_kernel_ref mm_gemm_lookup_64x256_noscale(int a_sf_block, int out_kind, int num_experts, int max_stages);

#define MM_GEMM_OUTS_ALL                                                                            \
  ((1u << MM_GEMM_OUT_F32) | (1u << MM_GEMM_OUT_BF16) | (1u << MM_GEMM_OUT_SWIGLU_FP8) |           \
   (1u << MM_GEMM_OUT_BF16_SCATTER))

#endif
