// The C ABI without a GPU: argument errors come back as status codes with a message naming the
// argument, never as exceptions or aborts.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>

#include "capi/guarded.hpp"
#include "core/env.hpp"
#include "cuda/driver.hpp"
#include "moejit/error.hpp"
#include "moejit/moejit.h"
#include "moejit/version.hpp"
#include "support/temp_dir.hpp"

extern "C" const char* moejit_c_abi_version_from_c(void);
extern "C" int moejit_c_abi_out_of_memory_from_c(void);
extern "C" int moejit_c_abi_set_option_from_c(const char* name, const char* value);

TEST_CASE("the C header compiles as C and reports the version", "[capi]") {
  CHECK(std::string(moejit_c_abi_version_from_c()) == moejit::kLibraryVersion);
}

TEST_CASE("C ABI argument errors are status codes with messages", "[capi]") {
  moejit_plan* plan = reinterpret_cast<moejit_plan*>(0x1);
  CHECK(moejit_plan_create(nullptr, &plan) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("problem"));
  CHECK(plan == nullptr);  // a caller may destroy *out whatever the status

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
  CHECK(moejit_plan_adopt_saved(nullptr, &m) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("plan"));
  moejit_plan_destroy(nullptr);

  CHECK(std::string(moejit_status_name(MOEJIT_ERROR_NO_DEVICE)) == "no_device");
  CHECK(std::string(moejit_status_name(MOEJIT_OK)) == "ok");
}

TEST_CASE("C ABI options: set, unset and clear without touching the environment; errors name the options",
          "[capi][options]") {
  moejit::test::ScopedEnv db("MOEJIT_DB", "/env.sqlite"), xdg("XDG_CACHE_HOME", "/x");
  // Drops the case's settings however it ends: later cases read the environment.
  struct Cleared {
    ~Cleared() {
      for (const char* name : {"DB", "LOG", "AUTOTUNE"}) moejit_clear_option(name);
    }
  } cleared;
  REQUIRE(moejit_set_option("MOEJIT_DB", "/set.sqlite") == MOEJIT_OK);
  CHECK(moejit::env::user_db_path() == std::filesystem::path("/set.sqlite"));
  CHECK(std::string(std::getenv("MOEJIT_DB")) == "/env.sqlite");
  REQUIRE(moejit_set_option("DB", nullptr) == MOEJIT_OK);  // unset: the default
  CHECK(moejit::env::user_db_path() == std::filesystem::path("/x/moejit/tuning.sqlite"));
  REQUIRE(moejit_clear_option("DB") == MOEJIT_OK);
  CHECK(moejit::env::user_db_path() == std::filesystem::path("/env.sqlite"));
  CHECK(std::string(moejit_last_error()).empty());
  CHECK(moejit_c_abi_set_option_from_c("MOEJIT_LOG", "info") == MOEJIT_OK);

  CHECK(moejit_set_option("LIBRARY", "/lib.so") == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("name") && Catch::Contains("'LIBRARY'") &&
                                      Catch::Contains("MOEJIT_AUTOTUNE"));
  CHECK(moejit_clear_option("MOEJIT_CLI") == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(moejit_set_option(nullptr, "1") == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("name"));
  CHECK(moejit_clear_option(nullptr) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(moejit_set_option("AUTOTUNE", "off") == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("MOEJIT_AUTOTUNE"));
  CHECK(moejit_clear_option("AUTOTUNE") == MOEJIT_OK);
}

TEST_CASE("a valid problem without a usable context fails cleanly", "[capi]") {
  // No context is current on this thread (and on a CPU machine there is no driver at all).
  moejit_problem p{64, 8, 128, 64, 2, MOEJIT_DTYPE_BF16, MOEJIT_MODE_TRAINING, 0};
  moejit_plan* plan = nullptr;
  const moejit_status s = moejit_plan_create(&p, &plan);
  CHECK(s == MOEJIT_ERROR_NO_DEVICE);
  CHECK(plan == nullptr);
  plan = reinterpret_cast<moejit_plan*>(0x1);
  CHECK(moejit_plan_create_on_stream(&p, nullptr, &plan) == MOEJIT_ERROR_NO_DEVICE);
  CHECK(plan == nullptr);
  CHECK(std::string(moejit_last_error()).size() > 10);
  CHECK(moejit_plan_memory(plan, nullptr) == MOEJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("problem memory is known on the host and matches the layout a plan uses", "[capi]") {
  // Every region of the layout is rounded up to 256 bytes. T=64 K=2: 128 pairs, 16 per expert;
  // a tile must cover the mean plus two spreads (bm - 16)^2 >= 4 * 16, so 32-row token tiles
  // (token_block_m) and at most 128/32 + min(E, 128) = 12 tiles. Routing: seven int arrays of at
  // most 64 ints, 256 bytes each ((E+1) x 1 chunk counts, E+1 counts, E+2 offsets, E+1 tile
  // offsets, 2 x 12 tile entries, 4E ranked experts), plus two arrays of 128 ints (sorted pairs,
  // pair rows); then pre_act [128, 2*64] bf16, and the state's 256-byte stamp.
  moejit_problem p{64, 8, 128, 64, 2, MOEJIT_DTYPE_BF16, MOEJIT_MODE_TRAINING, 0};
  moejit_memory_plan train{};
  REQUIRE(moejit_problem_memory(&p, &train) == MOEJIT_OK);
  CHECK(train.saved_bytes == 7 * 256 + 2 * 512 + 128 * 128 * 2 + 256);
  // 12 tile entries fill a fifth of their 256 bytes, so the figure above cannot see a wrong tile
  // count. T=4000 K=2: 8000 pairs, 1000 per expert, so 128-row tiles and 8000/128 + 8 = 62 + 8 =
  // 70 tiles: 280 bytes, two 256-byte blocks a tile table (64-row tiles would give 133 tiles and
  // three blocks, no E term 62 tiles and one). ceil(8000/512) = 16 chunks: 9 x 16 = 144 chunk
  // counts, 576 bytes, three blocks; the counts, offsets, tile offsets and 32 ranked experts one
  // block each; 8000 sorted pairs and 8000 pair rows 32000 bytes each; pre_act [8000, 128] bf16;
  // the stamp.
  moejit_problem large{4000, 8, 128, 64, 2, MOEJIT_DTYPE_BF16, MOEJIT_MODE_TRAINING, 0};
  moejit_memory_plan large_train{};
  REQUIRE(moejit_problem_memory(&large, &large_train) == MOEJIT_OK);
  CHECK(large_train.saved_bytes == 3 * 256 + 4 * 256 + 2 * 2 * 256 + 2 * 32000 + 8000 * 128 * 2 + 256);
  CHECK(train.forward_workspace_bytes == 128 * 64 * 2 + 128 * 128 * 2);
  // ds_acc (I = 64: one fp32 slot a pair), dx_rows and d_pre_act; the weighted activation
  // [128, 64] lives in dW1's buffer.
  CHECK(train.backward_workspace_bytes == 512 + 2 * 128 * 128 * 2);

  p.mode = MOEJIT_MODE_MEMORY_EFFICIENT;
  moejit_memory_plan memeff{};
  REQUIRE(moejit_problem_memory(&p, &memeff) == MOEJIT_OK);
  CHECK(memeff.saved_bytes == train.saved_bytes);
  CHECK(memeff.backward_workspace_bytes < train.backward_workspace_bytes);

  p.mode = MOEJIT_MODE_INFERENCE;
  moejit_memory_plan infer{};
  REQUIRE(moejit_problem_memory(&p, &infer) == MOEJIT_OK);
  CHECK(infer.saved_bytes == 0);
  CHECK(infer.backward_workspace_bytes == 0);
  CHECK(infer.forward_workspace_bytes == train.forward_workspace_bytes + 7 * 256 + 2 * 512);

  p.topk = 9;
  CHECK(moejit_problem_memory(&p, &infer) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("topk"));
  CHECK(moejit_problem_memory(nullptr, &infer) == MOEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(moejit_problem_memory(&p, nullptr) == MOEJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("out of memory has a status of its own, appended to the enum", "[capi]") {
  CHECK(MOEJIT_ERROR_INTERNAL == 9);  // the values before it are unchanged
  CHECK(MOEJIT_ERROR_OUT_OF_MEMORY == 10);
  CHECK(moejit_c_abi_out_of_memory_from_c() == 10);
  CHECK(std::string(moejit_status_name(MOEJIT_ERROR_OUT_OF_MEMORY)) == "out_of_memory");
  CHECK(std::string(moejit_status_name(static_cast<moejit_status>(11))) == "unknown");
}

TEST_CASE("host memory running out in a C call is MOEJIT_ERROR_OUT_OF_MEMORY", "[capi]") {
  CHECK(moejit::capi::guarded([] { throw std::bad_alloc(); }) == MOEJIT_ERROR_OUT_OF_MEMORY);
  CHECK(std::string(moejit_last_error()) == "out of host memory");
  CHECK(moejit::capi::guarded([] {}) == MOEJIT_OK);
  CHECK(std::string(moejit_last_error()).empty());
}

TEST_CASE("a driver's CUDA_ERROR_OUT_OF_MEMORY is an OutOfMemoryError and MOEJIT_ERROR_OUT_OF_MEMORY", "[capi]") {
  // cuda::check is what every driver call goes through (MOEJIT_CU). Without a driver the result's
  // name is its number, with one CUDA_ERROR_OUT_OF_MEMORY.
  const std::string name = moejit::cuda::result_name(CUDA_ERROR_OUT_OF_MEMORY);
  try {
    moejit::cuda::check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(&p, bytes)");
    FAIL("check did not throw");
  } catch (const moejit::OutOfMemoryError& e) {
    CHECK(e.code() == moejit::ErrorCode::kOutOfMemory);
    CHECK(e.result() == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(e.result_name() == name);
    CHECK_THAT(e.what(), Catch::StartsWith("cuMemAlloc(&p, bytes) failed: " + name));
  }
  // Handlers of any driver failure still catch it.
  CHECK_THROWS_AS(moejit::cuda::check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc"), moejit::CudaError);

  CHECK(moejit::capi::guarded([] { moejit::cuda::check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(&p, bytes)"); }) ==
        MOEJIT_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(moejit_last_error(), Catch::StartsWith("cuMemAlloc(&p, bytes) failed: " + name));
  // Every other driver failure stays MOEJIT_ERROR_CUDA.
  CHECK(moejit::capi::guarded([] { moejit::cuda::check(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async"); }) ==
        MOEJIT_ERROR_CUDA);
  CHECK_THROWS_MATCHES(moejit::cuda::check(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async"), moejit::CudaError,
                       Catch::Predicate<moejit::CudaError>(
                           [](const moejit::CudaError& e) { return e.code() == moejit::ErrorCode::kCuda; }));
}
