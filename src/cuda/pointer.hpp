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
  // Where the driver says (0 bytes: it did not), the memory holding the address
  // (cuMemGetAddressRange) and the address range it lies in (the RANGE pointer attributes). For
  // cuMemAlloc memory both are its allocation. In virtual memory mapped with cuMemMap (PyTorch's
  // expandable segments) the first is the one physical handle holding the address and the second
  // the whole reserved range, mapped or not: a buffer there may span handles mapped back to back.
  std::uintptr_t range_begin = 0;
  std::size_t range_bytes = 0;
  std::uintptr_t reserved_begin = 0;
  std::size_t reserved_bytes = 0;
};

// Throws CudaError only for a driver failure; an unknown address is kUnknown.
PointerInfo query_pointer(const void* p);

}  // namespace moejit::cuda
