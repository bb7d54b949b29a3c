/* Whether this build's kernels have the early combine (common.cuh,
 * MM_EARLY_COMBINE): the host C code cannot see the device compiler's
 * macros, and a forward may ask for the early order only where the
 * kernels count arrivals and have the tail for it. */
#include "common.cuh"

extern "C" int mm_early_combine_built(void) { return MM_EARLY_COMBINE; }
