# Split kernel 2 without its first mainloop's stamp (src/device/split/split_kernels.cuh): the watch
# could no longer tell a CTA in its first L2 mainloop from one past it. The GPU test "timeline:
# every CTA stamped" must fail on the split arm (no CTA stamped kernel 2's first L2 mainloop).
s/          if (tid == 0 \&\& tile_index == 0) mm_tl_stamp(L, MM_TL_K2_FIRST_MAIN);//
