// Chooses the config of every role of a plan. Order, first hit wins:
//   1. Options::config_overrides;
//   2. a fresh exact row: in-process map, user DB ($MOEJIT_DB), shipped DB for the SKU (db/);
//   3. self-tuning, when MOEJIT_AUTOTUNE allows it and the plan's stream is not capturing: under
//      a per-problem file lock next to the user DB, so concurrent processes tune each problem
//      once per host while the others wait and then read the rows; rows go to the user DB;
//   4. the nearest TPE bucket's row;
//   5. the heuristic default (tuner/config_space.hpp).
// Rows whose config no longer passes pruning are passed over at levels 2-4: level 3 tunes their
// keys again, level 4 takes the nearest bucket whose winner passes.
#pragma once

#include <map>
#include <string>

#include "cuda/device.hpp"
#include "db/tuning_lookup.hpp"
#include "jit/role.hpp"
#include "moejit/moejit.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

struct ResolvedConfig {
  TileConfig config;
  std::string source;  // "override", "memory", "user_db", "shipped_db", "tuned", "nearest_bucket", "heuristic"
};

// The process-wide lookup for the current $MOEJIT_DB, $MOEJIT_SHIPPED_DB_DIR and build (its
// in-process map outlives plans).
db::TuningLookup& tuning_lookup(const cuda::DeviceInfo& device);

// allow_tuning=false skips level 3 whatever MOEJIT_AUTOTUNE says (e.g. to report what is stored).
// Either way a malformed MOEJIT_AUTOTUNE or MOEJIT_TUNE_BUDGET_S throws InvalidArgument naming it.
std::map<Role, ResolvedConfig> resolve_configs(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                               const Options& options, bool allow_tuning = true);

}  // namespace moejit
