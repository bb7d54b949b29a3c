/* NVML sampler of the bench (bench_clocks.h). NVML's few entry points are
 * declared here (its header is not part of the CUDA toolkit on every
 * machine) and resolved with dlsym from libnvidia-ml.so.1, the driver's. */
#include "bench_clocks.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* NVML's ABI, as documented: return 0 is NVML_SUCCESS; a device is an opaque
 * pointer; the clock types SM = 1, MEM = 2; the temperature sensor GPU = 0. */
typedef int nvml_ret;
typedef struct nvml_device_st* nvml_device;
enum { NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_TEMPERATURE_GPU = 0 };

typedef struct nvml_api {
  void* lib;
  nvml_ret (*init)(void);
  nvml_ret (*shutdown)(void);
  nvml_ret (*by_pci)(const char*, nvml_device*);
  nvml_ret (*clock)(nvml_device, int, unsigned*);
  nvml_ret (*temperature)(nvml_device, int, unsigned*);
  nvml_ret (*power)(nvml_device, unsigned*);
  nvml_ret (*reasons)(nvml_device, unsigned long long*);
} nvml_api;

struct mm_clock_sampler {
  nvml_api api;
  nvml_device dev;
  int period_ms;
  pthread_t thread;
  pthread_mutex_t lock; /* guards win, gen and stop */
  mm_clock_stats win;   /* the samples since the last mark */
  unsigned gen;         /* marks so far: a sample read across a mark is dropped */
  int stop;
};

mm_clock_stats mm_clock_stats_empty(void) {
  mm_clock_stats s;
  memset(&s, 0, sizeof s);
  return s;
}

void mm_clock_stats_merge(mm_clock_stats* a, const mm_clock_stats* b) {
  if (b->samples == 0) return;
  if (a->samples == 0 || b->sm_mhz_min < a->sm_mhz_min) a->sm_mhz_min = b->sm_mhz_min;
  if (a->samples == 0 || b->sm_mhz_max > a->sm_mhz_max) a->sm_mhz_max = b->sm_mhz_max;
  a->samples += b->samples;
  a->sm_mhz_sum += b->sm_mhz_sum;
  a->mem_mhz_sum += b->mem_mhz_sum;
  a->power_w_sum += b->power_w_sum;
  if (b->temp_c_max > a->temp_c_max) a->temp_c_max = b->temp_c_max;
  a->reasons |= b->reasons;
}

void mm_clock_stats_format(const mm_clock_stats* st, char* out, int n) {
  if (n <= 0) return;
  if (st->samples == 0) {
    snprintf(out, (size_t)n, "no samples");
    return;
  }
  /* The reasons that lower clocks under load (idle, sync boost and the
   * display clock are not named). */
  static const struct {
    unsigned long long bit;
    const char* name;
  } kReasons[] = {{0x2ull, "applications clocks"}, {0x4ull, "sw power cap"},  {0x8ull, "hw slowdown"},
                  {0x20ull, "sw thermal"},         {0x40ull, "hw thermal"},    {0x80ull, "hw power brake"}};
  char why[160] = "";
  size_t used = 0;
  for (size_t i = 0; i < sizeof kReasons / sizeof kReasons[0]; ++i)
    if ((st->reasons & kReasons[i].bit) && used < sizeof why)
      used += (size_t)snprintf(why + used, sizeof why - used, "%s%s", used ? ", " : "", kReasons[i].name);
  snprintf(out, (size_t)n, "SM %.0f MHz mean (%.0f-%.0f), memory %.0f MHz, %.0f W (NVML avg), %u C max, clock events: %s",
           st->sm_mhz_sum / st->samples, st->sm_mhz_min, st->sm_mhz_max, st->mem_mhz_sum / st->samples,
           st->power_w_sum / st->samples, st->temp_c_max, used ? why : "none");
}

static int load_api(nvml_api* a) {
  memset(a, 0, sizeof *a);
  a->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!a->lib) return -1;
  /* Object pointers to function pointers through memcpy (ISO C forbids the cast). */
#define MM_SYM(field, name)                               \
  do {                                                    \
    void* p = dlsym(a->lib, name);                        \
    memcpy(&a->field, &p, sizeof p);                      \
  } while (0)
  MM_SYM(init, "nvmlInit_v2");
  MM_SYM(shutdown, "nvmlShutdown");
  MM_SYM(by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
  MM_SYM(clock, "nvmlDeviceGetClockInfo");
  MM_SYM(temperature, "nvmlDeviceGetTemperature");
  MM_SYM(power, "nvmlDeviceGetPowerUsage");
  MM_SYM(reasons, "nvmlDeviceGetCurrentClocksEventReasons");
  if (!a->reasons) MM_SYM(reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
#undef MM_SYM
  if (!a->init || !a->shutdown || !a->by_pci || !a->clock) {
    dlclose(a->lib);
    a->lib = NULL;
    return -1;
  }
  return 0;
}

/* One sample into s->win (the optional readings only when NVML gave them). */
static void sample(mm_clock_sampler* s) {
  unsigned sm = 0, mem = 0, temp = 0, mw = 0;
  unsigned long long why = 0;
  pthread_mutex_lock(&s->lock);
  const unsigned gen = s->gen;
  pthread_mutex_unlock(&s->lock);
  if (s->api.clock(s->dev, NVML_CLOCK_SM, &sm) != 0 || s->api.clock(s->dev, NVML_CLOCK_MEM, &mem) != 0) return;
  if (!s->api.temperature || s->api.temperature(s->dev, NVML_TEMPERATURE_GPU, &temp) != 0) temp = 0;
  if (!s->api.power || s->api.power(s->dev, &mw) != 0) mw = 0;
  if (!s->api.reasons || s->api.reasons(s->dev, &why) != 0) why = 0;
  mm_clock_stats one = mm_clock_stats_empty();
  one.samples = 1;
  one.sm_mhz_sum = one.sm_mhz_min = one.sm_mhz_max = sm;
  one.mem_mhz_sum = mem;
  one.power_w_sum = mw * 1e-3;
  one.temp_c_max = temp;
  one.reasons = why;
  pthread_mutex_lock(&s->lock);
  if (s->gen == gen) mm_clock_stats_merge(&s->win, &one); /* else it began before the window */
  pthread_mutex_unlock(&s->lock);
}

static void* sampler_main(void* arg) {
  mm_clock_sampler* s = arg;
  const struct timespec period = {s->period_ms / 1000, (long)(s->period_ms % 1000) * 1000000L};
  for (;;) {
    pthread_mutex_lock(&s->lock);
    const int stop = s->stop;
    pthread_mutex_unlock(&s->lock);
    if (stop) return NULL;
    sample(s);
    nanosleep(&period, NULL);
  }
}

mm_clock_sampler* mm_clocks_start(const char* pci_bus_id, int period_ms, const char** why) {
  *why = NULL;
  mm_clock_sampler* s = calloc(1, sizeof *s);
  if (!s) {
    *why = "out of host memory";
    return NULL;
  }
  if (load_api(&s->api) != 0) {
    *why = "NVML (libnvidia-ml.so.1) not found";
    free(s);
    return NULL;
  }
  if (s->api.init() != 0) {
    *why = "nvmlInit failed";
  } else if (s->api.by_pci(pci_bus_id, &s->dev) != 0) {
    *why = "NVML does not know this GPU's PCI bus id";
    s->api.shutdown();
  }
  if (*why) {
    dlclose(s->api.lib);
    free(s);
    return NULL;
  }
  s->period_ms = period_ms > 0 ? period_ms : 1;
  pthread_mutex_init(&s->lock, NULL);
  if (pthread_create(&s->thread, NULL, sampler_main, s) != 0) {
    *why = "pthread_create failed";
    pthread_mutex_destroy(&s->lock);
    s->api.shutdown();
    dlclose(s->api.lib);
    free(s);
    return NULL;
  }
  return s;
}

void mm_clocks_mark(mm_clock_sampler* s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  s->win = mm_clock_stats_empty();
  ++s->gen;
  pthread_mutex_unlock(&s->lock);
}

void mm_clocks_add_window(mm_clock_sampler* s, mm_clock_stats* into) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  const mm_clock_stats w = s->win;
  pthread_mutex_unlock(&s->lock);
  mm_clock_stats_merge(into, &w);
}

void mm_clocks_stop(mm_clock_sampler* s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  s->stop = 1;
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->lock);
  s->api.shutdown();
  dlclose(s->api.lib);
  free(s);
}
