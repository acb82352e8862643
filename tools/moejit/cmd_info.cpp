// moejit info: what this machine offers moejit. Works (and exits 0) without a GPU; a library
// variable set to a value moejit refuses is reported after the rest (exit 2).
#include <fmt/format.h>

#include "args.hpp"
#include "commands.hpp"
#include "core/env.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "jit/disk_cache.hpp"
#include "jit/embedded_templates.hpp"
#include "jit/nvrtc.hpp"
#include "jit/template_hash.hpp"
#include "moejit/error.hpp"
#include "moejit/version.hpp"

namespace moejit::cli {
namespace {

// Why the disk cache is off, or "" where it is on.
std::string disk_cache_note() {
  try {
    return env::disk_cache_enabled() ? "" : " (disabled by MOEJIT_DISK_CACHE=0)";
  } catch (const InvalidArgument&) {
    return " (MOEJIT_DISK_CACHE is invalid: below)";
  }
}

void print_device() {
  std::string why;
  if (!cuda::device_available(&why)) {
    fmt::print("device        no GPU ({})\n", why);
    return;
  }
  const cuda::DeviceInfo d = cuda::query_device(0);
  fmt::print("driver        {}.{}\n", d.driver_version / 1000, (d.driver_version % 1000) / 10);
  fmt::print("device        {} ({}, {} SMs, {} KiB smem/block opt-in, {} MiB L2, {} MiB memory)\n", d.name, d.arch(),
             d.sm_count, d.smem_optin_per_block / 1024, d.l2_bytes >> 20, d.total_memory >> 20);
}

}  // namespace

int run_info(int argc, char** argv, int start) {
  parse_args(argc, argv, start, {}, {});
  fmt::print("moejit        {}\n", kLibraryVersion);
  fmt::print("nvrtc         {}\n", jit::nvrtc_build_id());
  fmt::print("templates     {} files, hash {}\n", jit::embedded_template_files().size(), jit::template_hash());
  const auto cache = env::kernel_cache_dir();
  const auto user_db = env::user_db_path();
  constexpr const char* kNoFolder =
      "(none: no variable names a folder, and there is no private one in the temporary folder)";
  fmt::print("kernel cache  {}{}\n",
             cache ? fmt::format("{} (this build's files in {}/)", cache->string(),
                                 jit::DiskCache::of_this_build(*cache).folder().filename().string())
                   : kNoFolder,
             disk_cache_note());
  fmt::print("tuning db     {}\n", user_db ? user_db->string() : kNoFolder);
  fmt::print("shipped dbs   {}\n", env::shipped_db_dir().string());
  print_device();
  // Each one, not only the first: the commands that read them stop at the first (exit 2).
  const std::vector<std::string> invalid = env::setting_errors();
  for (const std::string& error : invalid) fmt::print("invalid       {}\n", error);
  return invalid.empty() ? 0 : 2;
}

}  // namespace moejit::cli
