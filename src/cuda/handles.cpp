#include "cuda/handles.hpp"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/log.hpp"
#include "cuda/driver.hpp"
#include "moejit/error.hpp"

namespace moejit::cuda {

void warn_on_failure(CUresult r, const char* what) noexcept {
  if (r == CUDA_SUCCESS) return;
  try {
    log::warn("{} failed during cleanup: {}", what, result_name(r));
  } catch (...) {
  }
}

PrimaryContext::PrimaryContext(int ordinal) {
  const Driver& d = driver();
  int count = 0;
  MOEJIT_CU(d.cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    throw NoDeviceError("GPU " + std::to_string(ordinal) + " requested but " + std::to_string(count) +
                        " visible");
  }
  MOEJIT_CU(d.cuDeviceGet(&dev_, ordinal));
  MOEJIT_CU(d.cuCtxGetCurrent(&previous_));
  MOEJIT_CU(d.cuDevicePrimaryCtxRetain(&ctx_, dev_));
  CUresult r = d.cuCtxSetCurrent(ctx_);
  if (r != CUDA_SUCCESS) {
    warn_on_failure(d.cuDevicePrimaryCtxRelease(dev_), "cuDevicePrimaryCtxRelease");
    check(r, "cuCtxSetCurrent");
  }
}

PrimaryContext::~PrimaryContext() {
  if (ctx_ == nullptr) return;
  const Driver& d = driver();
  // The same context current before stays current, as it was (its other holders keep it alive).
  if (previous_ != ctx_) warn_on_failure(d.cuCtxSetCurrent(previous_), "cuCtxSetCurrent");
  warn_on_failure(d.cuDevicePrimaryCtxRelease(dev_), "cuDevicePrimaryCtxRelease");
}

StreamOwner stream_owner(CUstream stream) {
  const Driver& d = driver();
  StreamOwner owner;
  if (d.cuStreamGetCtx_v2 != nullptr) {
    MOEJIT_CU(d.cuStreamGetCtx_v2(stream, &owner.context, &owner.green));
  } else {
    MOEJIT_CU(d.cuStreamGetCtx(stream, &owner.context));
  }
  return owner;
}

bool stream_capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  MOEJIT_CU(driver().cuStreamIsCapturing(stream, &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

int green_sm_count(CUgreenCtx green) {
  const Driver& d = driver();
  if (green == nullptr || d.cuGreenCtxGetDevResource == nullptr) return 0;
  CUdevResource resource{};
  MOEJIT_CU(d.cuGreenCtxGetDevResource(green, &resource, CU_DEV_RESOURCE_TYPE_SM));
  return static_cast<int>(resource.sm.smCount);
}

namespace {

CUcontext raw_current_context() {
  CUcontext ctx = nullptr;
  MOEJIT_CU(driver().cuCtxGetCurrent(&ctx));
  if (ctx == nullptr) {
    throw NoDeviceError("no CUDA context is current on this thread (create one, e.g. with the CUDA runtime)");
  }
  return ctx;
}

// What the legacy stream names for the current context, asked of the driver once per context
// (by its handle and id, which is never reused; a green context's handle differs from its primary
// context's whatever their ids): the legacy stream may not be asked while a blocking stream of the
// context is being captured (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and the capture is invalidated),
// and a forward on another stream checks its context meanwhile.
StreamOwner current_owner() {
  const CUcontext raw = raw_current_context();  // NoDeviceError where none is
  unsigned long long id = 0;
  MOEJIT_CU(driver().cuCtxGetId(raw, &id));
  // Never destroyed: a thread still running a plan at exit may ask.
  static std::mutex* mu = new std::mutex;
  static auto* owners = new std::map<std::pair<CUcontext, unsigned long long>, StreamOwner>;
  const std::lock_guard lock(*mu);
  const auto it = owners->find({raw, id});
  if (it != owners->end()) return it->second;
  const StreamOwner owner = stream_owner(nullptr);
  owners->emplace(std::pair{raw, id}, owner);
  return owner;
}

}  // namespace

CUcontext current_context() { return current_owner().context; }

bool green_context_current() { return current_owner().green != nullptr; }

ScopedContext::ScopedContext(CUcontext context) {
  if (raw_current_context() == context) return;
  MOEJIT_CU(driver().cuCtxPushCurrent(context));
  pushed_ = true;
}

ScopedContext::~ScopedContext() {
  CUcontext popped = nullptr;
  if (pushed_) warn_on_failure(driver().cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
}

unsigned long long current_context_id() {
  unsigned long long id = 0;
  MOEJIT_CU(driver().cuCtxGetId(current_context(), &id));
  return id;
}

Module::Module(std::string_view image) {
  // cuModuleLoadData reads a cubin whose size is in its ELF header; the string keeps the bytes.
  MOEJIT_CU(driver().cuModuleLoadData(&mod_, image.data()));
}

Module::~Module() {
  if (mod_ != nullptr) warn_on_failure(driver().cuModuleUnload(mod_), "cuModuleUnload");
}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    if (mod_ != nullptr) warn_on_failure(driver().cuModuleUnload(mod_), "cuModuleUnload");
    mod_ = std::exchange(o.mod_, nullptr);
  }
  return *this;
}

CUfunction Module::function(const char* lowered_name) const {
  CUfunction fn = nullptr;
  MOEJIT_CU(driver().cuModuleGetFunction(&fn, mod_, lowered_name));
  return fn;
}

Event::Event(unsigned flags) { MOEJIT_CU(driver().cuEventCreate(&ev_, flags)); }

Event::~Event() {
  if (ev_ != nullptr) warn_on_failure(driver().cuEventDestroy(ev_), "cuEventDestroy");
}

void Event::record(CUstream stream) const { MOEJIT_CU(driver().cuEventRecord(ev_, stream)); }

void Event::synchronize() const { MOEJIT_CU(driver().cuEventSynchronize(ev_)); }

float Event::elapsed_since(const Event& start) const {
  float ms = 0.f;
  MOEJIT_CU(driver().cuEventElapsedTime(&ms, start.ev_, ev_));
  return ms;
}

CaptureModeGuard::CaptureModeGuard(CUstreamCaptureMode mode) : previous_(mode) {
  MOEJIT_CU(driver().cuThreadExchangeStreamCaptureMode(&previous_));
}

CaptureModeGuard::~CaptureModeGuard() {
  warn_on_failure(driver().cuThreadExchangeStreamCaptureMode(&previous_), "cuThreadExchangeStreamCaptureMode");
}

Stream::Stream() { MOEJIT_CU(driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING)); }

Stream::Stream(CUcontext context) {
  const ScopedContext in(context);
  MOEJIT_CU(driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
}

Stream::~Stream() {
  if (stream_ != nullptr) warn_on_failure(driver().cuStreamDestroy(stream_), "cuStreamDestroy");
}

void Stream::synchronize() const { MOEJIT_CU(driver().cuStreamSynchronize(stream_)); }

CapturedGraph::CapturedGraph(CUstream stream, const std::function<void()>& record) {
  const Driver& d = driver();
  MOEJIT_CU(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  try {
    record();
  } catch (...) {
    CUgraph partial = nullptr;
    if (d.cuStreamEndCapture(stream, &partial) == CUDA_SUCCESS && partial != nullptr) {
      warn_on_failure(d.cuGraphDestroy(partial), "cuGraphDestroy");
    }
    throw;
  }
  MOEJIT_CU(d.cuStreamEndCapture(stream, &graph_));
  if (const CUresult r = d.cuGraphInstantiate(&exec_, graph_, 0); r != CUDA_SUCCESS) {
    warn_on_failure(d.cuGraphDestroy(graph_), "cuGraphDestroy");
    check(r, "cuGraphInstantiate");
  }
}

CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) warn_on_failure(driver().cuGraphExecDestroy(exec_), "cuGraphExecDestroy");
  if (graph_ != nullptr) warn_on_failure(driver().cuGraphDestroy(graph_), "cuGraphDestroy");
}

void CapturedGraph::launch(CUstream stream) const { MOEJIT_CU(driver().cuGraphLaunch(exec_, stream)); }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) MOEJIT_CU(driver().cuMemAlloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (ptr_ != 0) warn_on_failure(driver().cuMemFree(ptr_), "cuMemFree");
  ptr_ = 0;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) const {
  if (bytes > bytes_ || offset > bytes_ - bytes) {
    throw InternalError("DeviceBuffer::upload past the end of the buffer");
  }
  if (bytes > 0) MOEJIT_CU(driver().cuMemcpyHtoD(ptr_ + offset, host, bytes));
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  if (bytes > bytes_ || offset > bytes_ - bytes) {
    throw InternalError("DeviceBuffer::download past the end of the buffer");
  }
  if (bytes > 0) MOEJIT_CU(driver().cuMemcpyDtoH(host, ptr_ + offset, bytes));
}

void DeviceBuffer::fill_bytes(unsigned char value) const {
  if (bytes_ == 0) return;
  MOEJIT_CU(driver().cuMemsetD8Async(ptr_, value, bytes_, nullptr));
  MOEJIT_CU(driver().cuCtxSynchronize());
}

}  // namespace moejit::cuda
