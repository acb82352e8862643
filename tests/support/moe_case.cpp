#include "support/moe_case.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace moejit::test {

std::string describe(const CaseSpec& c) {
  static const char* routings[] = {"random", "one-expert", "even-experts", "skewed"};
  std::string text = fmt::format("T={} E={} H={} I={} K={} {} {}", c.tokens, c.experts, c.hidden, c.intermediate,
                                 c.topk, dtype_name(c.dtype), routings[static_cast<int>(c.routing)]);
  if (!c.empty_experts.empty()) text += fmt::format(", experts {} empty", fmt::join(c.empty_experts, ","));
  return text;
}

CaseData make_case(const CaseSpec& s) {
  CaseData d;
  d.spec = s;
  auto& t = d.tensors;
  t.tokens = s.tokens;
  t.experts = s.experts;
  t.hidden = s.hidden;
  t.intermediate = s.intermediate;
  t.topk = s.topk;
  std::mt19937 rng(s.seed);
  auto fill = [&](std::vector<double>& v, std::size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    v.resize(n);
    for (auto& x : v) x = round_to(s.dtype, u(rng));
  };
  const std::size_t T = s.tokens, E = s.experts, H = s.hidden, I = s.intermediate, K = s.topk;
  fill(t.x, T * H, -1.0, 1.0);
  fill(t.w1, E * 2 * I * H, -2.0 / std::sqrt(double(H)), 2.0 / std::sqrt(double(H)));
  fill(t.w2, E * H * I, -2.0 / std::sqrt(double(I)), 2.0 / std::sqrt(double(I)));
  fill(t.topk_weights, T * K, 0.05, 1.0);
  fill(d.d_out, T * H, -1.0, 1.0);
  t.topk_ids.resize(T * K);
  std::vector<int> perm(E);
  for (std::size_t e = 0; e < E; ++e) perm[e] = static_cast<int>(e);
  if (s.routing == Routing::kSkewed) {
    std::shuffle(perm.begin(), perm.end(), rng);  // perm[e]: expert e's popularity rank
    std::uniform_real_distribution<double> open(1e-300, 1.0);
    std::vector<std::pair<double, int>> key(E);
    for (std::size_t tok = 0; tok < T; ++tok) {
      // Gumbel top-k: the K largest log-weights plus Gumbel noise, a draw without replacement.
      for (std::size_t e = 0; e < E; ++e) {
        key[e] = {-1.5 * std::log(perm[e] + 1.0) - std::log(-std::log(open(rng))), static_cast<int>(e)};
      }
      std::partial_sort(key.begin(), key.begin() + K, key.end(), std::greater<>());
      for (std::size_t k = 0; k < K; ++k) t.topk_ids[tok * K + k] = key[k].second;
    }
    return d;
  }
  std::erase_if(perm, [&](int e) {
    return std::find(s.empty_experts.begin(), s.empty_experts.end(), e) != s.empty_experts.end();
  });
  if (perm.size() < K) throw std::invalid_argument(fmt::format("{}: fewer than K experts left", describe(s)));
  for (std::size_t tok = 0; tok < T; ++tok) {
    for (std::size_t k = 0; k < K; ++k) {
      std::uniform_int_distribution<std::size_t> pick(k, perm.size() - 1);
      std::swap(perm[k], perm[pick(rng)]);
      int e = perm[k];
      if (s.routing == Routing::kOneExpert) e = static_cast<int>(E / 2);
      if (s.routing == Routing::kEvenExpertsOnly) e = (e / 2) * 2;
      t.topk_ids[tok * K + k] = e;
    }
  }
  return d;
}

StoredInputs stored_inputs(const CaseData& d) {
  const DType dt = d.spec.dtype;
  return {to_storage(dt, d.tensors.x),           to_storage(dt, d.tensors.w1), to_storage(dt, d.tensors.w2),
          to_storage(dt, d.tensors.topk_weights), to_storage(dt, d.d_out),      d.tensors.topk_ids};
}

namespace {

template <typename V>
cuda::DeviceBuffer upload(const std::vector<V>& v) {
  cuda::DeviceBuffer b(std::max<std::size_t>(v.size() * sizeof(V), 2));
  b.upload(v.data(), v.size() * sizeof(V));
  return b;
}

cuda::DeviceBuffer alloc(std::size_t bytes) { return cuda::DeviceBuffer(std::max<std::size_t>(bytes, 256)); }

}  // namespace

DeviceRun::DeviceRun(const CaseData& d, const MemoryPlan& m) : DeviceRun(stored_inputs(d), m) {}

DeviceRun::DeviceRun(const StoredInputs& in, const MemoryPlan& m) {
  x = upload(in.x);
  w1 = upload(in.w1);
  w2 = upload(in.w2);
  weights = upload(in.topk_weights);
  d_out = upload(in.d_out);
  ids = upload(in.topk_ids);
  out = alloc(in.x.size() * 2);
  dx = alloc(in.x.size() * 2);
  dw1 = alloc(in.w1.size() * 2);
  dw2 = alloc(in.w2.size() * 2);
  d_weights = alloc(in.topk_weights.size() * 2);
  saved = alloc(m.saved_bytes);
  fwd_ws = alloc(m.forward_workspace_bytes);
  bwd_ws = alloc(m.backward_workspace_bytes);
  poison();
}

void DeviceRun::upload_inputs(const CaseData& d) {
  const StoredInputs in = stored_inputs(d);
  x.upload(in.x.data(), in.x.size() * 2);
  w1.upload(in.w1.data(), in.w1.size() * 2);
  w2.upload(in.w2.data(), in.w2.size() * 2);
  weights.upload(in.topk_weights.data(), in.topk_weights.size() * 2);
  d_out.upload(in.d_out.data(), in.d_out.size() * 2);
  ids.upload(in.topk_ids.data(), in.topk_ids.size() * 4);
}

void DeviceRun::poison() {
  for (auto* b : {&out, &dx, &dw1, &dw2, &d_weights, &saved, &fwd_ws, &bwd_ws}) b->fill_bytes(0xff);
}

ForwardArgs DeviceRun::forward_args(CUstream stream) const {
  ForwardArgs a;
  a.x = x.as<void>();
  a.w1 = w1.as<void>();
  a.w2 = w2.as<void>();
  a.topk_ids = ids.as<std::int32_t>();
  a.topk_weights = weights.as<void>();
  a.out = out.as<void>();
  a.saved = saved.as<void>();
  a.saved_bytes = saved.bytes();
  a.workspace = fwd_ws.as<void>();
  a.workspace_bytes = fwd_ws.bytes();
  a.stream = stream;
  return a;
}

BackwardArgs DeviceRun::backward_args(CUstream stream) const {
  BackwardArgs a;
  a.d_out = d_out.as<void>();
  a.x = x.as<void>();
  a.w1 = w1.as<void>();
  a.w2 = w2.as<void>();
  a.topk_ids = ids.as<std::int32_t>();
  a.topk_weights = weights.as<void>();
  a.saved = saved.as<void>();
  a.saved_bytes = saved.bytes();
  a.dx = dx.as<void>();
  a.dw1 = dw1.as<void>();
  a.dw2 = dw2.as<void>();
  a.d_topk_weights = d_weights.as<void>();
  a.workspace = bwd_ws.as<void>();
  a.workspace_bytes = bwd_ws.bytes();
  a.stream = stream;
  return a;
}

std::vector<double> download(const cuda::DeviceBuffer& b, DType dtype, std::size_t count, std::size_t offset) {
  std::vector<std::uint16_t> bits(count);
  b.download(bits.data(), count * 2, offset);
  return from_storage(dtype, bits);
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace moejit::test
