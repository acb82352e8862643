// The CUDA templates under templates/, embedded at build time (cmake/EmbedTemplates.cmake).
#pragma once

#include <vector>

namespace moejit::jit {

struct TemplateFile {
  const char* name;     // path relative to templates/, e.g. "common/warp.cuh"
  const char* content;
};

const std::vector<TemplateFile>& embedded_template_files();

}  // namespace moejit::jit
