// A stream created with the driver's default flags: blocking, it synchronises implicitly with the
// legacy stream (as cudaStreamCreate's do), so while it is captured nothing may touch that one.
// cuda::Stream makes non-blocking streams only.
#pragma once

#include "cuda/driver.hpp"

namespace moejit::test {

class BlockingStream {
 public:
  BlockingStream() { MOEJIT_CU(cuda::driver().cuStreamCreate(&stream_, CU_STREAM_DEFAULT)); }
  ~BlockingStream() { cuda::driver().cuStreamDestroy(stream_); }
  BlockingStream(const BlockingStream&) = delete;
  BlockingStream& operator=(const BlockingStream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

}  // namespace moejit::test
