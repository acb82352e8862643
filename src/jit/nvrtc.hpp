// NVRTC: compiles a generated unit against the embedded templates into a cubin.
#pragma once

#include <string>
#include <vector>

#include "jit/codegen.hpp"
#include "jit/ptxas_info.hpp"

namespace moejit::jit {

struct NvrtcOutput {
  std::string cubin;
  std::string log;
  std::vector<std::string> lowered_names;  // aligned with the unit's name expressions
  std::vector<KernelResources> resources;  // from -Xptxas=-v, one per entry function
  std::vector<std::string> performance_losses;  // ptxas's advisories (parse_performance_losses)
  double compile_ms = 0;
};

// "13.0": the linked NVRTC's version, recorded with every tuned row.
const std::string& nvrtc_version();

// "13.0 65be0db3...": the version, then the loaded library's GNU build id (else "size" and its
// file size), which stand for the patch release nvrtcVersion does not report; part of every
// kernel key, so a cubin from another build of NVRTC (one that fixes a miscompile, say) is never
// reused, while one NVRTC keys the same whatever path loaded it (a soname link, a wheel's copy).
const std::string& nvrtc_build_id();

// The compute capabilities the linked NVRTC can target, ascending (75, 80, ..., 120 for 13.0);
// an arch-specific target (sm_90a) counts as its capability's.
const std::vector<int>& nvrtc_target_ccs();

// Options for a target arch ("sm_90a", "sm_80"); part of every kernel key.
std::vector<std::string> nvrtc_options(const std::string& arch);

// Compiles with the templates as the only headers. Throws CompileError carrying the log and
// the generated source.
NvrtcOutput nvrtc_compile(const GeneratedUnit& unit, const std::vector<std::string>& options);

}  // namespace moejit::jit
