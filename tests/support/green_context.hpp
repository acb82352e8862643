// A green context (CUDA 12.4+): a share of the device's SMs that runs work of the device's primary
// context, as PyTorch's GreenContext and FlashInfer's green_ctx make them. The driver entry points
// are loaded here: the library itself never creates one.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>

namespace moejit::test {

class GreenContext {
 public:
  // At least `sms` of `device`'s SMs (the driver rounds up to its partition size), with a stream
  // of its own. Null, with `why` set, where the driver has no green contexts. The caller's
  // context stays current.
  static std::unique_ptr<GreenContext> create(int device, unsigned sms, std::string* why);
  ~GreenContext();
  GreenContext(const GreenContext&) = delete;
  GreenContext& operator=(const GreenContext&) = delete;

  // The CUcontext standing for it (cuCtxFromGreenCtx), to make current.
  CUcontext context() const { return context_; }
  CUstream stream() const { return stream_; }
  unsigned sm_count() const { return sm_count_; }

 private:
  GreenContext() = default;
  CUgreenCtx green_ = nullptr;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  unsigned sm_count_ = 0;
};

}  // namespace moejit::test
