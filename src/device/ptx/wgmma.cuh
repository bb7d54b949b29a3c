/* Warpgroup matrix-multiply wrappers (PTX ISA "wgmma"): the FP8 e4m3 x e4m3
 * -> f32 m64n128k32 operation with both operands in shared memory, its
 * fences, and the shared-memory matrix descriptor.
 *
 * Descriptor (PTX ISA "matrix descriptor format", 64 bits):
 *   bits  0-13  start address >> 4 (shared-window address)
 *   bits 16-29  leading-dimension byte offset >> 4
 *   bits 32-45  stride-dimension byte offset >> 4
 *   bits 49-51  base offset (0: every swizzle atom starts 1024-byte aligned)
 *   bits 62-63  swizzle: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
 * Our operands are K-major tiles written by TMA with the 128-byte swizzle:
 * row r of a tile (one M or N index) holds 128 bytes of K (one K block of
 * fp8) at byte r * 128, its 16-byte chunks XOR-permuted by r % 8. A swizzle
 * atom is 8 rows x 128 bytes = 1024 bytes; atoms follow each other along M/N,
 * so the stride-dimension offset is 1024 bytes. The leading-dimension offset
 * is not used for K-major swizzled layouts (one wgmma's K extent, 32 bytes,
 * lies inside the 128-byte swizzle row); we set it to 1 (16 bytes) as the
 * canonical value. The k-th 32-wide K slice of the tile starts 32 * k bytes
 * into the row: the descriptor's start address advances by 32 bytes per
 * k32 step, and the hardware applies the XOR swizzle to the final address
 * bits, which is what TMA did when it wrote the tile (the tile base is
 * 1024-byte aligned).
 *
 * Accumulator fragment of m64nNk32 with f32 D (per thread of the
 * warpgroup, warp w = 0..3 within the group, lane l): register i holds
 *   row 16 w + l / 4 + 8 * ((i >> 1) & 1),  column 8 * (i >> 2) + 2 * (l % 4) + (i & 1).
 * So with N = 128, registers i and i + 32 are columns c and c + 64 of the
 * same row. */
#ifndef MEGAMOE_PTX_WGMMA_CUH
#define MEGAMOE_PTX_WGMMA_CUH

#include <stdint.h>

#ifndef MM_PTX_DEVICE
#define MM_PTX_DEVICE __device__ __forceinline__
#endif

/* High 32 bits of a K-major 128-byte-swizzle descriptor: stride offset
 * 1024 bytes (64 in 16-byte units), base offset 0, swizzle mode 1. */
#define MM_WGMMA_DESC_SW128_HI ((1u << 30) | (1024u >> 4))

/* Low 32 bits for a tile starting at shared-window address `addr`
 * (1024-byte aligned, plus 32 * k for the k-th K slice): start address and
 * leading offset 1 (16 bytes, unused here). The start field is 14 bits of
 * addr >> 4, enough for the 228 KB shared window. */
MM_PTX_DEVICE uint32_t mm_wgmma_desc_sw128_lo(uint32_t addr) {
  return ((addr & 0x3FFFFu) >> 4) | (1u << 16);
}

MM_PTX_DEVICE uint64_t mm_wgmma_desc(uint32_t lo) {
  return ((uint64_t)MM_WGMMA_DESC_SW128_HI << 32) | (uint64_t)lo;
}

/* Orders earlier register accesses (of the accumulators) before the next
 * wgmma.mma_async of the warpgroup. */
MM_PTX_DEVICE void mm_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

/* Closes the wgmma-group of the operations issued since the last commit. */
MM_PTX_DEVICE void mm_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

/* Waits until at most N committed wgmma-groups of this thread are pending. */
template <int N>
MM_PTX_DEVICE void mm_wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group count");
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/* Keeps the compiler from moving accesses of an accumulator register across
 * the wgmma issue / wait points. */
MM_PTX_DEVICE void mm_wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

/* d[64] (+)= A[64 x 32] * B[32 x 128]: A and B e4m3 from shared memory via
 * descriptors (A K-major M x K, B K-major N x K), f32 accumulators.
 * accumulate = 0 writes d = A * B (d's old contents are ignored). */
MM_PTX_DEVICE void mm_wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                            uint32_t accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %66, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3\n\t"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n\t"
      "%64, %65, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

#endif
