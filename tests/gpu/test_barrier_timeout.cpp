// A pipeline barrier that never completes (a stage whose copies bring fewer bytes than expected,
// twice the cause of a hung GPU round) ends its launch with an error instead of hanging the
// process: the producer's timed wait, mbarrier_wait_or_trap in templates/common/pipeline_sm90.cuh.
// The trap leaves the context unusable, so the stuck kernel runs in a child process: this binary,
// on a hidden case.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>

#include "jit/nvrtc.hpp"
#include "moejit/error.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"

using namespace moejit;
using namespace moejit::test;

namespace {

constexpr const char* kChildCase = "a kernel waiting on a barrier nobody completes (child of the timeout test)";

// One arrival of the two the barrier expects: the wait can only end by the timeout.
const char* kStuckSource = R"(#include "common/pipeline_sm90.cuh"
__global__ void stuck_kernel(unsigned int* after_wait) {
  __shared__ moejit::uint64 bar;
  if (threadIdx.x == 0) {
    moejit::mbarrier_init(&bar, 2);
    moejit::mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) moejit::mbarrier_arrive(&bar);
  moejit::mbarrier_wait_or_trap(&bar, 0);
  *after_wait = 1;
}
)";

}  // namespace

TEST_CASE(kChildCase, "[.][child]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const jit::GeneratedUnit unit{"stuck.cu", kStuckSource, {"stuck_kernel"}};
  const jit::NvrtcOutput out = jit::nvrtc_compile(unit, jit::nvrtc_options(gpu->info.arch()));
  const cuda::Module module(out.cubin);
  const CUfunction f = module.function(out.lowered_names.at(0).c_str());
  const cuda::DeviceBuffer after_wait(sizeof(unsigned));
  after_wait.fill_bytes(0);
  CUdeviceptr arg = after_wait.get();
  void* args[] = {&arg};
  const cuda::Stream stream;
  MOEJIT_CU(cuda::driver().cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, stream.get(), args, nullptr));
  try {
    stream.synchronize();
    FAIL("the stuck kernel completed");
  } catch (const CudaError& e) {
    WARN("launch failed as it should: " << e.result_name() << ": " << e.what());
  }
}

TEST_CASE("a pipeline barrier that never completes fails the launch instead of hanging", "[gpu][pipeline]") {
  MOEJIT_REQUIRE_HOPPER(gpu, "the mbarrier pipelines are sm_90 code");
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  const auto t0 = std::chrono::steady_clock::now();
  // `timeout` guards this process should the watchdog fail: the case then fails, after 60 s.
  const ProcessResult r = run_command("timeout 60 " + self + " \"" + kChildCase + "\"");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code == 0);  // the child's case passes: its synchronize threw CudaError
  CHECK(r.output.find("launch failed as it should") != std::string::npos);
  CHECK(seconds < 40);
}
