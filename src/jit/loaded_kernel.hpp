// A kernel module loaded in one context (KernelCache::load), and how its kernels are launched and
// how many of their blocks the device runs at once.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/handles.hpp"
#include "cuda/work_queue.hpp"
#include "jit/compiled_kernel.hpp"

namespace moejit::jit {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// A kernel module loaded in one context, ready to launch.
struct LoadedKernel {
  std::shared_ptr<const CompiledKernel> compiled;
  cuda::Module module;
  std::vector<CUfunction> functions;  // aligned with compiled->name_expressions
  int max_dynamic_smem = 0;           // opt-in bytes set on every function at load

  // Launches functions[index] into `queue`, in clusters of `cluster` blocks along x when above 1
  // (grid.x a multiple of it). Dynamic shared memory beyond max_dynamic_smem throws.
  void launch(std::size_t index, Dim3 grid, Dim3 block, unsigned smem_bytes, cuda::WorkQueue& queue, void** args,
              unsigned cluster = 1) const;
  // The same, straight onto `stream`.
  void launch(std::size_t index, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, void** args,
              unsigned cluster = 1) const;

  // Clusters of `cluster` blocks (1: blocks) of functions[index] at this block size and shared
  // memory that the device runs at once: a persistent grid's size. At least 1; asked of the
  // driver once per (index, smem_bytes, cluster).
  unsigned resident_clusters(std::size_t index, Dim3 block, unsigned smem_bytes, unsigned cluster) const;

 private:
  mutable std::mutex resident_mu_;
  mutable std::map<std::tuple<std::size_t, unsigned, unsigned>, unsigned> resident_;
};

}  // namespace moejit::jit
