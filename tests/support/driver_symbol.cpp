#include "support/driver_symbol.hpp"

#include <dlfcn.h>

#include <stdexcept>

#include "core/env.hpp"
#include "cuda/driver.hpp"

namespace moejit::test {

void* driver_symbol(const char* name) {
  static void* const handle = [] {
    cuda::driver();  // loaded and initialised, or NoDeviceError
    void* h = ::dlopen(env::cuda_driver_library().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) throw std::runtime_error("cannot load the CUDA driver");
    return h;
  }();
  return ::dlsym(handle, name);
}

}  // namespace moejit::test
