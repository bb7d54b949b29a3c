/* Hooks of the reference for its own tests; not part of the API in ref.h. */
#ifndef MEGAMOE_REF_INTERNAL_H
#define MEGAMOE_REF_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

/* The layer's exact block sums have a portable build and, on x86 CPUs with
 * AVX2 and FMA, a faster one; both give the same bits. allow = 0 forces the
 * portable build (process-wide, not thread-safe; for tests). Returns the
 * previous setting. */
int ref_set_vector_path(int allow);
/* 1 when this CPU and build can take the AVX2 path. */
int ref_vector_path_available(void);

#ifdef __cplusplus
}
#endif

#endif
