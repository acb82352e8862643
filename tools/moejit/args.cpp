#include "args.hpp"

#include <fmt/format.h>

#include <charconv>

#include "core/env.hpp"
#include "moejit/error.hpp"

namespace moejit::cli {

std::filesystem::path database_path(const Args& a) {
  if (a.has("db")) return a.get("db");
  if (auto user = env::user_db_path()) return *user;
  throw InvalidArgument("--db", "no database named: pass --db, or set MOEJIT_DB (XDG_CACHE_HOME and HOME are unset "
                                "and there is no private folder in the temporary folder)");
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

std::vector<std::string> Args::get_list(const std::string& name) const {
  const std::string list = get(name);
  if (list.empty()) throw InvalidArgument("--" + name, "needs a value");
  std::vector<std::string> out;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = list.find(',', begin);
    out.push_back(list.substr(begin, comma - begin));
    // "5,,6" and "5,": an item lost to a typo would otherwise go unnoticed.
    if (out.back().empty()) throw InvalidArgument("--" + name, fmt::format("empty item in '{}'", list));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

std::vector<long long> Args::get_ints(const std::string& name, long long lo, long long hi) const {
  std::vector<long long> out;
  for (const std::string& item : get_list(name)) out.push_back(parse_int("--" + name, item, lo, hi));
  return out;
}

long long Args::get_int(const std::string& name, long long fallback, long long lo, long long hi) const {
  if (!has(name)) return fallback;
  const std::vector<long long> v = get_ints(name, lo, hi);
  if (v.size() != 1) throw InvalidArgument("--" + name, fmt::format("takes one value here, got '{}'", get(name)));
  return v[0];
}

long long parse_int(const std::string& option, const std::string& text, long long lo, long long hi) {
  long long v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::invalid_argument || ptr != end) {
    throw InvalidArgument(option, fmt::format("expected an integer, got '{}'", text));
  }
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
    throw InvalidArgument(option, hi == kNoMax ? fmt::format("{} is out of range (at least {})", text, lo)
                                               : fmt::format("{} is out of range ({} to {})", text, lo, hi));
  }
  return v;
}

Args parse_args(int argc, char** argv, int start, const std::set<std::string>& flags,
                const std::set<std::string>& valued, bool positionals) {
  Args a;
  for (int i = start; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      if (!positionals) throw InvalidArgument(s, "unexpected argument (options are --name value)");
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
