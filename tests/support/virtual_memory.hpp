// Device memory as allocators other than cuMemAlloc hold it, for the tests of the tensor checks
// (moe/validate.hpp): a reserved address range with physical handles mapped into it back to back,
// as PyTorch's expandable segments map theirs, managed memory, a block of the device's default
// memory pool (cudaMallocAsync), and a second context's memory and stream. The driver entry
// points they need are loaded here: the library itself never calls them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

namespace moejit::test {

class MappedHandles {
 public:
  // One granule of the device's allocation granularity per entry of `mapped`, which says whether
  // that granule gets a physical handle (false leaves a gap in the mapping).
  MappedHandles(int device, const std::vector<bool>& mapped);
  ~MappedHandles();
  MappedHandles(const MappedHandles&) = delete;
  MappedHandles& operator=(const MappedHandles&) = delete;
  char* base() const { return reinterpret_cast<char*>(base_); }
  std::size_t granularity() const { return granularity_; }
  std::size_t bytes() const { return granularity_ * handles_.size(); }

 private:
  void release() noexcept;
  CUdeviceptr base_ = 0;
  std::size_t granularity_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;  // 0 where a granule is left unmapped
};

class ManagedBuffer {
 public:
  explicit ManagedBuffer(std::size_t bytes);
  ~ManagedBuffer();
  ManagedBuffer(const ManagedBuffer&) = delete;
  ManagedBuffer& operator=(const ManagedBuffer&) = delete;
  char* get() const { return reinterpret_cast<char*>(ptr_); }

 private:
  CUdeviceptr ptr_ = 0;
};

// Freed on the stream it was allocated on, synchronously.
class PoolBuffer {
 public:
  PoolBuffer(std::size_t bytes, CUstream stream);
  ~PoolBuffer();
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  char* get() const { return reinterpret_cast<char*>(ptr_); }

 private:
  CUdeviceptr ptr_ = 0;
  CUstream stream_ = nullptr;
};

// A context of its own on `device` beside the caller's, which stays current: a buffer and a stream
// made in it. Memory of one context is not mapped in another.
class OtherContext {
 public:
  OtherContext(int device, std::size_t bytes);
  ~OtherContext();
  OtherContext(const OtherContext&) = delete;
  OtherContext& operator=(const OtherContext&) = delete;
  char* memory() const { return reinterpret_cast<char*>(memory_); }
  CUstream stream() const { return stream_; }

 private:
  void release() noexcept;
  CUcontext context_ = nullptr;
  CUdeviceptr memory_ = 0;
  CUstream stream_ = nullptr;
};

}  // namespace moejit::test
