// check.h: the failure macros the C test programs share. A failed check
// prints the rank, the place and the library's last error, and exits 1 (a
// test program, not library code).
#ifndef GOROVOD_TEST_CHECK_H
#define GOROVOD_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "gorovod.h"

static int rank = -1, size = -1;

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, " (last error: %s)\n", gorovod_last_error());       \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

#define OK(call)                                            \
  do {                                                      \
    int rc_ = (call);                                       \
    CHECK(rc_ == GOROVOD_OK, "%s returned %d", #call, rc_); \
  } while (0)

// join_world initializes the library and sets rank and size, checking the
// size against ABI_TEST_SIZE where cprogram_test.go gives it.
static inline void join_world(void) {
  OK(gorovod_init());
  rank = gorovod_rank();
  size = gorovod_size();
  const char *expect = getenv("ABI_TEST_SIZE");
  if (expect != NULL) {
    CHECK(size == atoi(expect), "size %d, want %s", size, expect);
  }
}

#endif
