/* Fault tests (issue 14, part 3): `make faults`, build/fault_tests [filter].
 *
 * Each case runs two ranks (EP2, one process per GPU, the library's
 * launcher with a grace period: after a rank dies the others get time to
 * report before they are ended) on a layer whose deadline is 1 s
 * (config timeout_s), on the staged, split and fused arms:
 *  - kill inside a forward: the victim enqueues a forward, whose kernels
 *    wait at the first cross-rank barrier for the peers (which have not
 *    entered yet), and SIGKILLs itself 20 ms later; the peers enter right
 *    after the kill, forward until the first error;
 *  - kill while the peers wait: the peers' forward is enqueued and waiting;
 *    the victim SIGKILLs itself before it joins;
 *    (both: every survivor's forward/sync must return MEGAMOE_ERR_TIMEOUT or
 *    MEGAMOE_ERR_PEER_FAILED naming the dead rank within the deadline + 10 %
 *    of the kill, a later forward MEGAMOE_ERR_LAYER_FAILED at once, and
 *    megamoe_abandon and megamoe_comm_abort return; the launcher returns
 *    MM_RANKS_RANK_FAILED naming the dead rank and its signal);
 *  - skip one forward: the victim skips one forward and joins the next:
 *    every rank's step times out within the deadline + 10 % of its start
 *    (the others in the skipped forward, the victim in the next), and every
 *    rank destroys the layer and the communicator collectively;
 *  - a different config on one rank (once, staged): megamoe_create returns
 *    a status naming the field on every rank, without a hang, for every
 *    field tried, a NULL config and an invalid one; then the same config
 *    makes a working layer.
 * Each case prints its measured time to error and PASS/FAIL; the closing
 * line is "N passed, N failed, N skipped". Needs 2 GPUs; skips, saying so,
 * with fewer. MEGAMOE_FAULT_PLANT=bound judges against half the deadline:
 * the kill and skip cases must then FAIL (the bound can fail). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "fault_judge.h"
#include "gpu/layer_case.h"
#include "host/procs.h"

#define FT_TIMEOUT_S 1.0   /* the layer's deadline in every case: the smallest the issue asks for */
#define FT_WAIT_S 60.0     /* how long a rank waits for another on the host before it gives up */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits until *word reaches want (another rank's progress); 0, or -1 after FT_WAIT_S. */
static int wait_for(const int* word, int want) {
  const double until = now_s() + FT_WAIT_S;
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < want) {
    if (now_s() > until) return -1;
    usleep(100);
  }
  return 0;
}

/* Every rank arrives at host barrier i before any leaves it. */
static int host_barrier(ft_shared* sh, int i, int num_ranks) {
  __atomic_fetch_add(&sh->arrived[i], 1, __ATOMIC_ACQ_REL);
  return wait_for(&sh->arrived[i], num_ranks);
}

typedef struct ft_run {
  ft_case c;
  ft_shared* sh;
  uint64_t seed;
} ft_run;

/* One rank's layer: communicator, the problem (layer_case.h), the layer. */
typedef struct ft_env {
  mm_rank_ctx ctx;
  lc_case lc;
  lc_data d;
  lc_device g;
  megamoe_layer* layer;
  int have_data;
} ft_env;

static void note(ft_rank_result* x, const char* what, const char* detail) {
  snprintf(x->note, sizeof x->note, "%s: %s", what, detail);
}

/* Communicator and the case's problem on this rank (no layer yet). */
static int env_open(ft_env* e, const ft_run* run, int rank, const ncclUniqueId* id, ft_rank_result* x) {
  memset(e, 0, sizeof *e);
  e->ctx.rank = rank;
  e->ctx.num_ranks = run->c.num_ranks;
  e->ctx.seed = run->seed;
  if (megamoe_comm_create(rank, run->c.num_ranks, id, &e->ctx.comm) != MEGAMOE_OK) {
    note(x, "megamoe_comm_create", megamoe_last_error());
    return -1;
  }
  if (cudaStreamCreate(&e->ctx.stream) != cudaSuccess) {
    note(x, "cudaStreamCreate", "failed");
    return -1;
  }
  e->lc = lc_make(&e->ctx, 512, 256, 4 * run->c.num_ranks, 2, 64, 1400 + (uint64_t)run->c.kind);
  e->lc.cfg.arm = run->c.arm;
  e->lc.cfg.timeout_s = run->c.timeout_s;
  e->lc.mask_ratio = 0.1;
  if (lc_build(&e->lc, run->c.num_ranks, rank, &e->d) != 0 || lc_upload(&e->lc, &e->d, rank, &e->g) != 0) {
    note(x, "problem", "lc_build / lc_upload failed");
    return -1;
  }
  e->have_data = 1;
  return 0;
}

/* Collective: the layer, its weights and one forward checked against the
 * reference (so the fault meets a layer that works, its kernels loaded). */
static int env_layer(ft_env* e, ft_rank_result* x) {
  if (megamoe_create(&e->lc.cfg, e->ctx.comm, &e->layer) != MEGAMOE_OK) {
    note(x, "megamoe_create", megamoe_last_error());
    e->layer = NULL;
    return -1;
  }
  megamoe_weights w = {e->g.w1, e->g.w1_sf, e->g.w2, e->g.w2_sf};
  if (megamoe_prepare_weights(e->layer, &w, e->ctx.stream) != MEGAMOE_OK) {
    note(x, "megamoe_prepare_weights", megamoe_last_error());
    return -1;
  }
  megamoe_forward_args a = lc_args(&e->lc, &e->g, e->ctx.rank);
  if (megamoe_forward(e->layer, &a, e->ctx.stream) != MEGAMOE_OK || megamoe_sync(e->layer, e->ctx.stream) != MEGAMOE_OK) {
    note(x, "warm-up forward", megamoe_last_error());
    return -1;
  }
  if (lc_check_output(&e->lc, &e->d, e->ctx.rank, e->g.y, "warm-up forward") != 0) {
    note(x, "warm-up forward", "the output is wrong");
    return -1;
  }
  return 0;
}

static void env_free_data(ft_env* e) {
  if (!e->have_data) return;
  lc_device_free(&e->g);
  lc_free(&e->d);
  e->have_data = 0;
}

/* The fault step: up to max_forwards forwards (each synced) until the first
 * error; *launched (may be NULL) is bumped once the first is enqueued. */
static void fault_step(ft_env* e, ft_rank_result* x, int max_forwards, int* launched) {
  megamoe_forward_args a = lc_args(&e->lc, &e->g, e->ctx.rank);
  x->t_start = now_s();
  x->error = MEGAMOE_OK;
  for (int f = 1; f <= max_forwards && x->error == MEGAMOE_OK; ++f) {
    megamoe_status st = megamoe_forward(e->layer, &a, e->ctx.stream);
    if (f == 1 && launched) __atomic_fetch_add(launched, 1, __ATOMIC_ACQ_REL);
    if (st == MEGAMOE_OK) st = megamoe_sync(e->layer, e->ctx.stream);
    if (st != MEGAMOE_OK) {
      x->t_error = now_s();
      x->error = st;
      x->error_forward = f;
      snprintf(x->message, sizeof x->message, "%s", megamoe_last_error());
    }
  }
  if (x->error == MEGAMOE_OK) x->t_error = now_s();
  /* One more forward: after a timeout it must be refused at once. */
  x->later_forward = megamoe_forward(e->layer, &a, e->ctx.stream);
  x->later_sync = megamoe_sync(e->layer, e->ctx.stream);
}

/* Frees the layer and the communicator: alone (a peer died) or collectively. */
static void env_close(ft_env* e, ft_rank_result* x, int peer_died) {
  double t = now_s();
  x->release = peer_died ? megamoe_abandon(e->layer) : megamoe_destroy(e->layer);
  x->release_s = now_s() - t;
  e->layer = NULL;
  t = now_s();
  x->comm_release = peer_died ? megamoe_comm_abort(e->ctx.comm) : megamoe_comm_destroy(e->ctx.comm);
  x->comm_release_s = now_s() - t;
  e->ctx.comm = NULL;
  env_free_data(e);
  if (e->ctx.stream) cudaStreamDestroy(e->ctx.stream);
}

/* Dies by SIGKILL, noting the time first (the survivors measure from it). */
static void die_now(ft_shared* sh) {
  fflush(NULL);
  __atomic_store_n(&sh->kill_ns, now_ns(), __ATOMIC_RELEASE);
  raise(SIGKILL);
}

static int rank_kill(ft_env* e, const ft_run* run, ft_rank_result* x) {
  ft_shared* sh = run->sh;
  const int R = run->c.num_ranks;
  if (e->ctx.rank == run->c.victim) {
    if (run->c.kind == FT_KILL_INSIDE) {
      /* Inside the forward: its kernels wait at the first cross-rank
       * barrier for peers that enter only after the kill. */
      megamoe_forward_args a = lc_args(&e->lc, &e->g, e->ctx.rank);
      if (megamoe_forward(e->layer, &a, e->ctx.stream) != MEGAMOE_OK) note(x, "victim's forward", megamoe_last_error());
      usleep(20000);
    } else {
      /* The peers wait inside their forward; this rank never joins it. */
      if (wait_for(&sh->launched, R - 1) != 0) note(x, "victim", "the peers never enqueued their forward");
      usleep(20000);
    }
    die_now(sh);
  }
  if (run->c.kind == FT_KILL_INSIDE) {
    const double until = now_s() + FT_WAIT_S;
    while (__atomic_load_n(&sh->kill_ns, __ATOMIC_ACQUIRE) == 0 && now_s() < until) usleep(50);
  }
  /* Up to 3 forwards: a killed process's kernels may still finish the
   * forward they were in before its context is torn down; the next one
   * cannot. The verdict says which forward failed. */
  fault_step(e, x, 3, run->c.kind == FT_KILL_WAITING ? &sh->launched : NULL);
  env_close(e, x, 1);
  return 0;
}

static int rank_skip(ft_env* e, const ft_run* run, ft_rank_result* x) {
  ft_shared* sh = run->sh;
  const int R = run->c.num_ranks;
  if (e->ctx.rank == run->c.victim) {
    /* Skip the forward the others make; join the next one. */
    if (wait_for(&sh->done, R - 1) != 0) note(x, "skipper", "the others never finished their step");
    if (host_barrier(sh, 1, R) != 0) note(x, "host barrier", "a peer never arrived");
    fault_step(e, x, 1, NULL);
  } else {
    fault_step(e, x, 1, NULL);
    __atomic_fetch_add(&sh->done, 1, __ATOMIC_ACQ_REL);
    if (host_barrier(sh, 1, R) != 0) note(x, "host barrier", "a peer never arrived");
  }
  env_close(e, x, 0); /* every rank lives: the collective teardown */
  return 0;
}

static int rank_config(ft_env* e, const ft_run* run) {
  ft_shared* sh = run->sh;
  const int R = run->c.num_ranks;
  for (int i = 0; i < FT_CONFIG_CASES; ++i) {
    ft_create_result* x = &sh->create[i][e->ctx.rank];
    if (host_barrier(sh, i, R) != 0) return 1;
    megamoe_config cfg = e->lc.cfg;
    int null_config = 0;
    if (e->ctx.rank == run->c.victim) ft_config_apply(i, &cfg, &null_config);
    megamoe_layer* layer = NULL;
    const double t = now_s();
    x->status = megamoe_create(null_config ? NULL : &cfg, e->ctx.comm, &layer);
    x->seconds = now_s() - t;
    snprintf(x->message, sizeof x->message, "%s", megamoe_last_error());
    x->layer_made = layer != NULL;
    x->forward = MEGAMOE_ERR_INTERNAL;
    if (layer && ft_config_cases[i].odd_status == MEGAMOE_OK) {
      /* The control: the layer works (every rank made one). */
      megamoe_weights w = {e->g.w1, e->g.w1_sf, e->g.w2, e->g.w2_sf};
      megamoe_forward_args a = lc_args(&e->lc, &e->g, e->ctx.rank);
      x->forward = megamoe_prepare_weights(layer, &w, e->ctx.stream);
      if (x->forward == MEGAMOE_OK) x->forward = megamoe_forward(layer, &a, e->ctx.stream);
      if (x->forward == MEGAMOE_OK) x->forward = megamoe_sync(layer, e->ctx.stream);
      if (x->forward == MEGAMOE_OK && lc_check_output(&e->lc, &e->d, e->ctx.rank, e->g.y, "control") != 0)
        x->forward = MEGAMOE_ERR_DEVICE_CHECK;
      megamoe_destroy(layer);
    } else if (layer) {
      megamoe_abandon(layer); /* a layer that should not exist: not collective (its peers may have none) */
    }
    x->reported = 1;
  }
  megamoe_comm_destroy(e->ctx.comm);
  e->ctx.comm = NULL;
  env_free_data(e);
  cudaStreamDestroy(e->ctx.stream);
  return 0;
}

static int rank_main(int rank, int num_ranks, const ncclUniqueId* id, void* vrun) {
  const ft_run* run = (const ft_run*)vrun;
  ft_rank_result* x = &run->sh->rank[rank];
  ft_env e;
  if (env_open(&e, run, rank, id, x) != 0) {
    x->reported = 1;
    return 3;
  }
  if (run->c.kind == FT_CONFIG) return rank_config(&e, run);
  /* create is collective: every rank reaches it, whatever its setup found */
  x->setup_ok = env_layer(&e, x) == 0;
  int rc = 0;
  if (!x->setup_ok) {
    x->reported = 1;
    return 3; /* the launcher ends the others; the verdict names the note */
  }
  /* Every rank's layer works before the fault. */
  if (host_barrier(run->sh, 0, num_ranks) != 0) {
    note(x, "host barrier", "a peer never arrived");
    x->reported = 1;
    return 1;
  }
  rc = run->c.kind == FT_SKIP ? rank_skip(&e, run, x) : rank_kill(&e, run, x);
  x->reported = 1;
  return rc;
}

/* ---- the parent: never touches CUDA ---------------------------------------------- */
static int matches(const ft_case* c, const char* filter) { return !filter || strstr(c->label, filter); }

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : NULL;
  const char* seed_env = getenv("MEGAMOE_TEST_SEED");
  const uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL);
  const char* plant = getenv("MEGAMOE_FAULT_PLANT");
  const double bound_factor = plant && strcmp(plant, "bound") == 0 ? 0.5 : 1.10;
  ft_case cases[10];
  int n = 0;
  const megamoe_arm arms[3] = {MEGAMOE_ARM_STAGED, MEGAMOE_ARM_SPLIT, MEGAMOE_ARM_FUSED};
  const struct {
    ft_kind kind;
    const char* what;
  } kinds[3] = {{FT_KILL_INSIDE, "a rank SIGKILLed inside a forward"},
                {FT_KILL_WAITING, "a rank SIGKILLed while its peers wait in a forward"},
                {FT_SKIP, "a rank skips one forward"}};
  for (int a = 0; a < 3; ++a)
    for (int k = 0; k < 3; ++k) {
      ft_case c = {kinds[k].kind, arms[a], 2, 1, FT_TIMEOUT_S, ""};
      snprintf(c.label, sizeof c.label, "EP2 %s, deadline %.0f s: %s", megamoe_arm_name(arms[a]), FT_TIMEOUT_S,
               kinds[k].what);
      cases[n++] = c;
    }
  ft_case config = {FT_CONFIG, MEGAMOE_ARM_STAGED, 2, 1, FT_TIMEOUT_S, "EP2 create with another config on rank 1"};
  cases[n++] = config;

  ft_counts counts = {0, 0, 0};
  const int gpus = mm_count_gpus();
  if (gpus < 2) {
    printf("fault tests: %d GPU(s) visible, the cases need 2: skipping every case\n", gpus);
    for (int i = 0; i < n; ++i)
      if (matches(&cases[i], filter)) {
        printf("[SKIP] %s\n", cases[i].label);
        counts.skipped += ft_verdicts(cases[i].kind);
      }
    printf("%d passed, %d failed, %d skipped\n", counts.passed, counts.failed, counts.skipped);
    return 0;
  }
  printf("fault tests on 2 of %d GPU(s), deadline %.1f s, time-to-error bound %.2f x the deadline%s\n", gpus,
         FT_TIMEOUT_S, bound_factor, bound_factor < 1 ? " (MEGAMOE_FAULT_PLANT=bound: the kill and skip cases must FAIL)" : "");
  fflush(stdout);
  for (int i = 0; i < n; ++i) {
    if (!matches(&cases[i], filter)) continue;
    ft_shared* sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
      perror("mmap");
      counts.failed += ft_verdicts(cases[i].kind);
      continue;
    }
    memset(sh, 0, sizeof *sh);
    ft_run run = {cases[i], sh, seed};
    /* After a rank dies the others report within a few deadlines; the
     * grace ends a survivor that hangs (the verdict then says so). */
    const mm_ranks_options o = {180.0, 30.0, 0};
    ft_launch launch;
    const double t = now_s();
    launch.rc = mm_run_ranks_opt(cases[i].num_ranks, &o, rank_main, &run, &launch.report);
    printf("case \"%s\": %.1f s\n", cases[i].label, now_s() - t);
    ft_judge(&cases[i], sh, &launch, bound_factor, stdout, &counts);
    munmap(sh, sizeof *sh);
  }
  printf("%d passed, %d failed, %d skipped\n", counts.passed, counts.failed, counts.skipped);
  return counts.failed ? 1 : 0;
}
