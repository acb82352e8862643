// The kernels a plan loads (role_kernel_spec) and the set `moejit compile` fills the cache with
// (plan_kernel_specs): the variant flags follow the problem, and the set holds every plan's.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "moe/kernel_specs.hpp"
#include "moe/memory_layout.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/tuning_keys.hpp"

using namespace moejit;

namespace {

const std::vector<Mode> kModes = {Mode::kTraining, Mode::kInference, Mode::kMemoryEfficient};

// Each role's configs that pass pruning: what a plan may resolve to.
std::map<Role, std::vector<TileConfig>> legal_configs(const MoeShape& shape, const cuda::DeviceInfo& device) {
  std::map<Role, std::vector<TileConfig>> out;
  for (Role r : kAllRoles) {
    for (const PruneDecision& d : prune_space(r, shape, device)) {
      if (!d.reason) out[r].push_back(d.config);
    }
  }
  return out;
}

std::set<std::string> names(const std::vector<jit::KernelSpec>& specs) {
  std::set<std::string> out;
  for (const jit::KernelSpec& s : specs) out.insert(s.readable_name());
  return out;
}

}  // namespace

TEST_CASE("plan_kernel_specs holds the kernels every plan of the problem loads, variants included", "[specs]") {
  const cuda::DeviceInfo device = cuda::fabricated::for_arch("sm_90a");
  // H not a multiple of 8 (element-wise kernels); a memory-efficient T past the room for the
  // weighted activation (bwd_dw2 recomputes it); and an aligned, everyday problem.
  const MoeProblem unaligned{64, 8, 260, 128, 2, DType::kBF16, Mode::kTraining};
  const MoeProblem recomputing{1572865, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  const MoeProblem everyday{8192, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  REQUIRE(memeff_recomputes_act(shape_of(recomputing), Mode::kMemoryEfficient));
  for (const MoeProblem& p : {unaligned, recomputing, everyday}) {
    const MoeShape shape = shape_of(p);
    INFO("T=" << p.tokens << " H=" << p.hidden);
    const auto legal = legal_configs(shape, device);
    const std::vector<jit::KernelSpec> all = plan_kernel_specs(p, kModes, legal, "sm_90a");
    CHECK(names(all).size() == all.size());  // each kernel once
    std::set<std::string> per_mode;
    for (Mode mode : kModes) {
      INFO(mode_name(mode));
      MoeProblem in_mode = p;
      in_mode.mode = mode;
      const std::vector<jit::KernelSpec> specs = plan_kernel_specs(p, {mode}, legal, "sm_90a");
      const std::set<std::string> mode_names = names(specs);
      per_mode.insert(mode_names.begin(), mode_names.end());
      // A heuristic plan's kernels, as FusedMoe builds them.
      for (Role r : roles_of(mode)) {
        const jit::KernelSpec planned = role_kernel_spec(r, default_config(r, shape, device, mode), in_mode, "sm_90a");
        INFO(planned.readable_name());
        CHECK(mode_names.count(planned.readable_name()) == 1);
      }
      for (const jit::KernelSpec& s : specs) {
        CHECK(s.aligned == (s.role == Role::kRouting || vector_aligned(p)));
        CHECK(s.fused_act == (s.role == Role::kBwdDw2 && memeff_recomputes_act(shape, mode)));
        if (mode == Mode::kInference) CHECK(s.role <= Role::kGatherSum);
      }
      CHECK(specs.size() == names(specs).size());
    }
    CHECK(names(all) == per_mode);
  }
  // Where memory-efficient bwd_dw2 recomputes, both of its variants are in the set, once per config.
  const auto legal = legal_configs(shape_of(recomputing), device);
  std::size_t dw2 = 0, fused = 0;
  for (const jit::KernelSpec& s : plan_kernel_specs(recomputing, kModes, legal, "sm_90a")) {
    if (s.role != Role::kBwdDw2) continue;
    ++dw2;
    fused += s.fused_act;
  }
  CHECK(fused == legal.at(Role::kBwdDw2).size());
  CHECK(dw2 == 2 * fused);
  // A role the configs leave out is not built.
  const std::vector<TileConfig>& gather = legal.at(Role::kGatherSum);
  CHECK(plan_kernel_specs(everyday, {Mode::kTraining}, {{Role::kGatherSum, gather}}, "sm_90a").size() == gather.size());
}
