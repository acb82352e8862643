#include "cuda/work_queue.hpp"

#include "cuda/driver.hpp"

namespace moejit::cuda {

ClusterLaunch::ClusterLaunch(const KernelWork& w, CUstream stream) {
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim = {w.cluster, 1, 1};
  config = CUlaunchConfig{.gridDimX = w.grid[0],
                          .gridDimY = w.grid[1],
                          .gridDimZ = w.grid[2],
                          .blockDimX = w.block[0],
                          .blockDimY = w.block[1],
                          .blockDimZ = w.block[2],
                          .sharedMemBytes = w.smem_bytes,
                          .hStream = stream,
                          .attrs = &attr,
                          .numAttrs = 1};
}

void StreamQueue::kernel(const KernelWork& w) {
  if (w.cluster <= 1) {
    MOEJIT_CU(driver().cuLaunchKernel(w.function, w.grid[0], w.grid[1], w.grid[2], w.block[0], w.block[1], w.block[2],
                                      w.smem_bytes, stream_, w.args, nullptr));
    return;
  }
  const ClusterLaunch launch(w, stream_);
  MOEJIT_CU(driver().cuLaunchKernelEx(&launch.config, w.function, w.args, nullptr));
}

void StreamQueue::memset32(CUdeviceptr dst, std::uint32_t value, std::size_t words) {
  MOEJIT_CU(driver().cuMemsetD32Async(dst, value, words, stream_));
}

}  // namespace moejit::cuda
