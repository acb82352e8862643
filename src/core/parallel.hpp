// Runs independent jobs on threads started for the call.
#pragma once

#include <cstddef>
#include <functional>

namespace moejit {

// Calls fn(i) for every i in [0, count) on up to `workers` threads and returns when all are
// done. A job that throws does not stop the others: once every job has run and every thread is
// joined, the first exception thrown (on any thread, the caller's included) is rethrown. Callers
// that want each item's failure record it in their own results.
void parallel_for(std::size_t count, unsigned workers, const std::function<void(std::size_t)>& fn);

}  // namespace moejit
