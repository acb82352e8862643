#include "inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "core/float16.hpp"
#include "core/parallel.hpp"
#include "moejit/error.hpp"

namespace moejit::bench {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// xorshift64*: a few instructions per draw, so a gigabyte of weights fills in about a second.
// Each (seed, stream) pair gets an independent sequence, which lets threads fill disjoint slices
// with results that do not depend on how many threads there are.
class Rng {
 public:
  Rng(std::uint64_t seed, std::uint64_t stream) : s_(splitmix64(seed ^ splitmix64(stream)) | 1) {}
  std::uint64_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545f4914f6cdd1dull;
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }               // [0, 1)
  double open_uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }  // (0, 1)

 private:
  std::uint64_t s_;
};

unsigned host_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

constexpr std::size_t kSlice = std::size_t{1} << 20;  // elements one task fills
constexpr std::size_t kSlicesPerUpload = 64;          // bounds the host staging buffer at 128 MiB

}  // namespace

RoutingSpec parse_routing(const std::string& text) {
  if (text == "uniform") return {};
  if (text == "balanced") return {false, true, 0.0};
  for (const std::string prefix : {"zipf:", "zipf-shuffled:"}) {
    if (text.rfind(prefix, 0) != 0) continue;
    const std::string value = text.substr(prefix.size());
    char* end = nullptr;
    const double s = std::strtod(value.c_str(), &end);
    if (!value.empty() && *end == '\0' && s > 0 && std::isfinite(s)) return {true, false, s, prefix != "zipf:"};
  }
  throw InvalidArgument("--routing",
                        "expected 'uniform', 'balanced', 'zipf:S' or 'zipf-shuffled:S' with S > 0, got '" + text + "'");
}

std::string routing_name(const RoutingSpec& r) {
  if (r.balanced) return "balanced";
  if (!r.zipf) return "uniform";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s:%g", r.shuffled ? "zipf-shuffled" : "zipf", r.exponent);
  return buf;
}

void fill_uniform(const cuda::DeviceBuffer& buffer, DType dtype, double lo, double hi, std::uint64_t seed) {
  const std::size_t count = buffer.bytes() / 2;
  std::vector<std::uint16_t> staging(std::min(count, kSlice * kSlicesPerUpload));
  const float base = static_cast<float>(lo), span = static_cast<float>(hi - lo);
  for (std::size_t begin = 0; begin < count; begin += staging.size()) {
    const std::size_t n = std::min(staging.size(), count - begin);
    parallel_for((n + kSlice - 1) / kSlice, host_threads(), [&](std::size_t slice) {
      Rng rng(seed, begin / kSlice + slice);
      const std::size_t end = std::min(n, (slice + 1) * kSlice);
      for (std::size_t i = slice * kSlice; i < end; ++i) {
        const float v = base + span * rng.uniform();
        staging[i] = dtype == DType::kBF16 ? float_to_bf16(v) : float_to_fp16(v);
      }
    });
    buffer.upload(staging.data(), n * 2, begin * 2);
  }
}

std::vector<std::int32_t> routing_ids(long long tokens, int experts, int topk, const RoutingSpec& routing,
                                      std::uint64_t seed) {
  std::vector<double> log_weight(experts, 0.0);
  if (routing.zipf) {
    // Popularity rank r (0 the most popular) goes to expert rank_expert[r].
    std::vector<int> rank_expert(experts);
    std::iota(rank_expert.begin(), rank_expert.end(), 0);
    if (routing.shuffled) {
      Rng rng(seed, ~0ULL);
      for (int r = experts - 1; r > 0; --r) std::swap(rank_expert[r], rank_expert[rng.next() % (r + 1)]);
    }
    for (int r = 0; r < experts; ++r) log_weight[rank_expert[r]] = -routing.exponent * std::log(r + 1.0);
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens) * topk);
  if (routing.balanced) {
    // Pair i of the deal goes to expert i mod E: K consecutive pairs are K distinct experts (K <= E),
    // and every expert's count is within one of T*K/E. The token order is shuffled so that an
    // expert's tokens are scattered over x as a real router's are.
    std::vector<long long> token_order(static_cast<std::size_t>(tokens));
    std::iota(token_order.begin(), token_order.end(), 0LL);
    Rng rng(seed, 0);
    for (long long i = tokens - 1; i > 0; --i) std::swap(token_order[i], token_order[rng.next() % (i + 1)]);
    for (long long t = 0; t < tokens; ++t)
      for (int k = 0; k < topk; ++k) ids[token_order[t] * topk + k] = static_cast<std::int32_t>((t * topk + k) % experts);
    return ids;
  }
  constexpr long long kTokensPerTask = 1024;
  parallel_for((tokens + kTokensPerTask - 1) / kTokensPerTask, host_threads(), [&](std::size_t task) {
    Rng rng(seed, task);
    std::vector<double> key(experts);
    std::vector<std::int32_t> order(experts);
    const long long end = std::min<long long>(tokens, (task + 1) * kTokensPerTask);
    for (long long t = task * kTokensPerTask; t < end; ++t) {
      // Gumbel top-k: the K largest log(w) + Gumbel noise are a draw of K experts without
      // replacement, each next one picked with probability proportional to its weight.
      for (int e = 0; e < experts; ++e) key[e] = log_weight[e] - std::log(-std::log(rng.open_uniform()));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + topk, order.end(),
                        [&](std::int32_t a, std::int32_t b) { return key[a] > key[b]; });
      std::copy_n(order.begin(), topk, ids.begin() + t * topk);
    }
  });
  return ids;
}

int rotation_copies(std::size_t bytes_per_copy, long long l2_bytes) {
  const std::size_t needed = 3 * static_cast<std::size_t>(std::max(l2_bytes, 0LL));
  const std::size_t copies = needed / std::max<std::size_t>(bytes_per_copy, 1) + 1;
  return static_cast<int>(std::clamp<std::size_t>(copies, 2, 64));
}

StepInputs::StepInputs(const MoeProblem& p, const RoutingSpec& routing, long long l2_bytes, std::uint64_t seed) {
  const std::size_t rows = static_cast<std::size_t>(p.tokens) * p.hidden * 2;
  const std::size_t pairs = static_cast<std::size_t>(p.tokens) * p.topk;
  const int n = rotation_copies(2 * rows + pairs * (4 + 2), l2_bytes);
  for (int c = 0; c < n; ++c) {
    const std::uint64_t s = seed + 4 * static_cast<std::uint64_t>(c);
    fill_uniform(x.emplace_back(rows), p.dtype, -1.0, 1.0, s);
    const std::vector<std::int32_t> ids = routing_ids(p.tokens, p.experts, p.topk, routing, s + 1);
    topk_ids.emplace_back(ids.size() * 4).upload(ids.data(), ids.size() * 4);
    fill_uniform(topk_weights.emplace_back(pairs * 2), p.dtype, 0.05, 1.0, s + 2);
    fill_uniform(d_out.emplace_back(rows), p.dtype, -1.0, 1.0, s + 3);
  }
}

}  // namespace moejit::bench
