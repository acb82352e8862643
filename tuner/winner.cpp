#include "tuner/winner.hpp"

#include <algorithm>
#include <cmath>

namespace moejit {

namespace {

bool eligible(const db::CandidateResult& c) { return !c.rejected && std::isfinite(c.median_ms); }

}  // namespace

void order_for_budget(std::vector<TileConfig>& candidates, const std::optional<TileConfig>& incumbent) {
  if (candidates.size() < 3) return;
  const auto rank = [&](const TileConfig& c) {
    if (incumbent && c == *incumbent) return 0;
    return c.use_tma && c.warp_specialized ? 1 : 2;
  };
  std::stable_sort(candidates.begin() + 1, candidates.end(),
                   [&](const TileConfig& a, const TileConfig& b) { return rank(a) < rank(b); });
}

double budget_share_s(double left_s, std::size_t roles_left) {
  if (!(left_s > 0) || roles_left == 0) return 0;
  return left_s / static_cast<double>(roles_left);
}

std::vector<std::size_t> finalists(const std::vector<db::CandidateResult>& c,
                                   const std::optional<TileConfig>& incumbent) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (eligible(c[i])) order.push_back(i);
  }
  // Equal medians (event times come in 32 ns steps) go as choose_winner breaks ties, the
  // incumbent first, then the smaller config: the slots do not depend on the timing order.
  const auto is_incumbent = [&](std::size_t i) { return incumbent && c[i].config == *incumbent; };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (c[a].median_ms != c[b].median_ms) return c[a].median_ms < c[b].median_ms;
    if (is_incumbent(a) != is_incumbent(b)) return is_incumbent(a);
    return c[a].config.smaller_than(c[b].config);
  });
  if (order.empty()) return order;
  const double limit = c[order.front()].median_ms * (1.0 + kFinalistFraction);
  std::size_t n = 0;
  while (n < order.size() && n < kMaxFinalists && c[order[n]].median_ms <= limit) ++n;
  std::vector<std::size_t> out(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
  for (std::size_t k = n; incumbent && k < order.size() && c[order[k]].median_ms <= limit; ++k) {
    if (c[order[k]].config == *incumbent) out.push_back(order[k]);
  }
  return out;
}

std::optional<std::size_t> choose_winner(const std::vector<db::CandidateResult>& c,
                                         const std::vector<std::size_t>& among,
                                         const std::optional<TileConfig>& incumbent) {
  std::vector<db::CandidateResult> pool;
  for (std::size_t i : among) pool.push_back(c.at(i));
  const auto w = choose_winner(pool, incumbent);
  if (!w) return std::nullopt;
  return among[*w];
}

std::optional<std::size_t> choose_winner(const std::vector<db::CandidateResult>& c,
                                         const std::optional<TileConfig>& incumbent) {
  std::optional<std::size_t> fastest;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (eligible(c[i]) && (!fastest || c[i].median_ms < c[*fastest].median_ms)) fastest = i;
  }
  if (!fastest) return std::nullopt;
  const double limit = c[*fastest].median_ms * (1.0 + kTieFraction);
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (!eligible(c[i]) || c[i].median_ms > limit) continue;
    if (incumbent && c[i].config == *incumbent) return i;
    if (!best || c[i].config.smaller_than(c[*best].config)) best = i;
  }
  return best;
}

}  // namespace moejit
