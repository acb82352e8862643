#include "moe/reference/moe_reference.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "core/parallel.hpp"
#include "moejit/error.hpp"

namespace moejit::reference {
namespace {

using Size = std::size_t;

// Work is expert-major, like the GPU's grouped GEMMs: every item streams one block of one
// expert's weights once for all of that expert's pairs. Token-major loops would re-read K
// experts' weights per token (hundreds of MB at Qwen3-30B-A3B sizes). The block sizes are fixed,
// so each output element sums in the same order whatever the thread count.
constexpr Size kDotRows = 32;    // weight rows per item when each output is a row dot product
constexpr Size kAxpyCols = 128;  // output columns per item when outputs accumulate scaled rows
constexpr Size kOuterRows = 16;  // weight-gradient rows per item

struct Dims {
  Size tokens, experts, hidden, inter, topk, pairs;
};

void check_size(const char* field, Size actual, Size expected, const char* formula) {
  if (actual != expected) {
    throw InvalidArgument(field, fmt::format("has {} values, {} = {}", actual, formula, expected));
  }
}

Dims validate(const MoeTensors& m) {
  if (m.tokens < 0) throw InvalidArgument("tokens", fmt::format("must be >= 0, got {}", m.tokens));
  auto positive = [](const char* field, int v) {
    if (v < 1) throw InvalidArgument(field, fmt::format("must be >= 1, got {}", v));
  };
  positive("experts", m.experts);
  positive("hidden", m.hidden);
  positive("intermediate", m.intermediate);
  positive("topk", m.topk);
  const Dims d{static_cast<Size>(m.tokens), static_cast<Size>(m.experts), static_cast<Size>(m.hidden),
               static_cast<Size>(m.intermediate), static_cast<Size>(m.topk),
               static_cast<Size>(m.tokens) * static_cast<Size>(m.topk)};
  check_size("x", m.x.size(), d.tokens * d.hidden, "tokens*hidden");
  check_size("w1", m.w1.size(), d.experts * 2 * d.inter * d.hidden, "experts*2*intermediate*hidden");
  check_size("w2", m.w2.size(), d.experts * d.hidden * d.inter, "experts*hidden*intermediate");
  check_size("topk_ids", m.topk_ids.size(), d.pairs, "tokens*topk");
  check_size("topk_weights", m.topk_weights.size(), d.pairs, "tokens*topk");
  return d;
}

unsigned worker_count(const ReferenceOptions& o) {
  return o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
}

// Flat pairs routed to each expert, ascending; dropped pairs are in no list.
std::vector<std::vector<Size>> pairs_by_expert(const MoeTensors& m, const Dims& d) {
  std::vector<std::vector<Size>> groups(d.experts);
  for (Size p = 0; p < d.pairs; ++p) {
    const std::int32_t e = m.topk_ids[p];
    if (e >= 0 && static_cast<Size>(e) < d.experts) groups[e].push_back(p);
  }
  return groups;
}

bool routed(const MoeTensors& m, Size p) { return m.topk_ids[p] >= 0 && m.topk_ids[p] < m.experts; }

// Calls fn(e, c0, c1) for every expert that has pairs and every block [c0, c1) of `cols`.
template <class Fn>
void for_expert_blocks(const std::vector<std::vector<Size>>& groups, Size cols, Size block, unsigned workers,
                       const Fn& fn) {
  std::vector<std::pair<Size, Size>> items;
  for (Size e = 0; e < groups.size(); ++e) {
    if (groups[e].empty()) continue;
    for (Size c0 = 0; c0 < cols; c0 += block) items.emplace_back(e, c0);
  }
  parallel_for(items.size(), workers, [&](Size i) {
    const auto [e, c0] = items[i];
    fn(e, c0, std::min(c0 + block, cols));
  });
}

// Four independent partial sums break the add dependency chain and let the compiler vectorise.
double dot(const double* a, const double* b, Size n) {
  double acc[4] = {0, 0, 0, 0};
  Size i = 0;
  for (; i + 4 <= n; i += 4) {
    for (Size r = 0; r < 4; ++r) acc[r] += a[i + r] * b[i + r];
  }
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// out[0, n) += sum over r < count of coef[r] * rows[r][0, n), count <= 4. Folding four rows into
// one pass over out cuts its loads and stores fourfold.
void add_scaled_rows(double* out, Size n, const double* const* rows, const double* coef, Size count) {
  if (count == 4) {
    const double *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
    const double c0 = coef[0], c1 = coef[1], c2 = coef[2], c3 = coef[3];
    for (Size i = 0; i < n; ++i) out[i] += c0 * r0[i] + c1 * r1[i] + c2 * r2[i] + c3 * r3[i];
    return;
  }
  for (Size r = 0; r < count; ++r) {
    for (Size i = 0; i < n; ++i) out[i] += coef[r] * rows[r][i];
  }
}

// For the pairs of one expert: out[p][c] = in(p) . m[c] for c in [c0, c1); m is [*, len].
template <class In>
void rows_dot_matrix_rows(const std::vector<Size>& pairs, const In& in, const double* m, Size len, double* out,
                          Size ld_out, Size c0, Size c1) {
  for (Size c = c0; c < c1; ++c) {
    for (Size p : pairs) out[p * ld_out + c] = dot(in(p), m + c * len, len);
  }
}

// For the pairs of one expert: out[p][c0, c1) = in(p) m[:, c0..c1); m is [len, ld_m].
template <class In>
void rows_times_matrix(const std::vector<Size>& pairs, const In& in, const double* m, Size len, Size ld_m,
                       double* out, Size ld_out, Size c0, Size c1) {
  for (Size k = 0; k < len; k += 4) {
    const Size count = std::min<Size>(4, len - k);
    const double* rows[4];
    for (Size r = 0; r < count; ++r) rows[r] = m + (k + r) * ld_m + c0;
    for (Size p : pairs) add_scaled_rows(out + p * ld_out + c0, c1 - c0, rows, in(p) + k, count);
  }
}

// For one expert's weight gradient g [*, len]: g[c] += sum_p a(p)[c] * b(p) for c in [c0, c1).
template <class A, class B>
void accumulate_outer(const std::vector<Size>& pairs, const A& a, const B& b, double* g, Size len, Size c0,
                      Size c1) {
  for (Size c = c0; c < c1; ++c) {
    for (Size i = 0; i < pairs.size(); i += 4) {
      const Size count = std::min<Size>(4, pairs.size() - i);
      const double* rows[4];
      double coef[4];
      for (Size r = 0; r < count; ++r) {
        rows[r] = b(pairs[i + r]);
        coef[r] = a(pairs[i + r])[c];
      }
      add_scaled_rows(g + c * len, len, rows, coef, count);
    }
  }
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu(double v) { return v * sigmoid(v); }

class Stored {
 public:
  explicit Stored(const ReferenceOptions& o) : round_(o.round_stored) {}
  double operator()(double v) const { return round_ ? round_(v) : v; }
  void apply(double* values, Size n) const {
    if (!round_) return;
    for (Size i = 0; i < n; ++i) values[i] = round_(values[i]);
  }

 private:
  const std::function<double(double)>& round_;
};

// pre_act = x[t] W1[e]^T per routed pair, unrounded.
std::vector<double> up_projection(const MoeTensors& m, const Dims& d, const std::vector<std::vector<Size>>& groups,
                                  unsigned workers) {
  const Size two_i = 2 * d.inter;
  std::vector<double> pre(d.pairs * two_i);
  auto x_row = [&](Size p) { return m.x.data() + (p / d.topk) * d.hidden; };
  for_expert_blocks(groups, two_i, kDotRows, workers, [&](Size e, Size c0, Size c1) {
    rows_dot_matrix_rows(groups[e], x_row, m.w1.data() + e * two_i * d.hidden, d.hidden, pre.data(), two_i, c0,
                         c1);
  });
  return pre;
}

}  // namespace

ForwardReference moe_forward(const MoeTensors& m, const ReferenceOptions& options) {
  const Dims d = validate(m);
  const unsigned workers = worker_count(options);
  const Stored stored(options);
  const auto groups = pairs_by_expert(m, d);
  const Size two_i = 2 * d.inter;

  ForwardReference f;
  f.pre_act = up_projection(m, d, groups, workers);
  f.act.assign(d.pairs * d.inter, 0.0);
  // The GPU's SwiGLU epilogue reads the fp32 accumulators, so act uses g, u before rounding.
  parallel_for(d.pairs, workers, [&](Size p) {
    double* pre = f.pre_act.data() + p * two_i;
    double* act = f.act.data() + p * d.inter;
    for (Size i = 0; i < d.inter; ++i) act[i] = stored(silu(pre[i]) * pre[d.inter + i]);
    stored.apply(pre, two_i);
  });

  f.y.assign(d.pairs * d.hidden, 0.0);
  auto act_row = [&](Size p) { return f.act.data() + p * d.inter; };
  for_expert_blocks(groups, d.hidden, kDotRows, workers, [&](Size e, Size c0, Size c1) {
    rows_dot_matrix_rows(groups[e], act_row, m.w2.data() + e * d.hidden * d.inter, d.inter, f.y.data(), d.hidden,
                         c0, c1);
  });

  f.out.assign(d.tokens * d.hidden, 0.0);
  parallel_for(d.tokens, workers, [&](Size t) {
    double* out = f.out.data() + t * d.hidden;
    for (Size p = t * d.topk; p < (t + 1) * d.topk; ++p) {
      if (!routed(m, p)) continue;
      double* y = f.y.data() + p * d.hidden;
      stored.apply(y, d.hidden);
      const double s = m.topk_weights[p];
      for (Size h = 0; h < d.hidden; ++h) out[h] += s * y[h];
    }
  });
  return f;
}

BackwardReference moe_backward(const MoeTensors& m, const std::vector<double>& d_out,
                               const ReferenceOptions& options) {
  const Dims d = validate(m);
  check_size("d_out", d_out.size(), d.tokens * d.hidden, "tokens*hidden");
  const unsigned workers = worker_count(options);
  const Stored stored(options);
  const auto groups = pairs_by_expert(m, d);
  const Size two_i = 2 * d.inter;

  // Recompute act as the GPU's backward does: from the stored (rounded) pre-activations.
  std::vector<double> pre = up_projection(m, d, groups, workers);
  std::vector<double> act(d.pairs * d.inter);
  parallel_for(d.pairs, workers, [&](Size p) {
    double* g = pre.data() + p * two_i;
    stored.apply(g, two_i);
    for (Size i = 0; i < d.inter; ++i) act[p * d.inter + i] = stored(silu(g[i]) * g[d.inter + i]);
  });

  BackwardReference b;
  b.d_act.assign(d.pairs * d.inter, 0.0);
  auto d_out_row = [&](Size p) { return d_out.data() + (p / d.topk) * d.hidden; };
  for_expert_blocks(groups, d.inter, kAxpyCols, workers, [&](Size e, Size c0, Size c1) {
    rows_times_matrix(groups[e], d_out_row, m.w2.data() + e * d.hidden * d.inter, d.hidden, d.inter,
                      b.d_act.data(), d.inter, c0, c1);
  });

  b.d_topk_weights.assign(d.pairs, 0.0);
  b.d_pre_act.assign(d.pairs * two_i, 0.0);
  b.weighted_act.assign(d.pairs * d.inter, 0.0);
  parallel_for(d.pairs, workers, [&](Size p) {
    if (!routed(m, p)) return;
    const double s = m.topk_weights[p];
    const double* g = pre.data() + p * two_i;
    const double* u = g + d.inter;
    const double* da = b.d_act.data() + p * d.inter;
    const double* a = act.data() + p * d.inter;
    double* dg = b.d_pre_act.data() + p * two_i;
    double* du = dg + d.inter;
    double* wa = b.weighted_act.data() + p * d.inter;
    double ds = 0;
    for (Size i = 0; i < d.inter; ++i) {
      ds += da[i] * a[i];
      const double sig = sigmoid(g[i]);
      const double scaled = s * da[i];
      du[i] = stored(scaled * g[i] * sig);
      dg[i] = stored(scaled * u[i] * sig * (1 + g[i] * (1 - sig)));
      wa[i] = stored(s * a[i]);
    }
    b.d_topk_weights[p] = ds;
  });

  // dx: one product per pair with all 2I rows of W1[e], then summed per token.
  std::vector<double> dx_pair(d.pairs * d.hidden, 0.0);
  auto d_pre_row = [&](Size p) { return b.d_pre_act.data() + p * two_i; };
  for_expert_blocks(groups, d.hidden, kAxpyCols, workers, [&](Size e, Size c0, Size c1) {
    rows_times_matrix(groups[e], d_pre_row, m.w1.data() + e * two_i * d.hidden, two_i, d.hidden, dx_pair.data(),
                      d.hidden, c0, c1);
  });
  b.dx.assign(d.tokens * d.hidden, 0.0);
  parallel_for(d.tokens, workers, [&](Size t) {
    double* dx = b.dx.data() + t * d.hidden;
    for (Size p = t * d.topk; p < (t + 1) * d.topk; ++p) {
      if (!routed(m, p)) continue;
      const double* part = dx_pair.data() + p * d.hidden;
      for (Size h = 0; h < d.hidden; ++h) dx[h] += part[h];
    }
  });

  // Weight gradients: each item owns a block of rows of one expert's slice; empty experts stay 0.
  b.dw2.assign(m.w2.size(), 0.0);
  auto weighted_act_row = [&](Size p) { return b.weighted_act.data() + p * d.inter; };
  for_expert_blocks(groups, d.hidden, kOuterRows, workers, [&](Size e, Size c0, Size c1) {
    accumulate_outer(groups[e], d_out_row, weighted_act_row, b.dw2.data() + e * d.hidden * d.inter, d.inter, c0,
                     c1);
  });
  b.dw1.assign(m.w1.size(), 0.0);
  auto x_row = [&](Size p) { return m.x.data() + (p / d.topk) * d.hidden; };
  for_expert_blocks(groups, two_i, kOuterRows, workers, [&](Size e, Size c0, Size c1) {
    accumulate_outer(groups[e], d_pre_row, x_row, b.dw1.data() + e * two_i * d.hidden, d.hidden, c0, c1);
  });
  return b;
}

}  // namespace moejit::reference
