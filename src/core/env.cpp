#include "core/env.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "core/fs.hpp"
#include "core/log.hpp"
#include "moejit/error.hpp"
#include "moejit/moejit.hpp"

#ifndef MOEJIT_SOURCE_DB_DIR
#define MOEJIT_SOURCE_DB_DIR ""
#endif

namespace moejit::env {
namespace {

// set_option's values by variable name, consulted before the environment: setting a variable
// instead would race with another thread's getenv (glibc's is not safe against setenv), and plans
// read their settings on whatever thread builds them. "" is an unset variable, as in the
// environment.
struct Overrides {
  std::mutex mu;
  std::map<std::string, std::string, std::less<>> values;
};

Overrides& overrides() {
  // Never destroyed: static destructors that log, running at exit after it would be gone, read it.
  static Overrides* o = new Overrides;
  return *o;
}

std::optional<std::string> get(const char* name) {
  std::optional<std::string> value;
  {
    Overrides& o = overrides();
    std::lock_guard<std::mutex> lock(o.mu);
    if (auto it = o.values.find(std::string_view(name)); it != o.values.end()) value = it->second;
  }
  // Outside the lock, which stays held only for the map's lookup: a child forked while another
  // thread holds it waits on it for ever, so the hold is kept short.
  if (!value) {
    const char* v = std::getenv(name);
    value = v == nullptr ? "" : v;
  }
  if (value->empty()) return std::nullopt;
  return value;
}

long long parse_int(const std::string& name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE) {
    throw InvalidArgument(name, "expected an integer, got '" + text + "'");
  }
  return x;
}

// The library's own variables, and how set_option checks a value: with the parser its accessor
// reads it with, so a value refused there is refused when set, not at every plan. None: any text.
struct Variable {
  std::string_view name;
  void (*check)(const std::string& value);
};

constexpr std::string_view kPrefix = "MOEJIT_";

constexpr Variable kVariables[] = {
    {"MOEJIT_CACHE_DIR", nullptr},
    {"MOEJIT_DISK_CACHE", [](const std::string& v) { parse_int("MOEJIT_DISK_CACHE", v); }},
    {"MOEJIT_DB", nullptr},
    {"MOEJIT_SHIPPED_DB_DIR", nullptr},
    {"MOEJIT_JOBS", [](const std::string& v) { parse_jobs(v, "MOEJIT_JOBS"); }},
    {"MOEJIT_LOG", nullptr},  // any other text than a level's name is warn
    {"MOEJIT_CUDA_DRIVER", nullptr},
    {"MOEJIT_AUTOTUNE", [](const std::string& v) { parse_int("MOEJIT_AUTOTUNE", v); }},
    {"MOEJIT_CHECK_ADOPTED", [](const std::string& v) { parse_int("MOEJIT_CHECK_ADOPTED", v); }},
    {"MOEJIT_CALL_GRAPHS", [](const std::string& v) { parse_int("MOEJIT_CALL_GRAPHS", v); }},
    {"MOEJIT_TUNE_BUDGET_S", [](const std::string& v) { parse_tune_budget_s(v, "MOEJIT_TUNE_BUDGET_S"); }},
};

// "MOEJIT_DB" or "DB", as the Python package spells them too.
const Variable& variable(std::string_view name) {
  for (const Variable& v : kVariables) {
    if (name == v.name || name == v.name.substr(kPrefix.size())) return v;
  }
  std::string known;
  for (const Variable& v : kVariables) known += (known.empty() ? "" : ", ") + std::string(v.name);
  throw InvalidArgument("name", fmt::format("unknown option '{}'; known: {} (or without MOEJIT_)", name, known));
}

// Said once per process and reason: the folders are asked for on every kernel build.
void warn_once(const std::string& message) {
  if (log::first_time(message)) log::warn("{}", message);
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

unsigned parse_jobs(const std::string& text, const std::string& what) {
  const long long v = parse_int(what, text);
  if (v < 1) throw InvalidArgument(what, fmt::format("expected a positive count, got {}", v));
  return static_cast<unsigned>(std::min(v, 1024LL));
}

std::vector<std::string> setting_errors() {
  std::vector<std::string> out;
  for (const Variable& v : kVariables) {
    const std::optional<std::string> value = get(std::string(v.name).c_str());
    if (!v.check || !value) continue;
    try {
      v.check(*value);
    } catch (const InvalidArgument& e) {
      out.push_back(e.what());
    }
  }
  return out;
}

std::optional<long long> get_int(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
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

std::optional<std::filesystem::path> gpu_lock_dir() {
  if (auto root = private_temp_root()) return *root / "gpu-locks";
  return std::nullopt;
}

std::filesystem::path shipped_db_dir() {
  if (auto v = get("MOEJIT_SHIPPED_DB_DIR")) return *v;
  return MOEJIT_SOURCE_DB_DIR;
}

unsigned compile_jobs() {
  if (auto v = get("MOEJIT_JOBS")) return parse_jobs(*v, "MOEJIT_JOBS");
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

bool check_adopted_states() {
  auto v = get_int("MOEJIT_CHECK_ADOPTED");
  return !v || *v != 0;
}

bool call_graphs() {
  auto v = get_int("MOEJIT_CALL_GRAPHS");
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

namespace moejit {

void set_option(std::string_view name, std::optional<std::string_view> value) {
  const auto& v = env::variable(name);
  std::string text(value.value_or(""));
  if (!text.empty() && v.check != nullptr) v.check(text);
  env::Overrides& o = env::overrides();
  std::lock_guard<std::mutex> lock(o.mu);
  o.values.insert_or_assign(std::string(v.name), std::move(text));
}

void set_option(std::string_view name, const char* value) {
  set_option(name, value == nullptr ? std::nullopt : std::optional<std::string_view>(value));
}

void clear_option(std::string_view name) {
  const auto& v = env::variable(name);
  env::Overrides& o = env::overrides();
  std::lock_guard<std::mutex> lock(o.mu);
  o.values.erase(std::string(v.name));
}

}  // namespace moejit
