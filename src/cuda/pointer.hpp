// What the driver knows of an address. A caller's tensor in host memory, or on another GPU, would
// fault inside a kernel and take the context down with it: checked before anything is enqueued.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moejit::cuda {

enum class MemoryKind {
  kUnknown,  // no CUDA allocation, mapping or registration holds the address (plain malloc), or
             // reserved address space with nothing mapped there
  kDevice,
  kHost,     // page-locked host memory (cuMemHostAlloc, cuMemHostRegister)
  kManaged,
};

struct PointerInfo {
  MemoryKind kind = MemoryKind::kUnknown;
  int device = -1;  // the ordinal the memory was allocated on or registered with
  // The allocation holding the address, where the driver says (0 bytes: it did not). For memory
  // mapped with cuMemMap (PyTorch's expandable segments) it is the whole reserved address range,
  // mapped or not (the RANGE pointer attributes).
  std::uintptr_t range_begin = 0;
  std::size_t range_bytes = 0;
  // The CUcontext the memory was allocated or registered in; 0 where the driver names none
  // (memory mapped with cuMemMap belongs to no context).
  std::uintptr_t context = 0;
};

// Throws CudaError only for a driver failure; an unknown address is kUnknown.
PointerInfo query_pointer(const void* p);

}  // namespace moejit::cuda
