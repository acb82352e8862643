// Runs independent jobs on threads started for the call.
#pragma once

#include <cstddef>
#include <functional>

namespace moejit {

// Calls fn(i) for every i in [0, count) on up to `workers` threads and returns when all are
// done. fn must not throw: callers record per-item failures in their own results.
void parallel_for(std::size_t count, unsigned workers, const std::function<void(std::size_t)>& fn);

}  // namespace moejit
