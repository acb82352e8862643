// The kernel paths a GPU test runs a case on, as plan options.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cuda/device.hpp"
#include "moejit/moejit.hpp"
#include "support/moe_case.hpp"

namespace moejit::test {

// The device's own heuristic defaults (on an H200 the wgmma configs wherever tiles are 64 rows
// or more), and, on a Hopper GPU, the portable mma.sync path forced through overrides with the
// defaults of an sm_80 device, and the wgmma pipeline the defaults do not use.
std::vector<std::pair<std::string, Options>> kernel_paths(const CaseSpec& s, const cuda::DeviceInfo& device);

}  // namespace moejit::test
