/* Launchers of the staged kernels (C++ internal to src/device/staged). */
#ifndef MEGAMOE_STAGED_KERNELS_CUH
#define MEGAMOE_STAGED_KERNELS_CUH

#include "staged/staged.h"

void mm_route_launch(const mm_layer_view& L, const mm_forward_view& F, cudaStream_t stream);
void mm_pool_layout_launch(const mm_layer_view& L, cudaStream_t stream);
void mm_barrier_launch(const mm_layer_view& L, int which, int site, cudaStream_t stream);
void mm_dispatch_launch(const mm_layer_view& L, cudaStream_t stream);
void mm_swiglu_quant_launch(const mm_layer_view& L, cudaStream_t stream);
void mm_combine_push_launch(const mm_layer_view& L, cudaStream_t stream);
void mm_reduce_launch(const mm_layer_view& L, const mm_forward_view& F, cudaStream_t stream);


#endif
