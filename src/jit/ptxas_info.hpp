// Resource figures ptxas prints under -Xptxas=-v, parsed from the NVRTC log.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace moejit::jit {

struct KernelResources {
  std::string function;  // mangled entry name
  int registers = 0;
  int stack_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int static_smem_bytes = 0;
};

// Pure: one entry per "Compiling entry function" block in the log, in log order.
std::vector<KernelResources> parse_ptxas_info(const std::string& log);

// Pure: ptxas's "Potential Performance Loss" advisories in the log, e.g. "(C7510) wgmma.mma_async
// instructions are serialized due to ..." or "(C7507) 'setmaxnreg' ignored ...": each one undoes
// what a Hopper config is for, so the unit tests require none.
std::vector<std::string> parse_performance_losses(const std::string& log);

void to_json(nlohmann::json& j, const KernelResources& r);
void from_json(const nlohmann::json& j, KernelResources& r);

}  // namespace moejit::jit
