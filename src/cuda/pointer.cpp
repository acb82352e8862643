#include "cuda/pointer.hpp"

#include <iterator>

#include "cuda/driver.hpp"

namespace moejit::cuda {

PointerInfo query_pointer(const void* p) {
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,   CU_POINTER_ATTRIBUTE_MAPPED,
                                      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      CU_POINTER_ATTRIBUTE_CONTEXT};
  unsigned int type = 0;
  // The driver writes booleans here; a zeroed 8-byte word reads true whatever width it writes.
  unsigned long long managed = 0, mapped = 0;
  int ordinal = -1;
  CUdeviceptr range_begin = 0;
  std::size_t range_bytes = 0;
  CUcontext context = nullptr;
  void* data[] = {&type, &managed, &ordinal, &mapped, &range_begin, &range_bytes, &context};
  // cuPointerGetAttributes leaves an address it does not know at the defaults (type 0) and
  // succeeds; its documentation also lists these two errors for such an address.
  const CUresult r = driver().cuPointerGetAttributes(static_cast<unsigned>(std::size(attributes)), attributes, data,
                                                     reinterpret_cast<CUdeviceptr>(p));
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_CONTEXT) return {};
  check(r, "cuPointerGetAttributes");
  PointerInfo info;
  info.device = ordinal;
  info.range_begin = static_cast<std::uintptr_t>(range_begin);
  info.range_bytes = range_bytes;
  info.context = reinterpret_cast<std::uintptr_t>(context);
  if (managed != 0) {
    info.kind = MemoryKind::kManaged;
  } else if (type == CU_MEMORYTYPE_DEVICE) {
    // Reserved address space (cuMemAddressReserve) with nothing mapped there lies in a known
    // range, and faults like an unknown address.
    info.kind = mapped != 0 ? MemoryKind::kDevice : MemoryKind::kUnknown;
  } else if (type == CU_MEMORYTYPE_HOST) {
    info.kind = MemoryKind::kHost;
  }
  return info;
}

}  // namespace moejit::cuda
