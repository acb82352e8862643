// The CUDA templates under templates/, embedded at build time (cmake/EmbedTemplates.cmake).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moejit::jit {

struct TemplateFile {
  const char* name;     // path relative to templates/, e.g. "common/warp.cuh"
  const char* content;
};

const std::vector<TemplateFile>& embedded_template_files();

// Hash over every embedded file's name and code (template_code); part of every kernel cache key
// and tuning row, so editing any template's code invalidates what was built or tuned with the old
// one, while a comment's rewording leaves tuned tables and cached cubins valid.
const std::string& template_hash();

// A CUDA source's code as the template hash sees it: without comments (string and character
// literals kept whole), trailing blanks and blank lines. Conservative: a comment ending in a
// line splice is taken to end at its line.
std::string template_code(std::string_view source);

}  // namespace moejit::jit
