// Command-line parsing for the moejit CLI: positionals plus --name value / --name=value options.
#pragma once

#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moejit/error.hpp"

namespace moejit::cli {

// An integer option's `hi` where only the type bounds it.
constexpr long long kNoMax = std::numeric_limits<long long>::max();

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // without the leading "--"; flags map to ""

  bool has(const std::string& name) const { return options.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // Comma-separated items ("train,infer"): at least one, none empty. Throws InvalidArgument
  // naming the option.
  std::vector<std::string> get_list(const std::string& name) const;
  // Comma-separated integers ("128,2048,768,8"), each parsed by parse_int.
  std::vector<long long> get_ints(const std::string& name, long long lo, long long hi) const;
  // The one integer of an option that takes a single value, or `fallback` when it is absent. A
  // list is an error, not silently cut to its first item.
  long long get_int(const std::string& name, long long fallback, long long lo, long long hi) const;
};

// The message of `e` without the argument it names in front ("role: unknown role 'x'").
std::string message_of(const InvalidArgument& e);

// `parse()`'s value; an InvalidArgument it throws is said of `option` instead: the library's
// parsers name their own field ("role", "dtype", "arch"), not the option the user typed.
template <typename Parse>
auto as_option(const std::string& option, Parse parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(option, message_of(e));
  }
}
// The database a command reads or writes: --db, else the user database (env::user_db_path()).
// Throws InvalidArgument for an empty --db or when neither names one, IoError when something
// other than a regular file is there (require_regular_file_if_any).
std::filesystem::path database_path(const Args& a);

// Throws IoError naming `what` when `path` exists and is not a regular file (after following
// symbolic links): SQLite would wait for ever on a FIFO and read /dev/null as an empty database.
void require_regular_file_if_any(const std::filesystem::path& path, const char* what);

// `text` as a whole decimal integer in [lo, hi]; trailing text ("1x"), a blank or a value out of
// range throws InvalidArgument naming `option` (stoi and strtoll would ignore, accept or clamp).
long long parse_int(const std::string& option, const std::string& text, long long lo, long long hi);

// Parses argv[start..argc). Names in `flags` take no value. Throws InvalidArgument for an
// option not in `flags` or `valued`, a flag given a value ("--force=no"), a valued option without
// its value, an option given twice, or a positional where `positionals` is false (a forgotten
// option name, "4096" for "--tokens 4096", is never ignored).
Args parse_args(int argc, char** argv, int start, const std::set<std::string>& flags,
                const std::set<std::string>& valued, bool positionals = false);

}  // namespace moejit::cli
