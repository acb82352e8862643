// The kernel cache: an in-process map of compiled kernels in front of the on-disk cache in
// front of NVRTC, plus the modules loaded per CUDA context. Thread-safe; each key is compiled
// once per process even when many threads ask at once.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "jit/compiled_kernel.hpp"
#include "jit/kernel_spec.hpp"
#include "jit/loaded_kernel.hpp"

namespace moejit::jit {

struct CompileResult {
  KernelSpec spec;
  std::shared_ptr<const CompiledKernel> kernel;  // null when compiling failed
  Origin origin = Origin::kCompiled;
  double wall_ms = 0;  // this request's cost
  std::string error;   // the CompileError message when kernel is null
  // Why the kernel compiled for this request is not in the disk cache (DiskCache::store); none
  // when it was stored, came from a cache, or the disk cache is off.
  std::optional<std::string> not_stored;
};

class KernelCache {
 public:
  static KernelCache& instance();

  // Memory, then disk (MOEJIT_CACHE_DIR), then NVRTC. Throws CompileError (InvalidArgument for a
  // spec codegen refuses or a malformed MOEJIT_DISK_CACHE). No folder for the cache turns the
  // disk cache off, and one that cannot be made or written turns storing there off, each with a
  // warning.
  std::shared_ptr<const CompiledKernel> get(const KernelSpec& spec, Origin* origin = nullptr);

  // Every spec on up to `jobs` threads, which read no environment variable (the calling thread
  // reads them once). Failures are reported per spec, never thrown, save std::bad_alloc where
  // host memory runs out for the result itself (thrown once every spec's job is done). NVRTC runs
  // on at most as many threads at once in the whole process as the machine has hardware threads.
  std::vector<CompileResult> compile_all(const std::vector<KernelSpec>& specs, unsigned jobs);

  // Loads the kernel into the current context once and returns it. Refuses (UnsupportedError)
  // a config the current device cannot run: this is the first-launch gate for arch-tagged
  // configs. Throws NoDeviceError, CudaError, CompileError.
  const LoadedKernel& load(const KernelSpec& spec);

  // Forgets compiled kernels held in memory (tests use it to observe disk hits). Loaded
  // modules stay.
  void forget_compiled();

 private:
  KernelCache() = default;
  struct BuildSettings;
  std::shared_ptr<const CompiledKernel> get(const KernelSpec& spec, Origin* origin, const BuildSettings& settings,
                                            std::optional<std::string>* not_stored = nullptr);
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CompiledKernel>>> compiled_;
  // Keyed by context id (cuda::current_context_id), never by the reusable CUcontext pointer.
  std::map<std::pair<unsigned long long, std::string>, std::unique_ptr<LoadedKernel>> loaded_;
  std::map<unsigned long long, int> context_cc_;
};

}  // namespace moejit::jit
