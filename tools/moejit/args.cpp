#include "args.hpp"

#include <fmt/format.h>

#include <charconv>

#include "core/env.hpp"
#include "moejit/error.hpp"

namespace moejit::cli {

std::string message_of(const InvalidArgument& e) {
  const std::string what = e.what();
  const std::string prefix = e.argument() + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

std::filesystem::path database_path(const Args& a) {
  std::filesystem::path path;
  if (a.has("db")) {
    // SQLite takes "" for a private temporary database, deleted at close: every row written lost.
    if (a.get("db").empty()) throw InvalidArgument("--db", "needs a value");
    path = a.get("db");
  } else if (auto user = env::user_db_path()) {
    path = *user;
  } else {
    throw InvalidArgument("--db", "no database named: pass --db, or set MOEJIT_DB (XDG_CACHE_HOME and HOME are unset "
                                  "and there is no private folder in the temporary folder)");
  }
  require_regular_file_if_any(path, "tuning database");
  return path;
}

void require_regular_file_if_any(const std::filesystem::path& path, const char* what) {
  using std::filesystem::file_type;
  std::error_code ec;
  const file_type type = std::filesystem::status(path, ec).type();
  // A path that cannot be looked at is left to the open, which says why.
  if (ec || type == file_type::not_found || type == file_type::regular) return;
  const char* kind = type == file_type::directory                               ? "a folder"
                     : type == file_type::fifo                                  ? "a FIFO"
                     : type == file_type::block || type == file_type::character ? "a device"
                     : type == file_type::socket                                ? "a socket"
                                                                                : "something else";
  throw IoError(fmt::format("{} is {}, not a regular file: it cannot be a {}", path.string(), kind, what));
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
    if (hi != kNoMax) throw InvalidArgument(option, fmt::format("{} is out of range ({} to {})", text, lo, hi));
    // Without a maximum only a count past long long is too large (from_chars leaves v unset then:
    // the sign tells which end it passed).
    if (ec == std::errc::result_out_of_range && text[0] != '-') {
      throw InvalidArgument(option, fmt::format("{} is too large", text));
    }
    throw InvalidArgument(option, fmt::format("{} is out of range (at least {})", text, lo));
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
    if (!flags.count(name) && !valued.count(name)) throw InvalidArgument(s, "unknown option");
    // A second value would silently replace the first ("--tokens 1024 --tokens 8192").
    if (a.has(name)) throw InvalidArgument("--" + name, "given more than once");
    if (flags.count(name)) {
      // "--force=false" would otherwise turn the flag on.
      if (inline_value) throw InvalidArgument("--" + name, fmt::format("takes no value, got '{}'", value));
      a.options[name] = "";
    } else {
      if (!inline_value) {
        if (i + 1 >= argc) throw InvalidArgument("--" + name, "needs a value");
        value = argv[++i];
      }
      a.options[name] = value;
    }
  }
  return a;
}

}  // namespace moejit::cli
