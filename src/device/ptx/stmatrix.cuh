/* Matrix store to shared memory (PTX ISA "stmatrix"), sm_90, and a plain
 * 16-bit shared store.
 *
 * stmatrix.sync.aligned.m8n8.x4.shared.b16 stores four 8 x 8 matrices of
 * 16-bit elements. Register j of every lane holds two adjacent elements of
 * matrix j in the mma fragment layout: lane l holds row l / 4, columns
 * 2 (l % 4) and 2 (l % 4) + 1 (the low half is the lower column). Lane l
 * gives the shared-window address of row l % 8 of matrix l / 8 (16 bytes,
 * 16-byte aligned). This is the layout of a wgmma f32 accumulator fragment
 * after converting pairs of columns to packed bf16x2. */
#ifndef MEGAMOE_PTX_STMATRIX_CUH
#define MEGAMOE_PTX_STMATRIX_CUH

#include <stdint.h>

#ifndef MM_PTX_DEVICE
#define MM_PTX_DEVICE __device__ __forceinline__
#endif

MM_PTX_DEVICE void mm_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

/* One 16-bit store to the shared window (a plain st.shared, for element
 * scatters stmatrix's layout does not fit: the SwiGLU epilogue's fp8 pairs). */
MM_PTX_DEVICE void mm_st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

#endif
