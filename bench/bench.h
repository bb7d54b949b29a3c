/* Benchmarks callable from the megamoe tool. */
#ifndef MEGAMOE_BENCH_H
#define MEGAMOE_BENCH_H

#include <stddef.h>
#include <stdint.h>

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

#ifndef MEGAMOE_BENCH_LAYER_DECL
#define MEGAMOE_BENCH_LAYER_DECL
#ifdef __cplusplus
extern "C" {
#endif
/* `megamoe bench`: the layer's arms side by side on the visible GPUs (one
 * process per rank). Returns a process exit code. */
int mm_bench_layer_main(int argc, char** argv);

/* Fills n fp8 bytes on the device with values ~ N(0, spread^2) (hash of seed
 * and index: no host data), and n_sf floats with scales in [lo, hi). */
int mm_bench_fill_fp8(void* dst, size_t n, float spread, uint64_t seed, void* stream);
int mm_bench_fill_uniform(float* dst, size_t n, float lo, float hi, uint64_t seed, void* stream);
#ifdef __cplusplus
}
#endif
#endif
