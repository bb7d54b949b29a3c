# The watch (src/host/timeline.c) blind to the last stamp event, MM_TL_REDUCED: a CTA that reduced
# is reported at an earlier event. The GPU test "timeline: mapped host memory and the watch
# thread" (and the CPU unit test timeline_watch_summary) must fail.
/^static void latest_stamps/,/^}/s/k < MM_TL_FIRST_DURATION;/k < MM_TL_REDUCED;/
