#include "tuner/tune_plan.hpp"

#include <algorithm>

#include "moejit/error.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit {

std::vector<TuneItem> plan_tuning(const TunePlanRequest& r, const cuda::DeviceInfo& device,
                                  const std::set<std::string>& done) {
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
    std::erase_if(item.roles,
                  [&](Role role) { return !r.force && done.count(tuning_key(role, item.problem, device).id()); });
    if (!item.roles.empty()) mine.push_back(std::move(item));
  }
  return mine;
}

}  // namespace moejit
