// Minimal leveled logging to stderr; the level comes from MOEJIT_LOG.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "core/env.hpp"

namespace moejit::log {

void write(env::LogLevel level, std::string_view message);
bool enabled(env::LogLevel level);

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
