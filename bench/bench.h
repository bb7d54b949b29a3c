/* Benchmarks callable from the megamoe tool. */
#ifndef MEGAMOE_BENCH_H
#define MEGAMOE_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* `megamoe bench-gemm`: our grouped GEMM vs cuBLASLt block-scaled FP8 on the
 * same data, in one process on the current device. argv excludes the tool
 * name and the subcommand. Returns a process exit code. */
int mm_bench_gemm_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif
