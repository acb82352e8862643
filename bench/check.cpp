#include "check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "core/float16.hpp"
#include "core/parallel.hpp"
#include "moe/reference/moe_reference.hpp"
#include "moejit/error.hpp"

namespace moejit::bench {
namespace {

using Size = std::size_t;

// Pairs per reference call on a sampled expert's weight gradients: bounds the call's memory and
// spreads a popular expert over the host's cores.
constexpr Size kPairsPerPiece = 256;

// `count` distinct values of [0, n), all of them when n is fewer, ascending (Floyd's algorithm).
std::vector<long long> distinct(long long n, long long count, std::mt19937_64& rng) {
  std::set<long long> chosen;
  for (long long j = std::max(0LL, n - count); j < n; ++j) {
    const auto v = static_cast<long long>(rng() % static_cast<std::uint64_t>(j + 1));
    if (!chosen.insert(v).second) chosen.insert(j);
  }
  return {chosen.begin(), chosen.end()};
}

// 16-bit values widened: a piece widens millions of weights. bf16 is the top half of a float;
// fp16 is looked up, a fraction of a conversion call.
class Widen {
 public:
  explicit Widen(DType dtype) : bf16_(dtype == DType::kBF16) {
    if (bf16_) return;
    fp16_.resize(1 << 16);
    for (std::size_t bits = 0; bits < fp16_.size(); ++bits) {
      fp16_[bits] = fp16_to_float(static_cast<std::uint16_t>(bits));
    }
  }
  double operator()(std::uint16_t bits) const {
    return bf16_ ? std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16) : fp16_[bits];
  }

 private:
  bool bf16_;
  std::vector<float> fp16_;
};

// One reference call: `pairs` (flat pair ids) as tokens of K = 1 routed to `expert`, its weights
// cut to the intermediate `columns`. The block is a sum over pairs, and its backward a sum over
// columns i too (not the forward: y = act W2^T sums them before it is stored, rounded). So a
// token's out, dx and d_topk_weights are sums of pieces of its pairs with every column, and dW1
// rows i, I + i and dW2 column i sums of pieces of their expert's pairs with the sampled columns.
struct Piece {
  bool tokens = false;  // the sampled tokens' pairs of the expert (out, dx, d_topk_weights), else dW1, dW2
  int expert = 0;
  std::vector<int> columns;
  std::vector<Size> pairs;
  Size slot = 0;  // weight pieces: the expert's index in CheckSample::weights
};

struct PieceResult {
  std::vector<double> out, dx, d_topk_weights;  // per pair: [n, H], [n, H], [n]
  std::vector<double> dw1, dw2;                 // [2J, H]: rows j (gate) and J + j (up); [H, J]
  std::string error;
};

// `m` and `d_out` are the worker's, reused from piece to piece: fresh pages for every piece's
// weights cost as much as its arithmetic.
PieceResult run_piece(const MoeProblem& p, const Piece& piece, const HostInputs& in, const HostWeights& w,
                      const Widen& widen, reference::MoeTensors& m, std::vector<double>& d_out) {
  const DType dt = p.dtype;
  const Size H = p.hidden, I = p.intermediate, K = p.topk, J = piece.columns.size(), n = piece.pairs.size();
  m.tokens = static_cast<long long>(n);
  m.experts = 1;
  m.hidden = p.hidden;
  m.intermediate = static_cast<int>(J);
  m.topk = 1;
  m.x.resize(n * H);
  m.topk_ids.assign(n, 0);
  m.topk_weights.resize(n);
  d_out.resize(n * H);
  for (Size r = 0; r < n; ++r) {
    const Size pair = piece.pairs[r], t = pair / K;
    for (Size h = 0; h < H; ++h) {
      m.x[r * H + h] = widen(in.x[t * H + h]);
      d_out[r * H + h] = widen(in.d_out[t * H + h]);
    }
    m.topk_weights[r] = widen(in.topk_weights[pair]);
  }
  const std::uint16_t* w1 = w.w1.data() + static_cast<Size>(piece.expert) * 2 * I * H;
  const std::uint16_t* w2 = w.w2.data() + static_cast<Size>(piece.expert) * H * I;
  m.w1.resize(2 * J * H);
  for (Size j = 0; j < J; ++j) {
    const Size i = piece.columns[j];
    for (Size h = 0; h < H; ++h) {
      m.w1[j * H + h] = widen(w1[i * H + h]);
      m.w1[(J + j) * H + h] = widen(w1[(I + i) * H + h]);
    }
  }
  m.w2.resize(H * J);
  for (Size h = 0; h < H; ++h) {
    for (Size j = 0; j < J; ++j) m.w2[h * J + j] = widen(w2[h * I + piece.columns[j]]);
  }

  reference::ReferenceOptions options;
  options.round_stored = [dt](double v) { return round_to(dt, v); };
  options.threads = 1;  // the pieces run in parallel
  PieceResult r;
  if (piece.tokens) r.out = reference::moe_forward(m, options).out;
  reference::BackwardReference b = reference::moe_backward(m, d_out, options);
  if (piece.tokens) {
    r.dx = std::move(b.dx);
    r.d_topk_weights = std::move(b.d_topk_weights);
  } else {
    r.dw1 = std::move(b.dw1);
    r.dw2 = std::move(b.dw2);
  }
  return r;
}

std::vector<Piece> pieces_of(const MoeProblem& p, const CheckSample& sample, const std::vector<std::int32_t>& ids) {
  const Size K = p.topk;
  std::map<int, std::vector<Size>> sampled_pairs;  // by expert
  for (long long t : sample.tokens) {
    for (Size k = 0; k < K; ++k) {
      const Size pair = static_cast<Size>(t) * K + k;
      if (ids[pair] >= 0 && ids[pair] < p.experts) sampled_pairs[ids[pair]].push_back(pair);
    }
  }
  std::vector<int> every(p.intermediate);
  std::iota(every.begin(), every.end(), 0);
  std::vector<Piece> pieces;
  for (auto& [expert, pairs] : sampled_pairs) pieces.push_back({true, expert, every, std::move(pairs)});
  for (Size slot = 0; slot < sample.weights.size(); ++slot) {
    const CheckSample::Columns& c = sample.weights[slot];
    std::vector<Size> pairs;
    for (Size pair = 0; pair < ids.size(); ++pair) {
      if (ids[pair] == c.expert) pairs.push_back(pair);
    }
    for (Size from = 0; from < pairs.size(); from += kPairsPerPiece) {
      const auto begin = pairs.begin() + static_cast<std::ptrdiff_t>(from);
      const auto end = begin + static_cast<std::ptrdiff_t>(std::min(kPairsPerPiece, pairs.size() - from));
      pieces.push_back({false, c.expert, c.columns, {begin, end}, slot});
    }
  }
  return pieces;
}

// One output's sample: rows of `width` values, where(r) naming row r.
struct Output {
  const char* name;
  const std::vector<double>& got;
  const std::vector<double>& want;
  Size width;
  std::function<std::string(Size)> where;
  bool rows_judged;  // each row held to 3x the tolerance; else the whole sample only
};

void fail(CheckResult& result, std::string failure) {
  if (result.ok) result.failure = std::move(failure);
  result.ok = false;
}

void judge_output(const Output& o, double tolerance, CheckResult& result) {
  if (o.got.size() != o.want.size() || o.width == 0) {
    fail(result, fmt::format("{}: {} values read, {} expected", o.name, o.got.size(), o.want.size()));
    return;
  }
  const Size rows = o.want.size() / o.width;
  Size bad = 0, first = 0;
  for (Size i = 0; i < o.got.size(); ++i) {
    if (std::isfinite(o.got[i])) continue;
    if (bad++ == 0) first = i;
  }
  if (bad > 0) {
    result.max_rel_err = std::numeric_limits<double>::infinity();
    fail(result, fmt::format("{}: {} of {} sampled values not finite (poison never written over?), the first "
                             "at {}, element {}",
                             o.name, bad, o.got.size(), o.where(first / o.width), first % o.width));
    return;
  }
  double num = 0, den = 0;
  for (Size i = 0; i < o.got.size(); ++i) {
    num += (o.got[i] - o.want[i]) * (o.got[i] - o.want[i]);
    den += o.want[i] * o.want[i];
  }
  const double whole = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  double worst = 0;
  Size worst_row = 0;
  if (o.rows_judged) {
    // A row whose reference is zero or tiny (an expert without pairs) is held to the sample's scale.
    const double floor = 0.1 * std::sqrt(den / static_cast<double>(std::max<Size>(rows, 1)));
    for (Size r = 0; r < rows; ++r) {
      double rn = 0, rd = 0;
      for (Size i = r * o.width; i < (r + 1) * o.width; ++i) {
        rn += (o.got[i] - o.want[i]) * (o.got[i] - o.want[i]);
        rd += o.want[i] * o.want[i];
      }
      const double e = std::sqrt(rn) / (std::sqrt(rd) + floor + 1e-30);
      if (e > worst) {
        worst = e;
        worst_row = r;
      }
    }
  }
  result.max_rel_err = std::max(result.max_rel_err, o.rows_judged ? worst : whole);
  // A row first: where a skipped tile is says more than the whole sample's error it causes.
  if (worst > 3 * tolerance) {
    fail(result, fmt::format("{}: {} relative error {:.3g} > {:.3g}", o.name, o.where(worst_row), worst,
                             3 * tolerance));
  } else if (whole > tolerance) {
    fail(result, fmt::format("{}: relative L2 error {:.3g} over the sample > {:.3g}", o.name, whole, tolerance));
  }
}

}  // namespace

Checked checked_outputs(StepKind kind) {
  switch (kind) {
    case StepKind::kForward:
    case StepKind::kInference: return {false, false};
    case StepKind::kFrozen: return {true, false};
    case StepKind::kBackward:
    case StepKind::kFull:
    case StepKind::kMemEff: break;
  }
  return {true, true};
}

CheckSample choose_sample(const MoeProblem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  CheckSample s;
  s.tokens = distinct(p.tokens, kCheckTokens, rng);
  for (long long e : distinct(p.experts, kCheckExperts, rng)) {
    const std::vector<long long> columns = distinct(p.intermediate, kCheckColumns, rng);
    s.weights.push_back({static_cast<int>(e), {columns.begin(), columns.end()}});
  }
  return s;
}

SampledOutputs reference_outputs(const MoeProblem& p, const CheckSample& sample, const HostInputs& in,
                                 const HostWeights& w) {
  const Size H = p.hidden, K = p.topk, tokens = sample.tokens.size();
  const std::vector<Piece> pieces = pieces_of(p, sample, in.topk_ids);
  const Widen widen(p.dtype);
  std::vector<PieceResult> results(pieces.size());
  // A worker per core, each keeping its tensors' memory from piece to piece.
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<Size> next{0};
  parallel_for(workers, workers, [&](Size) {
    reference::MoeTensors m;
    std::vector<double> d_out;
    for (Size i = next++; i < pieces.size(); i = next++) {
      try {
        results[i] = run_piece(p, pieces[i], in, w, widen, m, d_out);
      } catch (const std::exception& e) {
        results[i].error = e.what();
      }
    }
  });

  // Each sampled expert's columns start at column_base[slot] of the (expert, i) list.
  std::vector<Size> column_base(sample.weights.size() + 1, 0);
  for (Size slot = 0; slot < sample.weights.size(); ++slot) {
    column_base[slot + 1] = column_base[slot] + sample.weights[slot].columns.size();
  }
  SampledOutputs want;
  want.out.assign(tokens * H, 0.0);
  want.dx.assign(tokens * H, 0.0);
  want.d_topk_weights.assign(tokens * K, 0.0);
  want.dw1.assign(column_base.back() * 2 * H, 0.0);
  want.dw2.assign(column_base.back() * H, 0.0);
  for (Size i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    const PieceResult& r = results[i];
    if (!r.error.empty()) throw InternalError("the check's reference failed: " + r.error);
    if (piece.tokens) {
      for (Size q = 0; q < piece.pairs.size(); ++q) {
        const Size pair = piece.pairs[q];
        const auto t = static_cast<long long>(pair / K);
        const Size row = static_cast<Size>(std::lower_bound(sample.tokens.begin(), sample.tokens.end(), t) -
                                           sample.tokens.begin());
        for (Size h = 0; h < H; ++h) {
          want.out[row * H + h] += r.out[q * H + h];
          want.dx[row * H + h] += r.dx[q * H + h];
        }
        want.d_topk_weights[row * K + pair % K] = r.d_topk_weights[q];
      }
      continue;
    }
    const Size J = piece.columns.size();
    for (Size j = 0; j < J; ++j) {
      const Size c = column_base[piece.slot] + j;
      for (Size h = 0; h < H; ++h) {
        want.dw1[(2 * c) * H + h] += r.dw1[j * H + h];
        want.dw1[(2 * c + 1) * H + h] += r.dw1[(J + j) * H + h];
        want.dw2[c * H + h] += r.dw2[h * J + j];
      }
    }
  }
  return want;
}

double check_tolerance(DType dtype) { return dtype == DType::kFP16 ? 0.5e-2 : 1e-2; }

CheckResult judge(const MoeProblem& p, Checked what, const CheckSample& sample, const SampledOutputs& got,
                  const SampledOutputs& want) {
  const double tolerance = check_tolerance(p.dtype);
  const auto token = [&](Size row) { return fmt::format("token {}", sample.tokens.at(row)); };
  // The (expert, i) of each sampled column, in SampledOutputs' order.
  std::vector<std::pair<int, int>> columns;
  for (const CheckSample::Columns& c : sample.weights) {
    for (int i : c.columns) columns.emplace_back(c.expert, i);
  }
  CheckResult result;
  judge_output({"out", got.out, want.out, static_cast<Size>(p.hidden), token, true}, tolerance, result);
  if (what.backward) {
    judge_output({"dx", got.dx, want.dx, static_cast<Size>(p.hidden), token, true}, tolerance, result);
    judge_output({"d_topk_weights", got.d_topk_weights, want.d_topk_weights, static_cast<Size>(p.topk), token, false},
                 tolerance, result);
  }
  if (what.weight_gradients) {
    judge_output({"dW1", got.dw1, want.dw1, static_cast<Size>(p.hidden),
                  [&](Size row) {
                    const auto [e, i] = columns.at(row / 2);
                    return row % 2 == 0 ? fmt::format("expert {} row {} (gate)", e, i)
                                        : fmt::format("expert {} row {} (up)", e, p.intermediate + i);
                  },
                  true},
                 tolerance, result);
    judge_output({"dW2", got.dw2, want.dw2, static_cast<Size>(p.hidden),
                  [&](Size row) {
                    const auto [e, i] = columns.at(row);
                    return fmt::format("expert {} column {}", e, i);
                  },
                  true},
                 tolerance, result);
  }
  return result;
}

}  // namespace moejit::bench
