/* The GPU's clocks, power and temperature while the bench times a cell
 * (`megamoe bench --clocks`): a thread samples NVML every few milliseconds
 * and the bench reads what it saw between two marks.
 *
 * Why: the same forward ran 1-5 % slower inside both GEMM phases depending
 * on what the process ran before (docs/PERF.md, twentieth session); a GPU
 * that lowered its clocks (power cap, thermal) would look exactly like that.
 * NVML is loaded at run time (dlopen), so the tool still starts on machines
 * without the driver; there the sampler is simply absent. Host code only. */
#ifndef MEGAMOE_BENCH_CLOCKS_H
#define MEGAMOE_BENCH_CLOCKS_H

#include <stdint.h>

/* What the samples between a mark and a read saw (merged over windows with
 * mm_clock_stats_merge). samples 0: none (the window was shorter than one
 * sampling period, or nothing was read). */
typedef struct mm_clock_stats {
  int samples;
  double sm_mhz_sum, sm_mhz_min, sm_mhz_max;
  double mem_mhz_sum;
  double power_w_sum;
  unsigned temp_c_max;
  unsigned long long reasons; /* every NVML clock-event reason seen (bitwise or) */
} mm_clock_stats;

typedef struct mm_clock_sampler mm_clock_sampler;

/* Starts sampling the GPU with this PCI bus id (cudaDeviceGetPCIBusId's
 * form) every period_ms. NULL when NVML or the GPU cannot be opened; *why
 * then says so (static text). */
mm_clock_sampler* mm_clocks_start(const char* pci_bus_id, int period_ms, const char** why);

/* Begins a window: the samples from now on count, the earlier ones not.
 * NULL (no sampler): nothing. */
void mm_clocks_mark(mm_clock_sampler* s);

/* Adds the window's samples so far to *into (the sampler keeps running).
 * NULL (no sampler): nothing. */
void mm_clocks_add_window(mm_clock_sampler* s, mm_clock_stats* into);

/* Stops the thread and releases NVML. NULL is accepted. */
void mm_clocks_stop(mm_clock_sampler* s);

/* An empty record, and b added to a. */
mm_clock_stats mm_clock_stats_empty(void);
void mm_clock_stats_merge(mm_clock_stats* a, const mm_clock_stats* b);

/* One line for a record: "SM 1755 MHz mean (1650-1980), memory 2619 MHz,
 * 612 W (NVML avg), 61 C max, clock events: sw power cap" (or "no samples").
 * The power is NVML's reading, a running average on recent GPUs (about 1 s
 * on Hopper), so it blurs cells shorter than that. */
void mm_clock_stats_format(const mm_clock_stats* st, char* out, int n);

#endif
