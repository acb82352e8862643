#include "core/log.hpp"

#include <cstdio>
#include <mutex>

namespace moejit::log {

bool enabled(env::LogLevel level) { return static_cast<int>(level) <= static_cast<int>(env::log_level()); }

void write(env::LogLevel level, std::string_view message) {
  static std::mutex mu;
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[moejit %s] %.*s\n", kNames[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

}  // namespace moejit::log
