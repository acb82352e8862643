#include "jit/nvrtc.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <nvrtc.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "jit/embedded_templates.hpp"
#include "moejit/error.hpp"

namespace moejit::jit {
namespace {

class Program {
 public:
  Program(const GeneratedUnit& unit) {
    const auto& files = embedded_template_files();
    std::vector<const char*> contents, names;
    for (const TemplateFile& f : files) {
      contents.push_back(f.content);
      names.push_back(f.name);
    }
    check(nvrtcCreateProgram(&prog_, unit.source.c_str(), unit.file_name.c_str(), static_cast<int>(files.size()),
                             contents.data(), names.data()),
          "nvrtcCreateProgram", unit);
  }
  ~Program() {
    if (prog_ != nullptr) nvrtcDestroyProgram(&prog_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcProgram get() const { return prog_; }

  std::string log() const {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog_, &n) != NVRTC_SUCCESS || n == 0) return {};
    std::string s(n, '\0');
    if (nvrtcGetProgramLog(prog_, s.data()) != NVRTC_SUCCESS) return {};
    while (!s.empty() && (s.back() == '\0' || s.back() == '\n')) s.pop_back();
    return s;
  }

  void check(nvrtcResult r, const char* what, const GeneratedUnit& unit) const {
    if (r == NVRTC_SUCCESS) return;
    std::string log_text = prog_ != nullptr ? log() : std::string();
    throw CompileError(fmt::format("{} failed for {}: {}{}{}", what, unit.file_name, nvrtcGetErrorString(r),
                                   log_text.empty() ? "" : "\n", log_text),
                       log_text, unit.source);
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

}  // namespace

const std::vector<int>& nvrtc_target_ccs() {
  static const std::vector<int> ccs = [] {
    int n = 0;
    std::vector<int> out;
    if (nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS) out.resize(static_cast<std::size_t>(n));
    if (out.empty() || nvrtcGetSupportedArchs(out.data()) != NVRTC_SUCCESS) {
      throw InternalError("NVRTC did not list the architectures it targets");
    }
    return out;
  }();
  return ccs;
}

const std::string& nvrtc_version() {
  // Never destroyed: tuning lookups read it, also on a thread building a plan while the process
  // exits.
  static const auto* v = new std::string([] {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    return fmt::format("{}.{}", major, minor);
  }());
  return *v;
}

namespace {

// The loaded object that holds `address`, and its GNU build id (the ELF note the linker writes,
// NT_GNU_BUILD_ID) as hex; empty where the object carries none.
struct ObjectSearch {
  std::uintptr_t address;
  std::string build_id;
};

int find_object(dl_phdr_info* info, std::size_t, void* data) {
  auto* search = static_cast<ObjectSearch*>(data);
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum && !holds; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const std::uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    holds = ph.p_type == PT_LOAD && search->address >= begin && search->address < begin + ph.p_memsz;
  }
  if (!holds) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    const unsigned char* const end = p + ph.p_memsz;
    // Each note: a header, then the name and the description, each padded to 4 bytes.
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) note;
      std::memcpy(&note, p, sizeof note);
      const unsigned char* name = p + sizeof note;
      const unsigned char* desc = name + ((note.n_namesz + 3u) & ~3u);
      p = desc + ((note.n_descsz + 3u) & ~3u);
      if (p > end) break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (std::size_t j = 0; j < note.n_descsz; ++j) search->build_id += fmt::format("{:02x}", desc[j]);
        return 1;
      }
    }
  }
  return 1;
}

}  // namespace

const std::string& nvrtc_build_id() {
  // Never destroyed: every kernel cache request reads it, also on a thread building a plan while
  // the process exits.
  static const auto* id = new std::string([] {
    ObjectSearch search{reinterpret_cast<std::uintptr_t>(&nvrtcVersion)};
    dl_iterate_phdr(find_object, &search);
    if (!search.build_id.empty()) return fmt::format("{} {}", nvrtc_version(), search.build_id);
    // No build id: the file's size stands for the patch release, not its name, which differs
    // between the paths one library is loaded through (a soname link, a wheel's copy).
    Dl_info info{};
    std::error_code ec;
    std::uintmax_t bytes = 0;
    if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) != 0 && info.dli_fname != nullptr) {
      bytes = std::filesystem::file_size(std::filesystem::canonical(info.dli_fname, ec), ec);
    }
    return fmt::format("{} size {}", nvrtc_version(), ec ? 0 : bytes);
  }());
  return *id;
}

std::vector<std::string> nvrtc_options(const std::string& arch) {
  return {"-arch=" + arch, "--std=c++17", "-Xptxas=-v", "-DNDEBUG"};
}

NvrtcOutput nvrtc_compile(const GeneratedUnit& unit, const std::vector<std::string>& options) {
  auto t0 = std::chrono::steady_clock::now();
  Program prog(unit);
  for (const std::string& e : unit.name_expressions) {
    prog.check(nvrtcAddNameExpression(prog.get(), e.c_str()), "nvrtcAddNameExpression", unit);
  }
  std::vector<const char*> opts;
  for (const std::string& o : options) opts.push_back(o.c_str());
  prog.check(nvrtcCompileProgram(prog.get(), static_cast<int>(opts.size()), opts.data()), "nvrtcCompileProgram",
             unit);
  NvrtcOutput out;
  out.log = prog.log();
  for (const std::string& e : unit.name_expressions) {
    const char* lowered = nullptr;
    prog.check(nvrtcGetLoweredName(prog.get(), e.c_str(), &lowered), "nvrtcGetLoweredName", unit);
    out.lowered_names.emplace_back(lowered);
  }
  size_t size = 0;
  prog.check(nvrtcGetCUBINSize(prog.get(), &size), "nvrtcGetCUBINSize", unit);
  out.cubin.resize(size);
  prog.check(nvrtcGetCUBIN(prog.get(), out.cubin.data()), "nvrtcGetCUBIN", unit);
  out.resources = parse_ptxas_info(out.log);
  out.performance_losses = parse_performance_losses(out.log);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace moejit::jit
