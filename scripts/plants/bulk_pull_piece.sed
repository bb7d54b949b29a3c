# The fused pull's bulk copies (src/device/fused/fused_kernel.cuh, built with -DMM_FUSED_BULK_PULL=1)
# storing every piece of a row at the row's start: all but the first 1 KB of each pulled row keep
# what the ring held before. The fused ring test must fail: its H 1280 shape has rows of two pieces
# and more rows than the prologue pulls (every other test H is one piece, which this plant leaves
# right). Deterministic, unlike a missing wait.
s/mm_bulk_store_1d(pool_x + (int64_t)(dst0 + st.row) \* H + st.off,/mm_bulk_store_1d(pool_x + (int64_t)(dst0 + st.row) * H,/
