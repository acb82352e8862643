#include "core/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

namespace moejit {

void parallel_for(std::size_t count, unsigned workers, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::exception_ptr first;  // guarded by mu
  // Each job's exception is caught where it is thrown: none escapes a std::thread (which would
  // call std::terminate), and the thread goes on with the jobs left.
  auto worker = [&]() noexcept {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    }
  };
  const std::size_t n = std::min<std::size_t>(std::max(1u, workers), count);
  std::vector<std::thread> threads;
  // A thread that cannot start (a process or cgroup thread limit, no memory for it) leaves its
  // share to the others, the caller's thread at least: the jobs still all run, on fewer threads.
  try {
    if (n > 1) threads.reserve(n - 1);
    for (std::size_t t = 1; t < n; ++t) threads.emplace_back(worker);
  } catch (const std::system_error&) {
  } catch (const std::bad_alloc&) {
  }
  worker();
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace moejit
