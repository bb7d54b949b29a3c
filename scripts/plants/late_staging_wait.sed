# The fused L1 epilogue's late staging wait without its wait for the copy warps
# (src/device/gemm/gemm_epilogue.cuh, built with -DMM_FUSED_L1_LATE_STAGING_WAIT=1): the codes of
# an L1 tile may overwrite an L2 tile the copy warps are still reading out. Only the lag order
# waits there, so the fused ring tests (bitwise against the staged arm over shapes that wrap)
# must fail; it is a timing race: run the plant twice (docs/PERF.md, twenty-sixth session).
s/        free_now = mm_gemm_wait(sm, other->bar, other->parity, p);/        free_now = true;/
