/* The persistent arms' chunked routing (src/device/route/route.cuh:
 * mm_route_chunk_count, then a grid barrier, then mm_route_chunk_publish)
 * run alone in a cooperative kernel on a hand-built layer view whose R
 * destination ranks are R buffers of this GPU. Each destination's counts and
 * list are compared entry for entry (slot and weight bits) with the host's
 * lists in (token, slot) order, the order every arm's pool is built in; the
 * words around them (other sources' counts and lists, the list past its
 * count) must keep their poison. Each case runs after a forward with
 * another routing on the same count table. The layer tests cannot see this
 * order: a pool permuted within an expert gives the same y. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/grid.cuh"
#include "gemm/gemm_cfg.cuh"
#include "gpu_suites.h"
#include "route/route.cuh"

namespace {

const uint64_t kTimeoutNs = 10ull * 1000 * 1000 * 1000; /* must never fire */

uint64_t route_seed() {
  static uint64_t seed = 0;
  if (seed == 0) {
    const char* s = getenv("MEGAMOE_TEST_SEED");
    seed = (s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL)) | 1u;
    printf("    route tests: seed %llu (MEGAMOE_TEST_SEED=%llu reproduces)\n", (unsigned long long)seed,
           (unsigned long long)seed);
  }
  return seed;
}

uint64_t splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ void rt_spin_ns(uint64_t ns) {
  const uint64_t t0 = mm_globaltimer_ns();
  while (mm_globaltimer_ns() - t0 < ns) {
  }
}

/* Phase A, the grid barrier, phase B, as route_phases.cuh runs them.
 * use_barrier = 0 is the planted control: CTA 0 (whose chunk has slots
 * whenever any CTA's has) counts 50 us late and no barrier waits for it, so
 * the others sum its stale row of the table. */
__global__ void k_route_chunked(mm_layer_view L, mm_forward_view F, mm_grid_barrier_state* gb, int failed,
                                int use_barrier, unsigned* barrier_failed) {
  __shared__ int scratch[MM_ROUTE_CHUNK_SCRATCH_INTS];
  int32_t* const table = mm_ws<int32_t>(L, MM_WS_ROUTE_CTA_COUNTS);
  if (!use_barrier && blockIdx.x == 0 && threadIdx.x == 0) rt_spin_ns(50000);
  __syncthreads();
  mm_route_chunk_count(F, L.top_k, L.num_experts, table, scratch + 64);
  if (use_barrier) {
    const mm_wait_ctx ctx = {mm_status(L), kTimeoutNs, MM_SITE_GRID_BARRIER, NULL};
    if (!mm_grid_barrier(gb, ctx)) {
      if (threadIdx.x == 0) atomicAdd(barrier_failed, 1u);
      return;
    }
  }
  mm_route_chunk_publish(L, F, table, failed != 0, scratch + 64);
}

enum rt_pattern {
  RT_UNIFORM_MASKED, /* any expert, 10 % of slots masked (-1) */
  RT_REPEATS_BAD,    /* a token's slots may repeat an expert; 5 % ids outside [-1, E) (skipped: the
                        validation's error is recorded elsewhere) */
  RT_ONE_EXPERT,     /* every slot on the last expert, a few int64 ids past 2^31 */
};

typedef struct rt_case {
  const char* what;
  int E, R, src, K, T, T_max;
  int grid; /* CTAs; 0: every SM */
  int idx64, failed;
  rt_pattern pattern;
} rt_case;

const uint32_t kPoison = 0xFFFFFFFFu;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* Runs one case; returns the mismatches found (printing the first few), or
 * -1 when it could not run (then *why says why). */
long rt_run(const rt_case& c, int use_barrier, const char** why) {
  const int El = c.E / c.R;
  const int64_t slots = (int64_t)c.T * c.K, list_cap = (int64_t)c.T_max * c.K;
  int dev = 0, sms = 0;
  *why = "CUDA setup";
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return -1;
  const int grid = c.grid > 0 ? c.grid : sms;
  if (grid > sms || grid > MM_ROUTE_CHUNK_MAX_GRID) {
    *why = "grid above the SM count";
    return -1;
  }
  /* The routing, as a caller passes it. */
  uint64_t rng = route_seed() ^ ((uint64_t)c.E << 40) ^ ((uint64_t)c.T << 8) ^ (uint64_t)c.K;
  int64_t* ids = (int64_t*)malloc(sizeof(int64_t) * (size_t)(slots + 1));
  float* w = (float*)malloc(sizeof(float) * (size_t)(slots + 1));
  for (int64_t i = 0; i < slots; ++i) {
    const uint64_t r = splitmix(&rng);
    int64_t v = (int64_t)(r % (uint64_t)c.E);
    if (c.pattern == RT_UNIFORM_MASKED && r % 10 == 3) v = -1;
    if (c.pattern == RT_REPEATS_BAD) {
      const int64_t bad[4] = {-7, c.E, c.E + 100, INT32_MAX};
      if (r % 20 == 1) v = bad[(r >> 20) % 4];
      else if (i % c.K > 0 && r % 3 == 0) v = ids[i - 1]; /* the token's previous slot's expert */
    }
    if (c.pattern == RT_ONE_EXPERT) v = (c.idx64 && r % 50 == 7) ? ((int64_t)1 << 40) : c.E - 1;
    ids[i] = v;
    w[i] = v >= 0 && v < c.E ? (float)(splitmix(&rng) % 100000) / 1000.f - 50.f : NAN;
  }
  /* The host's lists: per destination, its local experts in order, each
   * expert's slots ascending. */
  int32_t* want_count = (int32_t*)calloc((size_t)c.E, sizeof(int32_t));
  for (int64_t i = 0; i < slots; ++i)
    if (ids[i] >= 0 && ids[i] < c.E) ++want_count[ids[i]];
  int64_t* first = (int64_t*)calloc((size_t)c.E, sizeof(int64_t)); /* list position of e's first entry */
  for (int e = 0; e < c.E; ++e) first[e] = e % El == 0 ? 0 : first[e - 1] + want_count[e - 1];
  mm_route_entry* want = (mm_route_entry*)malloc(sizeof(mm_route_entry) * (size_t)(c.R * list_cap + 1));
  int64_t* cursor = (int64_t*)malloc(sizeof(int64_t) * (size_t)c.E);
  memcpy(cursor, first, sizeof(int64_t) * (size_t)c.E);
  for (int64_t i = 0; i < slots; ++i) {
    if (ids[i] < 0 || ids[i] >= c.E) continue;
    const int e = (int)ids[i];
    mm_route_entry en;
    en.token_slot = (int32_t)i;
    en.weight = w[i];
    want[(int64_t)(e / El) * list_cap + cursor[e]++] = en;
  }

  /* Device buffers: the workspace (table, status), one symmetric buffer
   * per destination (counts [R][El], lists [R][T_max K]), poisoned. */
  const size_t table_bytes = (size_t)c.E * MM_ROUTE_CHUNK_MAX_GRID * 4;
  const size_t ws_bytes = align256(table_bytes) + sizeof(mm_device_status);
  const size_t counts_bytes = (size_t)c.R * El * 4, list_bytes = (size_t)c.R * list_cap * sizeof(mm_route_entry);
  const size_t sym_bytes = align256(counts_bytes) + list_bytes;
  uint8_t *ws = NULL, *sym[MM_MAX_RANKS] = {NULL};
  void *d_ids = NULL, *d_w = NULL;
  mm_grid_barrier_state* gb = NULL;
  unsigned* barrier_failed = NULL;
  long bad = -1;
  uint8_t* host_sym = (uint8_t*)malloc(sym_bytes);
  const size_t id_bytes = (size_t)(slots + 1) * (c.idx64 ? 8 : 4);
  void* host_ids = malloc(id_bytes);
  for (int64_t i = 0; i < slots; ++i) {
    if (c.idx64) ((int64_t*)host_ids)[i] = ids[i];
    else ((int32_t*)host_ids)[i] = (int32_t)ids[i];
  }
  bool ok = cudaMalloc((void**)&ws, ws_bytes) == cudaSuccess && cudaMemset(ws, 0, ws_bytes) == cudaSuccess &&
            cudaMalloc(&d_ids, id_bytes) == cudaSuccess &&
            cudaMemcpy(d_ids, host_ids, id_bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMalloc(&d_w, sizeof(float) * (size_t)(slots + 1)) == cudaSuccess &&
            cudaMemcpy(d_w, w, sizeof(float) * (size_t)(slots + 1), cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMalloc((void**)&gb, sizeof *gb) == cudaSuccess && cudaMemset(gb, 0, sizeof *gb) == cudaSuccess &&
            cudaMalloc((void**)&barrier_failed, 4) == cudaSuccess && cudaMemset(barrier_failed, 0, 4) == cudaSuccess;
  for (int d = 0; d < c.R && ok; ++d)
    ok = cudaMalloc((void**)&sym[d], sym_bytes) == cudaSuccess && cudaMemset(sym[d], 0xFF, sym_bytes) == cudaSuccess;
  if (ok) {
    mm_layer_view L;
    memset(&L, 0, sizeof L);
    L.rank = c.src, L.num_ranks = c.R, L.num_experts = c.E, L.local_experts = El, L.top_k = c.K;
    L.max_tokens = c.T_max;
    L.ws = ws;
    for (int d = 0; d < c.R; ++d) L.peer_sym[d] = sym[d];
    L.offset[MM_WS_ROUTE_CTA_COUNTS] = 0;
    L.offset[MM_WS_STATUS] = align256(table_bytes);
    L.offset[MM_SYM_ROUTE_COUNTS] = 0;
    L.offset[MM_SYM_ROUTE_ENTRIES] = align256(counts_bytes);
    L.timeout_ns = kTimeoutNs;
    mm_forward_view F;
    memset(&F, 0, sizeof F);
    F.topk_idx = d_ids, F.topk_idx_int64 = c.idx64, F.topk_w = (const float*)d_w, F.num_tokens = c.T;
    int failed = c.failed;
    void* args[] = {&L, &F, &gb, &failed, &use_barrier, &barrier_failed};
    cudaError_t e = cudaSuccess;
    if (use_barrier) {
      /* A forward before, on the same table, with every valid id moved to
       * the next expert: the checked routing must not read its counts. */
      for (int64_t i = 0; i < slots; ++i) {
        const int64_t v = ids[i] >= 0 && ids[i] < c.E ? (ids[i] + 1) % c.E : ids[i];
        if (c.idx64) ((int64_t*)host_ids)[i] = v;
        else ((int32_t*)host_ids)[i] = (int32_t)v;
      }
      int prior_failed = 0;
      void* prior_args[] = {&L, &F, &gb, &prior_failed, &use_barrier, &barrier_failed};
      e = cudaMemcpy(d_ids, host_ids, id_bytes, cudaMemcpyHostToDevice);
      if (e == cudaSuccess)
        e = cudaLaunchCooperativeKernel((const void*)k_route_chunked, dim3(grid), dim3(MM_GEMM_THREADS), prior_args, 0, 0);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      for (int64_t i = 0; i < slots; ++i) {
        if (c.idx64) ((int64_t*)host_ids)[i] = ids[i];
        else ((int32_t*)host_ids)[i] = (int32_t)ids[i];
      }
      if (e == cudaSuccess) e = cudaMemcpy(d_ids, host_ids, id_bytes, cudaMemcpyHostToDevice);
      for (int d = 0; d < c.R && e == cudaSuccess; ++d) e = cudaMemset(sym[d], 0xFF, sym_bytes);
    }
    if (e == cudaSuccess)
      e = cudaLaunchCooperativeKernel((const void*)k_route_chunked, dim3(grid), dim3(MM_GEMM_THREADS), args, 0, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    unsigned bf = 0;
    if (e == cudaSuccess) e = cudaMemcpy(&bf, barrier_failed, 4, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess || bf) {
      fprintf(stderr, "    k_route_chunked: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "a grid barrier gave up");
      *why = "the kernel failed";
      ok = false;
    }
  }
  if (ok) {
    bad = 0;
    int shown = 0;
    for (int d = 0; d < c.R && ok; ++d) {
      if (cudaMemcpy(host_sym, sym[d], sym_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        ok = false;
        bad = -1;
        break;
      }
      const int32_t* counts = (const int32_t*)host_sym;
      const mm_route_entry* list = (const mm_route_entry*)(host_sym + align256(counts_bytes));
      int64_t total = 0;
      for (int s = 0; s < c.R; ++s)
        for (int le = 0; le < El; ++le) {
          const int32_t got = counts[s * El + le];
          const int32_t exp = s != c.src ? (int32_t)kPoison : c.failed ? 0 : want_count[d * El + le];
          if (s == c.src && !c.failed) total += want_count[d * El + le];
          if (got != exp) {
            if (shown++ < 5)
              fprintf(stderr, "    destination %d: count of source %d, local expert %d: %d, want %d\n", d, s, le, got,
                      exp);
            ++bad;
          }
        }
      for (int s = 0; s < c.R; ++s)
        for (int64_t j = 0; j < list_cap; ++j) {
          const mm_route_entry got = list[(int64_t)s * list_cap + j];
          uint32_t got_w, exp_w = kPoison;
          memcpy(&got_w, &got.weight, 4);
          int32_t exp_slot = (int32_t)kPoison;
          if (s == c.src && j < total) {
            const mm_route_entry& x = want[(int64_t)d * list_cap + j];
            exp_slot = x.token_slot;
            memcpy(&exp_w, &x.weight, 4);
          }
          if (got.token_slot != exp_slot || got_w != exp_w) {
            if (shown++ < 5)
              fprintf(stderr, "    destination %d: source %d's entry %lld: slot %d weight 0x%08x, want %d 0x%08x\n",
                      d, s, (long long)j, got.token_slot, got_w, exp_slot, exp_w);
            ++bad;
          }
        }
    }
  }
  for (int d = 0; d < c.R; ++d) cudaFree(sym[d]);
  cudaFree(ws);
  cudaFree(d_ids);
  cudaFree(d_w);
  cudaFree(gb);
  cudaFree(barrier_failed);
  free(host_sym);
  free(host_ids);
  free(ids);
  free(w);
  free(want_count);
  free(first);
  free(want);
  free(cursor);
  return bad;
}

const rt_case kCases[] = {
    {"E 32 on 1 rank, K 6, 8192 tokens, 10 % masked (the bench's flash-rank)", 32, 1, 0, 6, 8192, 8192, 0, 0, 0,
     RT_UNIFORM_MASKED},
    {"E 64 on 4 ranks (source 2), K 8, 3001 tokens, repeated and bad ids, 37 CTAs", 64, 4, 2, 8, 3001, 4096, 37, 0, 0,
     RT_REPEATS_BAD},
    {"E 256 on 8 ranks (source 7), K 16, 1025 tokens, int64 ids: one expert, some past 2^31", 256, 8, 7, 16, 1025,
     1100, 0, 1, 0, RT_ONE_EXPERT},
    {"E 7 on 1 rank, K 3, 1 token (most chunks empty)", 7, 1, 0, 3, 1, 16, 0, 0, 0, RT_UNIFORM_MASKED},
    {"E 32 on 2 ranks (source 1), K 8, 65536 tokens (several batches per warp)", 32, 2, 1, 8, 65536, 65536, 0, 0, 0,
     RT_UNIFORM_MASKED},
    {"E 48 on 1 rank, K 8, 4096 tokens in one CTA", 48, 1, 0, 8, 4096, 4096, 1, 0, 0, RT_REPEATS_BAD},
    {"E 32 on 2 ranks, 0 tokens", 32, 2, 0, 6, 0, 64, 0, 0, 0, RT_UNIFORM_MASKED},
    {"E 32 on 2 ranks (source 1), 2048 tokens, a failed forward: counts 0, no entry", 32, 2, 1, 6, 2048, 2048, 0, 0,
     1, RT_UNIFORM_MASKED},
};

mm_test_result t_route_chunked_lists(void) {
  int ran = 0;
  for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; ++i) {
    const char* why = "";
    const long bad = rt_run(kCases[i], 1, &why);
    if (bad < 0 && strcmp(why, "grid above the SM count") == 0) {
      printf("    skipped (%s): %s\n", why, kCases[i].what);
      continue;
    }
    CHECK_MSG(bad == 0, "%s: %ld mismatches%s%s", kCases[i].what, bad, bad < 0 ? ", did not run: " : "",
              bad < 0 ? why : "");
    printf("    %s: lists equal\n", kCases[i].what);
    ++ran;
  }
  CHECK_MSG(ran >= 6, "only %d of the cases ran", ran);
  return MM_TEST_PASS;
}

mm_test_result t_control_route_no_barrier(void) {
  const char* why = "";
  const long bad = rt_run(kCases[0], 0, &why);
  CHECK_MSG(bad >= 0, "the planted run did not run: %s", why);
  printf("    planted missing grid barrier between the phases: %ld wrong words caught\n", bad);
  CHECK_MSG(bad > 0, "the list check did not catch a stale count table");
  return MM_TEST_PASS;
}

}  // namespace

extern "C" const mm_test mm_route_gpu_tests[] = {
    {"route: chunked counts and lists equal the host's (token, slot) order, poison around them intact",
     t_route_chunked_lists},
    {"route control: phase B without the grid barrier after phase A is caught", t_control_route_no_barrier},
    {NULL, NULL},
};
