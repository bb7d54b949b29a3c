/* moe_forward: one megamoe forward on the GPUs of one node, one process per GPU.
 *
 * Copy this file to start a program of your own. It shows:
 *   - one process per GPU, made with fork() by a parent that never touches CUDA:
 *     a process forked after CUDA was initialised in its parent fails with
 *     "initialization error", so the parent counts the GPUs in a throwaway child;
 *   - rank 0 makes the ncclUniqueId; the parent passes it to the other ranks
 *     through pipes;
 *   - NCCL_NVLS_ENABLE=0 set before any NCCL call (megamoe never uses NVLink
 *     multicast and megamoe_comm_create refuses to run without it);
 *   - cudaSetDevice(rank) first in each rank, then megamoe_comm_create,
 *     megamoe_create, megamoe_prepare_weights (random weights in the checkpoint
 *     layout), megamoe_forward + megamoe_sync, megamoe_destroy;
 *   - every call checked; a failure prints megamoe_last_error(), and the
 *     parent ends the other ranks (they would wait for the failed one forever).
 *
 * Build against an installed megamoe (make install PREFIX=...):
 *   cc -std=c11 moe_forward.c $(pkg-config --cflags --libs megamoe) -o moe_forward
 * Run:
 *   ./moe_forward [num_ranks]      (default: every visible GPU, at most 8)
 * Exit codes: 0 success; 1 a rank failed; 2 bad command line or environment;
 *   77 no CUDA GPU visible, nothing was run (the "skipped" code of test drivers).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "megamoe.h"

enum { EXIT_RANK_FAILED = 1, EXIT_USAGE = 2, EXIT_NO_GPU = 77 };

/* The problem: a small layer (H 2048, I 2048, 8 experts per rank, top-4) and
 * 256 tokens on every rank. */
#define HIDDEN 2048
#define INTERMEDIATE 2048
#define EXPERTS_PER_RANK 8
#define TOP_K 4
#define TOKENS 256
#define DEADLINE_S 600.0 /* the whole run; the parent ends every rank after it */

/* ---- Small helpers ------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int write_full(int fd, const void* buf, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = write(fd, (const char*)buf + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    done += (size_t)w;
  }
  return 0;
}

/* Reads n bytes; -1 on end of file, error or when deadline passes. */
static int read_full(int fd, void* buf, size_t n, double deadline) {
  for (size_t done = 0; done < n;) {
    const int ms = (int)((deadline - now_s()) * 1000.0);
    if (ms <= 0) return -1;
    struct pollfd p = {fd, POLLIN, 0};
    const int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    const ssize_t got = read(fd, (char*)buf + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    done += (size_t)got;
  }
  return 0;
}

/* xorshift64*: the random weights and inputs. */
static uint64_t rng_next(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

/* A random fp8 e4m3 value: random sign and mantissa, exponent 2^-3 .. 2^1
 * (never NaN). */
static uint8_t random_e4m3(uint64_t bits) {
  const unsigned sign = (unsigned)(bits & 1), mantissa = (unsigned)((bits >> 1) & 7);
  const unsigned exponent = 4 + (unsigned)((bits >> 4) % 5); /* bias 7 */
  return (uint8_t)((sign << 7) | (exponent << 3) | mantissa);
}

static float bf16_to_float(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- One rank ------------------------------------------------------------ */

#define CUDA_CHECK(call)                                                                               \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, cudaGetErrorString(e_));               \
      goto fail;                                                                                       \
    }                                                                                                  \
  } while (0)

#define MOE_CHECK(call)                                                                                \
  do {                                                                                                 \
    megamoe_status s_ = (call);                                                                        \
    if (s_ != MEGAMOE_OK) {                                                                            \
      fprintf(stderr, "rank %d: %s failed: %s\n  %s\n", rank, #call, megamoe_status_string(s_),       \
              megamoe_last_error());                                                                   \
      goto fail;                                                                                       \
    }                                                                                                  \
  } while (0)

#define HOST_CHECK(cond, what)                                                                         \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      fprintf(stderr, "rank %d: %s\n", rank, what);                                                    \
      goto fail;                                                                                       \
    }                                                                                                  \
  } while (0)

/* Copies n bytes of host data to a new device buffer. */
static cudaError_t upload(void** dst, const void* src, size_t n) {
  cudaError_t e = cudaMalloc(dst, n);
  if (e == cudaSuccess) e = cudaMemcpy(*dst, src, n, cudaMemcpyHostToDevice);
  return e;
}

/* Rank `rank` of num_ranks: its own GPU, its unique id from id_fd (rank 0
 * makes it and sends it to the parent on up_fd). Returns the exit code. */
static int run_rank(int rank, int num_ranks, int id_fd, int up_fd) {
  const int64_t H = HIDDEN, I = INTERMEDIATE, T = TOKENS;
  const int El = EXPERTS_PER_RANK, E = EXPERTS_PER_RANK * num_ranks, K = TOP_K;
  ncclComm_t comm = NULL;
  megamoe_layer* layer = NULL;
  cudaStream_t stream = NULL;
  void *w1 = NULL, *w1_sf = NULL, *w2 = NULL, *w2_sf = NULL;
  void *x = NULL, *x_sf = NULL, *topk_idx = NULL, *topk_w = NULL, *y = NULL;
  uint8_t* h_bytes = NULL;
  float* h_floats = NULL;
  int32_t* h_idx = NULL;
  uint16_t* h_y = NULL;

  /* 1. The device first: every CUDA, NCCL and megamoe call after this one
   *    works on it. */
  CUDA_CHECK(cudaSetDevice(rank));

  /* 2. The communicator: rank 0 makes the unique id, the others receive it. */
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      fprintf(stderr, "rank 0: ncclGetUniqueId failed: %s\n", ncclGetErrorString(r));
      goto fail;
    }
    HOST_CHECK(write_full(up_fd, &id, sizeof id) == 0, "could not send the unique id to the parent");
  } else {
    HOST_CHECK(read_full(id_fd, &id, sizeof id, now_s() + DEADLINE_S) == 0, "no unique id from the parent");
  }
  MOE_CHECK(megamoe_comm_create(rank, num_ranks, &id, &comm));
  /* A blocking stream: it waits for the cudaMemcpy calls below (they run on
   * the legacy default stream), so the layer reads complete inputs. */
  CUDA_CHECK(cudaStreamCreate(&stream));

  /* 3. The layer (collective: every rank, same config). */
  megamoe_config cfg = megamoe_config_make(H, I, E, K, T);
  MOE_CHECK(megamoe_create(&cfg, comm, &layer));

  /* 4. This rank's experts' weights, in the checkpoint layout (megamoe.h):
   *    w1 [El, 2I, H] and w2 [El, H, I] fp8 e4m3, one fp32 scale per 128x128
   *    block. Random here; a real program loads them. */
  uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
  const size_t n_w1 = (size_t)(El * 2 * I * H), n_w2 = (size_t)(El * H * I);
  const size_t n_w1_sf = (size_t)(El * (2 * I / 128) * (H / 128)), n_w2_sf = (size_t)(El * (H / 128) * (I / 128));
  size_t n_floats = n_w1_sf > n_w2_sf ? n_w1_sf : n_w2_sf; /* also x_sf and topk_w below */
  if (n_floats < (size_t)(T * (H / 128))) n_floats = (size_t)(T * (H / 128));
  if (n_floats < (size_t)(T * K)) n_floats = (size_t)(T * K);
  h_bytes = malloc(n_w1 > n_w2 ? n_w1 : n_w2); /* also x below */
  h_floats = malloc(sizeof(float) * n_floats);
  HOST_CHECK(h_bytes && h_floats, "out of host memory");
  for (size_t i = 0; i < n_w1; ++i) h_bytes[i] = random_e4m3(rng_next(&seed));
  CUDA_CHECK(upload(&w1, h_bytes, n_w1));
  for (size_t i = 0; i < n_w2; ++i) h_bytes[i] = random_e4m3(rng_next(&seed));
  CUDA_CHECK(upload(&w2, h_bytes, n_w2));
  for (size_t i = 0; i < n_w1_sf; ++i) h_floats[i] = (float)(1.0 / sqrt((double)H));
  CUDA_CHECK(upload(&w1_sf, h_floats, sizeof(float) * n_w1_sf));
  for (size_t i = 0; i < n_w2_sf; ++i) h_floats[i] = (float)(1.0 / sqrt((double)I));
  CUDA_CHECK(upload(&w2_sf, h_floats, sizeof(float) * n_w2_sf));
  megamoe_weights weights = {w1, (const float*)w1_sf, w2, (const float*)w2_sf};
  MOE_CHECK(megamoe_prepare_weights(layer, &weights, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  /* The layer keeps its own copy: ours can go. */
  CUDA_CHECK(cudaFree(w1));
  CUDA_CHECK(cudaFree(w2));
  CUDA_CHECK(cudaFree(w1_sf));
  CUDA_CHECK(cudaFree(w2_sf));
  w1 = w2 = w1_sf = w2_sf = NULL;

  /* 5. Inputs: x [T, H] fp8 with one scale per 128 channels, the router's
   *    top-k (global expert ids, distinct per token; -1 would mask a slot) and
   *    weights. */
  for (size_t i = 0; i < (size_t)(T * H); ++i) h_bytes[i] = random_e4m3(rng_next(&seed));
  CUDA_CHECK(upload(&x, h_bytes, (size_t)(T * H)));
  for (size_t i = 0; i < (size_t)(T * (H / 128)); ++i) h_floats[i] = 1.0f;
  CUDA_CHECK(upload(&x_sf, h_floats, sizeof(float) * (size_t)(T * (H / 128))));
  h_idx = malloc(sizeof(int32_t) * (size_t)(T * K));
  HOST_CHECK(h_idx, "out of host memory");
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0;
    for (int k = 0; k < K; ++k) {
      int e, fresh;
      do {
        e = (int)(rng_next(&seed) % (uint64_t)E);
        fresh = 1;
        for (int j = 0; j < k; ++j) fresh &= h_idx[t * K + j] != e;
      } while (!fresh);
      h_idx[t * K + k] = e;
      h_floats[t * K + k] = 0.5f + (float)(rng_next(&seed) % 1000) / 1000.0f;
      sum += h_floats[t * K + k];
    }
    for (int k = 0; k < K; ++k) h_floats[t * K + k] /= sum;
  }
  CUDA_CHECK(upload(&topk_idx, h_idx, sizeof(int32_t) * (size_t)(T * K)));
  CUDA_CHECK(upload(&topk_w, h_floats, sizeof(float) * (size_t)(T * K)));
  CUDA_CHECK(cudaMalloc(&y, sizeof(uint16_t) * (size_t)(T * H)));

  /* 6. The forward (collective, asynchronous), then megamoe_sync for the
   *    errors found on the device (a bad top-k index, a peer's failure or
   *    timeout). */
  megamoe_forward_args args = {x, (const float*)x_sf, topk_idx, MEGAMOE_INDEX_INT32, (const float*)topk_w,
                               T, 0, y};
  MOE_CHECK(megamoe_forward(layer, &args, stream));
  MOE_CHECK(megamoe_sync(layer, stream));

  /* 7. The output: y [T, H] bf16 for this rank's own tokens. */
  h_y = malloc(sizeof(uint16_t) * (size_t)(T * H));
  HOST_CHECK(h_y, "out of host memory");
  CUDA_CHECK(cudaMemcpy(h_y, y, sizeof(uint16_t) * (size_t)(T * H), cudaMemcpyDeviceToHost));
  double sum_abs = 0;
  int64_t not_finite = 0;
  for (int64_t i = 0; i < T * H; ++i) {
    const float v = bf16_to_float(h_y[i]);
    if (!isfinite(v)) ++not_finite;
    else sum_abs += fabs(v);
  }
  printf("rank %d: y [%lld x %lld] bf16, mean |y| %.4f, y[0][0..3] = %.4f %.4f %.4f %.4f\n", rank, (long long)T,
         (long long)H, sum_abs / (double)(T * H), bf16_to_float(h_y[0]), bf16_to_float(h_y[1]),
         bf16_to_float(h_y[2]), bf16_to_float(h_y[3]));
  HOST_CHECK(not_finite == 0, "y holds values that are not finite");

  /* 8. Teardown, collective like creation: every rank destroys its layer,
   *    then its communicator. */
  MOE_CHECK(megamoe_destroy(layer));
  layer = NULL;
  void* device_buffers[] = {x, x_sf, topk_idx, topk_w, y};
  for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; ++i) CUDA_CHECK(cudaFree(device_buffers[i]));
  x = x_sf = topk_idx = topk_w = y = NULL;
  CUDA_CHECK(cudaStreamDestroy(stream));
  stream = NULL;
  if (ncclCommDestroy(comm) != ncclSuccess) {
    comm = NULL; /* destroyed or not, not to be used again */
    fprintf(stderr, "rank %d: ncclCommDestroy failed\n", rank);
    goto fail;
  }
  comm = NULL;
  free(h_bytes);
  free(h_floats);
  free(h_idx);
  free(h_y);
  return 0;

fail:
  /* After a failure the ranks may be out of step, or a peer gone, so the
   * collective teardown (megamoe_destroy, ncclCommDestroy) could wait for
   * ever. Abort the communicator (local: it ends NCCL's work and frees it) and
   * leave without the layer's teardown: the end of the process frees its
   * device memory, and the parent ends the other ranks. */
  if (comm) ncclCommAbort(comm);
  free(h_bytes);
  free(h_floats);
  free(h_idx);
  free(h_y);
  return EXIT_RANK_FAILED;
}

/* ---- The parent: counts GPUs, forks the ranks, relays the id, watches ---- */

/* CUDA devices visible, counted in a throwaway child so the parent stays free
 * of CUDA. 0 without a device or a driver. */
static int count_gpus(void) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fflush(NULL);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(write_full(fds[1], &n, sizeof n) == 0 ? 0 : 1);
  }
  close(fds[1]);
  int n = -1;
  if (read_full(fds[0], &n, sizeof n, now_s() + 60.0) != 0) n = -1;
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return n;
}

static void end_ranks(const pid_t* pids, const int* alive, int n) {
  for (int r = 0; r < n; ++r)
    if (alive[r]) kill(pids[r], SIGKILL);
}

int main(int argc, char** argv) {
  int num_ranks = 0;
  if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
    fprintf(argc == 2 ? stdout : stderr, "usage: %s [num_ranks]   (1..%d; default: every visible GPU)\n", argv[0],
            MEGAMOE_MAX_RANKS);
    return argc == 2 ? 0 : EXIT_USAGE;
  }
  if (argc == 2) {
    char* end = NULL;
    errno = 0;
    const long v = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || errno == ERANGE || v < 1 || v > MEGAMOE_MAX_RANKS) {
      fprintf(stderr, "moe_forward: num_ranks '%s': must be a whole number in [1, %d]\n", argv[1], MEGAMOE_MAX_RANKS);
      return EXIT_USAGE;
    }
    num_ranks = (int)v;
  }

  /* Before any NCCL call, in the parent, so that every rank inherits it. */
  const char* nvls = getenv("NCCL_NVLS_ENABLE");
  if (!nvls) {
    if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) {
      perror("moe_forward: setenv NCCL_NVLS_ENABLE");
      return EXIT_USAGE;
    }
  } else if (strcmp(nvls, "0") != 0) {
    fprintf(stderr, "moe_forward: NCCL_NVLS_ENABLE=%s: megamoe never uses NVLink multicast; unset it or set it to 0\n",
            nvls);
    return EXIT_USAGE;
  }

  const int gpus = count_gpus();
  if (gpus < 0) {
    fprintf(stderr, "moe_forward: could not count the GPUs (fork or pipe failed)\n");
    return EXIT_RANK_FAILED;
  }
  if (gpus == 0) {
    printf("moe_forward: no CUDA GPU visible: nothing to run (this example needs 1 to %d Hopper GPUs of one node)\n",
           MEGAMOE_MAX_RANKS);
    return EXIT_NO_GPU;
  }
  if (num_ranks == 0) num_ranks = gpus < MEGAMOE_MAX_RANKS ? gpus : MEGAMOE_MAX_RANKS;
  if (num_ranks > gpus) {
    fprintf(stderr, "moe_forward: num_ranks %d but %d GPU(s) visible\n", num_ranks, gpus);
    return EXIT_USAGE;
  }
  printf("moe_forward: %d rank(s), H %d, I %d, %d experts per rank, top-%d, %d tokens per rank\n", num_ranks, HIDDEN,
         INTERMEDIATE, EXPERTS_PER_RANK, TOP_K, TOKENS);

  /* up: rank 0 -> parent (the unique id); down[r]: parent -> rank r. */
  int up[2], down[MEGAMOE_MAX_RANKS][2];
  pid_t pids[MEGAMOE_MAX_RANKS];
  int alive[MEGAMOE_MAX_RANKS] = {0};
  if (pipe(up) != 0) {
    perror("moe_forward: pipe");
    return EXIT_RANK_FAILED;
  }
  int launched = 0, rc = 0;
  for (int r = 0; r < num_ranks; ++r) {
    if (pipe(down[r]) != 0) {
      perror("moe_forward: pipe");
      rc = EXIT_RANK_FAILED;
      break;
    }
    fflush(NULL);
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("moe_forward: fork");
      close(down[r][0]);
      close(down[r][1]);
      rc = EXIT_RANK_FAILED;
      break;
    }
    if (pids[r] == 0) { /* the rank: keep only its own pipe ends */
      close(up[0]);
      if (r != 0) close(up[1]);
      for (int j = 0; j <= r; ++j) close(down[j][1]); /* the parent closed down[j][0] of earlier ranks */
      const int code = run_rank(r, num_ranks, down[r][0], up[1]);
      fflush(NULL);
      exit(code);
    }
    close(down[r][0]);
    alive[r] = 1;
    launched = r + 1;
  }
  close(up[1]);

  /* Relay rank 0's unique id to the others. */
  const double deadline = now_s() + DEADLINE_S;
  ncclUniqueId id;
  if (rc == 0 && read_full(up[0], &id, sizeof id, deadline) != 0) {
    fprintf(stderr, "moe_forward: rank 0 sent no unique id\n");
    rc = EXIT_RANK_FAILED;
  }
  for (int r = 1; r < launched && rc == 0; ++r)
    if (write_full(down[r][1], &id, sizeof id) != 0) {
      fprintf(stderr, "moe_forward: could not send the unique id to rank %d\n", r);
      rc = EXIT_RANK_FAILED;
    }
  close(up[0]);
  for (int r = 0; r < launched; ++r) close(down[r][1]);
  if (rc != 0) end_ranks(pids, alive, launched);

  /* Wait for every rank. The first that fails ends the others: they would
   * wait for it inside NCCL or megamoe until their own deadlines. */
  for (int left = launched; left > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {
      if (now_s() > deadline && rc == 0) {
        fprintf(stderr, "moe_forward: past the %.0f s deadline; ending every rank\n", DEADLINE_S);
        rc = EXIT_RANK_FAILED;
        end_ranks(pids, alive, launched);
      }
      const struct timespec pause_10ms = {0, 10 * 1000 * 1000};
      nanosleep(&pause_10ms, NULL);
      continue;
    }
    int r = 0;
    while (r < launched && pids[r] != pid) ++r;
    if (r == launched) continue;
    alive[r] = 0;
    --left;
    const int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && rc == 0) {
      if (WIFSIGNALED(status)) fprintf(stderr, "moe_forward: rank %d died (signal %d); ending the others\n", r,
                                       WTERMSIG(status));
      else fprintf(stderr, "moe_forward: rank %d failed (exit %d); ending the others\n", r, WEXITSTATUS(status));
      rc = EXIT_RANK_FAILED;
      end_ranks(pids, alive, launched);
    }
  }
  if (rc == 0) printf("moe_forward: every rank finished\n");
  return rc;
}
