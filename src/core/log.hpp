// Minimal leveled logging to stderr; the level comes from MOEJIT_LOG.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "core/env.hpp"

namespace moejit::log {

void write(env::LogLevel level, std::string_view message);
bool enabled(env::LogLevel level);

// True the first time this process asks with `key`, false after: for what is said once per
// process (and file), not at every plan.
bool first_time(const std::string& key);

// While alive, this thread logs at `level` instead of reading MOEJIT_LOG. Threads a call starts
// log at the level the call read: getenv is not safe against another thread's setenv.
class ScopedLevel {
 public:
  explicit ScopedLevel(env::LogLevel level);
  ~ScopedLevel();
  ScopedLevel(const ScopedLevel&) = delete;
  ScopedLevel& operator=(const ScopedLevel&) = delete;

 private:
  int previous_;
};

template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(env::LogLevel::kWarn)) write(env::LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(env::LogLevel::kInfo)) write(env::LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(env::LogLevel::kDebug)) write(env::LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moejit::log
