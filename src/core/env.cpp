#include "core/env.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "core/fs.hpp"
#include "core/log.hpp"
#include "moejit/error.hpp"

#ifndef MOEJIT_SOURCE_DB_DIR
#define MOEJIT_SOURCE_DB_DIR ""
#endif

namespace moejit::env {
namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// Said once per process and reason: the folders are asked for on every kernel build.
void warn_once(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> said;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!said.insert(message).second) return;
  }
  log::warn("{}", message);
}

// Every user shares the temporary folder, and another could make this folder first to plant
// forged kernels there: so one folder per user, used only while it is private.
std::optional<std::filesystem::path> private_temp_root() {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) return std::nullopt;
  const std::filesystem::path dir = tmp / fmt::format("moejit-cache-{}", ::geteuid());
  try {
    fs::make_private_dir(dir);
  } catch (const IoError& e) {
    warn_once(fmt::format("not using the temporary cache folder: {}", e.what()));
    return std::nullopt;
  }
  return dir;
}

// Nothing where no variable names a folder and the temporary folder has no private one either.
// Folders the variables name are the user's choice, shared or not, and are not checked.
std::optional<std::filesystem::path> user_cache_root() {
  if (auto xdg = get("XDG_CACHE_HOME")) return std::filesystem::path(*xdg) / "moejit";
  if (auto home = get("HOME")) return std::filesystem::path(*home) / ".cache" / "moejit";
  return private_temp_root();
}

}  // namespace

std::optional<long long> get_int(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE) {
    throw InvalidArgument(name, "expected an integer, got '" + *v + "'");
  }
  return x;
}

std::optional<std::filesystem::path> kernel_cache_dir() {
  if (auto v = get("MOEJIT_CACHE_DIR")) return std::filesystem::path(*v);
  if (auto root = user_cache_root()) return *root / "kernels";
  return std::nullopt;
}

bool disk_cache_enabled() {
  auto v = get_int("MOEJIT_DISK_CACHE");
  return !v || *v != 0;
}

std::optional<std::filesystem::path> user_db_path() {
  if (auto v = get("MOEJIT_DB")) return std::filesystem::path(*v);
  if (auto root = user_cache_root()) return *root / "tuning.sqlite";
  return std::nullopt;
}

std::filesystem::path shipped_db_dir() {
  if (auto v = get("MOEJIT_SHIPPED_DB_DIR")) return *v;
  return MOEJIT_SOURCE_DB_DIR;
}

unsigned compile_jobs() {
  // More threads than any machine has cores only cost stacks.
  if (auto v = get_int("MOEJIT_JOBS")) {
    if (*v < 1) throw InvalidArgument("MOEJIT_JOBS", fmt::format("expected a positive count, got {}", *v));
    return static_cast<unsigned>(std::min(*v, 1024LL));
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : hw;
}

LogLevel log_level() {
  auto v = get("MOEJIT_LOG");
  if (!v) return LogLevel::kWarn;
  if (*v == "error") return LogLevel::kError;
  if (*v == "info") return LogLevel::kInfo;
  if (*v == "debug") return LogLevel::kDebug;
  return LogLevel::kWarn;
}

std::string cuda_driver_library() { return get("MOEJIT_CUDA_DRIVER").value_or("libcuda.so.1"); }

bool autotune_enabled() {
  auto v = get_int("MOEJIT_AUTOTUNE");
  return !v || *v != 0;
}

double parse_tune_budget_s(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double s = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(s > 0) || !(s <= kMaxTuneBudgetS)) {
    throw InvalidArgument(what, fmt::format("expected seconds above 0 and at most {:g}, got '{}'", kMaxTuneBudgetS, text));
  }
  return s;
}

double tune_budget_s() {
  auto v = get("MOEJIT_TUNE_BUDGET_S");
  return v ? parse_tune_budget_s(*v, "MOEJIT_TUNE_BUDGET_S") : 60.0;
}

}  // namespace moejit::env
