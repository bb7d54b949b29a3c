/* Device error reports in words: peer, site, forward, how long; never raw
 * flag words. */
#include "device_status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char* mm_site_name(int site) {
  switch (site) {
    case MM_SITE_BARRIER_DISPATCH: return "the dispatch barrier";
    case MM_SITE_BARRIER_COMBINE: return "the combine barrier";
    case MM_SITE_ROUTE: return "routing";
    case MM_SITE_DISPATCH: return "dispatch";
    case MM_SITE_GEMM_ROWS_READY: return "a GEMM waiting for its pool rows";
    case MM_SITE_GEMM_PIPE: return "a GEMM pipeline wait";
    case MM_SITE_GRID_BARRIER: return "an in-kernel grid barrier";
    case MM_SITE_HOST: return "the host-side checks of megamoe_forward";
    case MM_SITE_POOL: return "the expert pool layout";
    case MM_SITE_TOKEN_BOUND: return "the fused arm's num_tokens_bound check";
    case MM_SITE_RING: return "the fused arm's ring layout";
    case MM_SITE_RING_SLOT: return "a pull waiting for its ring slot (the slot's previous block's L2 tiles)";
    case MM_SITE_COMBINE_ARRIVED: return "the early combine waiting for a token's expert rows";
  }
  return "an unnamed site";
}

/* Appends to a fixed buffer, truncating. */
typedef struct text {
  char* buf;
  size_t cap, len;
} text;

static void put(text* t, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void put(text* t, const char* fmt, ...) {
  if (t->len + 1 >= t->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  t->len += (size_t)k;
  if (t->len >= t->cap) t->len = t->cap - 1;
}

/* "the combine barrier of forward 4" for barrier number v (v > 0). */
static void put_barrier(text* t, uint64_t v) {
  const uint64_t fwd = v / MM_BARRIERS_PER_FORWARD;
  const int index = (int)(v % MM_BARRIERS_PER_FORWARD);
  put(t, "%s of forward %llu", index == 0 ? "the dispatch barrier" : "the combine barrier",
      (unsigned long long)fwd);
}

/* The status name without its explanation ("MEGAMOE_ERR_BAD_SHAPE"). */
static void put_status_name(text* t, int code) {
  const char* s = megamoe_status_string((megamoe_status)code);
  const char* colon = strchr(s, ':');
  put(t, "%.*s", colon ? (int)(colon - s) : (int)strlen(s), s);
}

megamoe_status mm_describe_device_error(const mm_error_report* r, const mm_status_context* ctx, char* out,
                                        size_t n) {
  text t = {out, n, 0};
  if (n == 0) return MEGAMOE_ERR_INTERNAL;
  out[0] = '\0';
  const int code = r->code;
  const megamoe_status st = (code > 0 && code < MEGAMOE_STATUS_COUNT) ? (megamoe_status)code : MEGAMOE_ERR_INTERNAL;
  const double waited_s = (double)r->waited_ns * 1e-9;
  put(&t, "rank %d, forward %llu: ", ctx->rank, (unsigned long long)r->forward);
  switch (st) {
    case MEGAMOE_ERR_TIMEOUT:
      if (r->where == MM_SITE_BARRIER_DISPATCH || r->where == MM_SITE_BARRIER_COMBINE) {
        put(&t, "rank %d did not arrive at %s: waited %.1f s (timeout_s %.1f); ", r->peer, mm_site_name(r->where),
            waited_s, ctx->timeout_s);
        if (r->seen == 0) put(&t, "it has not reached any barrier of this layer");
        else {
          put(&t, "the last barrier it reached is ");
          put_barrier(&t, r->seen);
        }
      } else if (r->where == MM_SITE_GRID_BARRIER) {
        /* The persistent arms' grid barriers wait twice the layer's deadline
         * (route_phases.cuh, mm_persistent_grid_ctx): a rank barrier's own
         * deadline, inside one CTA, fires first. */
        put(&t, "%s waited %.1f s (the deadline is %.1f s, twice timeout_s) and only %llu of its %llu CTAs arrived",
            mm_site_name(r->where), waited_s, 2.0 * ctx->timeout_s, (unsigned long long)r->seen,
            (unsigned long long)r->want);
      } else {
        put(&t, "%s waited %.1f s (the deadline is %.1f s) for counter %d to reach %lld; it stayed at %lld",
            mm_site_name(r->where), waited_s, ctx->timeout_s, r->detail, (long long)(int64_t)r->want,
            (long long)(int64_t)r->seen);
      }
      put(&t, ". The ranks are out of step: every later forward fails; destroy the layer");
      break;
    case MEGAMOE_ERR_PEER_FAILED:
      put(&t, "peer rank %d failed this forward with ", r->peer);
      put_status_name(&t, r->detail);
      if (r->detail == MEGAMOE_ERR_PEER_FAILED) put(&t, " (one of its own peers failed)");
      put(&t, ", seen at %s; this rank skipped its work and did not write y (rank %d's megamoe_sync has the "
              "details)",
          mm_site_name(r->where), r->peer);
      break;
    case MEGAMOE_ERR_BAD_TOPK_INDEX: {
      const int K = ctx->top_k > 0 ? ctx->top_k : 1;
      put(&t, "topk_idx[%d][%d] (token %d, slot %d) = %lld is outside [-1, %d); nothing computed, y not written",
          r->detail / K, r->detail % K, r->detail / K, r->detail % K, (long long)(int64_t)r->seen,
          ctx->num_experts);
      break;
    }
    case MEGAMOE_ERR_TOO_MANY_TOKENS:
    default:
      if (st == MEGAMOE_ERR_TOO_MANY_TOKENS && r->where == MM_SITE_POOL) {
        const int le = ctx->local_experts > 0 ? r->detail % ctx->local_experts : r->detail;
        put(&t,
            "the expert pool of rank %d overflowed: %llu rows routed here (padded per expert), the pool holds "
            "%llu (pool_imbalance %g); expert %d (local %d) is the first that does not fit. Nothing computed, "
            "nothing written past the pool; raise pool_imbalance or route more evenly",
            ctx->rank, (unsigned long long)r->seen, (unsigned long long)r->want, ctx->pool_imbalance, r->detail,
            le);
      } else if (st == MEGAMOE_ERR_TOO_MANY_TOKENS && r->where == MM_SITE_TOKEN_BOUND) {
        /* fused.h mm_bound_verdict: peer = the rank named, detail = 1 when its bound differs. */
        if (r->detail)
          put(&t, "num_tokens_bound differs across ranks: %lld on rank %d, %lld on rank 0 (0 counts as "
                  "max_tokens_per_rank); it must be identical on every rank",
              (long long)(int64_t)r->seen, r->peer, (long long)(int64_t)r->want);
        else
          put(&t, "num_tokens_bound = %lld is below rank %d's num_tokens = %lld; the bound must cover every rank's "
                  "count",
              (long long)(int64_t)r->want, r->peer, (long long)(int64_t)r->seen);
        put(&t, ". Every rank found it and stopped this forward: nothing computed, y not written");
      } else if (st == MEGAMOE_ERR_TOO_MANY_TOKENS && r->where == MM_SITE_RING) {
        put(&t, "the fused ring of rank %d holds %llu blocks, this forward's single-wave order needs %llu (its "
                "num_tokens_bound promised fewer rows). Nothing computed, nothing written past the ring",
            ctx->rank, (unsigned long long)r->want, (unsigned long long)r->seen);
      } else if (r->where == MM_SITE_HOST) {
        put(&t, "megamoe_forward failed on this rank with ");
        put_status_name(&t, code);
        if (ctx->host_message && ctx->host_message[0]) put(&t, " (%s)", ctx->host_message);
        put(&t, "; the forward ran empty (no input or weight read, y not written) so its peers stayed in step");
      } else if (st == MEGAMOE_ERR_LAYER_FAILED) {
        put(&t, "the layer failed earlier (a timeout left the ranks out of step); destroy it");
      } else {
        put_status_name(&t, code);
        put(&t, " at %s (detail %d)", mm_site_name(r->where), r->detail);
      }
      break;
  }
  if (ctx->failed_forwards > 1)
    put(&t, " [%u forwards failed since the last megamoe_sync; this is the first]", ctx->failed_forwards);
  return st;
}
