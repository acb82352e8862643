#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "cuda/driver.hpp"

namespace moejit::bench {
namespace {

// 256 MiB takes the H200 about 80 us to write: a few of them outlast the enqueue of many steps.
constexpr std::size_t kLeadBytes = std::size_t{256} << 20;
constexpr int kMaxLeadMemsets = 512;
// Head start over the host's estimated enqueue time of all timed iterations.
constexpr double kLeadMargin = 1.5;

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

void memset_lead(const cuda::DeviceBuffer& lead, CUstream stream) {
  MOEJIT_CU(cuda::driver().cuMemsetD32Async(lead.get(), 0x3f803f80u, lead.bytes() / 4, stream));
}

}  // namespace

Stats summarize(std::vector<float> samples_ms) {
  Stats s;
  s.samples_ms = samples_ms;
  if (samples_ms.empty()) return s;
  std::sort(samples_ms.begin(), samples_ms.end());
  const std::size_t n = samples_ms.size();
  s.median_ms = n % 2 ? samples_ms[n / 2] : 0.5 * (double(samples_ms[n / 2 - 1]) + samples_ms[n / 2]);
  s.min_ms = samples_ms.front();
  s.p90_ms = samples_ms[(9 * n + 9) / 10 - 1];
  return s;
}

std::vector<std::size_t> round_order(std::size_t n, int round) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = (i + static_cast<std::size_t>(round)) % n;
  return order;
}

std::vector<double> round_ratios(const std::vector<Stats>& ours, const std::vector<Stats>& dense) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < std::min(ours.size(), dense.size()); ++r) {
    if (ours[r].median_ms > 0) ratios.push_back(dense[r].median_ms / ours[r].median_ms);
  }
  return ratios;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Stats merge(const std::vector<Stats>& rounds) {
  std::vector<float> all;
  std::vector<std::array<double, 2>> spans;
  double host_us = 0;
  bool host_bound = false;
  for (const Stats& r : rounds) {
    all.insert(all.end(), r.samples_ms.begin(), r.samples_ms.end());
    spans.insert(spans.end(), r.spans_unix_s.begin(), r.spans_unix_s.end());
    host_us += r.host_us_per_iter * static_cast<double>(r.samples_ms.size());
    host_bound = host_bound || r.host_bound;
  }
  Stats s = summarize(std::move(all));
  if (!s.samples_ms.empty()) s.host_us_per_iter = host_us / static_cast<double>(s.samples_ms.size());
  s.host_bound = host_bound;
  s.spans_unix_s = std::move(spans);
  return s;
}

StreamTimer::StreamTimer(CUstream stream) : stream_(stream), lead_(kLeadBytes) {
  cuda::Event begin, end;
  memset_lead(lead_, stream_);  // the first pass pays for page mapping and clock ramp-up
  begin.record(stream_);
  memset_lead(lead_, stream_);
  end.record(stream_);
  end.synchronize();
  memset_ms_ = std::max(end.elapsed_since(begin), 1e-3f);
}

Stats StreamTimer::measure(int warmup, int iters, const Step& untimed, const Step& timed) {
  if (warmup < 1 || iters < 1) throw std::logic_error("StreamTimer::measure needs warmup >= 1 and iters >= 1");
  auto run = [&](int i) {
    if (untimed) untimed(i);
    timed(i);
  };
  // Warm-up also estimates the host's enqueue time per iteration; the first iteration carries
  // one-time costs (first launches, cuBLAS heuristics), so it is left out when others exist.
  std::vector<double> host_ms;
  for (int i = 0; i < warmup; ++i) {
    const double t = now_ms();
    run(i);
    host_ms.push_back(now_ms() - t);
  }
  const double per_iter = warmup > 1 ? std::accumulate(host_ms.begin() + 1, host_ms.end(), 0.0) / (warmup - 1)
                                     : host_ms.front();
  const int memsets = std::clamp(static_cast<int>(std::ceil(kLeadMargin * iters * per_iter / memset_ms_)), 1,
                                 kMaxLeadMemsets);

  cuda::Event lead_begin, lead_end;
  std::vector<cuda::Event> begin, end;
  begin.reserve(iters);
  end.reserve(iters);
  for (int k = 0; k < iters; ++k) {
    begin.emplace_back();
    end.emplace_back();
  }
  lead_begin.record(stream_);
  for (int m = 0; m < memsets; ++m) memset_lead(lead_, stream_);
  lead_end.record(stream_);

  const double t = now_ms();
  for (int k = 0; k < iters; ++k) {
    const int i = warmup + k;
    if (untimed) untimed(i);
    begin[k].record(stream_);
    timed(i);
    end[k].record(stream_);
  }
  const double host_total_ms = now_ms() - t;
  end.back().synchronize();
  // The host wakes within microseconds of the last event: the GPU span ends now.
  const double gpu_end_s = unix_now_s();

  std::vector<float> samples;
  for (int k = 0; k < iters; ++k) samples.push_back(end[k].elapsed_since(begin[k]));
  Stats s = summarize(std::move(samples));
  s.host_us_per_iter = 1e3 * host_total_ms / iters;
  s.host_bound = host_total_ms > lead_end.elapsed_since(lead_begin);
  s.spans_unix_s.push_back({gpu_end_s - 1e-3 * end.back().elapsed_since(begin.front()), gpu_end_s});
  return s;
}

}  // namespace moejit::bench
