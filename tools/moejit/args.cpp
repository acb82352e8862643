#include "args.hpp"

#include <cstdlib>
#include <sstream>

#include "moejit/error.hpp"

namespace moejit::cli {

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

std::vector<long long> Args::get_ints(const std::string& name) const {
  std::vector<long long> out;
  std::stringstream ss(get(name));
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') throw InvalidArgument("--" + name, "expected integers, got '" + get(name) + "'");
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> split(const std::string& list, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Args parse_args(int argc, char** argv, int start, const std::set<std::string>& flags,
                const std::set<std::string>& valued) {
  Args a;
  for (int i = start; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    std::string name = s.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (flags.count(name)) {
      a.options[name] = "";
    } else if (valued.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argc) throw InvalidArgument("--" + name, "needs a value");
        value = argv[++i];
      }
      a.options[name] = value;
    } else {
      throw InvalidArgument(s, "unknown option");
    }
  }
  return a;
}

}  // namespace moejit::cli
