// The C ABI without a GPU: argument errors come back as status codes with a message naming the
// argument, never as exceptions or aborts.
#include <catch2/catch.hpp>

#include <string>

#include "moejit/moejit.h"
#include "moejit/version.hpp"

extern "C" const char* moejit_c_abi_version_from_c(void);

TEST_CASE("the C header compiles as C and reports the version", "[capi]") {
  CHECK(std::string(moejit_c_abi_version_from_c()) == moejit::kLibraryVersion);
}

TEST_CASE("C ABI argument errors are status codes with messages", "[capi]") {
  moejit_plan* plan = reinterpret_cast<moejit_plan*>(0x1);
  CHECK(moejit_plan_create(nullptr, &plan) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("problem"));

  moejit_problem p{64, 8, 128, 64, 9, MOEJIT_DTYPE_BF16, MOEJIT_MODE_TRAINING, 0};
  CHECK(moejit_plan_create(&p, &plan) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("topk"));
  CHECK(plan == nullptr);

  p.topk = 2;
  p.dtype = 5;
  CHECK(moejit_plan_create(&p, &plan) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("dtype"));

  CHECK(moejit_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0, nullptr) ==
        MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("plan"));
  moejit_memory_plan m;
  CHECK(moejit_plan_memory(nullptr, &m) == MOEJIT_ERROR_INVALID_ARGUMENT);
  moejit_plan_destroy(nullptr);

  CHECK(std::string(moejit_status_name(MOEJIT_ERROR_NO_DEVICE)) == "no_device");
  CHECK(std::string(moejit_status_name(MOEJIT_OK)) == "ok");
}

TEST_CASE("a valid problem without a usable context fails cleanly", "[capi]") {
  // No context is current on this thread (and on a CPU machine there is no driver at all).
  moejit_problem p{64, 8, 128, 64, 2, MOEJIT_DTYPE_BF16, MOEJIT_MODE_TRAINING, 0};
  moejit_plan* plan = nullptr;
  const moejit_status s = moejit_plan_create(&p, &plan);
  CHECK(s == MOEJIT_ERROR_NO_DEVICE);
  CHECK(plan == nullptr);
  CHECK(std::string(moejit_last_error()).size() > 10);
  CHECK(moejit_plan_memory(plan, nullptr) == MOEJIT_ERROR_INVALID_ARGUMENT);
}
