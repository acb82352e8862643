#include "jit/codegen.hpp"

#include <array>
#include <fmt/format.h>

#include "moe/routing_layout.hpp"
#include "moejit/error.hpp"
#include "tuner/role_traits.hpp"

namespace moejit::jit {
namespace {

struct RoleTemplate {
  const char* header;  // file under templates/
  const char* kernel;  // __global__ template, qualified
  const char* params;  // its parameter struct, qualified
};

RoleTemplate role_template(Role r) {
  switch (r) {
    case Role::kRouting: return {"routing.cuh", "moejit::routing_kernel", "moejit::RoutingParams"};
    case Role::kFwdUp: return {"fwd_up.cuh", "moejit::fwd_up_kernel", "moejit::FwdUpParams"};
    case Role::kFwdDown: return {"fwd_down.cuh", "moejit::fwd_down_kernel", "moejit::FwdDownParams"};
    case Role::kGatherSum: return {"gather_sum.cuh", "moejit::gather_sum_kernel", "moejit::GatherSumParams"};
    case Role::kBwdDown: return {"bwd_down.cuh", "moejit::bwd_down_kernel", "moejit::BwdDownParams"};
    case Role::kBwdDw2: return {"bwd_dw2.cuh", "moejit::bwd_dw2_kernel", "moejit::BwdDw2Params"};
    case Role::kBwdDx: return {"bwd_dx.cuh", "moejit::bwd_dx_kernel", "moejit::BwdDxParams"};
    case Role::kBwdDw1: return {"bwd_dw1.cuh", "moejit::bwd_dw1_kernel", "moejit::BwdDw1Params"};
    case Role::kUtility: break;  // several kernels: utility_unit()
  }
  throw InternalError("unknown role");
}

void require(bool ok, const KernelSpec& spec, const char* what) {
  if (!ok) {
    throw InvalidArgument("config", fmt::format("{} config '{}' lacks {}", role_name(spec.role),
                                                spec.config.name(), what));
  }
}

const char* element_type(DType d) { return d == DType::kFP16 ? "moejit::fp16" : "moejit::bf16"; }

// Template arguments of each instantiation, in launch order.
std::vector<std::string> template_arguments(const KernelSpec& spec) {
  const TileConfig& c = spec.config;
  const char* aligned = spec.aligned ? "true" : "false";
  switch (role_kind(spec.role)) {
    case RoleKind::kRouting: {
      require(c.warps > 0 && c.items > 0, spec, "warps and items");
      std::vector<std::string> out;
      for (int phase = 0; phase < kRoutingPhases; ++phase) {
        out.push_back(fmt::format("{}, {}, {}", phase, c.threads(), c.items));
      }
      return out;
    }
    case RoleKind::kGather: {
      // The sum, then the scatter (src/moe/launch.cpp launches them by this order).
      require(c.warps > 0, spec, "warps");
      const std::string args = fmt::format("{}, {}, {}", element_type(spec.dtype), c.threads(), spec.aligned ? 8 : 1);
      return {args + ", false", args + ", true"};
    }
    case RoleKind::kTokenGemm:
    case RoleKind::kExpertGemm: {
      require(c.block_m > 0 && c.block_n > 0 && c.block_k > 0 && c.stages >= 2 && c.warps > 0 && c.group_m > 0, spec,
              "block_m, block_n, block_k, stages >= 2, warps and group_m");
      const int wm = gemm_warp_rows(spec.role, c);
      require(wm > 0, spec, "a legal warp layout");
      require(!c.warp_specialized || c.arch_tag == ArchTag::kHopper, spec, "wgmma (warp specialization is Hopper-only)");
      const char* wgmma = c.arch_tag == ArchTag::kHopper ? "true" : "false";
      const char* ws = c.warp_specialized ? "true" : "false";
      std::string args = fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}", element_type(spec.dtype), c.block_m,
                                     c.block_n, c.block_k, c.stages, c.warps, wm, c.group_m, wgmma, ws, aligned);
      require(!c.use_tma || (c.warp_specialized && spec.aligned), spec,
              "a warp-specialized pipeline on 16-byte rows for its TMA copies");
      args += c.use_tma ? ", true" : ", false";
      require(c.cluster == 1 || (c.cluster == 2 && c.use_tma && role_kind(spec.role) == RoleKind::kTokenGemm), spec,
              "a token GEMM's TMA copies for a cluster (pairs share the weight tile)");
      args += fmt::format(", {}", c.cluster);
      require(!c.persistent || persistent_eligible(spec.role, c), spec,
              "a two-warpgroup TMA tile or a cluster pair for a persistent grid");
      args += c.persistent ? ", true" : ", false";
      if (spec.role == Role::kBwdDw2) args += spec.fused_act ? ", true" : ", false";
      return {args};
    }
    case RoleKind::kUtility: break;
  }
  throw InternalError("no template arguments for this role");
}

// The utility module: each kernel at its UtilityKernel index.
GeneratedUnit utility_unit(const KernelSpec& spec) {
  GeneratedUnit unit;
  unit.file_name = fmt::format("utility.{}.cu", dtype_name(spec.dtype));
  unit.source = fmt::format("// moejit: {}\n#include \"util.cuh\"\n", spec.readable_name());
  const char* t = element_type(spec.dtype);
  std::array<std::pair<std::string, const char*>, kUtilityKernels> kernels;
  kernels[kUtilityFill] = {fmt::format("moejit::fill_uniform_kernel<{}>", t), "moejit::FillParams"};
  kernels[kUtilityTopkIds] = {"moejit::fill_topk_ids_kernel", "moejit::TopkIdsParams"};
  kernels[kUtilityRelDiff] = {fmt::format("moejit::rel_diff_kernel<{}>", t), "moejit::RelDiffParams"};
  for (const auto& [kernel, params] : kernels) {
    if (kernel.find('<') != std::string::npos) {
      unit.source += fmt::format("template __global__ void {}(const __grid_constant__ {});\n", kernel, params);
    }
    unit.name_expressions.push_back(kernel);
  }
  return unit;
}

}  // namespace

GeneratedUnit generate_unit(const KernelSpec& spec) {
  if (spec.role == Role::kUtility) return utility_unit(spec);
  const RoleTemplate t = role_template(spec.role);
  GeneratedUnit unit;
  unit.file_name = fmt::format("{}.{}.cu", role_name(spec.role), spec.config.name());
  unit.source = fmt::format("// moejit: {}\n#include \"{}\"\n", spec.readable_name(), t.header);
  for (const std::string& args : template_arguments(spec)) {
    const std::string kernel = fmt::format("{}<{}>", t.kernel, args);
    unit.source += fmt::format("template __global__ void {}(const __grid_constant__ {});\n", kernel, t.params);
    unit.name_expressions.push_back(kernel);
  }
  return unit;
}

}  // namespace moejit::jit
