// The CUDA templates under templates/, embedded at build time (cmake/EmbedTemplates.cmake).
#pragma once

#include <string>
#include <vector>

namespace moejit::jit {

struct TemplateFile {
  const char* name;     // path relative to templates/, e.g. "common/warp.cuh"
  const char* content;
};

const std::vector<TemplateFile>& embedded_template_files();

// Hash over every embedded file's name and content; part of every kernel cache key and tuning
// row, so editing any template invalidates what was built or tuned with the old one.
const std::string& template_hash();

}  // namespace moejit::jit
