// Choosing the winner among timed candidates: pure, so the tie-break is unit-tested.
#pragma once

#include <optional>
#include <vector>

#include "db/tuning_row.hpp"

namespace moejit {

// Candidates within this fraction of the fastest median are ties (CUDA-event medians of the
// same kernel vary by about 1% between runs).
inline constexpr double kTieFraction = 0.02;

// Candidates within this fraction of the fastest first-pass median are timed again, in turns
// (autotune): the clocks under the power cap drift by 10-20% over seconds, enough to reorder
// configs timed one after another, so each first-pass median is taken in turns with the
// reference's and scaled by its drift; what is left is the noise of those pairs. At most
// kMaxFinalists of them, the fastest first.
inline constexpr double kFinalistFraction = 0.10;
inline constexpr std::size_t kMaxFinalists = 4;

// Puts the candidates likeliest to win first, after candidates[0] (the reference, timed first
// whatever the budget): the incumbent, then the TMA warp-specialized configs (the winners of
// most shipped H200 rows, db/README), then the rest, each group in the space's order. A budget
// that runs out skips the candidates after the cut, so a row cut short has still timed these.
void order_for_budget(std::vector<TileConfig>& candidates, const std::optional<TileConfig>& incumbent);

// The seconds of the `left_s` still left that the next of `roles_left` roles may spend on its
// first pass: an equal share (0 when nothing is left). What a role does not use goes to the roles
// after it, and what is left after them all to the roles cut short (autotune).
double budget_share_s(double left_s, std::size_t roles_left);

// Indices of the eligible candidates (timed, not rejected) whose median is within
// kFinalistFraction of the fastest, fastest first (equal medians: the incumbent, then the smaller
// config, whatever order they were timed in), at most kMaxFinalists; and the incumbent
// last where it is within that fraction but not among the first kMaxFinalists, so that a tie
// can still keep it (choose_winner).
std::vector<std::size_t> finalists(const std::vector<db::CandidateResult>& candidates,
                                   const std::optional<TileConfig>& incumbent);

// Index of the winner among candidates that were timed and not rejected: the fastest median,
// except that among ties the incumbent (the config in use before this tuning) is kept, and
// otherwise the smaller config wins (TileConfig::smaller_than). nullopt when none is eligible.
std::optional<std::size_t> choose_winner(const std::vector<db::CandidateResult>& candidates,
                                         const std::optional<TileConfig>& incumbent);
// The same choice among the candidates at `among` only (the finalists, whose medians were
// measured together); an index into `candidates`.
std::optional<std::size_t> choose_winner(const std::vector<db::CandidateResult>& candidates,
                                         const std::vector<std::size_t>& among,
                                         const std::optional<TileConfig>& incumbent);

}  // namespace moejit
