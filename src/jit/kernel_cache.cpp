#include "jit/kernel_cache.hpp"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <mutex>
#include <optional>
#include <semaphore>
#include <set>
#include <thread>

#include "core/env.hpp"
#include "core/log.hpp"
#include "core/parallel.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"
#include "jit/codegen.hpp"
#include "jit/disk_cache.hpp"
#include "jit/nvrtc.hpp"
#include "jit/template_hash.hpp"
#include "moejit/error.hpp"
#include "tuner/gating.hpp"

namespace moejit::jit {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Swept once per process and folder (DiskCache::sweep).
void sweep_cache_folder(const DiskCache& disk) {
  // Never destroyed, as the kernel cache: a thread starting a build while the process exits reads it.
  static std::mutex* mu = new std::mutex;
  static auto* swept = new std::set<std::filesystem::path>;
  {
    std::lock_guard<std::mutex> lock(*mu);
    if (!swept->insert(disk.root()).second) return;
  }
  disk.sweep();
}

// NVRTC takes tens of MB per compile: threads of several calls at once (one tuning thread per GPU,
// say) share the machine's hardware threads.
class CompileSlot {
 public:
  CompileSlot() { slots().acquire(); }
  ~CompileSlot() { slots().release(); }
  CompileSlot(const CompileSlot&) = delete;
  CompileSlot& operator=(const CompileSlot&) = delete;

 private:
  static std::counting_semaphore<>& slots() {
    // Never destroyed, as the kernel cache: a thread compiling while the process exits holds a slot.
    static auto* s = new std::counting_semaphore<>(std::max(1u, std::thread::hardware_concurrency()));
    return *s;
  }
};

}  // namespace

// What a build reads from the environment, read once on the thread that asked.
struct KernelCache::BuildSettings {
  std::optional<std::filesystem::path> disk_dir;  // none: the disk cache is off
  env::LogLevel log_level = env::LogLevel::kWarn;

  static BuildSettings read() {
    BuildSettings s;
    s.log_level = env::log_level();
    if (!env::disk_cache_enabled()) return s;
    s.disk_dir = env::kernel_cache_dir();
    if (!s.disk_dir) {
      log::warn("kernel cache on disk off: no folder for it (MOEJIT_CACHE_DIR, XDG_CACHE_HOME and HOME unset, "
                "no private folder in the temporary folder)");
    }
    return s;
  }
};

namespace {

// Disk, then NVRTC; stores what it compiled, setting `not_stored` where that failed. Runs outside
// the cache lock.
std::shared_ptr<const CompiledKernel> build(const KernelSpec& spec, const GeneratedUnit& unit,
                                            const std::vector<std::string>& options, const KernelKey& key,
                                            const std::optional<std::filesystem::path>& disk_dir, Origin& origin,
                                            std::optional<std::string>& not_stored) {
  std::optional<DiskCache> disk;
  if (disk_dir) {
    disk.emplace(DiskCache::of_this_build(*disk_dir));
    sweep_cache_folder(*disk);
  }
  auto kernel = std::make_shared<CompiledKernel>();
  if (disk && disk->load(key, *kernel) == DiskLookup::kHit) {
    origin = Origin::kDisk;
    return kernel;
  }
  NvrtcOutput out = [&] {
    CompileSlot slot;
    return nvrtc_compile(unit, options);
  }();
  kernel->key = key;
  kernel->cubin = std::move(out.cubin);
  kernel->name_expressions = unit.name_expressions;
  kernel->lowered_names = std::move(out.lowered_names);
  kernel->resources = std::move(out.resources);
  kernel->performance_losses = std::move(out.performance_losses);
  kernel->compile_ms = out.compile_ms;
  log::debug("compiled {} in {:.1f} ms", spec.readable_name(), out.compile_ms);
  if (out.log.find("warning") != std::string::npos) log::warn("{}: {}", spec.readable_name(), out.log);
  // ptxas reports a serialized wgmma pipeline or an ignored setmaxnreg only as an info line.
  for (const std::string& loss : kernel->performance_losses) log::warn("{}: ptxas: {}", spec.readable_name(), loss);
  if (disk) not_stored = disk->store(*kernel);
  origin = Origin::kCompiled;
  return kernel;
}

// Two attributes: cuda::query_current_device() would read the whole descriptor (name, UUID, memory,
// every limit), driver calls the arch gate does not need and that could fail on their own.
int context_device_cc() {
  const cuda::Driver& d = cuda::driver();
  CUdevice dev = 0;
  MOEJIT_CU(d.cuCtxGetDevice(&dev));
  int major = 0, minor = 0;
  MOEJIT_CU(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  MOEJIT_CU(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  return major * 10 + minor;
}

}  // namespace

KernelCache& KernelCache::instance() {
  // Never destroyed: modules must not be unloaded after the driver or the caller's context has
  // been torn down at process exit.
  static KernelCache* cache = new KernelCache();
  return *cache;
}

std::shared_ptr<const CompiledKernel> KernelCache::get(const KernelSpec& spec, Origin* origin) {
  return get(spec, origin, BuildSettings::read());
}

std::shared_ptr<const CompiledKernel> KernelCache::get(const KernelSpec& spec, Origin* origin,
                                                       const BuildSettings& settings,
                                                       std::optional<std::string>* not_stored) {
  GeneratedUnit unit = generate_unit(spec);
  std::vector<std::string> options = nvrtc_options(spec.arch);
  KernelKey key = make_kernel_key(spec, unit, options, nvrtc_build_id(), template_hash());

  std::promise<std::shared_ptr<const CompiledKernel>> promise;
  std::shared_future<std::shared_ptr<const CompiledKernel>> future;
  bool builder = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = compiled_.find(key.stem());
    if (it != compiled_.end()) {
      future = it->second;
    } else {
      future = promise.get_future().share();
      compiled_.emplace(key.stem(), future);
      builder = true;
    }
  }
  if (!builder) {
    if (origin) *origin = Origin::kMemory;
    return future.get();  // rethrows the builder's CompileError
  }
  try {
    Origin o = Origin::kCompiled;
    std::optional<std::string> store_failure;
    auto kernel = build(spec, unit, options, key, settings.disk_dir, o, store_failure);
    promise.set_value(kernel);
    if (origin) *origin = o;
    if (not_stored) *not_stored = std::move(store_failure);
    return kernel;
  } catch (...) {
    // A failed build is not cached: a later request (e.g. after fixing the environment) retries.
    {
      std::lock_guard<std::mutex> lock(mu_);
      compiled_.erase(key.stem());
    }
    promise.set_exception(std::current_exception());
    throw;
  }
}

std::vector<CompileResult> KernelCache::compile_all(const std::vector<KernelSpec>& specs, unsigned jobs) {
  std::vector<CompileResult> results(specs.size());
  std::optional<BuildSettings> settings;
  std::string settings_error;  // a malformed variable fails every spec, as get() would
  try {
    settings = BuildSettings::read();
  } catch (const std::exception& e) {
    settings_error = e.what();
  }
  // Where memory runs out for the result itself (copying the spec or a message) no failure can
  // be recorded: that std::bad_alloc goes to parallel_for, which rethrows it once all jobs are done.
  parallel_for(specs.size(), jobs, [&](std::size_t i) {
    CompileResult& r = results[i];
    r.spec = specs[i];
    auto t0 = std::chrono::steady_clock::now();
    if (!settings) {
      r.error = settings_error;
      return;
    }
    log::ScopedLevel level(settings->log_level);
    try {
      r.kernel = get(specs[i], &r.origin, *settings, &r.not_stored);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    r.wall_ms = ms_since(t0);
  });
  return results;
}

const LoadedKernel& KernelCache::load(const KernelSpec& spec) {
  const unsigned long long ctx = cuda::current_context_id();
  int cc = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = context_cc_.find(ctx);
    if (it == context_cc_.end()) it = context_cc_.emplace(ctx, context_device_cc()).first;
    cc = it->second;
  }
  if (auto why = arch_gate_reason(spec.config.arch_tag, cc)) {
    throw UnsupportedError(fmt::format("{} cannot run here: {}", spec.readable_name(), *why));
  }
  if (spec.arch != cuda::arch_for_cc(cc)) {
    throw UnsupportedError(fmt::format("{} was built for {} but the current device is {}", spec.readable_name(),
                                       spec.arch, cuda::arch_for_cc(cc)));
  }
  auto compiled = get(spec);
  std::lock_guard<std::mutex> lock(mu_);
  auto slot = std::make_pair(ctx, compiled->key.stem());
  auto it = loaded_.find(slot);
  if (it != loaded_.end()) return *it->second;

  auto loaded = std::make_unique<LoadedKernel>();
  loaded->compiled = compiled;
  loaded->module = cuda::Module(compiled->cubin);
  const cuda::Driver& d = cuda::driver();
  CUdevice dev = 0;
  MOEJIT_CU(d.cuCtxGetDevice(&dev));
  int optin = 0;
  MOEJIT_CU(d.cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
  loaded->max_dynamic_smem = optin;
  for (const std::string& lowered : compiled->lowered_names) {
    CUfunction fn = loaded->module.function(lowered.c_str());
    int static_smem = 0;
    MOEJIT_CU(d.cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn));
    MOEJIT_CU(d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - static_smem));
    loaded->max_dynamic_smem = std::min(loaded->max_dynamic_smem, optin - static_smem);
    loaded->functions.push_back(fn);
  }
  return *loaded_.emplace(slot, std::move(loaded)).first->second;
}

void KernelCache::forget_compiled() {
  std::lock_guard<std::mutex> lock(mu_);
  compiled_.clear();
}

}  // namespace moejit::jit
