# The persistent kernels' tail register hand-back without its barrier (src/device/gemm/gemm_mainloop.cuh,
# mm_gemm_tail_regs_producer): the producer warpgroup takes its registers back as soon as its roles end,
# the race behind racecheck's split hang (docs/RELIABILITY.md, twenty-ninth session). Built with
# -DMM_TEST_MATH_REGS_LATE_NS=100000 a CTA without tiles always wins it: its math warps wait forever in
# setmaxnreg.inc, a hardware wait no deadline covers, so the forward never ends (plant_check.sh --hang).
/^MM_DEVICE void mm_gemm_tail_regs_producer/,/^}/s/^  mm_named_barrier_sync(MM_GEMM_BAR_REGS, MM_GEMM_THREADS);$//
