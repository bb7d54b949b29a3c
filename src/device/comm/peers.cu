/* Resolves every rank's symmetric-buffer base from the NCCL window, once at
 * create. The kernels then use plain loads and stores through these pointers. */
#include <nccl.h>
#include <nccl_device.h>

#include "common.cuh"
#include "comm/peers.h"

extern "C" {
#include "host/errors.h"
}

__global__ void resolve_peers_kernel(ncclWindow_t window, int num_ranks, uint8_t** out) {
  const int p = threadIdx.x;
  if (p < num_ranks) out[p] = static_cast<uint8_t*>(ncclGetLsaPointer(window, 0, p));
}

extern "C" megamoe_status mm_resolve_peers(ncclWindow_t window, int num_ranks,
                                           uint8_t** peer_sym_out) {
  uint8_t** d_out = NULL;
  cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&d_out), sizeof(uint8_t*) * num_ranks);
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "cudaMalloc(peer table): %s", cudaGetErrorString(err));
  resolve_peers_kernel<<<1, 32>>>(window, num_ranks, d_out);
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cudaMemcpy(peer_sym_out, d_out, sizeof(uint8_t*) * num_ranks, cudaMemcpyDeviceToHost);
  cudaError_t free_err = cudaFree(d_out);
  if (err == cudaSuccess) err = free_err;
  if (err != cudaSuccess)
    return mm_fail(MEGAMOE_ERR_CUDA, "resolving peer pointers: %s", cudaGetErrorString(err));
  return MEGAMOE_OK;
}

/* Ranks of comm that share this rank's load/store (NVLink) domain. */
extern "C" megamoe_status mm_lsa_team_size(ncclComm_t comm, int* size) {
  ncclTeam_t team = ncclTeamLsa(comm);
  *size = team.nRanks;
  return MEGAMOE_OK;
}
