#include "jit/loaded_kernel.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "cuda/driver.hpp"
#include "moejit/error.hpp"

namespace moejit::jit {

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
    const cuda::ClusterLaunch launch(
        cuda::KernelWork{functions[index], {cluster, 1, 1}, {block.x, block.y, block.z}, smem_bytes, cluster}, nullptr);
    MOEJIT_CU(d.cuOccupancyMaxActiveClusters(&count, functions[index], &launch.config));
  }
  return resident_[key] = static_cast<unsigned>(std::max(count, 1));
}

void LoadedKernel::launch(std::size_t index, Dim3 grid, Dim3 block, unsigned smem_bytes, cuda::WorkQueue& queue,
                          void** args, unsigned cluster) const {
  if (index >= functions.size()) throw InternalError("kernel function index out of range");
  if (static_cast<int>(smem_bytes) > max_dynamic_smem) {
    throw UnsupportedError(fmt::format("{} needs {} bytes of shared memory; the device allows {}",
                                       compiled->key.readable, smem_bytes, max_dynamic_smem));
  }
  if (cluster > 1 && grid.x % cluster != 0) {
    throw InternalError(fmt::format("{}: a grid of {} blocks is not made of clusters of {}", compiled->key.readable,
                                    grid.x, cluster));
  }
  queue.kernel(cuda::KernelWork{functions[index],
                                {grid.x, grid.y, grid.z},
                                {block.x, block.y, block.z},
                                smem_bytes,
                                std::max(cluster, 1u),
                                args});
}

void LoadedKernel::launch(std::size_t index, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, void** args,
                          unsigned cluster) const {
  cuda::StreamQueue queue(stream);
  launch(index, grid, block, smem_bytes, queue, args, cluster);
}

}  // namespace moejit::jit
