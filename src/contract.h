/* Host/device contract: plain C structs and constants shared by the C11 host
 * code and the CUDA kernels. Nothing here may depend on CUDA headers. */
#ifndef MEGAMOE_CONTRACT_H
#define MEGAMOE_CONTRACT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Each expert's rows in the expert-major pool start at a multiple of this, so
 * no GEMM m-tile (64 or 128 rows) ever spans two experts. */
#define MM_POOL_ROW_ALIGN 128

/* Scale block of the inputs x and of the weights (DESIGN.md section 1). */
#define MM_SCALE_BLOCK 128

/* The combine's reduction works in units of (token, this many columns): one
 * round trip to memory per warp (route.cuh, mm_reduce_tokens), and one
 * arrival counter per unit (MM_SYM_COMBINE_ARRIVED). A multiple of every L2
 * tile's BN, so a tile's row adds to exactly one unit. */
#define MM_COMBINE_UNIT_COLS 512

/* Ranks of one NVLink node (megamoe.h's MEGAMOE_MAX_RANKS, repeated here so
 * this header needs no CUDA or NCCL header). */
#define MM_MAX_RANKS 8

/* ---- Buffer regions ------------------------------------------------------
 * The layer's memory is two allocations per rank: the symmetric buffer
 * (NCCL window, read and written by peers over NVLink) and the workspace
 * (plain device memory). host/layout.c computes every region's offset; the
 * kernels address region `id` at base + offset[id]. */
typedef enum mm_region_id {
  /* symmetric */
  MM_SYM_FLAGS = 0,      /* [2][MM_MAX_RANKS] u64 barrier flags: bank b, slot p written by peer p */
  MM_SYM_INPUT_X,        /* [T_max, H] fp8: this rank's tokens, pulled by the expert ranks */
  MM_SYM_INPUT_X_SF,     /* [T_max, H/128] fp32 */
  MM_SYM_ROUTE_COUNTS,   /* [R][E_l] i32: rows source rank s routes to each local expert */
  MM_SYM_ROUTE_ENTRIES,  /* [R][T_max*K] mm_route_entry, written by source rank s */
  MM_SYM_COMBINE,        /* [T_max * K][H] bf16: expert outputs pushed back to this source rank, row t * K + k */
  MM_SYM_CALL_TOKENS,    /* fused arm: [R] mm_call_tokens, slot s written by source rank s before barrier 0:
                          * every rank checks every rank's num_tokens_bound against every count */
  MM_SYM_COMBINE_ARRIVED, /* split and fused arms: [T_max][ceil(H / MM_COMBINE_UNIT_COLS)] i32 columns of
                          * combine rows landed per (token, unit), added by the expert ranks' copy warps
                          * after their stores (the early combine, route_phases.cuh) */
  MM_SYM_COMBINE_ORDER,  /* split and fused arms: [R] i32, slot s written by source rank s in routing phase B:
                          * 1 when its forward takes the early combine (its rows are counted), else 0 */
  /* workspace */
  MM_WS_STATUS,          /* mm_device_status */
  MM_WS_EPOCH,           /* u64 number of the forward in progress (1 for the first), counted on
                          * the device (graph replays count too); mirrors mm_device_status.forward */
  MM_WS_PEERS,           /* [MM_MAX_RANKS] peer base pointers of the symmetric buffer */
  MM_WS_EXPERT_TOKENS,   /* [E] i32: routed slots of this rank's tokens per global expert */
  MM_WS_POOL_OFFSET,     /* [E_l + 1] i32: first pool row of each local expert */
  MM_WS_POOL_COUNT,      /* [E_l] i32: valid rows of each local expert */
  MM_WS_ROUTE_BASE,      /* [R][E_l] i32: first entry of (source, local expert) in the source's list */
  MM_WS_POOL_SRC_START,  /* [E_l][R] i32: first pool row of (local expert, source) */
  MM_WS_POOL_ROWS,       /* [P] mm_pool_row */
  MM_WS_POOL_WEIGHT,     /* [P] fp32 routing weight of each pool row */
  MM_WS_POOL_X,          /* [P, H] fp8 */
  MM_WS_POOL_X_SF,       /* [H/128][P] fp32 (K-block-major) */
  MM_WS_L1_ACC,          /* [P, 2I] fp32 (staged arm: L1 output before SwiGLU) */
  MM_WS_L1_OUT,          /* [P, I] fp8 */
  MM_WS_L1_OUT_SF,       /* [I/G][P] fp32 */
  MM_WS_L2_OUT,          /* [P, H] bf16 (staged arm: L2 output before the combine push) */
  MM_WS_GRID_BARRIER,    /* mm_grid_barrier_state of the in-kernel grid barrier (persistent arms) */
  MM_WS_READY,           /* [P / MM_READY_BLOCK_ROWS] i32 rows pulled per pool block (split arm's L1 wait) */
  MM_WS_BLOCK_COUNTERS,  /* fused arm: [MM_FLAG_BANKS][MM_FUSED_COUNTERS][virtual blocks] i32 per-block
                          * counters (pulled rows, L1 done, L2 done), bank = forward & 1 (fused.h) */
  MM_WS_TILE_COUNTERS,   /* [MM_TILE_COUNTERS] i32 tiles claimed per GEMM (gemm_dynamic.cuh; split arm), or the
                            fused arm's tasks claimed [0] and CTAs whose share of the task list is written [1]
                            (its order's dynamic_claim) */
  MM_WS_TASK_LIST,       /* fused arm: [mm_fused_task_list_entries] u64 this forward's stream, packed, decoded
                          * by the whole grid for the producers' dynamic claim (fused.h) */
  MM_REGION_COUNT
} mm_region_id;

/* The persistent arms' in-kernel timeline (diagnostic): events each CTA
 * stamps (%globaltimer, ns) when the layer was created with
 * MEGAMOE_TIMELINE=1 (or =mapped: host/timeline.h). A stamp is the time one designated thread reached the
 * point (the fused arm: the last time it did, over the CTA's tasks); the
 * pull end is the latest of the CTA's pull warps. From
 * MM_TL_FIRST_DURATION on, the entries are durations (ns) summed over the
 * forward, then the SM-clock entries; thread 0 of each CTA zeroes them all
 * when kernel 1 starts (both persistent arms). */
enum mm_timeline_event {
  MM_TL_K1_START = 0,    /* kernel 1 entered */
  MM_TL_COUNTED,         /* grid barrier after validation and counts */
  MM_TL_PUBLISHED,       /* grid barrier after the routing lists were published */
  MM_TL_BARRIER0,        /* CTA 0 passed all-rank barrier 0 (the layout follows) */
  MM_TL_LAYOUT,          /* CTA 0 wrote the pool layout (the grid barrier follows) */
  MM_TL_LAID_OUT,        /* grid barrier after all-rank barrier 0 and the pool layout */
  MM_TL_STREAM_BUILT,    /* fused: the task stream built (the CTA barrier after it) */
  MM_TL_TASKS_DECODED,   /* fused: warp 0's share of the CTA's task cache decoded (before the prologue) */
  MM_TL_ROLES,           /* the roles start (split kernel 1: the scheduler built; fused: the first tasks
                            decoded and the prologue's rows pulled, the CTA barrier after them) */
  MM_TL_PULL_END,        /* the CTA's last pulled row published */
  MM_TL_L1_FIRST_LOAD,   /* the producer's first L1 tile: its rows were ready, its first load issued (fused) */
  MM_TL_L1_FIRST_TILE,   /* the producer's first L1 tile: its last loads issued */
  MM_TL_L1_LAST_ISSUED,  /* the producer issued the last loads of its last L1 tile */
  MM_TL_L1_MATH_END,     /* the math warpgroups finished their last L1 tile */
  MM_TL_K2_START,        /* kernel 2 entered (fused: the producer's first L2 tile, its L1 rows ready) */
  MM_TL_K2_PRODUCER_REGS, /* split kernel 2: the producer thread past its setmaxnreg.dec */
  MM_TL_K2_MATH_REGS,    /* split kernel 2: thread 0 past its setmaxnreg.inc (the producer warpgroup's freed) */
  MM_TL_K2_FIRST_MAIN,   /* split kernel 2: thread 0's first L2 mainloop done (its first epilogue starts) */
  MM_TL_L2_MATH_END,     /* the math warpgroups finished their last L2 tile (scatter issued) */
  MM_TL_PUSHED,          /* grid barrier after every CTA's combine stores (early combine: this CTA's arrival) */
  MM_TL_COMBINED,        /* grid barrier after all-rank barrier 1 (early combine: after the reductions too) */
  MM_TL_REDUCED,         /* the CTA's reductions written */
  MM_TL_WAIT_PULLED,     /* duration: the producer's waits for an L1 tile's pulled rows (fused) */
  MM_TL_WAIT_L1_DONE,    /* duration: the producer's waits for an L2 tile's L1 outputs (fused) */
  MM_TL_WAIT_SLOT,       /* duration: the pull warps' waits for a free ring slot, summed over warps (fused) */
  MM_TL_WAIT_COPY,       /* duration: the copy warp's waits for its rows' pull (fused) */
  /* Durations of the math warps' work (thread 0, so its warpgroup's view; -DMM_FUSED_MATH_TIMELINE=1
   * builds: the fused kernel's parts, and the split kernels' epilogues, L1_EPI and L2_EPI): */
  MM_TL_MATH_TASK,       /* waiting for the next task from the ring (the vote after it: MM_TL_MATH_VOTE) */
  MM_TL_MATH_L1,         /* L1 mainloops */
  MM_TL_MATH_L1_EPI,     /* L1 epilogues (SwiGLU, quantization, stores) */
  MM_TL_MATH_L2,         /* L2 mainloops */
  MM_TL_MATH_L2_EPI,     /* L2 staging for the copy warps (with the wait for the previous tile's copy) */
  MM_TL_MATH_VOTE,       /* the math threads' vote after each task read (the other warpgroup's previous tile) */
  MM_TL_MATH_L1_PUB,     /* L1_DONE publications after the next L1 mainloop (the TMA store's completion, the
                            proxy fence, the barrier, the release) */
  MM_TL_MATH_L2_PUB,     /* the same before an L2 mainloop (the store issued just before, in the L1 epilogue) */
  MM_TL_PROD_PUBLISH,    /* duration: the producer's waits for a free task-ring entry (fused) */
  MM_TL_PROD_LOADS,      /* duration: the producer's tile loads, mostly waits for free pipeline stages (fused) */
  MM_TL_MATH_L1_DATA,    /* of the L1 mainloops: waiting for stages' data (-DMM_GEMM_WAIT_TIMER=1 builds) */
  MM_TL_MATH_L2_DATA,    /* of the L2 mainloops: the same */
  /* The SM clock (not durations; read without the offset): */
  MM_TL_CLK_START,       /* raw: thread 0's %clock64 right after its MM_TL_K1_START stamp */
  MM_TL_CLK_END,         /* raw: thread 0's %clock64 at its last math stamp in kernel 1 (split: L1 math end;
                            fused: L2 math end, so only CTAs with an L2 tile) */
  MM_TL_CLK_END_NS,      /* raw: %globaltimer read with MM_TL_CLK_END */
  MM_TL_SM_KHZ,          /* written by the host (mm_layer_timeline), not the device: the CTA's mean SM clock in
                            kHz over that span, (CLK_END - CLK_START) cycles over (CLK_END_NS - K1_START) ns,
                            routing and barrier waits included; 0 where a reading is missing. NVML's samples,
                            mostly between forwards, do not see it */
  MM_TL_EVENTS
};
#define MM_TL_MAX_CTAS 256
#define MM_TL_FIRST_DURATION MM_TL_WAIT_PULLED

/* The first workspace region: ids below it are symmetric. */
#define MM_FIRST_WORKSPACE_REGION MM_WS_STATUS

/* Everything a kernel of the layer needs, passed by value (host/layer.c
 * builds it once at create). */
typedef struct mm_layer_view {
  int32_t rank, num_ranks;
  int32_t hidden, intermediate, num_experts, local_experts, top_k, quant_group;
  int32_t max_tokens, pool_rows;
  int32_t has_clamp;
  float clamp;
  uint8_t* ws;                       /* local workspace base */
  uint8_t* peer_sym[MM_MAX_RANKS];   /* symmetric buffer base of each rank (own included) */
  uint64_t offset[MM_REGION_COUNT];  /* region offsets in their space */
  uint64_t timeout_ns;
  int32_t num_sms;                   /* the device's SMs: the persistent arms' grid (one CTA each) */
  int32_t fill_blocks;               /* grid of the grid-stride kernels: 4 per SM */
  uint64_t* timeline;                /* [CTA][MM_TL_EVENTS] %globaltimer stamps of the persistent arms' kernels,
                                        or NULL (off: MEGAMOE_TIMELINE=1 or mapped at create turns it on) */
  int32_t ring_blocks;               /* fused arm: ring slots of MM_FUSED_BLOCK_ROWS rows (pool_rows / 128) */
  int32_t virtual_blocks;            /* fused arm: per-block counters per bank (the worst case at T_max) */
  int32_t programmatic_launch;       /* 1: the persistent arms' kernels launch with programmatic stream
                                        serialization (megamoe_set_programmatic_launch); host only */
} mm_layer_view;

/* One forward's inputs. The kernels read every rank's tokens from its
 * symmetric staging region (MM_SYM_INPUT_X*); x / x_sf below are the
 * caller's tokens when a persistent arm stages them itself.
 *
 * injected_error != 0 makes this an EMPTY forward (host/layer.c builds it
 * when megamoe_forward rejects its arguments, so that the rank still takes
 * part and its peers stay in step): num_tokens = 0, topk_idx / topk_w / y
 * NULL, the weights are not read, and the arm records injected_error as this
 * forward's error (site MM_SITE_HOST) before its first barrier, so the
 * barrier flags carry it to the peers. Every arm runs the same cross-rank
 * barrier sequence (MM_BARRIERS_PER_FORWARD) in an empty forward as in a
 * full one. */
typedef struct mm_forward_view {
  const void* topk_idx;
  int32_t topk_idx_int64;
  const float* topk_w;
  int32_t num_tokens;
  uint16_t* y;
  int32_t injected_error; /* a megamoe_status, 0 = none */
  /* The persistent arms: reduce each (token, unit) as soon as its rows have
   * landed, into the combine buffer, and copy to y after barrier 1
   * (route_phases.cuh, mm_persistent_combine_tail); 0: reduce into y after
   * barrier 1. Chosen per call by the host (mm_plan_early_combine). */
  int32_t early_combine;
  /* The caller's tokens, copied into this rank's staging region by routing
   * phase A of the persistent arms (before barrier 0, which publishes them
   * to the peers), or NULL: already there (the caller wrote them there, or
   * the staged arm's host copy). */
  const uint8_t* x;
  const float* x_sf;
} mm_forward_view;

/* Metadata of one pool row: where its token lives. Padding rows have
 * src_rank = -1. token_slot = t * K + k on the source rank. */
typedef struct mm_pool_row {
  int32_t src_rank;
  int32_t token_slot;
} mm_pool_row;

/* One routed (token, slot) as the source rank publishes it to the expert's
 * rank: sorted by local expert, then token, then slot. The routing weight
 * travels with it so the expert side never reads the source's topk_w. */
typedef struct mm_route_entry {
  int32_t token_slot; /* t * K + k */
  float weight;
} mm_route_entry;

/* ---- The device status record: errors keyed by forward ---------------------
 * One per layer, in the workspace (MM_WS_STATUS), zeroed at create except
 * forward = 1.
 *
 * Forwards are numbered on the device: `forward` is the number of the
 * forward in progress; the last kernel of every forward advances it (and
 * writes the error word) once all its CTAs are done (mm_forward_end), so it
 * is stable while any kernel of the forward runs, and graph replays count.
 *
 * The first error of forward f wins: a recorder atomically replaces `key`
 * when it holds an older forward's error, and then fills the fields below
 * it. A kernel treats the layer as failed only when key names the CURRENT
 * forward (mm_failed), so an error of forward n never makes forward n+1
 * skip work, and nothing needs resetting between forwards. Every forward
 * that fails also lands in `first` unless `first` already holds an
 * unreported error: megamoe_sync reports `first` (in words) and clears it.
 *
 * Kernels that start after an error of their forward skip their work but
 * still take part in the cross-rank barriers (the ranks stay in step), except
 * after a timeout: then `dead` is set for good, the barriers are skipped and
 * every later forward reports MEGAMOE_ERR_LAYER_FAILED. */
typedef struct mm_error_report {
  uint64_t key;       /* (forward << MM_STATUS_KEY_SHIFT) | code; 0: none */
  uint64_t forward;   /* the forward the error belongs to */
  uint64_t seen;      /* site-specific: the value a wait saw when it gave up, ... */
  uint64_t want;      /* ... and the value it waited for */
  uint64_t waited_ns; /* how long the wait waited before it gave up (timeouts) */
  int32_t code;       /* a megamoe_status */
  int32_t where;      /* mm_wait_site */
  int32_t peer;       /* the peer a wait was waiting on or that reported the error, or -1 */
  int32_t detail;     /* site-specific: the bad index, the peer's code, the expert, ... */
} mm_error_report;

typedef struct mm_device_status {
  /* The error of forward `epoch` (the fields of the first version). */
  int32_t code;    /* a megamoe_status; this forward's only when epoch == forward */
  int32_t where;   /* mm_wait_site or kernel id, for the message */
  int32_t peer;    /* the peer a wait was waiting on, or -1 */
  int32_t detail;  /* e.g. the bad index, or the token */
  uint64_t seen;   /* the value seen when a wait gave up */
  uint64_t want;   /* the value it waited for */
  /* Forward keying. */
  uint64_t key;       /* (epoch << MM_STATUS_KEY_SHIFT) | code: the word recorders race on */
  uint64_t epoch;     /* the forward number of the error above */
  uint64_t waited_ns; /* for a timeout: how long it waited */
  uint64_t forward;   /* the forward in progress (1 for the first) */
  int32_t word;       /* the error word: 0 or the status of the last finished forward */
  int32_t dead;       /* 1 after a timeout: the ranks are out of step for good */
  uint32_t end_arrivals;    /* CTAs of the forward's last kernel that are done (mm_forward_end) */
  uint32_t failed_forwards; /* forwards that failed since the last megamoe_sync */
  mm_error_report first;    /* the first error since the last megamoe_sync */
} mm_device_status;

#define MM_STATUS_KEY_SHIFT 8
#define MM_STATUS_CODE_MASK 0xffull

/* The split arm's dynamically scheduled GEMMs: counter 0 for L1, 1 for L2. */
#define MM_TILE_COUNTERS 2

/* State of an in-kernel grid barrier (comm/grid.cuh): zero-initialized once,
 * never reset. A monotonic count of arrivals: round r ends when it reaches
 * (r + 1) x CTAs, so every kernel sharing one state must run the same CTA
 * count and arrive the same number of times per CTA (the persistent arms:
 * one CTA per SM, layer.c). 64 bits: it never wraps. */
typedef struct mm_grid_barrier_state {
  uint64_t arrivals; /* CTA arrivals since the layer was created */
} mm_grid_barrier_state;

/* ---- Cross-rank barrier flags ----------------------------------------------
 * A 64-bit word per (bank, peer) in the symmetric buffer: peer p writes slot
 * [bank][p] of every rank with st.release.sys the value
 * (sequence << MM_FLAG_SEQ_SHIFT) | error_code. Barrier number v of the
 * layer's life (v = MM_BARRIERS_PER_FORWARD * forward + index) uses bank
 * v & 1. Sequences only grow (never reset), so a waiter compares with >=.
 *
 * Why two banks: a peer can be at most ONE barrier ahead of a waiter (it
 * cannot pass barrier v + 1 before the waiter signals it), so the slot of
 * bank v & 1 holds exactly barrier v's value once it arrived: the error bits
 * the waiter reads are always barrier v's own, never overwritten by the
 * peer's next barrier (with one bank, a peer error carried at the combine
 * barrier could be replaced by the next forward's clean value before the
 * waiter looked, and be lost). */
#define MM_FLAG_SEQ_SHIFT 8
#define MM_FLAG_ERR_MASK 0xffull
#define MM_FLAG_BANKS 2

/* Every arm runs this many cross-rank barriers per forward (dispatch: the
 * routing is published; combine: the expert outputs have landed), also in an
 * empty forward. */
#define MM_BARRIERS_PER_FORWARD 2

#if defined(__CUDACC__)
#define MM_HOST_DEVICE static __host__ __device__ __forceinline__
#else
#define MM_HOST_DEVICE static inline
#endif

/* MM_TL_SM_KHZ of one CTA's entries `e` (mm_layer_timeline fills it): 0 when
 * a reading is missing or the clock went backwards (the CTA changed SM). */
MM_HOST_DEVICE uint64_t mm_timeline_sm_khz(const uint64_t* e) {
  const uint64_t ns0 = e[MM_TL_K1_START], clk0 = e[MM_TL_CLK_START];
  const uint64_t clk1 = e[MM_TL_CLK_END], ns1 = e[MM_TL_CLK_END_NS];
  if (!ns0 || !clk0 || clk1 <= clk0 || ns1 <= ns0) return 0;
  return (clk1 - clk0) * 1000000ull / (ns1 - ns0);
}

/* ---- The early combine's arrival counters (MM_SYM_COMBINE_ARRIVED) --------
 * One counter per (token, MM_COMBINE_UNIT_COLS-column unit) on the source
 * rank. The copy warps of an expert rank add, for each stored row of an L2
 * tile at column n0 (BN wide), mm_combine_row_columns to the counter at
 * mm_combine_arrival_index; the source's reduction of unit u of a token with
 * `live` routed slots waits for mm_combine_unit_target. Shared with the CPU
 * model of the protocol (tests/unit/test_combine.c). */
MM_HOST_DEVICE int32_t mm_combine_units(int32_t hidden) {
  return (hidden + MM_COMBINE_UNIT_COLS - 1) / MM_COMBINE_UNIT_COLS;
}

MM_HOST_DEVICE int64_t mm_combine_arrival_index(int32_t token_slot, int32_t top_k, int32_t hidden, int32_t n0) {
  return (int64_t)(token_slot / top_k) * mm_combine_units(hidden) + n0 / MM_COMBINE_UNIT_COLS;
}

MM_HOST_DEVICE int32_t mm_combine_row_columns(int32_t hidden, int32_t n0, int32_t bn) {
  return hidden - n0 < bn ? hidden - n0 : bn;
}

MM_HOST_DEVICE int32_t mm_combine_unit_target(int32_t live_slots, int32_t hidden, int32_t unit) {
  const int32_t cols = hidden - unit * MM_COMBINE_UNIT_COLS;
  return live_slots * (cols < MM_COMBINE_UNIT_COLS ? cols : MM_COMBINE_UNIT_COLS);
}

/* Barrier `index` (0: dispatch, 1: combine) of forward `forward`. */
MM_HOST_DEVICE uint64_t mm_barrier_value(uint64_t forward, int index) {
  return (uint64_t)MM_BARRIERS_PER_FORWARD * forward + (uint64_t)index;
}

MM_HOST_DEVICE uint64_t mm_flag_word(uint64_t value, int code) {
  return (value << MM_FLAG_SEQ_SHIFT) | ((uint64_t)code & MM_FLAG_ERR_MASK);
}

/* A waiter for barrier `value` that read flag word `seen`: 1 when the peer
 * arrived (sequence >= value; never ==, so a peer that is already further
 * does not count as absent). */
MM_HOST_DEVICE int mm_flag_arrived(uint64_t seen, uint64_t value) {
  return (seen >> MM_FLAG_SEQ_SHIFT) >= value;
}

/* The error code the peer carried in `seen` once it arrived (0: none). */
MM_HOST_DEVICE int mm_flag_error(uint64_t seen) { return (int)(seen & MM_FLAG_ERR_MASK); }

/* Wait sites, for the timeout message. */
enum mm_wait_site {
  MM_SITE_NONE = 0,
  MM_SITE_BARRIER_DISPATCH = 1, /* after routing was published, before the pull */
  MM_SITE_BARRIER_COMBINE = 2,  /* after the combine push, before the reduction */
  MM_SITE_ROUTE = 3,
  MM_SITE_DISPATCH = 4,
  MM_SITE_GEMM_ROWS_READY = 5,  /* a GEMM producer waiting for its A rows (arrival counter) */
  MM_SITE_GEMM_PIPE = 6,        /* a GEMM role waiting on its shared-memory pipeline */
  MM_SITE_GRID_BARRIER = 7,     /* an in-kernel grid barrier */
  MM_SITE_HOST = 8,             /* megamoe_forward rejected its arguments; the forward ran empty */
  MM_SITE_POOL = 9,             /* the expert pool layout (capacity check) */
  MM_SITE_TOKEN_BOUND = 10,     /* fused arm: a rank's num_tokens_bound below a count, or bounds that differ */
  MM_SITE_RING = 11,            /* fused arm: the blocks of a single-wave forward do not fit the ring */
  MM_SITE_RING_SLOT = 12,       /* fused arm: a pull waiting for its ring slot's previous L2 readers */
  MM_SITE_COMBINE_ARRIVED = 13, /* the early combine: a (token, unit) waiting for its rows (arrival counter) */
  MM_SITE_COUNT
};

/* The prepared W1 (what megamoe_prepare_weights produces): 64-row chunks of
 * gate and up interleaved, so prepared rows [128 c, 128 c + 64) are gate rows
 * [64 c, 64 c + 64) of the checkpoint and prepared rows [128 c + 64, 128 c + 128)
 * the matching up rows I + 64 c ... Its scales are per 64-row chunk:
 * W1p_sf [E_l, 2I / 64, H / 128], each the checkpoint's 128x128 block scale of
 * the chunk's rows. Any 128-wide column tile of the L1 output therefore holds
 * 64 matching (gate, up) pairs: a-columns [64 c, 64 c + 64). */
#define MM_W1_INTERLEAVE 64

/* ---- Grouped block-scaled FP8 GEMM (the engine, src/device/gemm/) ----------
 * D[rows of expert e] = A[rows of expert e] * B[e]^T, fp32 accumulation
 * promoted per K block with the block scales (DESIGN.md section 1).
 *
 * Rows: expert e's valid rows are expert_count[e] rows starting at pool row
 * expert_offset[e] (a multiple of MM_POOL_ROW_ALIGN). Those are the OUTPUT rows
 * (d, the SwiGLU outputs, row weights, the scatter table). The A rows (and A
 * scales, and the rows-ready counters) of expert e start at
 * expert_a_offset[e] when that array is given, else at expert_offset[e]: a
 * ring slot of the fused arm is not the pool row. Rows past the count
 * (padding) may hold anything; their outputs are not written. */
typedef enum mm_gemm_output {
  MM_GEMM_OUT_F32 = 0,          /* d fp32 [rows_cap, n] */
  MM_GEMM_OUT_BF16 = 1,         /* d bf16 [rows_cap, n], round to nearest even */
  MM_GEMM_OUT_SWIGLU_FP8 = 2,   /* the L1 epilogue, through `swiglu` (B = the prepared W1, n = 2I) */
  MM_GEMM_OUT_BF16_SCATTER = 3  /* bf16 rows to per-row destinations, through `scatter` */
} mm_gemm_output;

/* Epilogue of the L1 GEMM (MM_GEMM_OUT_SWIGLU_FP8). B is the prepared W1
 * (above). Output: a = silu(g) * u * weight (clamp first), quantized per
 * `group` a-columns (64 or 128): out [rows_cap, n / 2] fp8, out_sf
 * [n / 2 / group][rows_cap] fp32 with sf = max(amax, 1e-10) / 448. */
typedef struct mm_swiglu_epilogue {
  const float* row_weight; /* [rows_cap] routing weight of each output row */
  int32_t group;
  int32_t has_clamp;
  float clamp;
  uint8_t* out;
  float* out_sf;
  /* Set by mm_gemm_plan_make when the plan's fourth tensor map is `out` as
   * [rows_cap][n / 2] bytes in boxes of 128 bytes x BM rows (a 256-wide
   * tile, `out` 16-byte aligned, n / 2 a multiple of 16): a kernel with the
   * SwiGLU staging area stores full tiles' codes through it
   * (gemm_epilogue.cuh). Ignored by kernels without one. */
  int32_t tma_out;
} mm_swiglu_epilogue;

/* Scatter epilogue (MM_GEMM_OUT_BF16_SCATTER): output row r (a valid row)
 * goes to dst_base[rows[r].src_rank] + rows[r].token_slot * n * 2 bytes, a
 * bf16 row of n columns; rows with src_rank < 0 are skipped. The split and
 * fused arms pass the pool-row table and every rank's combine buffer, so each
 * L2 row lands in its source rank's [T_max * K][H] combine region over
 * NVLink. Staged through shared memory: 16-byte, coalesced stores. */
typedef struct mm_gemm_scatter {
  uint8_t* dst_base[MM_MAX_RANKS];
  const mm_pool_row* rows; /* [rows_cap] */
  /* Optional (the copy warps' path, mm_gemm_copy_tile): every rank's
   * MM_SYM_COMBINE_ARRIVED counters, or NULL. After a tile's rows are
   * stored, each stored row adds its column count to
   * arrived_base[src_rank][(token_slot / top_k) * units + n0 / MM_COMBINE_UNIT_COLS]
   * (units = ceil(n / MM_COMBINE_UNIT_COLS)) with system-scope release order,
   * for the sources whose source_early entry is set. */
  int32_t* arrived_base[MM_MAX_RANKS];
  int32_t top_k;
  /* [num_ranks] this forward's combine order of each source rank
   * (MM_SYM_COMBINE_ORDER, this rank's copy): rows are counted only for
   * sources that take the early order. */
  const int32_t* source_early;
  int32_t num_ranks;
} mm_gemm_scatter;

/* A rows that arrive while the GEMM runs (the split and fused arms): before
 * loading the A rows of a tile, the producer waits (acquire, with the
 * deadline) until counters[b] >= base + per_row * (valid rows of block b)
 * for every MM_READY_BLOCK_ROWS-row block b of A rows the tile covers (b
 * indexes A rows: a / MM_READY_BLOCK_ROWS). counters == NULL: every row is
 * ready at launch. Writers store the rows, fence.proxy.async.global, then
 * add with release (comm/wait.cuh). */
#define MM_READY_BLOCK_ROWS 128
typedef struct mm_gemm_ready {
  const int32_t* counters;
  int32_t base;
  int32_t per_row;
} mm_gemm_ready;

typedef struct mm_gemm_problem {
  /* A fp8 e4m3 [rows_cap, k] (row stride k); A_sf fp32 [k / a_sf_block][rows_cap]
   * (K-block-major; a_sf_block 128, or 64 for the L2 input when G = 64). */
  const uint8_t* a;
  const float* a_sf;
  int32_t a_sf_block;
  /* B fp8 e4m3 [num_experts, n, k], K-major; B_sf fp32 [num_experts][n / b_sf_block_n][k / 128]
   * (b_sf_block_n 128, or 64 for the prepared W1). */
  const uint8_t* b;
  const float* b_sf;
  int32_t b_sf_block_n;
  const int32_t* expert_offset;   /* [num_experts + 1] (device) */
  const int32_t* expert_count;    /* [num_experts] (device) */
  const int32_t* expert_a_offset; /* [num_experts] (device) or NULL */
  int32_t num_experts;
  int32_t rows_cap;
  int32_t n;
  int32_t k;
  int32_t out_kind;               /* mm_gemm_output */
  void* d;                        /* F32 / BF16 output */
  mm_swiglu_epilogue swiglu;
  mm_gemm_scatter scatter;
  mm_gemm_ready ready;
  /* A wait that passes timeout_ns records MEGAMOE_ERR_TIMEOUT here (first
   * error wins) and the kernel leaves; NULL: nothing is recorded (the kernel
   * still leaves). */
  mm_device_status* status;
  uint64_t timeout_ns;
} mm_gemm_problem;

/* Default deadline of the engine's waits when the problem gives none. */
#define MM_GEMM_DEFAULT_TIMEOUT_NS 60000000000ull

#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_CONTRACT_H */
