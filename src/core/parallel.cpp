#include "core/parallel.hpp"

#include <algorithm>
#include <atomic>
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
  for (std::size_t t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
}

}  // namespace moejit
