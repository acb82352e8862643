#include "cuda/pointer.hpp"

#include "cuda/driver.hpp"

namespace moejit::cuda {

PointerInfo query_pointer(const void* p) {
  const Driver& d = driver();
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,   CU_POINTER_ATTRIBUTE_MAPPED,
                                      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  unsigned int type = 0;
  // The driver writes booleans here; a zeroed 8-byte word reads true whatever width it writes.
  unsigned long long managed = 0, mapped = 0;
  int ordinal = -1;
  CUdeviceptr reserved_begin = 0;
  std::size_t reserved_bytes = 0;
  void* data[] = {&type, &managed, &ordinal, &mapped, &reserved_begin, &reserved_bytes};
  const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(p);
  // cuPointerGetAttributes leaves an address it does not know at the defaults (type 0) and
  // succeeds; its documentation also lists these two errors for such an address.
  const CUresult r = d.cuPointerGetAttributes(6, attributes, data, at);
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_CONTEXT) return {};
  check(r, "cuPointerGetAttributes");
  PointerInfo info;
  info.device = ordinal;
  if (managed != 0) {
    info.kind = MemoryKind::kManaged;
  } else if (type == CU_MEMORYTYPE_DEVICE) {
    // Reserved address space (cuMemAddressReserve) with nothing mapped there lies in a known range
    // and faults like an unknown address.
    info.kind = mapped != 0 ? MemoryKind::kDevice : MemoryKind::kUnknown;
  } else if (type == CU_MEMORYTYPE_HOST) {
    info.kind = MemoryKind::kHost;
  }
  if (info.kind == MemoryKind::kDevice || info.kind == MemoryKind::kManaged) {
    info.reserved_begin = static_cast<std::uintptr_t>(reserved_begin);
    info.reserved_bytes = reserved_bytes;
    CUdeviceptr begin = 0;
    std::size_t bytes = 0;
    if (d.cuMemGetAddressRange(&begin, &bytes, at) == CUDA_SUCCESS) {
      info.range_begin = static_cast<std::uintptr_t>(begin);
      info.range_bytes = bytes;
    }
  }
  return info;
}

}  // namespace moejit::cuda
