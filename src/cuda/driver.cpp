#include "cuda/driver.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include "core/env.hpp"
#include "moejit/error.hpp"

namespace moejit::cuda {
namespace {

struct LoadResult {
  Driver driver;
  std::string error;  // empty when loaded
};

// Two-level stringizing expands cuda.h's versioning macros first: MOEJIT_SYMBOL(cuMemAlloc) is
// "cuMemAlloc_v2", the exact function cuda.h declares. cuGetProcAddress is not used because it
// maps a base name to the newest variant for the requested CUDA version, whose signature can
// differ from the header's (CUDA 13 returns cuCtxGetDevice_v2(CUdevice*, CUcontext) for
// "cuCtxGetDevice").
#define MOEJIT_SYMBOL_TEXT(name) #name
#define MOEJIT_SYMBOL(name) MOEJIT_SYMBOL_TEXT(name)

LoadResult load() {
  LoadResult r;
  const std::string lib = env::cuda_driver_library();
  void* handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    r.error = fmt::format("no CUDA driver: cannot load {} ({})", lib, why ? why : "unknown reason");
    return r;
  }
  std::string missing;
#define MOEJIT_LOAD_FN(name)                                                                   \
  r.driver.name = reinterpret_cast<decltype(r.driver.name)>(::dlsym(handle, MOEJIT_SYMBOL(name))); \
  if (r.driver.name == nullptr) missing += std::string(missing.empty() ? "" : ", ") + MOEJIT_SYMBOL(name);
  MOEJIT_DRIVER_FUNCTIONS(MOEJIT_LOAD_FN)
#undef MOEJIT_LOAD_FN
#define MOEJIT_LOAD_OPTIONAL_FN(name) \
  r.driver.name = reinterpret_cast<decltype(r.driver.name)>(::dlsym(handle, MOEJIT_SYMBOL(name)));
  MOEJIT_DRIVER_OPTIONAL_FUNCTIONS(MOEJIT_LOAD_OPTIONAL_FN)
#undef MOEJIT_LOAD_OPTIONAL_FN
  if (!missing.empty()) {
    r.error = fmt::format("CUDA driver {} lacks {}", lib, missing);
    return r;
  }
  int version = 0;
  if (r.driver.cuDriverGetVersion(&version) != CUDA_SUCCESS || version < 12000) {
    r.error = fmt::format("CUDA driver {} reports version {}; moejit needs 12000 or newer", lib, version);
    return r;
  }
  r.driver.version = version;
  CUresult init = r.driver.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    r.driver.cuGetErrorName(init, &name);
    r.error = fmt::format("no usable GPU: cuInit failed with {}", name ? name : "an unknown error");
    return r;
  }
  // The handle is deliberately never closed: function pointers stay valid for the process.
  return r;
}

const LoadResult& loaded() {
  // Never destroyed: a thread still launching or building a plan while the process exits calls
  // driver().
  static const auto* result = new LoadResult(load());
  return *result;
}

}  // namespace

const Driver& driver() {
  const LoadResult& r = loaded();
  if (!r.error.empty()) throw NoDeviceError(r.error);
  return r.driver;
}

bool device_available(std::string* why) noexcept {
  try {
    const Driver& d = driver();
    int count = 0;
    CUresult res = d.cuDeviceGetCount(&count);
    if (res != CUDA_SUCCESS || count == 0) {
      if (why) *why = "the CUDA driver loaded but reports no GPU";
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::string result_name(CUresult result) {
  const LoadResult& r = loaded();
  const char* name = nullptr;
  if (r.error.empty() && r.driver.cuGetErrorName(result, &name) == CUDA_SUCCESS && name) return name;
  return fmt::format("CUresult({})", static_cast<int>(result));
}

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const LoadResult& r = loaded();
  const char* desc = nullptr;
  if (r.error.empty()) r.driver.cuGetErrorString(result, &desc);
  std::string name = result_name(result);
  std::string message = fmt::format("{} failed: {} ({})", what, name, desc ? desc : "no description");
  if (result == CUDA_ERROR_OUT_OF_MEMORY) throw OutOfMemoryError(static_cast<int>(result), name, message);
  throw CudaError(static_cast<int>(result), name, message);
}

}  // namespace moejit::cuda
