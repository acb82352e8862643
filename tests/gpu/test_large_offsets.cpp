// A case whose token tensors [T, H] and sorted-row tensors [T*K, H], [T*K, 2I], [T*K, I] all run
// past 2^31 elements (the sorted rows past 2^32), against the fp64 reference on sampled tokens.
// 32-bit index arithmetic anywhere on the way, kernel or host, shows as wrong rows, poison left
// in place or a launch failure. The host never holds the case in doubles (18 GB per [T, H]
// tensor): inputs are hashed straight into storage bits, and only the sampled tokens are read
// back and recomputed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "core/float16.hpp"
#include "core/parallel.hpp"
#include "support/gpu.hpp"
#include "support/kernel_paths.hpp"
#include "support/moe_case.hpp"

using namespace moejit;
using namespace moejit::test;

namespace {

constexpr double kTolerance = 1e-2;

// splitmix64's finaliser: value i of a stream depends on (seed, i) alone, so any thread can fill
// any block of it.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double uniform(std::uint64_t seed, std::uint64_t i, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(mix(seed ^ mix(i)) >> 11) * 0x1.0p-53;
}

unsigned workers() { return std::max(1u, std::thread::hardware_concurrency()); }

std::vector<std::uint16_t> hashed_bf16(std::size_t n, double lo, double hi, std::uint64_t seed) {
  std::vector<std::uint16_t> v(n);
  constexpr std::size_t kBlock = std::size_t{1} << 20;
  parallel_for((n + kBlock - 1) / kBlock, workers(), [&](std::size_t b) {
    for (std::size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      v[i] = float_to_bf16(static_cast<float>(uniform(seed, i, lo, hi)));
    }
  });
  return v;
}

std::vector<double> widened(const std::vector<std::uint16_t>& bits, std::size_t first, std::size_t count) {
  return from_storage(DType::kBF16, std::vector<std::uint16_t>(bits.begin() + first, bits.begin() + first + count));
}

// The GPU's outputs for the sampled tokens, row after row in the order of `tokens`.
struct Sampled {
  std::vector<double> out, dx, ds, dw1_last, dw2_last;
};

Sampled run_sampled(const StoredInputs& in, const CaseSpec& s, Mode mode, const Options& options,
                    const std::vector<long long>& tokens) {
  FusedMoe plan({s.tokens, s.experts, s.hidden, s.intermediate, s.topk, s.dtype, mode}, options);
  DeviceRun run(in, plan.memory());
  cuda::Stream stream;
  plan.forward(run.forward_args(stream.get()));
  plan.backward(run.backward_args(stream.get()));
  stream.synchronize();

  const std::size_t H = s.hidden, I = s.intermediate, K = s.topk, last = s.experts - 1;
  Sampled o;
  const std::vector<double> ds = download(run.d_weights, s.dtype, s.tokens * K);
  for (long long t : tokens) {
    const auto row = download(run.out, s.dtype, H, t * H * 2);
    o.out.insert(o.out.end(), row.begin(), row.end());
    const auto drow = download(run.dx, s.dtype, H, t * H * 2);
    o.dx.insert(o.dx.end(), drow.begin(), drow.end());
    o.ds.insert(o.ds.end(), ds.begin() + t * K, ds.begin() + (t + 1) * K);
  }
  o.dw1_last = download(run.dw1, s.dtype, 2 * I * H, last * 2 * I * H * 2);
  o.dw2_last = download(run.dw2, s.dtype, H * I, last * H * I * 2);
  return o;
}

// rel_l2 over the rows [first, first + count) of two row-major sets of `width` columns.
double rel_l2_rows(const std::vector<double>& got, const std::vector<double>& want, std::size_t first,
                   std::size_t count, std::size_t width) {
  const auto slice = [&](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + first * width, v.begin() + (first + count) * width);
  };
  return rel_l2(slice(got), slice(want));
}

}  // namespace

TEST_CASE("offsets past 2^32 elements: T = 2^24 + 3, K = 2, sampled tokens against the reference",
          "[gpu][moe][large]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const CaseSpec spec{(1LL << 24) + 3, 4, 136, 72, 2};
  const long long T = spec.tokens;
  const std::size_t H = spec.hidden, I = spec.intermediate, E = spec.experts, K = spec.topk;
  REQUIRE(static_cast<std::size_t>(T) * H > (std::size_t{1} << 31));
  REQUIRE(T * K * I > (std::size_t{1} << 31));
  REQUIRE(T * K * H > (std::size_t{1} << 32));

  // The last expert takes slot 1 of every 4096th token and of the last 8: few pairs, so its
  // weight gradients are checked whole, and they sort after every other pair, at the sorted
  // tensors' highest offsets. The bulk spreads over the other experts; their weight gradients
  // (sums over 11 M pairs each) are left out, their rows are checked through the sampled tokens.
  const auto to_last = [&](long long t) { return t % 4096 == 4095 || t >= T - 8; };
  StoredInputs in;
  in.x = hashed_bf16(T * H, -1.0, 1.0, 1);
  in.d_out = hashed_bf16(T * H, -1.0, 1.0, 2);
  in.w1 = hashed_bf16(E * 2 * I * H, -2.0 / std::sqrt(double(H)), 2.0 / std::sqrt(double(H)), 3);
  in.w2 = hashed_bf16(E * H * I, -2.0 / std::sqrt(double(I)), 2.0 / std::sqrt(double(I)), 4);
  in.topk_weights = hashed_bf16(T * K, 0.05, 1.0, 5);
  in.topk_ids.resize(T * K);
  parallel_for(T, workers(), [&](std::size_t t) {
    const std::uint64_t h = mix(t ^ 0x5eed);
    const int bulk = static_cast<int>(E - 1);  // experts 0 .. E - 2
    const int first = static_cast<int>(h % bulk);
    const int second = (first + 1 + static_cast<int>((h >> 32) % (bulk - 1))) % bulk;  // distinct from first
    in.topk_ids[t * K] = first;
    in.topk_ids[t * K + 1] = to_last(t) ? bulk : second;
  });

  // Every token of the last expert, and a spread of bulk tokens; those past 2^31 / H sit where
  // x, out and dx run past 2^31 elements.
  std::set<long long> chosen = {0};
  for (long long t = 0; t < T; ++t) {
    if (to_last(t)) chosen.insert(t);
  }
  for (long long i = 0; i < 1024; ++i) chosen.insert((i * 16381 + 7) * 1021 % T);
  const std::vector<long long> tokens(chosen.begin(), chosen.end());
  const long long high_first_token = (1LL << 31) / static_cast<long long>(H) + 1;
  const std::size_t high = std::distance(tokens.begin(), std::lower_bound(tokens.begin(), tokens.end(), high_first_token));
  const std::size_t n = tokens.size();
  INFO(n << " sampled tokens, " << n - high << " of them past 2^31 elements of x");
  REQUIRE(n - high >= 256);

  reference::MoeTensors sub;
  sub.tokens = static_cast<long long>(n);
  sub.experts = spec.experts;
  sub.hidden = spec.hidden;
  sub.intermediate = spec.intermediate;
  sub.topk = spec.topk;
  sub.w1 = widened(in.w1, 0, in.w1.size());
  sub.w2 = widened(in.w2, 0, in.w2.size());
  std::vector<double> d_out;
  for (long long t : tokens) {
    const auto x = widened(in.x, t * H, H), g = widened(in.d_out, t * H, H), s = widened(in.topk_weights, t * K, K);
    sub.x.insert(sub.x.end(), x.begin(), x.end());
    d_out.insert(d_out.end(), g.begin(), g.end());
    sub.topk_weights.insert(sub.topk_weights.end(), s.begin(), s.end());
    sub.topk_ids.insert(sub.topk_ids.end(), in.topk_ids.begin() + t * K, in.topk_ids.begin() + (t + 1) * K);
  }
  reference::ReferenceOptions opt;
  opt.round_stored = [](double v) { return round_to(DType::kBF16, v); };
  const auto fwd = reference::moe_forward(sub, opt);
  const auto bwd = reference::moe_backward(sub, d_out, opt);
  // The sample holds every pair of the last expert, so its weight gradients are the whole case's.
  const std::vector<double> dw1_last(bwd.dw1.begin() + (E - 1) * 2 * I * H, bwd.dw1.end());
  const std::vector<double> dw2_last(bwd.dw2.begin() + (E - 1) * H * I, bwd.dw2.end());

  struct Rows {
    std::size_t first, count;
    const char* what;
  };
  const Rows groups[] = {{0, n, "all sampled tokens"}, {high, n - high, "tokens past 2^31 elements of x"}};
  const auto check = [&](const Sampled& got) {
    for (const Rows& g : groups) {
      INFO(g.what);
      CHECK(rel_l2_rows(got.out, fwd.out, g.first, g.count, H) <= kTolerance);
      CHECK(rel_l2_rows(got.dx, bwd.dx, g.first, g.count, H) <= kTolerance);
      CHECK(rel_l2_rows(got.ds, bwd.d_topk_weights, g.first, g.count, K) <= kTolerance);
    }
    CHECK(rel_l2(got.dw1_last, dw1_last) <= kTolerance);
    CHECK(rel_l2(got.dw2_last, dw2_last) <= kTolerance);
  };
  const auto paths = kernel_paths(spec, gpu->info);
  for (const auto& [path, options] : paths) {
    INFO("path: " << path);
    check(run_sampled(in, spec, Mode::kTraining, options, tokens));
  }
  INFO("memory-efficient mode, " << paths[0].first);
  check(run_sampled(in, spec, Mode::kMemoryEfficient, paths[0].second, tokens));
}
