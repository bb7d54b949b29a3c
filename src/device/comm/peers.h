/* NVLink peers of a layer (C interface), used once at create. */
#ifndef MEGAMOE_COMM_PEERS_H
#define MEGAMOE_COMM_PEERS_H

#include <nccl.h>
#include <stdint.h>

#include "megamoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Resolves the symmetric base of every rank from an NCCL window (collective
 * registration already done). peer_sym_out: host array of num_ranks pointers. */
megamoe_status mm_resolve_peers(ncclWindow_t window, int num_ranks, uint8_t** peer_sym_out);

/* Number of ranks of comm in this rank's NVLink load/store team. */
megamoe_status mm_lsa_team_size(ncclComm_t comm, int* size);

#ifdef __cplusplus
}
#endif

#endif
