#include "cuda/driver.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "core/env.hpp"
#include "moejit/error.hpp"

namespace moejit::cuda {
namespace {

struct LoadResult {
  Driver driver;
  std::string error;  // empty when loaded
};

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

LoadResult load() {
  LoadResult r;
  const std::string lib = env::cuda_driver_library();
  void* handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    r.error = fmt::format("no CUDA driver: cannot load {} ({})", lib, why ? why : "unknown reason");
    return r;
  }
  auto get_proc = reinterpret_cast<GetProcAddressFn>(::dlsym(handle, "cuGetProcAddress_v2"));
  auto get_version = reinterpret_cast<decltype(&::cuDriverGetVersion)>(::dlsym(handle, "cuDriverGetVersion"));
  if (get_proc == nullptr || get_version == nullptr) {
    r.error = fmt::format("CUDA driver {} is too old: moejit needs a CUDA 12 or newer driver", lib);
    return r;
  }
  int version = 0;
  if (get_version(&version) != CUDA_SUCCESS || version < 12000) {
    r.error = fmt::format("CUDA driver {} reports version {}; moejit needs 12000 or newer", lib, version);
    return r;
  }
  r.driver.version = version;
  const int request = std::min(version, CUDA_VERSION);
  std::string missing;
#define MOEJIT_LOAD_FN(name)                                                                     \
  {                                                                                              \
    void* fn = nullptr;                                                                          \
    CUdriverProcAddressQueryResult status{};                                                     \
    if (get_proc(#name, &fn, request, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||   \
        fn == nullptr) {                                                                         \
      missing += std::string(missing.empty() ? "" : ", ") + #name;                               \
    }                                                                                            \
    r.driver.name = reinterpret_cast<decltype(r.driver.name)>(fn);                               \
  }
  MOEJIT_DRIVER_FUNCTIONS(MOEJIT_LOAD_FN)
#undef MOEJIT_LOAD_FN
  if (!missing.empty()) {
    r.error = fmt::format("CUDA driver {} (version {}) lacks {}", lib, version, missing);
    return r;
  }
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
  static const LoadResult result = load();
  return result;
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
  throw CudaError(static_cast<int>(result), name,
                  fmt::format("{} failed: {} ({})", what, name, desc ? desc : "no description"));
}

}  // namespace moejit::cuda
