// GPU timing on one stream: every timed iteration sits between its own pair of CUDA events, and
// the statistics are over those per-iteration times. A run of untimed memsets ahead of the timed
// iterations lets the host enqueue them all before the GPU gets there, so the events measure GPU
// time rather than the host's launch rate.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <functional>
#include <vector>

#include "cuda/handles.hpp"

namespace moejit::bench {

struct Stats {
  double median_ms = 0, min_ms = 0, p90_ms = 0;
  std::vector<float> samples_ms;  // in the order they ran
  double host_us_per_iter = 0;    // host wall time to enqueue one timed iteration
  // The host took longer to enqueue the timed iterations than the GPU's head start lasted, so the
  // GPU may have idled between launches and the times may include that idling.
  bool host_bound = false;
  // Wall-clock span [start, end] in Unix seconds of each measure() call's timed iterations on the
  // GPU (their first event to their last), so samples of clocks and power taken beside the run
  // (tools/power-phases.py) can be attributed to this step.
  std::vector<std::array<double, 2>> spans_unix_s;
};

// Median (mean of the middle two for an even count), min and nearest-rank 90th percentile.
Stats summarize(std::vector<float> samples_ms);

// One Stats over the samples (and spans) of several measure() calls of the same step (rounds).
Stats merge(const std::vector<Stats>& rounds);

// The order in which round `round` times n measured items (each step of ours and each dense
// sequence, listed with every step beside its dense sequence): the list rotated by the round
// index, so no item always follows the same one (a full step heats the card and lowers the clocks
// of whatever runs next).
std::vector<std::size_t> round_order(std::size_t n, int round);

// dense / ours of each round's medians, for the rounds both sides timed (their first
// min(size) rounds): a side whose clocks drifted between rounds is compared with the other side
// under the same conditions. The reported ratio is the median of these (median_of).
std::vector<double> round_ratios(const std::vector<Stats>& ours, const std::vector<Stats>& dense);
double median_of(std::vector<double> values);  // 0 for none

// Enqueues the work of iteration i on the timer's stream. i counts warm-up and timed iterations
// together, so inputs keep rotating across the two.
using Step = std::function<void(int i)>;

class StreamTimer {
 public:
  explicit StreamTimer(CUstream stream);

  // Runs `warmup` iterations (>= 1) untimed, then `iters` timed ones. Each iteration enqueues
  // untimed(i) (may be empty) and then timed(i) between its events.
  Stats measure(int warmup, int iters, const Step& untimed, const Step& timed);

 private:
  CUstream stream_;
  cuda::DeviceBuffer lead_;  // memset target that keeps the GPU busy while the host enqueues
  float memset_ms_ = 0;      // GPU time of one memset of lead_
};

}  // namespace moejit::bench
