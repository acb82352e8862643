#include "core/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace moejit {

void parallel_for(std::size_t count, unsigned workers, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::size_t n = std::min<std::size_t>(std::max(1u, workers), count);
  if (n <= 1) {
    worker();
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  // A thread that cannot start (a process or cgroup thread limit) leaves its share to the others,
  // the caller's thread at least: the jobs still all run, on fewer threads.
  try {
    for (std::size_t t = 1; t < n; ++t) threads.emplace_back(worker);
  } catch (const std::system_error&) {
  }
  worker();
  for (auto& t : threads) t.join();
}

}  // namespace moejit
