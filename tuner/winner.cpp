#include "tuner/winner.hpp"

#include <cmath>

namespace moejit {

std::optional<std::size_t> choose_winner(const std::vector<db::CandidateResult>& c,
                                         const std::optional<TileConfig>& incumbent) {
  auto eligible = [&](std::size_t i) { return !c[i].rejected && std::isfinite(c[i].median_ms); };
  std::optional<std::size_t> fastest;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (eligible(i) && (!fastest || c[i].median_ms < c[*fastest].median_ms)) fastest = i;
  }
  if (!fastest) return std::nullopt;
  const double limit = c[*fastest].median_ms * (1.0 + kTieFraction);
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (!eligible(i) || c[i].median_ms > limit) continue;
    if (incumbent && c[i].config == *incumbent) return i;
    if (!best || c[i].config.smaller_than(c[*best].config)) best = i;
  }
  return best;
}

}  // namespace moejit
