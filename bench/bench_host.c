/* Host-side problem data of the tool (bench.h): what `megamoe ref` and
 * `megamoe soak` feed the layer and the CPU reference. */
#include <math.h>

#include "bench.h"
#include "ref.h"

void mm_bench_host_fp8(mm_bench_rng* g, uint8_t* dst, int64_t n, double spread) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ref_e4m3_encode((float)(mm_bench_rng_normal(g) * spread));
}

void mm_bench_host_tokens(mm_bench_rng* g, uint8_t* x, float* x_sf, int64_t T, int64_t H) {
  float row[128];
  for (int64_t i = 0; i < T * (H / 128); ++i) {
    for (int j = 0; j < 128; ++j) row[j] = (float)mm_bench_rng_normal(g);
    ref_quantize_group(row, 128, x + i * 128, &x_sf[i]);
  }
}
