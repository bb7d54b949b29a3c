/* `megamoe bench-gemm --mainloop`: the math warpgroups' K loop alone, one CTA per SM, to
 * measure how much of the tensor pipe each loop structure keeps busy (docs/PERF.md,
 * "The mainloop alone"). No scheduler, no epilogue, no scale loads from global memory:
 * what is left is the chain issue, the wgmma.wait_group points, the fp32 promotion and,
 * with the feed on, the stage ring.
 *
 * Structures (per warpgroup, per 128-wide K block; every chain is 4 x m64nNk32):
 *   noscale  the chains accumulate across K blocks, wait_group 1 (the next block's chain
 *            queued behind the running one): the per-tensor-scaled GEMM, the ceiling;
 *   1p       per wave a chain into a fresh partial, wait_group 0, acc = fma(part, s, acc)
 *            (the engine's 256x128 / 128x256 tiles: 2 waves per warpgroup);
 *   2p       two partials, unit u + 1 issued before unit u is waited for and promoted
 *            (the engine's 128x128 / 64x256 tiles);
 *   1p early 1p, but the next K block's stage is waited for and its scales read while the
 *            block's last chain runs (before its wait_group 0), not after its promotion: the
 *            stage wait and the scale loads leave the warpgroup's critical path between two
 *            chains;
 *   rescale  one accumulator per wave, multiplied by a scale ratio before each chain
 *            accumulates into it (how seed 000's kernel runs n256: no fp32 promotion, the
 *            running sum goes through the tensor core; outside our numerics contract, timed
 *            only for comparison).
 * own B (the "own B" rows): each warpgroup reads its own B block from the stage (the
 * stage holds one per warpgroup), as when the two warpgroups run different tiles (a
 * staggered schedule that overlaps one's epilogue with the other's K loop): the same
 * chains, more bytes per FLOP through the ring.
 * feed = on: a producer thread fills a ring of stages (cp.async.bulk from a 32 MB
 * L2-resident buffer, the tile's A and B bytes per K block, full/empty mbarriers as in the
 * engine) and the chains read the stage they waited for; off: they read one resident stage.
 *
 * Printed per structure: TFLOP/s (CUDA events, best of 5 launches), cycles per K block
 * per warpgroup (clock64, mean over warpgroups) and the share of the tensor-bound cycles
 * (8192 dense fp8 FLOP per SM per cycle on sm_90). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "bench.h"
#include "common.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"

namespace {

#define MB_DEVICE __device__ __forceinline__
#define MB_CUDA(call)                                                                                  \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      fprintf(stderr, "bench-gemm --mainloop: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
              cudaGetErrorString(e_));                                                                 \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

enum mb_mode { MB_NOSCALE = 0, MB_1P = 1, MB_2P = 2, MB_RESCALE = 3, MB_1P_EARLY = 4 };
constexpr int kFeedBytes = 32 << 20;   /* the feed's source buffer: stays in the 60 MB L2 */
constexpr int kSmemBudget = 220 << 10; /* stages + barriers + scales */
constexpr int kTailBytes = 128 + 8 * 256 * 4; /* after the stages: 16 mbarriers, then 8 x 256 row scales */
constexpr int kMaxStages = 4;
constexpr int kMaxWarpgroups = 3;                      /* math warpgroups of a configuration */
constexpr int kMaxThreads = kMaxWarpgroups * 128 + 128; /* + the feed warpgroup */

/* Generated operand lists of the m64n192k32 and m64n256k32 wrappers (96 and 128 f32
 * accumulators per thread). */
#define MB_OUT8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MB_OUT32(d, i) MB_OUT8(d, i), MB_OUT8(d, i + 8), MB_OUT8(d, i + 16), MB_OUT8(d, i + 24)
#define MB_OUT96(d) MB_OUT32(d, 0), MB_OUT32(d, 32), MB_OUT32(d, 64)
#define MB_OUT128(d) MB_OUT32(d, 0), MB_OUT32(d, 32), MB_OUT32(d, 64), MB_OUT32(d, 96)
MB_DEVICE void mb_wgmma_n192(float (&d)[96], uint64_t da, uint64_t db, uint32_t acc) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %98, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1;\n\t}"
      : MB_OUT96(d)
      : "l"(da), "l"(db), "r"(acc));
}
MB_DEVICE void mb_wgmma_n256(float (&d)[128], uint64_t da, uint64_t db, uint32_t acc) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %130, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1;\n\t}"
      : MB_OUT128(d)
      : "l"(da), "l"(db), "r"(acc));
}

MB_DEVICE void mb_wgmma(float (&d)[64], uint64_t a, uint64_t b, uint32_t acc) { mm_wgmma_m64n128k32_e4m3(d, a, b, acc); }
MB_DEVICE void mb_wgmma(float (&d)[96], uint64_t a, uint64_t b, uint32_t acc) { mb_wgmma_n192(d, a, b, acc); }
MB_DEVICE void mb_wgmma(float (&d)[128], uint64_t a, uint64_t b, uint32_t acc) { mb_wgmma_n256(d, a, b, acc); }

/* One chain: the 4 k32 slices of a K block from A rows at a_addr, B at b_addr (both
 * 1024-byte aligned, 128-byte swizzle), into p (accumulate: continue p, else start fresh). */
template <int R>
MB_DEVICE void mb_chain(float (&p)[R], uint32_t a_addr, uint32_t b_addr, bool accumulate) {
#pragma unroll
  for (int i = 0; i < R; ++i) mm_wgmma_fence_operand(p[i]);
  mm_wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k)
    mb_wgmma(p, mm_wgmma_desc(mm_wgmma_desc_sw128_lo(a_addr + 32 * k)), mm_wgmma_desc(mm_wgmma_desc_sw128_lo(b_addr + 32 * k)),
             (accumulate || k > 0) ? 1u : 0u);
  mm_wgmma_commit();
#pragma unroll
  for (int i = 0; i < R; ++i) mm_wgmma_fence_operand(p[i]);
}

template <int R>
MB_DEVICE void mb_promote(float (&acc)[R], const float (&p)[R], float s0, float s1) {
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = fmaf(p[i], ((i >> 1) & 1) ? s1 : s0, acc[i]);
}

template <int R>
MB_DEVICE void mb_fence_all(float (&p)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) mm_wgmma_fence_operand(p[i]);
}

MB_DEVICE void mb_bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

/* Waits for a ring phase, spinning at most ~2^27 tries (seconds): a broken ring ends the
 * launch with *failed set instead of hanging (no trap: a trap in the loop makes ptxas
 * ignore setmaxnreg.inc and spill the math registers). */
MB_DEVICE bool mb_wait(uint32_t bar, uint32_t parity, int* failed) {
  if (mm_mbar_try_wait(bar, parity)) return true;
  for (uint32_t spin = 1;; ++spin) {
    if (mm_mbar_try_wait(bar, parity)) return true;
    if (spin == (1u << 27)) {
      *failed = 1;
      return false;
    }
  }
}

/* Shapes of a configuration: NWG math warpgroups, each WAVES waves of 64 rows x N
 * columns (waves stacked along M, sharing the B block; OWNB: a B block per warpgroup). */
template <int NWG, int N, int WAVES, bool OWNB = false>
struct mb_shape {
  static constexpr int kR = N / 2;                      /* accumulators per thread per wave */
  static constexpr int kABytes = NWG * WAVES * 64 * 128; /* one K block of A */
  static constexpr int kBBlockBytes = N * 128;          /* one B block (N columns x 128 K) */
  static constexpr int kBBytes = (OWNB ? NWG : 1) * kBBlockBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStagesFit = (kSmemBudget - kTailBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < kMaxStages ? kStagesFit : kMaxStages;
  static constexpr int kSmem = 1024 + kStages * kStageBytes + kTailBytes; /* 1024: the alignment slack */
  /* + a feed warpgroup (its first thread issues the copies), so the registers move
   * between the roles by setmaxnreg as in the engine: 2 x 128 x 232 + 128 x 40 = 168 x 384,
   * 3 x 128 x 160 + 128 x 32 = 128 x 512 (one math warpgroup: the launch's 255 suffice). */
  static constexpr int kThreads = NWG * 128 + 128;
  static constexpr int kMathRegs = NWG == 3 ? 160 : 232;
  static constexpr int kFeedRegs = NWG == 3 ? 32 : 40;
  static_assert(NWG == 1 || NWG * 128 * kMathRegs + 128 * kFeedRegs <= 65536, "setmaxnreg budget");
  static_assert(kStages >= 2, "two stages fit");
  static_assert(NWG <= kMaxWarpgroups && kThreads <= kMaxThreads, "the sink and cycle buffers' sizes");
};

/* The ring position, identical in the feed thread and the math threads. */
struct mb_pipe {
  uint32_t stage, phase;
};
MB_DEVICE void mb_advance(mb_pipe& p, uint32_t stages) {
  if (++p.stage == stages) {
    p.stage = 0;
    p.phase ^= 1u;
  }
}

template <int NWG, int N, int MODE, int WAVES, bool kFeed, bool OWNB>
__global__ void __launch_bounds__(mb_shape<NWG, N, WAVES, OWNB>::kThreads, 1)
    mb_kernel(int kblocks, const uint8_t* feed_src, float* sink, long long* cycles, int* failed) {
  using S = mb_shape<NWG, N, WAVES, OWNB>;
  constexpr int R = S::kR;
  extern __shared__ uint8_t mb_smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mb_smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t base = mm_smem_addr(smem);
  const uint32_t bars = base + S::kStages * S::kStageBytes; /* full[s] at 8 s, empty[s] at 64 + 8 s */
  float* scales = reinterpret_cast<float*>(smem + S::kStages * S::kStageBytes + 128); /* 8 x 256 row scales */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  /* Stage 0 filled with finite e4m3 codes (the resident operands of feed = off). */
  for (int i = threadIdx.x; i < S::kStageBytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = (0x31u * (uint32_t)i * 2654435761u) & 0x37373737u;
  for (int i = threadIdx.x; i < 8 * 256; i += blockDim.x) scales[i] = 1.0f + 1e-3f * (float)(i % 97);
  mm_fence_proxy_async_smem(); /* the fill before the async proxy's copies and wgmma reads */
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mm_mbar_init(bars + 8 * s, 1);
      mm_mbar_init(bars + 64 + 8 * s, NWG * 4);
    }
    mm_fence_mbar_init();
  }
  __syncthreads();

  if (warp >= NWG * 4) { /* the feed warpgroup */
    if constexpr (NWG > 1) mm_setmaxnreg_dec<S::kFeedRegs>();
    if (kFeed && warp == NWG * 4 && lane == 0) {
      mb_pipe pipe = {0u, 0u};
      size_t off = (size_t)blockIdx.x * S::kStageBytes * 7;
      for (int kb = 0; kb < kblocks; ++kb) {
        mb_wait(bars + 64 + 8 * pipe.stage, pipe.phase ^ 1u, failed);
        const uint32_t full = bars + 8 * pipe.stage;
        mm_mbar_arrive_expect_tx(full, S::kStageBytes);
        if (off + S::kStageBytes > (size_t)kFeedBytes) off = 0;
        mb_bulk_load(base + pipe.stage * S::kStageBytes, feed_src + off, S::kABytes, full);
        mb_bulk_load(base + pipe.stage * S::kStageBytes + S::kABytes, feed_src + off + S::kABytes, S::kBBytes, full);
        off += S::kStageBytes;
        mb_advance(pipe, S::kStages);
      }
    }
    return;
  }

  if constexpr (NWG > 1) mm_setmaxnreg_inc<S::kMathRegs>();
  const int wg = warp >> 2;
  const int r = (threadIdx.x & 127) >> 2; /* a fragment row of the thread (for the scale loads) */
  mb_pipe pipe = {0u, 0u};
  /* Wait for the stage of the next K block (feed on) and return its A and B addresses. */
  auto acquire = [&](uint32_t& a, uint32_t& b) {
    const uint32_t s = kFeed ? pipe.stage : 0u;
    if (kFeed) mb_wait(bars + 8 * s, pipe.phase, failed);
    a = base + s * S::kStageBytes + wg * WAVES * 64 * 128;
    b = base + s * S::kStageBytes + S::kABytes + (OWNB ? wg * S::kBBlockBytes : 0);
    return s;
  };
  auto release = [&](uint32_t s) {
    if (kFeed && lane == 0) mm_mbar_arrive(bars + 64 + 8 * s);
  };

  float acc[WAVES][R];
#pragma unroll
  for (int w = 0; w < WAVES; ++w)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[w][i] = 0.f;
  const long long t0 = clock64();
  if constexpr (MODE == MB_NOSCALE) {
    uint32_t prev = 0;
    for (int kb = 0; kb < kblocks; ++kb) {
      uint32_t a, b;
      const uint32_t s = acquire(a, b);
#pragma unroll
      for (int w = 0; w < WAVES; ++w) mb_fence_all(acc[w]);
      mm_wgmma_fence();
#pragma unroll
      for (int w = 0; w < WAVES; ++w)
#pragma unroll
        for (int k = 0; k < 4; ++k)
          mb_wgmma(acc[w], mm_wgmma_desc(mm_wgmma_desc_sw128_lo(a + w * 8192 + 32 * k)),
                   mm_wgmma_desc(mm_wgmma_desc_sw128_lo(b + 32 * k)), 1u);
      mm_wgmma_commit();
#pragma unroll
      for (int w = 0; w < WAVES; ++w) mb_fence_all(acc[w]);
      mm_wgmma_wait<1>();
      if (kb > 0) release(prev); /* the previous block's chains have completed */
      prev = s;
      mb_advance(pipe, S::kStages);
    }
    mm_wgmma_wait<0>();
#pragma unroll
    for (int w = 0; w < WAVES; ++w) mb_fence_all(acc[w]);
    release(prev);
  } else if constexpr (MODE == MB_1P_EARLY) {
    /* The stage of block kb + 1 and its scales, acquired while block kb's last chain runs. */
    uint32_t a, b;
    uint32_t s = acquire(a, b);
    float sc_cur[WAVES][2];
#pragma unroll
    for (int w = 0; w < WAVES; ++w) {
      sc_cur[w][0] = scales[w * 64 + r];
      sc_cur[w][1] = scales[w * 64 + r + 8];
    }
    auto block = [&](int kb, auto prefetch_next) {
      uint32_t a_n = 0, b_n = 0, s_n = 0;
      float sc_n[WAVES][2];
#pragma unroll
      for (int w = 0; w < WAVES; ++w) {
        float part[R];
        mb_chain(part, a + w * 8192, b, false);
        if (w == WAVES - 1) {
          if constexpr (decltype(prefetch_next)::value) {
            mb_advance(pipe, S::kStages);
            s_n = acquire(a_n, b_n);
            const float* sc = scales + ((kb + 1) & 7) * 256;
#pragma unroll
            for (int v = 0; v < WAVES; ++v) {
              sc_n[v][0] = sc[v * 64 + r];
              sc_n[v][1] = sc[v * 64 + r + 8];
            }
          }
        }
        mm_wgmma_wait<0>();
        mb_fence_all(part);
        if (w == WAVES - 1) release(s);
        mb_promote(acc[w], part, sc_cur[w][0], sc_cur[w][1]);
      }
      if constexpr (decltype(prefetch_next)::value) {
        a = a_n;
        b = b_n;
        s = s_n;
#pragma unroll
        for (int w = 0; w < WAVES; ++w) {
          sc_cur[w][0] = sc_n[w][0];
          sc_cur[w][1] = sc_n[w][1];
        }
      }
    };
    for (int kb = 0; kb + 1 < kblocks; ++kb) block(kb, mm_bool_tag<true>());
    block(kblocks - 1, mm_bool_tag<false>());
    mb_advance(pipe, S::kStages);
  } else if constexpr (MODE == MB_1P || MODE == MB_RESCALE) {
    for (int kb = 0; kb < kblocks; ++kb) {
      uint32_t a, b;
      const uint32_t s = acquire(a, b);
      const float* sc = scales + (kb & 7) * 256;
#pragma unroll
      for (int w = 0; w < WAVES; ++w) {
        const float s0 = sc[w * 64 + r], s1 = sc[w * 64 + r + 8];
        if constexpr (MODE == MB_1P) {
          float part[R];
          mb_chain(part, a + w * 8192, b, false);
          mm_wgmma_wait<0>();
          mb_fence_all(part);
          if (w == WAVES - 1) release(s);
          mb_promote(acc[w], part, s0, s1);
        } else {
#pragma unroll
          for (int i = 0; i < R; ++i) acc[w][i] *= ((i >> 1) & 1) ? s1 : s0;
          mb_chain(acc[w], a + w * 8192, b, true);
          mm_wgmma_wait<0>();
          mb_fence_all(acc[w]);
          if (w == WAVES - 1) release(s);
        }
      }
      mb_advance(pipe, S::kStages);
    }
  } else {
    static_assert(MODE != MB_2P || WAVES == 1, "two partials: one wave per warpgroup");
    /* The engine's two-partial order (gemm_mainloop.cuh): straight-line from each issue
     * to its wait, two units per iteration, then the tail. */
    float p0[R], p1[R];
    float sa0[2], sa1[2];
    uint32_t st0 = 0, st1 = 0;
#define MB_ISSUE(u, p, sa, st)                       \
  do {                                               \
    uint32_t a_, b_;                                 \
    st = acquire(a_, b_);                            \
    sa[0] = scales[((u) & 7) * 256 + r];             \
    sa[1] = scales[((u) & 7) * 256 + r + 8];         \
    mb_chain(p, a_, b_, false);                      \
    mb_advance(pipe, S::kStages);                    \
  } while (0)
#define MB_FINISH(p, sa, st)                \
  do {                                      \
    mb_fence_all(p);                        \
    release(st);                            \
    mb_promote(acc[0], p, sa[0], sa[1]);    \
  } while (0)
    MB_ISSUE(0, p0, sa0, st0);
    int u = 0;
    for (; u + 2 < kblocks; u += 2) {
      MB_ISSUE(u + 1, p1, sa1, st1);
      mm_wgmma_wait<1>();
      MB_FINISH(p0, sa0, st0);
      MB_ISSUE(u + 2, p0, sa0, st0);
      mm_wgmma_wait<1>();
      MB_FINISH(p1, sa1, st1);
    }
    if (u + 1 < kblocks) {
      MB_ISSUE(u + 1, p1, sa1, st1);
      mm_wgmma_wait<1>();
      MB_FINISH(p0, sa0, st0);
      mm_wgmma_wait<0>();
      MB_FINISH(p1, sa1, st1);
    } else {
      mm_wgmma_wait<0>();
      MB_FINISH(p0, sa0, st0);
    }
#undef MB_ISSUE
#undef MB_FINISH
  }
  const long long t1 = clock64();
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < WAVES; ++w)
#pragma unroll
    for (int i = 0; i < R; ++i) sum += acc[w][i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum; /* keeps the math alive */
  if ((threadIdx.x & 127) == 0) cycles[blockIdx.x * NWG + wg] = t1 - t0;
}

struct mb_ctx {
  int sms, kblocks;
  const uint8_t* feed_src;
  float* sink;
  long long* cycles;
  long long* h_cycles;
  int* failed; /* device word: a ring wait gave up */
  cudaEvent_t e0, e1;
};

const char* const kModeName[] = {"noscale", "1p", "2p", "rescale", "1p early"};

template <int NWG, int N, int MODE, int WAVES, bool kFeed, bool OWNB>
int mb_run_one(mb_ctx& c) {
  using S = mb_shape<NWG, N, WAVES, OWNB>;
  auto k = mb_kernel<NWG, N, MODE, WAVES, kFeed, OWNB>;
  MB_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem));
  k<<<c.sms, S::kThreads, S::kSmem>>>(64, c.feed_src, c.sink, c.cycles, c.failed); /* warm-up */
  MB_CUDA(cudaGetLastError());
  float best = 1e30f;
  for (int it = 0; it < 5; ++it) {
    MB_CUDA(cudaEventRecord(c.e0));
    k<<<c.sms, S::kThreads, S::kSmem>>>(c.kblocks, c.feed_src, c.sink, c.cycles, c.failed);
    MB_CUDA(cudaEventRecord(c.e1));
    MB_CUDA(cudaEventSynchronize(c.e1));
    float ms = 0.f;
    MB_CUDA(cudaEventElapsedTime(&ms, c.e0, c.e1));
    if (ms < best) best = ms;
  }
  MB_CUDA(cudaGetLastError());
  int failed = 0;
  MB_CUDA(cudaMemcpy(&failed, c.failed, sizeof failed, cudaMemcpyDeviceToHost));
  if (failed) {
    fprintf(stderr, "bench-gemm --mainloop: a stage-ring wait gave up (%d WG, n%d, %s)\n", NWG, N, kModeName[MODE]);
    return 1;
  }
  MB_CUDA(cudaMemcpy(c.h_cycles, c.cycles, sizeof(long long) * c.sms * NWG, cudaMemcpyDeviceToHost));
  double mean = 0;
  for (int i = 0; i < c.sms * NWG; ++i) mean += (double)c.h_cycles[i];
  mean /= (double)c.sms * NWG;
  const double flop_per_kb = (double)NWG * WAVES * 64.0 * N * 128.0 * 2.0; /* one CTA, one K block */
  const double per_kb = mean / c.kblocks;
  const double bound = flop_per_kb / 8192.0;
  char what[64];
  snprintf(what, sizeof what, "%d WG x %d wave%s m64n%d, %s%s", NWG, WAVES, WAVES > 1 ? "s" : " ", N, kModeName[MODE],
           OWNB ? ", own B" : "");
  printf("%-40s %4s %3d %9.1f %10.1f %9.1f %6.1f %%\n", what, kFeed ? "on" : "off", kFeed ? S::kStages : 0,
         (double)c.sms * flop_per_kb * c.kblocks / (best * 1e-3) * 1e-12, per_kb, bound, 100.0 * bound / per_kb);
  fflush(stdout);
  return 0;
}

template <int NWG, int N, int MODE, int WAVES, bool OWNB = false>
int mb_run(mb_ctx& c) {
  if (mb_run_one<NWG, N, MODE, WAVES, false, OWNB>(c)) return 1;
  return mb_run_one<NWG, N, MODE, WAVES, true, OWNB>(c);
}

}  // namespace

extern "C" int mm_bench_mainloop_run(int kblocks) {
  int dev = 0;
  cudaDeviceProp prop;
  MB_CUDA(cudaGetDevice(&dev));
  MB_CUDA(cudaGetDeviceProperties(&prop, dev));
  mb_ctx c;
  c.sms = prop.multiProcessorCount;
  c.kblocks = kblocks;
  uint8_t* feed = nullptr;
  MB_CUDA(cudaMalloc(&feed, kFeedBytes));
  if (mm_bench_fill_fp8(feed, kFeedBytes, 1.0f, 77, NULL)) {
    fprintf(stderr, "bench-gemm --mainloop: fill failed\n");
    return 1;
  }
  c.feed_src = feed;
  MB_CUDA(cudaMalloc(&c.sink, sizeof(float) * c.sms * kMaxThreads));
  MB_CUDA(cudaMalloc(&c.cycles, sizeof(long long) * c.sms * kMaxWarpgroups));
  c.h_cycles = new long long[c.sms * kMaxWarpgroups];
  MB_CUDA(cudaMalloc(&c.failed, sizeof(int)));
  MB_CUDA(cudaMemset(c.failed, 0, sizeof(int)));
  MB_CUDA(cudaEventCreate(&c.e0));
  MB_CUDA(cudaEventCreate(&c.e1));
  printf("bench-gemm --mainloop on %s (%d SMs): the math warpgroups' K loop alone, %d K blocks of 128 per CTA, "
         "one CTA per SM; best of 5 launches\n",
         prop.name, c.sms, kblocks);
  printf("%-40s %4s %3s %9s %10s %9s %8s\n", "structure", "feed", "stg", "TFLOP/s", "clk/K blk", "bound", "of bound");
  int rc = 0;
  rc = rc || mb_run<1, 128, MB_1P, 1>(c);
  rc = rc || mb_run<1, 128, MB_2P, 1>(c);
  rc = rc || mb_run<2, 128, MB_NOSCALE, 1>(c);
  rc = rc || mb_run<2, 128, MB_1P, 1>(c);
  rc = rc || mb_run<2, 128, MB_2P, 1>(c);
  rc = rc || mb_run<2, 128, MB_NOSCALE, 2>(c);
  rc = rc || mb_run<2, 128, MB_1P, 2>(c);
  rc = rc || mb_run<2, 128, MB_1P_EARLY, 2>(c);
  rc = rc || mb_run<2, 128, MB_1P_EARLY, 1>(c);
  rc = rc || mb_run<2, 192, MB_1P_EARLY, 1>(c);
  rc = rc || mb_run<2, 128, MB_RESCALE, 2>(c);
  rc = rc || mb_run<1, 128, MB_1P, 2>(c);         /* one warpgroup of a staggered pair alone */
  rc = rc || mb_run<2, 128, MB_1P, 2, true>(c);   /* the staggered pair: each its own tile's B */
  rc = rc || mb_run<2, 128, MB_NOSCALE, 2, true>(c);
  rc = rc || mb_run<2, 192, MB_NOSCALE, 1>(c);
  rc = rc || mb_run<2, 192, MB_1P, 1>(c);
  rc = rc || mb_run<2, 256, MB_NOSCALE, 1>(c);
  rc = rc || mb_run<2, 256, MB_RESCALE, 1>(c);
  rc = rc || mb_run<3, 128, MB_NOSCALE, 1>(c);
  rc = rc || mb_run<3, 128, MB_1P, 1>(c);
  printf("clk/K blk: cycles per 128-wide K block per warpgroup (clock64); bound: the tensor-bound cycles at 8192 "
         "FLOP per SM per cycle\n");
  delete[] c.h_cycles;
  cudaFree(c.cycles);
  cudaFree(c.failed);
  cudaFree(c.sink);
  cudaFree(feed);
  return rc;
}
