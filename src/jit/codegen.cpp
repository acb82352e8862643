#include "jit/codegen.hpp"

#include <fmt/format.h>

#include "moejit/error.hpp"

namespace moejit::jit {
namespace {

// One explicit instantiation: `kernel<args>` with the role's parameter struct.
struct Instantiation {
  std::string kernel;  // "moejit::routing_kernel<0, 256, 8>"
  std::string params;  // "moejit::RoutingParams"
};

void require(bool ok, const KernelSpec& spec, const char* what) {
  if (!ok) {
    throw InvalidArgument("config", fmt::format("{} config '{}' lacks {}", role_name(spec.role),
                                                spec.config.name(), what));
  }
}

std::vector<Instantiation> instantiations(const KernelSpec& spec) {
  const TileConfig& c = spec.config;
  switch (spec.role) {
    case Role::kRouting: {
      require(c.warps > 0 && c.items > 0, spec, "warps and items");
      std::vector<Instantiation> out;
      for (int phase = 0; phase < 3; ++phase) {
        out.push_back({fmt::format("moejit::routing_kernel<{}, {}, {}>", phase, c.threads(), c.items),
                       "moejit::RoutingParams"});
      }
      return out;
    }
    default:
      throw UnsupportedError(fmt::format("role {} has no template yet", role_name(spec.role)));
  }
}

const char* header_of(Role r) {
  switch (r) {
    case Role::kRouting: return "routing.cuh";
    default: return "";
  }
}

}  // namespace

GeneratedUnit generate_unit(const KernelSpec& spec) {
  GeneratedUnit unit;
  auto inst = instantiations(spec);
  unit.file_name = fmt::format("{}.{}.cu", role_name(spec.role), spec.config.name());
  unit.source = fmt::format("// moejit: {}\n#include \"{}\"\n", spec.readable_name(), header_of(spec.role));
  for (const Instantiation& i : inst) {
    unit.source += fmt::format("template __global__ void {}(const {});\n", i.kernel, i.params);
    unit.name_expressions.push_back(i.kernel);
  }
  return unit;
}

}  // namespace moejit::jit
