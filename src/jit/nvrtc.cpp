#include "jit/nvrtc.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fmt/format.h>
#include <utility>

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

const std::string& nvrtc_version() {
  static const std::string v = [] {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    return fmt::format("{}.{}", major, minor);
  }();
  return v;
}

const std::string& nvrtc_build_id() {
  static const std::string id = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || info.dli_fname == nullptr) {
      return nvrtc_version() + " ?";
    }
    std::error_code ec;
    const std::filesystem::path path = std::filesystem::canonical(info.dli_fname, ec);
    if (ec) return fmt::format("{} {}", nvrtc_version(), info.dli_fname);
    const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
    return fmt::format("{} {} {}", nvrtc_version(), path.filename().string(), ec ? 0 : bytes);
  }();
  return id;
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
