/* The persistent arms' launch (split, fused): a cooperative grid (the
 * kernels have grid barriers, so every CTA must be resident) of L->num_sms
 * CTAs of MM_GEMM_THREADS threads with `smem` bytes of dynamic shared memory.
 * The grid size is the layer's, never the caller's: every kernel that shares
 * the layer's grid-barrier state must run the same number of CTAs
 * (comm/grid.cuh: the arrival count must be a multiple of it between
 * rounds), and this is the only launch of such kernels.
 * L->programmatic_launch: also programmatic stream serialization (the kernel
 * may be scheduled before the previous one on the stream ends; every
 * persistent kernel runs mm_grid_dependency_wait before it touches global
 * memory, ptx/sync.cuh). */
#ifndef MEGAMOE_DEVICE_LAUNCH_CUH
#define MEGAMOE_DEVICE_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "contract.h"
#include "gemm/gemm_cfg.cuh"

static inline cudaError_t mm_launch_persistent(const void* fn, void** args, const mm_layer_view* L, uint32_t smem,
                                               cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)L->num_sms);
  cfg.blockDim = dim3(MM_GEMM_THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = L->programmatic_launch ? 2 : 1;
  return cudaLaunchKernelExC(&cfg, fn, args);
}

#endif
