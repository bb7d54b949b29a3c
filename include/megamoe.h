/* megamoe — expert-parallel FP8 Mixture-of-Experts layer for Hopper GPUs.
 *
 * One public header. Everything the library reports crosses it as a
 * megamoe_status; the text of the last failure on the calling thread is
 * available from megamoe_last_error(). Nothing in the library calls exit()
 * or abort().
 *
 * The numerics contract (what one forward computes) is docs/DESIGN.md
 * section 1. Shapes use the names of that section:
 *   H hidden, I intermediate, E experts in total, K top-k, R ranks,
 *   E_l = E / R local experts per rank, T tokens on this rank (T <= T_max),
 *   G quantization group of the L1 output (64 or 128).
 */
#ifndef MEGAMOE_H
#define MEGAMOE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEGAMOE_VERSION_MAJOR 0
#define MEGAMOE_VERSION_MINOR 1

/* Kernel limits (checked by megamoe_check_config). */
#define MEGAMOE_MAX_RANKS 8              /* one NVLink node */
#define MEGAMOE_MAX_INTERMEDIATE 4096    /* I: the L1 epilogue keeps a row's groups on chip */
#define MEGAMOE_MAX_HIDDEN 16384         /* H */
#define MEGAMOE_MAX_TOP_K 16             /* K */
#define MEGAMOE_MAX_LOCAL_EXPERTS 1024   /* E_l */
#define MEGAMOE_DEFAULT_TIMEOUT_S 60.0   /* every cross-rank wait has this deadline */

typedef enum megamoe_status {
  MEGAMOE_OK = 0,
  MEGAMOE_ERR_NULL_POINTER = 1,      /* a required pointer argument is NULL */
  MEGAMOE_ERR_BAD_SHAPE = 2,         /* H or I not a multiple of 128, or a size outside the kernels' limits */
  MEGAMOE_ERR_BAD_EXPERTS = 3,       /* E < 1, E not divisible by the rank count, or E_l too large */
  MEGAMOE_ERR_BAD_TOP_K = 4,         /* K < 1, K > E or K above MEGAMOE_MAX_TOP_K */
  MEGAMOE_ERR_BAD_MAX_TOKENS = 5,    /* T_max = 0 or negative */
  MEGAMOE_ERR_BAD_QUANT_GROUP = 6,   /* G not 64 or 128 */
  MEGAMOE_ERR_BAD_CLAMP = 7,         /* SwiGLU clamp enabled with a value <= 0 or not finite */
  MEGAMOE_ERR_BAD_ARM = 8,           /* arm not one of megamoe_arm */
  MEGAMOE_ERR_BAD_RANKS = 9,         /* rank count < 1 or above MEGAMOE_MAX_RANKS, rank out of range */
  MEGAMOE_ERR_SIZE_OVERFLOW = 10,    /* a buffer size does not fit in 64 bits */
  MEGAMOE_ERR_TOO_MANY_TOKENS = 11,  /* T > T_max, a token bound below T, or more rows routed to a
                                      * rank than its pool holds (config pool_imbalance) */
  MEGAMOE_ERR_BAD_TOPK_INDEX = 12,   /* a top-k index outside [-1, E) (found on the host or on the device) */
  MEGAMOE_ERR_BAD_ARGUMENT = 13,     /* any other argument out of its domain (the message names it) */
  MEGAMOE_ERR_CUDA = 14,             /* a CUDA runtime or driver call failed */
  MEGAMOE_ERR_NCCL = 15,             /* an NCCL call failed */
  MEGAMOE_ERR_OUT_OF_MEMORY = 16,
  MEGAMOE_ERR_NO_PEER_ACCESS = 17,   /* the ranks are not all in one NVLink (load/store) domain */
  MEGAMOE_ERR_TIMEOUT = 18,          /* a cross-rank wait passed its deadline: a peer stopped answering */
  MEGAMOE_ERR_PEER_FAILED = 19,      /* a peer reported an error in the same forward */
  MEGAMOE_ERR_LAYER_FAILED = 20,     /* an earlier timeout left the ranks out of step; destroy the layer */
  MEGAMOE_ERR_NO_DEVICE = 21,        /* no CUDA device */
  MEGAMOE_ERR_UNSUPPORTED_DEVICE = 22, /* not a Hopper (sm_90) GPU */
  MEGAMOE_ERR_NOT_IMPLEMENTED = 23,
  MEGAMOE_ERR_WEIGHTS_NOT_READY = 24, /* forward before megamoe_prepare_weights */
  MEGAMOE_ERR_INTERNAL = 25,
  MEGAMOE_ERR_DEVICE_CHECK = 26,     /* a device-side consistency check failed (see the message) */
  MEGAMOE_STATUS_COUNT
} megamoe_status;

/* Static text of a status ("MEGAMOE_ERR_BAD_SHAPE: ..."). Never NULL. */
const char* megamoe_status_string(megamoe_status status);

/* Message of the last failing call on this thread, naming the argument or
 * the call that failed. "" when none. Valid until the next call. */
const char* megamoe_last_error(void);

typedef enum megamoe_arm {
  MEGAMOE_ARM_STAGED = 0, /* separate kernels: the baseline and the oracle */
  MEGAMOE_ARM_SPLIT = 1,  /* (dispatch + L1 + SwiGLU + quant) then (L2 + combine) */
  MEGAMOE_ARM_FUSED = 2,  /* one persistent kernel */
  MEGAMOE_ARM_COUNT
} megamoe_arm;

const char* megamoe_arm_name(megamoe_arm arm);

typedef struct megamoe_config {
  int64_t hidden;              /* H, multiple of 128 */
  int64_t intermediate;        /* I, multiple of 128, <= MEGAMOE_MAX_INTERMEDIATE */
  int32_t num_experts;         /* E in total, divisible by the rank count */
  int32_t top_k;               /* K */
  int64_t max_tokens_per_rank; /* T_max */
  int32_t quant_group;         /* G of the L1 output quantization: 64 or 128 */
  int32_t has_swiglu_clamp;    /* 0: no clamp; 1: g = min(g, c), u = clamp(u, -c, c) */
  float swiglu_clamp;          /* c > 0 when has_swiglu_clamp */
  megamoe_arm arm;
  /* Deadline of every cross-rank wait; <= 0 means the default (60 s). A
   * peer that stops answering (its process died, it skipped a forward) is
   * reported within about this long: MEGAMOE_ERR_TIMEOUT naming it. Any
   * positive value is used as given; the fault tests (tests/faults) run at
   * 1 s. Keep it well above the longest forward. */
  double timeout_s;
  /* The most routed rows one rank's experts may receive in a forward, as a
   * multiple of the average T_max * K; it sizes the expert pool (the largest
   * part of the workspace). 0, the default, means num_ranks: the exact worst
   * case (every slot of every rank routed to one rank), which never
   * overflows. A value in [1, num_ranks] buys a smaller workspace: a forward
   * that routes more rows to one rank than its pool holds fails there with
   * MEGAMOE_ERR_TOO_MANY_TOKENS (megamoe_sync names the rank, the expert and
   * the rows), computes nothing and writes nothing past the pool; its peers
   * get MEGAMOE_ERR_PEER_FAILED, and the layer stays usable. The fused arm
   * keeps no pool (its ring holds any routing) and ignores it. */
  double pool_imbalance;
} megamoe_config;

/* A config with the given shape and defaults for the rest (G 128, no clamp,
 * staged arm, default timeout, worst-case pool). */
megamoe_config megamoe_config_make(int64_t hidden, int64_t intermediate, int32_t num_experts,
                                   int32_t top_k, int64_t max_tokens_per_rank);

/* Checks a config for num_ranks ranks. Pure host code. */
megamoe_status megamoe_check_config(const megamoe_config* config, int num_ranks);

/* Bytes a layer needs per rank: the symmetric (peer-visible, NCCL window)
 * buffer and the local workspace (plain device memory), excluding the
 * prepared weights. Pure host code. Either output may be NULL. */
megamoe_status megamoe_buffer_sizes(const megamoe_config* config, int num_ranks,
                                    size_t* symmetric_bytes, size_t* workspace_bytes);

/* Bytes of the prepared weights of one rank (E_l experts) in the copying
 * mode (megamoe_prepare_weights). */
megamoe_status megamoe_prepared_weight_bytes(const megamoe_config* config, int num_ranks,
                                             size_t* bytes);

/* How the layer gets its weights. */
typedef enum megamoe_weights_mode {
  MEGAMOE_WEIGHTS_COPY = 0,     /* megamoe_prepare_weights: the layer keeps its own prepared copy */
  MEGAMOE_WEIGHTS_IN_PLACE = 1  /* megamoe_prepare_weights_in_place: no second copy */
} megamoe_weights_mode;

/* Device memory of the weights in a mode, per rank, beyond the caller's own
 * buffers. resident_bytes: what the layer holds from preparation until
 * destroy. peak_bytes: the most it holds during the preparation call
 * (resident + temporaries). Pure host code; either output may be NULL.
 *   COPY:     resident = peak = W1 + W2 + their scales (a full second copy).
 *   IN_PLACE: resident = the per-64-row-chunk W1 scales, E_l * (2I/64) *
 *             (H/128) * 4 bytes; peak = resident + 2 * I * H (one expert's
 *             W1, the scratch of the in-place permutation). */
megamoe_status megamoe_weight_memory(const megamoe_config* config, int num_ranks,
                                     megamoe_weights_mode mode, size_t* resident_bytes,
                                     size_t* peak_bytes);

/* ---- Communicator -------------------------------------------------------
 * A layer runs on an ncclComm_t the caller owns (one process per GPU). This
 * helper makes one: it selects no device (call cudaSetDevice first) and calls
 * ncclCommInitRank. unique_id comes from ncclGetUniqueId on one rank.
 * megamoe never uses NVLink multicast and needs NCCL >= 2.28. NCCL has no
 * per-communicator switch for multicast, and the library never changes the
 * process environment, so the caller sets NCCL_NVLS_ENABLE=0 before its first
 * NCCL call (NCCL reads it once; a communicator the caller brings should be
 * made under it too). Without it this helper returns MEGAMOE_ERR_BAD_ARGUMENT
 * naming the variable; with an older NCCL library, MEGAMOE_ERR_NCCL. */
megamoe_status megamoe_comm_create(int rank, int num_ranks, const ncclUniqueId* unique_id,
                                   ncclComm_t* comm_out);

/* ---- Layer --------------------------------------------------------------- */
typedef struct megamoe_layer megamoe_layer;

/* Collective over comm: every rank calls it with the same config. Allocates
 * the symmetric buffer (ncclMemAlloc + symmetric window registration) and the
 * workspace on the current device and resolves the peer pointers. Fails with
 * MEGAMOE_ERR_NO_PEER_ACCESS when the ranks do not share one NVLink domain.
 *
 * Before anything else the ranks compare their configs (one small NCCL
 * allgather): when a field differs, every rank returns
 * MEGAMOE_ERR_BAD_ARGUMENT naming the first field that differs and its
 * values ("config differs across ranks: hidden = 512 on rank 0, 1024 on rank
 * 1"), and no layer is made. Fields compare by what they mean: a timeout_s
 * <= 0 is the default, a swiglu_clamp is ignored while the clamp is off. A
 * rank whose config or layer_out is NULL returns MEGAMOE_ERR_NULL_POINTER
 * and its peers MEGAMOE_ERR_PEER_FAILED naming it. Only a NULL comm returns
 * at once (there is nobody to tell); a rank that never calls create leaves
 * its peers waiting in NCCL, as any collective does. */
megamoe_status megamoe_create(const megamoe_config* config, ncclComm_t comm,
                              megamoe_layer** layer_out);

/* Collective. Frees everything (windows deregistered before their memory is
 * freed). NULL is accepted. The communicator stays the caller's. Every rank
 * must call it: the window deregistration waits for all of them. */
megamoe_status megamoe_destroy(megamoe_layer* layer);

/* Not collective: frees this rank's layer without the collective window
 * deregistration, for when a peer process died (its forwards end in
 * MEGAMOE_ERR_TIMEOUT and a collective call would wait for it forever). The
 * registration stays with the communicator: abort it next (ncclCommAbort),
 * and do not call megamoe_destroy on this layer. NULL is accepted. */
megamoe_status megamoe_abandon(megamoe_layer* layer);

/* Weights of this rank's E_l experts, in the checkpoint layout of DESIGN.md
 * section 1, as device pointers:
 *   w1    [E_l, 2I, H] fp8 e4m3, K-major: gate rows 0..I-1, up rows I..2I-1
 *   w1_sf [E_l, 2I/128, H/128] fp32 (one scale per 128x128 block)
 *   w2    [E_l, H, I] fp8 e4m3, K-major
 *   w2_sf [E_l, H/128, I/128] fp32 */
typedef struct megamoe_weights {
  const void* w1;
  const float* w1_sf;
  const void* w2;
  const float* w2_sf;
} megamoe_weights;

/* Converts the weights once into the layout the kernels read, into a copy
 * owned by the layer (allocated here, on the first call; see
 * megamoe_weight_memory). The caller may free its buffers once the stream
 * has run the copy. Enqueued on stream. w1 / w2 16-byte aligned, the scales
 * 4-byte aligned. Calling it again replaces the weights (the layer
 * synchronizes the device first when it has to reallocate). */
megamoe_status megamoe_prepare_weights(megamoe_layer* layer, const megamoe_weights* weights,
                                       cudaStream_t stream);

/* The same with no second copy of the weights (for models whose weights
 * fill the GPU):
 *   w1     is REWRITTEN IN PLACE into the kernels' layout (below). Afterwards
 *          it no longer holds the checkpoint layout: do not pass it to this
 *          function again, and keep it alive and unchanged until
 *          megamoe_destroy (or until the weights are prepared again from
 *          other buffers).
 *   w1_sf  is only read: the layer keeps its own per-chunk scales (small,
 *          megamoe_weight_memory); the caller may free w1_sf on return.
 *   w2, w2_sf are adopted as given: the kernels read them at every forward;
 *          keep them alive and unchanged until megamoe_destroy.
 * Layout of w1 afterwards, per expert e (contract of MM_W1_INTERLEAVE = 64):
 *   rows [128 c, 128 c + 64)        = checkpoint gate rows [64 c, 64 c + 64)
 *   rows [128 c + 64, 128 c + 128)  = checkpoint up rows [I + 64 c, I + 64 c + 64)
 * for c in [0, I / 64): 64-row chunks of gate and up alternate.
 * Peak extra device memory during the call: one expert's W1 (2 * I * H
 * bytes) of scratch plus the resident scales; the call synchronizes stream
 * before it frees the scratch and returns. w1, w2 and w2_sf 16-byte aligned,
 * w1_sf 4-byte aligned. Forwards give bitwise the same results as after
 * megamoe_prepare_weights. */
megamoe_status megamoe_prepare_weights_in_place(megamoe_layer* layer, void* w1, const float* w1_sf,
                                                const void* w2, const float* w2_sf,
                                                cudaStream_t stream);

typedef enum megamoe_index_type {
  MEGAMOE_INDEX_INT32 = 0,
  MEGAMOE_INDEX_INT64 = 1
} megamoe_index_type;

/* One forward. Device pointers, with their alignment:
 *   x        [T, H] fp8 e4m3                               any
 *   x_sf     [T, H/128] fp32                               4 bytes
 *   topk_idx [T, K] int32 or int64, global expert id,      4 or 8 bytes
 *            -1 = masked slot
 *   topk_w   [T, K] fp32                                   4 bytes
 *   y        [T, H] bf16 (written: every element of the    16 bytes
 *            T rows, nothing else)
 * With num_tokens 0 no token pointer is read and each may be NULL.
 * num_tokens_bound: 0, or a bound >= every rank's T, identical on all ranks
 * (lets the kernels size per-call schedules; ignored by the staged arm). A
 * bound above max_tokens_per_rank or below this rank's num_tokens is rejected
 * here (MEGAMOE_ERR_TOO_MANY_TOKENS naming it). The fused arm also checks the
 * contract across ranks on the device: bounds that differ, or a bound below
 * a peer's count, end that forward with MEGAMOE_ERR_TOO_MANY_TOKENS on every
 * rank (the message names the rank), nothing computed, the layer usable.
 *
 * Non-finite inputs (the contract's arithmetic, as the CPU reference does
 * it; tests/gpu/test_fuzz.c holds the kernels to it): a token's row of y
 * depends on its own inputs and the weights only, so a NaN or Inf in one
 * token never changes another token's row, bitwise. A NaN in a token's x
 * (the e4m3 NaN code), in its x_sf, or in the routing weight of one of its
 * live slots makes every element of its row NaN, with or without the
 * SwiGLU clamp (the clamp keeps a NaN). An Inf routing weight of a live
 * slot does too (the slot's quantization scale becomes Inf and Inf / Inf is
 * NaN), and so does an Inf x_sf without the clamp; with the clamp, an Inf
 * activation is clamped like any large value (except where a block's fp32
 * partial sum is 0: 0 x Inf makes the whole row NaN, as below). The weight of a masked slot
 * is never read (it may be NaN), and a token whose slots are all masked gets
 * +0.0 whatever its x and x_sf hold. A NaN or Inf in an expert's weight
 * scales reaches only the tokens with a live slot on that expert: W1's makes
 * their rows NaN (an Inf under the clamp is clamped, except where the block's
 * fp32 partial sum is 0: 0 x Inf makes the whole row NaN, and a sum near 0
 * may round to 0 or not), W2's makes the 128 output columns of its block
 * non-finite and leaves the others as they were.
 * Bad indices are errors, not numbers: MEGAMOE_ERR_BAD_TOPK_INDEX (an int64
 * index is never truncated to 32 bits). */
typedef struct megamoe_forward_args {
  const void* x;
  const float* x_sf;
  const void* topk_idx;
  megamoe_index_type topk_idx_type;
  const float* topk_w;
  int64_t num_tokens;
  int64_t num_tokens_bound;
  void* y;
} megamoe_forward_args;

/* Programmatic dependent launch (Hopper's griddepcontrol) for the persistent
 * arms' kernels: enable 1 launches them with programmatic stream
 * serialization, so a forward's kernel may be scheduled while the kernel
 * before it on the stream (the caller's, or the previous forward's) still
 * runs. What it saves is the launch gap: each kernel waits, before it reads
 * anything (the caller's inputs, the layer's own buffers), until the kernel
 * before it has completed and its writes are visible, so results are
 * bitwise the same on and off; and each kernel lets the next one on the
 * stream be scheduled early (which matters only if that kernel was launched
 * the same way). The split arm's two kernels overlap each other's launch the
 * same way. The staged arm ignores it (its kernels are launched as before).
 * Per rank, not collective: ranks may differ. Default 0. Works under stream
 * capture: the graph keeps the programmatic edges. enable must be 0 or 1
 * (MEGAMOE_ERR_BAD_ARGUMENT otherwise). Takes effect from the next forward
 * enqueued; a graph keeps the setting its forwards were captured with. */
megamoe_status megamoe_set_programmatic_launch(megamoe_layer* layer, int enable);

/* Collective: every rank calls it, in the same order, the same number of
 * times. Enqueues the layer on stream and returns without waiting. Errors the
 * device finds (a bad top-k index, a pool overflow, a timeout, a peer's
 * failure) are reported by megamoe_sync and by the error word. Inputs are
 * read and y is written in stream order; nothing outside y and the layer's
 * own buffers is written.
 *
 * Errors keep the ranks in step. When this call rejects its arguments (NULL
 * args or pointer, num_tokens negative or above T_max, a bad token bound, a
 * misaligned pointer, a bad index type, weights not prepared, a layer that
 * failed earlier), it still enqueues an EMPTY forward: it reads none of the
 * caller's pointers and no weights and writes nothing to y, but takes part
 * in the cross-rank barriers, carrying the error code to the peers. The call
 * returns the specific status at once (megamoe_last_error names the
 * argument). The peers' megamoe_sync report MEGAMOE_ERR_PEER_FAILED naming
 * this rank and its status, this rank's megamoe_sync reports the same status
 * again (it is this forward's error, with the same message), and the error
 * word of that forward holds it on every rank (the status here,
 * MEGAMOE_ERR_PEER_FAILED on the peers). The next forward runs normally on
 * every rank. Only a NULL layer enqueues nothing. */
megamoe_status megamoe_forward(megamoe_layer* layer, const megamoe_forward_args* args,
                               cudaStream_t stream);

/* Collective, in place of a forward: a caller (a language binding) that
 * rejects its own arguments before they reach megamoe_forward still takes
 * part, so the peers do not wait for it: an empty forward carrying `status`
 * (an error status) is enqueued on stream, the peers' megamoe_sync reports
 * MEGAMOE_ERR_PEER_FAILED naming this rank and `status`, and this rank's
 * next megamoe_sync reports `status` with `message`. Returns `status`. */
megamoe_status megamoe_forward_reject(megamoe_layer* layer, megamoe_status status, const char* message,
                                      cudaStream_t stream);

/* Waits for the stream and returns the first error of the layer's forwards
 * since the last megamoe_sync, described in words by megamoe_last_error()
 * (which rank, which forward, where, which peer, how long a wait waited, the
 * bad index or the expert that did not fit), then clears it. A timeout
 * leaves the layer failed: every later forward and sync reports
 * MEGAMOE_ERR_LAYER_FAILED; destroy the layer.
 *
 * Errors are kept per forward: an error of forward n never makes forward
 * n + 1 skip work or fail on a peer; a forward without an error writes every
 * element of y even after failed ones, and a forward with an error writes
 * nothing to y (report it, do not use y). Call it when no forward of the
 * layer runs on another stream. */
megamoe_status megamoe_sync(megamoe_layer* layer, cudaStream_t stream);

/* The error word: a device pointer to one int32 in the layer's workspace
 * that every forward overwrites at its end, in stream order, with 0 (it
 * succeeded) or its megamoe_status (the first error of that forward on this
 * rank: MEGAMOE_ERR_PEER_FAILED when a peer failed). It lets a serving loop
 * that replays a CUDA graph check every forward without a host sync: a
 * kernel later on the stream reads it, or a cudaMemcpyAsync after each
 * forward copies it to pinned host memory. megamoe_sync still reports (in
 * words) the first error since the last sync. Valid until megamoe_destroy. */
megamoe_status megamoe_error_word(megamoe_layer* layer, const int32_t** word);

/* Where the layer stages this rank's x and x_sf for its peers: x holds
 * [max_tokens_per_rank, H] bytes, x_sf [max_tokens_per_rank, H/128] floats,
 * in this rank's symmetric buffer. A caller that writes its tokens there
 * (row-major, as args.x / args.x_sf) and passes these very pointers as
 * args.x / args.x_sf saves one copy per forward (either one alone too).
 * Write them in stream order after the previous forward and before this one:
 * the peers read the region during a forward, and finish before that
 * forward completes on this rank (not after a timeout: the layer has then
 * failed). A kernel that writes the region and is itself launched with
 * programmatic stream serialization after a forward must wait for it
 * (griddepcontrol.wait) before writing: the persistent arms let their
 * dependents start early. A forward whose x or x_sf comes from elsewhere
 * overwrites the region; one whose x or x_sf meets the region without being
 * its own part's start is rejected (MEGAMOE_ERR_BAD_ARGUMENT naming it).
 * Valid until megamoe_destroy. */
megamoe_status megamoe_input_staging(megamoe_layer* layer, void** x, float** x_sf);

/* The layer's config and rank facts. */
const megamoe_config* megamoe_layer_config(const megamoe_layer* layer);
int megamoe_layer_rank(const megamoe_layer* layer);
int megamoe_layer_num_ranks(const megamoe_layer* layer);

/* ---- Library facts --------------------------------------------------------
 * A binding (python/megamoe) compares these with what it was written for. */
#define MEGAMOE_VERSION (MEGAMOE_VERSION_MAJOR * 1000 + MEGAMOE_VERSION_MINOR)

/* MEGAMOE_VERSION of the library that is loaded. */
int megamoe_version(void);

/* NCCL versions in NCCL_VERSION_CODE form (22809 for 2.28.9): header_version
 * is the nccl.h the library was built against (its device code inlines
 * NCCL's device API), library_version the libnccl this process loaded
 * (ncclGetVersion; in a process that loads two libraries of that name, the
 * first one wins). Either output may be NULL. No device needed. */
megamoe_status megamoe_nccl_versions(int* header_version, int* library_version);

/* ---- Process helpers -------------------------------------------------------
 * CUDA and NCCL calls a program needs around a layer, for callers that reach
 * the library only (a language binding): they act on the CUDA runtime and
 * NCCL the library itself loaded. */

/* ncclGetUniqueId: the id megamoe_comm_create takes, made on one rank and
 * passed by the caller to every other rank. No device needed. */
megamoe_status megamoe_unique_id(ncclUniqueId* unique_id);

/* ncclCommDestroy of a communicator from megamoe_comm_create, after every
 * layer on it was destroyed. Every rank calls it: without an earlier
 * ncclCommFinalize, NCCL's teardown waits for the node's other ranks. NULL
 * accepted. */
megamoe_status megamoe_comm_destroy(ncclComm_t comm);

/* ncclCommAbort: for a communicator whose peer died (after megamoe_abandon of
 * its layers). Not collective. NULL accepted. */
megamoe_status megamoe_comm_abort(ncclComm_t comm);

/* cudaSetDevice / cudaGetDevice on the library's CUDA runtime. set_device
 * checks device against the visible device count (MEGAMOE_ERR_NO_DEVICE when
 * none is visible, MEGAMOE_ERR_BAD_ARGUMENT when out of range). */
megamoe_status megamoe_set_device(int device);
megamoe_status megamoe_get_device(int* device);

/* ---- Buffer layout (what `megamoe info` prints) ---------------------------
 * Pure host code: the layout megamoe_create would allocate for config on
 * num_ranks ranks. */
typedef enum megamoe_space {
  MEGAMOE_SPACE_SYMMETRIC = 0, /* the NCCL window peers read and write */
  MEGAMOE_SPACE_WORKSPACE = 1  /* local device memory */
} megamoe_space;

typedef struct megamoe_region {
  const char* name;    /* static string ("input_x", "pool_x", ...) */
  megamoe_space space;
  uint64_t offset;     /* within its space's allocation */
  uint64_t bytes;      /* 0 when the config's arm does not use the region */
  uint64_t align;
} megamoe_region;

typedef struct megamoe_layout_info {
  int32_t num_ranks;
  int32_t num_regions;              /* how many megamoe_region the layout has (fixed per build) */
  int64_t local_experts;            /* E_l */
  int64_t pool_rows;                /* expert pool capacity in rows (config pool_imbalance) */
  uint64_t symmetric_bytes;         /* per rank, as megamoe_buffer_sizes */
  uint64_t workspace_bytes;
  uint64_t prepared_weight_bytes;   /* megamoe_weight_memory, MEGAMOE_WEIGHTS_COPY */
  uint64_t in_place_resident_bytes; /* MEGAMOE_WEIGHTS_IN_PLACE: kept until destroy */
  uint64_t in_place_peak_bytes;     /* MEGAMOE_WEIGHTS_IN_PLACE: during preparation */
  /* The fused arm's ring (docs/FUSED.md; all 0 for the other arms): its pool
   * regions hold ring_blocks slots of 128 rows (pool_rows = 128 ring_blocks),
   * sized for the lag order of ring_lag units in groups of ring_group units;
   * ring_virtual_blocks is the most blocks a forward lays out at T_max (its
   * per-block counters). ring_blocks == ring_virtual_blocks: the ring holds
   * the worst case, never wraps, and every forward takes the single-wave order
   * (unless the diagnostic MEGAMOE_FUSED_RING_PERCENT grew it there: the
   * calls keep the lag ring's orders, or with MEGAMOE_FUSED_RING_ORDER=1
   * take the grown ring's). */
  int32_t ring_blocks;
  int32_t ring_lag;
  int32_t ring_group;
  int32_t ring_virtual_blocks;
} megamoe_layout_info;

/* Fills *info and, when regions is not NULL, regions[0 .. info->num_regions)
 * (capacity must be at least info->num_regions, else
 * MEGAMOE_ERR_BAD_ARGUMENT naming capacity and the count). regions NULL:
 * only *info (ask the count first). Config errors as megamoe_check_config. */
megamoe_status megamoe_layout(const megamoe_config* config, int num_ranks, megamoe_layout_info* info,
                              megamoe_region* regions, int capacity);

/* ---- The CPU reference and the checker, for users' own tests --------------
 * The reference of the library's own tests (ref/ref.h: the contract of
 * DESIGN.md section 1 written out exactly, in C on the CPU) and the
 * per-token checker the GPU tests judge every forward with (ref/ref_check.h).
 * Host memory only; no device, no CUDA call. */

/* y of one rank's tokens. rank_weights[r] (r < num_ranks) holds rank r's
 * E_l experts in the checkpoint layout of megamoe_weights, as HOST pointers
 * (every rank's: a token may be routed to any expert); args are this rank's
 * inputs and output as HOST pointers, laid out as for megamoe_forward
 * (num_tokens_bound is not used: the reference has no tiles). A token's
 * output depends on its own inputs and the weights only, so the source rank
 * does not enter, and the same global weights give bitwise the same y for
 * any num_ranks. Checks: the config, every pointer (a token pointer may be
 * NULL when num_tokens is 0), num_tokens in [0, max_tokens_per_rank]
 * (MEGAMOE_ERR_TOO_MANY_TOKENS), the index type, every top-k index in
 * [-1, E) (MEGAMOE_ERR_BAD_TOPK_INDEX naming the element); y is untouched on
 * a failure. MEGAMOE_ERR_OUT_OF_MEMORY when a scratch allocation fails. */
megamoe_status megamoe_reference_forward(const megamoe_config* config, int num_ranks,
                                         const megamoe_weights* rank_weights,
                                         const megamoe_forward_args* args);

/* Bounds of megamoe_check_output; megamoe_check_default_bounds gives the
 * ones the library's GPU tests use (about 5x above what the H200 measured;
 * ref/ref_check.h says how they were set). */
typedef struct megamoe_check_bounds {
  double row_rel_err;        /* per token: ||y - y_ref|| / ||y_ref|| */
  double row_abs_over_scale; /* per token: max |y - y_ref| / rms(y_ref row) */
  double diff;               /* whole rank: 1 - 2 sum(y y_ref) / sum(y^2 + y_ref^2) */
  double scale_floor;        /* a row's scale (rms) is at least this */
} megamoe_check_bounds;

megamoe_check_bounds megamoe_check_default_bounds(void);

/* Why a check failed (the first reason, in this order of precedence). */
typedef enum megamoe_check_failure {
  MEGAMOE_CHECK_PASSED = 0,
  MEGAMOE_CHECK_BAD_REFERENCE = 2,  /* y_ref holds a NaN or an Inf */
  MEGAMOE_CHECK_NONFINITE = 3,      /* y holds a NaN or an Inf */
  MEGAMOE_CHECK_MASKED_NONZERO = 4, /* every slot of a token masked, its row not all +0.0 */
  MEGAMOE_CHECK_ROW_REL_ERR = 5,    /* a token's rel err above its bound */
  MEGAMOE_CHECK_ROW_ABS_ERR = 6,    /* a token's max abs/scale above its bound */
  MEGAMOE_CHECK_DIFF = 7            /* the whole rank's diff above its bound (or NaN) */
} megamoe_check_failure;

typedef struct megamoe_check_stats {
  int32_t pass;                    /* 1: every check passed */
  megamoe_check_failure first_failure;
  const char* first_failure_name;  /* static text ("row rel err", ...; "passed") */
  int64_t first_failure_token;     /* lowest failing token; -1 for a whole-rank failure or none */
  int64_t tokens_checked;          /* num_tokens */
  int64_t tokens_masked;           /* tokens with every slot masked (must be exactly +0.0) */
  int64_t tokens_failed;
  int64_t nonfinite;               /* NaN or Inf elements of y */
  double max_rel_err;              /* over the tokens with a live slot and a finite row */
  int64_t max_rel_err_token;       /* -1 when no such token */
  double max_abs_over_scale;
  int64_t max_abs_over_scale_token;
  double diff;                     /* whole rank (NaN when y holds a NaN) */
  int32_t diff_judged;             /* 0: fewer than diff_min_tokens live tokens, diff not judged */
  int32_t diff_min_tokens;
  megamoe_check_bounds bounds;     /* the bounds judged against */
  char summary[512];               /* one line: "PASS T 64 (masked 0) max rel err ..." */
} megamoe_check_stats;

/* Judges one rank's y [num_tokens, hidden] (bf16 bits) against y_ref from
 * megamoe_reference_forward, token by token, with the slots' top-k indices
 * [num_tokens, top_k] (only their sign is read). bounds NULL: the defaults.
 * Returns MEGAMOE_OK when the check ran, whatever it found (stats->pass and
 * stats->summary say); an error status, *stats untouched, when an argument
 * is bad: NULL pointers (y, y_ref, topk_idx may be NULL when num_tokens is
 * 0), num_tokens < 0, hidden or top_k < 1, a bound not positive and finite,
 * an unknown index type. */
megamoe_status megamoe_check_output(const uint16_t* y, const uint16_t* y_ref, int64_t num_tokens,
                                    int64_t hidden, const void* topk_idx,
                                    megamoe_index_type topk_idx_type, int64_t top_k,
                                    const megamoe_check_bounds* bounds, megamoe_check_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_H */
