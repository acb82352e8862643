// Command-line parsing for the moejit CLI: positionals plus --name value / --name=value options.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace moejit::cli {

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // without the leading "--"; flags map to ""

  bool has(const std::string& name) const { return options.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // Comma-separated integers ("128,2048,768,8"); throws InvalidArgument naming the option.
  std::vector<long long> get_ints(const std::string& name) const;
};

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split(const std::string& list, char sep = ',');

// Parses argv[start..argc). Names in `flags` take no value. Throws InvalidArgument for an
// option not in `flags` or `valued`, or a valued option without its value.
Args parse_args(int argc, char** argv, int start, const std::set<std::string>& flags,
                const std::set<std::string>& valued);

}  // namespace moejit::cli
