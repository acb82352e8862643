#include "jit/loaded_kernel.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "cuda/driver.hpp"
#include "moejit/error.hpp"

namespace moejit::jit {
namespace {

// A launch in clusters of `cluster` blocks along x (the config points at its own attribute).
struct ClusterLaunch {
  CUlaunchAttribute attr{};
  CUlaunchConfig config{};

  ClusterLaunch(Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, unsigned cluster) {
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim = {cluster, 1, 1};
    config = CUlaunchConfig{.gridDimX = grid.x,
                            .gridDimY = grid.y,
                            .gridDimZ = grid.z,
                            .blockDimX = block.x,
                            .blockDimY = block.y,
                            .blockDimZ = block.z,
                            .sharedMemBytes = smem_bytes,
                            .hStream = stream,
                            .attrs = &attr,
                            .numAttrs = 1};
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace

unsigned LoadedKernel::resident_clusters(std::size_t index, Dim3 block, unsigned smem_bytes, unsigned cluster) const {
  if (index >= functions.size()) throw InternalError("kernel function index out of range");
  const std::lock_guard<std::mutex> lock(resident_mu_);
  const auto key = std::make_tuple(index, smem_bytes, cluster);
  if (const auto it = resident_.find(key); it != resident_.end()) return it->second;
  const cuda::Driver& d = cuda::driver();
  int count = 0;
  if (cluster <= 1) {
    int per_sm = 0, sms = 0;
    CUdevice dev = 0;
    MOEJIT_CU(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, functions[index],
                                                            static_cast<int>(block.x * block.y * block.z), smem_bytes));
    MOEJIT_CU(d.cuCtxGetDevice(&dev));
    MOEJIT_CU(d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    count = per_sm * sms;
  } else {
    // Asked of the whole device even where a green context is current, which would answer for
    // its share of the SMs: the count is kept for every later launch, in any context.
    const cuda::ScopedContext whole_device(cuda::current_context());
    ClusterLaunch launch(Dim3{cluster, 1, 1}, block, smem_bytes, nullptr, cluster);
    MOEJIT_CU(d.cuOccupancyMaxActiveClusters(&count, functions[index], &launch.config));
  }
  return resident_[key] = static_cast<unsigned>(std::max(count, 1));
}

void LoadedKernel::launch(std::size_t index, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream,
                          void** args, unsigned cluster) const {
  if (index >= functions.size()) throw InternalError("kernel function index out of range");
  if (static_cast<int>(smem_bytes) > max_dynamic_smem) {
    throw UnsupportedError(fmt::format("{} needs {} bytes of shared memory; the device allows {}",
                                       compiled->key.readable, smem_bytes, max_dynamic_smem));
  }
  if (cluster <= 1) {
    MOEJIT_CU(cuda::driver().cuLaunchKernel(functions[index], grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                            smem_bytes, stream, args, nullptr));
    return;
  }
  if (grid.x % cluster != 0) {
    throw InternalError(fmt::format("{}: a grid of {} blocks is not made of clusters of {}", compiled->key.readable,
                                    grid.x, cluster));
  }
  ClusterLaunch launch(grid, block, smem_bytes, stream, cluster);
  MOEJIT_CU(cuda::driver().cuLaunchKernelEx(&launch.config, functions[index], args, nullptr));
}

}  // namespace moejit::jit
