// moejit cache: what the kernel cache folder holds per build, and removing other builds' kernels.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "core/env.hpp"
#include "jit/disk_cache.hpp"
#include "moejit/error.hpp"

namespace moejit::cli {
namespace {

// --dir, else the folder the library uses (MOEJIT_CACHE_DIR and the fallbacks, README). The
// library's folder may not exist yet (nothing compiled); a --dir that does not is a mistake, which
// would otherwise list as empty and prune nothing, successfully. Missing, it fails as db's
// commands fail on a database that is not there (IoError, exit 1).
jit::DiskCache cache_of(const Args& a) {
  if (!a.positional.empty()) throw InvalidArgument("cache", fmt::format("unexpected argument '{}'", a.positional[0]));
  if (a.has("dir")) {
    const std::filesystem::path dir = a.get("dir");
    if (dir.empty()) throw InvalidArgument("--dir", "needs a value");
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      throw IoError(fmt::format("no kernel cache folder at {}", dir.string()));
    }
    return jit::DiskCache::of_this_build(dir);
  }
  const auto dir = env::kernel_cache_dir();
  if (!dir) throw InvalidArgument("cache", "no kernel cache folder: pass --dir or set MOEJIT_CACHE_DIR");
  return jit::DiskCache::of_this_build(*dir);
}

std::string day_of(std::filesystem::file_time_type t) {
  const auto system = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::file_clock::to_sys(t));
  return fmt::format("{:%Y-%m-%d}", system);
}

// What could not be read or removed, on stderr; the exit code: 1 where there was any, since the
// listing or the pruning is then incomplete.
int report(const std::vector<std::string>& errors) {
  for (const std::string& error : errors) fmt::print(stderr, "moejit cache: {}\n", error);
  return errors.empty() ? 0 : 1;
}

int list(const Args& a) {
  const jit::DiskCache cache = cache_of(a);
  fmt::print("kernel cache: {}\n", cache.root().string());
  std::vector<std::string> errors;
  const auto builds = cache.builds(&errors);
  if (builds.empty()) {
    fmt::print("{}\n", errors.empty() ? "(empty)" : "(nothing readable)");
    return report(errors);
  }
  fmt::print("{:<36} {:>6} {:>8}  {}\n", "BUILD", "FILES", "MiB", "LAST USED");
  for (const auto& b : builds) {
    const std::string name = b.build.empty() ? "(no subfolder: before 2026-12-02)" : b.build;
    fmt::print("{:<36} {:>6} {:>8.1f}  {:<10}{}\n", name, b.files, static_cast<double>(b.bytes) / (1 << 20),
               day_of(b.last_used), b.build == cache.build() ? "  this build" : "");
  }
  return report(errors);
}

int prune(const Args& a) {
  const jit::DiskCache cache = cache_of(a);
  std::vector<std::string> errors;
  const std::size_t removed = cache.remove_other_builds(std::chrono::seconds(0), &errors);
  fmt::print("removed {} kernel files of other builds from {}; this build's are in {}/\n", removed,
             cache.root().string(), cache.build());
  if (!errors.empty()) {
    fmt::print("{} error{}: other builds' files may remain\n", errors.size(), errors.size() == 1 ? "" : "s");
  }
  return report(errors);
}

}  // namespace

int run_cache(int argc, char** argv, int start) {
  const std::string sub = start < argc ? argv[start] : "";
  if (sub == "list") return list(parse_args(argc, argv, start + 1, {}, {"dir"}, true));
  if (sub == "prune") return prune(parse_args(argc, argv, start + 1, {}, {"dir"}, true));
  return help_or_unknown_subcommand("cache", sub);
}

}  // namespace moejit::cli
