#include "cuda/pointer.hpp"

#include "cuda/driver.hpp"

namespace moejit::cuda {

PointerInfo query_pointer(const void* p) {
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                      CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  unsigned int type = 0;
  // The driver writes a boolean here; a zeroed 8-byte word reads true whatever width it writes.
  unsigned long long managed = 0;
  int ordinal = -1;
  CUdeviceptr range_begin = 0;
  std::size_t range_bytes = 0;
  unsigned long long legacy = 0;  // a boolean, like `managed`
  void* data[] = {&type, &managed, &ordinal, &range_begin, &range_bytes, &legacy};
  // cuPointerGetAttributes leaves an address it does not know at the defaults (type 0) and
  // succeeds; its documentation also lists these two errors for such an address.
  const CUresult r = driver().cuPointerGetAttributes(6, attributes, data, reinterpret_cast<CUdeviceptr>(p));
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_CONTEXT) return {};
  check(r, "cuPointerGetAttributes");
  PointerInfo info;
  info.device = ordinal;
  info.range_begin = static_cast<std::uintptr_t>(range_begin);
  info.range_bytes = range_bytes;
  info.range_is_allocation = legacy != 0;
  if (managed != 0) {
    info.kind = MemoryKind::kManaged;
  } else if (type == CU_MEMORYTYPE_DEVICE) {
    info.kind = MemoryKind::kDevice;
  } else if (type == CU_MEMORYTYPE_HOST) {
    info.kind = MemoryKind::kHost;
  }
  return info;
}

}  // namespace moejit::cuda
