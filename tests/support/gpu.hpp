// GPU test support: skip with a printed reason when there is no device, and a primary
// context for the test's thread.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"

namespace moejit::test {

// The device and its context, or null (after printing why) when no GPU is usable.
struct Gpu {
  cuda::PrimaryContext context;
  cuda::DeviceInfo info;
  Gpu() : context(0), info(cuda::query_device(0)) {}
};

inline std::unique_ptr<Gpu> gpu_or_skip() {
  std::string why;
  if (!cuda::device_available(&why)) {
    WARN("SKIPPED (no GPU): " << why);
    return nullptr;
  }
  return std::make_unique<Gpu>();
}

}  // namespace moejit::test

// First statement of every [gpu] test case.
#define MOEJIT_REQUIRE_GPU(var)              \
  auto var = ::moejit::test::gpu_or_skip(); \
  if (!var) return

// First statement of a [gpu] test case whose kernels exist only on sm_90 (wgmma, TMA, mbarrier
// pipelines): as MOEJIT_REQUIRE_GPU, and on any other card the case skips, printing `why`.
#define MOEJIT_REQUIRE_HOPPER(var, why) \
  MOEJIT_REQUIRE_GPU(var);              \
  if (!var->info.is_hopper()) {         \
    WARN("skipped: " why);              \
    return;                             \
  }                                     \
  static_assert(true)
