// The work list of an offline tuning run (`moejit tune`): one item per (token count, mode) with
// the roles whose keys still need tuning. Pure, so resuming and sharding are unit-tested.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "db/tuning_row.hpp"
#include "jit/role.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

struct TuneItem {
  MoeProblem problem;
  std::vector<Role> roles;
};

struct TunePlanRequest {
  int experts = 0, hidden = 0, intermediate = 0, topk = 0;
  DType dtype = DType::kBF16;
  std::vector<long long> tokens;
  std::vector<Mode> modes;
  std::vector<Role> roles;  // empty: every role of each mode
  int shard = 0, shards = 1;
  bool force = false;       // retune keys that already have a fresh row
};

// The token counts a table tunes by default for a shape with `experts` and `topk`: for every
// (tokens-per-expert bucket, token tile height) that some T in [1, max_tokens] reaches, the
// largest such T, ascending. Every T up to max_tokens then finds its own key's row: a fixed list
// (once 128, 512, 1024, ...) left T = 160 to 352 and 520 to 784 of Qwen3-30B-A3B, whose token tiles
// are 32 and 64 rows high, to the heuristic defaults.
std::vector<long long> table_token_counts(int experts, int topk, long long max_tokens);
inline constexpr long long kTableMaxTokens = 32768;  // `moejit tune`'s default max_tokens

// Keys already tuned are skipped unless force: those whose row in `stored` (this build's rows, by
// key id) was tuned whole (tuner/prune.hpp: tuned_partly) and has a winner that is legal at the
// problem the key is tuned at (winner_legal: pruning and the space change without the template
// hash). A key shared by several modes (e.g. fwd_down is "train" for inference too) is tuned
// once, in the first mode listed. Items are ordered by token count, then mode; shard i of n
// takes items i, i+n, ... of the list before done keys are skipped, so a resumed shard keeps its
// share.
std::vector<TuneItem> plan_tuning(const TunePlanRequest& request, const cuda::DeviceInfo& device,
                                  const std::map<std::string, db::TuningRow>& stored);

}  // namespace moejit
