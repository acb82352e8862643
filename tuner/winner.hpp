// Choosing the winner among timed candidates: pure, so the tie-break is unit-tested.
#pragma once

#include <optional>
#include <vector>

#include "db/tuning_row.hpp"

namespace moejit {

// Candidates within this fraction of the fastest median are ties (CUDA-event medians of the
// same kernel vary by about 1% between runs).
inline constexpr double kTieFraction = 0.02;

// Index of the winner among candidates that were timed and not rejected: the fastest median,
// except that among ties the incumbent (the config in use before this tuning) is kept, and
// otherwise the smaller config wins (TileConfig::smaller_than). nullopt when none is eligible.
std::optional<std::size_t> choose_winner(const std::vector<db::CandidateResult>& candidates,
                                         const std::optional<TileConfig>& incumbent);

}  // namespace moejit
