#include "tuner/tune_plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "db/tuning_key.hpp"
#include "moejit/error.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit {

std::vector<long long> table_token_counts(int experts, int topk, long long max_tokens) {
  if (experts <= 0) throw InvalidArgument("experts", fmt::format("must be positive, got {}", experts));
  if (topk <= 0 || topk > experts) {
    throw InvalidArgument("topk", fmt::format("must be in [1, experts = {}], got {}", experts, topk));
  }
  if (max_tokens <= 0) throw InvalidArgument("max_tokens", fmt::format("must be positive, got {}", max_tokens));
  // The key moves with T only through the pairs per expert, which grow by at most one per T: a
  // walk over every T sees every key. Later T of a key replace earlier ones.
  std::map<std::pair<int, int>, long long> largest;
  for (long long t = 1; t <= max_tokens; ++t) {
    const MoeShape shape{t, experts, 1, 1, topk, DType::kBF16};
    largest[{db::tpe_bucket(shape.pairs(), experts), token_block_m(shape)}] = t;
  }
  std::vector<long long> out;
  for (const auto& [key, t] : largest) out.push_back(t);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<TuneItem> plan_tuning(const TunePlanRequest& r, const cuda::DeviceInfo& device,
                                  const std::map<std::string, db::TuningRow>& stored) {
  if (r.shards < 1 || r.shard < 0 || r.shard >= r.shards) {
    throw InvalidArgument("shard", "expected i/n with 0 <= i < n");
  }
  // Shards split the whole list before the done keys drop out, so a shard that resumes keeps
  // its own items instead of taking over another shard's.
  std::vector<TuneItem> all;
  std::set<std::string> planned;
  std::vector<long long> tokens = r.tokens;
  std::sort(tokens.begin(), tokens.end());
  for (long long t : tokens) {
    for (Mode mode : r.modes) {
      TuneItem item{{t, r.experts, r.hidden, r.intermediate, r.topk, r.dtype, mode}, {}};
      for (Role role : roles_of(mode)) {
        if (!r.roles.empty() && std::find(r.roles.begin(), r.roles.end(), role) == r.roles.end()) continue;
        if (planned.insert(tuning_key(role, item.problem, device).id()).second) item.roles.push_back(role);
      }
      if (!item.roles.empty()) all.push_back(std::move(item));
    }
  }
  std::vector<TuneItem> mine;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (static_cast<int>(i % r.shards) != r.shard) continue;
    TuneItem& item = all[i];
    const MoeShape shape = shape_of(item.problem);
    const auto done = [&](Role role) {
      const auto row = stored.find(tuning_key(role, item.problem, device).id());
      if (row == stored.end() || tuned_partly(row->second, shape) || !winner_legal(row->second, shape, device)) {
        return false;
      }
      // Plans at the key's smallest T run the row too (routing's pruning depends on T; a row an
      // earlier build tuned may hold a chunk too wide there).
      MoeShape smallest = shape;
      smallest.tokens = key_floor_tokens(role, item.problem, device);
      return winner_legal(row->second, smallest, device);
    };
    std::erase_if(item.roles, [&](Role role) { return !r.force && done(role); });
    if (!item.roles.empty()) mine.push_back(std::move(item));
  }
  return mine;
}

}  // namespace moejit
