#include "tuner/tuning_keys.hpp"

#include "moe/memory_layout.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {

std::vector<Role> roles_of(Mode mode) {
  std::vector<Role> roles = {Role::kRouting, Role::kFwdUp, Role::kFwdDown, Role::kGatherSum};
  if (mode != Mode::kInference) roles.insert(roles.end(), {Role::kBwdDown, Role::kBwdDw2, Role::kBwdDx, Role::kBwdDw1});
  return roles;
}

std::string key_mode(Role role, const MoeShape& shape, Mode mode) {
  if (role == Role::kFwdUp && mode == Mode::kInference) return "infer";
  if ((role == Role::kBwdDw2 || role == Role::kBwdDown) && memeff_recomputes_act(shape, mode)) return "memeff";
  return "train";
}

db::TuningKey tuning_key(Role role, const MoeProblem& p, const cuda::DeviceInfo& device) {
  const MoeShape shape = shape_of(p);
  db::TuningKey k;
  k.device = device.name;
  k.arch = device.arch();
  k.role = role;
  k.dtype = p.dtype;
  k.hidden = p.hidden;
  k.intermediate = p.intermediate;
  k.experts = p.experts;
  k.topk = p.topk;
  k.block_m = token_block_m(shape);
  k.use_tma = tma_eligible(role, shape);
  k.tpe_bucket = db::tpe_bucket(shape.pairs(), p.experts);
  k.mode = key_mode(role, shape, p.mode);
  return k;
}

long long key_floor_tokens(Role role, const MoeProblem& problem, const cuda::DeviceInfo& device) {
  const db::TuningKey key = tuning_key(role, problem, device);
  MoeProblem p = problem;
  long long lo = 1, hi = problem.tokens;  // the key at hi is the key
  while (lo < hi) {
    p.tokens = lo + (hi - lo) / 2;
    if (tuning_key(role, p, device) == key) {
      hi = p.tokens;
    } else {
      lo = p.tokens + 1;
    }
  }
  return hi;
}

}  // namespace moejit
