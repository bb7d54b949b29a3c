/* The split arm's forward: two persistent kernels on the stream
 * (device/split/split.h), with the GEMM plans of the call's regime. */
#include "split_forward.h"

#include "device/split/split.h"
#include "errors.h"

megamoe_status mm_split_forward(const mm_layer_view* L, const mm_forward_view* F, const mm_arm_gemm* gemms,
                                cudaStream_t stream) {
  MM_TRY(mm_split_l1_launch(L, F, &gemms[0].plan, stream));
  return mm_split_l2_launch(L, F, &gemms[1].plan, stream);
}
