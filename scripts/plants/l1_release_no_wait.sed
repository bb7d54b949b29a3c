# MM_FUSED_L1_RELEASE_BY_COPY without the copy thread's wait for the hand-off (src/device/fused/fused_kernel.cuh):
# L1_DONE is released when the copy warps read the L1 task, before the math warps wrote the tile, so L2
# tiles read codes and scales not yet written. Run with --defs "-DMM_FUSED_L1_RELEASE_BY_COPY=1" and
# MEGAMOE_TEST_ARM=fused; "arms: bitwise equal to staged" must fail (the wait on `taken` then times out too).
s/  if (!mm_gemm_wait(c.sm, mm_fused_l1_handed(c.sm), i \& 1u, p)) return false;//
