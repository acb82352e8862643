#include "jit/ptxas_info.hpp"

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace moejit::jit {

std::vector<KernelResources> parse_ptxas_info(const std::string& log) {
  // Never destroyed: a thread still compiling when the process exits parses its log with them.
  static const auto* entry = new std::regex(R"(Compiling entry function '([^']+)')");
  static const auto* frame =
      new std::regex(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const auto* regs = new std::regex(R"(Used (\d+) registers)");
  static const auto* smem = new std::regex(R"((\d+) bytes smem)");
  std::vector<KernelResources> out;
  std::istringstream in(log);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, *entry)) {
      out.push_back({m[1].str()});
      continue;
    }
    if (out.empty()) continue;
    KernelResources& k = out.back();
    if (std::regex_search(line, m, *frame)) {
      k.stack_bytes = std::stoi(m[1].str());
      k.spill_store_bytes = std::stoi(m[2].str());
      k.spill_load_bytes = std::stoi(m[3].str());
    }
    if (std::regex_search(line, m, *regs)) k.registers = std::stoi(m[1].str());
    if (line.find("Used") != std::string::npos && std::regex_search(line, m, *smem)) {
      k.static_smem_bytes = std::stoi(m[1].str());
    }
  }
  return out;
}

std::vector<std::string> parse_performance_losses(const std::string& log) {
  // Never destroyed, as parse_ptxas_info's.
  static const auto* loss = new std::regex(R"((\(C\d+\))? ?Potential Performance Loss: (.*))");
  std::vector<std::string> out;
  std::istringstream in(log);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, *loss)) out.push_back(m[1].matched ? m[1].str() + " " + m[2].str() : m[2].str());
  }
  return out;
}

void to_json(nlohmann::json& j, const KernelResources& r) {
  j = nlohmann::json{{"function", r.function},
                     {"registers", r.registers},
                     {"stack_bytes", r.stack_bytes},
                     {"spill_store_bytes", r.spill_store_bytes},
                     {"spill_load_bytes", r.spill_load_bytes},
                     {"static_smem_bytes", r.static_smem_bytes}};
}

void from_json(const nlohmann::json& j, KernelResources& r) {
  r.function = j.at("function").get<std::string>();
  r.registers = j.value("registers", 0);
  r.stack_bytes = j.value("stack_bytes", 0);
  r.spill_store_bytes = j.value("spill_store_bytes", 0);
  r.spill_load_bytes = j.value("spill_load_bytes", 0);
  r.static_smem_bytes = j.value("static_smem_bytes", 0);
}

}  // namespace moejit::jit
