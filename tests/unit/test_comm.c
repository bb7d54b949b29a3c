/* megamoe_comm_create without a GPU: it never changes the process
 * environment, and it refuses to make a communicator unless the caller has
 * turned NVLink multicast off (NCCL_NVLS_ENABLE=0), saying so. Both checks
 * run before NCCL is called, so no GPU is needed. */
#include "megamoe.h"
#include "unit.h"

static mm_test_result expect_refused(const char* value) {
  if (value) CHECK(setenv("NCCL_NVLS_ENABLE", value, 1) == 0);
  else CHECK(unsetenv("NCCL_NVLS_ENABLE") == 0);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t comm = NULL;
  CHECK_STATUS(megamoe_comm_create(0, 1, &id, &comm), MEGAMOE_ERR_BAD_ARGUMENT);
  CHECK_MESSAGE_HAS("NCCL_NVLS_ENABLE");
  CHECK_MESSAGE_HAS(value ? value : "unset");
  CHECK(comm == NULL);
  /* The environment is as the caller left it. */
  const char* now = getenv("NCCL_NVLS_ENABLE");
  if (value) CHECK_MSG(now && !strcmp(now, value), "NCCL_NVLS_ENABLE changed from '%s' to '%s'", value, now ? now : "(unset)");
  else CHECK_MSG(now == NULL, "NCCL_NVLS_ENABLE was set to '%s'", now);
  return MM_TEST_PASS;
}

static mm_test_result comm_env_cases(void) {
  const char* const refused[] = {NULL, "1", "2", "", "0x", "08", "0 ", "zero"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i)
    if (expect_refused(refused[i]) != MM_TEST_PASS) {
      fprintf(stderr, "    NCCL_NVLS_ENABLE=%s%s%s was not refused as it should be\n", refused[i] ? "'" : "",
              refused[i] ? refused[i] : "(unset)", refused[i] ? "'" : "");
      return MM_TEST_FAIL;
    }
  /* Argument checks come first and name the argument. */
  CHECK(setenv("NCCL_NVLS_ENABLE", "0", 1) == 0);
  ncclComm_t comm = NULL;
  CHECK_STATUS(megamoe_comm_create(0, 1, NULL, &comm), MEGAMOE_ERR_NULL_POINTER);
  CHECK_MESSAGE_HAS("unique_id");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  CHECK_STATUS(megamoe_comm_create(2, 2, &id, &comm), MEGAMOE_ERR_BAD_RANKS);
  CHECK_MESSAGE_HAS("rank");
  return MM_TEST_PASS;
}

static mm_test_result test_comm_create_needs_nvls_off_and_leaves_env_alone(void) {
  const char* before = getenv("NCCL_NVLS_ENABLE");
  char saved[64] = "";
  const int was_set = before != NULL;
  if (was_set) snprintf(saved, sizeof saved, "%s", before);
  const mm_test_result r = comm_env_cases();
  if (was_set) setenv("NCCL_NVLS_ENABLE", saved, 1);
  else unsetenv("NCCL_NVLS_ENABLE");
  return r;
}

const mm_test unit_suite_comm[] = {
    {"comm_create_needs_nvls_off_and_leaves_env_alone", test_comm_create_needs_nvls_off_and_leaves_env_alone},
    {NULL, NULL}};
