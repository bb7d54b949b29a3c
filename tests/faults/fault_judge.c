/* Verdicts of the fault tests (fault_judge.h). */
#include "fault_judge.h"

#include <signal.h>
#include <stdarg.h>
#include <string.h>

const ft_config_case ft_config_cases[FT_CONFIG_CASES] = {
    {"hidden differs (512 / 1024)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT, ": hidden = 512 on rank 0, 1024",
     ": hidden = 512 on rank 0, 1024"},
    {"top_k differs (2 / 3)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT, ": top_k = 2 on rank 0, 3", ": top_k = 2 on rank 0, 3"},
    {"arm differs (staged / split)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT, ": arm = ", ": arm = "},
    {"timeout_s differs (1 / 2)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT, ": timeout_s = 1 on rank 0, 2",
     ": timeout_s = 1 on rank 0, 2"},
    {"quant_group differs (128 / 64)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT, ": quant_group = 128",
     ": quant_group = 128"},
    {"max_tokens_per_rank differs (64 / 65)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT,
     ": max_tokens_per_rank = 64 on rank 0, 65", ": max_tokens_per_rank = 64 on rank 0, 65"},
    /* The comparison comes before the config checks: an invalid config on
     * one rank is a difference on every rank, not a lone early return. */
    {"an invalid config on one rank (hidden 100)", MEGAMOE_ERR_BAD_ARGUMENT, MEGAMOE_ERR_BAD_ARGUMENT,
     ": hidden = 512 on rank 0, 100", ": hidden = 512 on rank 0, 100"},
    {"NULL config on one rank", MEGAMOE_ERR_NULL_POINTER, MEGAMOE_ERR_PEER_FAILED, "config is NULL", "rank %d"},
    {"the same config on every rank (control)", MEGAMOE_OK, MEGAMOE_OK, "", ""},
};

void ft_config_apply(int i, megamoe_config* c, int* null_config) {
  *null_config = 0;
  switch (i) {
    case 0: c->hidden = 1024; break;
    case 1: c->top_k = 3; break;
    case 2: c->arm = c->arm == MEGAMOE_ARM_STAGED ? MEGAMOE_ARM_SPLIT : MEGAMOE_ARM_STAGED; break;
    case 3: c->timeout_s = 2.0; break;
    case 4: c->quant_group = 64; break;
    case 5: c->max_tokens_per_rank += 1; break;
    case 6: c->hidden = 100; break;
    case 7: *null_config = 1; break;
    default: break;
  }
}

int ft_verdicts(ft_kind kind) { return kind == FT_CONFIG ? FT_CONFIG_CASES : 1; }

/* The reasons a verdict failed, as one line. */
typedef struct reasons {
  char text[2048];
  size_t len;
  int count;
} reasons;

static void fail(reasons* r, const char* fmt, ...) {
  if (r->len < sizeof r->text) {
    r->len += (size_t)snprintf(r->text + r->len, sizeof r->text - r->len, "%s", r->count ? "; " : "");
    va_list ap;
    va_start(ap, fmt);
    if (r->len < sizeof r->text) r->len += (size_t)vsnprintf(r->text + r->len, sizeof r->text - r->len, fmt, ap);
    va_end(ap);
  }
  r->count++;
}

static const char* name_of(megamoe_status st, char* buf, size_t n) {
  const char* s = megamoe_status_string(st);
  const char* colon = strchr(s, ':');
  snprintf(buf, n, "%.*s", colon ? (int)(colon - s) : (int)strlen(s), s);
  return buf;
}

static int timeout_like(megamoe_status st) { return st == MEGAMOE_ERR_TIMEOUT || st == MEGAMOE_ERR_PEER_FAILED; }

static void verdict(const char* label, const reasons* r, const char* details, FILE* out, ft_counts* counts) {
  fprintf(out, "[%s] %s: %s\n", r->count ? "FAIL" : "PASS", label, details);
  if (r->count) fprintf(out, "    why: %s\n", r->text);
  if (r->count) counts->failed++;
  else counts->passed++;
}

/* A survivor of a kill, or any rank of a skip: its fault step, what came
 * after, and its teardown. t0: what the time to error counts from. */
static void judge_step(const ft_case* c, int rank, const ft_rank_result* x, double t0, const char* t0_name,
                       double bound_s, int want_forward, reasons* why, char* line, size_t n) {
  char st[64], later[64], later_sync[64];
  if (!x->reported) {
    fail(why, "rank %d never reported (it crashed, or hung and was ended)", rank);
    snprintf(line, n, "rank %d: no report", rank);
    return;
  }
  if (!x->setup_ok) {
    fail(why, "rank %d: setup failed: %s", rank, x->note);
    snprintf(line, n, "rank %d: setup failed", rank);
    return;
  }
  const double to_error = x->t_error - t0;
  snprintf(line, n,
           "rank %d: %s in forward %d of the step, %.3f s after %s (bound %.3f s), %.3f s after its own forward "
           "began; later forward %s / sync %s; %s %.2f s, %s %.2f s",
           rank, name_of(x->error, st, sizeof st), x->error_forward, to_error, t0_name, bound_s,
           x->t_error - x->t_start, name_of(x->later_forward, later, sizeof later),
           name_of(x->later_sync, later_sync, sizeof later_sync), c->kind == FT_SKIP ? "destroy" : "abandon",
           x->release_s, c->kind == FT_SKIP ? "comm destroy" : "comm abort", x->comm_release_s);
  if (!timeout_like(x->error))
    fail(why, "rank %d: the step gave %s, want MEGAMOE_ERR_TIMEOUT or MEGAMOE_ERR_PEER_FAILED (%s)", rank, st,
         x->message);
  if (want_forward > 0 && x->error_forward != want_forward)
    fail(why, "rank %d: the error came in forward %d of the step, want %d", rank, x->error_forward, want_forward);
  if (timeout_like(x->error) && !(to_error >= 0.0 && to_error <= bound_s))
    fail(why, "rank %d: %.3f s from %s to the error, bound %.3f s (the deadline + 10 %%)", rank, to_error, t0_name,
         bound_s);
  char victim[32];
  snprintf(victim, sizeof victim, "rank %d", c->victim);
  if (timeout_like(x->error) && rank != c->victim && !strstr(x->message, victim))
    fail(why, "rank %d: the message does not name the %s: %s", rank, victim, x->message);
  /* The configured deadline is the one in effect (the message states it). */
  char deadline[2][48];
  snprintf(deadline[0], sizeof deadline[0], "timeout_s %.1f", c->timeout_s);
  snprintf(deadline[1], sizeof deadline[1], "the deadline is %.1f s", c->timeout_s);
  if (x->error == MEGAMOE_ERR_TIMEOUT && !strstr(x->message, deadline[0]) && !strstr(x->message, deadline[1]))
    fail(why, "rank %d: the timeout message does not state the configured deadline (\"%s\"): %s", rank, deadline[0],
         x->message);
  if (x->error == MEGAMOE_ERR_TIMEOUT && !(x->later_forward == MEGAMOE_ERR_LAYER_FAILED &&
                                            x->later_sync == MEGAMOE_ERR_LAYER_FAILED))
    fail(why, "rank %d: after the timeout a forward gave %s and its sync %s, want MEGAMOE_ERR_LAYER_FAILED both", rank,
         later, later_sync);
  if (x->release != MEGAMOE_OK) fail(why, "rank %d: freeing the layer gave %s", rank, name_of(x->release, st, sizeof st));
  if (x->comm_release != MEGAMOE_OK)
    fail(why, "rank %d: freeing the communicator gave %s", rank, name_of(x->comm_release, st, sizeof st));
}

static void judge_kill(const ft_case* c, const ft_shared* sh, const ft_launch* l, double bound_factor, FILE* out,
                       ft_counts* counts) {
  reasons why;
  memset(&why, 0, sizeof why);
  const double bound = bound_factor * c->timeout_s, t_kill = (double)sh->kill_ns * 1e-9;
  const mm_ranks_report* rep = &l->report;
  if (l->rc != MM_RANKS_RANK_FAILED) fail(&why, "the launcher returned %d, want MM_RANKS_RANK_FAILED (%d)", l->rc, MM_RANKS_RANK_FAILED);
  if (rep->first_failed != c->victim) fail(&why, "the launcher named rank %d as the first to fail, want rank %d", rep->first_failed, c->victim);
  if (rep->signal[c->victim] != SIGKILL || rep->ended[c->victim])
    fail(&why, "rank %d ended by signal %d%s, want SIGKILL by its own hand", c->victim, rep->signal[c->victim],
         rep->ended[c->victim] ? " sent by the launcher" : "");
  if (sh->kill_ns == 0) fail(&why, "the victim never reached its SIGKILL");
  char details[2048];
  size_t len = (size_t)snprintf(details, sizeof details, "launcher rc %d naming rank %d (signal %d)", l->rc,
                                rep->first_failed, rep->first_failed >= 0 ? rep->signal[rep->first_failed] : 0);
  for (int r = 0; r < c->num_ranks; ++r) {
    if (r == c->victim) continue;
    char line[512];
    judge_step(c, r, &sh->rank[r], t_kill, "the kill", bound, c->kind == FT_KILL_WAITING ? 1 : 0, &why, line,
               sizeof line);
    if (rep->exit_code[r] != 0 || rep->ended[r])
      fail(&why, "rank %d: exit code %d, signal %d%s", r, rep->exit_code[r], rep->signal[r],
           rep->ended[r] ? " (ended by the launcher after the grace)" : "");
    if (len < sizeof details) len += (size_t)snprintf(details + len, sizeof details - len, "\n    %s", line);
  }
  verdict(c->label, &why, details, out, counts);
}

static void judge_skip(const ft_case* c, const ft_shared* sh, const ft_launch* l, double bound_factor, FILE* out,
                       ft_counts* counts) {
  reasons why;
  memset(&why, 0, sizeof why);
  const double bound = bound_factor * c->timeout_s;
  if (l->rc != MM_RANKS_OK) fail(&why, "the launcher returned %d, want MM_RANKS_OK (every rank lives and exits 0)", l->rc);
  char details[2048];
  size_t len = (size_t)snprintf(details, sizeof details, "launcher rc %d", l->rc);
  for (int r = 0; r < c->num_ranks; ++r) {
    char line[512];
    /* Every rank's step times out: the others in the forward the victim
     * skipped, the victim in its next one (its peers are failed by then). */
    judge_step(c, r, &sh->rank[r], sh->rank[r].t_start, "its forward began", bound, 1, &why, line, sizeof line);
    if (len < sizeof details)
      len += (size_t)snprintf(details + len, sizeof details - len, "\n    %s%s", r == c->victim ? "(skipped one) " : "",
                              line);
  }
  verdict(c->label, &why, details, out, counts);
}

static void judge_config(const ft_case* c, const ft_shared* sh, const ft_launch* l, FILE* out, ft_counts* counts) {
  for (int i = 0; i < FT_CONFIG_CASES; ++i) {
    const ft_config_case* k = &ft_config_cases[i];
    reasons why;
    memset(&why, 0, sizeof why);
    if (l->rc != MM_RANKS_OK) fail(&why, "the launcher returned %d, want MM_RANKS_OK", l->rc);
    char details[1536];
    size_t len = 0;
    details[0] = '\0';
    double slowest = 0;
    for (int r = 0; r < c->num_ranks; ++r) {
      const ft_create_result* x = &sh->create[i][r];
      const megamoe_status want = r == c->victim ? k->odd_status : k->others_status;
      char got_name[64], want_name[64], text[96];
      name_of(x->status, got_name, sizeof got_name);
      name_of(want, want_name, sizeof want_name);
      snprintf(text, sizeof text, r == c->victim ? k->odd_text : k->others_text, c->victim);
      if (!x->reported) {
        fail(&why, "rank %d never reported", r);
        continue;
      }
      if (x->seconds > slowest) slowest = x->seconds;
      if (x->status != want) fail(&why, "rank %d: %s, want %s: %s", r, got_name, want_name, x->message);
      else if (want != MEGAMOE_OK && !strstr(x->message, text))
        fail(&why, "rank %d: the message lacks \"%s\": %s", r, text, x->message);
      if (want != MEGAMOE_OK && x->layer_made) fail(&why, "rank %d: a layer was made", r);
      if (want == MEGAMOE_OK && x->forward != MEGAMOE_OK)
        fail(&why, "rank %d: a forward on the layer gave %s", r, name_of(x->forward, got_name, sizeof got_name));
      if (len < sizeof details)
        len += (size_t)snprintf(details + len, sizeof details - len, "%srank %d %s in %.3f s", r ? ", " : "", r,
                                got_name, x->seconds);
    }
    char label[192];
    snprintf(label, sizeof label, "%s: %s", c->label, k->name);
    char line[1700];
    snprintf(line, sizeof line, "%s (slowest create %.3f s)%s%s", details, slowest, why.count ? "" : "; message: ",
             why.count ? "" : sh->create[i][0].message);
    verdict(label, &why, line, out, counts);
  }
}

void ft_judge(const ft_case* c, const ft_shared* sh, const ft_launch* launch, double bound_factor, FILE* out,
              ft_counts* counts) {
  switch (c->kind) {
    case FT_KILL_INSIDE:
    case FT_KILL_WAITING: judge_kill(c, sh, launch, bound_factor, out, counts); break;
    case FT_SKIP: judge_skip(c, sh, launch, bound_factor, out, counts); break;
    case FT_CONFIG: judge_config(c, sh, launch, out, counts); break;
  }
  fflush(out);
}
