# Split kernel 2 without its math side's register hand-off stamp (src/device/split/split_kernels.cuh):
# the watch could no longer tell a CTA stuck before setmaxnreg.inc from one past it. The GPU test
# "timeline: every CTA stamped" must fail on the split arm.
s/    if (tid == 0) mm_tl_stamp(L, MM_TL_K2_MATH_REGS);//
