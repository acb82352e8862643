// RAII owners of driver objects. Destructors never throw: a failing release is logged.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>
#include <string_view>
#include <utility>

namespace moejit::cuda {

// A release that failed (in a destructor: never thrown), said at the warn level.
void warn_on_failure(CUresult r, const char* what) noexcept;

// Retains a device's primary context and makes it current on this thread (the context the
// CUDA runtime and PyTorch use); on destruction releases it and makes current again what was
// current before, so no released context stays current on the thread.
class PrimaryContext {
 public:
  explicit PrimaryContext(int ordinal = 0);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  CUcontext get() const { return ctx_; }
  CUdevice device() const { return dev_; }

 private:
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUcontext previous_ = nullptr;
};

// The context current on this thread; throws NoDeviceError when there is none. Where a green
// context is current (cuCtxFromGreenCtx), its device's primary context: a green context shares
// that context's memory and modules and only runs kernels on fewer SMs. Asks the legacy stream
// once per context, which a capture of a blocking stream forbids: the first call in a context
// must come before such a capture (a plan's construction, usually; a green context made current
// after the plan was built asks at its first forward or backward).
CUcontext current_context();

// The contexts `stream` enqueues in: `context` as current_context() names it (for a green
// context's stream, its device's primary context), and `green`, the green context it runs on
// (null for any other stream, and where the driver predates cuStreamGetCtx_v2). The null stream
// stands for the current context.
struct StreamOwner {
  CUcontext context = nullptr;
  CUgreenCtx green = nullptr;
};
StreamOwner stream_owner(CUstream stream);

// Whether work enqueued on `stream` now joins a graph capture (its own, or one it was joined to).
// Throws CudaError.
bool stream_capturing(CUstream stream);

// The SMs a green context holds (its share of the device); 0 where the driver cannot tell.
int green_sm_count(CUgreenCtx green);

// Whether the current context stands for a green context (never, where the driver predates
// cuStreamGetCtx_v2).
bool green_context_current();

// Makes `context` current on this thread for its lifetime, where another context is (pushed,
// then popped).
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
};

// Sets this thread's stream-capture mode for its lifetime, then restores the one before. A plan
// is built under the relaxed mode, as PyTorch's allocator allocates: while another thread
// captures a graph in the global mode, this thread's allocations, module loads and
// synchronisations would otherwise fail and invalidate that capture.
class CaptureModeGuard {
 public:
  explicit CaptureModeGuard(CUstreamCaptureMode mode);
  ~CaptureModeGuard();
  CaptureModeGuard(const CaptureModeGuard&) = delete;
  CaptureModeGuard& operator=(const CaptureModeGuard&) = delete;

 private:
  CUstreamCaptureMode previous_;
};

// A process-unique id of the current context (current_context()). Unlike the CUcontext pointer it is never reused
// when a context is destroyed and another created (e.g. a primary context released and retained
// again), so it can key per-context state such as loaded modules.
unsigned long long current_context_id();

class Module {
 public:
  Module() = default;
  // Loads a cubin into the current context. Throws CudaError.
  explicit Module(std::string_view image);
  ~Module();
  Module(Module&& o) noexcept : mod_(std::exchange(o.mod_, nullptr)) {}
  Module& operator=(Module&& o) noexcept;
  CUfunction function(const char* lowered_name) const;
  CUmodule get() const { return mod_; }

 private:
  CUmodule mod_ = nullptr;
};

class Event {
 public:
  explicit Event(unsigned flags = CU_EVENT_DEFAULT);
  ~Event();
  Event(Event&& o) noexcept : ev_(std::exchange(o.ev_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  void record(CUstream stream) const;
  void synchronize() const;
  // Milliseconds from `start` to this event.
  float elapsed_since(const Event& start) const;
  CUevent get() const { return ev_; }

 private:
  CUevent ev_ = nullptr;
};

class Stream {
 public:
  // A non-blocking stream of the current context.
  Stream();
  // A non-blocking stream of `context`, made current only to create it: of a device's primary
  // context (current_context()), the stream runs on all its SMs even where a green context is current.
  explicit Stream(CUcontext context);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }
  void synchronize() const;

 private:
  CUstream stream_ = nullptr;
};

// What `record` enqueues on a stream, captured into a graph and instantiated; both are
// destroyed with it. Global capture mode, the strictest (a framework's capture may use it): no
// thread may make a call that is unsafe during a capture meanwhile. The capture ends even when
// `record` throws, so the stream is left usable.
class CapturedGraph {
 public:
  CapturedGraph(CUstream stream, const std::function<void()>& record);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  // Enqueues one replay on `stream`.
  void launch(CUstream stream) const;

 private:
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

// Device memory owned by one allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  CUdeviceptr get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(ptr_);
  }
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0) const;
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  // Fills every byte with `value` (synchronously), e.g. to poison outputs before a test.
  void fill_bytes(unsigned char value) const;

 private:
  void release() noexcept;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace moejit::cuda
