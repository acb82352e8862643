#include "jit/template_hash.hpp"

#include "core/hash.hpp"
#include "jit/embedded_templates.hpp"

namespace moejit::jit {
namespace {

// Appends line (its trailing blanks dropped) and a newline to out, unless it is blank.
void append_line(std::string& out, std::string_view line) {
  const std::size_t end = line.find_last_not_of(" \t\r");
  if (end == std::string_view::npos) return;
  out.append(line.substr(0, end + 1));
  out.push_back('\n');
}

}  // namespace

std::string template_code(std::string_view source) {
  std::string out, line;
  std::size_t i = 0;
  const auto at = [&](std::size_t j) { return j < source.size() ? source[j] : '\0'; };
  while (i < source.size()) {
    const char c = source[i];
    if (c == '\n') {
      append_line(out, line);
      line.clear();
      ++i;
    } else if (c == '/' && at(i + 1) == '/') {
      while (i < source.size() && source[i] != '\n') ++i;
    } else if (c == '/' && at(i + 1) == '*') {
      const std::size_t close = source.find("*/", i + 2);
      i = close == std::string_view::npos ? source.size() : close + 2;
      line.push_back(' ');  // keeps the tokens on either side apart
    } else if (c == '"' || c == '\'') {
      // A literal, escapes included, up to its closing quote or the end of the line.
      line.push_back(c);
      ++i;
      while (i < source.size() && source[i] != c && source[i] != '\n') {
        if (source[i] == '\\' && i + 1 < source.size()) line.push_back(source[i++]);
        line.push_back(source[i++]);
      }
      if (at(i) == c) line.push_back(source[i++]);
    } else {
      line.push_back(c);
      ++i;
    }
  }
  append_line(out, line);
  return out;
}

const std::string& template_hash() {
  // Never destroyed: every kernel cache request and tuning lookup reads it, also on a thread
  // building a plan while the process exits.
  static const auto* hash = new std::string([] {
    Hasher h;
    for (const TemplateFile& f : embedded_template_files()) h.field(f.name).field(template_code(f.content));
    return h.hex();
  }());
  return *hash;
}

}  // namespace moejit::jit
