#include "core/log.hpp"

#include <cstdio>
#include <mutex>
#include <set>
#include <utility>

namespace moejit::log {

namespace {
thread_local int t_level = -1;  // a ScopedLevel's, or -1: MOEJIT_LOG's
}

bool enabled(env::LogLevel level) {
  const int current = t_level >= 0 ? t_level : static_cast<int>(env::log_level());
  return static_cast<int>(level) <= current;
}

bool first_time(const std::string& key) {
  // Never destroyed: a thread still logging while the process exits must not find them gone.
  static std::mutex* mu = new std::mutex;
  static std::set<std::string>* seen = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(*mu);
  return seen->insert(key).second;
}

ScopedLevel::ScopedLevel(env::LogLevel level) : previous_(std::exchange(t_level, static_cast<int>(level))) {}

ScopedLevel::~ScopedLevel() { t_level = previous_; }

void write(env::LogLevel level, std::string_view message) {
  static std::mutex mu;
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[moejit %s] %.*s\n", kNames[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

}  // namespace moejit::log
