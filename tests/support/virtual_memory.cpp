#include "support/virtual_memory.hpp"

#include <stdexcept>
#include <string>

#include "cuda/driver.hpp"
#include "support/driver_symbol.hpp"

namespace moejit::test {
namespace {

#define MOEJIT_TEST_VM_FUNCTIONS(X)                                                                \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) \
  X(cuMemSetAccess) X(cuMemGetAllocationGranularity) X(cuMemAllocManaged) X(cuMemAllocAsync) X(cuMemFreeAsync)   \
  X(cuCtxCreate) X(cuCtxDestroy)

struct VmDriver {
#define MOEJIT_TEST_DECLARE(name) decltype(&::name) name = nullptr;
  MOEJIT_TEST_VM_FUNCTIONS(MOEJIT_TEST_DECLARE)
#undef MOEJIT_TEST_DECLARE
};

const VmDriver& vm() {
  static const VmDriver d = [] {
    VmDriver out;
#define MOEJIT_TEST_LOAD(name)                                                                 \
  out.name = reinterpret_cast<decltype(out.name)>(driver_symbol(MOEJIT_TEST_SYMBOL(name)));    \
  if (out.name == nullptr) throw std::runtime_error(std::string("the CUDA driver lacks ") + MOEJIT_TEST_SYMBOL(name));
    MOEJIT_TEST_VM_FUNCTIONS(MOEJIT_TEST_LOAD)
#undef MOEJIT_TEST_LOAD
    return out;
  }();
  return d;
}

}  // namespace

MappedHandles::MappedHandles(int device, const std::vector<bool>& mapped) : handles_(mapped.size(), 0) {
  const VmDriver& d = vm();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  MOEJIT_CU(d.cuMemGetAllocationGranularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  MOEJIT_CU(d.cuMemAddressReserve(&base_, bytes(), 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  try {
    for (std::size_t i = 0; i < mapped.size(); ++i) {
      if (!mapped[i]) continue;
      MOEJIT_CU(d.cuMemCreate(&handles_[i], granularity_, &prop, 0));
      const CUdeviceptr at = base_ + i * granularity_;
      MOEJIT_CU(d.cuMemMap(at, granularity_, 0, handles_[i], 0));
      MOEJIT_CU(d.cuMemSetAccess(at, granularity_, &access, 1));
    }
  } catch (...) {
    release();
    throw;
  }
}

MappedHandles::~MappedHandles() { release(); }

// A handle created but never mapped fails to unmap, harmlessly.
void MappedHandles::release() noexcept {
  const VmDriver& d = vm();
  for (std::size_t i = 0; i < handles_.size(); ++i) {
    if (handles_[i] == 0) continue;
    d.cuMemUnmap(base_ + i * granularity_, granularity_);
    d.cuMemRelease(handles_[i]);
    handles_[i] = 0;
  }
  if (base_ != 0) d.cuMemAddressFree(base_, bytes());
  base_ = 0;
}

ManagedBuffer::ManagedBuffer(std::size_t bytes) {
  MOEJIT_CU(vm().cuMemAllocManaged(&ptr_, bytes, CU_MEM_ATTACH_GLOBAL));
}

ManagedBuffer::~ManagedBuffer() { cuda::driver().cuMemFree(ptr_); }

PoolBuffer::PoolBuffer(std::size_t bytes, CUstream stream) : stream_(stream) {
  MOEJIT_CU(vm().cuMemAllocAsync(&ptr_, bytes, stream));
  MOEJIT_CU(cuda::driver().cuStreamSynchronize(stream));
}

PoolBuffer::~PoolBuffer() {
  vm().cuMemFreeAsync(ptr_, stream_);
  cuda::driver().cuStreamSynchronize(stream_);
}

// cuCtxCreate makes the new context current; it is popped once its buffer and stream exist.
OtherContext::OtherContext(int device, std::size_t bytes) {
  const VmDriver& d = vm();
  CUdevice dev = 0;
  MOEJIT_CU(cuda::driver().cuDeviceGet(&dev, device));
  MOEJIT_CU(d.cuCtxCreate(&context_, nullptr, 0, dev));
  try {
    MOEJIT_CU(cuda::driver().cuMemAlloc(&memory_, bytes));
    MOEJIT_CU(cuda::driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  } catch (...) {
    release();
    throw;
  }
  CUcontext popped = nullptr;
  cuda::driver().cuCtxPopCurrent(&popped);
}

OtherContext::~OtherContext() { release(); }

// Each handle is released in its own context, made current for the purpose.
void OtherContext::release() noexcept {
  const VmDriver& d = vm();
  if (context_ == nullptr) return;
  cuda::driver().cuCtxPushCurrent(context_);
  if (stream_ != nullptr) cuda::driver().cuStreamDestroy(stream_);
  if (memory_ != 0) cuda::driver().cuMemFree(memory_);
  CUcontext popped = nullptr;
  cuda::driver().cuCtxPopCurrent(&popped);
  d.cuCtxDestroy(context_);
  context_ = nullptr;
}

}  // namespace moejit::test
