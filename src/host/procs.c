/* Process-per-rank launcher (see procs.h). */
#include "procs.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "colocated.h"
#include "megamoe.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads exactly n bytes, waiting at most until deadline (0: forever). */
static int read_full(int fd, void* buf, size_t n, double deadline) {
  size_t got = 0;
  while (got < n) {
    if (deadline > 0) {
      struct pollfd p = {fd, POLLIN, 0};
      int ms = (int)((deadline - now_s()) * 1000);
      if (ms <= 0) return -1;
      int r = poll(&p, 1, ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return -1;
    }
    ssize_t r = read(fd, (char*)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void* buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t r = write(fd, (const char*)buf + put, n - put);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    put += (size_t)r;
  }
  return 0;
}

int mm_count_gpus(void) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return 0;
  }
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    write_full(fds[1], &n, sizeof n);
    _exit(0);
  }
  close(fds[1]);
  int n = 0;
  if (read_full(fds[0], &n, sizeof n, now_s() + 60) != 0) n = 0;
  close(fds[0]);
  int status;
  waitpid(pid, &status, 0);
  return n;
}

/* Records how rank r ended (status from waitpid) into report (may be NULL). */
static void note_end(mm_ranks_report* report, int r, int status, int ended_by_launcher) {
  if (!report) return;
  report->exit_code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  report->signal[r] = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  report->ended[r] = ended_by_launcher;
}

/* SIGTERM to every live child, SIGKILL to those still alive 5 s later. */
static void end_children(pid_t* pids, int* alive, int n, mm_ranks_report* report) {
  for (int i = 0; i < n; ++i)
    if (alive[i]) kill(pids[i], SIGTERM);
  double until = now_s() + 5.0;
  for (;;) {
    int any = 0;
    for (int i = 0; i < n; ++i)
      if (alive[i]) {
        int status;
        if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
          alive[i] = 0;
          note_end(report, i, status, 1);
        } else {
          any = 1;
        }
      }
    if (!any) return;
    if (now_s() > until) {
      for (int i = 0; i < n; ++i)
        if (alive[i]) kill(pids[i], SIGKILL);
      for (int i = 0; i < n; ++i)
        if (alive[i]) {
          int status;
          waitpid(pids[i], &status, 0);
          alive[i] = 0;
          note_end(report, i, status, 1);
        }
      return;
    }
    usleep(10000);
  }
}

static int child_main(int rank, int num_ranks, int flags, int id_out_fd, int id_in_fd, mm_rank_fn fn,
                      void* ctx) {
  if (flags & MM_RANKS_NO_GPU) return fn(rank, num_ranks, NULL, ctx);
  const int device = flags & MM_RANKS_COLOCATED ? 0 : rank;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    fprintf(stderr, "rank %d: cudaSetDevice(%d): %s\n", rank, device, cudaGetErrorString(e));
    return 3;
  }
  if (flags & MM_RANKS_COLOCATED) return fn(rank, num_ranks, NULL, ctx);
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      fprintf(stderr, "rank 0: ncclGetUniqueId: %s\n", ncclGetErrorString(r));
      return 3;
    }
    if (write_full(id_out_fd, &id, sizeof id) != 0) return 3;
  } else if (read_full(id_in_fd, &id, sizeof id, 0) != 0) {
    fprintf(stderr, "rank %d: no unique id from the launcher\n", rank);
    return 3;
  }
  return fn(rank, num_ranks, &id, ctx);
}

static int run_children(int num_ranks, double deadline_s, double grace_s, int flags, mm_colocated* group,
                        mm_rank_fn fn, void* ctx, mm_ranks_report* report);

int mm_run_ranks(int num_ranks, double deadline_s, mm_rank_fn fn, void* ctx) {
  return mm_run_ranks_ex(num_ranks, deadline_s, 0, fn, ctx);
}

int mm_run_ranks_ex(int num_ranks, double deadline_s, int flags, mm_rank_fn fn, void* ctx) {
  const mm_ranks_options o = {deadline_s, 0.0, flags};
  return mm_run_ranks_opt(num_ranks, &o, fn, ctx, NULL);
}

int mm_run_ranks_opt(int num_ranks, const mm_ranks_options* o, mm_rank_fn fn, void* ctx, mm_ranks_report* report) {
  if (report) {
    memset(report, 0, sizeof *report);
    report->first_failed = -1;
  }
  if (num_ranks < 1 || num_ranks > MEGAMOE_MAX_RANKS) {
    fprintf(stderr, "mm_run_ranks: num_ranks = %d out of [1, %d]\n", num_ranks, MEGAMOE_MAX_RANKS);
    return MM_RANKS_LAUNCH_FAILED;
  }
  const double deadline_s = o->deadline_s, grace_s = o->grace_s > 0 ? o->grace_s : 0.0;
  const int flags = o->flags;
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  mm_colocated* group = NULL;
  if (flags & MM_RANKS_COLOCATED) {
    group = mm_colocated_create(num_ranks);
    if (!group) {
      fprintf(stderr, "mm_run_ranks: mapping the co-located group failed\n");
      return MM_RANKS_LAUNCH_FAILED;
    }
  }
  const int result = run_children(num_ranks, deadline_s, grace_s, flags, group, fn, ctx, report);
  mm_colocated_destroy(group);
  return result;
}

/* Closes the launcher's pipes: id_up and the first n of id_down (a launch
 * that failed before any child owns them). */
static void close_pipes(int id_up[2], int id_down[][2], int n) {
  close(id_up[0]);
  close(id_up[1]);
  for (int r = 0; r < n; ++r) {
    close(id_down[r][0]);
    close(id_down[r][1]);
  }
}

/* mm_run_ranks_opt after its checks: fork, relay the id, watch. */
static int run_children(int num_ranks, double deadline_s, double grace_s, int flags, mm_colocated* group,
                        mm_rank_fn fn, void* ctx, mm_ranks_report* report) {
  int id_up[2];   /* child 0 -> parent */
  int id_down[MEGAMOE_MAX_RANKS][2]; /* parent -> child r */
  if (pipe(id_up) != 0) return MM_RANKS_LAUNCH_FAILED;
  for (int r = 0; r < num_ranks; ++r)
    if (pipe(id_down[r]) != 0) {
      close_pipes(id_up, id_down, r);
      return MM_RANKS_LAUNCH_FAILED;
    }
  pid_t pids[MEGAMOE_MAX_RANKS];
  int alive[MEGAMOE_MAX_RANKS] = {0};
  fflush(NULL);
  for (int r = 0; r < num_ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      end_children(pids, alive, r, report);
      close_pipes(id_up, id_down, num_ranks);
      return MM_RANKS_LAUNCH_FAILED;
    }
    if (pid == 0) {
      close(id_up[0]);
      if (r != 0) close(id_up[1]); /* so the parent sees EOF if rank 0 dies */
      for (int q = 0; q < num_ranks; ++q) {
        close(id_down[q][1]);
        if (q != r) close(id_down[q][0]);
      }
      mm_colocated_set_current(group, r);
      int code = child_main(r, num_ranks, flags, id_up[1], id_down[r][0], fn, ctx);
      fflush(NULL);
      _exit(code);
    }
    pids[r] = pid;
    alive[r] = 1;
  }
  close(id_up[1]);
  for (int r = 0; r < num_ranks; ++r) close(id_down[r][0]);

  const double start = now_s();
  const double deadline = deadline_s > 0 ? start + deadline_s : 0;
  int result = 0;
  /* Relay the unique id (or give up if rank 0 never sends one). */
  ncclUniqueId id;
  const int have_id = !(flags & (MM_RANKS_NO_GPU | MM_RANKS_COLOCATED)) && read_full(id_up[0], &id, sizeof id, start + 120) == 0;
  for (int r = 1; r < num_ranks; ++r) {
    if (have_id) write_full(id_down[r][1], &id, sizeof id);
    close(id_down[r][1]);
  }
  close(id_down[0][1]);
  close(id_up[0]);

  /* After the first failure the others run until end_at (the grace), then
   * they are ended: a rank that died leaves its peers blocked in NCCL calls. */
  double end_at = 0;
  int remaining = num_ranks;
  while (remaining > 0) {
    int progressed = 0;
    for (int r = 0; r < num_ranks; ++r) {
      if (!alive[r]) continue;
      int status;
      pid_t w = waitpid(pids[r], &status, WNOHANG);
      if (w != pids[r]) continue;
      alive[r] = 0;
      remaining--;
      progressed = 1;
      note_end(report, r, status, 0);
      int bad = 0;
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        fprintf(stderr, "launcher: rank %d exited with code %d\n", r, WEXITSTATUS(status));
        bad = 1;
      } else if (WIFSIGNALED(status)) {
        fprintf(stderr, "launcher: rank %d killed by signal %d (%s)\n", r, WTERMSIG(status), strsignal(WTERMSIG(status)));
        bad = 1;
      }
      if (bad) {
        result = MM_RANKS_RANK_FAILED;
        if (report && report->first_failed < 0) report->first_failed = r;
        if (remaining > 0 && end_at == 0) {
          if (grace_s > 0)
            fprintf(stderr, "launcher: the other ranks may run %.1f s more before they are ended\n", grace_s);
          end_at = now_s() + grace_s;
        }
      }
    }
    if (remaining > 0 && end_at > 0 && now_s() >= end_at) {
      fprintf(stderr, "launcher: ending the other ranks\n");
      end_children(pids, alive, num_ranks, report);
      remaining = 0;
    }
    if (remaining > 0 && deadline > 0 && now_s() > deadline) {
      fprintf(stderr, "launcher: deadline of %.1f s passed; ending all ranks\n", deadline_s);
      end_children(pids, alive, num_ranks, report);
      return MM_RANKS_DEADLINE;
    }
    if (!progressed) usleep(5000);
  }
  return result;
}
