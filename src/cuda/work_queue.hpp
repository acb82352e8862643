// Where a call's GPU work goes: each kernel launch and memset straight onto a stream, or into the
// nodes of a CUDA graph that one launch then enqueues (call_graph.hpp).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace moejit::cuda {

// One kernel launch as the driver takes it: `args` points at the kernel's parameters (the driver
// copies them when the launch is enqueued or the graph node set).
struct KernelWork {
  CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem_bytes = 0;
  unsigned cluster = 1;  // blocks per cluster along x; 1: no clusters
  void** args = nullptr;
};

// The launch configuration of a cluster launch (cuLaunchKernelEx, cuOccupancyMaxActiveClusters),
// pointing at its own cluster attribute.
struct ClusterLaunch {
  CUlaunchAttribute attr{};
  CUlaunchConfig config{};
  ClusterLaunch(const KernelWork& w, CUstream stream);
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

class WorkQueue {
 public:
  virtual void kernel(const KernelWork& work) = 0;
  // `words` 32-bit words at `dst` set to `value`.
  virtual void memset32(CUdeviceptr dst, std::uint32_t value, std::size_t words) = 0;

 protected:
  ~WorkQueue() = default;
};

// Each item enqueued on the stream as it comes. Throws CudaError.
class StreamQueue final : public WorkQueue {
 public:
  explicit StreamQueue(CUstream stream) : stream_(stream) {}
  void kernel(const KernelWork& work) override;
  void memset32(CUdeviceptr dst, std::uint32_t value, std::size_t words) override;

 private:
  CUstream stream_;
};

}  // namespace moejit::cuda
