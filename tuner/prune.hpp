// Pruning: decides, before anything is compiled, whether a config can serve a problem on a
// device. Pure; unit-tested with fabricated devices.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "db/tuning_row.hpp"
#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

// nullopt when the config is legal; otherwise the reason it is dropped.
std::optional<std::string> prune_reason(Role role, const TileConfig& config, const MoeShape& shape,
                                        const cuda::DeviceInfo& device);

struct PruneDecision {
  TileConfig config;
  std::optional<std::string> reason;  // set when pruned
};

std::vector<PruneDecision> prune_space(Role role, const MoeShape& shape, const cuda::DeviceInfo& device);

// Why a legal config stays out of the space a self-tune on a plan's first call times, where
// NVRTC compiling the whole space is most of the cold start: of a role's legal configs, only the
// TMA warp-specialized ones where there are any. In the shipped H200 table (session 44's) they
// won every token GEMM row at 128-row tiles (165) and 41 of 50 at 64-row tiles, the best of them
// within 5.6 % at the other nine. Where
// none is legal, every legal config stays, except that token tiles under 64 rows (no wgmma
// config) leave out BK 32 where a deeper BLOCK_K is legal: over the table's 75 such keys the best
// of the rest came within 2.1 % of the winner (0.2 % on average), and the cut takes back most of
// the cold start the deeper small-tile pipelines added (session 44; measured on the H200 only, a
// rule for every device). `moejit tune` times the whole space. nullopt: the config stays.
std::optional<std::string> first_call_exclusion(const TileConfig& config, const std::vector<PruneDecision>& space);

// Why the tuner recorded a candidate untimed once its budget of `budget_s` seconds was spent.
std::string budget_skip_reason(double budget_s);

// Whether a row's candidates leave part of its role's space at `shape` untimed: the first call's
// narrower space (first_call_exclusion's reasons) or a tuning budget spent first
// (budget_skip_reason). Plans run such a row; `moejit tune` times its key again, whole, and a
// plan's own partial row does not replace a whole one. A mark on a config the space no longer
// holds does not count: the space is host code, outside the template hash, so it can shrink under
// a current row whose candidates are never wiped (db/tuning_db.hpp); counted, the mark would send
// the key to every `moejit tune`, none of which times that config.
bool tuned_partly(const db::TuningRow& row, const MoeShape& shape);

// Whether a stored row's winner may run for `shape` on `device`: it passes pruning and its role's
// space holds it. Pruning rules and the space are host code, outside the template hash that makes
// rows stale, and an imported or hand-edited table may carry anything (a BLOCK_K of 48, which
// would reach NVRTC and fail the plan).
bool winner_legal(const db::TuningRow& row, const MoeShape& shape, const cuda::DeviceInfo& device);

}  // namespace moejit
