# The fused pull's bulk copies (src/device/fused/fused_kernel.cuh, built with -DMM_FUSED_BULK_PULL=1)
# storing every piece of a row at the row's start: all but the first 1 KB of each pulled row keep
# what the ring held before. The fused arm's bitwise tests over rows the pull warps move (the ring
# tests: more rows than the prologue's) must fail. Deterministic, unlike a missing wait.
s/mm_bulk_store_1d(pool_x + (int64_t)(dst0 + row) \* H + off,/mm_bulk_store_1d(pool_x + (int64_t)(dst0 + row) * H,/
