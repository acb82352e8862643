#include "cuda/device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string_view>

#include "cuda/driver.hpp"
#include "moejit/error.hpp"

namespace moejit::cuda {

std::string arch_for_cc(int cc) {
  // The 'a' targets expose instructions (wgmma, setmaxnreg, tcgen05) that are not forward
  // compatible; moejit compiles for the exact device, so it always takes them where they exist.
  bool has_arch_specific = cc >= 90;
  return fmt::format("sm_{}{}", cc, has_arch_specific ? "a" : "");
}

int cc_from_arch(const std::string& arch) {
  // Checked whole: strtol took "sm_+90", "sm_ 90" and, without the prefix, "90".
  std::string_view digits = arch;
  const bool prefixed = digits.starts_with("sm_");
  if (prefixed) digits.remove_prefix(3);
  if (digits.ends_with('a')) digits.remove_suffix(1);
  const bool all_digits =
      !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  int v = 0;
  if (!prefixed || !all_digits || std::from_chars(digits.data(), digits.data() + digits.size(), v).ec != std::errc() ||
      v < 50 || v > 200) {
    throw InvalidArgument("arch", "expected an architecture like sm_90a or sm_80, got '" + arch + "'");
  }
  return v;
}

std::string DeviceInfo::arch() const { return arch_for_cc(cc()); }

DeviceInfo query_device(int ordinal) {
  const Driver& d = driver();
  int count = 0;
  MOEJIT_CU(d.cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    throw NoDeviceError(fmt::format("GPU {} requested but {} visible", ordinal, count));
  }
  CUdevice dev = 0;
  MOEJIT_CU(d.cuDeviceGet(&dev, ordinal));
  DeviceInfo info;
  char name[256] = {};
  MOEJIT_CU(d.cuDeviceGetName(name, sizeof name, dev));
  info.name = name;
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    MOEJIT_CU(d.cuDeviceGetAttribute(&v, a, dev));
    return v;
  };
  info.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.smem_optin_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info.smem_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  info.regs_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  info.regs_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  info.max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  info.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  size_t total = 0;
  MOEJIT_CU(d.cuDeviceTotalMem(&total, dev));
  info.total_memory = static_cast<long long>(total);
  CUuuid uuid{};
  MOEJIT_CU(d.cuDeviceGetUuid(&uuid, dev));
  for (char byte : uuid.bytes) info.uuid += fmt::format("{:02x}", static_cast<unsigned char>(byte));
  info.driver_version = d.version;
  info.ordinal = ordinal;
  return info;
}

DeviceInfo query_current_device() {
  CUdevice dev = 0;
  MOEJIT_CU(driver().cuCtxGetDevice(&dev));
  return query_device(static_cast<int>(dev));  // a CUdevice handle is its ordinal
}

namespace fabricated {

DeviceInfo h200() {
  return {"NVIDIA H200", 9, 0, 132, 232448, 233472, 65536, 65536, 1024, 60LL << 20, 143771LL << 20, 0};
}

DeviceInfo a100() {
  return {"NVIDIA A100-SXM4-80GB", 8, 0, 108, 166912, 167936, 65536, 65536, 1024, 40LL << 20, 80LL << 30, 0};
}

DeviceInfo b200() {
  return {"NVIDIA B200", 10, 0, 148, 232448, 233472, 65536, 65536, 1024, 126LL << 20, 180LL << 30, 0};
}

DeviceInfo rtx5090() {
  return {"NVIDIA GeForce RTX 5090", 12, 0, 170, 101376, 102400, 65536, 65536, 1024, 96LL << 20, 32LL << 30, 0};
}

DeviceInfo for_arch(const std::string& arch) {
  int cc = cc_from_arch(arch);
  DeviceInfo base = cc >= 120 ? rtx5090() : cc >= 100 ? b200() : cc >= 90 ? h200() : a100();
  if (cc == 86 || cc == 89) {  // RTX 30 and 40, A40, L40S: 99 KB per block, not the A100's 163
    base.smem_optin_per_block = 101376;
    base.smem_per_sm = 102400;
  }
  base.cc_major = cc / 10;
  base.cc_minor = cc % 10;
  base.name = fmt::format("generic {}", arch_for_cc(cc));
  return base;
}

}  // namespace fabricated
}  // namespace moejit::cuda
