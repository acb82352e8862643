// The CUDA driver, loaded lazily on first GPU use with dlopen + dlsym and never linked, so
// moejit loads (and forks) on machines without a driver and never initialises CUDA at load
// time. cuda.h is used for types only.
#pragma once

#include <cuda.h>

#include <string>

namespace moejit::cuda {

// Every driver entry point moejit calls. Names pass through cuda.h's versioning macros
// (cuMemAlloc -> cuMemAlloc_v2) both here and at call sites, so types always match.
#define MOEJIT_DRIVER_FUNCTIONS(X)                                                         \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                    \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute)             \
  X(cuDeviceTotalMem) X(cuDeviceGetUuid) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuCtxGetId) \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent)                                                    \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                              \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)          \
  X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoDAsync)          \
  X(cuMemcpyDtoHAsync)                                                                      \
  X(cuMemsetD8Async) X(cuMemsetD32Async)                                                    \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamIsCapturing)        \
  X(cuStreamGetCtx)                                                                         \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuThreadExchangeStreamCaptureMode)         \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)            \
  X(cuGraphCreate) X(cuGraphAddKernelNode) X(cuGraphAddMemsetNode) X(cuGraphKernelNodeSetAttribute) \
  X(cuGraphExecKernelNodeSetParams) X(cuGraphExecMemsetNodeSetParams)                       \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)                 \
  X(cuEventElapsedTime) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                      \
  X(cuOccupancyMaxActiveClusters)                                                           \
  X(cuTensorMapEncodeTiled) X(cuPointerGetAttributes)

// Entry points of newer drivers than the oldest moejit runs on: null where the driver lacks them.
// cuStreamGetCtx_v2 (12.5) names the primary context behind a green context;
// cuGreenCtxGetDevResource (12.4) the SMs a green context holds.
#define MOEJIT_DRIVER_OPTIONAL_FUNCTIONS(X) X(cuStreamGetCtx_v2) X(cuGreenCtxGetDevResource)

struct Driver {
#define MOEJIT_DECLARE_FN(name) decltype(&::name) name = nullptr;
  MOEJIT_DRIVER_FUNCTIONS(MOEJIT_DECLARE_FN)
  MOEJIT_DRIVER_OPTIONAL_FUNCTIONS(MOEJIT_DECLARE_FN)
#undef MOEJIT_DECLARE_FN
  int version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The loaded driver, after cuInit. Throws NoDeviceError (with the reason) when the library
// cannot be loaded or initialised; later calls rethrow the same reason without retrying.
const Driver& driver();

// True when a driver loads and reports at least one device; `why` gets the reason otherwise.
// Never throws.
bool device_available(std::string* why = nullptr) noexcept;

// "CUDA_ERROR_OUT_OF_MEMORY" for a result code; the numeric code where no driver loads.
std::string result_name(CUresult result);

// Throws CudaError naming the call, the result and its description when result != CUDA_SUCCESS;
// OutOfMemoryError (a CudaError) for CUDA_ERROR_OUT_OF_MEMORY.
void check(CUresult result, const char* what);

}  // namespace moejit::cuda

#define MOEJIT_CU(call) ::moejit::cuda::check((call), #call)
