# Plant for scripts/plant_check.sh: puts back the grid-barrier timeout record's plain int32 cast of the round (negative past round 2^31), which the GPU test "grid barrier deadline past round 2^31" must catch (docs/RELIABILITY.md, twentieth session).
s/(int)((round_start \/ ctas) \& 0x7fffffffu)/(int)(round_start \/ ctas)/
