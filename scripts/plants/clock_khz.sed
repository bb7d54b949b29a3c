# Plant for scripts/plant_check.sh: the timeline's SM clock computed in MHz instead of kHz (1000 times too small), which the GPU test "timeline: every CTA stamped, the SM clock in 200-3000 MHz" must catch on the split and fused arms (docs/PERF.md, twenty-first session).
s/return (clk1 - clk0) \* 1000000ull \/ (ns1 - ns0);/return (clk1 - clk0) * 1000ull \/ (ns1 - ns0);/
