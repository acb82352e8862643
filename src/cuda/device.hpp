// What moejit needs to know about a GPU, as a plain value: read from the device, or fabricated
// (tests, `moejit compile --arch` on a machine without a GPU).
#pragma once

#include <string>

namespace moejit::cuda {

struct DeviceInfo {
  std::string name;            // "NVIDIA H200"
  int cc_major = 0;            // compute capability
  int cc_minor = 0;
  int sm_count = 0;
  int smem_optin_per_block = 0;  // bytes a block may use after opting in
  int smem_per_sm = 0;
  int regs_per_block = 0;
  int regs_per_sm = 0;
  int max_threads_per_block = 1024;
  long long l2_bytes = 0;
  long long total_memory = 0;
  int driver_version = 0;      // 0 when fabricated
  int ordinal = -1;            // the visible device's index; -1 when fabricated
  std::string uuid;            // 32 hex digits, the same in every process of the host; empty when fabricated

  // NVRTC target: "sm_90a" for the architecture-specific features of sm_90/100/103/110/120/121,
  // "sm_80" style otherwise.
  std::string arch() const;
  int cc() const { return cc_major * 10 + cc_minor; }
  bool is_hopper() const { return cc() == 90; }
};

// Reads the descriptor of a visible GPU. Throws NoDeviceError or CudaError.
DeviceInfo query_device(int ordinal = 0);

// Reads the descriptor of the device of the current context. Throws NoDeviceError or CudaError.
DeviceInfo query_current_device();

// The NVRTC arch string for a compute capability (cc 90 -> "sm_90a").
std::string arch_for_cc(int cc);
// Parses "sm_90a" or "sm_90" ("sm_", digits, an optional 'a') into a compute capability (90); throws
// InvalidArgument for anything else.
int cc_from_arch(const std::string& arch);

// Fabricated descriptors with the published limits of each part.
namespace fabricated {
DeviceInfo h200();
DeviceInfo a100();
DeviceInfo b200();
DeviceInfo rtx5090();
// A descriptor for compiling ahead of time for `arch` when no such GPU is present: limits of
// the flagship part of that architecture.
DeviceInfo for_arch(const std::string& arch);
}  // namespace fabricated

}  // namespace moejit::cuda
