/* This process's stderr into a temporary file and back, for tests that check
 * what a library thread prints (the timeline watch). Header-only, C. */
#ifndef MEGAMOE_TEST_STDERR_CAPTURE_H
#define MEGAMOE_TEST_STDERR_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct mm_stderr_capture {
  char path[64];
  int fd, saved; /* the file, and the real stderr while captured (-1: not capturing) */
} mm_stderr_capture;

/* 0 when stderr now goes to the file; nothing is left open otherwise. */
static inline int mm_stderr_capture_begin(mm_stderr_capture* c) {
  snprintf(c->path, sizeof c->path, "/tmp/megamoe_stderr_XXXXXX");
  c->saved = -1;
  c->fd = mkstemp(c->path);
  if (c->fd < 0) return 1;
  fflush(stderr);
  c->saved = dup(2);
  if (c->saved < 0 || dup2(c->fd, 2) != 2) {
    if (c->saved >= 0) close(c->saved);
    close(c->fd);
    unlink(c->path);
    c->fd = c->saved = -1;
    return 1;
  }
  return 0;
}

/* Puts stderr back and returns what was captured (malloc'ed, NUL-terminated;
 * NULL when nothing was being captured or on failure), also copied to the
 * real stderr when echo is set, so nothing printed meanwhile is lost. */
static inline char* mm_stderr_capture_end(mm_stderr_capture* c, int echo) {
  if (c->fd < 0) return NULL;
  fflush(stderr);
  dup2(c->saved, 2);
  close(c->saved);
  char* text = NULL;
  const off_t n = lseek(c->fd, 0, SEEK_END);
  if (n >= 0 && (text = (char*)malloc((size_t)n + 1)) != NULL) {
    const ssize_t got = pread(c->fd, text, (size_t)n, 0);
    text[got > 0 ? got : 0] = '\0';
    if (echo) fputs(text, stderr);
  }
  close(c->fd);
  unlink(c->path);
  c->fd = c->saved = -1;
  return text;
}

#endif
